"""ONNX's shape inference, guarded: run in a forked child or a spawned interpreter where it may abort the process,
inferred depth by depth where a Slice is at risk of a negative dim, and every inferred dim checked."""

from __future__ import annotations

import gc
import logging
import marshal
import os
import signal
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from functools import partial
from math import prod
from operator import attrgetter, itemgetter

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper

from ...context import TensorInfo
from ...errors import ShapeError, first_line
from ..graph import GraphIndex
from ..loading import copy_field
from .interpreter import (
    LazyConstants,
    constant_value,
    evaluate_node,
    has_data,
    inline_array,
)
from .overrides import apply_overrides, real_inputs
from .shape_constants import check_shape_constants
from .tensors import (
    DIM_SAFE_OPS,
    FOLD_LIMIT,
    MAX_ELEMENTS,
    SUBGRAPH_OPS,
    Collected,
    collect,
    declared_shape,
    from_type_table,
    initializer_infos,
    type_table,
)

log = logging.getLogger(__name__)

# inference


def infer(model: ModelProto, where: str, strict: bool = False, hint: bool = True, guard: bool = True) -> ModelProto:
    """ONNX's inference of ``model``, guarded (see :func:`_guard_depths`) so that no negative dim
    reaches the code in it that aborts the process; raises :class:`ShapeError` on a negative or
    oversized dim, or when inference fails. ``guard=False``: the caller knows that no Slice is at
    risk (see :func:`guard_needed`).

    With a Slice at risk, inference runs once, whole, in a forked child (:func:`_contained_inference`), which
    an abort kills instead of this process; where it finishes and every dim checks, that is the answer (one
    inference, whatever the graph's depth). Only where it crashed, a dim is wrong, or no child can be forked,
    the graph is inferred depth by depth, each depth's dims checked before a Slice of the next reads them, so
    that the error names the node that made the first wrong dim and the process never aborts."""
    op_types = list(map(_OP_TYPE, model.graph.node))  # read once for the checks and data propagation's bound
    check_shape_constants(model, where, op_types)
    depths = _guard_depths(model.graph, op_types) if guard else None
    if depths is None:
        return _infer_plain(model, where, strict, op_types)
    whole = _contained_inference(model, strict)
    if whole is not None:
        kind, data = whole
        if kind == "E":
            if strict:
                raise RuntimeError(data)
            raise _inference_failed(where, data)
        inferred = onnx.load_from_string(data)
        try:
            check_dims(collect(inferred), model, where, hint)
            return inferred
        except ShapeError:
            log.debug("%s: a wrong dim after inference: inferred again depth by depth to name its node", where)
    for d in range(max(depths) + 1):
        part = model if d == max(depths) else _nodes_up_to(model, depths, d)
        inferred = _infer_plain(part, where, strict)
        check_dims(collect(inferred), model, where, hint)
    return inferred


def _contained_inference(model: ModelProto, strict: bool) -> tuple[str, str | bytes] | None:
    """ONNX's inference of the whole ``model`` in a forked child: ``("M", the inferred model serialized)``, or
    ``("E", the first line of the inference error)``; None where no child may be forked (:func:`fork_safe`) or
    it did not exit cleanly (ONNX's C++ aborting on a negative dim: the caller then guards depth by depth)."""
    if not fork_safe():
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


def _infer_plain(model: ModelProto, where: str, strict: bool = False,
                 op_types: Sequence[str] | None = None) -> ModelProto:
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=strict,
                                                 data_prop=data_prop_bounded(model, op_types))
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


_DIMS, _OP_TYPE = attrgetter("dims"), attrgetter("op_type")


