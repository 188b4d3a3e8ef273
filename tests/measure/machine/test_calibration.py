"""Machine profiles: the collectives' fit against its closed form, interpolation of rates by size, every check of a
damaged or foreign profile (exit 12 with one line), the warning line of a profile from elsewhere, the datasheet
profiles, and a quick calibration of two gloo processes."""

from __future__ import annotations

import json
import math

import pytest

from flopcount.errors import MeasurementError, UsageError
from flopcount.measure.machine import calibration as cal
from flopcount.measure.machine.calibration import Point


def _line(a: float, bw: float, kind: str, n: int, sizes) -> list[Point]:
    """Points exactly on latency a + factor·B / bw, with factor nccl-tests' for ``kind`` over ``n`` ranks."""
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "send_recv": 1.0}[kind]
    return [Point(b, a + factor * b / bw, a + factor * b / bw, a + factor * b / bw) for b in sizes]


@pytest.mark.parametrize("kind, n", [("all_reduce", 4), ("all_gather", 3), ("send_recv", 2)])
def test_fit_recovers_latency_and_bus_bandwidth(kind, n):
    a_small, bw_small, a_large, bw_large = 40e-6, 0.5e9, 300e-6, 3e9
    pts = _line(a_small, bw_small, kind, n, (1024, 8192, 65536)) + _line(a_large, bw_large, kind, n,
                                                                          (262144, 1 << 20, 4 << 20))
    small, large = cal.fit_segments(kind, n, pts)
    assert small.latency_s["median"] == pytest.approx(a_small, rel=1e-6)
    assert small.bus_bytes_per_s["median"] == pytest.approx(bw_small, rel=1e-6)
    assert large.latency_s["best"] == pytest.approx(a_large, rel=1e-6)
    assert large.bus_bytes_per_s["best"] == pytest.approx(bw_large, rel=1e-6)
    coll = cal.Collective(n, tuple(pts), (small, large))
    b = 2 << 20  # in the large range: latency + factor·B/bw
    factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "send_recv": 1.0}[kind]
    t, outside = cal.collective_seconds(coll, kind, b, n)
    assert t == pytest.approx(a_large + factor * b / bw_large) and not outside
    assert cal.collective_seconds(coll, kind, 64 << 20, n)[1]  # past the largest size: extrapolated
    assert cal.collective_seconds(coll, kind, b, 1) == (0.0, False)  # one rank sends nothing


def test_the_fit_has_a_range_up_to_64_kib_one_up_to_1_mib_and_one_above():
    """Three lines, one a range: each range's fit is its own line, and a message is timed by the range it falls in
    (a payload on a bound falls below it); a range with one point joins the one below."""
    lines = ((20e-6, 0.2e9, (64, 4096, 65536)), (900e-6, 0.6e9, (131072, 524288, 1 << 20)),
             (300e-6, 2e9, (2 << 20, 8 << 20, 32 << 20)))
    pts = [p for a, bw, sizes in lines for p in _line(a, bw, "all_reduce", 2, sizes)]
    segs = cal.fit_segments("all_reduce", 2, pts)
    assert [(s.low, s.high) for s in segs] == [(64, 65536), (65536, 1 << 20), (1 << 20, 32 << 20)]
    for s, (a, bw, _) in zip(segs, lines):
        assert s.latency_s["median"] == pytest.approx(a, rel=1e-6)
        assert s.bus_bytes_per_s["median"] == pytest.approx(bw, rel=1e-6)
    coll = cal.Collective(2, tuple(pts), segs)
    # over 2 ranks the bus factor is 2·1/2 = 1
    assert cal.collective_seconds(coll, "all_reduce", 1 << 20, 2)[0] == pytest.approx(900e-6 + (1 << 20) / 0.6e9)
    assert cal.collective_seconds(coll, "all_reduce", 3 << 19, 2)[0] == pytest.approx(300e-6 + (3 << 19) / 2e9)
    one_above = pts[:6] + pts[6:7]  # 2 MiB alone above 1 MiB: fitted with the range below
    assert [(s.low, s.high) for s in cal.fit_segments("all_reduce", 2, one_above)] == [(64, 65536),
                                                                                      (65536, 2 << 20)]


