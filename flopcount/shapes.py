"""Shape resolution: user overrides, ONNX shape inference with data propagation, and evaluation of
the small integer subgraphs that compute shapes.

ONNX's own inference resolves static graphs in one pass. Exported graphs often compute Reshape
targets or ConstantOfShape sizes at run time (``Shape → Gather → Concat → Reshape``, ``Range``,
``Where(Equal(...))``); when dims remain unknown, :func:`resolve` evaluates every node whose inputs
are known small constants (shape vectors, never weights), turns the results into initializers of a
scratch copy and infers again, until nothing new resolves.
"""

from __future__ import annotations

import functools
import gc
import importlib.util
import logging
import marshal
import os
import re
import signal
import sys
import threading
import warnings
from dataclasses import dataclass
from math import prod
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from .context import TensorInfo
from .errors import ShapeError, UsageError, first_line
from .graph import GraphIndex, node_label
from .loading import copy_field

log = logging.getLogger(__name__)

MAX_ROUNDS = 12
FOLD_LIMIT = 4096  # largest tensor (elements) evaluated while folding shape subgraphs
#: Largest dim, and largest element count of any tensor, that a model or an option may give
#: (2**48 elements: 1 PiB of float32). Above it a shape is an error, never a count; it also keeps
#: every product of dims far inside int64, where ONNX's inference does its arithmetic.
MAX_ELEMENTS = 2**48


@dataclass(frozen=True)
class Resolution:
    tensors: Mapping[str, TensorInfo]
    values: Mapping[str, np.ndarray]  # small constants known without weights
    inputs: tuple[TensorInfo, ...]  # real graph inputs, after overrides
    rounds: int  # inference passes run
    inference_error: str  # what strict ONNX inference says about unresolved dims ("" if nothing)


# --------------------------------------------------------------------------------------------
# input overrides


def parse_dims(text: str) -> tuple[int, ...]:
    """``"8x3x224x224"`` (or ``8,3,224,224``) → ``(8, 3, 224, 224)``; ``""`` → ``()`` (a scalar)."""
    text = text.strip()
    if not text:
        return ()
    parts = re.split(r"[x,×*]", text)
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"cannot read shape {text!r}: write dims as integers joined by 'x', e.g. 8x3x224x224") from None
    if any(d <= 0 for d in dims):
        raise UsageError(f"shape {text!r} has a zero or negative dim; every dim must be a positive integer")
    if any(d > MAX_ELEMENTS for d in dims) or prod(dims) > MAX_ELEMENTS:
        raise UsageError(f"shape {text!r} is too large: a tensor may hold at most 2**48 elements; give real dims")
    return dims


def _tensor_type(vi: onnx.ValueInfoProto):
    """The tensor type of a tensor value, or of the elements of a sequence value."""
    if vi.type.HasField("sequence_type"):
        return vi.type.sequence_type.elem_type.tensor_type
    return vi.type.tensor_type


def _declared_shape(vi: onnx.ValueInfoProto) -> tuple | None:
    t = _tensor_type(vi)
    if not t.HasField("shape"):
        return None
    return tuple(_dim(d) for d in t.shape.dim)


def _dim(d) -> int | str | None:
    if d.HasField("dim_value"):
        return d.dim_value
    return d.dim_param or None


def apply_overrides(
    model: ModelProto,
    real_inputs: Sequence[str],
    input_shapes: Mapping[str, Sequence[int]],
    batch: int | None,
    where: str,
) -> bool:
    """Set input dims in place from ``input_shapes`` and ``batch``; True when anything changed."""
    by_name = {vi.name: vi for vi in model.graph.input}
    unknown = [n for n in input_shapes if n not in real_inputs]
    if unknown:
        raise UsageError(
            f"{where}: --input-shape names {', '.join(map(repr, unknown))}, which is not an input of the "
            f"model; its inputs are: {', '.join(map(repr, real_inputs)) or '(none)'}"
        )
    if batch is not None and not 0 < batch <= MAX_ELEMENTS:
        raise UsageError(f"--batch must be a positive integer of at most 2**48, not {batch}")
    for name, dims in input_shapes.items():
        if any(not isinstance(d, int) or d <= 0 or d > MAX_ELEMENTS for d in dims) or prod(dims) > MAX_ELEMENTS:
            raise UsageError(f"{where}: the shape given for input {name!r} ({list(dims)}) must be positive integers, "
                             "with at most 2**48 elements in all")
    if batch is not None:
        for name, dims in input_shapes.items():
            if len(dims) and dims[0] != batch:
                raise UsageError(
                    f"{where}: --batch {batch} (batch=) and --input-shape {name}={'x'.join(map(str, dims))} "
                    f"(input_shapes=) give dim 0 of input {name!r} differently ({batch} and {dims[0]}); "
                    "give one of them, or both alike"
                )
    _dynamic_minus_one(model, real_inputs)
    for name in real_inputs:
        declared = _declared_shape(by_name[name])
        for i, d in enumerate(declared or ()):
            if isinstance(d, int) and d < 0:
                raise ShapeError(
                    f"{where}: graph input {name!r} declares dim {i} as {d}; dims cannot be negative: "
                    f"fix the model or give --input-shape {name}=..."
                )
    changed = False
    for name in real_inputs:
        vi = by_name[name]
        declared = _declared_shape(vi)
        if name in input_shapes:
            dims = tuple(input_shapes[name])
            if declared is not None and len(declared) != len(dims):
                raise UsageError(
                    f"{where}: input {name!r} has rank {len(declared)} "
                    f"({'x'.join(str(d) if d is not None else '?' for d in declared)}), "
                    f"but --input-shape gives {len(dims)} dims"
                )
        elif batch is not None and declared:
            dims = (batch, *declared[1:])
        else:
            continue
        if dims != declared:
            changed = True
            shape = _tensor_type(vi).shape
            shape.ClearField("dim")
            for d in dims:
                if isinstance(d, int):
                    shape.dim.add().dim_value = d
                elif d:
                    shape.dim.add().dim_param = d
                else:
                    shape.dim.add()
    if changed:
        # Annotations written for the old shapes would contradict the new ones.
        model.graph.ClearField("value_info")
        for o in model.graph.output:
            if o.type.tensor_type.HasField("shape"):
                o.type.tensor_type.ClearField("shape")
    return changed


def _dynamic_minus_one(model: ModelProto, real_inputs: Sequence[str]) -> None:
    """Graph inputs that declare a dim as -1 (Paddle2ONNX's way of writing a dynamic dim) get an
    unknown dim instead, in place; ``--input-shape`` and ``--batch`` fix it like a symbolic one."""
    wanted = set(real_inputs)
    for vi in model.graph.input:
        if vi.name in wanted and _tensor_type(vi).HasField("shape"):
            for d in _tensor_type(vi).shape.dim:
                if d.HasField("dim_value") and d.dim_value == -1:
                    d.Clear()


# --------------------------------------------------------------------------------------------
# inference


def _infer(model: ModelProto, where: str, strict: bool = False, hint: bool = True, guard: bool = True) -> ModelProto:
    """ONNX's inference of ``model``, guarded (see :func:`_guard_depths`) so that no negative dim
    reaches the code in it that aborts the process; raises :class:`ShapeError` on a negative or
    oversized dim, or when inference fails. ``guard=False``: the caller knows that no Slice is at
    risk (see :func:`_guard_needed`).

    With a Slice at risk, inference runs once, whole, in a forked child (:func:`_contained_inference`), which
    an abort kills instead of this process; where it finishes and every dim checks, that is the answer (one
    inference, whatever the graph's depth). Only where it crashed, a dim is wrong, or no child can be forked,
    the graph is inferred depth by depth, each depth's dims checked before a Slice of the next reads them, so
    that the error names the node that made the first wrong dim and the process never aborts."""
    depths = _guard_depths(model.graph) if guard else None
    if depths is None:
        return _infer_plain(model, where, strict)
    whole = _contained_inference(model, strict)
    if whole is not None:
        kind, data = whole
        if kind == "E":
            if strict:
                raise RuntimeError(data)
            raise _inference_failed(where, data)
        inferred = onnx.load_from_string(data)
        try:
            check_dims(_collect(inferred), model, where, hint)
            return inferred
        except ShapeError:
            log.debug("%s: a wrong dim after inference: inferred again depth by depth to name its node", where)
    for d in range(max(depths) + 1):
        part = model if d == max(depths) else _nodes_up_to(model, depths, d)
        inferred = _infer_plain(part, where, strict)
        check_dims(_collect(inferred), model, where, hint)
    return inferred


