"""Measured time and FLOP/s per operator: the counted graph run through onnxruntime's profiler.

The model is counted (:func:`flopcount.count`), then run by onnxruntime on the same fixed shapes: warm-up runs,
then timed runs under the profiler, each node's kernel time the median over the timed runs, and the whole run's
time measured again without the profiler (``run_time_s``). Each node's analytic FLOPs and the bytes it reads and
writes (:func:`flopcount.report.node_bytes`) then give its achieved FLOP/s, its arithmetic intensity and whether it
sits left (memory-bound) or right (compute-bound) of the ridge point of the machine's measured ceilings.

Weights: a model whose initializers are in the file runs with them, and so does one whose external-data files are all
present beside it (read through onnx's own loader, which refuses locations outside the model's folder; counting
itself never opens them). Initializers without data (a weightless graph, external data whose files are absent) are
synthesised from their dims and dtypes into a new in-memory model: floating-point weights uniform in ±1/√fan-in (rank ≥ 2) or in [0.5, 1.5) (scales, variances), integer and
boolean ones zero. Small integer tensors that shapes depend on are inline in the file and kept exactly.

Graph optimisations are off by default, so every executed node is a graph node. With ``optimize="basic"`` or
``"all"`` onnxruntime fuses nodes; each executed node is then attributed the graph nodes it replaced (their FLOPs
summed, the bytes crossing the group's boundary), and ``covers`` lists them.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from flopcount.errors import DeviceError, MeasurementError, ShapeError, UsageError
from flopcount.report import NodeCount, Report, node_bytes, op_key, tensor_bytes

log = logging.getLogger(__name__)

PROFILE_SCHEMA_VERSION = 1
OPTIMIZE_LEVELS = ("none", "basic", "extended", "all")
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
#: ONNX element type → the ceilings' dtype name.
_CEILING_DTYPE = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp64"}


class _Rates:
    """Achieved FLOP/s and arithmetic intensity of something with ``flops``, ``bytes`` and ``time_s``."""

    flops: int
    bytes: int | None
    time_s: float | None

    @property
    def flops_per_s(self) -> float | None:
        return self.flops / self.time_s if self.time_s else None

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte read or written."""
        return self.flops / self.bytes if self.bytes else None


@dataclass(frozen=True)
class NodeProfile(_Rates):
    """One executed node: its measured median time and its counted work.

    ``covers`` are the graph nodes it runs (itself without optimisation; the fused nodes with it); ``flops`` their
    analytic FLOPs; ``bytes`` what it reads and writes (None when a shape is unknown); ``time_s`` the median kernel
    time over the timed runs (None when the profiler never reported it); ``bound`` ``"compute"`` or ``"memory"``
    against the ceilings (None when bytes or the ceilings are unknown)."""

    name: str
    op_type: str
    covers: tuple[str, ...]
    flops: int
    bytes: int | None
    time_s: float | None
    bound: str | None
    dtype: str = "fp32"
    provider: str = ""


@dataclass(frozen=True)
class OpTypeProfile(_Rates):
    op_type: str
    nodes: int
    flops: int
    bytes: int | None
    time_s: float
    bound: str | None


@dataclass(frozen=True)
class Profile:
    """The result of :func:`profile`. ``run_time_s`` is the median whole-run time without the profiler;
    ``profiled_time_s`` the median sum of the node times; ``unattributed_s`` the median time of kernels that map to
    no graph node (layout conversions an optimised graph adds)."""

    model: str | None
    provider: str
    optimize: str
    batch: int
    warmup: int
    runs: int
    run_time_s: float
    profiled_time_s: float
    flops: int
    nodes: tuple[NodeProfile, ...]
    by_op_type: Mapping[str, OpTypeProfile]
    ceilings: Any  # flopcount.measure.ceilings.Ceilings
    weights: Mapping[str, int]  # {"from_model": k, "synthesized": m}
    unattributed_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def flops_per_s(self) -> float:
        """The whole run's FLOP/s: counted FLOPs over the median run time without the profiler."""
        return self.flops / self.run_time_s


