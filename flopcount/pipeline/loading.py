"""Reading an ONNX model without its weights.

External data is never opened, by construction: :func:`strip_weight_data` removes every external-data
reference (location, offset, length) from every tensor at load, so no later reader (``numpy_helper``,
ONNX's inference, the reference evaluator) holds a path it could follow. A model whose
``.weights``/``.data`` file is missing counts the same as one whose file is present. Inline weights
are parsed (protobuf cannot skip them) and their bytes are dropped at once, so nothing downstream
ever holds or serialises them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, TensorProto

from ..context import is_long
from ..errors import ModelFileError, OpsetError, first_line
from ..registry import DEFAULT_DOMAIN, canonical_domain

# Tensors up to this many elements keep their data: they are shape vectors, axes, scales, and
# other small constants that shape resolution may need. Larger ones are weights.
SMALL_TENSOR_ELEMENTS = 1024
#: int64 tensors (positions, ranges, indices) keep their values up to this many elements (8 MiB): see
#: :func:`is_index_tensor`.
INDEX_TENSOR_ELEMENTS = 1 << 20

_DATA_FIELDS = (
    "raw_data",
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
)


@dataclass(frozen=True)
class LoadedModel:
    model: ModelProto
    path: str | None  # None when given as a ModelProto or bytes


def load(source: str | os.PathLike | ModelProto | bytes | LoadedModel) -> LoadedModel:
    """Load ``source`` (a path, serialized bytes, a ``ModelProto``, or a :class:`LoadedModel` read already, whose
    path it keeps) with weight data stripped.

    A ``ModelProto`` passed in is never modified: its weightless copy is made field by field.
    """
    if isinstance(source, LoadedModel):
        model = weightless_copy(source.model, source.path or "<model>")
        path = source.path
    elif isinstance(source, ModelProto):
        model = weightless_copy(source, "<model>")
        path = None
    elif isinstance(source, (bytes, bytearray)):
        model = _parse(bytes(source), "<bytes>")
        strip_weight_data(model, "<bytes>")
        path = None
    else:
        path = os.fspath(source)
        model = _parse(_read(path), path)
        strip_weight_data(model, path)
    _check_is_model(model, path or "<model>")
    _check_text(model, path or "<model>")
    check_opsets(model, path or "<model>")
    if model.functions:
        model = _inline_functions(model, path or "<model>")
    return LoadedModel(model, path)


def load_with_weights(source: str | os.PathLike | ModelProto | bytes) -> LoadedModel:
    """``source`` read with its inline weight data (external data stays unread), for a caller that runs the model
    as well as counts it: :func:`load` (and so :func:`flopcount.count`) takes the result without reading the file
    again. A ``ModelProto`` passed in is copied, never modified; a file that cannot be read fails as in :func:`load`.
    """
    if isinstance(source, ModelProto):
        model = ModelProto()
        model.CopyFrom(source)
        return LoadedModel(model, None)
    if isinstance(source, (bytes, bytearray)):
        return LoadedModel(_parse(bytes(source), "<bytes>"), None)
    path = os.fspath(source)
    return LoadedModel(_parse(_read(path), path), path)


def _read(path: str) -> bytes:
    if not os.path.exists(path):
        raise ModelFileError(f"{path}: no such file; give the path of an .onnx model")
    if os.path.isdir(path):
        raise ModelFileError(f"{path}: is a directory; give the path of an .onnx model file inside it")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ModelFileError(f"{path}: cannot be read ({e.strerror}); check its permissions") from None
    if not data:
        raise ModelFileError(f"{path}: the file is empty; re-export the model")
    return data


def _parse(data: bytes, where: str) -> ModelProto:
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        other = _other_onnx_message(data)
        if other:
            raise ModelFileError(
                f"{where}: this is an ONNX {other}, not an ONNX model (ModelProto); "
                "wrap it in a model (onnx.helper.make_model) or give the exported .onnx file"
            ) from None
        raise ModelFileError(
            f"{where}: not a readable ONNX protobuf ({first_line(e)}); the file is truncated, "
            "corrupt or of another format: re-export or re-download it"
        ) from None
    if not model.HasField("graph"):
        other = _other_onnx_message(data)
        if other:
            raise ModelFileError(
                f"{where}: this is an ONNX {other}, not an ONNX model (ModelProto); "
                "wrap it in a model (onnx.helper.make_model) or give the exported .onnx file"
            )
    return model


def _other_onnx_message(data: bytes) -> str:
    """Name of the ONNX message type ``data`` parses as completely, other than ModelProto ("" if none)."""
    for cls, required in ((onnx.GraphProto, "node"), (onnx.TensorProto, "dims"), (onnx.NodeProto, "op_type")):
        msg = cls()
        try:
            msg.ParseFromString(data)
        except (DecodeError, RuntimeError, ValueError):
            continue
        if msg.ListFields() and getattr(msg, required) and msg.SerializeToString() == data:
            return cls.__name__
    return ""


def _check_is_model(model: ModelProto, where: str) -> None:
    if not model.HasField("graph") or not model.opset_import:
        what = "an empty model" if model.ByteSize() == 0 else "a protobuf message, not an ONNX model"
        raise ModelFileError(
            f"{where}: this is {what} (no graph or no opset_import); give an .onnx ModelProto file"
        )


def _check_text(model: ModelProto, where: str) -> None:
    """The model's names that reports show are valid UTF-8 (protobuf hands over bytes where they
    are not); node fields are checked with the graph (:mod:`flopcount.pipeline.validate`)."""
    g = model.graph
    texts = [model.producer_name, model.producer_version, model.domain, g.name,
             *(i.domain for i in model.opset_import), *(t.name for t in g.initializer)]
    for vi in (*g.input, *g.output):
        texts.append(vi.name)
        if vi.type.HasField("tensor_type"):
            texts.extend(d.dim_param for d in vi.type.tensor_type.shape.dim)
    if any(isinstance(t, bytes) for t in texts):
        from ..errors import InvalidGraphError

        raise InvalidGraphError(
            f"{where}: a name in the model (graph, producer, input, output, initializer or dim name) is not valid "
            "UTF-8; the file is corrupt: re-export it"
        )


@lru_cache(maxsize=None)
def known_opset(domain: str) -> int:
    """The newest opset of ``domain`` that the installed ``onnx`` package has schemas for (0: none)."""
    if domain == DEFAULT_DOMAIN:
        return onnx.defs.onnx_opset_version()
    versions = [s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.domain == domain]
    return max(versions, default=0)


def check_opsets(model: ModelProto, where: str) -> None:
    """Opset versions start at 1; a domain is imported once (the default domain as ``""`` or ``"ai.onnx"``),
    or twice at the same version; the standard domains are known to the installed onnx."""
    seen: dict[str, onnx.OperatorSetIdProto] = {}
    for imp in model.opset_import:
        first = seen.setdefault(canonical_domain(imp.domain), imp)
        if first.version != imp.version:
            from ..errors import InvalidGraphError

            raise InvalidGraphError(
                f"{where}: the model imports domain {imp.domain or 'ai.onnx'!r} twice, at opset {first.version} "
                f"(as {first.domain!r}) and at opset {imp.version} (as {imp.domain!r}); which one its nodes use is "
                "ambiguous: keep one opset_import entry per domain"
            )
    for imp in model.opset_import:
        if imp.version < 1:
            from ..errors import InvalidGraphError

            raise InvalidGraphError(
                f"{where}: the model imports opset {imp.version} of domain {imp.domain or 'ai.onnx'!r}; "
                "opset versions start at 1: fix opset_import or re-export the model"
            )
        domain = canonical_domain(imp.domain)
        if domain not in (DEFAULT_DOMAIN, "ai.onnx.ml"):
            continue  # custom domains: their ops are reported as unsupported, not an error
        newest = known_opset(domain)
        if imp.version > newest:
            raise OpsetError(
                f"{where}: the model imports opset {imp.version} of domain {imp.domain or 'ai.onnx'!r}, "
                f"but the installed onnx {onnx.__version__} knows only up to {newest}; "
                "upgrade it (pip install -U onnx) or export the model with an older opset"
            )


def _is_small(t: TensorProto) -> bool:
    if t.data_location == TensorProto.EXTERNAL:
        return False
    n = 1
    for d in t.dims:
        n *= d
    return n <= SMALL_TENSOR_ELEMENTS or is_index_tensor(t)


def is_index_tensor(t: TensorProto) -> bool:
    """Whether ``t`` is an int64 tensor of at most :data:`INDEX_TENSOR_ELEMENTS` elements, whose values are kept:
    positions, ranges and indices, which attention masks and shapes are computed from. A framework's weights are
    floating point (int8 or int4 when quantized), never int64, so no weight is read."""
    if t.data_type != TensorProto.INT64:
        return False
    n = 1
    for d in t.dims:
        n *= d
    return n <= INDEX_TENSOR_ELEMENTS


_CLEARED = (*_DATA_FIELDS, "external_data")
_clear = TensorProto.ClearField  # unbound: no method object made per call, for every weight of the largest graphs


def _strip_tensor(t: TensorProto) -> None:
    """Drop a tensor's data, keeping name, dims and data type."""
    for f in _CLEARED:
        _clear(t, f)
    t.data_location = TensorProto.DEFAULT