def _contained_inference(model: ModelProto, strict: bool) -> tuple[str, str | bytes] | None:
    """ONNX's inference of the whole ``model`` in a forked child: ``("M", the inferred model serialized)``, or
    ``("E", the first line of the inference error)``; None where no child may be forked (:func:`_fork_safe`) or
    it did not exit cleanly (ONNX's C++ aborting on a negative dim: the caller then guards depth by depth)."""
    if not _fork_safe():
        return None
    forked = _fork_with_pipe()
    if forked is None:
        return None
    pid, read, write = forked
    if pid == 0:  # the child: infer, write, exit without running any of the parent's cleanup (see Inference)
        gc.disable()
        done = False
        try:
            os.close(read)
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
            except OSError:
                pass
            from onnx.onnx_cpp2py_export import shape_inference as cpp

            try:
                data = b"M" + cpp.infer_shapes(model.SerializeToString(), False, strict, data_prop_bounded(model))
            except Exception as e:  # InferenceError, ValidationError, or RuntimeError from C++
                data = b"E" + first_line(e).encode("utf-8", "replace")
            view = memoryview(data)
            while view:
                view = view[os.write(write, view):]
            done = True
        finally:
            os._exit(0 if done else 1)
    os.close(write)
    chunks = []
    try:
        while chunk := os.read(read, 1 << 20):
            chunks.append(chunk)
    except OSError:
        chunks = []
    finally:
        os.close(read)
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    data = b"".join(chunks)
    if not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0) or data[:1] not in (b"M", b"E"):
        return None
    return ("M", data[1:]) if data[:1] == b"M" else ("E", data[1:].decode("utf-8", "replace"))


def _infer_plain(model: ModelProto, where: str, strict: bool = False) -> ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=strict,
                                                 data_prop=data_prop_bounded(model))
    except Exception as e:  # InferenceError, ValidationError, or RuntimeError from C++
        if strict:
            raise
        raise _inference_failed(where, first_line(e)) from None


#: Most elements of a one-dimensional tensor that ONNX's data propagation may see. It holds the values of a 1-D
#: tensor of known length as shape dims, about 150 bytes each, with no bound, and again for every Cast, Add, Mul ...
#: that reads it: Range(0, 2**24) → Cast takes over 4 GB. No shape has this many dims.
DATA_PROP_LIMIT = 2**16


def _fork_with_pipe() -> tuple[int, int, int] | None:
    """``(pid, read, write)``: a forked child (pid 0 in the child) and a pipe between the two, or None where the pipe
    or the fork cannot be made (the caller then infers in this process)."""
    try:
        read, write = os.pipe()
    except OSError:
        return None
    try:
        with warnings.catch_warnings():  # Python >= 3.12 warns of native threads: see _may_fork
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(read)
        os.close(write)
        return None
    return pid, read, write


def data_prop_bounded(model: ModelProto) -> bool:
    """Whether ONNX's data propagation stays bounded on ``model``: no graph input or initializer of rank 1, and no
    integer Range of the top graph, holds more than :data:`DATA_PROP_LIMIT` elements. A Range's size is known from
    its constant inputs, or from inputs computed from declared shapes and constants (``Range(0, Size(x))``) as
    :func:`_fold` computes them. Where it is not bounded, inference runs without data propagation, and folding
    (:func:`resolve`) computes the small shape vectors instead."""
    g = model.graph
    for t in g.initializer:
        if len(t.dims) == 1 and t.dims[0] > DATA_PROP_LIMIT:
            log.debug("initializer %r has %d elements: inference without data propagation", t.name, t.dims[0])
            return False
    for vi in g.input:
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 1 and dims[0].dim_value > DATA_PROP_LIMIT:
            log.debug("input %r has %d elements: inference without data propagation", vi.name, dims[0].dim_value)
            return False
    ranges = [i for i, n in enumerate(g.node) if n.op_type == "Range" and n.domain in ("", "ai.onnx")]
    for i, (size, _) in (_range_sizes(model, ranges).items() if ranges else ()):
        if size > DATA_PROP_LIMIT:
            log.debug("Range %r has %d elements: inference without data propagation", g.node[i].name, size)
            return False
    return True


def _range_sizes(model: ModelProto, ranges: Sequence[int]) -> dict[int, tuple[int, np.dtype]]:
    """Element count and type of the integer Ranges at ``ranges`` (node indices) whose inputs are known: constants,
    else values folded from declared shapes and constants. A size computed from inferred shapes becomes a constant
    in the next round of :func:`resolve`, whose inference asks again."""
    g = model.graph
    values: dict = {}
    constants = _LazyConstants(model)
    inputs = {x for i in ranges for x in g.node[i].input[:3] if x}
    for x in inputs:
        v = constants.get(x)
        if v is not None:
            values[x] = v
    sizes = _known_range_sizes(g, ranges, values)
    rest = [i for i in ranges if i not in sizes]
    if rest:
        producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
        wanted, stack = set(), [x for i in rest for x in g.node[i].input[:3] if x and x not in values]
        while stack:
            k = producer.get(stack.pop())
            if k is not None and k not in wanted:
                wanted.add(k)
                if g.node[k].op_type not in ("Shape", "Size"):  # they read a shape, not what computed it
                    stack.extend(x for x in g.node[k].input if x)
        order = sorted(wanted)
        known = _collect(model, bodies=False)  # declared shapes only: no inference here
        local = dict(values)
        for k in order:
            node = g.node[k]
            local.update({o: constants[o] for o in node.output if o in constants})
            if all(o in local for o in node.output if o):
                continue
            outs = _evaluate(node, known, local)
            for o, v in zip(node.output, outs or ()):
                if o and isinstance(v, (np.ndarray, np.generic)):
                    local[o] = np.asarray(v)
        sizes.update(_known_range_sizes(g, rest, local))
    return sizes


