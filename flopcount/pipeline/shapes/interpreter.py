"""A small numpy interpreter: evaluation of the small integer subgraphs that compute shapes (folding), and the
scratch copies in which what it found is constant."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from math import prod

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ...context import TensorInfo
from ..graph import GraphIndex
from ..loading import copy_field
from .tensors import DIM_SAFE_OPS, FOLD_LIMIT

log = logging.getLogger(__name__)

# folding of small constant subgraphs


class LazyConstants(Mapping):
    """The model's small constant values (those :func:`small_constants` reads), each read on its first look-up:
    a count looks up a few (Reshape targets, axes) of a graph's many initializers. Iterating reads them all.
    ``index``, when given, holds the node lists already read from the protos."""

    def __init__(self, model: ModelProto, index: GraphIndex | None = None):
        self._model, self._graph_index, self._values = model, index, None
        self._initializers: dict | None = None  # name → initializer
        self._constants: dict | None = None  # name → Constant node
        self._read: dict[str, np.ndarray | None] = {}

    def _load(self) -> dict:
        if self._values is None:
            self._values = small_constants(self._model)
        return self._values

    def __getitem__(self, name):
        if self._values is not None:
            return self._values[name]
        value = self._read.get(name, self._read)
        if value is self._read:
            value = self._read[name] = self._one(name)
        if value is None:
            raise KeyError(name)
        return value

    def indexed(self) -> "LazyConstants":
        """``self``, with the initializers and Constant nodes indexed by name now rather than at the first look-up
        (for a caller with time to spare now: waiting on the inference child)."""
        if self._initializers is None:
            self._initializers = {t.name: t for t in self._model.graph.initializer}
            self._constants = _constant_nodes(self._model.graph, self._graph_index)
        return self

    def _one(self, name: str) -> np.ndarray | None:
        """What :func:`small_constants` gives ``name``, or None: a Constant node's value wins over an
        initializer's, as there."""
        self.indexed()
        node = self._constants.get(name)
        value = _small_constant_node(node) if node is not None else None
        if value is None and name in self._initializers:
            value = _small_initializer(self._initializers[name])
        return value

    def __iter__(self):
        return iter(self._load())

    def __len__(self):
        return len(self._load())


def small_constants(model: ModelProto) -> dict[str, np.ndarray]:
    values = {t.name: v for t in model.graph.initializer if (v := _small_initializer(t)) is not None}
    for name, node in _constant_nodes(model.graph).items():
        v = _small_constant_node(node)
        if v is not None:
            values[name] = v
    return values


def _constant_nodes(graph: onnx.GraphProto, index: GraphIndex | None = None) -> dict[str, onnx.NodeProto]:
    """Output name → the standard ``Constant`` node that writes it (from ``index``'s node lists when given)."""
    if index is None:
        return {n.output[0]: n for n in graph.node
                if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1}
    return {outs[0]: index.protos[k] for k, ((domain, op), outs) in enumerate(zip(index.node_ops, index.node_outputs))
            if op == "Constant" and domain in ("", "ai.onnx") and len(outs) == 1}


def _small_initializer(t: TensorProto) -> np.ndarray | None:
    """An inline initializer's value when it has at most FOLD_LIMIT elements, else None."""
    if t.data_location != TensorProto.EXTERNAL and prod(t.dims) <= FOLD_LIMIT and has_data(t):
        return inline_array(t)
    return None


def _small_constant_node(node: onnx.NodeProto) -> np.ndarray | None:
    """A Constant node's value when it has at most FOLD_LIMIT elements, else None."""
    v = constant_value(node)
    return v if v is not None and v.size <= FOLD_LIMIT else None


def inline_array(t: TensorProto) -> np.ndarray | None:
    """The value of an inline tensor; None for one that refers to external data (the loader
    strips such references, so this is a second lock: nothing here can open a file)."""
    if t.data_location == TensorProto.EXTERNAL or len(t.external_data):
        return None
    return numpy_helper.to_array(t)


def has_data(t: TensorProto) -> bool:
    if t.data_location == TensorProto.EXTERNAL or len(t.external_data):
        return False
    if prod(t.dims) == 0:
        return True
    return t.data_location != TensorProto.EXTERNAL and any(
        t.HasField(f) if f == "raw_data" else len(getattr(t, f)) > 0
        for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data")
    )


def constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for a in node.attribute:
        if a.name == "value":
            return inline_array(a.t) if has_data(a.t) else None
        if a.name in ("value_int", "value_ints"):
            return np.array(helper.get_attribute_value(a), dtype=np.int64)
        if a.name in ("value_float", "value_floats"):
            return np.array(helper.get_attribute_value(a), dtype=np.float32)
    return None


