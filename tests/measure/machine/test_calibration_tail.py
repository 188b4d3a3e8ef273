"""The tail of a collective's calls in a step: the mean and the 90th percentile of a list of calls' seconds (written
out by hand), their fits beside the median's (lines recovered from points on them), a profile with them reading
back equal, one taken before they were recorded loading without them, and each damaged figure refused in one line
(exit 12)."""

from __future__ import annotations

import json

import pytest

from flopcount.errors import MeasurementError
from flopcount.measure.machine import calibration as cal
from flopcount.measure.machine.calibrate import tail_stats


def test_mean_and_90th_percentile_of_heavy_tailed_calls():
    # 17 calls of 0.3 ms and 3 of 5 ms: the mean (17·0.3 + 3·5) / 20 = 1.005 ms; the 90th percentile is the
    # ⌈0.9·20⌉ = 18th smallest call, the first of the slow ones
    mean, p90 = tail_stats([0.3e-3] * 17 + [5e-3] * 3)
    assert mean == pytest.approx(1.005e-3) and p90 == 5e-3
    # 10 calls, one slow: the 9th smallest is a fast one, and the mean (9·1 + 11) / 10 = 2
    assert tail_stats([1.0] * 9 + [11.0]) == (pytest.approx(2.0), 1.0)
    # order does not matter: 1..10 shuffled, mean 5.5, 9th smallest 9
    assert tail_stats([7.0, 2.0, 10.0, 1.0, 9.0, 4.0, 3.0, 8.0, 6.0, 5.0]) == (pytest.approx(5.5), 9.0)


def _points(sizes=(1024, 8192, 65536, 1 << 19, 1 << 20, 1 << 22, 1 << 24)) -> list[cal.Point]:
    # over 2 ranks (bus factor 2·1/2 = 1): median 0.2 ms + B / 2 GB/s, mean 1 ms + B / 1 GB/s, p90 4 ms + B / 0.5 GB/s
    return [cal.Point(b, 2e-4 + b / 2e9, 1e-4 + b / 4e9, 9e-3 + b / 1e8, 1e-3 + b / 1e9, 4e-3 + b / 5e8)
            for b in sizes]


def test_the_mean_and_p90_are_fitted_as_the_median_is():
    segs = cal.fit_segments("all_reduce", 2, _points())
    assert len(segs) == 3  # up to 64 KiB, up to 1 MiB, and above
    for s in segs:
        assert s.latency_s["mean"] == pytest.approx(1e-3, rel=1e-6)
        assert s.bus_bytes_per_s["mean"] == pytest.approx(1e9, rel=1e-6)
        assert s.latency_s["p90"] == pytest.approx(4e-3, rel=1e-6)
        assert s.bus_bytes_per_s["p90"] == pytest.approx(5e8, rel=1e-6)
        assert s.latency_s["median"] == pytest.approx(2e-4, rel=1e-6)
    c = cal.Collective(2, tuple(_points()), segs)
    assert cal.tail_fits(c)
    assert cal.collective_seconds(c, "all_reduce", 1 << 19, 2, "mean")[0] == pytest.approx(1e-3 + (1 << 19) / 1e9)
    # a tight loop's points have no tail: no such fit
    plain = [cal.Point(p.size, p.median, p.best, p.slowest) for p in _points()]
    plain_c = cal.Collective(2, tuple(plain), cal.fit_segments("all_reduce", 2, plain))
    assert not cal.tail_fits(plain_c) and "mean" not in plain_c.segments[0].latency_s


def _doc() -> dict:
    doc = cal.device_profile("H100", 8).as_dict()
    pts = tuple(_points())
    doc["collectives_in_step"] = {"all_reduce": cal.Collective(2, pts, cal.fit_segments("all_reduce", 2, pts))
                                  .as_dict("all_reduce")}
    return doc


def test_a_profile_with_the_tail_reads_back_equal_and_one_without_it_loads():
    doc = json.loads(json.dumps(_doc()))
    assert doc["collectives_in_step"]["all_reduce"]["points"][0]["p90"] == pytest.approx(4e-3 + 1024 / 5e8)
    p = cal.profile_from_dict(doc)
    assert p.as_dict() == doc and cal.tail_fits(p.collectives_in_step["all_reduce"])
    for pt in doc["collectives_in_step"]["all_reduce"]["points"]:  # as calibrate wrote it before the tail
        del pt["mean"], pt["p90"]
    for s in doc["collectives_in_step"]["all_reduce"]["fit"]:
        for k in ("latency_s", "bus_bytes_per_s"):
            del s[k]["mean"], s[k]["p90"]
    old = cal.profile_from_dict(doc).collectives_in_step["all_reduce"]
    assert not cal.tail_fits(old) and old.points[0].mean is None and old.points[0].p90 is None


@pytest.mark.parametrize("where, key, value, words", [
    ("points", "mean", -1.0, "a point's mean and p90 are numbers >= 0"),
    ("points", "p90", "4 ms", "a point's mean and p90 are numbers >= 0"),
    ("points", "p90", float("nan"), "a point's mean and p90 are numbers >= 0"),
    ("latency_s", "p90", None, "mean and p90 both or neither"),  # the key deleted: one of the two without the other
    ("bus_bytes_per_s", "mean", 0.0, "a bandwidth that is not a number > 0"),
    ("latency_s", "mean", -1e-3, "a latency that is not a number >= 0"),
])
def test_a_damaged_tail_is_refused_with_one_line(where, key, value, words):
    doc = _doc()
    c = doc["collectives_in_step"]["all_reduce"]
    target = c["points"][0] if where == "points" else c["fit"][0][where]
    if value is None:
        del target[key]
    else:
        target[key] = value
    with pytest.raises(MeasurementError) as e:
        cal.profile_from_dict(doc, "p.json")
    assert words in str(e.value) and "collectives_in_step.all_reduce" in str(e.value)
    assert "\n" not in str(e.value) and e.value.exit_code == 12
