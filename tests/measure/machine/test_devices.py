"""Devices and peaks: recognition from the driver's name, dense peaks, MFU's dtype of the work."""

from __future__ import annotations

import pytest

from flopcount.measure.harness import mfu
from flopcount.measure.machine import ceilings, devices
from flopcount.measure.machine.devices import Device, Peak, gpu_device, gpu_entry

T = 1e12


@pytest.mark.parametrize("name, key", [
    pytest.param("NVIDIA L40S", "L40S", id="L40S-is-not-L4"),
    pytest.param("NVIDIA L4", "L4", id="L4"),
    pytest.param("NVIDIA L40", "L40", id="L40"),
    pytest.param("NVIDIA H100 80GB HBM3", "H100 SXM", id="H100-SXM"),
    pytest.param("NVIDIA H100 PCIe", "H100 PCIe", id="H100-PCIe"),
    pytest.param("NVIDIA H100 NVL", "H100 NVL", id="H100-NVL"),
    pytest.param("NVIDIA H200", "H200 SXM", id="H200"),
    pytest.param("NVIDIA H200 NVL", "H200 NVL", id="H200-NVL"),
    pytest.param("NVIDIA B200", "B200", id="B200"),
    pytest.param("NVIDIA A100-SXM4-80GB", "A100 SXM", id="A100-SXM"),
    pytest.param("NVIDIA A100 80GB PCIe", "A100 PCIe", id="A100-PCIe"),
    pytest.param("NVIDIA A10", "A10", id="A10"),
    pytest.param("Tesla V100-SXM2-32GB", "V100 SXM2", id="V100"),
    pytest.param("Tesla T4", "T4", id="T4"),
    pytest.param("NVIDIA GeForce RTX 4090", "RTX 4090", id="RTX4090"),
    pytest.param("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada", id="RTX6000Ada"),
    pytest.param("NVIDIA GeForce GTX 1080 Ti", None, id="unknown-GTX1080"),
    pytest.param("NVIDIA GH200 480GB", None, id="GH200-is-not-H200"),
    pytest.param("Tesla V100S-PCIE-32GB", None, id="V100S-is-not-V100"),
])
def test_recognition(name, key):
    entry = gpu_entry(name)
    assert (entry.key if entry else None) == key


def test_dense_peaks_not_sparse_nor_fp32_rates():
    # H100 NVL: the datasheet's 1,671 TFLOPS bf16 is with 2:4 sparsity; dense is half
    assert gpu_entry("NVIDIA H100 NVL").peaks["bf16"] == pytest.approx(1671 / 2 * T)
    assert gpu_entry("NVIDIA H100 80GB HBM3").peaks["bf16"] == pytest.approx(989.4 * T)
    # RTX 4090: bf16 tensor cores with FP32 accumulate run at twice the fp32 rate, not at it
    rtx = gpu_entry("NVIDIA GeForce RTX 4090").peaks
    assert rtx["bf16"] == pytest.approx(2 * rtx["fp32"])
    # every entry: tensor peaks at least the fp32 rate, and a cited source
    for entry in devices.GPUS:
        assert entry.source.startswith(("NVIDIA", "AMD", "Google"))
        if not entry.source.startswith("NVIDIA"):
            assert "https://" in entry.source, entry.key  # beyond NVIDIA's table: the source's address
        for dtype in ("tf32", "bf16", "fp16"):
            if dtype in entry.peaks and "fp32" in entry.peaks:  # a TPU's table gives bf16 only
                assert entry.peaks[dtype] >= entry.peaks["fp32"], (entry.key, dtype)


