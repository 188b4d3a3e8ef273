"""Step time, tokens per second, MFU and HFU predicted per rank from a counted report and a machine profile
(:mod:`flopcount.measure.machine.calibration`): arithmetic on plain numbers, no loop, device or framework.

The rules (docs/predict.md states them for users):

* **A node's time** (one microbatch, on one rank): ``max(FLOPs / rate, bytes / bandwidth) + overhead``. The kind of
  its operator picks the rate: products (``matmul``, ``gemm``, ``einsum``, ``attention``) the GEMM rate at the
  product's effective size n = ∛(m·k·n) (its FLOPs / 2 per matrix of the batch), convolutions the convolution rate
  (else the GEMM rate), and every node the elementwise bandwidth (reductions, softmax, normalisations, losses and
  pooling the reduction bandwidth) at its bytes (inputs read and outputs written,
  :func:`flopcount.reporting.report.node_bytes`). The backward of a node runs its backward FLOPs at the same rate
  and moves twice its forward bytes (the gradient of each output read with the saved inputs, a gradient of each
  input written); its recompute is its forward again. Attention products (two activations over a batch of
  matrices, or a fused attention operator) run at the profile's fused attention rates where calibrated. A
  training Dropout's forward runs its FLOPs (one per element) at the profile's dropout rate (elements per second
  of torch's dropout) where calibrated, or its bytes if slower; its backward (a multiply by the mask) by its bytes.
  A softmax or log-softmax runs its FLOPs (forward, backward) at the profile's ``softmax`` (``softmax_backward``)
  rate where calibrated (torch's softmax over rows of 512, as FLOP/s of the count's FLOPs of that Softmax), or its
  bytes if slower; a softmax cross-entropy loss at the profile's ``cross_entropy`` (``cross_entropy_backward``)
  rate (torch's cross-entropy over rows of 512 and its backward, as FLOP/s of the count's FLOPs of that loss),
  at the softmax's where the profile has no such timing.
  An elementwise node or reduction whose bytes (forward, or the backward's twice those) are at least
  :func:`~.machine.calibration.fresh_from` of the profile runs as a step runs it (inputs out of cache, a new
  output): its bytes run at the profile's ``elementwise_fresh`` rate where that is slower. A node without FLOPs
  that copies (not a view: a concatenation, a cast) moves twice its outputs' bytes; a slice's backward writes its input's gradient whole; a
  tensor read by k > 1 nodes that need its gradient has k - 1 gradient sums of three times its bytes in the
  backward (:func:`flopcount.measure.predict_report.extra_works`): the copies at the profile's ``copy`` rate (a
  strided copy; the elementwise rate where it has none), the sums at the elementwise rate (on a plan's rank at
  the rank's share of the node's outputs, :meth:`flopcount.parallel.layout.Layout.activation_divisor`).
  ``overhead`` (added, not a floor) is the profile's framework seconds per operator: the forward's once for a node
  with work, the backward's per backward kernel (:func:`backward_kernels`, a slice's backward and each gradient
  sum), the forward's again when recomputed.
* **A rank's share** of a node under a plan is the ledger's (:func:`flopcount.parallel.ranks.node_shares`): its
  FLOPs, its bytes scaled by the same fraction, its effective size from its own FLOPs.
* **Collectives**: each of the ledger's collectives per step is sent as messages of a known size:
  tensor-parallel ones of the activation A = b·s·h·e (the loss's three small all_reduces apart), pipeline sends of
  A (A/T under sp), and a data-parallel all_reduce in DDP's buckets (the first 1 MiB, the others 25 MiB). A
  message of B bytes over a group of n ranks takes latency + bus_factor(n)·B / bus bandwidth
  (:func:`~.machine.calibration.collective_seconds`), from the profile's collectives timed in a step (each call
  after a burst of compute, ``collectives_in_step``) where it has them, else from those timed in a tight loop (a
  note says what that leaves out); over a group of the message's size where the profile timed its collective
  in a step over groups of that size (``collectives_in_step_groups``: groups smaller than the calibration's ranks,
  side by side, :func:`~.machine.calibration.group_timing`), whatever the group's rank stride, else over all
  the calibration's ranks (a group size it was not timed at widens the interval to unknown, and says so). A
  collective timed in a step with the mean of its calls recorded
  (:func:`~.machine.calibration.tail_fits`) is priced at that mean at both ends of the interval, whatever the
  repeat: a call's cost is heavy-tailed, and a step's total of many calls sees the mean, not the median or the
  best. On a datasheet profile of a system of nodes (``network``), a group whose ranks span nodes (its rank stride
  from :meth:`~flopcount.parallel.plan.ParallelPlan.group_stride`) runs at most at m × a network adapter's
  bandwidth, m the fewest of its ranks on one node. Tensor-parallel collectives are exposed (they sit between
  the ops that need them), half in the forward and half in the backward in training; the pipeline's sends
  lengthen the action that sends. The data-parallel all_reduce overlaps the last microbatch's backward as DDP
  runs it: each bucket is ready once the backward has produced the gradient bytes up to its end (at an even
  pace), the buckets reduce one after another, and what runs past the backward's end is exposed. Other
  data-parallel collectives (fsdp, zero1, zero2) are counted exposed (an upper bound; fsdp's as FSDP2's calls, a
  layer's gather each way and the root's once, a reduce-scatter a layer and the root's, every microbatch, each of
  the average size, each with FSDP2's own work around it besides the collective, :func:`framework_seconds` of its
  payload: the gathered output copied out into each parameter's new memory, the gradients copied into the
  reduce-scatter's input), and so are the gradient
  sums of weights held in copies (the K/V projections' copies when tp exceeds the K/V heads, a tied embedding's two
  copies under pp), once a step.
* **The step**: the pipeline schedule's simulation (:func:`flopcount.parallel.schedules.simulate_schedule`) with each
  chunk's forward and backward lasting the longest of its TP ranks' (compute and exposed TP time and the send),
  then the exposed data-parallel time, then the optimizer step (:func:`optimizer_seconds`: the profile's timing of
  the optimizer per parameter tensor and per element at the tensor's size; without it, its parameter bytes read
  and written at the elementwise bandwidth: 7 bytes-per-byte for adam/adamw, 5 momentum, 3 sgd). Without a
  pipeline the schedule is M microbatches one after another. A rank's ``bubble_seconds`` = the schedule's makespan
  − its busy time.
* **The point and the interval**: the step is predicted with every rate at its best calibrated repeat (a busy
  machine can only slow a repeat down, so the best is the closest to what the hardware sustains, as
  :func:`flopcount.measure.machine.ceilings.measure_gemm` takes it), and again at the median repeats: the interval
  is [best, median], its high end widened by the tail of the collectives timed in a step
  (:func:`tail_seconds`). An end that cannot be known is None, with ``interval_note`` saying why, never a guessed
  margin: both ends when a size lies outside the calibrated sizes or a group has a size the calibration did not
  time its collective at (``extrapolated`` says what); the high end for a datasheet profile (best-case rates, how
  far below them the device runs is not known) and for a profile whose collective latency is not known.
* **Ranks sharing a CPU's cores**: on a calibrated CPU profile every rank of the plan runs as a process of
  ``threads_per_rank`` threads on the profile's machine (``machine.cores`` cores; the plan's ranks the ``world`` of
  the work's plan, the listed ranks standing for the others where a plan search lists data-parallel rank 0's).
  Where the ranks' threads outnumber the cores, the cores run every rank's busy seconds (compute, optimizer step and
  collectives, exposed and overlapped) in turn: the step lasts at least their sum × u / cores, u = min(threads,
  cores) the cores a rank's rates were timed on
  (:func:`shared_cores_seconds`), and a note says so. A GPU's ranks each have their device: no such floor.
* ``mfu`` = model FLOPs of the step (all ranks) / (step seconds × ranks × the profile's peak), ``hfu`` the same
  with the hardware FLOPs (recompute and redundant work included).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .machine.calibration import (CALIBRATION_METHOD, METHOD_CHANGES, MachineProfile, collective_seconds, fresh_from,
                                  group_timing, latency_known, rate_at, tail_fits)

__all__ = ["BUCKET_BYTES", "BUSY_LOAD", "FIRST_BUCKET_BYTES", "GEMM_FAMILIES", "Message", "NodeWork",
           "OPTIMIZER_TRAFFIC", "Prediction", "REDUCTION_FAMILIES", "RankWork", "Timeline", "Work", "busy_seconds",
           "exposed_after", "node_seconds", "predict", "predict_point", "predict_work", "shared_cores_seconds",
           "tail_seconds", "work_of"]

#: DDP's default gradient buckets: the first (the last layers' gradients) of 1 MiB, the others of 25 MiB
#: (``bucket_cap_mb=25``).
FIRST_BUCKET_BYTES = 2**20
BUCKET_BYTES = 25 * 2**20
#: A profile taken at a 1-minute load average per core above this was taken on a busy machine (a note says so).
BUSY_LOAD = 1.0
GEMM_FAMILIES = ("matmul", "gemm", "einsum", "attention")
REDUCTION_FAMILIES = ("reduction", "softmax", "normalization", "loss", "pooling")
OPTIMIZER_TRAFFIC = {"adam": 7, "adamw": 7, "momentum": 5, "sgd": 3}
_WHICH = ("best", "median")
_PARTS = ("compute_seconds", "collective_seconds", "send_seconds")


@dataclass(frozen=True)
class NodeWork:
    """One node's work on one rank per microbatch: ``kind`` gemm, attention (a product of two activations: Q·Kᵀ,
    probs·V), conv, dropout (a training Dropout), softmax (a softmax or log-softmax), cross_entropy (a softmax
    cross-entropy loss), elementwise or reduction; ``matrices`` the product's batch of
    matrices (1 for a plain product); ``backward_kernels`` the kernels its backward runs
    (:func:`backward_kernels`); ``whole_bytes`` the part of ``bytes`` a split of the sequence over context-parallel
    ranks leaves whole on each (its parameters, and the K and V an attention reads: they are gathered);
    ``moved_bytes`` the bytes a backward without FLOPs moves (a slice's gradient written whole: zeros, then the
    slice's part); ``sums`` the gradient additions of its outputs in the backward (one fewer than the nodes that
    read an output needing a gradient), each of ``sum_bytes`` (two reads and a write of the output)."""

    kind: str
    flops: float
    bytes: float
    backward_flops: float = 0.0
    recompute_flops: float = 0.0
    matrices: float = 1.0
    backward_kernels: float = 1.0
    whole_bytes: float = 0.0
    moved_bytes: float = 0.0
    sums: float = 0.0
    sum_bytes: float = 0.0


def backward_kernels(forward_macs: float, backward_macs: float, backward_flops: float) -> float:
    """The kernels a node's backward runs, from the counting's backward rule: a product's backward multiplies
    once per operand that needs a gradient, each product the forward's MACs (``MatMul``: dA = dY·Bᵀ, dB = Aᵀ·dY),
    so its products are its backward MACs / its forward MACs; any other node with backward work runs one; none
    without.

    >>> backward_kernels(100, 200, 400), backward_kernels(0, 0, 5), backward_kernels(0, 0, 0)
    (2, 1, 0)
    """
    if not backward_flops:
        return 0
    return max(1, round(backward_macs / forward_macs)) if forward_macs and backward_macs else 1


@dataclass(frozen=True)
class Message:
    """A collective a rank runs: ``count`` messages of ``bytes`` over a group of ``ranks``; ``phase`` forward,
    backward (exposed in that action), ``dp`` (the DDP all_reduce), ``send`` (a pipeline send) or ``step`` (exposed
    once a step)."""

    kind: str
    group: str
    bytes: float
    count: float
    ranks: int
    phase: str
    stride: int = 1  # the rank ids' distance between the group's neighbouring members (ParallelPlan.group_stride)
    framework_bytes: float = 0.0  # payload bytes a call's framework copies besides the collective (FSDP2's)


@dataclass(frozen=True)
class RankWork:
    """What one rank runs per microbatch (``chunks``: its nodes per model chunk) and per step."""

    rank: int
    stage: int
    tp: int
    chunks: Mapping[int, tuple[NodeWork, ...]]
    messages: tuple[Message, ...]
    model_flops: float  # per step
    hardware_flops: float
    optimizer_bytes: float = 0.0  # bytes the optimizer step reads and writes
    optimizer: str | None = None  # its name (``--optimizer``), None without one
    optimizer_tensors: tuple[tuple[float, float], ...] = ()  # (parameter tensors, their elements) per module held


@dataclass(frozen=True)
class Timeline:
    """The pipeline schedule of the point's step (:func:`flopcount.parallel.schedules.simulated_schedule` with the
    predicted durations) in seconds: its ``makespan`` and ``actions`` (:class:`flopcount.parallel.schedules.Action`:
    pipeline rank, ``F`` or ``B``, virtual stage, microbatch, start, end); ``parts[c]``: the forward's and the
    backward's (compute, exposed collectives, send) seconds of virtual stage c, those of the rank whose action
    lasts longest (the action's length is their sum)."""

    makespan: float
    actions: tuple[Any, ...]
    parts: tuple[tuple[tuple[float, float, float], tuple[float, float, float]], ...]

    def as_dict(self) -> dict[str, Any]:
        return {"makespan": self.makespan, "actions": [a._asdict() for a in self.actions],
                "parts": [{"forward": dict(zip(_PARTS, f)), "backward": dict(zip(_PARTS, b))} for f, b in self.parts]}


@dataclass(frozen=True)
class Prediction:
    """A step's prediction (see the module); ``ranks[]``: each rank's figures; ``timeline``: the pipeline's
    schedule in seconds (None without a pipeline)."""

    step_seconds: float
    interval: tuple[float | None, float | None]
    tokens_per_second: float | None
    mfu: float
    hfu: float
    critical_rank: int
    ranks: tuple[Mapping[str, Any], ...]
    profile: Mapping[str, Any]
    extrapolated: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    tokens_note: str | None = None
    interval_note: str | None = None
    timeline: Timeline | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"step_seconds": self.step_seconds, "interval": list(self.interval),
                **({"interval_note": self.interval_note} if self.interval_note else {}),
                "tokens_per_second": self.tokens_per_second,
                **({"tokens_per_second_note": self.tokens_note} if self.tokens_note else {}),
                "mfu": self.mfu, "hfu": self.hfu, "critical_rank": self.critical_rank,
                "extrapolated": list(self.extrapolated), "notes": list(self.notes), "profile": dict(self.profile),
                "ranks": [dict(r) for r in self.ranks],
                "schedule": None if self.timeline is None else self.timeline.as_dict()}

    def lines(self) -> list[str]:
        """The text report's block: the step, then the critical rank's parts, then the notes."""
        tps = (f"{self.tokens_per_second:,.0f} tokens/s" if self.tokens_per_second is not None
               else f"tokens/s not known ({self.tokens_note})")
        prof = self.profile
        made = f"calibrated {prof['date']}" if prof["calibrated"] else "from datasheets"
        ranks = f"{prof['ranks']} rank{'s' if prof['ranks'] != 1 else ''}"
        low, high = ("not known" if v is None else f"{v:.4g}" for v in self.interval)
        out = [f"Prediction ({prof['device']} profile, {made}, {ranks}): step {self.step_seconds:.4g} s "
               f"[{low}, {high}], {tps}, MFU {self.mfu:.3f}, HFU {self.hfu:.3f}; "
               f"critical rank {self.critical_rank}"]
        r = next(row for row in self.ranks if row["rank"] == self.critical_rank)
        comm = "; ".join(f"{k} {v['exposed']:.3g} s exposed, {v['overlapped']:.3g} s overlapped"
                         for k, v in r["communication_seconds"].items()) or "none"
        ov = r["overhead_seconds"]
        ov = "not known (datasheet profile)" if ov is None else f"{ov:.3g} s"
        out.append(f"Rank {r['rank']}: compute {r['compute_seconds']:.4g} s, bubble {r['bubble_seconds']:.4g} s, "
                   f"optimizer {r['optimizer_seconds']:.3g} s, framework overhead {ov} "
                   f"(within compute and optimizer); communication: {comm}")
        notes = ([f"interval: {self.interval_note}"] if self.interval_note else []) + list(self.notes)
        return out + [f"Prediction note: {n}" for n in notes]


