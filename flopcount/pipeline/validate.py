"""Checks that an invalid model is refused rather than counted as if it were valid.

Two passes. :func:`check_graph` runs after the DAG is built and before any shape inference: every
node of the standard domains (subgraph bodies included) is checked against its operator schema by
ONNX's own checker (attribute names and types, required attributes, input and output counts), then
the values schemas cannot express (window attributes, ``auto_pad``, ``group``) and the structure of
``If``/``Loop``/``Scan`` bodies are checked, and declared dims must not be negative.
:func:`check_resolved` runs once shapes and small constants are known: convolution weights must fit
their input and ``group``, and biases their output channels; a convolution or pooling window must have
a position in its padded input; Reshape, Tile, Expand and ConstantOfShape targets must not be negative,
and a Reshape keeps its element count.
Every failure is an :class:`InvalidGraphError` (exit 4) naming the node and what is wrong, or a
:class:`ShapeError` (exit 5) for a declared negative dim. :func:`fix_hint` says how to fix shapes left unknown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain, compress
from functools import lru_cache

import numpy as np
import onnx
from onnx import AttributeProto, helper

from ..context import TensorInfo, is_long
from ..errors import InvalidGraphError, ShapeError, first_line
from ..registry import DEFAULT_DOMAIN, canonical_domain
from .graph import GraphIndex, node_label
from .loading import has_data, shortened

_GRAPH_TYPES = (AttributeProto.GRAPH, AttributeProto.GRAPHS)
_AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")
_POSITIVE_INTS = ("kernel_shape", "strides", "dilations")


def check_graph(model: onnx.ModelProto, index: GraphIndex, opsets: Mapping[str, int], where: str) -> None:
    """Check ``model`` before inference, except the top graph's nodes against their schemas, which
    :func:`check_node` does as the traversal reads their attributes (once per distinct node)."""
    ops = set(index.node_ops)
    if bytes in {type(x) for op in ops for x in op} or bytes in set(map(type, index.names)) or bytes in set(
            map(type, chain.from_iterable(chain(index.node_inputs, index.node_outputs)))):
        for i, node in enumerate(index.protos):
            _check_strings(node, i, (), where)
    _check_declared(model.graph, index.bodies, where, index.initializer_types)
    seen: set = set()
    protos = index.protos
    for i in index.bodies:
        node = protos[i]
        _check_bodies(node, i, (), where)
        for a in node.attribute:
            if a.type in _GRAPH_TYPES:
                for body in [a.g] if a.type == AttributeProto.GRAPH else a.graphs:
                    for inner, j, scope in _walk(body, (node_label(node, i),)):
                        _check_strings(inner, j, scope, where)
                        check_node(inner, j, scope, opsets, model.ir_version, where, seen)
                        if any(b.type in _GRAPH_TYPES for b in inner.attribute):
                            _check_bodies(inner, j, scope, where)


def _walk(g: onnx.GraphProto, scope: tuple[str, ...]) -> Iterator[tuple[onnx.NodeProto, int, tuple[str, ...]]]:
    """Every node of ``g`` and of its bodies, with the names of the nodes that enclose it."""
    for i, node in enumerate(g.node):
        yield node, i, scope
        for a in node.attribute:
            if a.type in _GRAPH_TYPES:
                inner = (*scope, node_label(node, i))
                for body in [a.g] if a.type == AttributeProto.GRAPH else a.graphs:
                    yield from _walk(body, inner)


def _where_node(node: onnx.NodeProto, index: int, scope: tuple[str, ...], where: str) -> str:
    inside = "".join(f" in the body of {s!r}" for s in reversed(scope))
    return f"{where}: node {node_label(node, index)!r} ({node.op_type}){inside}"


def _check_strings(node, index, scope, where) -> None:
    if isinstance(node.op_type, bytes) or isinstance(node.domain, bytes) or isinstance(node.name, bytes):
        raise InvalidGraphError(
            f"{where}: node {index}{' in a body' if scope else ''} has an op_type, domain or name that is not "
            "valid UTF-8; the file is corrupt: re-export it"
        )
    if any(isinstance(x, bytes) for x in (*node.input, *node.output)):
        raise InvalidGraphError(
            f"{_where_node(node, index, scope, where)}: a tensor name is not valid UTF-8; the file is corrupt: re-export it"
        )


def check_node(node, index, scope, opsets, ir_version, where, seen=None) -> None:
    """One node against its schema and the window rules; ``seen`` (a set) skips nodes already
    checked, by their key (domain, op type, arity and attributes other than graphs)."""
    domain = canonical_domain(node.domain)
    version = opsets.get(domain)
    if version is None or domain not in (DEFAULT_DOMAIN, "ai.onnx.ml"):
        return  # other domains: their ops are unsupported or counted by their own formulas
    if seen is not None:
        key = (domain, node.op_type, len(node.input), len(node.output),
               *[a.SerializeToString() for a in node.attribute if a.type not in _GRAPH_TYPES])
        if key in seen:
            return
        seen.add(key)
    _check_schema(node, domain, version, ir_version, index, scope, where)
    _check_window(node, index, scope, where)


@lru_cache(maxsize=None)
def _has_schema(op_type: str, version: int, domain: str) -> bool:
    try:
        onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return False
    return True


def _check_schema(node, domain, version, ir_version, index, scope, where) -> None:
    """ONNX's checker on one node: attribute names and types, required attributes, input counts.
    Bodies are replaced by empty graphs here (they are checked node by node, in their scope)."""
    if not _has_schema(node.op_type, version, domain):
        return  # unknown to this onnx: reported as unsupported, not an error
    node = _as_checked(node)
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = ir_version or onnx.IR_VERSION
    ctx.opset_imports = {"" if domain == DEFAULT_DOMAIN else domain: version}
    try:
        onnx.checker.check_node(node, ctx, onnx.checker.C.LexicalScopeContext())
    except Exception as e:  # ValidationError
        text = first_line(e)
        wrong = re.match(r"Mismatched attribute type in '.*: (.+)'\. Expected: '(\w+)', actual: '(\w+)'", text)
        if wrong:
            name, wanted, given = wrong.groups()
            text = f"attribute {name!r} is {given}, but the spec wants {wanted}"
        raise InvalidGraphError(
            f"{_where_node(node, index, scope, where)}: {text} (ONNX checker, opset {version}); "
            "fix the node against the operator's spec or re-export the model"
        ) from None


_TENSOR_TYPES = (AttributeProto.TENSOR, AttributeProto.TENSORS, AttributeProto.SPARSE_TENSOR)


def _as_checked(node: onnx.NodeProto) -> onnx.NodeProto:
    """``node`` as the schema check sees it: bodies replaced by empty graphs (they are checked node by
    node, in their scope), and a tensor without data by a zero-element tensor of the same type. The
    loader checked each inline tensor as written before dropping its data (:mod:`flopcount.pipeline.loading`),
    so the check never depends on whether data was dropped, at load or before the file was written."""
    if not any(a.type in _GRAPH_TYPES or (a.type in _TENSOR_TYPES and _dataless(a)) or is_long(a) for a in node.attribute):
        return node
    bare = shortened(node)  # the checker reads a long attribute's name and type: one value is as good as millions
    for a in bare.attribute:
        if a.type == AttributeProto.GRAPH:
            a.g.Clear()
            a.g.name = "body"
        elif a.type == AttributeProto.GRAPHS:
            for g in a.graphs:
                g.Clear()
                g.name = "body"
        elif a.type == AttributeProto.TENSOR and not has_data(a.t):
            _empty(a.t)
        elif a.type == AttributeProto.TENSORS:
            for t in a.tensors:
                if not has_data(t):
                    _empty(t)
        elif a.type == AttributeProto.SPARSE_TENSOR and not has_data(a.sparse_tensor.values):
            _empty(a.sparse_tensor.values)
            _empty(a.sparse_tensor.indices)
    return bare


def _dataless(a: onnx.AttributeProto) -> bool:
    if a.type == AttributeProto.TENSOR:
        return not has_data(a.t)
    if a.type == AttributeProto.TENSORS:
        return not all(map(has_data, a.tensors))
    return not has_data(a.sparse_tensor.values)


def _empty(t: onnx.TensorProto) -> None:
    """Make ``t`` a tensor of its type with no elements (its last dim 0), which needs no value."""
    t.dims[-1:] = [0]


def _check_window(node, index, scope, where) -> None:
    """Values of convolution and pooling attributes that the schema types cannot express."""
    attrs = {a.name: a for a in node.attribute}
    if not attrs.keys() & {"kernel_shape", "strides", "dilations", "pads", "auto_pad", "group"}:
        return
    if node.op_type in ("Pad", "Slice"):
        return

    def fail(what: str) -> InvalidGraphError:
        return InvalidGraphError(f"{_where_node(node, index, scope, where)}: {what}; fix the attribute or re-export the model")

    values = {k: helper.get_attribute_value(a) for k, a in attrs.items() if a.type in (AttributeProto.INT, AttributeProto.INTS, AttributeProto.STRING)}
    for name in _POSITIVE_INTS:
        v = values.get(name)
        if isinstance(v, list) and any(x <= 0 for x in v):
            raise fail(f"attribute {name}={v} has a zero or negative value; every value must be positive")
    pads = values.get("pads")
    if isinstance(pads, list):
        if any(p < 0 for p in pads) and node.op_type not in ("ConvTranspose",):
            raise fail(f"attribute pads={pads} has a negative value")
        if len(pads) % 2:
            raise fail(f"attribute pads={pads} has an odd length; it holds a begin and an end per spatial axis")
    rank = None
    for name in ("kernel_shape", "strides", "dilations"):
        v = values.get(name)
        if isinstance(v, list):
            if rank is not None and len(v) != rank:
                raise fail(f"attribute {name}={v} has {len(v)} values, but the other window attributes have {rank}")
            rank = len(v)
    if rank is not None and isinstance(pads, list) and len(pads) != 2 * rank:
        raise fail(f"attribute pads={pads} has {len(pads)} values, but {2 * rank} are needed for {rank} spatial axes")
    auto_pad = values.get("auto_pad")
    if isinstance(auto_pad, bytes):
        try:
            auto_pad = auto_pad.decode()
        except UnicodeDecodeError:
            auto_pad = repr(auto_pad)
        if auto_pad not in _AUTO_PADS:
            raise fail(f"attribute auto_pad={auto_pad!r} is not one of {', '.join(_AUTO_PADS)}")
        if auto_pad != "NOTSET" and isinstance(pads, list) and any(pads):
            raise fail(f"auto_pad={auto_pad!r} and pads={pads} are both given; the spec allows only one of them")
    group = values.get("group")
    if isinstance(group, int) and group < 1:
        raise fail(f"attribute group={group}; it must be a positive integer")


def _check_bodies(node, index, scope, where) -> None:
    """The structure of If/Loop/Scan bodies: outputs present, produced, and as many as the node needs."""
    label = _where_node(node, index, scope, where)
    bodies = {a.name: ([a.g] if a.type == AttributeProto.GRAPH else list(a.graphs)) for a in node.attribute
              if a.type in _GRAPH_TYPES}
    n_in, n_out = len(node.input), len(node.output)
    for name, graphs in bodies.items():
        for body in graphs:
            if not body.output:
                raise InvalidGraphError(f"{label}: its {name} has no outputs; a body must produce the node's results")
            made = {i.name for i in body.input} | {t.name for t in body.initializer}
            made |= {o for n in body.node for o in n.output if o}
            for o in body.output:
                if o.name not in made and node.domain in ("", "ai.onnx"):
                    raise InvalidGraphError(
                        f"{label}: output {o.name!r} of its {name} is produced by no node of the body; "
                        "the body is incomplete: re-export the model"
                    )
            if node.domain not in ("", "ai.onnx"):
                continue
            if node.op_type == "If" and len(body.output) != n_out:
                raise InvalidGraphError(f"{label}: its {name} has {len(body.output)} outputs, but the node has {n_out}")
            if node.op_type == "Loop":
                carried = n_in - 2
                if len(body.input) != 2 + carried or len(body.output) < 1 + carried or len(body.output) - 1 != n_out:
                    raise InvalidGraphError(
                        f"{label}: its body has {len(body.input)} inputs and {len(body.output)} outputs; with "
                        f"{carried} loop-carried value(s) and {n_out} node output(s) it needs {2 + carried} inputs "
                        f"and {1 + n_out} outputs (the condition first)"
                    )
            # (Scan-8 takes sequence_lens first, which its body does not see)
            if node.op_type == "Scan" and (len(body.input) not in (n_in, n_in - 1) or len(body.output) != n_out):
                raise InvalidGraphError(
                    f"{label}: its body has {len(body.input)} inputs and {len(body.output)} outputs, but the node "
                    f"has {n_in} inputs and {n_out} outputs; they must match"
                )


def _check_declared(g: onnx.GraphProto, bodies, where: str, initializers: Mapping | None = None) -> None:
    """No declared dim (graph inputs and outputs, value_info, initializers) is negative; ``bodies``:
    indices of the nodes of ``g`` with subgraphs (None: look at every node); ``initializers``: the dense
    initializers' (data type, dims) by name, where read already (None: read here)."""
    if initializers is not None and len(initializers) != len(g.initializer):
        initializers = None  # a name given twice: each tensor is looked at
    dims_of = ((t.name, t.dims) for t in g.initializer) if initializers is None else (
        (name, dims) for name, (_, dims) in initializers.items())
    if initializers is None or min(chain.from_iterable(d for _, d in initializers.values()), default=0) < 0:
        for name, dims in dims_of:
            if any(d < 0 for d in dims):
                raise InvalidGraphError(f"{where}: initializer {name!r} has dims {list(dims)}; dims cannot be negative")
    for kind, infos in (("graph output", g.output), ("value_info of tensor", g.value_info), ("graph input", g.input)):
        for vi in infos:
            t = vi.type.tensor_type if not vi.type.HasField("sequence_type") else vi.type.sequence_type.elem_type.tensor_type
            for i, d in enumerate(t.shape.dim if t.HasField("shape") else ()):
                if d.HasField("dim_value") and d.dim_value < 0:
                    raise ShapeError(
                        f"{where}: {kind} {vi.name!r} declares dim {i} as {d.dim_value}; dims cannot be negative: "
                        "fix the model" + (" or give --input-shape" if kind == "graph input" else "")
                    )
    for node in g.node if bodies is None else [g.node[i] for i in bodies]:
        for a in node.attribute:
            if a.type in _GRAPH_TYPES:
                for body in [a.g] if a.type == AttributeProto.GRAPH else a.graphs:
                    _check_declared(body, None, where)