def has_data(t: TensorProto) -> bool:
    """Whether ``t`` holds values (inline or by an external reference). A tensor without data is read as
    dims and type only: its data was dropped at load, or it never had any (a weightless export); every
    check treats both alike."""
    return (t.HasField("raw_data") or t.data_location == TensorProto.EXTERNAL
            or any(len(getattr(t, f)) for f in _DATA_FIELDS[1:]))


# Standard operators whose attributes can hold tensors or subgraphs; nodes of other domains are
# inspected too. Reading every attribute of every node would cost more than parsing the file.
_TENSOR_ATTRIBUTE_OPS = frozenset({"Constant", "ConstantOfShape", "If", "Loop", "Scan", "SequenceMap"})


def _big_tensors(graph: onnx.GraphProto, where: str):
    """Initializers and node-attribute tensors that are weights or refer to external data, in this
    graph and all subgraphs (an external tensor of any size, zero elements included, loses its
    reference: a tensor without data is read as dims and type only). A node's inline tensor is
    checked by ONNX's checker as written before it is yielded, since its data is about to go."""
    for t in graph.initializer:
        if not _is_small(t):
            yield t
        else:
            _check_length(t, f"{where}: initializer {t.name!r}")
    for sp in graph.sparse_initializer:
        yield sp.values
        yield sp.indices
    for i, node in enumerate(graph.node):
        if node.op_type not in _TENSOR_ATTRIBUTE_OPS and node.domain in ("", "ai.onnx"):
            continue
        yield from _node_big_tensors(node, i, where)