def node_seconds(w: NodeWork, profile: MachineProfile, which: str = "median") -> tuple[float, float, list[str]]:
    """(forward, backward with recompute) seconds of one node's work, and what was extrapolated."""
    out: list[str] = []

    def rate(kind: str, size: float) -> float:  # a kind the profile lacks is timed as the one it falls back to
        r, outside = rate_at(profile.compute[kind], size, which)
        if outside:
            out.append(f"{kind} at size {size:.4g} (calibrated {profile.compute[kind][0].size:.4g}"
                       f"-{profile.compute[kind][-1].size:.4g})")
        return r

    def moved(nbytes: float, mem: str = "elementwise", new: bool = True) -> float:
        if nbytes <= 0:
            return 0.0
        t = nbytes / rate(mem, nbytes)
        if new and mem != "copy" and fresh is not None and nbytes >= fresh:
            t = max(t, nbytes / rate("elementwise_fresh", nbytes))  # its output is new memory
        return t

    def one(flops: float, nbytes: float, backward: bool = False) -> float:
        if flops <= 0 and nbytes <= 0:
            return 0.0
        t = 0.0
        if flops > 0 and w.kind == "dropout" and not backward and "dropout" in profile.compute:
            t = flops / rate("dropout", flops)  # its FLOPs: one per element (the mask drawn, the scale)
        if flops > 0 and w.kind == "cross_entropy" and "cross_entropy" in profile.compute:
            kind = "cross_entropy_backward" if backward else "cross_entropy"
            t = flops / rate(kind, flops)
        elif flops > 0 and w.kind in ("softmax", "cross_entropy") and "softmax" in profile.compute:
            kind = "softmax_backward" if backward and "softmax_backward" in profile.compute else "softmax"
            t = flops / rate(kind, flops)
        if flops > 0 and w.kind in ("gemm", "conv", "attention"):
            kind = _product_kind(w.kind, backward, profile)
            products = max(1.0, w.backward_kernels) if backward else 1.0  # each of the forward's MACs
            size = nbytes if kind == "conv" else (flops / 2 / products / w.matrices) ** (1 / 3)
            t = flops / rate(kind, size)
        mem = "reduction" if w.kind == "reduction" and "reduction" in profile.compute else "elementwise"
        if flops <= 0 and w.kind == "elementwise":
            mem = copy  # a node without FLOPs that copies
        return max(t, moved(nbytes, mem, w.kind in ("elementwise", "reduction", "softmax", "cross_entropy")))

    fresh = fresh_from(profile)
    copy = "copy" if "copy" in profile.compute else "elementwise"

    fwd = one(w.flops, w.bytes)
    ov_f, ov_b = node_overhead(w, profile, which)
    bwd_s = one(w.backward_flops, 2 * w.bytes, True) if w.backward_flops else 0.0
    bwd_s += moved(w.moved_bytes, copy) + w.sums * moved(w.sum_bytes)  # data movement without FLOPs, gradient sums
    if w.recompute_flops and w.flops:
        bwd_s += fwd * w.recompute_flops / w.flops
    return fwd + ov_f, bwd_s + ov_b, out