# --------------------------------------------------------------------------------------------
# after shapes are resolved

# Convolutions: (index of X, index of W, whether W is [C_out, C_in/G, k...] (True) or
# ConvTranspose's [C_in, C_out/G, k...] (False)).
_CONVS = {"Conv": (0, 1, True), "ConvInteger": (0, 1, True), "QLinearConv": (0, 3, True),
          "ConvTranspose": (0, 1, False), "DeformConv": (0, 1, True)}
# Operators whose input at this index is a shape or repeat count: none of its values may be negative
# (Reshape allows one -1).
_TARGETS = {"Reshape": 1, "Tile": 1, "Expand": 1, "ConstantOfShape": 0}


# Windowed operators: (index of X, index of W or None where ``kernel_shape`` gives the window).
_WINDOWS = {"Conv": (0, 1), "ConvInteger": (0, 1), "QLinearConv": (0, 3), "DeformConv": (0, 1),
            "MaxPool": (0, None), "AveragePool": (0, None), "LpPool": (0, None)}
# Convolutions with a bias input: its index.
_BIASES = {"Conv": 2, "ConvTranspose": 2, "QLinearConv": 8, "DeformConv": 3}
# The standard operators check_resolved looks at.
_CHECKED_OPS = frozenset(_CONVS) | frozenset(_WINDOWS) | frozenset(_TARGETS)


