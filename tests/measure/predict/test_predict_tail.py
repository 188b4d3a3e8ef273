"""Collectives timed in a step with the tail of their calls recorded: each priced at the mean of its calls at both
ends of the interval, whatever the repeat, and the interval's high end widened by √(Σ count·(p90 − mean)²) of the
rank's calls; written out here as closed forms on a hand-made rank and profile."""

from __future__ import annotations

import dataclasses
import math

import pytest

from flopcount.measure.machine.calibration import Collective, Segment
from flopcount.measure.predict import Message, NodeWork, Work, predict_work, tail_seconds

from test_predict import R, one_rank, plan, profile

LAT = {"best": 1e-4, "median": 2e-4, "slowest": 9e-3, "mean": 1e-3, "p90": 4e-3}  # seconds
BW = {"best": 4e9, "median": 2e9, "slowest": 1e8, "mean": 1e9, "p90": 5e8}  # bus bytes/s


def _with_tail(lat=LAT, bw=BW):
    seg = Segment(0, math.inf, dict(lat), dict(bw))
    return dataclasses.replace(profile(), collectives_in_step={"all_reduce": Collective(2, (), (seg,))})


def _work(a: float, calls: int) -> Work:
    w = NodeWork("gemm", R * 0.01, 0, backward_flops=R * 0.02)  # 0.03 s at every repeat (a flat profile)
    msgs = [Message("all_reduce", "tp", a, calls / 2, 2, phase) for phase in ("forward", "backward")]
    return Work((one_rank([w], msgs),), plan(), None)


def test_each_call_is_priced_at_its_mean_and_the_high_end_widened_by_the_tail():
    a, calls = 1 << 19, 16  # over 2 ranks: bus bytes 2·(2-1)/2·a = a
    mean, p90 = LAT["mean"] + a / BW["mean"], LAT["p90"] + a / BW["p90"]
    p = predict_work(_work(a, calls), _with_tail())
    assert p.step_seconds == pytest.approx(0.03 + calls * mean)  # the point: the mean, not the best repeat
    # the high end: the same mean (the median repeat of compute, equal here) plus √(calls·(p90 − mean)²)
    assert p.interval[0] == pytest.approx(0.03 + calls * mean)
    assert p.interval[1] == pytest.approx(0.03 + calls * mean + math.sqrt(calls) * (p90 - mean))
    assert tail_seconds(_work(a, calls).ranks[0], _with_tail()) == pytest.approx(math.sqrt(calls) * (p90 - mean))
    assert not any("in a step" in n for n in p.notes)
    r = p.ranks[0]["communication_seconds"]["all_reduce"]
    assert r["exposed"] == pytest.approx(calls * mean) and r["overlapped"] == 0


def test_a_p90_below_the_mean_does_not_widen_and_no_collective_no_tail():
    # a tail beyond the 90th percentile: the mean above the p90, the mean already holds it
    lat = dict(LAT, p90=5e-4)
    a, calls = 4096, 8
    p = predict_work(_work(a, calls), _with_tail(lat))
    assert p.interval[1] == pytest.approx(p.interval[0])  # nothing added
    assert p.step_seconds == pytest.approx(0.03 + calls * (LAT["mean"] + a / BW["mean"]))
    alone = one_rank([NodeWork("gemm", R * 0.01, 0)])
    assert tail_seconds(alone, _with_tail()) == 0.0
    # a tight loop's profile (no collectives in a step): no tail, priced at its repeats as before
    assert tail_seconds(_work(a, calls).ranks[0], profile()) == 0.0