def _product_kind(kind: str, backward: bool, profile: MachineProfile) -> str:
    """The profile's rate a product is timed at: attention products at the fused attention's (its backward's in
    the backward) where calibrated, convolutions at the convolution's, else the GEMM rate."""
    if kind == "attention":
        kind = "attention_backward" if backward else "attention"
    return kind if kind in profile.compute else "gemm"


def node_overhead(w: NodeWork, profile: MachineProfile, which: str = "median") -> tuple[float, float]:
    """(forward, backward with recompute) framework seconds of a node: the profile's forward overhead once for a
    node with work, its backward overhead per backward kernel (a backward without FLOPs that moves bytes has its
    kernels too) and per gradient sum, and the forward's again when it is recomputed."""
    ov = profile.overhead
    fwd = getattr(ov["forward"], which) if w.flops or w.bytes else 0.0
    bwd = getattr(ov["backward"], which) * (w.backward_kernels if w.backward_flops or w.moved_bytes else 0.0)
    bwd += getattr(ov["backward"], which) * w.sums
    return fwd, bwd + (fwd if w.recompute_flops and w.flops else 0.0)


def optimizer_seconds(r: RankWork, profile: MachineProfile, which: str = "median") -> tuple[float, float]:
    """(seconds, of which per-tensor overhead) of the rank's optimizer step: with the profile's timing of its
    optimizer, each parameter tensor's per-tensor cost plus its elements at the per-element cost of a tensor of its
    size (interpolated in log(size) between the timed sizes; the nearest outside them); without, its bytes read and
    written at the elementwise bandwidth (no per-tensor cost)."""
    cost = (profile.optimizers or {}).get(r.optimizer) if r.optimizer else None
    if cost is not None and r.optimizer_tensors:
        tensors = sum(n for n, _ in r.optimizer_tensors)
        per_tensor = getattr(cost.per_tensor_s, which) * tensors
        return per_tensor + sum(e * rate_at(cost.per_element_s, e / n, which)[0]
                                for n, e in r.optimizer_tensors if n and e), per_tensor
    if not r.optimizer_bytes:
        return 0.0, 0.0
    return r.optimizer_bytes / rate_at(profile.compute["elementwise"], r.optimizer_bytes, which)[0], 0.0