def _known_range_sizes(g: onnx.GraphProto, ranges: Sequence[int], values: Mapping) -> dict[int, tuple[int, np.dtype]]:
    """Element count and type of the integer Ranges at ``ranges`` whose three inputs are in ``values``."""
    sizes = {}
    for i in ranges:
        args = [values.get(x) if x else None for x in g.node[i].input[:3]]
        if len(args) < 3 or any(a is None or a.size != 1 or a.dtype.kind not in "iu" for a in args):
            continue
        start, limit, delta = (int(a.reshape(-1)[0]) for a in args)
        if delta:
            sizes[i] = (max(-((start - limit) // delta), 0), args[0].dtype)  # ceil((limit - start) / delta)
    return sizes


# Standard operators whose inferred output dims are never negative when their input dims are not
# (copies, sums, products or clamped slices of them). Any other operator (convolution and pooling
# windows, Pad, Resize, Split with sizes, Tile, DFT, other domains ...) may turn a hostile attribute
# or constant into a negative dim, and ONNX's Slice inference aborts the process on one (an
# assertion in std::clamp). A Slice downstream of such an operator is inferred only once the dims
# feeding it are checked: see _guard_depths.
_DIM_SAFE_OPS = frozenset("""
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


def _guard_depths(graph: onnx.GraphProto) -> list[int] | None:
    """Per node of ``graph``: how many Slice nodes at risk lie on the longest path that ends at it
    (itself included); None when no Slice is at risk. A Slice is at risk when an operator outside
    :data:`_DIM_SAFE_OPS` precedes it; a node with subgraphs counts as unsafe, and as a Slice when
    one of its bodies holds one. Paths follow ONNX's own order of inference (the order of the
    nodes), so a read of a tensor produced further down does not count: ONNX does not see its shape
    either. Inferring the nodes of depth <= d, for d = 0, 1, ..., checks every Slice's input dims
    before a Slice sees them."""
    nodes = graph.node
    kinds = [_guard_kind(n) for n in nodes]
    if not any(slice_like for _, slice_like in kinds) or all(safe for safe, _ in kinds):
        return None
    if any(n.op_type == "Expand" for n in nodes):
        dims = _dim_vectors(graph)
        kinds = [(True, False) if n.op_type == "Expand" and n.domain in ("", "ai.onnx") and len(n.input) > 1
                 and n.input[1] in dims else k for n, k in zip(nodes, kinds)]
        if all(safe for safe, _ in kinds):
            return None
    tainted: dict[str, bool] = {}
    depth_of: dict[str, int] = {}
    depths = []
    for node, (safe, slice_like) in zip(nodes, kinds):
        reads = list(node.input)
        if not safe:
            from .graph import subgraph_outer_names

            reads += sorted(subgraph_outer_names(node))
        taint = any(tainted.get(x, False) for x in reads)
        depth = max((depth_of.get(x, 0) for x in reads), default=0) + (1 if slice_like and taint else 0)
        depths.append(depth)
        for o in node.output:
            if o:
                tainted[o] = taint or not safe
                depth_of[o] = depth
    return depths if max(depths, default=0) > 0 else None


#: Operators that pass on (some of) the values of their first input unchanged: a vector of dims stays one.
_SELECTING_OPS = frozenset({"Slice", "Gather", "Concat", "Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten"})


def _dim_vectors(graph: onnx.GraphProto) -> set[str]:
    """Tensors of ``graph`` whose values are dims of other tensors or non-negative integer constants: the outputs of
    Shape and Size, non-negative Constant and initializer integers, and what Slice, Gather, Concat, (Un)squeeze,
    Reshape and Identity select of them. An Expand to such a shape has no negative output dim unless its inputs
    have one (the dims it reads are checked where those tensors are), so it needs no guard of its own."""
    found = {t.name for t in graph.initializer if t.data_type in (TensorProto.INT64, TensorProto.INT32)
             and _has_data(t) and prod(t.dims) <= FOLD_LIMIT and (_array(t) >= 0).all()}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or not node.output:
            continue
        op = node.op_type
        if op in ("Shape", "Size"):
            found.add(node.output[0])
        elif op == "Constant":
            v = _constant_value(node)
            if v is not None and v.dtype.kind in "iu" and v.size <= FOLD_LIMIT and (v >= 0).all():
                found.add(node.output[0])
        elif op in _SELECTING_OPS:
            data = node.input if op == "Concat" else node.input[:1]
            if data and all(x in found for x in data if x):
                found.add(node.output[0])
    return found


def _guard_needed(index: GraphIndex) -> bool:
    """Whether the graph of ``index`` may hold a Slice at risk (cheap: from the op types read once)."""
    ops = set(index.node_ops)
    if index.bodies:
        return True
    if ("", "Slice") not in ops and ("ai.onnx", "Slice") not in ops:
        return False
    return any(d not in ("", "ai.onnx") or o not in _DIM_SAFE_OPS for d, o in ops)


def _guard_kind(node: onnx.NodeProto) -> tuple[bool, bool]:
    """(dim-safe, Slice-like) of one node."""
    if node.domain not in ("", "ai.onnx"):
        return False, False
    if node.op_type in _SUBGRAPH_OPS:
        return False, any(_holds_slice(g) for a in node.attribute
                          for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs))
    if node.op_type == "Split":
        return len(node.input) < 2 or not node.input[1], False  # without sizes, parts are even
    return node.op_type in _DIM_SAFE_OPS, node.op_type == "Slice"


def _holds_slice(g: onnx.GraphProto) -> bool:
    return any(_guard_kind(n)[1] for n in g.node)


def _nodes_up_to(model: ModelProto, depths: Sequence[int], d: int) -> ModelProto:
    """A copy of ``model`` with only the nodes of guard depth <= ``d`` (and the outputs they keep)."""
    part = ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            copy_field(part, field, value)
    g = part.graph
    for field, value in model.graph.ListFields():
        if field.name not in ("node", "output", "value_info"):
            copy_field(g, field, value)
    kept = [n for n, k in zip(model.graph.node, depths) if k <= d]
    g.node.extend(kept)
    made = {o for n in kept for o in n.output} | {i.name for i in model.graph.input}
    g.output.extend(o for o in model.graph.output if o.name in made)
    g.value_info.extend(v for v in model.graph.value_info if v.name in made)
    return part


def check_dims(tensors: Mapping[str, TensorInfo], model: ModelProto, where: str, hint: bool = True) -> None:
    """Raise :class:`ShapeError` when an inferred dim is negative, or a tensor holds more than
    :data:`MAX_ELEMENTS` elements, naming the node that makes it, its inputs and, where a larger
    input would cure it, the smallest input that works. A convolution or pooling window that
    leaves no output position (a zero spatial dim from a non-empty input) is as wrong as a negative dim."""
    empty = False
    odd = getattr(tensors, "odd", None)
    for t in tensors.values() if odd is None else [tensors[n] for n in odd if n in tensors]:
        shape = t[2]
        if not shape:
            continue
        known = [d for d in shape if type(d) is int]
        if known and (min(known) < 0 or max(known) > MAX_ELEMENTS or prod(known) > MAX_ELEMENTS):
            raise _bad_dims_error(t, tensors, model, where, hint)
        empty = empty or (known and min(known) == 0)
    if empty:
        for node in model.graph.node:
            if node.op_type in _WINDOW_OPS and node.domain in ("", "ai.onnx") and node.output:
                x, y = tensors.get(node.input[0]) if node.input else None, tensors.get(node.output[0])
                if (x is not None and x.is_static and 0 not in x.shape and y is not None and y.is_static
                        and 0 in y.shape[2:]):
                    raise _bad_dims_error(y, tensors, model, where, hint)


def _bad_dims_error(t: TensorInfo, tensors: Mapping[str, TensorInfo], model: ModelProto, where: str,
                    hint: bool) -> ShapeError:
    node = _producer(model.graph, t.name)
    known = [d for d in t.shape if type(d) is int]
    what = ("a negative dim" if min(known) < 0 else "an empty window output" if min(known) == 0
            else "more than 2**48 elements")
    if node is None:
        return ShapeError(f"{where}: tensor {t.name!r} has shape {t.shape_text()}, {what}; fix the model")
    label = node.name or node.op_type
    ins = ", ".join(f"{x!r} {tensors[x].shape_text() if x in tensors else '?'}" for x in node.input if x)
    text = (f"{where}: node {label!r} ({node.op_type}) makes tensor {t.name!r} of shape {t.shape_text()}, {what}, "
            f"from its inputs {ins or '(none)'}")
    if not what.startswith("more"):
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute if a.name in _WINDOW_ATTRIBUTES}
        if attrs:
            text += " and " + ", ".join(f"{k}={v}" for k, v in attrs.items())
            text += ": its window is larger than its padded input"
        smallest = _smallest_input(model, where) if hint else ""
        if smallest:
            text += f"; the smallest input that works is --input-shape {smallest}"
        else:
            text += "; check its attributes and the values feeding it"
    else:
        text += "; no real tensor is that large: check the model's constants and --input-shape"
    return ShapeError(text)


_WINDOW_ATTRIBUTES = ("kernel_shape", "strides", "dilations", "pads")
SEARCH_MAX_NODES = 20_000  # larger graphs get no smallest-input search (a few dozen inferences)
_WINDOW_OPS = frozenset({"Conv", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool", "DeformConv"})


def _producer(g: onnx.GraphProto, name: str) -> onnx.NodeProto | None:
    for node in g.node:
        if name in node.output:
            return node
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                inner = _producer(sub, name)
                if inner is not None:
                    return inner
    return None


def _smallest_input(model: ModelProto, where: str, limit: int = 2**16) -> str:
    """``NAME=DIMS`` of the smallest square input (every dim after N and C set to one size) for
    which inference gives no negative dim, when the model has one static input of rank >= 3 and
    such a size up to ``limit`` exists; else ""."""
    inputs = real_inputs(model.graph)
    if len(inputs) != 1 or len(model.graph.node) > SEARCH_MAX_NODES:
        return ""
    vi = next(v for v in model.graph.input if v.name == inputs[0])
    declared = _declared_shape(vi)
    if not declared or len(declared) < 3 or not all(isinstance(d, int) and d > 0 for d in declared):
        return ""

    def works(size: int) -> bool:
        dims = (*declared[:2], *(max(d, size) for d in declared[2:]))
        trial = ModelProto()
        trial.CopyFrom(model)
        apply_overrides(trial, inputs, {inputs[0]: dims}, None, where)
        try:
            check_dims(_collect(_infer(trial, where, hint=False)), trial, where, hint=False)
        except ShapeError:
            return False
        return True

    low = max(declared[2:])
    high = low * 2
    while not works(high):
        low, high = high, high * 2
        if high > limit:
            return ""
    while high - low > 1:  # works(high), not works(low)
        mid = (low + high) // 2
        low, high = (low, mid) if works(mid) else (mid, high)
    dims = (*declared[:2], *(max(d, high) for d in declared[2:]))
    return f"{inputs[0]}=" + "x".join(map(str, dims))



def _inference_failed(where: str, message: str) -> ShapeError:
    return ShapeError(
        f"{where}: ONNX shape inference failed: {message}; check the input shapes "
        "(--input-shape) against the model"
    )


# Smallest graph whose first inference runs in a child process (below it, the fork costs more
# than it hides). FLOPCOUNT_PARALLEL=0 in the environment keeps every inference in-process.
PARALLEL_MIN_NODES = 2000


class Inference:
    """The first ONNX shape inference of a model, started before the caller builds its DAG.

    ONNX's inference is C++ that holds the GIL (about 1 s for 100k nodes), so a thread cannot
    overlap it with Python work. On Linux, for a large graph, and when :func:`_may_fork` finds it
    safe, it runs in a forked child that serializes the model, infers, reads the inferred tensor
    types and sends them back through a pipe; the caller builds its DAG meanwhile. Otherwise, or if
    the child does not finish its report and exit cleanly, :meth:`collected` answers None and the
    caller infers in-process: the answer is the same either way.
    """

    _signal: str | None = None  # the name of the signal that killed the child, if one did
    _spawned: bytes | None = None  # the report of a spawned interpreter (see _spawn)

    def __init__(self, model: ModelProto, where: str) -> None:
        self.model, self.where = model, where
        self._pid: int | None = None
        self._fd: int | None = None
        if _may_fork(model):
            self._start()
        elif _body_at_risk(model.graph):  # containment, not speed: FLOPCOUNT_PARALLEL=0 does not turn it off
            self._spawn()

    def _start(self) -> None:
        forked = _fork_with_pipe()
        if forked is None:
            return
        pid, read, write = forked
        if pid == 0:  # the child: infer, report, exit without running any of the parent's cleanup
            # No garbage collection here: inherited garbage may hold finalizers that take a lock another thread of
            # the parent held at the fork (TensorFlow's, after a Keras export), which would hang the child for good.
            gc.disable()
            reported = False
            try:
                os.close(read)
                try:  # what ONNX's C++ prints as it aborts is not for the user: the parent reports the crash
                    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
                except OSError:
                    pass
                view = memoryview(_report(self.model, self.where))
                while view:
                    view = view[os.write(write, view):]
                reported = True
            finally:
                os._exit(0 if reported else 1)  # the parent trusts the report only after a 0
        os.close(write)
        self._pid, self._fd = pid, read

    def _spawn(self) -> None:
        """Infer in a fresh interpreter (no fork allowed here, but ONNX may abort on this graph): synchronous, its
        report read like the forked child's; a start that fails leaves inference to this process, as before."""
        import subprocess

        if not sys.executable:
            return
        try:
            done = subprocess.run([sys.executable, "-c", "from flopcount.shapes import _spawned_main; _spawned_main()",
                                   self.where], input=self.model.SerializeToString(), stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, check=False)
        except OSError as e:
            log.debug("%s: cannot start an interpreter for inference (%s)", self.where, e)
            return
        if done.returncode < 0:
            try:
                self._signal = signal.Signals(-done.returncode).name
            except ValueError:
                self._signal = f"signal {-done.returncode}"
        elif done.returncode == 0:
            self._spawned = done.stdout
        else:
            log.debug("%s: the inference interpreter exited with %d", self.where, done.returncode)

    def collected(self) -> "_Collected | None":
        """The tensor infos of the inferred model as :func:`_collect` reads them, or None when there is no report to
        trust (no child, or it died without a word, or its report does not parse): the caller infers in-process.
        Raises :class:`ShapeError` when inference fails, or when it crashed the child (ONNX's C++ aborting on a
        malformed graph): that is never re-run in-process."""
        data = self._receive()
        if data[:1] == b"C":
            try:
                return _from_rows(*marshal.loads(data[1:]))
            except Exception as e:  # a damaged report: infer here instead
                log.debug("%s: the inference child's report does not parse (%s)", self.where, e)
                return None
        if data[:1] == b"E":
            raise _inference_failed(self.where, data[1:].decode("utf-8", "replace"))
        if data[:1] == b"S":
            raise ShapeError(data[1:].decode("utf-8", "replace"))
        if self._signal is not None:
            raise ShapeError(
                f"{self.where}: ONNX shape inference crashed ({self._signal}) on this model, which is malformed: "
                "a dim or attribute is out of range (a kernel larger than its input, a negative size); "
                "check the model and --input-shape"
            )
        return None  # no child, or it died without a word

    def _receive(self) -> bytes:
        """The child's whole report, or b"" when there is none or it did not exit cleanly (a
        report cut short could parse as a smaller model); a child killed by a signal leaves its
        name in ``_signal``."""
        if self._spawned is not None:
            data, self._spawned = self._spawned, None
            return data
        if self._fd is None:
            return b""
        chunks = []
        try:
            while chunk := os.read(self._fd, 1 << 20):
                chunks.append(chunk)
        except OSError:
            chunks = []
        os.close(self._fd)
        self._fd = None
        if self._pid is not None:
            pid, self._pid = self._pid, None
            try:
                _, status = os.waitpid(pid, 0)  # its end of the pipe is closed: it is exiting
            except ChildProcessError:  # reaped by someone else (a SIGCHLD handler): no exit status
                status = None
            if status is not None and os.WIFSIGNALED(status):
                number = os.WTERMSIG(status)
                try:
                    self._signal = signal.Signals(number).name
                except ValueError:
                    self._signal = f"signal {number}"
                return b""
            if status is not None and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
                return b""
        return b"".join(chunks)

    def close(self) -> None:
        """Stop and reap the child, if any (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._pid is not None:
            pid, self._pid = self._pid, None
            try:
                if os.waitpid(pid, os.WNOHANG) == (0, 0):  # still at work: its answer is not wanted
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
            except (ChildProcessError, ProcessLookupError):
                pass


def _report(model: ModelProto, where: str) -> bytes:
    """What a child reports: b"C" + the tensor infos of the inferred model (:func:`_rows`), b"S" + a ShapeError's
    message (a negative dim found by the guard), or b"E" + the first line of an inference error. The child reads the
    inferred model itself, beside the parent's DAG construction, and sends plain tuples, which the parent rebuilds
    faster than it would parse the model and read its types."""
    try:
        if _guard_depths(model.graph) is None:
            from onnx.onnx_cpp2py_export import shape_inference as cpp

            inferred = onnx.load_from_string(cpp.infer_shapes(model.SerializeToString(), False, False,
                                                              data_prop_bounded(model)))
        else:
            inferred = _infer(model, where)  # a Slice at risk of a negative dim: step by step
        return b"C" + marshal.dumps(_rows(_collect(inferred)))
    except ShapeError as e:
        return b"S" + str(e).encode("utf-8", "replace")
    except Exception as e:  # InferenceError, ValidationError, or RuntimeError from C++
        return b"E" + first_line(e).encode("utf-8", "replace")


def _rows(collected: "_Collected") -> tuple[list[tuple], list[str]]:
    """Collected tensor infos as plain tuples (for :mod:`marshal`), and the names with odd dims."""
    return [tuple(t) for t in collected.values()], collected.odd


def _from_rows(rows: list[tuple], odd: list[str]) -> "_Collected":
    """The inverse of :func:`_rows`."""
    make = tuple.__new__
    out = _Collected({row[0]: make(TensorInfo, row) for row in rows})
    out.odd = odd
    return out


def _spawned_main() -> None:
    """The interpreter :meth:`Inference._spawn` starts: the model on stdin, the report on stdout."""
    model = onnx.load_from_string(sys.stdin.buffer.read())
    sys.stdout.buffer.write(_report(model, sys.argv[1] if len(sys.argv) > 1 else "<model>"))
    sys.stdout.buffer.flush()


def _may_fork(model: ModelProto) -> bool:
    """Whether :class:`Inference` may fork: Linux, a large graph (or a control-flow body with an op whose inference
    can abort, see :func:`_body_at_risk`), no other Python thread (one
    could hold a lock the child would need), no CUDA context (a big address space to copy), and
    FLOPCOUNT_PARALLEL not set to 0. Native helper threads, such as a BLAS pool that numpy starts
    on import, do not matter: the child runs only ONNX's inference, writes to a pipe and exits."""
    if len(model.graph.node) < PARALLEL_MIN_NODES and not _body_at_risk(model.graph):
        return False
    return _fork_safe()


def _fork_safe() -> bool:
    """Whether this process may fork a child that runs ONNX's inference (see :func:`_may_fork`)."""
    if os.environ.get("FLOPCOUNT_PARALLEL", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    if not hasattr(os, "fork") or threading.active_count() != 1:
        return False
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return not (cuda is not None and getattr(cuda, "is_initialized", lambda: False)())


_SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})
#: Ops whose inference in ONNX's C++ aborts the process (an assertion in std::clamp) when an input dim is negative.
_ABORTING_OPS = frozenset({"Slice", "Pad"})


def _body_at_risk(graph) -> bool:
    """Whether a control-flow body (at any depth) holds an op whose ONNX inference can abort on a negative dim.
    Top-level ones are guarded before inference (:func:`_guard_depths`); dims inside bodies are not checked first
    (ONNX infers the branch not taken too), so such a graph's inference runs in the child at any size, where an
    abort is contained and reported instead of killing the process."""
    for node in graph.node:
        if node.op_type in _SUBGRAPH_OPS:
            for a in node.attribute:
                for body in (a.g,) if a.HasField("g") else tuple(a.graphs):
                    if any(n.op_type in _ABORTING_OPS for n in body.node) or _body_at_risk(body):
                        return True
    return False


class _Collected(dict):
    """Tensor name → :class:`TensorInfo`, as read from an inferred model; ``odd`` names the tensors
    with a negative, zero or oversized dim (found once per distinct type, for :func:`check_dims`)."""

    __slots__ = ("odd",)


def _collect(model: ModelProto, bodies: bool = True, initializers: Mapping[str, TensorInfo] | None = None) -> dict[str, TensorInfo]:
    """Tensor infos of an inferred model; ``initializers``, when given, are the top graph's
    initializer infos (see :func:`initializer_infos`), already read."""
    out = _Collected()
    out.odd = []
    _collect_graph(model.graph, out, bodies, initializers)
    return out


def _odd(shape) -> bool:
    """Whether a shape has a negative or zero dim, or more than MAX_ELEMENTS elements."""
    known = [d for d in shape or () if type(d) is int]
    return bool(known) and (min(known) <= 0 or max(known) > MAX_ELEMENTS or prod(known) > MAX_ELEMENTS)


def initializer_infos(g: onnx.GraphProto) -> dict[str, TensorInfo]:
    """Infos of a graph's initializers (their dims and types are declared: no inference needed)."""
    make = tuple.__new__
    return {t.name: make(TensorInfo, (t.name, t.data_type, tuple(t.dims), True)) for t in g.initializer}


def _collect_graph(g: onnx.GraphProto, out: dict[str, TensorInfo], bodies: bool = True,
                   initializers: Mapping[str, TensorInfo] | None = None, top: bool = True) -> None:
    """Tensor infos of ``g`` and, recursively, of its subgraphs (names are unique across scopes);
    ``bodies=False`` skips the scan for subgraphs (the graph has none). Odd dims are noted for the
    top graph only: ONNX infers both branches of an If, and the one not taken may well have them
    (a body that runs and has one gets a negative count, which the traversal refuses)."""
    for node in g.node if bodies else ():
        if node.op_type in _SUBGRAPH_OPS:
            for a in node.attribute:
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs):
                    _collect_graph(sub, out, top=False)
    odd = getattr(out, "odd", None) if top else None
    # A large graph has a few distinct types (dtype and dims) for a great many tensors: each
    # distinct one is decoded once, keyed by its serialized bytes.
    make = tuple.__new__
    decoded: dict[bytes, tuple | None] = {}
    out.update(initializer_infos(g) if initializers is None else initializers)
    for vi in (*g.input, *g.value_info, *g.output):
        name = vi.name
        prev = out.get(name)
        if prev is not None and prev[3]:  # static already (an initializer's declared input)
            continue
        ty = vi.type
        key = ty.SerializeToString()
        info = decoded.get(key, False)
        if info is False:
            info = decoded[key] = _decode_type(ty)
            if info is not None and odd is not None and _odd(info[1]):
                decoded[key] = info = (*info, True)  # marked: a fourth field
        if info is not None:
            if len(info) == 4:
                odd.append(name)
                info = info[:3]
            out[name] = make(TensorInfo, (name, *info))


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


def _unresolved(index: GraphIndex, tensors: Mapping[str, TensorInfo]) -> list[str]:
    """Node outputs whose shapes are not fully known."""
    get = tensors.get
    return [name for name in index.producer if (t := get(name)) is None or not t.is_static]


def apply_values(model: ModelProto, real_inputs: Sequence[str], input_values: Mapping[str, object], where: str,
                 shapes: Mapping[str, Sequence[int]] | None = None) -> None:
    """Turn inputs whose values are given (axes, sizes, an ``attention_mask``: small tensors) into
    initializers of ``model``, in place, so that inference and folding see them as constants. A flat list of
    values (``--input-value attention_mask=1,1,1,0,...``) takes the shape given in ``shapes``, else the input's
    declared static shape, where the number of values fits it."""
    by_name = {vi.name: vi for vi in model.graph.input}
    for name, value in input_values.items():
        if name not in real_inputs:
            raise UsageError(
                f"{where}: --input-value names {name!r}, which is not an input of the model; its inputs are: "
                f"{', '.join(map(repr, real_inputs)) or '(none)'}"
            )
        vi = by_name[name]
        elem = vi.type.tensor_type.elem_type
        declared = _declared_shape(vi)
        try:
            array = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(elem) if elem else None)
        except (OverflowError, ValueError, TypeError) as e:
            raise UsageError(f"{where}: the value given for input {name!r} does not fit its type ({e})") from None
        if declared is not None and len(declared) == 0 and array.size == 1:
            array = array.reshape(())
        target = (shapes or {}).get(name) or (declared if declared and all(isinstance(d, int) for d in declared) else None)
        if array.ndim == 1 and target is not None and len(target) != 1 and prod(target) == array.size:
            array = array.reshape(tuple(int(d) for d in target))
        if array.size > FOLD_LIMIT:
            raise UsageError(f"{where}: --input-value {name!r} has {array.size} elements; give values only for small "
                             f"shape-like inputs (at most {FOLD_LIMIT}), and shapes for the rest")
        if declared is not None and (len(declared) != array.ndim or any(
                isinstance(d, int) and d != a for d, a in zip(declared, array.shape))):
            raise UsageError(f"{where}: the value given for input {name!r} has shape {list(array.shape)}, "
                             f"but the model declares {['?' if d is None else d for d in declared]}")
        model.graph.input.remove(vi)
        model.graph.initializer.append(numpy_helper.from_array(array, name))