@pytest.mark.parametrize("name, sms, dtype, tflops", [
    pytest.param("AMD Instinct MI300X", 304, "bf16", 1307.4, id="MI300X-bf16"),  # ROCm docs: 2048 FLOPs/clk/CU
    pytest.param("AMD Instinct MI300X", 304, "fp8", 2614.9, id="MI300X-fp8"),
    pytest.param("AMD Instinct MI250X", 110, "bf16", 383.0 / 2, id="MI250X-one-die"),  # half the OAM
    # ROCm's MI250 page: the OAM's matrix FP64 90.5, BF16 362.1 TFLOPS, INT8 362.1 TOPS; one GCD is half of it
    pytest.param("AMD Instinct MI250", 104, "fp64", 90.5 / 2, id="MI250-one-die-fp64"),
    pytest.param("AMD Instinct MI250", 104, "bf16", 362.1 / 2, id="MI250-one-die-bf16"),
    pytest.param("AMD Instinct MI250", 104, "int8", 362.1 / 2, id="MI250-one-die-int8"),
    pytest.param("TPU v5 lite", None, "bf16", 197, id="TPUv5e"),
    pytest.param("TPU v5", None, "bf16", 459, id="TPUv5p"),
    pytest.param("TPU v6 lite", None, "int8", 1836, id="TPUv6e"),
    pytest.param("TPU v4", None, "bf16", 275, id="TPUv4"),
])
def test_peaks_beyond_nvidia(name, sms, dtype, tflops):
    assert gpu_device(name, sms).peak(dtype).flops_per_s == pytest.approx(tflops * T)


def test_mi250x_die_agrees_with_amds_per_cu_rates():
    """AMD's lab notes give the MI250X's matrix rates per CU and clock (FP64/FP32 256, BF16/INT8 1024), ROCm's
    specification table 110 CUs per GCD, ROCm's MI250 page the CDNA 2 GCD's 1.7 GHz peak clock."""
    die = gpu_entry("AMD Instinct MI250X").peaks
    assert die["bf16"] == pytest.approx(110 * 1024 * 1.7e9, rel=1e-3)
    assert die["fp64"] == pytest.approx(110 * 256 * 1.7e9, rel=1e-3)
    assert die["int8"] == pytest.approx(110 * 1024 * 1.7e9, rel=1e-3)


@pytest.mark.parametrize("name, sms, key, bf16_tflops", [
    pytest.param("AMD Instinct MI250", 104, "MI250", 181.05, id="MI250"),
    pytest.param("AMD Instinct MI250X", 110, "MI250X", 191.5, id="MI250X"),
    # a name listing both parts is the MI250X's entry, scaled to the CUs reported: 104 of 110 is an MI250 die
    pytest.param("AMD Instinct MI250X / MI250", 104, "MI250X", 191.5 * 104 / 110, id="both-names-104-CUs"),
])
def test_mi250_and_mi250x_are_told_apart(name, sms, key, bf16_tflops):
    dev = gpu_device(name, sms)
    assert dev.table_entry == key
    assert dev.peak("bf16").flops_per_s == pytest.approx(bf16_tflops * T)


@pytest.mark.parametrize("name, part", [
    pytest.param("AMD Instinct MI355X", "MI355X", id="MI355X"),
    pytest.param("AMD Instinct MI325X", "MI325X", id="MI325X"),
    pytest.param("NVIDIA GB200", "GB200", id="GB200"),
    pytest.param("NVIDIA B300 SXM6 AC", "B300", id="B300"),
    pytest.param("NVIDIA GeForce RTX 5090", "RTX 5090", id="RTX5090"),
    pytest.param("Intel Gaudi 2", "Gaudi 2", id="Gaudi2"),
    pytest.param("Intel Gaudi 3", "Gaudi 3", id="Gaudi3"),
])
def test_parts_without_a_found_datasheet_get_a_null_peak_with_its_reason(name, part):
    peak = gpu_device(name, None).peak("bf16")
    assert peak.flops_per_s is None and "no peak in flopcount's table" in peak.source
    # the reason names the part and what was searched
    assert f"({part}: no " in peak.source and "could be read" in peak.source
    assert devices.not_in_table(name).startswith(f"{part}: ")


def test_parts_beside_a_missing_one_are_not_mistaken_for_it():
    assert devices.not_in_table("NVIDIA GB300") is None  # "b300" is not a whole word of "GB300"
    assert devices.not_in_table("NVIDIA GeForce RTX 4090") is None
    assert "could be read" not in gpu_device("NVIDIA Future 9000", 200).peak("bf16").source


