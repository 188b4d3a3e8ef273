"""``flopcount plan``: every plan of a decoder on N devices ranked by its predicted throughput.

The model is counted once (one microbatch, training); each plan is its per-rank ledger
(:func:`flopcount.parallel.ranks.ledger`) predicted on the machine profile (:mod:`flopcount.measure.predict`).
The plans enumerated: tp · pp · dp = N over the divisors of N, the schedule (``1f1b`` and ``gpipe`` where pp > 1),
the microbatch counts given (those below pp left out), recompute ``none`` and ``full``. A plan the ledger refuses
(a degree that does not divide what it splits) is dropped and counted by its reason. Plans are ranked by tokens per
second (a plan's global batch is b·M·dp, so throughput, not the step's seconds, compares them), ties by MFU.
Not searched yet: sp, cp, ep, interleaved schedules, fsdp/zero, the microbatch size, and per-rank memory.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from flopcount.errors import FlopcountError, UsageError

__all__ = ["Candidate", "divisors", "search"]


@dataclass(frozen=True)
class Candidate:
    """One plan and its prediction."""

    parallel: str  # tp=T,pp=P,dp=D
    microbatches: int
    schedule: str
    recompute: str
    step_seconds: float
    tokens_per_second: float | None
    mfu: float

    def as_dict(self) -> dict[str, Any]:
        return {"parallel": self.parallel, "microbatches": self.microbatches, "schedule": self.schedule,
                "recompute": self.recompute, "step_seconds": self.step_seconds,
                "tokens_per_second": self.tokens_per_second, "mfu": self.mfu}


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


def search(report: Any, profile: Any, devices: int, microbatches: Sequence[int]) -> tuple[list[Candidate], Counter]:
    """Every plan of ``report`` (a training count of one microbatch) on ``devices`` ranks, predicted on ``profile``
    and ranked (see the module), and the plans dropped, counted by the ledger's reason."""
    import dataclasses

    from flopcount.parallel.plan import parse_parallel, parse_recompute
    from flopcount.parallel.ranks import ledger

    from .predict import predict

    if report.mode != "train":
        raise UsageError("plan: the model must be counted for training (--mode train)")
    found, dropped = [], Counter()
    for tp in divisors(devices):
        for pp in divisors(devices // tp):
            dp = devices // (tp * pp)
            text = f"tp={tp},pp={pp},dp={dp}"
            for schedule in ("1f1b", "gpipe") if pp > 1 else ("1f1b",):
                for m in sorted({m for m in microbatches if m >= pp}):
                    for rc in ("none", "full"):
                        try:
                            plan = parse_parallel(text, m, schedule)
                            led = ledger(report, plan, parse_recompute(rc))
                            pred = predict(dataclasses.replace(report, parallel=led), profile)
                        except FlopcountError as e:
                            dropped[str(e).split(":", 1)[-1].strip()] += 1
                            continue
                        found.append(Candidate(text, m, schedule, rc, pred.step_seconds, pred.tokens_per_second,
                                               pred.mfu))
    found.sort(key=lambda c: (-(c.tokens_per_second or 0.0), -c.mfu, c.parallel, c.microbatches))
    return found, dropped
