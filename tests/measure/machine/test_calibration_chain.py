"""Collectives timed in a step are timed as a step makes them: one call after another with compute between and no
barrier, the ranks agreeing whether to stop only at each chain's start. By the wall clock each point's figures are
the slowest rank's own (its median, best, slowest, mean and p90 over its calls); by the CPU seconds alone, the
figures of each call's slowest rank. The distributed calls are stood in for here, so the order and the arithmetic
are seen exactly."""

from __future__ import annotations

import pytest


def test_a_chain_of_calls_agrees_to_stop_only_at_its_start(monkeypatch):
    """7 timed calls and 2 warm-up calls, chains of 3: the ranks agree at calls 0, 3 and 6 (three stop
    all_reduces), every call follows its burst, and no barrier is made."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    from flopcount.measure.machine import calibrate as cb

    events = []

    def all_reduce(t, op=None, group=None):
        events.append("stop" if t.numel() == 1 else "call")

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: events.append("barrier"))
    in_step = cb._InStep(lambda: events.append("burst"), False, least=100, budget_s=1e9, chain=3)
    times = cb._time_collective("all_reduce", 64, 0, 2, 7, in_step)
    assert len(times) == 7 and all(t >= 0 for t in times)
    chain = ["burst", "call"]
    assert events == ["stop", *chain * 3, "stop", *chain * 3, "stop", *chain * 3]


def test_the_ranks_stop_together_once_past_the_budget_with_enough_calls(monkeypatch):
    """With the budget spent at once and at least 4 calls wanted, chains of 3: the first agreement finds no calls,
    the second 1 (two warm-ups, then one timed), the third 4: the ranks stop there, before the chain's burst."""
    pytest.importorskip("torch")
    import torch.distributed as dist

    from flopcount.measure.machine import calibrate as cb

    stops = []

    def all_reduce(t, op=None, group=None):
        if t.numel() == 1:
            stops.append(float(t.item()))

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    in_step = cb._InStep(lambda: None, False, least=4, budget_s=0.0, chain=3)
    times = cb._time_collective("all_reduce", 64, 0, 2, 40, in_step)
    assert stops == [0.0, 0.0, 1.0] and len(times) == 4


def test_a_point_in_a_step_is_the_slowest_ranks_own_figures(monkeypatch):
    """Rank 0's calls take 1, 1, 1, 1 and 11 s; rank 1's 2 s each. Each rank's own figures (median, best, slowest,
    mean, p90) are 1, 1, 11, 3, 11 and 2, 2, 2, 2, 2; the point holds the larger of each: 2, 2, 11, 3, 11. (The
    slowest rank of each call would give 2, 2, 11, 4, 11: a mean no rank's step sees.)"""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from flopcount.measure.machine import calibrate as cb

    peer = torch.tensor([2.0, 2.0, 2.0, 2.0, 2.0], dtype=torch.float64)

    def all_reduce(t, op=None, group=None):
        t.copy_(torch.maximum(t, peer))

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(cb, "_time_collective", lambda *a, **k: [1.0, 1.0, 1.0, 1.0, 11.0])
    sizes = cb.Sizes(messages=(4096,))
    in_step = cb._InStep(lambda: None, False, least=1, budget_s=0.0)
    rows = cb._collectives(0, 2, sizes, in_step, kinds=("all_reduce",))
    assert rows == {"all_reduce": [[4096, 2.0, 2.0, 11.0, 3.0, 11.0]]}


def test_timed_by_cpu_seconds_a_point_is_the_slowest_rank_of_each_call(monkeypatch):
    """By the CPU seconds alone a call does not hold a rank's wait for a late peer: the same two ranks' calls (1, 1,
    1, 1 and 11 s; 2 s each) give the slowest rank of each call, 2, 2, 2, 2 and 11: median 2, best 2, slowest 11,
    mean 19 / 5 = 3.8, p90 11."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    from flopcount.measure.machine import calibrate as cb

    peer = torch.tensor([2.0] * 5, dtype=torch.float64)
    monkeypatch.setattr(dist, "all_reduce", lambda t, op=None, group=None: t.copy_(torch.maximum(t, peer)))
    monkeypatch.setattr(cb, "_time_collective", lambda *a, **k: [1.0, 1.0, 1.0, 1.0, 11.0])
    in_step = cb._InStep(lambda: None, True, least=1, budget_s=0.0)
    rows = cb._collectives(0, 2, cb.Sizes(messages=(4096,)), in_step, kinds=("all_reduce",))
    assert rows == {"all_reduce": [[4096, 2.0, 2.0, 11.0, pytest.approx(3.8), 11.0]]}