def real_inputs(graph: onnx.GraphProto) -> tuple[str, ...]:
    """Declared graph inputs that are not initializers (older exports declare both)."""
    initializers = {t.name for t in graph.initializer}
    return tuple(i.name for i in graph.input if i.name not in initializers)


def prepare(
    model: ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None,
    batch: int | None,
    where: str,
    input_values: Mapping[str, object] | None = None,
) -> None:
    """Apply what the user fixes (``input_values``, then ``input_shapes`` and ``batch``) to
    ``model`` in place, before any inference."""
    inputs = real_inputs(model.graph)
    input_shapes = dict(input_shapes or {})
    if input_values:
        apply_values(model, inputs, input_values, where, input_shapes)
        inputs = tuple(n for n in inputs if n not in input_values)
        both = set(input_shapes) & set(input_values)  # a shape given with the value must be the value's
        applied = {t.name: tuple(t.dims) for t in model.graph.initializer if t.name in both}
        for name in sorted(both):
            dims, value = tuple(input_shapes.pop(name)), applied[name]
            if dims != value:
                raise UsageError(f"{where}: input {name!r} is given the shape {list(dims)} and a value of shape "
                                 f"{list(value)}; give one of them, or both alike")
    apply_overrides(model, inputs, input_shapes, batch, where)


