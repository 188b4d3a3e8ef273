"""The pipeline schedules simulated action by action (``gpipe``, ``1f1b``, ``interleaved``): each pipeline rank
runs its own order of forwards and backwards, an action waiting for its rank and for the action it needs. The
per-rank ledgers (:mod:`.ranks`, :mod:`.generation`), the memory per rank and the step-time prediction read the
same simulation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, NamedTuple

from ..errors import UsageError
from .layout import chunks_of, warmup

__all__ = ["Action", "Schedule", "pipeline_schedule", "schedule_bubble", "simulate_schedule", "simulated_schedule"]


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
    form: :mod:`flopcount.parallel.generation`); times in FLOPs of TP rank 0 at equal throughput. ``run``: the
    simulation's arguments, whose actions are listed when first read (a plan search reads the makespan and the busy
    times alone)."""

    makespan: float
    busy: tuple[float, ...]
    run: tuple = field(default=(), repr=False, compare=False)

    @cached_property
    def actions(self) -> tuple[Action, ...]:
        """Every action in the order the simulation ran them (:func:`_run_schedule`)."""
        return _run_schedule(*self.run)[2] if self.run else ()

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
        makespan, busy = _timed(_steps(schedule, stages, microbatches, virtual, any(backward)), key[3], key[4])
        found = _simulated_last[key] = Schedule(makespan, busy, key[:3] + (key[3], key[4], virtual))
    return found


def schedule_bubble(plan: Any, shares: Sequence[Any], train: bool) -> float:
    """The bubble of the plan's schedule (:func:`pipeline_schedule`); 0 without a pipeline."""
    schedule = pipeline_schedule(plan, shares, train)
    return 0.0 if schedule is None else schedule.bubble_fraction


def pipeline_schedule(plan: Any, shares: Sequence[Any], train: bool) -> Schedule | None:
    """The plan's schedule simulated (:func:`simulate_schedule`), each chunk's actions as long as its TP rank 0's
    FLOPs per microbatch (``shares``: the per-rank ledger's, :func:`flopcount.parallel.ranks.node_shares`); None
    without a pipeline (pp = 1)."""
    if plan.pp == 1:
        return None
    v = chunks_of(plan)
    asked = (plan.pp * v, train)
    if _last_lengths and _last_lengths[0] is shares and _last_lengths[1] == asked:
        tf, tb = _last_lengths[2]
    else:
        tf, tb = [0.0] * (plan.pp * v), [0.0] * (plan.pp * v)
        for x in shares:
            if x.tp == 0:
                tf[x.chunk] += x.forward
                tb[x.chunk] += x.backward + x.recompute if train else 0
        _last_lengths[:] = [shares, asked, (tf, tb)]
    return simulated_schedule(plan.schedule, plan.pp, plan.microbatches, tf, tb, v)


#: The last shares (by identity) whose chunks' lengths :func:`pipeline_schedule` summed, and those lengths: the plans
#: of the same shares (another sharding, M or schedule's name) have the same.
_last_lengths: list[Any] = []


#: The orders encoded (:func:`_steps`), by the schedule's shape (plans of the same shape and other lengths), kept up to
#: :data:`_KEPT_ACTIONS` actions in all (a search of Llama-3-70B on 64 devices has 124 shapes of 1.4 million).
_steps_kept: dict[tuple, tuple] = {}
_KEPT_ACTIONS = 1 << 21