def fold_constants(model: ModelProto, index: GraphIndex, tensors: Mapping[str, TensorInfo], values: dict) -> bool:
    """Evaluate nodes whose inputs are known small constants; True when a new value was found."""
    if not values:
        values.update(small_constants(model))
    return _fold_nodes((index.protos[idx] for idx in index.order), tensors, values)


def _fold_nodes(nodes: Iterable[onnx.NodeProto], tensors: Mapping[str, TensorInfo], values: dict) -> bool:
    """:func:`fold_constants` over ``nodes`` in order, and into the branch each If with a known condition takes (its
    nodes are inlined by :func:`with_constants`, so an If nested there can be decided in turn: PyTorch's
    exports test an input's rank inside the branch that tests the sample rate)."""
    found = False
    for node in nodes:
        if node.domain not in ("", "ai.onnx") or not node.output:
            continue
        if node.output[0] not in values:
            outs = _evaluate(node, tensors, values)
            for name, v in zip(node.output, outs or ()):
                if isinstance(v, np.generic):  # numpy arithmetic on 0-d arrays gives scalars
                    v = np.asarray(v)
                if name and isinstance(v, np.ndarray) and v.size <= FOLD_LIMIT:  # not sequences
                    values[name] = v
                    found = True
        branch = _taken_branch(node, values)
        if branch is not None and not all(o in values for o in node.output if o):
            for t in branch.initializer:
                if t.name not in values and has_data(t) and prod(t.dims) <= FOLD_LIMIT:
                    values[t.name] = inline_array(t)
            for inner in branch.node:
                if inner.op_type == "Constant" and inner.output[0] not in values:
                    v = constant_value(inner)
                    if v is not None and v.size <= FOLD_LIMIT:
                        values[inner.output[0]] = v
            found = _fold_nodes(branch.node, tensors, values) or found
    return found


def evaluate_node(node: onnx.NodeProto, tensors: Mapping[str, TensorInfo], values: Mapping[str, np.ndarray],
                  limit: int = FOLD_LIMIT) -> list | None:
    """The outputs of ``node`` (a default-domain operator) from the values of its inputs (``values``, by name) and
    the resolved shapes (``tensors``: what Shape and Size read), or None where an input is not known, the node cannot
    be evaluated, or an input or output would hold more than ``limit`` elements (told before anything is computed)."""
    return _evaluate(node, tensors, values, limit)


def _evaluate(node, tensors, values, limit: int = FOLD_LIMIT) -> list | None:
    op = node.op_type
    if op in ("Shape", "Size"):
        t = tensors.get(node.input[0])
        if t is None or not t.is_static:
            return None
        shape = np.array(t.shape, dtype=np.int64)
        if op == "Size":
            return [np.array(prod(t.shape), dtype=np.int64)]
        attrs = {a.name: a.i for a in node.attribute}  # ONNX start/end clamp like Python slices
        return [shape[attrs.get("start", 0) : attrs.get("end")]]
    if op == "CastLike":  # needs only the target's dtype, which inference knows
        target = tensors.get(node.input[1])
        if node.input[0] not in values or target is None or not target.elem_type:
            return None
        return [values[node.input[0]].astype(helper.tensor_dtype_to_np_dtype(target.elem_type))]
    if op == "If":
        return _evaluate_if(node, tensors, values)
    if op in _NONDETERMINISTIC or op == "Constant":
        return None
    args = []
    for name in node.input:
        if not name:
            args.append(None)
        elif name in values:
            args.append(values[name])
        else:
            return None
    if any(a is not None and a.size > limit for a in args):
        return None
    fn = _FOLDERS.get(op)
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if not _fits(node, args, tensors, fn is not None, limit):
        return None
    try:
        if fn is not None:
            out = fn(attrs, *args)
            return list(out) if isinstance(out, tuple) else [out]
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
            return None
        from onnx.reference import ReferenceEvaluator

        feeds = {n: a for n, a in zip(node.input, args) if n}
        return list(ReferenceEvaluator(node).run(None, feeds))
    except Exception as e:  # a node that cannot be evaluated simply stays unfolded
        log.debug("not folding %s %r: %s", op, node.name, e)
        return None