def resolve(model: ModelProto, index: GraphIndex, where: str, first: "Inference | None" = None,
            loop_trips: Mapping[str, int] | None = None) -> Resolution:
    """Resolve every tensor's shape that can be resolved without weights (``model`` is weightless
    and prepared by :func:`prepare`). ``first``, when given, is the first inference, already started.
    ``loop_trips`` (node name to trip count, as ``count`` takes it) gives the length of those Loops' stacked
    outputs."""
    bodies = bool(index.bodies)
    guard = _guard_needed(index)
    tensors = first.collected() if first is not None else None  # the child's report, read beside the DAG
    if tensors is None:
        tensors = _collect(_infer(model, where, guard=guard), bodies)
    check_dims(tensors, model, where)
    values: dict[str, np.ndarray] = {}
    rounds = 1
    pending = _unresolved(index, tensors)
    contrib = any(p.domain not in ("", "ai.onnx") for p in index.protos)
    for _ in range(MAX_ROUNDS):  # folding, then other-domain ops, until neither settles anything new
        folds = 1
        while pending and folds < MAX_ROUNDS:
            folds += 1
            new = _fold(model, index, tensors, values)
            if not new:
                break
            scratch = _with_constants(model, index, values)
            rounds += 1
            found = _collect(_infer(scratch, where, guard=guard), bodies)
            check_dims(found, model, where)
            tensors = {**tensors, **{k: v for k, v in found.items() if v.is_static or k not in tensors}}
            pending = _unresolved(index, tensors)
        if not (pending and contrib):
            break
        before = len(pending)
        tensors = _contrib_shapes(model, index, tensors, values, where)
        pending = _unresolved(index, tensors)
        if len(pending) == before:  # else what they settled may let shape subgraphs fold further
            break
    if not values and any(n.op_type == "If" for n in model.graph.node):
        _fold(model, index, tensors, values)  # an If's condition computed from constants or given values
    if not values:
        values = _LazyConstants(model, index)  # each read on its first look-up
    if bodies:
        tensors = dict(tensors)
        _infer_bodies(model, model.graph, tensors, values, where)
        while rounds < MAX_ROUNDS and (settled := _loop_outputs(model.graph, tensors, values, loop_trips)):
            # ONNX leaves every Loop output shapeless; with them settled, infer what follows them
            tensors.update(settled)
            scratch = _with_constants(model, index, values)
            scratch.graph.value_info.extend(_value_info(name, t) for name, t in settled.items())
            rounds += 1
            found = _collect(_infer(scratch, where, guard=guard), bodies)
            check_dims(found, model, where)
            tensors.update((k, v) for k, v in found.items() if v.is_static and not _static(tensors.get(k)))
            if not isinstance(values, dict):
                values = {}
            if _fold(model, index, tensors, values):  # a later Loop's trip count from this one's stacked length
                scratch = _with_constants(model, index, values)
                rounds += 1
                found = _collect(_infer(scratch, where, guard=guard), bodies)
                check_dims(found, model, where)
                tensors.update((k, v) for k, v in found.items() if v.is_static and not _static(tensors.get(k)))
            _infer_bodies(model, model.graph, tensors, values, where)
        pending = _unresolved(index, tensors)
    error = ""
    if pending:
        try:
            _infer(_with_constants(model, index, values), where, strict=True, guard=guard)
        except Exception as e:
            error = first_line(e)
        log.debug("%d tensors keep unknown dims after %d rounds: %s", len(pending), rounds, pending[:10])
    inputs = tuple(tensors.get(n, TensorInfo(n)) for n in index.inputs)
    return Resolution(tensors, values, inputs, rounds, error)