def data_prop_bounded(model: ModelProto, op_types: Sequence[str] | None = None) -> bool:
    """Whether ONNX's data propagation stays bounded on ``model``: no graph input or initializer of rank 1, and no
    integer Range of the top graph, holds more than :data:`DATA_PROP_LIMIT` elements. A Range's size is known from
    its constant inputs, or from inputs computed from declared shapes and constants (``Range(0, Size(x))``) as
    :func:`fold_constants` computes them. Where it is not bounded, inference runs without data propagation, and folding
    (:func:`resolve`) computes the small shape vectors instead."""
    g = model.graph
    # the initializers' dims, and below the nodes' op types (``op_types``, where the caller read them), read by
    # C-level loops: this runs over every initializer and node of the largest graphs (on the inference child's
    # critical path)
    for k, dims in enumerate(list(map(_DIMS, g.initializer))):
        if len(dims) == 1 and dims[0] > DATA_PROP_LIMIT:
            t = g.initializer[k]
            log.debug("initializer %r has %d elements: inference without data propagation", t.name, t.dims[0])
            return False
    for vi in g.input:
        dims = vi.type.tensor_type.shape.dim
        if len(dims) == 1 and dims[0].dim_value > DATA_PROP_LIMIT:
            log.debug("input %r has %d elements: inference without data propagation", vi.name, dims[0].dim_value)
            return False
    if op_types is None:
        op_types = list(map(_OP_TYPE, g.node))
    ranges = [i for i, op in enumerate(op_types) if op == "Range" and g.node[i].domain in ("", "ai.onnx")] \
        if "Range" in op_types else []
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
    constants = LazyConstants(model)
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
        known = collect(model, bodies=False)  # declared shapes only: no inference here
        local = dict(values)
        for k in order:
            node = g.node[k]
            local.update({o: constants[o] for o in node.output if o in constants})
            if all(o in local for o in node.output if o):
                continue
            outs = evaluate_node(node, known, local)
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

def _guard_depths(graph: onnx.GraphProto, op_types: Sequence[str] | None = None) -> list[int] | None:
    """Per node of ``graph``: how many Slice nodes at risk lie on the longest path that ends at it
    (itself included); None when no Slice is at risk. A Slice is at risk when an operator outside
    :data:`DIM_SAFE_OPS` precedes it; a node with subgraphs counts as unsafe, and as a Slice when
    one of its bodies holds one. Paths follow ONNX's own order of inference (the order of the
    nodes), so a read of a tensor produced further down does not count: ONNX does not see its shape
    either. Inferring the nodes of depth <= d, for d = 0, 1, ..., checks every Slice's input dims
    before a Slice sees them. ``op_types``: the nodes' op types, where the caller read them."""
    nodes = graph.node
    present = set(list(map(_OP_TYPE, nodes)) if op_types is None else op_types)
    if "Slice" not in present and present.isdisjoint(SUBGRAPH_OPS):  # no Slice-like node: read nothing more
        return None
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
            from ..graph import subgraph_outer_names

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
             and has_data(t) and prod(t.dims) <= FOLD_LIMIT and (inline_array(t) >= 0).all()}
    for node in graph.node:
        if node.domain not in ("", "ai.onnx") or not node.output:
            continue
        op = node.op_type
        if op in ("Shape", "Size"):
            found.add(node.output[0])
        elif op == "Constant":
            v = constant_value(node)
            if v is not None and v.dtype.kind in "iu" and v.size <= FOLD_LIMIT and (v >= 0).all():
                found.add(node.output[0])
        elif op in _SELECTING_OPS:
            data = node.input if op == "Concat" else node.input[:1]
            if data and all(x in found for x in data if x):
                found.add(node.output[0])
    return found


def guard_needed(index: GraphIndex) -> bool:
    """Whether the graph of ``index`` may hold a Slice at risk (cheap: from the op types read once)."""
    ops = set(index.node_ops)
    if index.bodies:
        return True
    if ("", "Slice") not in ops and ("ai.onnx", "Slice") not in ops:
        return False
    return any(d not in ("", "ai.onnx") or o not in DIM_SAFE_OPS for d, o in ops)


