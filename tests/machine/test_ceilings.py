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
