"""Measured time and FLOP/s per operator: the counted graph run through onnxruntime's profiler.

The model is counted (:func:`flopcount.count`), then run by onnxruntime on the same fixed shapes: warm-up runs,
then timed runs under the profiler, each node's kernel time the median over the timed runs, and the whole run's
time measured again without the profiler (``run_time_s``). Each node's analytic FLOPs and the bytes it reads and
writes (:func:`flopcount.reporting.report.node_bytes`) then give its achieved FLOP/s, its arithmetic intensity and whether it
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
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping

from flopcount.errors import MeasurementError, UsageError
from flopcount.reporting.report import op_key

from .attribution import attribute, bound_of, by_op_type, ceiling_dtype, group_bytes
from .records import NodeProfile, Profile
from .runnable import make_inputs, runnable_model
from .session import OPTIMIZE_LEVELS, SessionSpec, import_ort, open_session, parse_profile, run_session

__all__ = ["ProfileSettings", "profile", "stale_ceiling"]


@dataclass(frozen=True)
class ProfileSettings:
    """How :func:`profile` counts and runs a model: the input shapes, batch and input values it is counted at (as
    :func:`flopcount.count` takes them), onnxruntime's execution provider (``"cpu"`` or ``"cuda"``), its graph
    optimisation level (one of :data:`~.session.OPTIMIZE_LEVELS`), the untimed warm-up runs, the timed runs and
    the intra-op threads (None: onnxruntime's own)."""

    input_shapes: Mapping[str, tuple[int, ...]] | None = None
    batch: int | None = None
    input_values: Mapping[str, list[int]] | None = None
    provider: str = "cpu"
    optimize: str = "none"
    warmup: int = 2
    runs: int = 5
    threads: int | None = None


def profile(source, settings: ProfileSettings = ProfileSettings(), ceilings=None) -> Profile:
    """Count ``source`` (a path or ModelProto), run it with onnxruntime's profiler as ``settings`` say and return a
    :class:`Profile`.

    ``ceilings`` (a :class:`~flopcount.measure.machine.ceilings.Ceilings`) decide compute/memory bound; None measures
    this CPU's (cached) GEMM and copy ceilings, the GEMM of onnxruntime itself on the profile's threads (its kernels
    and torch's differ in speed on the same core).
    """
    from flopcount import count
    from flopcount.pipeline.loading import load_with_weights

    provider, optimize, warmup, runs = settings.provider, settings.optimize, settings.warmup, settings.runs
    if optimize not in OPTIMIZE_LEVELS:
        raise UsageError(f"--optimize {optimize!r}: expected one of {', '.join(OPTIMIZE_LEVELS)}")
    if warmup < 0 or runs < 1:
        raise UsageError(f"--warmup must be >= 0 and --runs >= 1 (got {warmup} and {runs})")
    ort = import_ort(provider)
    loaded = load_with_weights(source)  # read once: counted without its weights, run with them
    report = count(loaded, input_shapes=dict(settings.input_shapes or {}), batch=settings.batch,
                   input_values=dict(settings.input_values or {}))
    where = report.model.path or "<model>"
    model, names, weights = runnable_model(loaded, report)
    counted = {n.index: n for n in report.nodes}  # graph position -> its count (names repeat; positions do not)
    feeds = make_inputs(report)
    if ceilings is None:  # this CPU's, with onnxruntime's own GEMM as the compute ceiling for a CPU profile
        from flopcount.measure.machine.ceilings import cached_ort_gemm, default_ceilings

        ceilings = default_ceilings(cached_ort_gemm(settings.threads) if provider == "cpu" else None)
    try:
        model_bytes = model.SerializeToString()
    except ValueError:  # protobuf's 2 GB limit
        raise MeasurementError(f"{where}: with its weights the model is over 2 GB, more than onnxruntime takes from "
                               "memory; profile a smaller --batch or a smaller variant") from None
    notes: list[str] = []
    if weights["synthesized"]:
        notes.append(f"{weights['synthesized']} initializers without data were synthesised (random values of their "
                     "dims and dtypes); times do not depend on the values")
    run = _Run(SessionSpec(ort, model_bytes, provider, optimize, settings.threads, where), feeds)
    run_time, events, groups, executed_ops = _profiled(run, model, names, counted, warmup, runs, notes)
    per_run, profiled_runs, providers = parse_profile(events, warmup)
    if not per_run:
        raise MeasurementError(f"{where}: onnxruntime's profile holds no timed run; rerun with --runs 3 or more")
    rows = [_row(name, op, [counted[i] for i in groups.get(name, [])], per_run, providers, ceilings)
            for name, op in executed_ops.items()]
    executed = set(executed_ops)
    unattributed = statistics.median(sum(v for k, v in r.items() if k not in executed) for r in per_run)
    if unattributed > 0:
        notes.append(f"{unattributed * 1e3:.3f} ms per run in kernels that name no executed node")
    stale = stale_ceiling(rows, ceilings)
    if stale:
        notes.append(stale)
    counted_flops = sum(r.flops for r in rows)
    if counted_flops != report.forward.flops:
        notes.append(f"{report.forward.flops - counted_flops:,} FLOPs belong to nodes folded away by optimisation")
    profiled = statistics.median(sum(r.values()) for r in per_run)
    return Profile(report.model.path, provider, optimize, report.batch, warmup, runs, run_time, profiled,
                   report.forward.flops, tuple(rows), by_op_type(rows, ceilings), ceilings, weights, unattributed,
                   tuple(notes), report)


def stale_ceiling(rows: list[NodeProfile], ceilings) -> str | None:
    """One line when the nodes of an operator type together (their FLOPs over their summed times, as
    ``by_op_type`` rates them) ran faster than the compute ceiling of their dtype: the ceiling is stale
    (:func:`flopcount.measure.machine.calibration.above_ceiling`; the type furthest above it); None otherwise. Single
    nodes are not compared: a kernel of a millisecond can run between other jobs' time slices that a ceiling's long
    products do not escape."""
    from flopcount.measure.machine.calibration import above_ceiling

    groups: dict[str, list[NodeProfile]] = {}
    for r in rows:
        if r.time_s and r.flops:
            groups.setdefault(r.op_type, []).append(r)
    worst, ratio = None, 1.0
    for op, rs in groups.items():
        peak = None if ceilings is None else ceilings.compute(rs[0].dtype) or ceilings.compute("fp32")
        rate = sum(r.flops for r in rs) / sum(r.time_s for r in rs)
        if peak is not None and peak.value > 0 and rate / peak.value > ratio:
            worst, ratio = (op, rs[0].dtype, rate, peak.value), rate / peak.value
    if worst is None:
        return None
    op, dtype, rate, peak = worst
    return above_ceiling(rate, peak, f"the {op} nodes ({dtype}) ran", "flopcount ceilings -o FILE, then --ceilings "
                         "FILE")


@dataclass(frozen=True)
class _Run:
    """What a profiled run of the model needs: the sessions' onnxruntime, model, provider, optimisation level,
    threads and name for messages, and the inputs fed."""

    session: SessionSpec
    feeds: Mapping[str, Any]


def _profiled(run: _Run, model, names: list[str], counted: Mapping, warmup: int, runs: int, notes: list[str]):
    """``(median run seconds, the profile's events, executed node -> graph positions, executed node -> op key)``:
    profiled and plain runs alternate, so that both see the same machine (other load, clocks); the plain runs are
    the timed ones."""
    with tempfile.TemporaryDirectory(prefix="flopcount-profile-") as tmp:
        spec, where = run.session, run.session.where
        optimized_path = os.path.join(tmp, "optimized.onnx") if spec.optimize != "none" else None
        session = open_session(spec, os.path.join(tmp, "ort"), optimized_path)
        plain = open_session(spec)
        times = []
        for k in range(warmup + runs):
            run_session(session, run.feeds, where)
            t0 = time.perf_counter()
            run_session(plain, run.feeds, where)
            if k >= warmup:
                times.append(time.perf_counter() - t0)
        trace = session.end_profiling()
        try:
            with open(trace, encoding="utf-8") as f:
                events = json.load(f)
        except (OSError, ValueError) as e:
            raise MeasurementError(f"onnxruntime's profile {trace} cannot be read ({e})") from None
        if optimized_path:
            import onnx

            optimized = onnx.load(optimized_path, load_external_data=False)
            groups = attribute(model.graph.node, names, optimized.graph)
            executed_ops = {n.name: op_key(n.domain, n.op_type) for n in optimized.graph.node}
            notes.append(f"graph optimisations '{spec.optimize}': {len(optimized.graph.node)} executed nodes for "
                         f"{len(counted)} graph nodes; each row lists the graph nodes it runs")
        else:
            groups = {name: [i] for i, name in enumerate(names)}
            executed_ops = {name: counted[i].op_type for i, name in enumerate(names)}
    return statistics.median(times), events, groups, executed_ops


def _row(name: str, op: str, members: list, per_run: list[Mapping[str, float]], providers: Mapping[str, str],
         ceilings) -> NodeProfile:
    """The profile's row of executed node ``name``: the graph nodes it runs, their FLOPs and bytes, its median time
    and what bounds it."""
    samples = [r[name] for r in per_run if name in r]
    time_s = statistics.median(samples) if samples else None
    flops = sum(n.cost.flops for n in members)
    nbytes = group_bytes(members) if members else None
    dtype = ceiling_dtype(members)
    return NodeProfile(name, op, tuple(n.name for n in members), flops, nbytes, time_s,
                       bound_of(flops, nbytes, dtype, ceilings), dtype, providers.get(name, ""))