def check_resolved(index: GraphIndex, tensors: Mapping[str, TensorInfo], values: Mapping, attributes, where: str) -> None:
    """Checks that need shapes or constant values; ``attributes`` is the per-node attribute list of
    the traversal (None for nodes whose attributes no formula reads)."""
    protos, names, node_inputs, node_ops = index.protos, index.names, index.node_inputs, index.node_ops
    passed: set[tuple] = set()  # the target and Reshape checks that passed, by what they read
    windows: set[tuple] = set()  # the convolution and window checks that passed, by what they read
    checked = {k for k in set(node_ops) if k[0] in ("", "ai.onnx") and k[1] in _CHECKED_OPS}
    get = tensors.get
    # the nodes of those kinds, picked by a C-level loop (most nodes of a large graph are none of them)
    for i in compress(range(len(node_ops)), map(checked.__contains__, node_ops)) if checked else ():
        op_type = node_ops[i][1]
        if op_type in _CONVS or op_type in _WINDOWS:
            # the window checks read the op type, the attributes (one shared dict per distinct set, or None) and
            # the inputs' shapes: the nodes alike (the layers of a deep network) are checked once
            attrs = attributes[i]
            key = (op_type, id(attrs) if attrs is not None else -1 - i,
                   *[None if (t := get(n)) is None else t[2] for n in node_inputs[i]])
            if key not in windows:
                if op_type in _CONVS:
                    _check_conv(protos[i], names[i], tensors, attrs, where)
                if op_type in _WINDOWS:
                    _check_window_fits(protos[i], names[i], tensors, attrs, where)
                windows.add(key)
        if op_type in _TARGETS:  # reads the op type and the value of one input
            at, inputs = _TARGETS[op_type], node_inputs[i]
            key = (op_type, inputs[at] if len(inputs) > at else "")
            if key not in passed:
                _check_target(protos[i], names[i], values, where)
                passed.add(key)
        if op_type == "Reshape":  # reads the input's shape, the target's value and the attributes
            inputs = node_inputs[i]
            x = tensors.get(inputs[0]) if inputs else None
            key = (*inputs[1:2], None if x is None else x.shape, *[a.SerializeToString() for a in protos[i].attribute])
            if key not in passed:
                _check_reshape_count(protos[i], names[i], tensors, values, attributes[i], where)
                passed.add(key)