def exposed_after(backward_s: float, buckets: Sequence[tuple[float, float]]) -> float:
    """Seconds the buckets' all_reduces run past the end of a backward of ``backward_s``: ``buckets`` are (bytes,
    seconds) in the order the backward fills them, each ready once the backward has produced the gradient bytes up
    to its end (at an even pace), each starting once it is ready and the one before is done.

    >>> round(exposed_after(1.0, [(1, 0.1), (1, 0.1)]), 6)  # ready at 0.5 and 1.0: done at 0.6 and 1.1
    0.1
    """
    total, filled, done = sum(b for b, _ in buckets), 0.0, 0.0
    for b, t in buckets:
        filled += b
        done = max(done, backward_s * filled / total if total else backward_s) + t
    return max(0.0, done - backward_s)


def _timed(m: Message, profile: MachineProfile, out: list[str]) -> tuple[str, Any, bool]:
    """The kind a message is priced as, its timing, and whether that was timed in a step: over groups of the
    message's size as a step runs them where measured (``collectives_in_step_groups``), else over all the
    calibration's ranks as a step runs them, else in a tight loop."""
    if not profile.collectives:
        from flopcount.errors import UsageError

        raise UsageError(f"--predict: the plan runs {m.kind} over {m.group}, and the machine profile has no "
                         "collectives (calibrated with --ranks 1); calibrate with flopcount calibrate --ranks N")
    grouped = group_timing(profile, m.kind, m.ranks)
    if grouped is not None:
        return m.kind, grouped, True
    timed = profile.collectives_in_step or profile.collectives  # as a step runs them, where measured
    kind = m.kind if m.kind in timed else None
    if kind is None:
        out.append(f"{m.kind} not calibrated (counted as all_reduce)")
        kind = "all_reduce"
    return kind, timed[kind], timed is profile.collectives_in_step