# ----------------------------------------------------------------------------------------------------------------
# the model onnxruntime runs


def _has_data(t) -> bool:
    from onnx import TensorProto

    if t.data_location == TensorProto.EXTERNAL:
        return False
    n = 1
    for d in t.dims:
        n *= d
    if n == 0:
        return True
    return any(len(getattr(t, f)) for f in ("raw_data", "float_data", "int32_data", "string_data", "int64_data",
                                            "double_data", "uint64_data"))


def _synthesize(t, rng):
    """A tensor of ``t``'s name, dims and dtype with synthetic values (see the module docstring)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    dims = tuple(t.dims)
    try:
        np_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    except (KeyError, TypeError, ValueError):
        np_dtype = None
    floating = t.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    if floating:
        if len(dims) >= 2:
            fan_in = max(1, int(np.prod(dims[1:])))
            values = rng.uniform(-1, 1, size=dims) / np.sqrt(fan_in)
        else:
            values = rng.uniform(0.5, 1.5, size=dims)
        if t.data_type == TensorProto.BFLOAT16:
            return helper.make_tensor(t.name, t.data_type, dims, values.astype(np.float32).ravel().tolist())
        return numpy_helper.from_array(values.astype(np_dtype), t.name)
    if np_dtype is not None and np_dtype.kind in "iub":
        return numpy_helper.from_array(np.zeros(dims, dtype=np_dtype), t.name)
    raise MeasurementError(f"initializer {t.name!r} ({onnx.TensorProto.DataType.Name(t.data_type)}) has no data "
                           "and flopcount cannot synthesise that type; give the model with its weights")


def _fill_graph(graph, rng, counts: dict[str, int]) -> None:
    from onnx import AttributeProto

    for i, t in enumerate(graph.initializer):
        if _has_data(t):
            counts["from_model"] += 1
        else:
            graph.initializer[i].CopyFrom(_synthesize(t, rng))
            counts["synthesized"] += 1
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR and not _has_data(a.t):
                a.t.CopyFrom(_synthesize(a.t, rng))
                counts["synthesized"] += 1
            elif a.type == AttributeProto.GRAPH:
                _fill_graph(a.g, rng, counts)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    _fill_graph(g, rng, counts)


def _load_present_external_data(model, folder: str) -> None:
    """Read the model's external weights when every file they name exists in ``folder`` (a location that leaves the
    folder, or a file that is absent or too short, leaves the weights to be synthesised, with a log line)."""
    import onnx
    from onnx import TensorProto, external_data_helper

    tensors = [t for t in external_data_helper._get_all_tensors(model) if t.data_location == TensorProto.EXTERNAL]
    if not tensors:
        return
    locations = {next((e.value for e in t.external_data if e.key == "location"), "") for t in tensors}
    root = os.path.realpath(folder)
    inside = all(loc and os.path.realpath(os.path.join(root, loc)).startswith(root + os.sep) for loc in locations)
    if not inside or not all(os.path.isfile(os.path.join(root, loc)) for loc in locations):
        log.info("external weights (%s) absent or outside the model's folder: synthesised",
                 ", ".join(sorted(locations))[:200])
        return
    try:
        external_data_helper.load_external_data_for_model(model, root)
    except (OSError, ValueError, onnx.checker.ValidationError) as e:
        log.warning("external weights could not be read (%s): synthesised", e)
        for t in tensors:  # anything half-read is synthesised from its dims
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL


def runnable_model(source, report: Report, seed: int = 0):
    """The model onnxruntime runs: ``source`` read with its inline data (and its external data when every file is
    present beside it), model-local
    functions expanded as counting expands them, every node given a unique name (kept where it already is one),
    missing weights synthesised, and graph inputs and outputs fixed to the count's resolved shapes. Returns the
    model, the node names by graph position, and ``{"from_model": k, "synthesized": m}``."""
    import numpy as np
    import onnx

    if isinstance(source, onnx.ModelProto):
        model = onnx.ModelProto()
        model.CopyFrom(source)
    else:
        try:
            model = onnx.load(os.fspath(source), load_external_data=False)
        except Exception as e:  # count() has read it already: unlikely
            raise MeasurementError(f"{source}: cannot be read for running ({e})") from None
    if not isinstance(source, onnx.ModelProto):
        _load_present_external_data(model, os.path.dirname(os.path.abspath(os.fspath(source))))
    if model.functions:
        import onnx.inliner

        model = onnx.inliner.inline_local_functions(model)
    graph = model.graph
    if len(graph.node) != len(report.nodes):
        raise MeasurementError(f"{report.model.path or '<model>'}: the graph onnxruntime would run has "
                               f"{len(graph.node)} nodes but the count has {len(report.nodes)}; profile the file "
                               "as it is on disk")
    seen: set[str] = set()
    names = []
    for i, node in enumerate(graph.node):
        name = node.name
        if not name or name in seen:
            name = f"{node.op_type}_{i}"
            while name in seen:
                name += "_"
            node.name = name
        seen.add(name)
        names.append(name)
    counts = {"from_model": 0, "synthesized": 0}
    _fill_graph(graph, np.random.default_rng(seed), counts)
    resolved = {t.name: t for t in (*report.model.inputs, *report.model.outputs)}
    for vi in (*graph.input, *graph.output):
        info = resolved.get(vi.name)
        if info is None or not vi.type.HasField("tensor_type"):
            continue
        shape = vi.type.tensor_type.shape
        shape.ClearField("dim")
        if info.shape is not None:
            for d in info.shape:
                dim = shape.dim.add()
                if isinstance(d, int):
                    dim.dim_value = d
                elif isinstance(d, str):
                    dim.dim_param = d
        else:
            vi.type.tensor_type.ClearField("shape")
    graph.ClearField("value_info")  # stale intermediate shapes would contradict the fixed inputs
    return model, names, counts


def make_inputs(report: Report, seed: int = 0) -> dict[str, Any]:
    """Random floating-point inputs (standard normal) and zero integer/boolean inputs of the resolved shapes."""
    import numpy as np
    from onnx import helper

    rng = np.random.default_rng(seed + 1)
    feeds = {}
    for t in report.model.inputs:
        if not t.is_static:
            raise ShapeError(f"input {t.name!r} has dims {t.shape_text()}, not all known; fix them with "
                             f"--input-shape {t.name}=DIMS (or --batch N)")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        if dtype.kind == "f":
            feeds[t.name] = rng.standard_normal(t.shape).astype(dtype)
        else:
            feeds[t.name] = np.zeros(t.shape, dtype=dtype)
    return feeds


# ----------------------------------------------------------------------------------------------------------------
# onnxruntime


def _ort(provider: str):
    try:
        import onnxruntime as ort
    except ImportError:
        raise DeviceError("profiling needs onnxruntime: pip install onnxruntime (onnxruntime-gpu for --provider "
                          "cuda)") from None
    if provider not in PROVIDERS:
        raise UsageError(f"--provider {provider!r}: expected one of {', '.join(PROVIDERS)}")
    if PROVIDERS[provider] not in ort.get_available_providers():
        raise DeviceError(f"--provider {provider}: this onnxruntime has no {PROVIDERS[provider]} (it offers "
                          f"{', '.join(ort.get_available_providers())}); pip install onnxruntime-gpu in place of "
                          "onnxruntime")
    return ort


def _session(ort, model_bytes: bytes, provider: str, optimize: str, profile_prefix: str | None = None,
             optimized_path: str | None = None, threads: int | None = None, where: str = "<model>"):
    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimize]
    so.log_severity_level = 3
    if threads:
        so.intra_op_num_threads = threads
    # Idle pool threads sleep instead of spinning: spinning threads take cores from the ones doing the work
    # whenever the machine has other load, which makes times erratic; on an idle machine this costs little.
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile_prefix:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    try:
        return ort.InferenceSession(model_bytes, so, providers=[PROVIDERS[provider]])
    except Exception as e:  # onnxruntime raises its own exception types
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MeasurementError(f"{where}: onnxruntime cannot load the model: {first}") from None


def _run(session, feeds, where: str):
    try:
        session.run(None, feeds)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise MeasurementError(f"{where}: onnxruntime failed to run the model: {first}") from None


def parse_profile(events: list[dict], warmup: int) -> tuple[list[dict[str, float]], list[float], dict[str, str]]:
    """Per timed run, seconds per node name (kernel time; on CUDA the GPU kernels' time when onnxruntime reports
    them), the profiled run times, and node name → provider. The first ``warmup`` ``model_run`` events are
    skipped; a node's events are assigned to the run whose span holds them."""
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    runs = runs[warmup:]
    per_run: list[dict[str, float]] = [{} for _ in runs]
    providers: dict[str, str] = {}
    gpu = [e for e in events if e.get("cat") == "Kernel" and (e.get("args") or {}).get("parent_name")]
    if gpu:
        items = [(e["ts"], e["args"]["parent_name"], e["dur"]) for e in gpu]
        for e in events:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
                providers[e["name"][: -len("_kernel_time")]] = (e.get("args") or {}).get("provider", "")
    else:
        items = []
        for e in events:
            if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time"):
                name = e["name"][: -len("_kernel_time")]
                items.append((e["ts"], name, e["dur"]))
                providers[name] = (e.get("args") or {}).get("provider", "")
    starts = [a for a, _ in runs]
    import bisect

    for ts, name, dur in items:
        k = bisect.bisect_right(starts, ts) - 1
        if k < 0 or ts > runs[k][1] + 1e3 and not gpu:  # before the timed runs, or in no run (warm-up)
            continue
        per_run[k][name] = per_run[k].get(name, 0.0) + dur * 1e-6
    return per_run, [(b - a) * 1e-6 for a, b in runs], providers


