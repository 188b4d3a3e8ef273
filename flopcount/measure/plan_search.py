"""``flopcount plan``: every plan of a decoder on N devices that fits their memory, ranked by predicted throughput.

The plans tried are :mod:`flopcount.measure.plan_space`'s. The model is counted for training once per microbatch
size and recompute policy, with its memory ledger (whose graph keeps what the policy recomputes); each plan is
then

1. **checked**: a plan the model cannot split (a degree that does not divide the heads, the layers, the
   vocabulary ..., a recompute policy the model has nothing for) is dropped and counted by the reason the per-rank
   ledgers give;
2. **fitted**: its largest per-rank peak (:func:`flopcount.memory.ranks.per_rank`, the walk of each stage's nodes
   at the rank's shares) against the device's memory; a plan over it is dropped and counted ("over memory");
3. **predicted** (:mod:`flopcount.measure.predict` on its per-rank ledger, :func:`flopcount.parallel.ranks.ledger`).

Plans are ranked by tokens per second (plans of different global batches compare by throughput), ties by MFU.

What is shared between plans, exactly:

* a stage's memory walk reads the plan's tp, sp, cp, ep, pp and interleaving (which nodes a rank runs, at what
  shares), the sharding and the D·C ranks it shards over, whether more than one microbatch accumulates gradients,
  the recompute policy and the microbatch size; not dp without sharding, the schedule's name (1f1b and gpipe run
  the same chunks) or M. One walk per such key serves every plan that shares it: a plan's rank peak is the walk's
  with the other in-flight microbatches' activations held for its own schedule
  (:func:`flopcount.parallel.layout.in_flight`), as the per-rank ledger adds them;
* a plan's data- and context-parallel replicas run the same work (the ledger lists them with equal figures), so the
  prediction reads one of them per (stage, TP rank) and each node's seconds once per distinct share.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from flopcount.errors import FlopcountError, UsageError

from .plan_space import Choice, SpaceSettings, choices, reason

__all__ = ["Candidate", "OVER_MEMORY", "Search", "check_report", "search"]

#: The dropped count of the plans whose largest per-rank peak exceeds the device's memory.
OVER_MEMORY = "over memory (the largest per-rank peak exceeds --device-memory)"


@dataclass(frozen=True)
class Candidate:
    """One plan and its figures: its step, throughput and MFU predicted, its largest per-rank peak (bytes) and the
    device memory left beside it, its step's model FLOPs (all ranks) and the busiest rank's hardware FLOPs."""

    parallel: str  # as --parallel reads it
    schedule: str  # "-" without a pipeline
    microbatch_size: int
    microbatches: int
    recompute: str
    step_seconds: float | None
    tokens_per_second: float | None
    mfu: float | None
    peak_bytes: int
    headroom_bytes: int | None
    model_flops: int | None = None
    hardware_flops: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def command(self) -> str:
        """The flags that count this plan alone."""
        out = f"--parallel {self.parallel} --microbatches {self.microbatches} --recompute {self.recompute}"
        return out + (f" --schedule {self.schedule}" if self.schedule != "-" else "")


@dataclass(frozen=True)
class Search:
    """The plans that fit (ranked), the plans dropped (counted by reason), the plan of the least peak among those
    over memory (``smallest``; None when none was over) and the plans tried."""

    plans: list[Candidate]
    dropped: Counter
    smallest: Candidate | None
    tried: int


class _Walks:
    """Per-rank memory peaks of plans, one walk per key shared by the plans (see the module)."""

    def __init__(self, report_of: Callable[[int, str], Any]):
        self.report_of = report_of
        self.walked: dict[tuple, Any] = {}

    @staticmethod
    def key(c: Choice) -> tuple:
        p = c.plan
        v = p.virtual_stages if p.schedule == "interleaved" else 1
        shards = p.dp * p.cp if p.zero_stage else 0
        return (c.size, c.recompute, p.tp, p.sp, p.cp, p.ep, p.pp, v, p.zero_stage, shards, p.microbatches > 1,
                p.microbatches % p.pp == 0 if v > 1 else True)

    def peak(self, c: Choice) -> int:
        """The largest per-rank peak of ``c``'s plan; the per-rank ledgers' refusal raised."""
        from flopcount.memory.ranks import per_rank
        from flopcount.parallel.layout import in_flight, layout_of

        k = self.key(c)
        if k not in self.walked:
            try:  # what the model cannot split is refused by the layout before a policy's own count is made
                layout_of(self.report_of(c.size, "none"), c.plan)
                mem = per_rank(self.report_of(c.size, c.recompute), c.plan)
                self.walked[k] = (c.plan, [(r.stage, r.peak_bytes, r.activations_bytes) for r in mem.ranks])
            except FlopcountError as e:
                self.walked[k] = e
        found = self.walked[k]
        if isinstance(found, Exception):
            raise found
        walked_plan, ranks = found
        return max(peak - int(act * (in_flight(walked_plan, s) - 1)) + int(act * (in_flight(c.plan, s) - 1))
                   for s, peak, act in ranks)


def _predicted(report: Any, c: Choice, profile: Any) -> tuple[Any, Any]:
    """(ledger, prediction) of ``c``; the prediction reads one data-parallel replica per (stage, TP rank, CP
    rank) where the replicas are equal (no expert parallelism: an EP rank is drawn from the data-parallel ranks)."""
    from flopcount.parallel.plan import parse_recompute
    from flopcount.parallel.ranks import ledger

    from .predict import predict

    led = ledger(report, c.plan, parse_recompute(c.recompute))
    shown = led
    if c.plan.ep == 1 and c.plan.dp > 1:
        shown = dataclasses.replace(led, ranks=tuple(r for r in led.ranks if r.coords["dp"] == 0))
    return led, predict(dataclasses.replace(report, parallel=shown), profile)


def search(report_of: Callable[[int, str], Any], profile: Any, space: SpaceSettings,
           device_memory: int | None, sample: int | None = None) -> Search:
    """Every plan of ``space`` checked, fitted to ``device_memory`` bytes (None: not fitted) and predicted on
    ``profile``, ranked (see the module). ``report_of(size, recompute)``: the training count of one microbatch of
    ``size`` sequences with its memory ledger under that recompute policy. ``sample``: only so many of the plans,
    drawn at random (seeded), as a benchmark times a search too long to run whole."""
    tried, dropped = choices(space)
    if sample is not None and sample < len(tried):
        import random

        tried = random.Random(0).sample(tried, sample)
        dropped = Counter()
    total = len(tried) + sum(dropped.values())
    # plans of the same node shares one after another: the ledgers keep the last shares asked
    tried.sort(key=lambda c: (c.size, c.recompute, c.plan.tp, c.plan.sp, c.plan.pp, c.plan.virtual_stages))
    walks = _Walks(report_of)
    found: list[Candidate] = []
    smallest: Candidate | None = None
    for c in tried:
        p = c.plan
        try:
            peak = walks.peak(c)
        except FlopcountError as e:
            dropped[reason(e)] += 1
            continue
        if device_memory is not None and peak > device_memory:
            dropped[OVER_MEMORY] += 1
            if smallest is None or peak < smallest.peak_bytes:
                smallest = Candidate(c.text, c.schedule, c.size, p.microbatches, c.recompute, None, None, None, peak,
                                     None)
            continue
        try:
            led, pred = _predicted(report_of(c.size, c.recompute), c, profile)
        except FlopcountError as e:
            dropped[reason(e)] += 1
            continue
        found.append(Candidate(c.text, c.schedule, c.size, p.microbatches, c.recompute, pred.step_seconds,
                               pred.tokens_per_second, pred.mfu, peak,
                               None if device_memory is None else device_memory - peak,
                               sum(r.model_flops for r in led.ranks), max(r.hardware_flops for r in led.ranks)))
    found.sort(key=lambda x: (-(x.tokens_per_second or 0.0), -(x.mfu or 0.0), x.parallel, x.microbatches))
    return Search(found, dropped, smallest, total)


def check_report(report: Any) -> None:
    """:class:`UsageError` for a count the search cannot take: not of training."""
    if report.mode != "train":
        raise UsageError("plan: the model must be counted for training (--mode train)")