def tail_seconds(r: RankWork, profile: MachineProfile) -> float:
    """How far the rank's collectives of a step may run past their mean: √(Σ count · (p90 − mean)²) over its
    messages timed in a step with their tail recorded (each call's p90 and mean at its size, p90 below the mean
    counted 0): the 90th percentile of a sum of independent calls above its mean, were each call normally
    distributed (σ = (p90 − mean) / 1.2816); a heavy tail's σ is smaller than that, so it is the wider bound."""
    total = 0.0
    for m in r.messages:
        if m.ranks <= 1 or not (profile.collectives_in_step or profile.collectives_in_step_groups):
            continue
        kind, c, in_step = _timed(m, profile, [])
        if in_step and tail_fits(c):
            p90, mean = (collective_seconds(c, kind, m.bytes, m.ranks, w)[0] for w in ("p90", "mean"))
            total += m.count * max(0.0, p90 - mean) ** 2
    return math.sqrt(total)


def _message_seconds(m: Message, profile: MachineProfile, which: str, out: list[str]) -> float:
    kind, c, in_step = _timed(m, profile, out)
    called = "mean" if in_step and tail_fits(c) else which  # what a step's total of many calls sees (the module)
    cap = profile.network.bus_cap(m.ranks, m.stride) if profile.network is not None else None
    t, outside = collective_seconds(c, kind, m.bytes, m.ranks, called, cap)
    if outside:
        out.append(f"{m.kind} of {m.bytes:.4g} bytes (calibrated {c.segments[0].low:.4g}-{c.segments[-1].high:.4g})")
    if c.ranks and c.ranks != m.ranks and m.ranks > 1:
        out.append(f"{m.kind} over {m.ranks} ranks (calibrated over {c.ranks})")
    return (t + framework_seconds(m.framework_bytes, profile, which, out)) * m.count


def framework_seconds(payload: float, profile: MachineProfile, which: str = "median",
                      out: list[str] | None = None) -> float:
    """Seconds FSDP2 spends around one of its collectives of ``payload`` bytes besides the collective (the module's
    rules): at the profile's ``fsdp_copy`` rate (bytes of the payload per second, its ``unshard()`` timed beside a
    plain gather) where calibrated, else the payload read and written once at the ``copy`` rate (the elementwise
    rate where the profile has none)."""
    if payload <= 0:
        return 0.0
    kind, moved = ("fsdp_copy", payload) if "fsdp_copy" in profile.compute else \
        ("copy" if "copy" in profile.compute else "elementwise", 2 * payload)
    rate, outside = rate_at(profile.compute[kind], moved, which)
    if outside and out is not None:
        pts = profile.compute[kind]
        out.append(f"{kind} at size {moved:.4g} (calibrated {pts[0].size:.4g}-{pts[-1].size:.4g})")
    return moved / rate


#: Chunks already timed, by the identity of their node tuple (held, so that the identity is not reused), the
#: profile's and the repeat's: a plan search times the same chunks under many plans.
_chunks_timed: dict[tuple[int, int, str], tuple] = {}