def _guard_kind(node: onnx.NodeProto) -> tuple[bool, bool]:
    """(dim-safe, Slice-like) of one node."""
    if node.domain not in ("", "ai.onnx"):
        return False, False
    if node.op_type in SUBGRAPH_OPS:
        return False, any(_holds_slice(g) for a in node.attribute
                          for g in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs))
    if node.op_type == "Split":
        return len(node.input) < 2 or not node.input[1], False  # without sizes, parts are even
    return node.op_type in DIM_SAFE_OPS, node.op_type == "Slice"


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
    declared = declared_shape(vi)
    if not declared or len(declared) < 3 or not all(isinstance(d, int) and d > 0 for d in declared):
        return ""

    def works(size: int) -> bool:
        dims = (*declared[:2], *(max(d, size) for d in declared[2:]))
        trial = ModelProto()
        trial.CopyFrom(model)
        apply_overrides(trial, inputs, {inputs[0]: dims}, None, where)
        try:
            check_dims(collect(infer(trial, where, hint=False)), trial, where, hint=False)
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

    @property
    def in_child(self) -> bool:
        """Whether a forked child is at work on this inference (its report not yet read)."""
        return self._fd is not None

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
            done = subprocess.run([sys.executable, "-c", "from flopcount.pipeline.shapes.guarded import spawned_main; spawned_main()",
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

    def collected(self, declared: Mapping[str, tuple[int, tuple[int, ...]]],
                  infos: Mapping[str, TensorInfo] | None = None) -> "Collected | None":
        """The tensor infos of the inferred model as :func:`collect` reads them (``declared``: the top graph's
        initializers, ``(data type, dims)`` by name, which the child leaves out; ``infos``: their tensor infos,
        where the caller made them already), or None when there is no report to
        trust (no child, or it died without a word, or its report does not parse): the caller infers in-process.
        Raises :class:`ShapeError` when inference fails, or when it crashed the child (ONNX's C++ aborting on a
        malformed graph): that is never re-run in-process."""
        data = self._receive()
        if data[:1] == b"T":
            try:
                return from_type_table(*marshal.loads(data[1:]),
                                       initializer_infos(None, declared) if infos is None else infos)
            except Exception as e:  # a damaged report: infer here instead
                log.debug("%s: the inference child's report does not parse (%s)", self.where, e)
                return None
        if data[:1] == b"C":
            try:
                return _from_rows(*marshal.loads(data[1:]), declared, infos)
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
    """What a child reports: b"T" + the tensor infos of an inferred model without bodies (a table of its distinct
    types: :func:`~flopcount.pipeline.shapes.tensors.type_table`), b"C" + those of a model with bodies
    (:func:`_rows`), b"S" + a ShapeError's
    message (a negative dim found by the guard), or b"E" + the first line of an inference error. The child reads the
    inferred model itself, beside the parent's DAG construction, and sends plain tuples, which the parent rebuilds
    faster than it would parse the model and read its types."""
    try:
        op_types = list(map(_OP_TYPE, model.graph.node))  # read once for the three checks
        check_shape_constants(model, where, op_types)  # before ONNX's data propagation may hold its values
        if _guard_depths(model.graph, op_types) is None:
            from onnx.onnx_cpp2py_export import shape_inference as cpp

            inferred = onnx.load_from_string(cpp.infer_shapes(model.SerializeToString(), False, False,
                                                              data_prop_bounded(model, op_types)))
        else:
            inferred = infer(model, where)  # a Slice at risk of a negative dim: step by step
        if set(op_types).isdisjoint(SUBGRAPH_OPS):  # no bodies: the compact table of the top graph's types
            return b"T" + marshal.dumps(type_table(inferred.graph))
        return b"C" + marshal.dumps(_rows(collect(inferred, initializers={})))  # the parent has the initializers
    except ShapeError as e:
        return b"S" + str(e).encode("utf-8", "replace")
    except Exception as e:  # InferenceError, ValidationError, or RuntimeError from C++
        return b"E" + first_line(e).encode("utf-8", "replace")


def _rows(collected: "Collected") -> tuple[list[tuple], list[str]]:
    """Collected tensor infos as plain tuples (for :mod:`marshal`), and the names with odd dims."""
    return [tuple(t) for t in collected.values()], collected.odd


def _from_rows(rows: list[tuple], odd: list[str], declared: Mapping[str, tuple[int, tuple[int, ...]]],
               infos: Mapping[str, TensorInfo] | None = None) -> "Collected":
    """The inverse of :func:`_rows`, for a report collected without the top graph's initializers: they come first, from
    ``declared`` (as :func:`collect` puts them; ``infos``: their tensor infos, where made already), and their declared
    types stand (the rows of their inputs are dropped)."""
    out = Collected(initializer_infos(None, declared) if infos is None else infos)
    names = list(map(itemgetter(0), rows))
    if not declared.keys().isdisjoint(names):  # an initializer's declared input (older exports)
        rows = [row for row in rows if row[0] not in declared]
        names = list(map(itemgetter(0), rows))
    out.update(zip(names, map(partial(tuple.__new__, TensorInfo), rows)))  # C-level iterators: no frame per row
    out.odd = [name for name in odd if name not in declared] if declared else odd
    return out


def spawned_main() -> None:
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
    return fork_safe()


def fork_safe() -> bool:
    """Whether this process may fork a child (ONNX's inference here, an export ahead in
    :mod:`flopcount.frontends.ahead`): see :func:`_may_fork`. A progress bar's monitor thread, when it is the only
    other Python thread, is stopped first (:func:`_stop_progress_monitor`)."""
    if os.environ.get("FLOPCOUNT_PARALLEL", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    if not hasattr(os, "fork") or (threading.active_count() != 1 and not _stop_progress_monitor()):
        return False
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    return not (cuda is not None and getattr(cuda, "is_initialized", lambda: False)())


def _stop_progress_monitor() -> bool:
    """Stop tqdm's monitor thread where it is the only Python thread besides this one; whether this process then has
    no other. A framework's progress bar (a download, a model's loading, an export) starts that monitor, a daemon
    thread that wakes every few seconds to tune the bars and lives until the process ends, even after every bar has
    closed; a process with it would never fork. The thread is known by what it holds, not by its name: the tqdm class
    whose bars it watches, whose ``monitor`` it is, and its own ``exit()``, which wakes and joins it. Nothing is lost
    by stopping it: the next bar of that class starts a new one."""
    others = [t for t in threading.enumerate() if t is not threading.current_thread()]
    if len(others) != 1:
        return False
    (thread,) = others
    watched = getattr(thread, "tqdm_cls", None)
    stop = getattr(thread, "exit", None)
    if watched is None or getattr(watched, "monitor", None) is not thread or not callable(stop):
        return False
    stop()
    return not thread.is_alive() and threading.active_count() == 1


#: Ops whose inference in ONNX's C++ aborts the process (an assertion in std::clamp) when an input dim is negative.
_ABORTING_OPS = frozenset({"Slice", "Pad"})


def _body_at_risk(graph) -> bool:
    """Whether a control-flow body (at any depth) holds an op whose ONNX inference can abort on a negative dim.
    Top-level ones are guarded before inference (:func:`_guard_depths`); dims inside bodies are not checked first
    (ONNX infers the branch not taken too), so such a graph's inference runs in the child at any size, where an
    abort is contained and reported instead of killing the process."""
    for node in graph.node:
        if node.op_type in SUBGRAPH_OPS:
            for a in node.attribute:
                for body in (a.g,) if a.HasField("g") else tuple(a.graphs):
                    if any(n.op_type in _ABORTING_OPS for n in body.node) or _body_at_risk(body):
                        return True
    return False