def test_all_reduce_over_n_ranks_closed_form():
    lat, bw, n, b = 1e-4, 2e9, 8, 3 << 20
    seg = cal.Segment(0, math.inf, {"median": lat}, {"median": bw})
    t, _ = cal.collective_seconds(cal.Collective(n, (), (seg,)), "all_reduce", b, n)
    assert t == pytest.approx(lat + 2 * (n - 1) / n * b / bw)  # 2(n-1)/n: the bus bytes of a ring all_reduce


def test_rate_interpolates_in_log_size():
    pts = (Point(64, 10.0, 12.0, 8.0), Point(256, 30.0, 36.0, 24.0))
    assert cal.rate_at(pts, 128) == (pytest.approx(20.0), False)  # log2: halfway from 64 to 256
    assert cal.rate_at(pts, 128, "best") == (pytest.approx(24.0), False)
    assert cal.rate_at(pts, 1024) == (30.0, True)  # beyond: the nearest, flagged
    assert cal.rate_at(pts, 16) == (10.0, True)
    assert cal.rate_at(pts, 64) == (10.0, False)


def _good() -> dict:
    return cal.device_profile("H100", 8).as_dict()


def _damage(doc: dict, path: tuple, value) -> dict:
    d = doc
    for k in path[:-1]:
        d = d[k]
    if value is KeyError:
        del d[path[-1]]
    else:
        d[path[-1]] = value
    return doc


@pytest.mark.parametrize("path, value, words", [
    (("format",), "something-else", "not a flopcount machine profile"),
    (("version",), 99, "format version 99"),
    (("compute", "gemm"), KeyError, "compute.gemm is missing"),
    (("compute", "gemm"), [], "compute.gemm has no points"),
    (("compute", "elementwise", 0, "median"), -1.0, "numbers >= 0"),
    (("overhead",), KeyError, "'overhead' is missing"),
    (("collectives", "broadcast"), {"fit": []}, "collectives.broadcast"),
    (("collectives", "all_reduce", "fit", 0, "bus_bytes_per_s", "median"), 0, "bandwidth that is not a number > 0"),
    (("collectives", "all_reduce", "fit", 0, "bus_bytes_per_s", "best"), math.nan, "not a number > 0"),
    (("collectives", "all_reduce", "fit", 0, "latency_s", "best"), -1e-6, "latency that is not a number >= 0"),
    (("collectives", "all_reduce", "fit", 0, "latency_s", "best"), "1us", "latency that is not a number >= 0"),
    (("collectives", "all_reduce", "ranks"), "eight", "needs ranks (an integer >= 0)"),
    (("peak_flops_per_s",), 0, "must be finite numbers > 0"),
    (("peak_flops_per_s",), math.nan, "must be finite numbers > 0"),
    (("peak_flops_per_s",), math.inf, "must be finite numbers > 0"),
    (("compute", "gemm", 0, "best"), 0.0, "compute.gemm has a rate of 0"),
    (("compute", "gemm", 0, "median"), math.nan, "numbers >= 0"),
    (("load_per_core",), "high", "load_per_core"),
    (("machine",), ["cpu"], "machine"),
    (("calibrated",), "yes", "'calibrated' is missing or not a bool"),
], ids=["foreign", "version", "no-gemm", "empty-gemm", "negative", "no-overhead", "unknown-collective",
        "zero-bandwidth", "nan-bandwidth", "negative-latency", "text-latency", "text-ranks", "zero-peak", "nan-peak",
        "inf-peak", "zero-rate", "nan-rate", "text-load", "list-machine", "calibrated-not-bool"])
