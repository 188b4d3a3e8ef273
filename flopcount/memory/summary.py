"""A plan's summary from its ledgers (:func:`plan_summary`): the most bytes a rank holds against the device's memory,
with its verdict, the slowest rank's FLOPs, the ceiling on MFU the bubble, redundant and recomputed work leave, and
the ranks grouped by the bytes they hold (docs/parallel.md, "The plan's summary"); and the text report's memory table
by rank (:func:`rank_rows`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .ledger import Memory, RankMemory, held_bytes
from .ranks import PlanRankMemory

__all__ = ["PlanSummary", "RANK_HEADERS", "RankClass", "plan_summary", "rank_rows"]


@dataclass(frozen=True)
class RankClass:
    """Ranks of one pipeline ``stage`` that hold the same bytes (the TP and EP ranks ``tp`` and ``ep`` of the stage,
    with their data- and context-parallel replicas: ``ranks``). ``activations_bytes``: kept for the backward by all
    the microbatches in flight; ``held_bytes``: the peak, and with ``--generate`` the KV cache beside it;
    ``headroom_bytes``: the device's memory less ``held_bytes`` (negative: over it; None without a device memory);
    ``hardware_flops``: the most of its ranks run per step (None without the FLOPs ledger)."""

    stage: int
    tp: tuple[int, ...]
    ep: tuple[int, ...]
    ranks: tuple[int, ...]
    params_bytes: int
    buffers_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    held_bytes: int
    peak_phase: str
    headroom_bytes: int | None
    hardware_flops: int | None

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.update(tp=list(self.tp), ep=list(self.ep), ranks=list(self.ranks), count=len(self.ranks))
        return d


@dataclass(frozen=True)
class PlanSummary:
    """The answer a planner wants from a plan's ledgers (:func:`plan_summary`): the most bytes a rank holds
    (``held_bytes``, on ``stage``) against the device's memory, with the ``verdict`` (``fits``: True, False, or None
    where it cannot be known: no device memory, or a lower bound within it), the slowest rank's hardware FLOPs per
    step, the ceiling on MFU that the bubble, redundant and recomputed work leave (``mfu_ceiling``: ``model_flops``
    / (``world`` × ``step_flops``), docs/parallel.md), and the ranks grouped by the bytes they hold (``classes``)."""

    plan: str | None
    world: int
    mode: str | None  # the FLOPs ledger's: train, inference or generate (its FLOPs are the whole generation's)
    device_memory_bytes: int | None
    held_bytes: int | None
    stage: int | None
    fits: bool | None
    headroom_bytes: int | None
    verdict: str | None
    lower_bound: bool
    slowest_rank: int | None
    slowest_hardware_flops: int | None
    model_flops: int | None
    step_flops: float | None
    mfu_ceiling: float | None
    bubble_fraction: float | None
    redundant_share: float | None
    recompute_share: float | None
    classes: tuple[RankClass, ...]

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["classes"] = [c.as_dict() for c in self.classes]
        return d


def plan_summary(parallel: Any = None, memory: Memory | None = None,
                 device_memory: int | None = None) -> PlanSummary:
    """The summary of a plan's ledgers (see :class:`PlanSummary`): ``parallel`` its FLOPs ledger
    (:class:`flopcount.parallel.ranks.ParallelLedger`) and ``memory`` its memory ledger per rank
    (:func:`per_rank`, or the one-rank ledger without a plan), either None when not counted; ``device_memory``
    in bytes, the memory settings' when None."""
    if device_memory is None and memory is not None and memory.settings is not None:
        device_memory = memory.settings.device_memory
    flops = _flops_figures(parallel)
    classes = _classes(memory, parallel, device_memory) if memory is not None else ()
    world = len(parallel.ranks) if parallel is not None else sum(len(c.ranks) for c in classes)
    top = max(classes, key=lambda c: (c.held_bytes, -c.stage), default=None)
    held = top.held_bytes if top else None
    lower = bool(memory is not None and memory.lower_bound)
    fits = headroom = None
    if top is not None and device_memory is not None:
        headroom = device_memory - held
        fits = False if headroom < 0 else (None if lower else True)
    plan = str(parallel.plan) if parallel is not None else (
        str(memory.settings.plan) if memory is not None and memory.settings is not None and memory.ranks
        and isinstance(memory.ranks[0], PlanRankMemory) else None)
    return PlanSummary(plan, world, parallel.mode if parallel is not None else None, device_memory, held,
                       top.stage if top else None, fits, headroom,
                       _verdict(top, device_memory, lower) if top else None, lower, *flops, tuple(classes))