_NCHWC = "_nchwc"
_REORDER = ("ReorderInput", "ReorderOutput")
_MOVES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose"})  # compute nothing


def _absorbs(node) -> dict[str, int]:
    """What an executed node computes after its own output, by its attributes: an ``activation`` (onnxruntime's
    FusedConv, FusedGemm and NCHWc Conv) and, for a convolution with a fourth input, the sum of that input
    (Conv + Add fusion). Op type → how many such graph nodes it absorbs downstream."""
    out: dict[str, int] = {}
    for a in node.attribute:
        if a.name == "activation" and a.s:
            out[a.s.decode()] = 1
    if node.op_type in ("Conv", "FusedConv") and len(node.input) >= 4 and node.input[3]:
        out["Add"] = out.get("Add", 0) + 1
        out["Sum"] = out.get("Sum", 0) + 1
    return out


def attribute(graph_nodes, names: list[str], optimized_graph) -> dict[str, list[int]]:
    """Executed node name → the graph positions of the nodes it runs, for an optimised graph.

    A node belongs to the executed node that produces one of its outputs. A node fused away belongs, first, to the
    executed node that absorbed it downstream of its own output (a convolution's ``activation``, or the residual
    ``Add`` of a convolution that takes the sum as a fourth input) where that node owns the producer of the fused
    node's input; else to the owner of its first consumer that has one (a ``Transpose`` folded into the product
    it feeds). Nodes folded into constants belong to none. onnxruntime's NCHWc layout pass names each node it
    rewrites ``<tensor>_nchwc`` after the tensor it stands for, whose name its output no longer carries (a
    ``ReorderOutput`` may carry it instead): such a node counts as producing ``<tensor>``. A data-movement node
    the optimiser inserted (a node of no graph node's name: the Reshapes around the Gemm that MatMul + Add of a
    3-D input become) passes what it writes on to the node that computed its input, unless the graph node that
    wrote it moves data too (a Transpose the optimiser rebuilt under a new name)."""
    produced = {o: n.name for n in optimized_graph.node for o in n.output if o}
    known = set(names)
    inserted = {n.name: n.input[0] for n in optimized_graph.node
                if n.op_type in _MOVES and n.domain in ("", "ai.onnx") and n.input and n.name not in known}

    def computed_by(name: str) -> str:
        """Back from an inserted move through its input, to the node that computed what it moves."""
        for _ in range(len(inserted)):
            up = produced.get(inserted[name]) if name in inserted else None
            if up is None:
                break
            name = up
        return name
    layout = {n.name for n in optimized_graph.node if n.op_type in _REORDER}
    for n in optimized_graph.node:
        if not n.name.endswith(_NCHWC):
            continue
        stands_for = n.name[: -len(_NCHWC)]
        if produced.get(stands_for) in (None, *layout):  # a reorder back to NCHW only moves what this node computed
            produced[stands_for] = n.name
    capacity = {n.name: _absorbs(n) for n in optimized_graph.node}
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph_nodes):
        for t in n.output:
            producer[t] = i
        for t in n.input:
            consumers.setdefault(t, []).append(i)
    owner: dict[int, str | None] = {}
    moved: dict[int, str] = {}  # nodes whose output only a reorder writes: theirs unless a computing node absorbed them
    for i, n in enumerate(graph_nodes):  # downstream absorption, in graph order: Conv → Add → Relu
        found = next((produced[o] for o in n.output if o in produced), None)
        if found in inserted and n.op_type not in _MOVES:  # a move of the optimiser's writes what n computed
            found = computed_by(found)
        if found in layout:
            moved[i], found = found, None
        if found is None:
            for t in n.input:
                up = owner.get(producer.get(t, -1))
                if up is not None and capacity[up].get(n.op_type, 0) > 0:
                    capacity[up][n.op_type] -= 1
                    found = up
                    break
        owner[i] = found
    for i in range(len(graph_nodes) - 1, -1, -1):  # the rest: with the first consumer that has an owner
        if owner[i] is not None:
            continue
        n = graph_nodes[i]
        for o in n.output:
            for j in consumers.get(o, ()):
                if j > i and owner.get(j):
                    owner[i] = owner[j]
                    if owner[i] in inserted and n.op_type not in _MOVES:  # a move merged with the optimiser's
                        owner[i] = computed_by(owner[i])
                    break
            if owner[i]:
                break
    for i, name in moved.items():
        if owner[i] is None:
            owner[i] = name
    out: dict[str, list[int]] = {}
    for i, name in sorted(owner.items()):
        if name is not None:
            out.setdefault(name, []).append(i)
    return out


