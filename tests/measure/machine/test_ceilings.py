"""``flopcount ceilings``: measured GEMM, convolution, copy and all-reduce ceilings and their JSON."""

from __future__ import annotations

import json

import pytest

from flopcount.cli import main
from flopcount.measure.machine.ceilings import load_ceilings

torch = pytest.importorskip("torch")


@pytest.mark.slow
def test_quick_ceilings_json(tmp_path):
    out = tmp_path / "c.json"
    assert main(["ceilings", "--quick", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == 1 and doc["device"]["kind"] == "cpu" and doc["ranks"] == 1
    gemm, conv, memory = doc["gemm"]["fp32"], doc["conv"]["fp32"], doc["memory_bandwidth"]
    # quick sizes: GEMM 256 or 512 (2·n³ FLOPs), CONV 2x64x28x28 with a 3x3 kernel, a 32 MiB copy
    assert gemm["n"] in (256, 512) and conv["shape"] == [2, 64, 28, 28]
    assert memory["message_bytes"] == 32 * 2**20
    assert 1e7 < gemm["flops_per_s"] < 1e13 and 1e7 < conv["flops_per_s"] < 1e13 and 1e7 < memory["bytes_per_s"]
    assert doc["allreduce_bandwidth"] is None and "torchrun" in doc["unavailable"]["allreduce_bandwidth"]
    c = load_ceilings(str(out))
    assert c.compute("fp32").value == max(gemm["flops_per_s"], conv["flops_per_s"])


def test_allreduce_bus_bandwidth_over_two_gloo_ranks():
    """Two gloo ranks (threads of this process sharing an in-memory store) all-reduce 1 MiB."""
    import threading

    import torch.distributed as dist

    from flopcount.measure.machine.ceilings import measure_allreduce

    store, results = dist.HashStore(), {}

    def rank(r: int) -> None:
        results[r] = measure_allreduce(mib=1, repeats=3, group=dist.ProcessGroupGloo(store, r, 2))

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    a, b = results[0], results[1]
    assert a.kind == "allreduce" and a.ranks == 2 and a.backend == "gloo"
    assert a.message_bytes == 2**20  # 1 MiB of fp32
    assert a.bytes_per_s == b.bytes_per_s > 0  # both ranks report the slowest rank's time


def test_allreduce_without_distributed_is_a_device_error():
    from flopcount.errors import DeviceError
    from flopcount.measure.machine.ceilings import measure_allreduce

    with pytest.raises(DeviceError, match="torchrun"):
        measure_allreduce()


def test_cached_gemm_keeps_the_harness_interface():
    from flopcount.measure.machine.ceilings import GemmCeiling, cached_gemm, measured_cpu_device

    g = cached_gemm("cpu", "fp32")
    assert isinstance(g, GemmCeiling) and g.dtype == "fp32" and g.flops_per_s > 0
    assert measured_cpu_device().peak("fp32").flops_per_s == g.flops_per_s  # the harness's CPU peak is this ceiling


def test_gemm_ceiling_is_the_best_repeat_with_its_spread():
    from flopcount.measure.machine.ceilings import MIN_PRODUCT_S, measure_gemm

    g = measure_gemm("cpu", "fp32", sizes=(128, 1024), repeats=4, budget_s=30.0)
    n3 = 2 * g.n ** 3
    assert g.flops_per_s >= g.median_flops_per_s >= g.min_flops_per_s > 0  # max, median, min over repeats
    # each rate is 2 n^3 over one repeat's seconds; the chosen size's median product lasts MIN_PRODUCT_S or more
    # (a 1024^3 product is 2.1 GFLOP: >= 10 ms below 215 GFLOP/s), unless none did
    assert n3 / g.median_flops_per_s >= MIN_PRODUCT_S or g.n == 1024
    assert "best of" in g.describe() and "median" in g.describe()


def test_cached_ceiling_stays_until_beaten_never_remeasured_for_load(tmp_path, monkeypatch):
    from flopcount.measure.machine import ceilings

    monkeypatch.setenv("FLOPCOUNT_CACHE", str(tmp_path))

    def record(rate, load):
        return ceilings.GemmCeiling("cpu", "fp32", rate, 1024, 7, 2, "t", load, rate * 0.9, rate * 0.8)

    measured = []
    monkeypatch.setattr(ceilings, "measure_gemm", lambda *a, **k: measured.append(1) or record(400e9, 2.0))
    monkeypatch.setattr(ceilings, "load_per_core", lambda: 0.1)  # quiet now, busy when measured: kept anyway
    assert ceilings.cached_gemm("cpu", "fp32").flops_per_s == 400e9 and measured == [1]
    assert ceilings.cached_gemm("cpu", "fp32").flops_per_s == 400e9 and measured == [1]  # from the cache
    assert ceilings.offer_ceiling("gemm", record(390e9, 0.0), "cpu", "fp32") is False  # lower: not kept
    assert ceilings.cached_gemm("cpu", "fp32").flops_per_s == 400e9
    assert ceilings.offer_ceiling("gemm", record(442e9, 0.0), "cpu", "fp32") is True  # beaten: replaced
    assert ceilings.cached_gemm("cpu", "fp32").flops_per_s == 442e9 and measured == [1]
    best, note = ceilings.best_gemm(record(300e9, 0.0))  # flopcount ceilings measuring less reports the best
    assert best.flops_per_s == 442e9 and "above the 300.0 GFLOP/s measured now" in note


def test_onnxruntime_gemm_ceiling_is_its_own_best_sustained_rate():
    pytest.importorskip("onnxruntime")
    from flopcount.measure.machine.ceilings import measure_ort_gemm

    g = measure_ort_gemm("fp32", threads=1, sizes=(256, 512), repeats=3, budget_s=2.0)
    assert (g.framework, g.threads, g.dtype, g.device) == ("onnxruntime", 1, "fp32", "cpu")
    assert g.n in (256, 512) and g.repeats >= 1
    assert g.flops_per_s >= g.median_flops_per_s >= g.min_flops_per_s > 0  # the best repeat, then its spread
    assert "onnxruntime" in g.describe()
    with pytest.raises(RuntimeError, match="fp32 only"):
        measure_ort_gemm("bf16")
