"""The profile's collectives timed in a step (``collectives_in_step``): a profile with them reads back equal, one
taken before they were measured loads with the field null, every damaged figure is refused with one line (exit 12),
and a quick calibration of two gloo processes finds each all_reduce in a step (after a burst of compute) at least as
long as the same call's fastest repeat in a tight loop, timed here in the test's own processes."""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import statistics
import time

import pytest

from flopcount.errors import MeasurementError
from flopcount.measure.machine import calibration as cal


def _with_in_step() -> dict:
    doc = cal.device_profile("H100", 8).as_dict()
    doc["collectives_in_step"] = {"all_reduce": {
        "ranks": 2, "points": [{"size": 4096, "median": 4e-4, "best": 3e-4, "slowest": 5e-4}],
        "fit": [{"from_bytes": 4096, "to_bytes": 65536, "latency_s": {"median": 4e-4, "best": 3e-4, "slowest": 5e-4},
                 "bus_bytes_per_s": {"median": 1e9, "best": 2e9, "slowest": 5e8}}]}}
    return doc


def test_in_step_collectives_read_back_and_absent_is_null():
    doc = _with_in_step()
    p = cal.profile_from_dict(doc)
    ar = p.collectives_in_step["all_reduce"]
    assert ar.ranks == 2 and ar.points[0].best == 3e-4 and ar.segments[0].bus_bytes_per_s["best"] == 2e9
    assert cal.profile_from_dict(json.loads(json.dumps(p.as_dict()))) == p
    del doc["collectives_in_step"]
    assert cal.profile_from_dict(doc).collectives_in_step is None
    doc["collectives_in_step"] = None
    assert cal.profile_from_dict(doc).collectives_in_step is None
    assert cal.device_profile("H100", 8).as_dict()["collectives_in_step"] is None  # a datasheet measures none


@pytest.mark.parametrize("path, value, words", [
    ((), [], "'collectives_in_step' is not an object"),
    (("broadcast",), {"fit": [{}]}, "collectives_in_step.broadcast is not a known collective"),
    (("all_reduce", "fit"), [], "collectives_in_step.all_reduce is not a known collective with a fit"),
    (("all_reduce", "ranks"), -2, "collectives_in_step.all_reduce needs ranks"),
    (("all_reduce", "fit", 0, "bus_bytes_per_s", "best"), 0, "bandwidth that is not a number > 0"),
    (("all_reduce", "fit", 0, "latency_s", "median"), math.nan, "latency that is not a number >= 0"),
    (("all_reduce", "points", 0, "best"), -1.0, "collectives_in_step.all_reduce: a point needs"),
], ids=["not-object", "unknown", "no-fit", "negative-ranks", "zero-bandwidth", "nan-latency", "negative-point"])
def test_damaged_in_step_timing_is_refused_with_one_line(path, value, words):
    doc = _with_in_step()
    if not path:
        doc["collectives_in_step"] = value
    else:
        d = doc["collectives_in_step"]
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    with pytest.raises(MeasurementError) as e:
        cal.profile_from_dict(doc, "p.json")
    assert words in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tight_loop(rank: int, port: int, sizes: tuple[int, ...], out: str) -> None:
    """The test's own tight loop: each size's all_reduce 9 times back to back after one barrier; the fastest call's
    wall-clock seconds and the fastest call's CPU seconds of the process (every thread), each size."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    fastest = {}
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        dist.barrier()
        times, cpus = [], []
        for _ in range(9):
            t0, c0 = time.perf_counter(), time.process_time()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        fastest[nbytes] = {"wall": min(times[2:]), "cpu": min(cpus[2:])}
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(fastest, f)


def test_a_collective_in_a_step_costs_at_least_its_tight_loop(tmp_path):
    pytest.importorskip("torch")
    import torch.multiprocessing as mp

    from flopcount.measure.machine.calibrate import QUICK_SIZES, calibrate
    from flopcount.measure.machine.devices import cpu_cores

    sizes = tuple(b - b % 8 for b in QUICK_SIZES.messages)
    out = os.path.join(tmp_path, "tight.json")
    mp.start_processes(_tight_loop, args=(_free_port(), sizes, out), nprocs=2, start_method="spawn")
    with open(out, encoding="utf-8") as f:
        tight = {int(k): v for k, v in json.load(f).items()}
    p = calibrate(2, QUICK_SIZES, threads=1)
    assert set(p.collectives_in_step) == set(cal.COLLECTIVES)
    in_step = p.collectives_in_step["all_reduce"]
    assert [pt.size for pt in in_step.points] == list(sizes)
    assert all(pt.best <= pt.median <= pt.slowest for pt in in_step.points)
    # each size timed enough to see its tail: the mean and the 90th percentile of its calls between the extremes
    assert all(pt.best <= pt.mean <= pt.slowest and pt.median <= pt.p90 <= pt.slowest for pt in in_step.points)
    assert cal.tail_fits(in_step) and not cal.tail_fits(p.collectives["all_reduce"])
    # the median in a step against the fastest tight-loop call, the same size (cores: one each, or shared), by the
    # clock the calibration timed the step's calls with: their CPU seconds alone where the ranks' threads and the
    # machine's other load outnumber the cores (the wall clock then holds other processes' turns), else the larger
    # of the wall clock and the CPU seconds
    clock = p.machine.get("collectives_in_step_clock")
    assert clock in ("cpu", "wall_or_cpu")

    def reference(size: int) -> float:
        t = tight[size]
        return t["cpu"] if clock == "cpu" else t["wall"]

    got = [pt.median / reference(int(pt.size)) for pt in in_step.points]
    assert statistics.median(got) >= 1.0, (got, clock, cpu_cores())
    assert cal.profile_from_dict(json.loads(json.dumps(p.as_dict()))) == p