def _steps(schedule: str, stages: int, microbatches: int, virtual: int, train: bool) -> tuple[int, tuple, tuple]:
    """(J, each pipeline rank's order (:func:`_orders`', written here as numbers) of actions (virtual stage · J +
    microbatch) · 2 + (1 for a backward), and per rank what each of its actions needs and its length's place in
    :func:`_timed`'s lengths (:func:`_needs`)), J more than the largest microbatch ordered (M + P: an interleaved
    order of M not a multiple of P names microbatches past M − 1). Checked against :func:`_orders` in the tests."""
    key = (schedule, stages, microbatches, virtual, train)
    found = _steps_kept.get(key)
    if found is not None:
        return found
    p, m, v = stages, microbatches, virtual
    stride = m + p if schedule == "interleaved" else m
    out = []
    for s in range(p):
        if schedule == "interleaved":
            pv = p * v
            fw = [((((k % pv) // p) * p + s) * stride + (k // pv) * p + k % p) * 2 for k in range(m * v)]
            bw = [(((v - 1 - (k % pv) // p) * p + s) * stride + (k // pv) * p + k % p) * 2 + 1 for k in range(m * v)]
        else:
            fw = [(s * stride + j) * 2 for j in range(m)]
            bw = [c + 1 for c in fw]
        if not train:
            out.append(fw)
            continue
        warm = warmup(schedule, p, m, v, s)
        order = fw[:warm]
        for k in range(warm, len(fw)):
            order += (fw[k], bw[k - warm])
        order += bw[len(fw) - warm:]
        out.append(order)
    if sum(len(x) for found in _steps_kept.values() for x in found[1]) > _KEPT_ACTIONS:
        _steps_kept.clear()
    found = _steps_kept[key] = (stride, tuple(out), _needs(stride, out, stages * virtual))
    return found


def _needs(stride: int, steps: list[list[int]], chunks: int) -> tuple[tuple[list[int], list[int]], ...]:
    """Per pipeline rank, for each action of its order (:func:`_steps`), the action it needs (-1: none) and its
    length's place (virtual stage · 2 + 1 for a backward): an action needs the forward of the virtual stage before
    (its number − 2J), a backward that of the stage after (+ 2J), or on the last of the ``chunks`` virtual stages
    its own forward (− 1)."""
    last, twice = chunks - 1, 2 * stride
    out = []
    for order in steps:
        needs, places = [], []
        for action in order:
            vs = (action >> 1) // stride
            if action & 1:
                needs.append(action + twice if vs < last else action - 1)
            else:
                needs.append(action - twice if vs else -1)
            places.append(2 * vs + (action & 1))
        out.append((needs, places))
    return tuple(out)


def _timed(steps: tuple[int, tuple, tuple], forward: Sequence[float], backward: Sequence[float]
           ) -> tuple[float, tuple[float, ...]]:
    """(makespan, busy per pipeline rank) of :func:`_steps`' orders at these lengths: each rank runs as far as what
    it needs is done (:func:`_needs`), in turn. Each action's start and end are :func:`_run_schedule`'s, the same
    sums of the same terms (an action's times depend only on those of its rank's previous action and of the action
    it needs, not on the turn it is run in), and each rank's busy time the same sum in the same order."""
    stride, orders, needs = steps
    lengths = [0.0] * (2 * len(forward))
    lengths[0::2], lengths[1::2] = map(float, forward), map(float, backward)
    done: list[float | None] = [None] * (len(lengths) * stride)
    stages = len(orders)
    free, busy, nxt = [0.0] * stages, [0.0] * stages, [0] * stages
    left = sum(len(s) for s in orders)
    while left:
        moved = 0
        for s in range(stages):
            order, (need_of, place), i, t, b = orders[s], needs[s], nxt[s], free[s], busy[s]
            n = len(order)
            while i < n:
                need = need_of[i]
                if need >= 0:
                    d = done[need]
                    if d is None:
                        break
                    if d > t:
                        t = d
                length = lengths[place[i]]
                t += length
                done[order[i]] = t
                b += length
                i += 1
            moved += i - nxt[s]
            nxt[s], free[s], busy[s] = i, t, b
        if not moved:
            raise RuntimeError("pipeline schedule deadlocked")  # an order above is wrong, not the user's input
        left -= moved
    return max(free), tuple(busy)


def _run_schedule(schedule: str, stages: int, microbatches: int, forward: Sequence[float],
                  backward: Sequence[float], virtual: int) -> tuple[float, tuple[float, ...], tuple[Action, ...]]:
    """The simulation itself, action by action (the reference :func:`_timed` is checked against, and the actions'
    list): in turn, each pipeline rank runs the next action of its order once what it needs is done; (makespan,
    busy per rank, actions)."""
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
    return max(free), tuple(busy), tuple(actions)
