"""Collectives timed in a step over groups smaller than the calibration's ranks (``collectives_in_step_groups``):
the group sizes a calibration of N ranks times (written out by hand), a profile with them reading back equal, one
taken before they were measured loading with the field null, and each damaged part refused in one line (exit 12)."""

from __future__ import annotations

import json

import pytest

from flopcount.errors import MeasurementError
from flopcount.measure.machine import calibration as cal
from flopcount.measure.machine.calibrate import group_sizes


def test_group_sizes_are_the_proper_divisors_from_two():
    assert group_sizes(1) == group_sizes(2) == group_sizes(3) == ()
    assert group_sizes(4) == (2,)
    assert group_sizes(6) == (2, 3)
    assert group_sizes(8) == (2, 4)
    assert group_sizes(7) == ()


def _pair() -> cal.Collective:
    # over 2 ranks (bus factor 1): median 0.2 ms + B / 2 GB/s, mean 0.4 ms + B / 1 GB/s, p90 0.9 ms + B / 0.5 GB/s
    pts = tuple(cal.Point(b, 2e-4 + b / 2e9, 1e-4 + b / 4e9, 2e-3 + b / 1e8, 4e-4 + b / 1e9, 9e-4 + b / 5e8)
                for b in (1024, 8192, 65536, 1 << 20, 1 << 22))
    return cal.Collective(2, pts, cal.fit_segments("all_reduce", 2, pts))


def _doc() -> dict:
    doc = cal.device_profile("H100", 4).as_dict()
    doc["collectives_in_step_groups"] = {"2": {"all_reduce": _pair().as_dict("all_reduce")}}
    return doc


def test_a_profile_with_group_timings_reads_back_equal_and_one_without_them_loads():
    p = cal.profile_from_dict(_doc())
    c = p.collectives_in_step_groups[2]["all_reduce"]
    assert c.ranks == 2 and c.segments[0].latency_s["mean"] == pytest.approx(4e-4, rel=1e-6)
    assert cal.group_timing(p, "all_reduce", 2) is c
    assert cal.group_timing(p, "all_gather", 2) is None and cal.group_timing(p, "all_reduce", 4) is None
    assert cal.profile_from_dict(json.loads(json.dumps(p.as_dict()))) == p
    assert p.as_dict()["collectives_in_step_groups"] == _doc()["collectives_in_step_groups"]
    old = _doc()
    del old["collectives_in_step_groups"]  # a profile taken before calibrate timed groups
    assert cal.profile_from_dict(old).collectives_in_step_groups is None
    assert cal.group_timing(cal.profile_from_dict(old), "all_reduce", 2) is None
    assert cal.device_profile("H100", 4).as_dict()["collectives_in_step_groups"] is None


@pytest.mark.parametrize("change, words", [
    (lambda d: d.update(collectives_in_step_groups=[1]), "'collectives_in_step_groups' is not an object"),
    (lambda d: d["collectives_in_step_groups"].update({"4": d["collectives_in_step_groups"]["2"]}),
     "collectives_in_step_groups.4 is not a group size"),  # not below the profile's 4 ranks
    (lambda d: d["collectives_in_step_groups"].update({"3": d["collectives_in_step_groups"]["2"]}),
     "collectives_in_step_groups.3 is not a group size"),  # does not divide 4
    (lambda d: d["collectives_in_step_groups"].update({"two": {}}), "collectives_in_step_groups.two is not"),
    (lambda d: d["collectives_in_step_groups"].update({"2": []}), "collectives_in_step_groups.2 is not"),
    (lambda d: d["collectives_in_step_groups"]["2"].update(broadcast={"fit": [{}]}),
     "collectives_in_step_groups.2.broadcast is not a known collective"),
    (lambda d: d["collectives_in_step_groups"]["2"]["all_reduce"].update(ranks=4),
     "collectives_in_step_groups.2 has a collective whose ranks is not 2"),
    (lambda d: d["collectives_in_step_groups"]["2"]["all_reduce"]["fit"][0]["bus_bytes_per_s"].update(mean=0),
     "bandwidth that is not a number > 0"),
    (lambda d: d["collectives_in_step_groups"]["2"]["all_reduce"]["points"][0].update(mean=-1.0),
     "collectives_in_step_groups.2.all_reduce: a point's mean and p90"),
], ids=["not-object", "size-not-below", "size-not-divisor", "size-not-integer", "not-mapping", "unknown-kind",
        "wrong-ranks", "zero-bandwidth", "negative-mean"])
def test_a_damaged_group_timing_is_refused_with_one_line(change, words):
    doc = _doc()
    change(doc)
    with pytest.raises(MeasurementError) as e:
        cal.profile_from_dict(doc, "p.json")
    assert words in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 12


@pytest.mark.slow
def test_a_4_rank_calibration_times_groups_of_2_side_by_side():
    """A quick calibration of 4 gloo processes (about 40 s on 2 busy cores) times the in-step all_reduce,
    all_gather and reduce_scatter over groups of 2 (ranks 0-1 and 2-3 at the same time), each at every message
    size rounded to the group's 4·2 bytes, with the tail of its calls; an all_reduce over a pair costs less than
    over all 4 processes (a ring of 2 moves each byte once, one of 4 three times, and has a third of the steps)."""
    pytest.importorskip("torch")
    from flopcount.measure.machine.calibrate import QUICK_SIZES, calibrate

    p = calibrate(4, QUICK_SIZES, threads=1)
    assert set(p.collectives_in_step_groups) == {2}
    pair = p.collectives_in_step_groups[2]
    assert set(pair) == {"all_reduce", "all_gather", "reduce_scatter"}
    for c in pair.values():
        assert c.ranks == 2 and [pt.size for pt in c.points] == [b - b % 8 for b in QUICK_SIZES.messages]
        assert all(pt.best <= pt.mean <= pt.slowest and pt.median <= pt.p90 <= pt.slowest for pt in c.points)
        assert cal.tail_fits(c)
    world = p.collectives_in_step["all_reduce"]
    assert [pt.size for pt in world.points] == [pt.size for pt in pair["all_reduce"].points]  # multiples of 16
    ratios = sorted(a.mean / b.mean for a, b in zip(pair["all_reduce"].points, world.points))
    assert ratios[len(ratios) // 2] < 1.0, ratios
    assert 0 < p.machine["collectives_in_step_groups_s"] < 30
    assert cal.profile_from_dict(json.loads(json.dumps(p.as_dict()))) == p
