"""The plans ``flopcount plan`` tries (:mod:`flopcount.measure.plan_search`): every layout of N devices as plain
arithmetic on degrees, before any model is asked whether it splits so.

* the degrees: tp · cp · pp · dp = N over the divisors of N; ``ep`` (a model with routed experts only) over the
  divisors of dp · cp (expert parallelism reuses those ranks); ``sp`` on and off where tp > 1;
* the schedule where pp > 1: ``1f1b``, ``gpipe`` and ``interleaved:V`` for each V ≥ 2 with pp · V dividing the
  layers (V = 1 is 1f1b);
* the sharding of the model states: none; ``fsdp`` where dp > 1; ``zero1`` and ``zero2`` where dp · cp > 1;
* the microbatch size b and count M: with a global batch B (sequences per optimizer step), each size b given with
  b · dp dividing B and M = B / (b · dp) (a size that does not divide is dropped and counted); without one, each
  size b with each count M given;
* the recompute policy: ``none``, ``selective`` and ``full``.

A plan of fewer microbatches than pipeline stages, or one the plan record refuses (more schedule steps than the
ledger simulates), is dropped and counted by its reason here; what the model cannot split is the search's to find.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from flopcount.errors import UsageError

__all__ = ["Choice", "FEWER", "RECOMPUTES", "SpaceSettings", "check_space", "choices", "divisors", "reason"]

#: The dropped count of the plans of fewer microbatches than pipeline stages (the pipeline cannot fill).
FEWER = "fewer microbatches than pipeline stages"
#: The recompute policies tried, cheapest in time first.
RECOMPUTES = ("none", "selective", "full")


@dataclass(frozen=True)
class SpaceSettings:
    """What bounds the search: ``devices`` N, the ``layers`` of the model's stack (0: none), whether it has routed
    experts, the microbatch ``sizes`` and ``counts`` tried, and the ``global_batch`` (None: each count)."""

    devices: int
    layers: int
    experts: bool
    sizes: tuple[int, ...]
    counts: tuple[int, ...]
    global_batch: int | None = None


@dataclass(frozen=True)
class Choice:
    """One plan tried: the plan record (degrees, switches, microbatch count, schedule), its recompute policy and
    its microbatch size (sequences a microbatch)."""

    plan: object  # ParallelPlan
    recompute: str
    size: int

    @property
    def text(self) -> str:
        """The plan as ``--parallel`` reads it."""
        p = self.plan
        parts = [f"{d}={getattr(p, d)}" for d in ("tp", "pp", "cp", "ep", "dp") if getattr(p, d) > 1 or d == "dp"]
        return ",".join(parts + [f for f in ("sp", "fsdp", "zero1", "zero2") if getattr(p, f)])

    @property
    def schedule(self) -> str:
        p = self.plan
        if p.pp == 1:
            return "-"
        return f"interleaved:{p.virtual_stages}" if p.schedule == "interleaved" else p.schedule


def divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


def reason(error: Exception) -> str:
    """A refusal's reason as the dropped counts name it: its message after the flag it names."""
    return str(error).split(": ", 1)[-1].strip()


def _schedules(pp: int, layers: int) -> list[tuple[str, int]]:
    if pp == 1:
        return [("1f1b", 1)]
    out = [("1f1b", 1), ("gpipe", 1)]
    if layers and layers % pp == 0:
        out += [("interleaved", v) for v in divisors(layers // pp) if v > 1]
    return out


def _shardings(dp: int, cp: int) -> list[str]:
    return [""] + (["fsdp"] if dp > 1 else []) + (["zero1", "zero2"] if dp * cp > 1 else [])


def _batches(s: SpaceSettings, dp: int, dropped: Counter) -> Iterator[tuple[int, int]]:
    """(microbatch size, count) pairs of a plan with ``dp`` replicas; the sizes the global batch refuses counted."""
    for b in s.sizes:
        if s.global_batch is None:
            yield from ((b, m) for m in s.counts)
        elif s.global_batch % (b * dp):
            dropped[f"the global batch of {s.global_batch} sequences is no multiple of b·dp"] += len(RECOMPUTES)
        else:
            yield b, s.global_batch // (b * dp)


def choices(s: SpaceSettings) -> tuple[list[Choice], Counter]:
    """Every plan of the search space (see the module) and the plans dropped by the plan record, counted by reason
    (a plan refused so counts once per recompute policy)."""
    from flopcount.parallel.plan import ParallelPlan

    found: list[Choice] = []
    dropped: Counter = Counter()
    n = s.devices
    for tp in divisors(n):
        for cp in divisors(n // tp):
            for pp in divisors(n // (tp * cp)):
                dp = n // (tp * cp * pp)
                for ep in divisors(dp * cp) if s.experts else [1]:
                    for sp in (False, True) if tp > 1 else (False,):
                        for schedule, v in _schedules(pp, s.layers):
                            for shard in _shardings(dp, cp):
                                for b, m in _batches(s, dp, dropped):
                                    if pp > 1 and m < pp:
                                        dropped[FEWER] += len(RECOMPUTES)
                                        continue
                                    flags = {shard: True} if shard else {}
                                    try:
                                        plan = ParallelPlan(tp=tp, pp=pp, cp=cp, ep=ep, dp=dp, sp=sp,
                                                            microbatches=m, schedule=schedule, virtual_stages=v,
                                                            **flags)
                                    except UsageError as e:
                                        dropped[reason(e)] += len(RECOMPUTES)
                                        continue
                                    found.extend(Choice(plan, rc, b) for rc in RECOMPUTES)
    return found, dropped


def check_space(sizes: Sequence[int], global_batch: int | None) -> None:
    """:class:`UsageError` for a search that cannot have any plan: a global batch below every microbatch size."""
    if global_batch is not None and global_batch < min(sizes):
        raise UsageError(f"plan: --global-batch {global_batch} is smaller than every microbatch size "
                         f"({', '.join(map(str, sizes))}); give a larger global batch or --microbatch-sizes 1")
