"""The pipeline schedules simulated action by action (``gpipe``, ``1f1b``, ``interleaved``): each pipeline rank
runs its own order of forwards and backwards, an action waiting for its rank and for the action it needs. The
per-rank ledgers (:mod:`.ranks`, :mod:`.generation`), the memory per rank and the step-time prediction read the
same simulation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import UsageError
from .layout import warmup

__all__ = ["Action", "Schedule", "simulate_schedule", "simulated_schedule"]


class Action(NamedTuple):
    """One action of a pipeline schedule: pipeline rank ``rank`` runs the forward (``F``) or backward (``B``) of
    ``microbatch`` through its virtual stage ``chunk`` (c·P + p) from ``start`` to ``end`` (in FLOPs of TP rank 0
    at equal throughput)."""

    rank: int
    kind: str
    chunk: int
    microbatch: int
    start: float
    end: float


@dataclass(frozen=True)
class Schedule:
    """A simulated pipeline schedule (:func:`simulate_schedule`): the step's ``makespan``, each pipeline rank's
    ``busy`` time, and its ``actions`` in the order they ran (none for generation's phases, whose length is a closed
    form: :mod:`flopcount.parallel.generation`); times in FLOPs of TP rank 0 at equal throughput."""

    makespan: float
    busy: tuple[float, ...]
    actions: tuple[Action, ...] = ()

    @property
    def bubble_fraction(self) -> float:
        """1 − busy time / (P × makespan)."""
        return 1 - sum(self.busy) / (len(self.busy) * self.makespan) if self.makespan else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"makespan": self.makespan, "busy": list(self.busy),
                "actions": [a._asdict() for a in self.actions]}


def _orders(schedule: str, stages: int, microbatches: int, virtual: int, train: bool) -> list[list[tuple]]:
    """Each pipeline rank's order of actions ``(kind, virtual stage, microbatch)``; virtual stage c·P + p is
    chunk c of rank p. Interleaved 1F1B as Megatron orders it: forwards in groups of P microbatches per chunk
    (chunks in turn), backwards likewise with the chunks reversed, (P − p − 1)·2 + (v − 1)·P warm-up
    forwards."""
    p_, m, v = stages, microbatches, virtual
    orders = []
    for s in range(p_):
        if schedule == "interleaved":
            def fwd(k: int) -> tuple:
                return ("F", ((k % (p_ * v)) // p_) * p_ + s, (k // (p_ * v)) * p_ + k % p_)

            def bwd(k: int) -> tuple:
                return ("B", (v - 1 - (k % (p_ * v)) // p_) * p_ + s, (k // (p_ * v)) * p_ + k % p_)

            total = m * v
            if not train:
                orders.append([fwd(k) for k in range(total)])
                continue
            warm = warmup(schedule, p_, m, v, s)
            order = [fwd(k) for k in range(warm)]
            for k in range(warm, total):
                order += [fwd(k), bwd(k - warm)]
            order += [bwd(k) for k in range(total - warm, total)]
        elif not train:
            order = [("F", s, j) for j in range(m)]
        elif schedule == "gpipe":
            order = [("F", s, j) for j in range(m)] + [("B", s, j) for j in range(m)]
        else:  # 1f1b
            warm = warmup(schedule, p_, m, 1, s)
            order = [("F", s, j) for j in range(warm)]
            for j in range(warm, m):
                order += [("F", s, j), ("B", s, j - warm)]
            order += [("B", s, j) for j in range(m - warm, m)]
        orders.append(order)
    return orders


def simulate_schedule(schedule: str, stages: int, microbatches: int, forward: Sequence[float],
                      backward: Sequence[float], virtual: int = 1) -> tuple[float, list[float]]:
    """(makespan, busy time per pipeline rank) of a schedule's actions (``gpipe``, ``1f1b``, ``interleaved`` with
    ``virtual`` chunks per rank), each rank running its own order of forwards and backwards (no backwards when
    ``backward`` is all zeros); ``forward[c·P + p]`` and ``backward[c·P + p]`` are the lengths of chunk c of rank
    p. An action waits for its rank and for the action it needs: the forward of the previous virtual stage, the
    backward of the next, or on the last virtual stage its own forward.

    >>> simulate_schedule("1f1b", 4, 8, [1] * 4, [2] * 4)  # (M + P − 1) · (f + b), busy M · (f + b)
    (33.0, [24.0, 24.0, 24.0, 24.0])
    """
    run = simulated_schedule(schedule, stages, microbatches, forward, backward, virtual)
    return run.makespan, list(run.busy)


#: The last schedules simulated, by their arguments: the memory and FLOPs ledgers of one plan simulate the same
#: schedule, and a plan search many plans of the same chunks.
_simulated_last: dict[tuple, Schedule] = {}


def simulated_schedule(schedule: str, stages: int, microbatches: int, forward: Sequence[float],
                       backward: Sequence[float], virtual: int = 1) -> Schedule:
    """:func:`simulate_schedule`'s run, with every action's start and end (a :class:`Schedule`)."""
    if schedule not in ("gpipe", "1f1b", "interleaved"):
        raise UsageError(f"--schedule {schedule}: not modelled yet in FLOPs per rank; give gpipe, 1f1b or "
                         "interleaved")
    key = (schedule, stages, microbatches, tuple(forward), tuple(backward), virtual)
    found = _simulated_last.get(key)
    if found is None:
        if len(_simulated_last) >= 16:
            _simulated_last.clear()
        found = _simulated_last[key] = _run_schedule(schedule, stages, microbatches, key[3], key[4], virtual)
    return found


def _run_schedule(schedule: str, stages: int, microbatches: int, forward: Sequence[float],
                  backward: Sequence[float], virtual: int) -> Schedule:
    """The simulation itself: in turn, each pipeline rank runs the next action of its order once what it needs is
    done."""
    last = stages * virtual - 1
    orders = _orders(schedule, stages, microbatches, virtual, any(backward))
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * stages
    nxt = [0] * stages
    busy = [0.0] * stages
    actions: list[Action] = []
    while any(nxt[s] < len(orders[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            if nxt[s] >= len(orders[s]):
                continue
            kind, vs, j = orders[s][nxt[s]]
            need = (("F", vs - 1, j) if vs > 0 else None) if kind == "F" else (
                ("B", vs + 1, j) if vs < last else ("F", vs, j))
            if need is not None and need not in done:
                continue
            length = float(forward[vs] if kind == "F" else backward[vs])
            start = max(free[s], done[need] if need else 0.0)
            done[(kind, vs, j)] = free[s] = start + length
            actions.append(Action(s, kind, vs, j, start, start + length))
            busy[s] += length
            nxt[s] += 1
            moved = True
        if not moved:
            raise RuntimeError("pipeline schedule deadlocked")  # an order above is wrong, not the user's input
    return Schedule(max(free), tuple(busy), tuple(actions))
