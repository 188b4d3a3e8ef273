"""Tensor infos read from an (inferred) model, and the limits and operator sets every stage of shape resolution
shares."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from itertools import repeat
from math import prod
from operator import attrgetter, itemgetter, methodcaller

import onnx
from onnx import ModelProto, helper

from ...context import TensorInfo
from ...limits import MAX_ELEMENTS

FOLD_LIMIT = 4096  # largest tensor (elements) evaluated while folding shape subgraphs


def tensor_type(vi: onnx.ValueInfoProto):
    """The tensor type of a tensor value, or of the elements of a sequence value."""
    if vi.type.HasField("sequence_type"):
        return vi.type.sequence_type.elem_type.tensor_type
    return vi.type.tensor_type


def declared_shape(vi: onnx.ValueInfoProto) -> tuple | None:
    t = tensor_type(vi)
    if not t.HasField("shape"):
        return None
    return tuple(_dim(d) for d in t.shape.dim)


def _dim(d) -> int | str | None:
    if d.HasField("dim_value"):
        return d.dim_value
    return d.dim_param or None


SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})

class Collected(dict):
    """Tensor name → :class:`TensorInfo`, as read from an inferred model; ``odd`` names the tensors
    with a negative, zero or oversized dim (found once per distinct type, for :func:`check_dims`)."""

    __slots__ = ("odd",)


def collect(model: ModelProto, bodies: bool = True, initializers: Mapping[str, TensorInfo] | None = None) -> dict[str, TensorInfo]:
    """Tensor infos of an inferred model; ``initializers``, when given, are the top graph's
    initializer infos (see :func:`initializer_infos`), already read."""
    out = Collected()
    out.odd = []
    _collect_graph(model.graph, out, bodies, initializers)
    return out


def _odd(shape) -> bool:
    """Whether a shape has a negative or zero dim, or more than MAX_ELEMENTS elements."""
    known = [d for d in shape or () if type(d) is int]
    return bool(known) and (min(known) <= 0 or max(known) > MAX_ELEMENTS or prod(known) > MAX_ELEMENTS)


def initializer_infos(g: onnx.GraphProto | None,
                      declared: Mapping[str, tuple[int, tuple[int, ...]]] | None = None) -> dict[str, TensorInfo]:
    """Infos of a graph's initializers (their dims and types are declared: no inference needed); ``declared``: their
    ``(data type, dims)`` by name as :func:`~flopcount.pipeline.graph.build_graph` read them (``g`` is then not read)."""
    make = tuple.__new__
    if declared is not None:  # built by C-level iterators: no Python frame per initializer
        types = declared.values()
        rows = zip(declared, map(itemgetter(0), types), map(itemgetter(1), types), repeat(True))
        return dict(zip(declared, map(partial(make, TensorInfo), rows)))
    return {t.name: make(TensorInfo, (t.name, t.data_type, tuple(t.dims[:]), True)) for t in g.initializer}


def _collect_graph(g: onnx.GraphProto, out: dict[str, TensorInfo], bodies: bool = True,
                   initializers: Mapping[str, TensorInfo] | None = None, top: bool = True) -> None:
    """Tensor infos of ``g`` and, recursively, of its subgraphs (names are unique across scopes);
    ``bodies=False`` skips the scan for subgraphs (the graph has none). Odd dims are noted for the
    top graph only: ONNX infers both branches of an If, and the one not taken may well have them
    (a body that runs and has one gets a negative count, which the traversal refuses)."""
    for node in g.node if bodies else ():
        if node.op_type in SUBGRAPH_OPS:
            for a in node.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs):
                    _collect_graph(sub, out, top=False)
    odd = getattr(out, "odd", None) if top else None
    out.update(initializer_infos(g) if initializers is None else initializers)
    names, keys, decoded = _graph_entries(g)
    marked = set()  # the keys of odd types (top graph only)
    if odd is not None:
        marked = {key for key, info in decoded.items() if info is not None and _odd(info[1])}
    infos = list(map(decoded.__getitem__, keys))
    make = tuple.__new__
    if None not in decoded.values() and out.keys().isdisjoint(names) and len(set(names)) == len(names):
        # each name once, none already read: every entry is kept, in one C-level pass
        rows = zip(names, map(_FIRST, infos), map(_SECOND, infos), map(_THIRD, infos))
        out.update(zip(names, map(make, repeat(TensorInfo), rows)))
        if marked:
            odd.extend(name for name, key in zip(names, keys) if key in marked)
        return
    get = out.get
    for name, key, info in zip(names, keys, infos):
        prev = get(name)
        if prev is not None and prev[3]:  # static already (an initializer's declared input)
            continue
        if info is not None:
            if key in marked:
                odd.append(name)
            out[name] = make(TensorInfo, (name, *info))


def _graph_entries(g: onnx.GraphProto) -> tuple[list[str], list[bytes], dict[bytes, tuple | None]]:
    """The names of ``g``'s inputs, value infos and outputs (in that order), a key per name (its type's bytes), and the
    decoded type (:func:`_decode_type`) of each distinct key. A large graph has a few distinct types (dtype and dims)
    for a great many tensors: each is decoded once. Names and keys are read by C-level loops (no Python frame per
    entry)."""
    entries = [*g.input, *g.value_info, *g.output]
    names = list(map(_NAME, entries))
    keys = list(map(_SERIALIZED, map(_TYPE, entries)))
    first = dict(zip(keys, range(len(keys))))  # a key → an entry that has it
    return names, keys, {key: _decode_type(entries[k].type) for key, k in first.items()}


def type_table(g: onnx.GraphProto) -> tuple[list[str], list[int], list[tuple | None], list[int]]:
    """The tensor infos of ``g`` (its bodies aside) in a compact form for another process: the names (as
    :func:`_graph_entries`), the position of each one's type in a table of the distinct types, the table (each
    ``(elem_type, shape, static)``, None for a map or an optional) and the positions in it of the types with odd dims
    (see :class:`Collected`). :func:`from_type_table` reads it back."""
    names, keys, decoded = _graph_entries(g)
    ids = dict(zip(decoded, range(len(decoded))))
    odd = [ids[key] for key, info in decoded.items() if info is not None and _odd(info[1])]
    return names, list(map(ids.__getitem__, keys)), list(decoded.values()), odd


def from_type_table(names: list[str], ids: list[int], table: list[tuple | None], odd: list[int],
                    initializers: Mapping[str, TensorInfo]) -> Collected:
    """What :func:`collect` gives for a graph without bodies whose entries :func:`type_table` read, the graph's
    ``initializers`` given: they come first, and their declared types stand (an entry of the same name is dropped)."""
    out = Collected(initializers)
    out.odd = []
    if not initializers.keys().isdisjoint(names):  # an initializer's declared input (older exports)
        kept = [k for k, name in enumerate(names) if name not in initializers]
        names, ids = [names[k] for k in kept], [ids[k] for k in kept]
    odd_ids = frozenset(odd)
    if None not in table and len(set(names)) == len(names):  # each name once: every entry kept, by C-level loops
        infos = list(map(table.__getitem__, ids))
        rows = zip(names, map(_FIRST, infos), map(_SECOND, infos), map(_THIRD, infos))
        out.update(zip(names, map(tuple.__new__, repeat(TensorInfo), rows)))
        if odd_ids:
            out.odd = [name for name, k in zip(names, ids) if k in odd_ids]
        return out
    for name, k in zip(names, ids):  # as _collect_graph: a later entry wins unless an earlier one is static
        prev, info = out.get(name), table[k]
        if info is not None and not (prev is not None and prev[3]):
            if k in odd_ids:
                out.odd.append(name)
            out[name] = tuple.__new__(TensorInfo, (name, *info))
    return out


_NAME, _TYPE, _SERIALIZED = attrgetter("name"), attrgetter("type"), methodcaller("SerializeToString")
_FIRST, _SECOND, _THIRD = itemgetter(0), itemgetter(1), itemgetter(2)


def _decode_type(ty: onnx.TypeProto) -> tuple | None:
    """(elem_type, shape, static) of a tensor type, or of a sequence's elements; None for maps and
    optionals, which have no tensor shape."""
    if ty.HasField("tensor_type"):
        tt = ty.tensor_type
    elif ty.HasField("sequence_type") and ty.sequence_type.elem_type.HasField("tensor_type"):
        tt = ty.sequence_type.elem_type.tensor_type  # a sequence is recorded by its elements' type
    else:
        return None
    shape = tuple([d.dim_value or _dim(d) for d in tt.shape.dim]) if tt.HasField("shape") else None
    return tt.elem_type, shape, shape is not None and all(type(d) is int for d in shape)


def value_info(name: str, t: TensorInfo | None) -> onnx.ValueInfoProto:
    if t is None or not t.elem_type:
        return helper.make_empty_tensor_value_info(name)
    return helper.make_tensor_value_info(name, t.elem_type, None if t.shape is None else list(t.shape))

def static(t: TensorInfo | None) -> bool:
    return t is not None and t.is_static



# Standard operators whose inferred output dims are never negative when their input dims are not
# (copies, sums, products or clamped slices of them). Any other operator (convolution and pooling
# windows, Pad, Resize, Split with sizes, Tile, DFT, other domains ...) may turn a hostile attribute
# or constant into a negative dim, and ONNX's Slice inference aborts the process on one (an
# assertion in std::clamp). A Slice downstream of such an operator is inferred only once the dims
# feeding it are checked: see _guard_depths.
DIM_SAFE_OPS = frozenset("""
    Abs Acos Acosh Add And ArgMax ArgMin Asin Asinh Atan Atanh BatchNormalization BitShift BitwiseAnd
    BitwiseNot BitwiseOr BitwiseXor Cast CastLike Ceil Celu Clip Concat Constant Cos Cosh CumSum
    DequantizeLinear Div Dropout DynamicQuantizeLinear Elu Equal Erf Exp Flatten Floor Gather
    GatherElements GatherND Gelu Gemm GlobalAveragePool GlobalLpPool GlobalMaxPool Greater GreaterOrEqual
    GroupNormalization HardSigmoid HardSwish Hardmax Identity InstanceNormalization IsInf IsNaN
    LayerNormalization LeakyRelu Less LessOrEqual Log LogSoftmax LpNormalization MatMul MatMulInteger Max
    Mean MeanVarianceNormalization Min Mish Mod Mul Neg Not Or PRelu Pow QuantizeLinear Range Reciprocal
    ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin ReduceProd ReduceSum
    ReduceSumSquare Relu Reshape RMSNormalization Round Selu Shape Shrink Sigmoid Sign Sin Sinh Size
    Slice Softmax Softplus Softsign Sqrt Squeeze Sub Sum Swish Tan Tanh ThresholdedRelu Transpose Trilu
    Unsqueeze Where Xor
""".split())