def _group_bytes(nodes: list[NodeCount]) -> int | None:
    """Bytes crossing the boundary of a group of nodes: tensors read from outside it and tensors it writes that
    are used outside it (or are graph outputs: all outputs of its last node are counted)."""
    if len(nodes) == 1:
        b = node_bytes(nodes[0])
        return None if b is None else b.total
    inside_out = {t.name: t for n in nodes for t in n.outputs if t is not None}
    inside_in = {t.name for n in nodes for t in n.inputs if t is not None}
    total = 0
    seen: set[str] = set()
    for n in nodes:
        for t in n.inputs:
            if t is not None and t.name not in inside_out and t.name not in seen:
                b = tensor_bytes(t)
                if b is None:
                    return None
                total += b
                seen.add(t.name)
    for name, t in inside_out.items():
        if name not in inside_in or t in nodes[-1].outputs:
            b = tensor_bytes(t)
            if b is None:
                return None
            total += b
    return total


def _dtype(nodes: list[NodeCount]) -> str:
    for n in nodes:
        for t in n.outputs:
            if t is not None and t.elem_type in _CEILING_DTYPE:
                return _CEILING_DTYPE[t.elem_type]
    return "fp32"


def bound_of(flops: int, nbytes: int | None, dtype: str, ceilings) -> str | None:
    """``"memory"`` when the intensity ``flops / nbytes`` is below the ridge point (compute ceiling of ``dtype``,
    else fp32, over the memory bandwidth), ``"compute"`` at or above it; None when either is unknown."""
    if not nbytes or ceilings is None or ceilings.memory_bandwidth is None:
        return None
    peak = ceilings.compute(dtype) or ceilings.compute("fp32")
    if peak is None:
        return None
    return "memory" if flops / nbytes < peak.value / ceilings.memory_bandwidth.value else "compute"