def _check_conv(node, name, tensors, attrs, where) -> None:
    x_at, w_at, forward = _CONVS[node.op_type]
    if len(node.input) <= w_at:
        return
    x, w = tensors.get(node.input[x_at]), tensors.get(node.input[w_at])
    if x is None or w is None or not x.is_static or not w.is_static:
        return
    attrs = attrs or {a.name: helper.get_attribute_value(a) for a in node.attribute}
    group = attrs.get("group", 1)
    label = f"{where}: node {name!r} ({node.op_type})"
    if len(x.shape) != len(w.shape) or len(x.shape) < 3:
        raise InvalidGraphError(
            f"{label}: input {x.name!r} is {x.shape_text()} and weight {w.name!r} is {w.shape_text()}; both need "
            "the same rank, at least 3 (N, C, spatial...)"
        )
    c_in = x.shape[1]
    if forward:
        c_out, per_group = w.shape[0], w.shape[1]
        ok = per_group * group == c_in and c_out % group == 0
        need = f"weight dim 1 x group = C_in ({per_group} x {group} vs {c_in}) and group dividing C_out ({c_out})"
    else:
        ok = w.shape[0] == c_in and c_in % group == 0
        need = f"weight dim 0 = C_in ({w.shape[0]} vs {c_in}) and group ({group}) dividing C_in"
    if not ok:
        raise InvalidGraphError(
            f"{label}: input {x.name!r} {x.shape_text()}, weight {w.name!r} {w.shape_text()} and group={group} do not "
            f"fit: the spec needs {need}; fix the weight or the group attribute"
        )
    kernel = attrs.get("kernel_shape")
    if kernel and list(kernel) != list(w.shape[2:]):
        raise InvalidGraphError(
            f"{label}: kernel_shape={list(kernel)} contradicts weight {w.name!r} {w.shape_text()}; fix one of them"
        )
    b_at = _BIASES.get(node.op_type)
    b = tensors.get(node.input[b_at]) if b_at is not None and len(node.input) > b_at and node.input[b_at] else None
    if b is not None and b.is_static:
        c_out = w.shape[0] if forward else w.shape[1] * group
        if b.shape != (c_out,):
            raise InvalidGraphError(
                f"{label}: bias {b.name!r} is {b.shape_text()}, but weight {w.name!r} {w.shape_text()} (group={group}) "
                f"makes {c_out} output channels; the spec wants one bias per output channel, shape {c_out}: fix the "
                "bias or the weight"
            )