def _chunk_seconds(nodes: Sequence[NodeWork], profile: MachineProfile, which: str,
                   memo: dict[NodeWork, tuple]) -> tuple[float, float, list[str], float]:
    """(forward, backward) seconds of a chunk's nodes in order, what was extrapolated, and the framework overhead
    within those seconds."""
    key = (id(nodes), id(profile), which)
    hit = _chunks_timed.get(key)
    if hit is not None and hit[0] is nodes and hit[1] is profile:
        return hit[2]
    fwd = bwd = ov = 0.0
    notes: list[str] = []
    for w in nodes:
        found = memo.get(w)
        if found is None:
            found = memo[w] = (*node_seconds(w, profile, which), sum(node_overhead(w, profile, which)))
        f, b, x, o = found
        fwd += f
        bwd += b
        ov += o
        notes.extend(x)
    if len(_chunks_timed) > 4096:
        _chunks_timed.clear()
    if isinstance(nodes, tuple):
        _chunks_timed[key] = (nodes, profile, (fwd, bwd, notes, ov))
    return fwd, bwd, notes, ov


def _rank_times(r: RankWork, profile: MachineProfile, which: str, out: list[str],
                memo: dict[NodeWork, tuple] | None = None) -> dict[str, Any]:
    """A rank's seconds; ``memo``: node seconds already found (the same work on another rank or layer)."""
    fwd: dict[int, float] = {}
    bwd: dict[int, float] = {}
    memo = {} if memo is None else memo
    overhead = 0.0
    for c, nodes in r.chunks.items():
        fwd[c], bwd[c], notes, ov = _chunk_seconds(nodes, profile, which, memo)
        overhead += ov
        out.extend(notes)
    comm: dict[str, dict[str, float]] = {}
    phase_s = {"forward": 0.0, "backward": 0.0, "send_forward": 0.0, "send_backward": 0.0, "step": 0.0}
    dp_buckets: list[float] = []
    for m in r.messages:
        t = _message_seconds(m, profile, which, out)
        slot = comm.setdefault(m.kind, {"exposed": 0.0, "overlapped": 0.0})
        if m.phase == "dp":
            dp_buckets.extend([(m.bytes, t / m.count)] * int(m.count))
            continue
        slot["exposed"] += t
        phase_s[m.phase] += t
    return {"forward": fwd, "backward": bwd, "comm": comm, "phase": phase_s, "dp_buckets": dp_buckets,
            "compute": sum(fwd.values()) + sum(bwd.values()), "overhead": overhead}


def _step(work: Sequence[RankWork], profile: MachineProfile, plan: Mapping[str, Any], which: str,
          out: list[str], drawn: bool = True) -> tuple[float, list[dict[str, Any]], Timeline | None]:
    from flopcount.parallel.schedules import simulated_schedule

    m, p, v = plan["microbatches"], plan["pp"], plan["virtual"]
    memo: dict[NodeWork, tuple] = {}
    times = [_rank_times(r, profile, which, out, memo) for r in work]
    train = any(any(t["backward"].values()) for t in times)
    tf, tb = [0.0] * (p * v), [0.0] * (p * v)
    parts = [[(0.0, 0.0, 0.0)] * 2 for _ in range(p * v)]  # the longest action's (compute, collectives, send)
    for r, t in zip(work, times):  # a chunk lasts its slowest TP rank's; the TP time and the send go with it
        per, ph = m * len(t["forward"]), t["phase"]
        for c in t["forward"]:
            f = t["forward"][c] + (ph["forward"] + ph["send_forward"]) / per
            b = t["backward"][c] + (ph["backward"] + ph["send_backward"]) / per
            if f > tf[c]:
                tf[c], parts[c][0] = f, (t["forward"][c], ph["forward"] / per, ph["send_forward"] / per)
            if b > tb[c]:
                tb[c], parts[c][1] = b, (t["backward"][c], ph["backward"] / per, ph["send_backward"] / per)
    timeline = None
    if p > 1:
        run = simulated_schedule(plan["schedule"], p, m, tf, tb if train else [0.0] * len(tb), v)
        makespan, busy = run.makespan, run.busy
        if drawn:  # the actions listed (not for a point alone)
            timeline = Timeline(makespan, run.actions, tuple((f, b if train else (0.0, 0.0, 0.0)) for f, b in parts))
    else:
        makespan, busy = m * (tf[0] + tb[0]), [m * (tf[0] + tb[0])]
    rows = []
    for r, t in zip(work, times):
        last_bwd = max((tb[c] for c in t["backward"]), default=0.0)
        dp_exposed = exposed_after(last_bwd, t["dp_buckets"]) if t["dp_buckets"] else 0.0
        if t["dp_buckets"]:
            ar = t["comm"]["all_reduce"]
            ar["exposed"] += dp_exposed
            hidden = sum(b[1] for b in t["dp_buckets"]) - dp_exposed
            ar["overlapped"] += hidden if hidden > 1e-12 else 0.0  # not a rounding error's remainder
        opt, opt_overhead = optimizer_seconds(r, profile, which)
        total = makespan + dp_exposed + t["phase"]["step"] + opt
        rows.append({"rank": r.rank, "step_seconds": total, "compute_seconds": m * t["compute"],
                     "communication_seconds": t["comm"], "bubble_seconds": makespan - busy[r.stage],
                     "optimizer_seconds": opt,
                     # a datasheet profile measures no overhead: not known, not zero
                     "overhead_seconds": m * t["overhead"] + opt_overhead if profile.calibrated else None})
    return max(max(row["step_seconds"] for row in rows), shared_cores_seconds(rows, profile, plan)), rows, timeline


def busy_seconds(row: Mapping[str, Any]) -> float:
    """A predicted rank's busy seconds a step (one of :class:`Prediction`'s ``ranks``): its compute, its optimizer
    step and its collectives, exposed and overlapped (its bubble and waits are not busy)."""
    comm = sum(v["exposed"] + v["overlapped"] for v in row["communication_seconds"].values())
    return row["compute_seconds"] + row["optimizer_seconds"] + comm