# ----------------------------------------------------------------------------------------------------------------


def profile(source, input_shapes: Mapping[str, tuple[int, ...]] | None = None, batch: int | None = None,
            provider: str = "cpu", optimize: str = "none", warmup: int = 2, runs: int = 5, ceilings=None,
            threads: int | None = None, input_values: Mapping[str, list[int]] | None = None) -> Profile:
    """Count ``source`` (a path or ModelProto), run it with onnxruntime's profiler and return a :class:`Profile`.

    ``ceilings`` (a :class:`~flopcount.measure.ceilings.Ceilings`) decide compute/memory bound; None measures
    this CPU's (cached) GEMM and copy ceilings.
    """
    from flopcount import count

    if optimize not in OPTIMIZE_LEVELS:
        raise UsageError(f"--optimize {optimize!r}: expected one of {', '.join(OPTIMIZE_LEVELS)}")
    if warmup < 0 or runs < 1:
        raise UsageError(f"--warmup must be >= 0 and --runs >= 1 (got {warmup} and {runs})")
    ort = _ort(provider)
    report = count(source, input_shapes=dict(input_shapes or {}), batch=batch, input_values=dict(input_values or {}))
    where = report.model.path or "<model>"
    model, names, weights = runnable_model(source, report)
    feeds = make_inputs(report)
    if ceilings is None:
        from .ceilings import default_ceilings

        ceilings = default_ceilings()
    try:
        model_bytes = model.SerializeToString()
    except ValueError:  # protobuf's 2 GB limit
        raise MeasurementError(f"{where}: with its weights the model is over 2 GB, more than onnxruntime takes from "
                               "memory; profile a smaller --batch or a smaller variant") from None
    notes: list[str] = []
    if weights["synthesized"]:
        notes.append(f"{weights['synthesized']} initializers without data were synthesised (random values of their "
                     "dims and dtypes); times do not depend on the values")
    with tempfile.TemporaryDirectory(prefix="flopcount-profile-") as tmp:
        optimized_path = os.path.join(tmp, "optimized.onnx") if optimize != "none" else None
        session = _session(ort, model_bytes, provider, optimize, os.path.join(tmp, "ort"), optimized_path, threads,
                           where)
        plain = _session(ort, model_bytes, provider, optimize, threads=threads, where=where)
        # Profiled and plain runs alternate, so that both see the same machine (other load, clocks).
        times = []
        for k in range(warmup + runs):
            _run(session, feeds, where)
            t0 = time.perf_counter()
            _run(plain, feeds, where)
            if k >= warmup:
                times.append(time.perf_counter() - t0)
        run_time = statistics.median(times)
        trace = session.end_profiling()
        try:
            with open(trace, encoding="utf-8") as f:
                events = json.load(f)
        except (OSError, ValueError) as e:
            raise MeasurementError(f"onnxruntime's profile {trace} cannot be read ({e})") from None
        groups: dict[str, list[int]]
        executed_ops: dict[str, str]
        if optimized_path:
            import onnx

            optimized = onnx.load(optimized_path, load_external_data=False)
            groups = attribute(model.graph.node, names, optimized.graph)
            executed_ops = {n.name: op_key(n.domain, n.op_type) for n in optimized.graph.node}
            notes.append(f"graph optimisations '{optimize}': {len(optimized.graph.node)} executed nodes for "
                         f"{len(report.nodes)} graph nodes; each row lists the graph nodes it runs")
        else:
            groups = {name: [i] for i, name in enumerate(names)}
            executed_ops = {name: report.nodes[i].op_type for i, name in enumerate(names)}
    per_run, profiled_runs, providers = parse_profile(events, warmup)
    if not per_run:
        raise MeasurementError(f"{where}: onnxruntime's profile holds no timed run; rerun with --runs 3 or more")

    rows: list[NodeProfile] = []
    for name in executed_ops:
        members = [report.nodes[i] for i in groups.get(name, [])]
        samples = [r[name] for r in per_run if name in r]
        time_s = statistics.median(samples) if samples else None
        flops = sum(n.cost.flops for n in members)
        nbytes = _group_bytes(members) if members else None
        dtype = _dtype(members)
        rows.append(NodeProfile(name, executed_ops[name], tuple(n.name for n in members), flops, nbytes, time_s,
                                bound_of(flops, nbytes, dtype, ceilings), dtype, providers.get(name, "")))
    executed = set(executed_ops)
    unattributed = statistics.median(sum(v for k, v in r.items() if k not in executed) for r in per_run)
    if unattributed > 0:
        notes.append(f"{unattributed * 1e3:.3f} ms per run in kernels that name no executed node")
    counted_flops = sum(r.flops for r in rows)
    if counted_flops != report.forward.flops:
        notes.append(f"{report.forward.flops - counted_flops:,} FLOPs belong to nodes folded away by optimisation")
    profiled = statistics.median(sum(r.values()) for r in per_run)
    return Profile(report.model.path, provider, optimize, report.batch, warmup, runs, run_time, profiled,
                   report.forward.flops, tuple(rows), _by_op_type(rows, ceilings), ceilings, weights, unattributed,
                   tuple(notes))