def _check_window_fits(node, name, tensors, attrs, where) -> None:
    """The window of a convolution or pooling with explicit pads (or none) has a position in its padded input: the
    spec's output size ``floor((X + pads - ((K - 1) * dilation + 1)) / stride + 1)`` (``ceil`` with ``ceil_mode``)
    is at least one. ONNX's inference divides with C++'s truncation toward zero, so that a window larger than its
    padded input by less than the stride gets an output size of 1 there, and the model would be counted."""
    x_at, w_at = _WINDOWS[node.op_type]
    x = tensors.get(node.input[x_at]) if len(node.input) > x_at else None
    if x is None or x.shape is None or len(x.shape) < 3:
        return
    attrs = attrs or {a.name: helper.get_attribute_value(a) for a in node.attribute}
    auto_pad = attrs.get("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode("utf-8", "replace") if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID"):
        return  # SAME_*: pads grow to keep ceil(X / stride) outputs
    kernel = attrs.get("kernel_shape")
    if not kernel and w_at is not None and len(node.input) > w_at:
        w = tensors.get(node.input[w_at])
        kernel = w.shape[2:] if w is not None and w.shape is not None else None
    spatial = x.shape[2:]
    rank = len(spatial)
    if not kernel or len(kernel) != rank:
        return
    pads = list(attrs.get("pads") or [0] * 2 * rank) if auto_pad == "NOTSET" else [0] * 2 * rank
    dilations = list(attrs.get("dilations") or [1] * rank)
    strides = list(attrs.get("strides") or [1] * rank)
    if len(pads) != 2 * rank or len(dilations) != rank or len(strides) != rank:
        return
    ceil = bool(attrs.get("ceil_mode", 0))
    for axis, (size, k, d, s) in enumerate(zip(spatial, kernel, dilations, strides)):
        if type(size) is not int or type(k) is not int or s < 1:
            continue
        begin, end = pads[axis], pads[axis + rank]
        padded, window = size + begin + end, (k - 1) * d + 1
        if padded >= window:
            continue
        out = (-((window - padded) // s) if ceil else (padded - window) // s) + 1  # ceil/floor((padded - window) / s) + 1
        if out < 1:
            rounding = "ceil" if ceil else "floor"
            raise InvalidGraphError(
                f"{where}: node {name!r} ({node.op_type}): its window on spatial axis {axis} spans {window} (kernel "
                f"{k}, dilation {d}), more than input {x.name!r} {x.shape_text()} with its pads ({begin} + {size} + "
                f"{end} = {padded}): the spec's output size {rounding}(({padded} - {window}) / {s} + 1) = {out} is "
                "not positive; fix the kernel, the pads or the input shape"
            )


def _check_target(node, name, values, where) -> None:
    at = _TARGETS[node.op_type]
    if len(node.input) <= at or not node.input[at]:
        return
    v = values.get(node.input[at])
    if v is None:
        return
    flat = np.asarray(v).reshape(-1)
    if flat.dtype.kind not in "iu" or not flat.size:
        return
    reshape = node.op_type == "Reshape"
    if flat.min() >= (-1 if reshape else 0) and not (reshape and np.count_nonzero(flat == -1) > 1):
        return
    what = {"Reshape": "target shape", "Tile": "repeats", "Expand": "shape", "ConstantOfShape": "shape"}[node.op_type]
    rule = "one -1 at most and no other negative value" if reshape else "no negative value"
    raise InvalidGraphError(
        f"{where}: node {name!r} ({node.op_type}): its {what} {node.input[at]!r} is {flat.tolist()}; the spec "
        f"allows {rule}: fix the model"
    )


def _check_reshape_count(node, name, tensors, values, attrs, where) -> None:
    """A Reshape keeps its element count: its target (a 0 copying the input's dim unless ``allowzero=1``, one -1
    taking what is left) must hold as many elements as its input. ONNX's inference writes the target as it is."""
    if len(node.input) < 2 or not node.input[1]:
        return
    x, v = tensors.get(node.input[0]), values.get(node.input[1])
    if x is None or not x.is_static or v is None:
        return
    target = np.asarray(v).reshape(-1)
    if target.dtype.kind not in "iu" or target.min(initial=0) < -1 or np.count_nonzero(target == -1) > 1:
        return  # refused by _check_target
    allowzero = (attrs or {a.name: helper.get_attribute_value(a) for a in node.attribute}).get("allowzero", 0)
    dims = [int(d) for d in target]
    for i, d in enumerate(dims):
        if d == 0 and not allowzero:
            if i >= len(x.shape):
                raise InvalidGraphError(
                    f"{where}: node {name!r} (Reshape): its target shape {node.input[1]!r} is {dims}, whose 0 at "
                    f"index {i} copies a dim input {x.name!r} {x.shape_text()} does not have: fix the model"
                )
            dims[i] = x.shape[i]
    elements = math.prod(int(d) for d in x.shape)
    known = math.prod(d for d in dims if d != -1)
    fits = (elements % known == 0 if known else elements == 0) if -1 in dims else elements == known
    if not fits:
        need = f"a multiple of {known}" if -1 in dims else f"{known}"
        raise InvalidGraphError(
            f"{where}: node {name!r} (Reshape): input {x.name!r} {x.shape_text()} holds {elements} elements, but its "
            f"target shape {node.input[1]!r} {list(map(int, target))} needs {need}; a Reshape keeps the element "
            "count: fix the target or the input shape"
        )


def fix_hint(inputs: Sequence[TensorInfo], inference_error: str) -> str:
    """How to fix unknown shapes: dynamic inputs with the dims that are known and placeholders for
    the rest (``x=1x3xHxW``), and the small integer inputs whose values shapes may depend on."""
    dynamic = [t for t in inputs if not t.is_static]
    valued = [t for t in inputs if _value_like(t)]
    parts = []
    if valued:
        parts.append(
            "Shapes may depend on the value of "
            + ", ".join(f"input {t.name!r} ({_dtype_name(t)} {t.shape_text()})" for t in valued)
            + ": give it, e.g. "
            + " ".join(f"--input-value {t.name}={'VALUE' if not t.shape else 'V1,V2'}" for t in valued)
            + " (in Python: input_values=...)."
        )
    dynamic = [t for t in dynamic if t not in valued or t.shape is None]
    if dynamic:
        examples = " ".join(f"--input-shape {t.name}={_placeholder_dims(t)}" for t in dynamic)
        parts.append(
            "Dynamic inputs: "
            + ", ".join(f"{t.name!r} ({t.shape_text() if t.shape is not None else 'rank unknown'})" for t in dynamic)
            + f". Fix them: {examples}, with sizes for the placeholders (or --batch N for the first dim; "
            "in Python: input_shapes=..., batch=...)."
        )
    if inference_error:
        parts.append(f"ONNX shape inference says: {inference_error}")
    return " ".join(parts)


def _placeholder_dims(t: TensorInfo) -> str:
    """``1x3xHxW``: known dims as they are, symbolic ones by their name in capitals, unnamed ones
    as N (dim 0) or D<i>."""
    if t.shape is None:
        return "DIMS"
    out = []
    for i, d in enumerate(t.shape):
        if isinstance(d, int):
            out.append(str(d))
        elif isinstance(d, str) and d and all(c.isalnum() or c == "_" for c in d) and "x" not in d.lower():
            out.append(d.upper())
        else:
            out.append("N" if i == 0 else f"D{i}")
    return "x".join(out)


def _value_like(t: TensorInfo) -> bool:
    """A small integer or bool input (a scalar or a vector: axes, sizes, a rate selecting a branch)."""
    return t.elem_type in _VALUE_TYPES and t.shape is not None and len(t.shape) <= 1


_VALUE_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL})


def _dtype_name(t: TensorInfo) -> str:
    return onnx.TensorProto.DataType.Name(t.elem_type).lower() if t.elem_type else "?"