def test_an_unknown_device_gets_no_peak_and_a_fix():
    dev = gpu_device("NVIDIA Future 9000", 200)
    peak = dev.peak("bf16")
    assert peak.flops_per_s is None and "unknown device 'NVIDIA Future 9000'" in peak.source
    assert "peak_flops=" in peak.source


def test_mig_slice_is_scaled_by_its_sms_and_a_larger_part_is_unknown():
    # a 3g.40gb slice of an H100 SXM has 60 of its 132 SMs
    dev = gpu_device("NVIDIA H100 80GB HBM3 MIG 3g.40gb", 60)
    assert dev.peak("bf16").flops_per_s == pytest.approx(989.4 * T * 60 / 132)
    assert "scaled by 60/132 SMs" in dev.peak("bf16").source
    assert gpu_device("NVIDIA L4", 142).table_entry is None


H100 = gpu_device("NVIDIA H100 80GB HBM3", 132)


def test_effective_peak_one_dtype_is_that_peak():
    parts = {"conv": 90.0, "matmul": 5.0, "other": 5.0}
    p = mfu.effective_peak(H100, mfu.Precision("bf16", "bf16", "given"), parts)
    assert p.flops_per_s == pytest.approx(989.4 * T) and p.source.startswith("bf16 peak")


def test_effective_peak_tf32_convolutions_and_fp32_products():
    # PyTorch's defaults in fp32: cuDNN convolutions in TF32, matmuls in FP32. Conv work 80 (+ other 10, which
    # rides with the larger product part), matmul 10: the time at peak is 90/494.7T + 10/66.9T.
    parts = {"conv": 80.0, "matmul": 10.0, "other": 10.0}
    p = mfu.effective_peak(H100, mfu.Precision("tf32", "fp32", "flags"), parts)
    assert p.flops_per_s == pytest.approx(100 / (90 / (494.7 * T) + 10 / (66.9 * T)))
    assert "90.0% at the tf32 peak" in p.source


def test_given_peak_wins():
    p = mfu.effective_peak(H100, mfu.Precision("bf16", "bf16", "given"), None, peak_flops=123.0)
    assert (p.flops_per_s, p.source) == (123.0, "given (peak_flops=)")


def test_precision_follows_the_tf32_flags():
    torch = pytest.importorskip("torch")
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
        p = mfu.detect_precision("cuda", None, None, None)
        assert (p.conv, p.matmul) == ("tf32", "fp32") and p.label == "conv tf32, matmul fp32"
        torch.backends.cuda.matmul.allow_tf32 = True
        assert mfu.detect_precision("cuda", None, None, None).matmul == "tf32"
        assert mfu.detect_precision("cuda", None, "bf16", None).label == "bf16"  # autocast wins
        assert mfu.detect_precision("cpu", None, None, None).label == "fp32"  # no TF32 on a CPU
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_split_work_reads_families_of_a_training_count():
    torch = pytest.importorskip("torch")
    import flopcount

    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 3 * 3, 2))
    report = flopcount.from_torch(net, (2, 3, 5, 5), mode="train", cache_dir=False)
    parts = mfu.split_work(report)
    # per sample: conv forward 2*4*9*27 + bias 36, backward dW only (first layer) 2*4*9*27 + dB 36
    assert parts["conv"] == 2 * (2 * 4 * 9 * 27 + 36)
    # Gemm 36 -> 2 with bias: forward 2*36*2 + 2; backward dA and dB 2*(2*36*2) + dC 2
    assert parts["matmul"] == 2 * 36 * 2 + 2 + 2 * (2 * 36 * 2) + 2
    assert sum(parts.values()) == pytest.approx(report.per_sample.flops)