def _by_op_type(rows: list[NodeProfile], ceilings) -> dict[str, OpTypeProfile]:
    acc: dict[str, list[NodeProfile]] = {}
    for r in rows:
        acc.setdefault(r.op_type, []).append(r)
    out = {}
    for op, rs in acc.items():
        # bytes of the graph nodes these executed nodes run; one that runs none (a Reshape the optimiser inserted)
        # adds no counted work, rather than making the sum unknown
        counted = [r for r in rs if r.covers]
        nbytes = None if not counted or any(r.bytes is None for r in counted) else sum(r.bytes for r in counted)
        flops = sum(r.flops for r in rs)
        out[op] = OpTypeProfile(op, len(rs), flops, nbytes, sum(r.time_s or 0.0 for r in rs),
                                bound_of(flops, nbytes, rs[0].dtype, ceilings))
    return dict(sorted(out.items(), key=lambda kv: -kv[1].time_s))


# ----------------------------------------------------------------------------------------------------------------
# rendering


def to_dict(p: Profile) -> dict[str, Any]:
    """The JSON document of ``flopcount profile --format json`` (schema in docs/profile.md)."""
    from flopcount import __version__

    def node(r: NodeProfile) -> dict[str, Any]:
        return {"name": r.name, "op_type": r.op_type, "covers": list(r.covers), "flops": r.flops, "bytes": r.bytes,
                "time_s": r.time_s, "flops_per_s": r.flops_per_s, "intensity": r.intensity, "bound": r.bound,
                "dtype": r.dtype, "provider": r.provider}

    total_time = sum(s.time_s for s in p.by_op_type.values())
    c = p.ceilings
    peak = c.compute("fp32")
    return {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "tool": {"name": "flopcount", "version": __version__},
        "model": p.model,
        "provider": p.provider,
        "optimize": p.optimize,
        "batch": p.batch,
        "warmup": p.warmup,
        "runs": p.runs,
        "run_time_s": p.run_time_s,
        "profiled_time_s": p.profiled_time_s,
        "unattributed_s": p.unattributed_s,
        "flops": p.flops,
        "flops_per_s": p.flops_per_s,
        "weights": dict(p.weights),
        "ceilings": {
            "compute_fp32_flops_per_s": None if peak is None else peak.value,
            "memory_bytes_per_s": None if c.memory_bandwidth is None else c.memory_bandwidth.value,
            "device": c.device.get("name"),
        },
        "nodes": [node(r) for r in p.nodes],
        "by_op_type": {
            k: {"op_type": s.op_type, "nodes": s.nodes, "flops": s.flops, "bytes": s.bytes, "time_s": s.time_s,
                "time_share": s.time_s / total_time if total_time else None,
                "flops_share": s.flops / p.flops if p.flops else None, "flops_per_s": s.flops_per_s,
                "intensity": s.intensity, "bound": s.bound}
            for k, s in p.by_op_type.items()
        },
        "notes": list(p.notes),
    }


