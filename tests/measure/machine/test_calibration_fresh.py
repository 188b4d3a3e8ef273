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


def test_the_in_step_rate_is_the_bytes_of_the_outputs_kept_over_their_seconds(monkeypatch):
    """``_in_step_rates`` over a pool of k tensors: each repeat (after one warm-up repeat) calls the operator once on
    each tensor and the next one, k calls, and keeps their outputs; on a clock that advances 1 ms a reading, its rate
    is k·moved / 1 ms. ``_pool`` holds held_bytes of tensors: at least 2, at most ``most``."""
    torch = pytest.importorskip("torch")
    from flopcount.measure.machine import calibrate as cb

    n = 1000
    pool = cb._pool(lambda: torch.ones(n), 4 * n, held_bytes=40 * 4 * n)
    assert len(pool) == 40
    assert len(cb._pool(lambda: torch.ones(n), 4 * n, held_bytes=10**9, most=7)) == 7
    assert len(cb._pool(lambda: torch.ones(n), 4 * n, held_bytes=1)) == 2
    pool[1] = torch.full((n,), 2.0)
    clock = iter(range(10**6))
    monkeypatch.setattr(cb.time, "perf_counter", lambda: next(clock) * 1e-3)
    made = []

    def add(x, y):
        made.append(x + y)
        return made[-1]

    assert cb._in_step_rates(add, pool, 12 * n, 3) == pytest.approx([12 * n * 40 / 1e-3] * 3)
    assert len(made) == 4 * 40  # the warm-up repeat's calls too
    assert [float(t[0]) for t in made[:3]] == [3.0, 3.0, 2.0]  # pool[0] + pool[1], pool[1] + pool[2], ...
    assert float(made[39][0]) == 2.0  # the last with the first


def test_outputs_in_a_step_are_never_faster_than_into_a_reused_buffer():
    """Measured: an operator reading its inputs among 64 MiB of tensors and writing outputs it keeps costs at least
    what one writing into a reused buffer from the same inputs does, so every repeat of the in-step rate is below
    twice the best of 50 rates the test times for ``torch.add(a, b, out=c)`` at the same size."""
    torch = pytest.importorskip("torch")
    import time

    from flopcount.measure.machine.calibrate import _in_step_rates, _pool

    n = 2**18
    a, b, c = torch.ones(n), torch.ones(n), torch.empty(n)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a calibration runs
    try:
        reused = []
        for _ in range(50):
            t0 = time.perf_counter()
            torch.add(a, b, out=c)
            reused.append(12 * n / (time.perf_counter() - t0))
        rates = _in_step_rates(torch.add, _pool(lambda: torch.ones(n), 4 * n), 12 * n, 5)
    finally:
        torch.set_num_threads(threads)
    assert len(rates) == 5 and all(0 < r < 2 * max(reused) for r in rates), (rates, max(reused))


@pytest.mark.parametrize("ranks, threads, others, cpu_clock", [
    (1, 1, 0.0, False),  # one thread of 4 cores, nothing else: the wall clock
    (2, 2, 0.0, False),  # as many threads as cores
    (2, 2, 0.5, True),  # the machine's other load (half a core: a whole one) makes them more than the cores
    (2, 2, 0.4, False),  # less than half a core busy: none
    (2, 1, 2.0, False),  # two busy cores beside two threads: as many as the cores
    (4, 1, 0.0, False),
    (5, 1, 0.0, True),
], ids=["alone", "as-many-as-cores", "with-load", "under-half-a-core", "two-busy-cores", "four-of-four",
        "five-of-four"])
def test_work_timed_as_a_step_runs_it_is_timed_by_cpu_seconds_where_the_ranks_outnumber_the_cores(
        monkeypatch, tmp_path, ranks, threads, others, cpu_clock):
    """``measure_rank`` hands ``_compute`` the process's CPU clock where ranks × threads + the machine's other load
    (in whole cores, half a core or more counting as one) exceed the cores (4 here), the wall clock (None)
    otherwise: the rule the collectives in a step follow. A one-process group stands for the ranks (it joins no
    gloo group): the other ranks' threads are handed in with the machine's other load, which the rule adds alike."""
    torch = pytest.importorskip("torch")
    import time

    from flopcount.measure.machine import calibrate as cb
    from flopcount.measure.machine import devices

    seen = []
    monkeypatch.setattr(devices, "cpu_cores", lambda: 4)
    monkeypatch.setattr(cb, "_compute", lambda sizes, clock=None, flush_bytes=0: seen.append(clock) or {})
    threads_before = torch.get_num_threads()
    try:
        cb.measure_rank(0, 1, 0, cb.QUICK_SIZES, str(tmp_path), threads, others + (ranks - 1) * threads)
    finally:
        torch.set_num_threads(threads_before)
    assert seen == [time.process_time if cpu_clock else None]


def test_the_in_step_rates_read_the_clock_they_are_given():
    """``_in_step_rates`` times its repeats on the clock handed to it: a clock that advances 2 s a reading gives each
    repeat's k calls 2 s."""
    pytest.importorskip("torch")
    from flopcount.measure.machine import calibrate as cb

    clock = iter(range(0, 10**6, 2))
    rates = cb._in_step_rates(lambda a, b: a, [1, 2, 3], 10.0, 2, clock=lambda: next(clock))
    assert rates == pytest.approx([3 * 10.0 / 2] * 2)


def test_a_repeat_another_clock_cannot_see_is_timed_by_the_wall_clock():
    """A CPU clock too coarse to see a repeat (it stands still) gives no rate of 1/0: the repeat's wall-clock
    seconds are used, so every rate is positive and finite."""
    pytest.importorskip("torch")
    import math

    from flopcount.measure.machine import calibrate as cb

    rates = cb._in_step_rates(lambda a, b: a, [1, 2, 3], 10.0, 2, clock=lambda: 5.0)
    assert len(rates) == 2 and all(0 < r < math.inf for r in rates)