def test_cpu_peak_is_the_measured_gemm_ceiling(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    monkeypatch.setenv("FLOPCOUNT_CACHE", str(tmp_path))
    dev = ceilings.measured_cpu_device()
    peak = dev.peak("fp32")
    assert peak.flops_per_s > 0 and peak.source.startswith("measured GEMM ceiling of this cpu")
    assert list(tmp_path.glob("ceiling-gemm-*.json"))  # cached per machine
    assert ceilings.measured_cpu_device().peak("fp32") == peak  # read back from the cache
    assert devices.cpu_device().peaks == {}  # describing the CPU measures nothing


def test_theoretical_cpu_peak_needs_every_factor(monkeypatch):
    monkeypatch.delenv("FLOPCOUNT_CPU_FMA_UNITS", raising=False)
    assert devices.theoretical_cpu_peak().flops_per_s is None
    monkeypatch.setenv("FLOPCOUNT_CPU_FMA_UNITS", "2")
    monkeypatch.setattr(devices, "_cpu_max_hz", lambda: 3.0e9)
    monkeypatch.setattr(devices, "_fp32_lanes", lambda: 16)
    monkeypatch.setattr(devices, "cpu_cores", lambda: 4)
    assert devices.theoretical_cpu_peak().flops_per_s == 4 * 3.0e9 * 16 * 2 * 2


@pytest.mark.gpu
def test_cuda_device_description():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    dev = devices.cuda_device()
    assert dev.kind == "cuda" and dev.details["sm_count"] == torch.cuda.get_device_properties(0).multi_processor_count


def test_busy_cores_sums_each_cores_busy_fraction_over_the_interval(monkeypatch):
    """Two readings of /proc/stat's (idle, total) ticks: core 0 idle 50 of 100 ticks, core 1 idle 10 of 100:
    0.5 + 0.9 = 1.4 cores busy; a core outside this process's affinity is not read."""
    readings = iter([{0: (100, 200), 1: (50, 100)}, {0: (150, 300), 1: (60, 200)}])
    seen = []
    monkeypatch.setattr(devices, "_core_times", lambda cores: seen.append(cores) or next(readings))
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert devices.busy_cores(0.0) == pytest.approx(1.4)
    assert seen == [{0, 1}, {0, 1}]


def test_busy_cores_is_none_where_proc_stat_cannot_be_read(monkeypatch):
    monkeypatch.setattr(devices, "_core_times", lambda cores: None)
    assert devices.busy_cores(0.0) is None


def test_busy_cores_on_this_machine_lies_between_none_and_all(monkeypatch):
    import os

    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat here")
    busy = devices.busy_cores(0.05)
    assert busy is not None and 0.0 <= busy <= devices.cpu_cores() + 1e-9


def test_last_level_cache_is_the_largest_cache_the_first_core_reaches(monkeypatch, tmp_path):
    """Linux's cache folders of the core: 48K (L1), 2048K (L2) and 491520K (L3) give 480 MiB; none give None."""
    import glob

    folders = []
    for i, size in enumerate(("48K", "64K", "2048K", "491520K")):
        d = tmp_path / f"index{i}"
        d.mkdir()
        (d / "size").write_text(size + "\n")
        folders.append(str(d))
    monkeypatch.setattr(glob, "glob", lambda pattern: folders if pattern.endswith("/cache/index*") else [])
    assert devices.last_level_cache_bytes() == 480 * 2**20
    monkeypatch.setattr(glob, "glob", lambda pattern: [])
    assert devices.last_level_cache_bytes() is None


def test_core_times_pass_over_lines_they_cannot_read(tmp_path):
    """A blank line, a short line and a non-number are passed over; cpu0's idle is idle + iowait (40 + 2), its total
    the eight fields' sum (10 + 0 + 5 + 40 + 2 + 1 + 1 + 1 = 60); a core outside the set is not read."""
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3 4 5 6 7 8\n\ncpu0 10 0 5 40 2 1 1 1 0 0\ncpu1 1 2\ncpu2 x 1 1 1 1 1 1 1\n"
                    "cpu3 1 1 1 1 1 1 1 1\nintr 5\n")
    assert devices._core_times({0, 1, 2}, str(stat)) == {0: (42, 60)}
    assert devices._core_times({5}, str(stat)) is None
    assert devices._core_times({0}, str(tmp_path / "absent")) is None


def test_busy_cores_is_none_where_the_second_reading_fails(monkeypatch):
    readings = iter([{0: (100, 200)}, None])
    monkeypatch.setattr(devices, "_core_times", lambda cores: next(readings))
    monkeypatch.setattr(devices.os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert devices.busy_cores(0.0) is None