def _static(t: TensorInfo | None) -> bool:
    return t is not None and t.is_static


def _loop_outputs(graph: onnx.GraphProto, tensors: Mapping[str, TensorInfo], values: Mapping,
                  loop_trips: Mapping[str, int] | None = None) -> dict[str, TensorInfo]:
    """Shapes of Loop outputs that ONNX's inference leaves without one, where the body settles them:
    a loop-carried value whose body output has the static shape of its initial value keeps that
    shape; a scan output stacks the body's static output over the trip count: the N that ``loop_trips``
    gives the Loop by name (``--loop-trips NAME=N``), else a known M. Where a condition may end the loop
    early, M is its maximum, as the Loop's own count takes it (both are upper bounds, which the Loop's count
    names: ``operators/control_flow.py``); a Loop with neither leaves its scan outputs open, and its count
    asks for ``--loop-trips``."""
    settled: dict[str, TensorInfo] = {}
    loop_trips = loop_trips or {}
    for position, node in enumerate(graph.node):
        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
            continue
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        if body is None:
            continue
        n_carried = len(node.input) - 2
        for k, out in enumerate(node.output):
            if not out or _static(tensors.get(out)) or 1 + k >= len(body.output):
                continue
            inner = tensors.get(body.output[1 + k].name)
            if not _static(inner):
                continue
            if k < n_carried:
                initial = tensors.get(node.input[2 + k])
                if _static(initial) and initial.shape == inner.shape:
                    settled[out] = TensorInfo(out, inner.elem_type or initial.elem_type, inner.shape)
            else:
                trips = values.get(node.input[0]) if node.input[0] else None
                count = int(np.asarray(trips).reshape(())) if trips is not None and np.size(trips) == 1 else -1
                count = loop_trips.get(node_label(node, position), count)
                if count >= 0:
                    settled[out] = TensorInfo(out, inner.elem_type, (count, *inner.shape))
    return settled


# --------------------------------------------------------------------------------------------
# operators of other domains (ONNX Runtime's contrib ops), which ONNX's inference does not know

# Fused ops whose output shapes are those of a standard op given the same leading inputs and the
# standard op's attributes; attributes the standard op does not have are dropped. Only for
# inference (counting still applies the fused op's own formula).
SHAPE_TWINS: Mapping[tuple[str, str], tuple[str, int]] = {
    ("com.microsoft", "FusedConv"): ("Conv", 3),
    ("com.microsoft", "FusedGemm"): ("Gemm", 3),
    ("com.microsoft", "FusedMatMul"): ("MatMul", 2),  # only without transposes (checked below)
    ("com.microsoft", "TransposeMatMul"): ("MatMul", 2),
    ("com.microsoft", "Gelu"): ("Relu", 1),
    ("com.microsoft", "FastGelu"): ("Relu", 1),
    ("com.microsoft", "QuickGelu"): ("Relu", 1),
    ("com.microsoft", "BiasGelu"): ("Add", 2),
    ("com.microsoft", "BiasAdd"): ("Add", 2),
}


def _twin(node: onnx.NodeProto, opset: int) -> onnx.NodeProto | None:
    twin = SHAPE_TWINS.get((node.domain, node.op_type))
    if twin is None:
        return None
    op, n_inputs = twin
    attrs = {a.name: a for a in node.attribute}
    if op == "MatMul" and any(helper.get_attribute_value(attrs[k]) for k in attrs if k.startswith("trans")):
        return None
    try:
        schema = onnx.defs.get_schema(op, opset)
    except onnx.defs.SchemaError:
        return None
    out = helper.make_node(op, list(node.input[:n_inputs]), list(node.output[:1]), name=node.name)
    out.attribute.extend(a for name, a in attrs.items() if name in schema.attributes)
    return out


def _contrib_shapes(model: ModelProto, index: GraphIndex, tensors: dict, values: Mapping, where: str) -> dict:
    """Shapes around other-domain ops: standard twins for fused ops, then the shape functions registered
    beside the formulas, then, only for what those leave unknown, ONNX Runtime's symbolic shape inference
    (when onnxruntime is installed), which knows Attention, SkipLayerNormalization, EmbedLayerNormalization,
    GroupQueryAttention, MatMulNBits ... Partial results are kept."""
    opset = next((imp.version for imp in model.opset_import if imp.domain in ("", "ai.onnx")), 0)
    scratch = _with_constants(model, index, values) if values else model
    twinned = ModelProto()
    twinned.CopyFrom(scratch)
    changed = False
    for i, node in enumerate(twinned.graph.node):
        t = _twin(node, opset)
        if t is not None:
            twinned.graph.node[i].CopyFrom(t)
            changed = True
    base = twinned if changed else scratch
    merged = _merged(tensors, _collect(_infer(twinned, where), False) if changed else {})
    merged = _registered_shapes(base, index, merged, where)
    if _other_unknown(index, merged):  # onnxruntime's inference is slow to load: only when it is needed
        merged = _merged(merged, _ort_symbolic(base, where))
        merged = _registered_shapes(base, index, merged, where)  # what it settled may feed registered operators
    # declared in the model, so that later folding rounds infer past these nodes
    ops, outputs = index.node_ops, index.node_outputs
    settled = {o: merged[o] for k, (domain, _) in enumerate(ops) if domain not in ("", "ai.onnx")
               for o in outputs[k] if o and _static(merged.get(o)) and not _static(tensors.get(o))}
    if settled:
        kept = [vi for vi in model.graph.value_info if vi.name not in settled]
        del model.graph.value_info[:]
        model.graph.value_info.extend(kept + [_value_info(n, t) for n, t in settled.items()])
    return merged


def _merged(tensors: Mapping[str, TensorInfo], found: Mapping[str, TensorInfo]) -> dict:
    """``tensors`` with what ``found`` knows better: a static shape, or a rank where there was none."""
    merged = dict(tensors)
    for k, v in found.items():
        prev = merged.get(k)
        if prev is None or (not prev.is_static and (v.is_static or prev.shape is None)):
            merged[k] = v
    return merged


def _other_unknown(index: GraphIndex, tensors: Mapping[str, TensorInfo]) -> bool:
    """Whether a node of another domain, or one ONNX has no schema for, that no registered shape function covers
    has an output of unknown shape (a registered function is the better judge: a ZipMap's sequence of maps has
    no tensor shape to find)."""
    from .registry import lookup_shape

    ops, outputs = index.node_ops, index.node_outputs
    uncovered = {(domain, op) for domain, op in set(ops)
                 if (domain not in ("", "ai.onnx") or not onnx.defs.has(op, domain)) and not lookup_shape(domain, op)}
    return bool(uncovered) and any(not _static(tensors.get(o)) for k, key in enumerate(ops) if key in uncovered
                                   for o in outputs[k] if o)