def _fits(node: onnx.NodeProto, args: list, tensors: Mapping[str, TensorInfo], folder: bool,
          limit: int = FOLD_LIMIT) -> bool:
    """Whether the outputs of ``node`` on ``args`` hold at most ``limit`` elements, told
    before anything is computed: a hostile constant (``Range(0, 2**40)``, ``Tile`` by 10**9) must
    not make folding allocate. Operators that generate data from values (Range, Expand, Tile,
    ConstantOfShape, windows, Pad, Resize ...) are folded only when their output size is known small;
    the others (:data:`DIM_SAFE_OPS`) give outputs no larger than the product of their inputs."""
    try:
        op = node.op_type
        if op == "Range":
            start, stop, delta = (float(np.asarray(a).reshape(-1)[0]) for a in args[:3])
            return delta != 0 and max(np.ceil((stop - start) / delta), 0) <= limit
        if op in ("Expand", "Tile"):
            x, v = args[0], [int(d) for d in np.asarray(args[1]).reshape(-1)]
            if any(d < 0 for d in v):
                return False
            if op == "Tile":
                return prod(d * r for d, r in zip(x.shape, v)) <= limit
            rank = max(x.ndim, len(v))
            dims = [1] * (rank - x.ndim) + list(x.shape)
            wanted = [1] * (rank - len(v)) + v
            return prod(max(d, w) for d, w in zip(dims, wanted)) <= limit
        if op == "ConstantOfShape":
            v = [int(d) for d in np.asarray(args[0]).reshape(-1)]
            return all(d >= 0 for d in v) and prod(v) <= limit
    except (TypeError, ValueError, OverflowError, IndexError, AttributeError):
        return False
    outs = [tensors.get(o) for o in node.output if o]
    if outs and all(t is not None and t.is_static for t in outs):
        return all(0 <= prod(t.shape) <= limit for t in outs)
    return folder or op in DIM_SAFE_OPS


def _taken_branch(node: onnx.NodeProto, values: Mapping[str, np.ndarray]) -> onnx.GraphProto | None:
    """The subgraph an If node runs when its condition is a known constant, else None."""
    if node.op_type != "If" or node.domain not in ("", "ai.onnx"):
        return None
    cond = values.get(node.input[0])
    if cond is None or cond.size != 1:
        return None
    name = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
    return next((a.g for a in node.attribute if a.name == name), None)


def _evaluate_if(node, tensors, values) -> list | None:
    """An If whose condition is a known constant: evaluate the branch it takes."""
    branch = _taken_branch(node, values)
    if branch is None:
        return None
    local = dict(values)
    for t in branch.initializer:
        if has_data(t) and prod(t.dims) <= FOLD_LIMIT:
            local[t.name] = inline_array(t)
    for inner in branch.node:
        if inner.op_type == "Constant":
            v = constant_value(inner)
            outs = None if v is None else [v]
        else:
            outs = _evaluate(inner, tensors, local)
        if outs is None:
            return None
        for name, v in zip(inner.output, outs):
            if name and isinstance(v, (np.ndarray, np.generic)):
                local[name] = np.asarray(v)
    return [local.get(o.name) for o in branch.output]


def with_constants(model: ModelProto, index: GraphIndex, values: Mapping[str, np.ndarray]) -> ModelProto:
    """A scratch copy in which every folded tensor is an initializer and its producer is removed."""
    scratch = ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            copy_field(scratch, field, value)
    g = scratch.graph
    g.name = model.graph.name
    g.input.extend(model.graph.input)
    g.output.extend(model.graph.output)
    # a folded tensor's declared type would override its value (a quantizer's stale ``unk__1`` dims)
    g.value_info.extend(vi for vi in model.graph.value_info if vi.name not in values)
    have = {t.name for t in model.graph.initializer}
    g.initializer.extend(model.graph.initializer)
    _inline_taken(model.graph.node, values, g)
    have |= {t.name for t in g.initializer}
    for name, v in values.items():
        if name not in have:
            g.initializer.append(numpy_helper.from_array(np.asarray(v), name))
    return scratch


def _inline_taken(nodes: Iterable[onnx.NodeProto], values: Mapping[str, np.ndarray], g: onnx.GraphProto) -> None:
    """Append ``nodes`` to ``g`` less those whose outputs are all folded, with each If whose condition is known
    replaced by the branch it takes (recursively: an If nested in that branch too), so its output shapes are
    exact."""
    for node in nodes:
        if node.output and all((not o) or o in values for o in node.output):
            continue
        branch = _taken_branch(node, values)
        if branch is None:
            g.node.append(node)
            continue
        g.initializer.extend(t for t in branch.initializer if t.name not in values)
        _inline_taken(branch.node, values, g)
        for inner, outer in zip(branch.output, node.output):
            if outer:
                g.node.append(helper.make_node("Identity", [inner.name], [outer]))