def _flops_figures(parallel: Any) -> tuple:
    """(slowest rank, its hardware FLOPs, model FLOPs, step FLOPs, MFU ceiling, bubble, redundant share, recompute
    share) of a FLOPs ledger; Nones without one. The step lasts, in FLOPs at equal throughput, the most any rank's
    hardware FLOPs stretch to with its pipeline rank's idle time in the simulated schedule: H · makespan / busy."""
    if parallel is None or not parallel.ranks:
        return (None,) * 8
    sched = parallel.schedule

    def stretched(r) -> float:
        if sched is None or not sched.busy[r.stage]:
            return float(r.hardware_flops)
        return r.hardware_flops * sched.makespan / sched.busy[r.stage]

    slowest = next(r for r in parallel.ranks if r.rank == parallel.slowest_rank)
    model = sum(r.model_flops for r in parallel.ranks)
    hardware = sum(r.hardware_flops for r in parallel.ranks)
    step = max(stretched(r) for r in parallel.ranks)
    ceiling = model / (len(parallel.ranks) * step) if step else None
    return (slowest.rank, slowest.hardware_flops, model, step, ceiling, parallel.bubble_fraction,
            sum(r.redundant_flops for r in parallel.ranks) / hardware if hardware else 0.0,
            sum(r.recompute_flops for r in parallel.ranks) / hardware if hardware else 0.0)


def _classes(memory: Memory, parallel: Any, device_memory: int | None) -> list[RankClass]:
    """The ledger's ranks grouped by stage and the bytes they hold, in the order of their first rank."""
    most = {r.rank: r.hardware_flops for r in parallel.ranks} if parallel is not None else {}
    groups: dict[tuple, list[RankMemory]] = {}
    for r in memory.ranks:
        figures = {k: v for k, v in r.__dict__.items() if k not in ("rank", "coords", "replicas")}
        groups.setdefault((getattr(r, "stage", 0), tuple(sorted(figures.items()))), []).append(r)
    out = []
    for (stage, _), rs in groups.items():
        r = rs[0]
        ranks = tuple(sorted(x for m in rs for x in (getattr(m, "replicas", ()) or (getattr(m, "rank", 0),))))
        held = held_bytes(r)
        flops = [most[x] for x in ranks if x in most]
        out.append(RankClass(
            stage, tuple(sorted({getattr(m, "coords", {}).get("tp", 0) for m in rs})),
            tuple(sorted({getattr(m, "coords", {}).get("ep", 0) for m in rs})), ranks, r.params_bytes, r.buffers_bytes,
            r.grads_bytes, r.optimizer_bytes, int(r.activations_bytes * getattr(r, "microbatches_in_flight", 1.0)),
            held, r.peak_phase, None if device_memory is None else device_memory - held, max(flops, default=None)))
    return sorted(out, key=lambda c: c.ranks[0])


def _verdict(top: RankClass, device_memory: int | None, lower: bool) -> str:
    """One line: the most a rank holds against the device's memory."""
    from .sizes import size_text

    where = f"stage {top.stage}"
    if device_memory is None:
        return f"{where}: {size_text(top.held_bytes)} at most; no device memory given (--device-memory)"
    if top.held_bytes > device_memory:
        return (f"{where}: {size_text(top.held_bytes)}, over {size_text(device_memory)} by "
                f"{size_text(top.held_bytes - device_memory)}" + (" (at least: a lower bound)" if lower else ""))
    if lower:
        return (f"unknown: at least {size_text(top.held_bytes)} of {size_text(device_memory)} on {where} (a lower "
                "bound: some activations are not counted)")
    return (f"fits: {size_text(top.held_bytes)} of {size_text(device_memory)}, "
            f"{size_text(device_memory - top.held_bytes)} free ({where})")


#: Columns of :func:`rank_rows` (the text report's memory table by rank).
RANK_HEADERS = ("ranks", "tp", "pp", "ep", "params B", "grads B", "optimizer B", "activations B / mb", "in flight",
                "all-gather B", "all_to_all B", "peak B", "peak phase")


def rank_rows(memory: Memory) -> list[list[str]]:
    """One row per distinct rank of a per-rank memory ledger, its data- and context-parallel replicas in the first
    column."""
    return [[",".join(map(str, r.replicas)), str(r.coords["tp"]), str(r.stage), str(r.coords["ep"]),
             f"{r.params_bytes:,}", f"{r.grads_bytes:,}", f"{r.optimizer_bytes:,}", f"{r.activations_bytes:,}",
             f"{r.microbatches_in_flight:g}", f"{r.allgather_bytes:,}", f"{r.alltoall_bytes:,}", f"{r.peak_bytes:,}",
             r.peak_phase]
            for r in memory.ranks if isinstance(r, PlanRankMemory)]
