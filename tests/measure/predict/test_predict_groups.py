"""Collectives timed in a step over groups smaller than the calibration's ranks (``collectives_in_step_groups``):
a message over a group of that size is priced from them (at the mean of their calls, the interval widened by their
tail and known), one over a group size the profile did not time at from the all-ranks timing with its note and an
unknown interval; written out here as closed forms on a hand-made 4-rank profile."""

from __future__ import annotations

import dataclasses
import math

import pytest

from flopcount.measure.machine.calibration import Collective, Segment
from flopcount.measure.predict import Message, NodeWork, Work, predict_work, tail_seconds

from test_predict import R, one_rank, plan, profile

# all 4 ranks in a step: slow; groups of 2 side by side: fast (seconds, bus bytes/s)
WORLD_LAT = {"best": 2e-3, "median": 3e-3, "slowest": 9e-3, "mean": 5e-3, "p90": 8e-3}
WORLD_BW = {"best": 2e8, "median": 1e8, "slowest": 5e7, "mean": 8e7, "p90": 6e7}
PAIR_LAT = {"best": 1e-4, "median": 2e-4, "slowest": 2e-3, "mean": 4e-4, "p90": 9e-4}
PAIR_BW = {"best": 4e9, "median": 2e9, "slowest": 1e8, "mean": 1e9, "p90": 5e8}


def _four_ranks(groups: bool = True):
    def one(n, lat, bw):
        return Collective(n, (), (Segment(0, math.inf, dict(lat), dict(bw)),))

    return dataclasses.replace(
        profile(), ranks=4,
        collectives_in_step={"all_reduce": one(4, WORLD_LAT, WORLD_BW), "all_gather": one(4, WORLD_LAT, WORLD_BW)},
        collectives_in_step_groups={2: {"all_reduce": one(2, PAIR_LAT, PAIR_BW)}} if groups else None)


def _work(kind: str, a: float, calls: int, group: int) -> Work:
    w = NodeWork("gemm", R * 0.01, 0, backward_flops=R * 0.02)  # 0.03 s at every repeat (a flat profile)
    msgs = [Message(kind, "tp", a, calls / 2, group, phase) for phase in ("forward", "backward")]
    return Work((one_rank([w], msgs),), plan(), None)


def test_a_message_over_a_timed_group_size_is_priced_from_that_group():
    a, calls = 1 << 19, 16
    # over 2 ranks: bus bytes 2·(2-1)/2·a = a, at the pair's mean, and its tail
    mean, p90 = PAIR_LAT["mean"] + a / PAIR_BW["mean"], PAIR_LAT["p90"] + a / PAIR_BW["p90"]
    p = predict_work(_work("all_reduce", a, calls, 2), _four_ranks())
    assert p.step_seconds == pytest.approx(0.03 + calls * mean)
    assert p.interval[0] == pytest.approx(0.03 + calls * mean)
    assert p.interval[1] == pytest.approx(0.03 + calls * mean + math.sqrt(calls) * (p90 - mean))
    assert tail_seconds(_work("all_reduce", a, calls, 2).ranks[0], _four_ranks()) == \
        pytest.approx(math.sqrt(calls) * (p90 - mean))
    assert not p.extrapolated and p.interval_note is None
    # the same message on a profile without group timings: the 4-rank fit at n = 2, noted, the interval unknown
    old = predict_work(_work("all_reduce", a, calls, 2), _four_ranks(groups=False))
    assert old.step_seconds == pytest.approx(0.03 + calls * (WORLD_LAT["mean"] + a / WORLD_BW["mean"]))
    assert any("over 2 ranks (calibrated over 4)" in x for x in old.extrapolated)
    assert old.interval == (None, None)


def test_the_full_group_and_an_untimed_kind_keep_the_all_ranks_timing():
    a, calls = 1 << 16, 4
    # over all 4 ranks: bus factor 2·3/4, the 4-rank in-step mean, the group timing not consulted
    p = predict_work(_work("all_reduce", a, calls, 4), _four_ranks())
    assert p.step_seconds == pytest.approx(0.03 + calls * (WORLD_LAT["mean"] + 1.5 * a / WORLD_BW["mean"]))
    assert not p.extrapolated
    # an all_gather over 2 ranks: the groups timed no all_gather here, so the 4-rank fit at n = 2 with its note
    g = predict_work(_work("all_gather", a, calls, 2), _four_ranks())
    assert g.step_seconds == pytest.approx(0.03 + calls * (WORLD_LAT["mean"] + 0.5 * a / WORLD_BW["mean"]))
    assert any("all_gather over 2 ranks (calibrated over 4)" in x for x in g.extrapolated)