def shared_cores_seconds(rows: Sequence[Mapping[str, Any]], profile: MachineProfile, plan: Mapping[str, Any]) -> float:
    """The least a step lasts when the plan's ranks share the cores of a calibrated CPU profile's machine (the
    module's rules): Σ busy × min(threads per rank, cores) / cores over the plan's ``world`` ranks (the listed
    ``rows`` standing for them, each as often); 0 where their threads do not outnumber the cores, or the profile is
    not a CPU's."""
    cores, threads = profile.machine.get("cores"), profile.machine.get("threads_per_rank")
    if not (profile.calibrated and profile.device == "cpu" and cores and threads and rows):
        return 0.0
    used = min(threads, cores)  # a rank's rates were timed on these (more threads than cores run on the cores)
    world = plan.get("world", len(rows))
    return 0.0 if world * used <= cores else sum(busy_seconds(r) for r in rows) * (world / len(rows)) * used / cores


@dataclass(frozen=True)
class Work:
    """Everything the prediction needs of a count, as plain numbers: the ranks' work, the plan's shape
    (``microbatches``, ``pp``, ``virtual``, ``schedule``), the tokens of a step (None with ``tokens_note``)."""

    ranks: tuple[RankWork, ...]
    plan: Mapping[str, Any]
    tokens: float | None
    tokens_note: str | None = None
    notes: tuple[str, ...] = field(default=())


def predict_work(work: Work, profile: MachineProfile) -> Prediction:
    """The prediction of ``work`` on ``profile`` (see the module)."""
    results = {}
    for which in _WHICH:
        out: list[str] = []
        step, rows, timeline = _step(work.ranks, profile, work.plan, which, out)
        results[which] = (step, rows, out, timeline)
    step, rows, extrapolated, timeline = results["best"]
    unique = tuple(dict.fromkeys(extrapolated))
    tails = {r.rank: tail_seconds(r, profile) for r in work.ranks}
    widened = max(results["median"][0], *(row["step_seconds"] + tails[row["rank"]] for row in results["median"][1]))
    (low, high), why = _interval(work, profile, (step, widened), unique)
    critical = max(rows, key=lambda row: (row["step_seconds"], -row["rank"]))["rank"]
    notes = list(work.notes)
    if profile.load_per_core is not None and profile.load_per_core > BUSY_LOAD:
        notes.append(f"the profile was taken on a busy machine (load {profile.load_per_core:.2f} per core): its "
                     "rates are what the work got then, not what the machine sustains; calibrate again when it is "
                     "quiet")
    shared = shared_cores_seconds(rows, profile, work.plan)
    if shared and shared >= max(row["step_seconds"] for row in rows):
        notes.append(f"the plan's {work.plan.get('world', len(rows))} ranks of {profile.machine['threads_per_rank']} "
                     f"thread(s) share the machine's {profile.machine['cores']} cores: the step lasts their busy "
                     f"seconds over the cores, {shared:.4g} s, longer than the slowest rank's own")
    notes += _missing_calibrations(work, profile)
    if not profile.calibrated:
        notes.append(f"profile of the {profile.device} from its datasheets (calibrated: false): best-case rates, "
                     f"products at its dense {profile.dtype} peak, no framework overhead")
    return Prediction(step, (low, high), *_rates(work, profile, step), critical, tuple(rows),
                      {"device": profile.device, "calibrated": profile.calibrated, "ranks": profile.ranks,
                       "date": profile.date, "peak_flops_per_s": profile.peak_flops_per_s},
                      unique, tuple(notes), work.tokens_note, why, timeline)