def _node_big_tensors(node: onnx.NodeProto, index: int, where: str):
    """The weight-sized or external tensors in a node's attributes, subgraphs included."""
    for a in node.attribute:
        if a.type == onnx.AttributeProto.TENSOR and not _is_small(a.t):
            _check_tensor(a.t, node, index, where)
            yield a.t
        elif a.type == onnx.AttributeProto.TENSOR:
            _check_length(a.t, _node_tensor(node, index, a.t, where))
        elif a.type == onnx.AttributeProto.GRAPH:
            yield from _big_tensors(a.g, where)
        elif a.type == onnx.AttributeProto.TENSORS:
            for t in a.tensors:
                if not _is_small(t):
                    _check_tensor(t, node, index, where)
                    yield t
                else:
                    _check_length(t, _node_tensor(node, index, t, where))
        elif a.type == onnx.AttributeProto.SPARSE_TENSOR:
            _check_tensor(a.sparse_tensor, node, index, where)
            yield from (a.sparse_tensor.values, a.sparse_tensor.indices)
        elif a.type == onnx.AttributeProto.GRAPHS:
            for g in a.graphs:
                yield from _big_tensors(g, where)


def _node_tensor(node: onnx.NodeProto, index: int, t: TensorProto, where: str) -> str:
    return f"{where}: node {node.name or f'{node.op_type}_{index}'!r} ({node.op_type}), tensor {t.name!r}"


# Element types stored one value per element (two for complex numbers) in their typed field, or ``itemsize`` bytes
# each in raw_data: (field, values per element, bytes per element). Packed types (4-, 2- and 6-bit) are left out.
_LAYOUTS = {
    TensorProto.FLOAT: ("float_data", 1, 4), TensorProto.DOUBLE: ("double_data", 1, 8),
    TensorProto.COMPLEX64: ("float_data", 2, 8), TensorProto.COMPLEX128: ("double_data", 2, 16),
    TensorProto.INT64: ("int64_data", 1, 8), TensorProto.UINT64: ("uint64_data", 1, 8),
    TensorProto.UINT32: ("uint64_data", 1, 4), TensorProto.STRING: ("string_data", 1, None),
    **{dtype: ("int32_data", 1, size) for dtype, size in (
        (TensorProto.INT32, 4), (TensorProto.INT16, 2), (TensorProto.UINT16, 2), (TensorProto.INT8, 1),
        (TensorProto.UINT8, 1), (TensorProto.BOOL, 1), (TensorProto.FLOAT16, 2), (TensorProto.BFLOAT16, 2),
        (TensorProto.FLOAT8E4M3FN, 1), (TensorProto.FLOAT8E4M3FNUZ, 1), (TensorProto.FLOAT8E5M2, 1),
        (TensorProto.FLOAT8E5M2FNUZ, 1))},
}


def _check_length(t: TensorProto, what: str) -> None:
    """A small tensor, whose data is kept and read for shapes, holds as many values as its dims say
    (:class:`~flopcount.errors.InvalidGraphError` naming it, ``what``, otherwise)."""
    layout = _LAYOUTS.get(t.data_type)
    if layout is None or t.data_location == TensorProto.EXTERNAL:
        return
    field, per_element, itemsize = layout
    elements = 1
    for d in t.dims:
        elements *= d
    if t.HasField("raw_data"):
        if itemsize is None or len(t.raw_data) == elements * itemsize:
            return
        held, unit = len(t.raw_data), "bytes of raw_data"
        wanted = elements * itemsize
    else:
        held = len(getattr(t, field))
        if held == elements * per_element or not has_data(t):
            return
        unit, wanted = f"values in {field}", elements * per_element
    from ..errors import InvalidGraphError

    raise InvalidGraphError(
        f"{what}: its dims {list(t.dims)} make {elements} elements, which take {wanted} {unit}, but it holds {held}; "
        "dims and data must agree: fix the tensor or re-export the model"
    )