def _registered_shapes(model: ModelProto, index: GraphIndex, tensors: dict, where: str) -> dict:
    """Output types of other-domain nodes from the shape functions registered beside their formulas
    (:func:`flopcount.registry.shape_function`), in topological order; each round that settles some is
    followed by ONNX's inference, so that what follows them resolves, until nothing new settles."""
    from .context import attribute_value
    from .registry import lookup_shape

    ops, node_inputs, node_outputs = index.node_ops, index.node_inputs, index.node_outputs
    targets = [k for k in index.order if ops[k][0] not in ("", "ai.onnx") and lookup_shape(*ops[k])]
    # nodes whose shapes only onnxruntime's inference knows (SkipLayerNormalization, and
    # SimplifiedLayerNormalization, which onnxruntime writes in the default domain)
    others = [k for k in index.order if not lookup_shape(*ops[k]) and not onnx.defs.has(ops[k][1], ops[k][0])]
    settled: dict[str, TensorInfo] = {}
    for _ in range(len(targets)):
        new: dict[str, TensorInfo] = {}
        for k in targets:
            outs = node_outputs[k]
            if all(not o or _static(tensors.get(o)) for o in outs):
                continue
            ins = tuple(tensors.get(n) if n else None for n in node_inputs[k])
            proto = index.protos[k]
            attrs = {a.name: attribute_value(a) for a in proto.attribute}
            try:
                types = lookup_shape(*ops[k])(ins, **attrs)
            except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as e:
                log.debug("%s: no output shapes for node %r (%s): %s", where, proto.name, ops[k][1], e)
                continue
            for o, t in zip(outs, types):
                if o and t is not None and not t[0] and tensors.get(o) is not None:  # a type ONNX's inference knows
                    t = (tensors[o].elem_type, t[1])
                info = TensorInfo(o, *t) if o and t is not None else None
                if info is not None and info.is_static and not _static(tensors.get(o)):
                    new[o] = tensors[o] = info
        if not new:
            break
        settled.update(new)
        # the settled nodes' outputs become graph inputs of a scratch copy without those nodes, which
        # both ONNX's and onnxruntime's inference then start from
        scratch = ModelProto()
        scratch.CopyFrom(model)
        kept = [n for n in scratch.graph.node if not (n.output and all(not o or o in settled for o in n.output))]
        del scratch.graph.node[:]
        scratch.graph.node.extend(kept)
        scratch.graph.input.extend(_value_info(n, t) for n, t in settled.items())
        found = _collect(_infer(scratch, where), False)
        if any(not _static(found.get(o)) for k in others for o in node_outputs[k] if o):
            found.update((n, t) for n, t in _ort_symbolic(scratch, where).items() if t.is_static)
        tensors.update((n, t) for n, t in found.items() if t.is_static and not _static(tensors.get(n)))
    return tensors


_ORT_SYMBOLIC = "flopcount._onnxruntime_symbolic_shape_infer"  # the name its module file is loaded under


@functools.cache
def symbolic_inference() -> type | None:
    """onnxruntime's ``SymbolicShapeInference`` class, None without onnxruntime. Loaded from its module file
    (``onnxruntime/tools/symbolic_shape_infer.py``, which needs only onnx, numpy, sympy and packaging) without
    running the ``onnxruntime.tools`` package's ``__init__``, which imports torch when torch is installed:
    seconds for a module that needs none of it. Imported as usual where that file cannot be loaded alone."""
    loaded = sys.modules.get("onnxruntime.tools.symbolic_shape_infer") or sys.modules.get(_ORT_SYMBOLIC)
    if loaded is None:
        try:
            spec = importlib.util.find_spec("onnxruntime")  # finds the package without importing it
        except (ImportError, ValueError):
            spec = None
        folders = list(spec.submodule_search_locations or ()) if spec is not None else []
        path = next((p for f in folders if os.path.isfile(p := os.path.join(f, "tools", "symbolic_shape_infer.py"))),
                    None)  # fmt: skip
        if path is not None:
            file_spec = importlib.util.spec_from_file_location(_ORT_SYMBOLIC, path)
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[_ORT_SYMBOLIC] = module
            try:
                file_spec.loader.exec_module(module)
                loaded = module
            except Exception as e:  # a release whose file needs its package: import it the usual way
                del sys.modules[_ORT_SYMBOLIC]
                log.debug("onnxruntime's symbolic_shape_infer.py does not load alone (%s)", first_line(e))
    if loaded is None:
        try:
            import onnxruntime.tools.symbolic_shape_infer as loaded
        except Exception as e:  # absent, or a package that fails on import: no symbolic inference
            log.debug("onnxruntime's symbolic shape inference is not available (%s)", first_line(e))
            return None
    return getattr(loaded, "SymbolicShapeInference", None)


def _ort_symbolic(model: ModelProto, where: str) -> dict[str, TensorInfo]:
    """ONNX Runtime's symbolic shape inference, driven step by step so that what it resolves is
    kept even when some node stops it (its ``infer_shapes`` would raise and write a file to the
    working directory). Nothing when onnxruntime is absent or its internals differ."""
    inference = symbolic_inference()
    if inference is None:
        return {}
    try:
        engine = inference(2**31 - 1, True, False, 0)
        engine._preprocess(model)
        while engine.run_:
            engine._infer_impl()
        engine._update_output_from_vi()
        return _collect(engine.out_mp_, False)
    except Exception as e:  # an internal API of onnxruntime: degrade quietly
        log.debug("%s: onnxruntime symbolic shape inference gave up: %s", where, e)
        return {}


# --------------------------------------------------------------------------------------------
# bodies of If / Loop / Scan


def _value_info(name: str, t: TensorInfo | None) -> onnx.ValueInfoProto:
    if t is None or not t.elem_type:
        return helper.make_empty_tensor_value_info(name)
    return helper.make_tensor_value_info(name, t.elem_type, None if t.shape is None else list(t.shape))


def _body_inputs(node: onnx.NodeProto, body: onnx.GraphProto, tensors: Mapping[str, TensorInfo]) -> list:
    """Types of a body's formal inputs, from the node's actual inputs."""
    outer = [tensors.get(n) if n else None for n in node.input]
    if node.op_type == "Loop":
        return [TensorInfo("", TensorProto.INT64, ()), TensorInfo("", TensorProto.BOOL, ()), *outer[2:]]
    if node.op_type == "Scan":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        m = attrs.get("num_scan_inputs", 0)
        n_states = len(node.input) - m
        axes = attrs.get("scan_input_axes") or [0] * m
        scans = []
        for t, axis in zip(outer[n_states:], axes):
            if t is None or t.shape is None:
                scans.append(t)
            else:
                a = axis % len(t.shape)
                scans.append(TensorInfo(t.name, t.elem_type, t.shape[:a] + t.shape[a + 1 :]))
        return [*outer[:n_states], *scans]
    if node.op_type == "SequenceMap":  # one element of each sequence (recorded by element type), tensors as they are
        return outer
    return [None] * len(body.input)


def _infer_bodies(model: ModelProto, graph: onnx.GraphProto, tensors: dict, values: Mapping, where: str) -> None:
    """Infer shapes inside subgraphs whose inputs ONNX left untyped or typed with open dims, as standalone graphs
    whose inputs carry the outer node's types (see :func:`_formal_inputs`); recurses into nested bodies.

    A carried value (a Loop's or Scan's state) keeps the outer dims only if the body gives it back with the same
    shape: one whose shape changes from one iteration to the next (a growing Concat) is inferred again with the
    body's own declared type, so that the first iteration's shape is never taken for every iteration's."""
    for node in graph.node:
        if node.op_type not in _SUBGRAPH_OPS:
            continue
        for a in node.attribute:
            for body in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                if all(tensors.get(o) is not None and tensors[o].is_static for n in body.node for o in n.output if o):
                    continue
                inputs = _formal_inputs(body, _body_inputs(node, body, tensors))
                found = _infer_body(model, node, body, inputs, tensors, values, where)
                for _ in _carried(node, body):  # each pass gives at least one more state its declared type back
                    if found is None:
                        break
                    changed = [k for k, out in _carried(node, body) if inputs[k] is not body.input[k]
                               and _declared_shape(inputs[k]) != _found_shape(found.get(out))]
                    if not changed:
                        break
                    inputs = [body.input[k] if k in changed else vi for k, vi in enumerate(inputs)]
                    found = _infer_body(model, node, body, inputs, tensors, values, where)
                if found is None:
                    continue
                for name, info in found.items():
                    prev = tensors.get(name)
                    if prev is None or (not prev.is_static and (info.is_static or prev.shape is None)):
                        tensors[name] = info
                _infer_bodies(model, body, tensors, values, where)