def _missing_calibrations(work: Work, profile: MachineProfile) -> list[str]:
    """A note for each part of the step a calibrated profile taken before it was measured leaves out."""
    if not profile.calibrated:
        return []
    out = []
    method = profile.machine.get("method", 1)  # a profile that describes no machine says nothing of its method
    if profile.machine and isinstance(method, int) and method < CALIBRATION_METHOD:
        changes = "; ".join(METHOD_CHANGES[m] for m in range(max(method, 1) + 1, CALIBRATION_METHOD + 1))
        out.append(f"the profile was taken by an earlier flopcount calibrate (method {method}, this one "
                   f"{CALIBRATION_METHOD}): {changes}; calibrate again")
    names = sorted({r.optimizer for r in work.ranks if r.optimizer and r.optimizer_tensors})
    if names and not all(n in (profile.optimizers or {}) for n in names):
        out.append(f"the profile has no timing of the {', '.join(names)} step (taken before calibrate measured "
                   "optimizers): the step is its bytes at the elementwise bandwidth and its per-tensor cost is left "
                   "out; calibrate again to include it")
    collectives = any(m.ranks > 1 for r in work.ranks for m in r.messages)
    if profile.collectives_in_step is None and profile.collectives and collectives:
        out.append("the profile has no timing of collectives in a step (taken before calibrate measured it): each "
                   "collective at its tight-loop time, which leaves out what a call costs between compute (its "
                   "buffers out of cache, gloo's threads idle); calibrate again to include it")
    elif profile.collectives_in_step and collectives and not all(
            tail_fits(c) for c in profile.collectives_in_step.values()):
        out.append("the profile's collectives in a step have no mean or 90th percentile of their calls (taken "
                   "before calibrate recorded them): each collective at its best and median repeat, which leaves out "
                   "the heavy tail of a call's cost in a step, and the interval is not widened by it; calibrate "
                   "again to include it")
    if "dropout" not in profile.compute and any(w.kind == "dropout" and w.flops for r in work.ranks
                                                 for nodes in r.chunks.values() for w in nodes):
        out.append("the profile has no timing of dropout (taken before calibrate measured it): a Dropout's mask "
                   "drawn at the elementwise rate, far faster than torch's CPU dropout draws it; calibrate again to "
                   "include it")
    if profile.calibrated and "elementwise_fresh" not in profile.compute and any(
            w.kind in ("elementwise", "reduction") for r in work.ranks for nodes in r.chunks.values() for w in nodes):
        out.append("the profile has no timing of elementwise work into fresh memory (taken before calibrate "
                   "measured it): every elementwise operator and reduction at the rate into a reused buffer on "
                   "inputs in cache, where a step's read theirs from memory and write new outputs; calibrate again "
                   "to include it")
    if "softmax" not in profile.compute and any(w.kind in ("softmax", "cross_entropy") for r in work.ranks
                                                 for nodes in r.chunks.values() for w in nodes):
        out.append("the profile has no timing of a softmax (taken before calibrate measured it): softmaxes and "
                   "the loss's log-softmax at the elementwise rate of their bytes, faster than torch runs their "
                   "exponentials and passes over each row; calibrate again to include it")
    elif "cross_entropy" not in profile.compute and any(w.kind == "cross_entropy" for r in work.ranks
                                                         for nodes in r.chunks.values() for w in nodes):
        out.append("the profile has no timing of a cross-entropy loss (taken before calibrate measured it): the "
                   "loss at the softmax's rate, faster than torch runs its log-softmax and its backward (a "
                   "gradient of zeros, then the log-softmax's backward); calibrate again to include it")
    if "copy" not in profile.compute and any(w.moved_bytes or not w.flops and not w.backward_flops and w.bytes
                                              for r in work.ranks for nodes in r.chunks.values() for w in nodes):
        out.append("the profile has no timing of a copy (taken before calibrate measured it): data moved by nodes "
                   "without FLOPs (concatenations, casts, slices' backward) at the elementwise rate, faster than "
                   "torch's strided copies; calibrate again to include it")
    if "fsdp_copy" not in profile.compute and any(m.framework_bytes for r in work.ranks for m in r.messages):
        out.append("the profile has no timing of FSDP2's own work around its gathers (taken before calibrate "
                   "measured it, or with --ranks 1): each FSDP2 gather and reduce-scatter adds its payload read and "
                   "written once at the copy rate, which leaves out the rest of what FSDP2 does around a call; "
                   "calibrate again with --ranks N to include it")
    if "attention" not in profile.compute and any(w.kind == "attention" for r in work.ranks
                                                   for nodes in r.chunks.values() for w in nodes):
        out.append("the profile has no timing of fused attention (taken before calibrate measured it): attention "
                   "products at the GEMM rate; calibrate again to include it")
    return out


def _rates(work: Work, profile: MachineProfile, step: float) -> tuple[float | None, float, float]:
    """(tokens per second, MFU, HFU) of ``work`` in a step of ``step`` seconds."""
    n = len(work.ranks)
    model = sum(r.model_flops for r in work.ranks)
    hardware = sum(r.hardware_flops for r in work.ranks)
    return (work.tokens / step if work.tokens and step else None,
            model / (step * n * profile.peak_flops_per_s) if step else math.nan,
            hardware / (step * n * profile.peak_flops_per_s) if step else math.nan)


def predict_point(work: Work, profile: MachineProfile) -> tuple[float, float | None, float]:
    """(step seconds, tokens per second, MFU) of :func:`predict_work`'s point, at the best repeats, without its
    interval (the median repeats) or its rows: what a plan search ranks by."""
    step, _, _ = _step(work.ranks, profile, work.plan, "best", [], drawn=False)
    return step, *_rates(work, profile, step)[:2]


def _interval(work: Work, profile: MachineProfile, steps: tuple[float, float],
              extrapolated: tuple[str, ...]) -> tuple[tuple[float | None, float | None], str | None]:
    """[best, median] step seconds, an end that cannot be known None, and why (the module's rules)."""
    low, high = steps
    why = []
    if extrapolated:
        low = high = None
        why.append("not known: outside the calibration (the nearest calibrated rate used): "
                   + "; ".join(extrapolated[:3]) + (f" (and {len(extrapolated) - 3} more)" if len(extrapolated) > 3
                                                    else ""))
    if not profile.calibrated and high is not None:
        high = None
        why.append("no high end: a datasheet profile's rates are the best case, and how far below them the device "
                   "runs is not known")
    calls = max((sum(m.count for m in r.messages if m.ranks > 1) for r in work.ranks), default=0)
    if calls and not latency_known(profile):
        high = None
        why.append(f"collective latency not known: each of a rank's up to {calls:g} collectives a step is timed by "
                   "its bytes over the bus bandwidth alone, and lasts its latency longer")
    return (low, high), "; ".join(why) or None


def predict(report: Any, profile: MachineProfile) -> Prediction:
    """The prediction of a counted ``report`` (with its per-rank ledger, ``report.parallel``, or one rank) on
    ``profile``."""
    return predict_work(work_of(report), profile)


def work_of(report: Any) -> Work:
    """The plain numbers of ``report`` the prediction reads (:mod:`flopcount.measure.predict_report`)."""
    from .predict_report import report_work

    return report_work(report)