def test_damaged_profiles_are_refused_with_one_line(path, value, words):
    with pytest.raises(MeasurementError) as e:
        cal.profile_from_dict(_damage(_good(), path, value), "p.json")
    assert words in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 12


def test_a_nan_written_by_json_is_refused_from_the_file(tmp_path, capsys, save):
    """Python's json writes NaN and reads it back: the loaded file is refused all the same, exit 12 on the command
    line with one line on stderr."""
    from flopcount.cli import main

    doc = _good()
    doc["compute"]["elementwise"][0]["best"] = math.nan
    bad = tmp_path / "nan.json"
    bad.write_text(json.dumps(doc))
    assert "NaN" in bad.read_text()
    with pytest.raises(MeasurementError, match="compute.elementwise: a point needs"):
        cal.load_profile(str(bad))
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(MeasurementError, match="not JSON"):
        cal.load_profile(str(binary))
    from helpers import single

    model = save(single("Relu", {"x": (4, 4)}))
    for path in (bad, binary):
        assert main([model, "--predict", "--machine", str(path)]) == 12
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and str(path) in err[0], err


def test_load_profile_of_bad_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for path, words in ((bad, "not JSON"), (tmp_path / "absent.json", "cannot read it")):
        with pytest.raises(MeasurementError, match=words):
            cal.load_profile(str(path))
    good = tmp_path / "good.json"
    good.write_text(json.dumps(_good()))
    assert cal.load_profile(str(good)) == cal.device_profile("H100", 8)


def test_a_profile_from_elsewhere_is_named_in_one_line():
    doc = _good()
    doc["calibrated"], doc["machine"], doc["torch"] = True, {"cpu": "X", "cores": 2}, "2.0"
    p = cal.profile_from_dict(doc)
    assert cal.differences(p, {"cpu": "X", "cores": 2, "torch": "2.0"}, 8) is None
    line = cal.differences(p, {"cpu": "Y", "cores": 2, "torch": "2.1"}, 4)
    assert "\n" not in line
    for words in ("cpu 'X' (here 'Y')", "torch 2.0 (here 2.1)", "8 ranks (this plan runs 4)", "--ranks 4"):
        assert words in line
    # the device and the run's threads per rank, when the run gives them (the meter does: it knows its threads)
    doc["machine"]["threads_per_rank"] = 1
    p = cal.profile_from_dict(doc)
    line = cal.differences(p, {"device": "cuda", "cpu": "X", "cores": 2, "threads_per_rank": 2, "torch": "2.0"}, 8)
    assert "device 'H100 SXM' (here 'cuda')" in line and "threads_per_rank 1 (here 2)" in line
    assert "cpu" not in line.split("; ")[0].replace("device", "")  # only what differs is named
    here = cal.this_machine(threads=3)
    assert here["threads_per_rank"] == 3 and here["device"] == "cpu" and here["cores"] >= 1


def test_datasheet_profiles():
    from flopcount.measure.machine.devices import gpu_entry

    p = cal.device_profile("A100", 16, "bf16")
    assert not p.calibrated and p.peak_flops_per_s == gpu_entry("A100").peaks["bf16"] == 312e12
    assert p.compute["elementwise"][0].best == 2.039e12
    assert p.collectives["all_reduce"].segments[0].bus_bytes_per_s["best"] == 600e9 / 2
    # no datasheet gives a collective's latency: null, with its reason, never an assumed figure
    assert all(v is None for c in p.collectives.values() for s in c.segments for v in s.latency_s.values())
    assert not cal.latency_known(p) and cal.LATENCY_UNKNOWN in p.sources
    seconds, _ = cal.collective_seconds(p.collectives["all_reduce"], "all_reduce", 1e6, 8)
    assert seconds == pytest.approx(2 * 7 / 8 * 1e6 / (600e9 / 2))  # the bus term alone: a lower bound
    assert json.loads(json.dumps(p.as_dict()))["collectives"]["all_reduce"]["fit"][0]["latency_s"]["best"] is None
    with pytest.raises(UsageError, match="no published bandwidths"):
        cal.device_profile("T4")
    with pytest.raises(UsageError, match="no fp8 peak"):
        cal.device_profile("A100", 8, "fp8")