def _check_tensor(t, node: onnx.NodeProto, index: int, where: str) -> None:
    """ONNX's checker on a node's tensor (dense or sparse) as written, before its data is dropped: the
    value field, its type and its length. A tensor without data is read as dims and type only, and an
    external one is never opened, so neither is checked here."""
    dense = t.values if isinstance(t, onnx.SparseTensorProto) else t
    if not has_data(dense) or dense.data_location == TensorProto.EXTERNAL:
        return
    check = onnx.checker.check_sparse_tensor if dense is not t else onnx.checker.check_tensor
    try:
        check(t, onnx.checker.C.CheckerContext())
    except Exception as e:  # onnx.checker.ValidationError and plain C++ exceptions
        from ..errors import InvalidGraphError

        raise InvalidGraphError(
            f"{where}: node {node.name or f'{node.op_type}_{index}'!r} ({node.op_type}), tensor {dense.name!r}: "
            f"{first_line(e)} "
            "(ONNX checker); fix the tensor or re-export the model"
        ) from None


def strip_weight_data(model: ModelProto, where: str = "<model>") -> None:
    """Drop, in place, the data of every weight-sized tensor (dims and dtypes stay). A node's inline
    tensor is checked as written first (:class:`~flopcount.errors.InvalidGraphError` naming it)."""
    for t in _big_tensors(model.graph, where):
        _strip_tensor(t)
    for f in model.functions:
        for i, node in enumerate(f.node):
            for t in _node_big_tensors(node, i, f"{where}: function {f.name!r}"):
                _strip_tensor(t)


def _is_repeated(field) -> bool:
    # protobuf >= 6 has ``is_repeated``; older versions only ``label``
    flag = getattr(field, "is_repeated", None)
    return flag if flag is not None else field.label == field.LABEL_REPEATED


def copy_field(dst, field, value) -> None:
    """Set ``field`` of the message ``dst`` to ``value`` (a pair from ``ListFields()`` of a message of its type)."""
    if _is_repeated(field):
        getattr(dst, field.name).extend(value)
    elif field.message_type is not None:
        getattr(dst, field.name).CopyFrom(value)
    elif isinstance(value, bytes) and field.type == field.TYPE_STRING:
        # a string field protobuf could not decode as UTF-8 (it hands over bytes): copied as the wire holds it, so
        # that the copy is checked exactly as the same bytes read from a file
        dst.MergeFromString(_varint((field.number << 3) | 2) + _varint(len(value)) + value)
    else:
        setattr(dst, field.name, value)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def weightless_copy(model: ModelProto, where: str = "<model>") -> ModelProto:
    """A copy of ``model`` without weight data, made without copying the weight bytes."""
    out = ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            copy_field(out, field, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            copy_field(out.graph, field, value)
            continue
        for t in value:
            if _is_small(t):
                out.graph.initializer.add().CopyFrom(t)
            else:
                out.graph.initializer.add(name=t.name, dims=t.dims, data_type=t.data_type)
    strip_weight_data(out, where)  # Constant nodes, sparse initializers, subgraphs
    return out


def _inline_functions(model: ModelProto, where: str) -> ModelProto:
    """Expand model-local functions into the main graph (the model is weightless, so this is cheap)."""
    import onnx.inliner

    try:
        return onnx.inliner.inline_local_functions(model)
    except Exception as e:  # onnx raises plain exceptions from C++
        from ..errors import InvalidGraphError

        raise InvalidGraphError(
            f"{where}: its model-local functions cannot be expanded ({first_line(e)}); "
            "check the function definitions or re-export without functions"
        ) from None


def shortened(node: onnx.NodeProto, keep: tuple[str, ...] | frozenset[str] = ()) -> onnx.NodeProto:
    """A copy of the ``onnx.NodeProto`` ``node`` whose long repeated attributes (:func:`~flopcount.context.is_long`), except those
    named in ``keep``, hold only their first value: what ONNX's checker and the shape inference of a tree
    ensemble read (names, types, labels), without copying millions of values."""
    short = onnx.NodeProto()
    for field, value in node.ListFields():
        if field.name != "attribute":
            copy_field(short, field, value)
    for a in node.attribute:
        if is_long(a) and a.name not in keep:
            b = short.attribute.add(name=a.name, type=a.type)
            b.ints.extend(a.ints[:1])
            b.floats.extend(a.floats[:1])
            b.strings.extend(a.strings[:1])
        else:
            short.attribute.add().CopyFrom(a)
    return short
