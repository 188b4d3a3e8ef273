"""The profile's elementwise work into fresh memory (``compute.elementwise_fresh``): a profile with it reads back
equal, one taken before it was measured loads without it, a damaged one is refused with one line (exit 12), the
size the fresh rate applies from (``fresh_from``) follows its rule written out here, and the calibration's timing
is that of the same calls timed by the test."""

from __future__ import annotations

import json
import math

import pytest

from flopcount.errors import MeasurementError
from flopcount.measure.machine import calibration as cal


def _point(size: float, median: float, slowest: float | None = None) -> dict:
    return {"size": size, "median": median, "best": median * 1.1, "slowest": median if slowest is None else slowest}


def _doc(reused: list[dict], fresh: list[dict] | None) -> dict:
    doc = cal.device_profile("H100", 8).as_dict()
    doc["compute"]["elementwise"] = reused
    if fresh is not None:
        doc["compute"]["elementwise_fresh"] = fresh
    return doc


REUSED = [_point(s, 100e9, 90e9) for s in (1e3, 1e4, 1e5, 1e6, 1e7)]


def test_fresh_timing_reads_back_and_absent_is_none():
    doc = _doc(REUSED, [_point(s, 50e9) for s in (1e3, 1e7)])
    p = cal.profile_from_dict(doc)
    assert [pt.size for pt in p.compute["elementwise_fresh"]] == [1e3, 1e7]
    assert cal.profile_from_dict(json.loads(json.dumps(p.as_dict()))) == p
    old = cal.profile_from_dict(_doc(REUSED, None))
    assert "elementwise_fresh" not in old.compute and cal.fresh_from(old) is None


@pytest.mark.parametrize("value, words", [
    ([], "compute.elementwise_fresh has no points"),
    ([_point(1e3, 0.0)], "compute.elementwise_fresh has a rate of 0"),
    ([{"size": 1e3, "median": math.nan, "best": 1.0, "slowest": 1.0}], "numbers >= 0"),
    ("fast", "compute.elementwise_fresh has no points"),
], ids=["no-points", "zero-rate", "nan", "text"])
def test_damaged_fresh_timing_is_refused_with_one_line(value, words):
    with pytest.raises(MeasurementError) as e:
        cal.profile_from_dict(_doc(REUSED, value), "p.json")
    assert words in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 12


@pytest.mark.parametrize("fresh, expected", [
    # below the reused rate's slowest repeat (90e9) from 1e5 on: the fresh rate applies from 1e5
    ([(1e3, 95e9), (1e4, 91e9), (1e5, 60e9), (1e6, 30e9), (1e7, 10e9)], 1e5),
    # slower at 1e4 but not at 1e5: only from the size after which every larger one is slower
    ([(1e3, 95e9), (1e4, 50e9), (1e5, 95e9), (1e6, 30e9), (1e7, 10e9)], 1e6),
    ([(1e3, 95e9), (1e7, 91e9)], None),  # never slower: no size
    ([(1e3, 20e9), (1e7, 10e9)], 1e3),  # slower everywhere
], ids=["from-1e5", "last-run", "never", "everywhere"])
def test_fresh_from_is_the_smallest_size_from_which_fresh_is_slower(fresh, expected):
    p = cal.profile_from_dict(_doc(REUSED, [_point(s, r) for s, r in fresh]))
    assert cal.fresh_from(p) == expected


def test_the_fresh_rate_is_that_of_new_outputs_kept():
    """``_fresh_rates`` of a 1 MiB output: each repeat's rate within 3× of the test's own timing of the same
    pattern (64 new outputs of a + b kept, 12 bytes an element moved)."""
    torch = pytest.importorskip("torch")
    import time

    from flopcount.measure.machine.calibrate import _fresh_rates

    n = 2**18
    a, b = torch.ones(n), torch.ones(n)
    assert bool((torch.add(a, b) == 2).all())
    rates = _fresh_rates(a, b, 5, held_bytes=64 * 4 * n)
    own = []
    for _ in range(5):
        kept = []
        t0 = time.perf_counter()
        for _ in range(64):
            kept.append(a + b)
        own.append(12 * n * 64 / (time.perf_counter() - t0))
        del kept  # nothing allocated after the outputs: their memory is freed as the calibration's is
    mid = sorted(own)[2]
    assert len(rates) == 5 and mid / 3 <= sorted(rates)[2] <= 3 * mid