def _found_shape(t: TensorInfo | None) -> tuple | None:
    return None if t is None else t.shape


def _formal_inputs(body: onnx.GraphProto, formal: Sequence[TensorInfo | None]) -> list[onnx.ValueInfoProto]:
    """The body's inputs, typed from the outer node's (``formal``): a body input declared without a type takes the
    outer one whole, and a declared dim that is symbolic or empty (tf2onnx's ``['unk__477', 300]`` for every Loop
    state) takes the outer known dim. A dim the body declares as a number stays (the body says what it reads).
    Where nothing is taken, the body's own input is returned (the same object)."""
    out = []
    for vi, t in zip(body.input, formal):
        declared = _tensor_type(vi)
        if t is None or vi.type.HasField("sequence_type"):
            out.append(vi)
        elif not declared.HasField("shape") or not declared.elem_type:
            out.append(_value_info(vi.name, t))
        else:
            dims = _declared_shape(vi)
            merged = dims if t.shape is None or len(t.shape) != len(dims) else tuple(
                d if isinstance(d, int) and d > 0 else (o if isinstance(o, int) else d) for d, o in zip(dims, t.shape))
            out.append(vi if merged == dims else _value_info(vi.name, TensorInfo(vi.name, declared.elem_type, merged)))
    out.extend(body.input[len(out):])
    return out


def _carried(node: onnx.NodeProto, body: onnx.GraphProto) -> list[tuple[int, str]]:
    """(body input index, body output name) of each value a Loop or Scan carries from one iteration to the next."""
    if node.op_type == "Loop":
        return [(2 + j, out.name) for j, out in enumerate(body.output[1:len(body.input) - 1])]
    if node.op_type == "Scan":
        m = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "num_scan_inputs"), 0)
        return [(k, body.output[k].name) for k in range(min(len(node.input) - m, len(body.output)))]
    return []


def _infer_body(model: ModelProto, node: onnx.NodeProto, body: onnx.GraphProto, inputs: Sequence[onnx.ValueInfoProto],
                tensors: Mapping[str, TensorInfo], values: Mapping, where: str) -> dict[str, TensorInfo] | None:
    """The tensor infos of ``body`` inferred as a standalone graph with ``inputs`` and what it reads from enclosing
    scopes (known values as initializers, else their types); None when ONNX's inference fails on it."""
    sub = ModelProto(ir_version=model.ir_version)
    sub.opset_import.extend(model.opset_import)
    g = sub.graph
    g.name = body.name or "body"
    g.node.extend(body.node)
    g.initializer.extend(body.initializer)
    g.output.extend(body.output)
    g.input.extend(inputs)
    defined = {i.name for i in body.input} | {t.name for t in body.initializer}
    defined |= {o for n in body.node for o in n.output}
    outer_refs = {x for n in body.node for x in n.input if x and x not in defined}
    from .graph import subgraph_outer_names

    for n in body.node:
        outer_refs |= {x for x in subgraph_outer_names(n) if x not in defined}
    for name in sorted(outer_refs):
        if name in values:
            g.initializer.append(numpy_helper.from_array(np.asarray(values[name]), name))
        else:
            g.input.append(_value_info(name, tensors.get(name)))
    try:
        return _collect(_infer(sub, where))
    except ShapeError as e:  # leave the body as it is; its formulas will name the tensor
        if not str(e).startswith(f"{where}: ONNX shape inference failed"):
            raise  # a negative or oversized dim
        log.debug("%s: cannot infer the body of %s %r: %s", where, node.op_type, node.name, e)
        return None


# --------------------------------------------------------------------------------------------
# folding of small constant subgraphs


class _LazyConstants(Mapping):
    """The model's small constant values (those :func:`_small_constants` reads), each read on its first look-up:
    a count looks up a few (Reshape targets, axes) of a graph's many initializers. Iterating reads them all.
    ``index``, when given, holds the node lists already read from the protos."""

    def __init__(self, model: ModelProto, index: GraphIndex | None = None):
        self._model, self._graph_index, self._values = model, index, None
        self._initializers: dict | None = None  # name → initializer
        self._constants: dict | None = None  # name → Constant node
        self._read: dict[str, np.ndarray | None] = {}

    def _load(self) -> dict:
        if self._values is None:
            self._values = _small_constants(self._model)
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

    def _one(self, name: str) -> np.ndarray | None:
        """What :func:`_small_constants` gives ``name``, or None: a Constant node's value wins over an
        initializer's, as there."""
        if self._initializers is None:
            self._initializers = {t.name: t for t in self._model.graph.initializer}
            self._constants = _constant_nodes(self._model.graph, self._graph_index)
        node = self._constants.get(name)
        value = _small_constant_node(node) if node is not None else None
        if value is None and name in self._initializers:
            value = _small_initializer(self._initializers[name])
        return value

    def __iter__(self):
        return iter(self._load())

    def __len__(self):
        return len(self._load())


def _small_constants(model: ModelProto) -> dict[str, np.ndarray]:
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
    if t.data_location != TensorProto.EXTERNAL and prod(t.dims) <= FOLD_LIMIT and _has_data(t):
        return _array(t)
    return None


def _small_constant_node(node: onnx.NodeProto) -> np.ndarray | None:
    """A Constant node's value when it has at most FOLD_LIMIT elements, else None."""
    v = _constant_value(node)
    return v if v is not None and v.size <= FOLD_LIMIT else None


def _array(t: TensorProto) -> np.ndarray | None:
    """The value of an inline tensor; None for one that refers to external data (the loader
    strips such references, so this is a second lock: nothing here can open a file)."""
    if t.data_location == TensorProto.EXTERNAL or len(t.external_data):
        return None
    return numpy_helper.to_array(t)


def _has_data(t: TensorProto) -> bool:
    if t.data_location == TensorProto.EXTERNAL or len(t.external_data):
        return False
    if prod(t.dims) == 0:
        return True
    return t.data_location != TensorProto.EXTERNAL and any(
        t.HasField(f) if f == "raw_data" else len(getattr(t, f)) > 0
        for f in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data")
    )


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for a in node.attribute:
        if a.name == "value":
            return _array(a.t) if _has_data(a.t) else None
        if a.name in ("value_int", "value_ints"):
            return np.array(helper.get_attribute_value(a), dtype=np.int64)
        if a.name in ("value_float", "value_floats"):
            return np.array(helper.get_attribute_value(a), dtype=np.float32)
    return None


def _fold(model: ModelProto, index: GraphIndex, tensors: Mapping[str, TensorInfo], values: dict) -> bool:
    """Evaluate nodes whose inputs are known small constants; True when a new value was found."""
    if not values:
        values.update(_small_constants(model))
    return _fold_nodes((index.protos[idx] for idx in index.order), tensors, values)


def _fold_nodes(nodes: Iterable[onnx.NodeProto], tensors: Mapping[str, TensorInfo], values: dict) -> bool:
    """:func:`_fold` over ``nodes`` in order, and into the branch each If with a known condition takes (its
    nodes are inlined by :func:`_with_constants`, so an If nested there can be decided in turn: PyTorch's
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
                if t.name not in values and _has_data(t) and prod(t.dims) <= FOLD_LIMIT:
                    values[t.name] = _array(t)
            for inner in branch.node:
                if inner.op_type == "Constant" and inner.output[0] not in values:
                    v = _constant_value(inner)
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
    the others (:data:`_DIM_SAFE_OPS`) give outputs no larger than the product of their inputs."""
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
    return folder or op in _DIM_SAFE_OPS


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
        if _has_data(t) and prod(t.dims) <= FOLD_LIMIT:
            local[t.name] = _array(t)
    for inner in branch.node:
        if inner.op_type == "Constant":
            v = _constant_value(inner)
            outs = None if v is None else [v]
        else:
            outs = _evaluate(inner, tensors, local)
        if outs is None:
            return None
        for name, v in zip(inner.output, outs):
            if name and isinstance(v, (np.ndarray, np.generic)):
                local[name] = np.asarray(v)
    return [local.get(o.name) for o in branch.output]


def _with_constants(model: ModelProto, index: GraphIndex, values: Mapping[str, np.ndarray]) -> ModelProto:
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
    fill = _array(attrs["value"]) if "value" in attrs else np.zeros(1, np.float32)
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