def _f(v: float | None, unit: str = "") -> str:
    from flopcount.render import si

    return "-" if v is None else si(v, unit)


def render(p: Profile, fmt: str = "table", per_node: bool = False) -> str:
    import csv
    import io

    from tabulate import tabulate

    if fmt == "json":
        return json.dumps(to_dict(p), indent=2) + "\n"
    total_time = sum(s.time_s for s in p.by_op_type.values()) or 1.0
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if per_node:
            w.writerow(["name", "op_type", "covers", "flops", "bytes", "time_s", "flops_per_s", "intensity", "bound"])
            for r in p.nodes:
                w.writerow([r.name, r.op_type, " ".join(r.covers), r.flops, _blank(r.bytes), _blank(r.time_s),
                            _blank(r.flops_per_s), _blank(r.intensity), r.bound or ""])
        else:
            w.writerow(["op_type", "nodes", "flops", "bytes", "time_s", "time_share", "flops_share", "flops_per_s",
                        "intensity", "bound"])
            for s in p.by_op_type.values():
                w.writerow([s.op_type, s.nodes, s.flops, _blank(s.bytes), s.time_s, f"{s.time_s / total_time:.6f}",
                            f"{s.flops / p.flops:.6f}" if p.flops else "", _blank(s.flops_per_s),
                            _blank(s.intensity), s.bound or ""])
        return buf.getvalue()
    parts = []
    if per_node:
        parts.append(tabulate(
            [[r.name, r.op_type, _ms(r.time_s), _f(r.flops, "FLOPs"), _f(r.flops_per_s, "FLOP/s"), _f(r.bytes, "B"),
              _i(r.intensity), r.bound or "-"] for r in p.nodes],
            ["node", "op type", "time ms", "FLOPs", "FLOP/s", "bytes", "FLOP/B", "bound"],
            tablefmt="simple", disable_numparse=True))
    parts.append(tabulate(
        [[s.op_type, s.nodes, f"{s.time_s * 1e3:.3f}", f"{100 * s.time_s / total_time:.1f}%",
          f"{100 * s.flops / p.flops:.1f}%" if p.flops else "-", _f(s.flops_per_s, "FLOP/s"), _f(s.bytes, "B"),
          _i(s.intensity), s.bound or "-"] for s in p.by_op_type.values()],
        ["op type", "nodes", "time ms", "time share", "FLOPs share", "FLOP/s", "bytes", "FLOP/B", "bound"],
        tablefmt="simple", disable_numparse=True, colalign=("left",) + ("right",) * 8))
    c = p.ceilings
    peak = c.compute("fp32")
    lines = [
        f"Model: {p.model or '<in memory>'}; batch {p.batch}; onnxruntime {p.provider}, graph optimisation "
        f"{p.optimize}; {p.warmup} warm-up + {p.runs} timed runs (medians)",
        f"Whole run (no profiler): {p.run_time_s * 1e3:.3f} ms, {_f(p.flops, 'FLOPs')} -> {_f(p.flops_per_s, 'FLOP/s')}",
        f"Sum of node times (profiler): {p.profiled_time_s * 1e3:.3f} ms "
        f"({100 * p.profiled_time_s / p.run_time_s:.1f}% of the whole run)",
        f"Ceilings: compute fp32 {_f(None if peak is None else peak.value, 'FLOP/s')}, memory "
        f"{_f(None if c.memory_bandwidth is None else c.memory_bandwidth.value, 'B/s')}"
        + (f", ridge point {peak.value / c.memory_bandwidth.value:.1f} FLOP/B" if peak and c.memory_bandwidth else "")
        + f" ({c.device.get('name', '?')})",
        f"Weights: {p.weights['from_model']} initializers from the model, {p.weights['synthesized']} synthesised",
        *[f"Note: {n}" for n in p.notes],
    ]
    return "\n\n".join(parts + ["\n".join(lines)]) + "\n"


def _blank(v) -> str:
    return "" if v is None else repr(v)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.3f}"


def _i(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