def _i64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.int64)


def _slice(attrs, data, starts=None, ends=None, axes=None, steps=None):
    starts = _i64(attrs["starts"] if starts is None and "starts" in attrs else starts)
    ends = _i64(attrs["ends"] if ends is None and "ends" in attrs else ends)
    if axes is None:
        axes = attrs.get("axes", range(len(starts)))
    axes = [int(a) % data.ndim for a in _i64(axes).reshape(-1)]
    steps = _i64(np.ones(len(starts)) if steps is None else steps)
    index = [slice(None)] * data.ndim
    for a, s, e, st in zip(axes, starts, ends, steps):
        index[a] = slice(int(s), int(e), int(st))
    return data[tuple(index)]


def _axes(attrs, axes):
    if axes is None:
        axes = attrs.get("axes")
    return None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]


def _unsqueeze(attrs, data, axes=None):
    axes = sorted(a % (data.ndim + len(_axes(attrs, axes))) for a in _axes(attrs, axes))
    for a in axes:
        data = np.expand_dims(data, a)
    return data


def _squeeze(attrs, data, axes=None):
    axes = _axes(attrs, axes)
    return np.squeeze(data) if axes is None else np.squeeze(data, axis=tuple(a % data.ndim for a in axes))


def _reshape(attrs, data, shape):
    shape = [int(s) for s in shape]
    if not attrs.get("allowzero", 0):
        shape = [data.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return data.reshape(shape)


def _div(attrs, a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        return (np.trunc(a / b)).astype(np.result_type(a, b))  # ONNX integer Div truncates
    return a / b


def _cast(attrs, x):
    return x.astype(helper.tensor_dtype_to_np_dtype(attrs["to"]))


def _constant_of_shape(attrs, shape):
    fill = inline_array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
    if fill is None or fill.size == 0:
        raise ValueError("no inline fill value")
    dims = [int(d) for d in shape]  # its size was checked before (_fits)
    return np.full(dims, fill.reshape(-1)[0], dtype=fill.dtype)


def _reduce(np_fn):
    def fold(attrs, data, axes=None):
        axes = _axes(attrs, axes)
        keep = bool(attrs.get("keepdims", 1))
        if axes is None or (len(axes) == 0 and not attrs.get("noop_with_empty_axes", 0)):
            axes = list(range(data.ndim))
        return np_fn(data, axis=tuple(a % data.ndim for a in axes), keepdims=keep)

    return fold


_FOLDERS: dict[str, Callable] = {
    "Identity": lambda at, x: x,
    "Cast": _cast,
    "Gather": lambda at, d, i: np.take(d, i.astype(np.int64), axis=at.get("axis", 0)),
    "Slice": _slice,
    "Concat": lambda at, *xs: np.concatenate([x for x in xs if x is not None], axis=at["axis"]),
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Flatten": lambda at, x: x.reshape(prod(x.shape[: at.get("axis", 1)]), -1),
    "ConstantOfShape": _constant_of_shape,
    "Range": lambda at, s, l, d: np.arange(s.item(), l.item(), d.item(), dtype=np.result_type(s, l, d)),
    "Add": lambda at, a, b: a + b,
    "Sub": lambda at, a, b: a - b,
    "Mul": lambda at, a, b: a * b,
    "Div": _div,
    "Mod": lambda at, a, b: np.fmod(a, b) if at.get("fmod", 0) else np.mod(a, b),
    "Neg": lambda at, x: -x,
    "Abs": lambda at, x: np.abs(x),
    "Max": lambda at, *xs: np.maximum.reduce(list(np.broadcast_arrays(*xs))),
    "Min": lambda at, *xs: np.minimum.reduce(list(np.broadcast_arrays(*xs))),
    "Equal": lambda at, a, b: np.equal(a, b),
    "Less": lambda at, a, b: np.less(a, b),
    "Greater": lambda at, a, b: np.greater(a, b),
    "Not": lambda at, x: np.logical_not(x),
    "Where": lambda at, c, a, b: np.where(c, a, b),
    "Expand": lambda at, x, s: x * np.ones([int(d) for d in s], dtype=x.dtype),
    "Tile": lambda at, x, r: np.tile(x, [int(v) for v in r]),
    "Transpose": lambda at, x: np.transpose(x, at.get("perm")),
    "ReduceProd": _reduce(np.prod),
    "ReduceSum": _reduce(np.sum),
    "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min),
}

_NONDETERMINISTIC = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout"}
)