def test_quick_calibration_of_two_gloo_processes():
    pytest.importorskip("torch")
    from flopcount.measure.machine.calibrate import QUICK_SIZES, calibrate

    p = calibrate(2, QUICK_SIZES, threads=1)
    assert p.calibrated and p.ranks == 2 and p.machine["threads_per_rank"] == 1
    assert set(p.collectives) == set(cal.COLLECTIVES)
    for kind, c in p.collectives.items():
        assert [pt.size for pt in c.points] == [b - b % 8 for b in QUICK_SIZES.messages]
        assert all(pt.best <= pt.median <= pt.slowest for pt in c.points)  # seconds
        assert all(s.bus_bytes_per_s["median"] > 0 for s in c.segments)
    assert [pt.size for pt in p.compute["gemm"]] == list(QUICK_SIZES.gemm)
    assert all(pt.slowest <= pt.median <= pt.best for pt in p.compute["gemm"])  # rates
    assert [pt.size for pt in p.compute["gemm_in_cache"]] == list(QUICK_SIZES.gemm)
    assert p.peak_flops_per_s == max(pt.best for pt in p.compute["gemm_in_cache"])  # the peak: operands in cache
    # FSDP2's own work around a gather of four square weights of 64 KiB (64²·4 float32) and 256 KiB (128²·4): the
    # payload of each, a rate of it per second
    assert [pt.size for pt in p.compute["fsdp_copy"]] == [4 * 64 * 64 * 4, 4 * 128 * 128 * 4]
    assert all(0 < pt.slowest <= pt.median <= pt.best for pt in p.compute["fsdp_copy"])
    assert cal.profile_from_dict(json.loads(json.dumps(p.as_dict()))) == p


def test_the_fit_weighs_each_message_by_its_relative_error():
    """Points off a line (a large message's time 20% under it, as a noisy repeat gives): the fit is numpy's weighted
    least squares of t against x with weights 1/t (its residuals divided by t: the relative error), so that the
    small messages of a range are not sacrificed to its largest."""
    np = pytest.importorskip("numpy")
    sizes = [2 << 20, 4 << 20, 8 << 20, 16 << 20, 64 << 20]
    ts = [1e-3 + b / 1e9 for b in sizes]
    ts[-1] *= 0.8
    pts = [Point(b, t, t, t) for b, t in zip(sizes, ts)]
    # the ranges up to 64 KiB and up to 1 MiB, fitted apart
    tiny = [Point(b, 1e-4, 1e-4, 1e-4) for b in (1024, 4096, 128 << 10, 512 << 10)]
    *_, seg = cal.fit_segments("send_recv", 2, [*tiny, *pts])
    assert seg.low == 512 << 10 and seg.high == 64 << 20
    slope, intercept = np.polyfit(sizes, ts, 1, w=[1 / t for t in ts])
    assert seg.latency_s["best"] == pytest.approx(intercept, rel=1e-6)
    assert seg.bus_bytes_per_s["best"] == pytest.approx(1 / slope, rel=1e-6)
    fitted = [cal.collective_seconds(cal.Collective(2, tuple(pts), (seg,)), "send_recv", b, 2, "best")[0]
              for b in sizes]
    assert abs(fitted[1] / ts[1] - 1) < 0.1  # 4 MiB within 10%: an unweighted line misses it by far more
    unweighted = np.polyfit(sizes, ts, 1)
    assert abs(np.polyval(unweighted, sizes[1]) / ts[1] - 1) > abs(fitted[1] / ts[1] - 1)
