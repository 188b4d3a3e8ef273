"""Devices and their peaks: which device runs the work, and the dense peak FLOP/s of each dtype on it.

One description of a device serves the harness (MFU), ``flopcount ceilings``, the rooflines and the Nsight
cross-check. Peaks are **dense** (no 2:4 structured sparsity) vendor figures, each with its source; a device missing
from the table gets no peak at all (``peak_flops=`` / ``--peak-flops`` gives one), never another device's.

Recognition is by the name the driver reports, split into words, so that ``L40S`` is never read as ``L4`` and
``H100 NVL`` never as ``H100 SXM``; the SM count confirms the variant, and a device with fewer SMs than its table
entry (a MIG slice) gets the entry's peak scaled by its share of SMs, which the source line says.

>>> gpu_entry("NVIDIA L40S").key, gpu_entry("NVIDIA L4").key
('L40S', 'L4')
>>> gpu_entry("NVIDIA H100 NVL").peaks["bf16"] / 1e12
835.5
>>> gpu_entry("NVIDIA GeForce GTX 1080") is None
True
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import dataclass, field
from typing import Mapping

#: The dtypes a peak can be given for, in the order reports list them.
DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")

T = 1e12


@dataclass(frozen=True)
class GpuEntry:
    """One row of the peak table: dense peaks per dtype in FLOP/s (int8 in OP/s), for a part whose name the driver
    reports with all of ``words`` (and none of ``without``), at ``sms`` streaming multiprocessors (compute units
    of an AMD part; 0 for a part that has neither, a TPU)."""

    key: str
    words: tuple[str, ...]
    sms: int
    peaks: Mapping[str, float]
    source: str
    without: tuple[str, ...] = ()


def _dense(**tflops: float) -> dict[str, float]:
    return {k: v * T for k, v in tflops.items()}


# Sources are NVIDIA's product datasheets and architecture whitepapers. Where a datasheet gives tensor-core figures
# "with sparsity" only, the dense figure is half of it, as the datasheets' footnotes state; the source says so.
# fp64 is the tensor-core FP64 rate where the part has one (A100, H100, H200, B200), else the CUDA-core rate. The
# bf16/fp16 figures of GeForce cards are their FP32-accumulate rate (what training uses), which is half of the
# FP16-accumulate rate that product pages quote.
GPUS: tuple[GpuEntry, ...] = (
    GpuEntry("B200", ("b200",), 148, _dense(fp64=37, fp32=75, tf32=1125, bf16=2250, fp16=2250, fp8=4500, int8=4500),
             "NVIDIA HGX B200 datasheet (per GPU; tensor figures half of the with-sparsity ones)"),
    GpuEntry("H200 NVL", ("h200", "nvl"), 132,
             _dense(fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5),
             "NVIDIA H200 NVL datasheet (tensor figures half of the with-sparsity ones)"),
    GpuEntry("H200 SXM", ("h200",), 132,
             _dense(fp64=66.9, fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9, int8=1978.9),
             "NVIDIA H200 datasheet, SXM (tensor figures half of the with-sparsity ones)", without=("nvl",)),
    GpuEntry("H100 NVL", ("h100", "nvl"), 132,
             _dense(fp64=60, fp32=60, tf32=417.5, bf16=835.5, fp16=835.5, fp8=1670.5, int8=1670.5),
             "NVIDIA H100 NVL datasheet, per GPU (tensor figures half of the with-sparsity ones)"),
    GpuEntry("H100 PCIe", ("h100", "pcie"), 114,
             _dense(fp64=51, fp32=51, tf32=378, bf16=756, fp16=756, fp8=1513, int8=1513),
             "NVIDIA H100 datasheet, PCIe (tensor figures half of the with-sparsity ones)"),
    GpuEntry("H100 SXM", ("h100",), 132,
             _dense(fp64=66.9, fp32=66.9, tf32=494.7, bf16=989.4, fp16=989.4, fp8=1978.9, int8=1978.9),
             "NVIDIA H100 datasheet, SXM5 (tensor figures half of the with-sparsity ones)", without=("nvl", "pcie")),
    GpuEntry("A100 SXM", ("a100", "sxm4"), 108, _dense(fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
             "NVIDIA A100 datasheet (dense tensor figures)"),
    GpuEntry("A100 PCIe", ("a100", "pcie"), 108, _dense(fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
             "NVIDIA A100 datasheet (dense tensor figures)"),
    GpuEntry("A100", ("a100",), 108, _dense(fp64=19.5, fp32=19.5, tf32=156, bf16=312, fp16=312, int8=624),
             "NVIDIA A100 datasheet (dense tensor figures; SXM and PCIe parts have the same peaks)"),
    GpuEntry("L40S", ("l40s",), 142, _dense(fp32=91.6, tf32=183, bf16=366.5, fp16=366.5, fp8=733, int8=733),
             "NVIDIA L40S datasheet (tensor figures half of the with-sparsity ones)"),
    GpuEntry("L40", ("l40",), 142, _dense(fp32=90.5, tf32=90.5, bf16=181.05, fp16=181.05, fp8=362, int8=362),
             "NVIDIA L40 datasheet (dense tensor figures)"),
    GpuEntry("L4", ("l4",), 58, _dense(fp32=30.3, tf32=60, bf16=121, fp16=121, fp8=242.5, int8=242.5),
             "NVIDIA L4 datasheet (tensor figures half of the with-sparsity ones)"),
    GpuEntry("A10", ("a10",), 72, _dense(fp32=31.2, tf32=62.5, bf16=125, fp16=125, int8=250),
             "NVIDIA A10 datasheet (dense tensor figures)"),
    GpuEntry("V100 SXM2", ("v100", "sxm2"), 80, _dense(fp64=7.8, fp32=15.7, fp16=125),
             "NVIDIA V100 datasheet, SXM2 (fp16 tensor cores; no bf16/tf32)"),
    GpuEntry("V100 PCIe", ("v100", "pcie"), 80, _dense(fp64=7, fp32=14, fp16=112),
             "NVIDIA V100 datasheet, PCIe (fp16 tensor cores; no bf16/tf32)"),
    GpuEntry("T4", ("t4",), 40, _dense(fp32=8.1, fp16=65, int8=130),
             "NVIDIA T4 datasheet (fp16 mixed precision; no bf16/tf32)"),
    GpuEntry("RTX 4090", ("rtx", "4090"), 128, _dense(fp32=82.6, tf32=82.6, bf16=165.2, fp16=165.2, fp8=330.3, int8=660.6),
             "NVIDIA Ada Lovelace architecture whitepaper, GeForce RTX 4090 (dense; bf16/fp16/fp8 with FP32 accumulate)"),
    GpuEntry("RTX 6000 Ada", ("rtx", "6000", "ada"), 142,
             _dense(fp32=91.1, tf32=182.1, bf16=364.2, fp16=364.2, fp8=728.5, int8=728.5),
             "NVIDIA RTX 6000 Ada Generation datasheet (tensor figures half of the with-sparsity ones)"),
    GpuEntry("RTX A6000", ("rtx", "a6000"), 84, _dense(fp32=38.7, tf32=77.4, bf16=154.8, fp16=154.8, int8=309.7),
             "NVIDIA RTX A6000 datasheet (tensor figures half of the with-sparsity ones)"),
    GpuEntry("RTX 3090", ("rtx", "3090"), 82, _dense(fp32=35.6, tf32=35.6, bf16=71, fp16=71, int8=284),
             "NVIDIA Ampere GA102 whitepaper, GeForce RTX 3090 (dense; bf16/fp16 with FP32 accumulate)"),
) + (
    # AMD Instinct: ROCm builds of torch report them as "cuda" devices, with their compute units as the SM count.
    # Matrix-core figures (dense; AMD's tables list structured sparsity apart); fp32 and fp64 the matrix rates.
    GpuEntry("MI300X", ("mi300x",), 304,
             _dense(fp64=163.4, fp32=163.4, tf32=653.7, bf16=1307.4, fp16=1307.4, fp8=2614.9, int8=2614.9),
             "AMD ROCm documentation, AMD Instinct MI300 series microarchitecture, peak-performance table of the "
             "MI300X OAM (https://rocm.docs.amd.com/en/latest/conceptual/gpu-arch/mi300.html)"),
    # An MI250X OAM holds two graphics compute dies of 110 CUs, and ROCm shows each die as one device: the
    # entry is one die, half the OAM's figures (fp64/fp32 matrix 95.7, fp16/bf16/int8 383.0 TFLOPS per OAM).
    # AMD's own pages with these totals were not found; AMD's per-CU matrix rates (lab notes: FP64/FP32 256,
    # FP16/BF16/INT8 1024 FLOPs/clock/CU on MI250X), ROCm's 110 CUs per GCD and the CDNA 2 GCD's 1.7 GHz peak clock
    # (ROCm's MI250 page) give the same 110 x 1024 x 1.7 GHz = 191.5 TFLOPS per die.
    GpuEntry("MI250X", ("mi250x",), 110,
             _dense(fp64=47.85, fp32=47.85, bf16=191.5, fp16=191.5, int8=191.5),
             "AMD Instinct MI200 series specification table (MI250X OAM: 220 CUs, FP64/FP32 matrix 95.7, FP16/BF16 "
             "383.0 TFLOPS, INT8 383.0 TOPS), as reproduced at https://zexron.com/amd-mi250-x-aldebaran-as-mcm-with-"
             "up-to-479-teraflop-s-and-560-watt-tdp; per graphics compute die, half of the OAM; the per-CU rates are "
             "AMD's (AMD lab notes, AMD matrix cores, https://gpuopen.com/learn/amd-lab-notes/amd-lab-notes-matrix-"
             "cores-readme/)"),
    # MI250: ROCm's own table for the OAM (two GCDs of 104 CUs at 1.7 GHz); one GCD is one device, half the OAM.
    # "without": a driver name that lists both parts ("MI250X / MI250") is read as the MI250X, whose entry scales
    # to the SM count ROCm reports (104 of 110 CUs gives the MI250's figures).
    GpuEntry("MI250", ("mi250",), 104,
             _dense(fp64=45.25, fp32=45.25, bf16=181.05, fp16=181.05, int8=181.05),
             "AMD ROCm documentation, AMD Instinct MI250 microarchitecture, peak-performance table of the MI250 OAM "
             "(matrix FP64/FP32 90.5, FP16/BF16 362.1 TFLOPS, INT8 362.1 TOPS), the source of rocm.docs.amd.com's "
             "page (https://github.com/ROCm/ROCm/blob/e396b4898f459db094bfd60b876f419f77eb9f09/docs/conceptual/"
             "gpu-arch/mi250.md); per graphics compute die, half of the OAM", without=("mi250x",)),
    # Google Cloud TPUs (torch_xla, JAX): per chip, from the Cloud TPU system-architecture pages; the names are
    # those the runtimes report ("TPU v5 lite" is v5e, "TPU v5" v5p, "TPU v6 lite" v6e).
    GpuEntry("TPU v4", ("tpu", "v4"), 0, _dense(bf16=275, int8=275),
             "Google Cloud TPU v4 system architecture, peak compute per chip 275 TFLOPS (bf16 or int8) "
             "(https://docs.cloud.google.com/tpu/docs/v4)"),
    GpuEntry("TPU v5e", ("tpu", "v5e"), 0, _dense(bf16=197, int8=393),
             "Google Cloud TPU v5e system architecture, peak compute per chip 197 TFLOPS bf16, 393 TOPS int8 "
             "(https://docs.cloud.google.com/tpu/docs/v5e)"),
    GpuEntry("TPU v5 lite", ("tpu", "v5", "lite"), 0, _dense(bf16=197, int8=393),
             "Google Cloud TPU v5e system architecture, peak compute per chip 197 TFLOPS bf16, 393 TOPS int8 "
             "(https://docs.cloud.google.com/tpu/docs/v5e)"),
    GpuEntry("TPU v5p", ("tpu", "v5p"), 0, _dense(bf16=459),
             "Google Cloud TPU v5p system architecture, peak compute per chip 459 TFLOPS bf16 "
             "(https://cloud.google.com/tpu/docs/v5p-training)"),
    GpuEntry("TPU v5", ("tpu", "v5"), 0, _dense(bf16=459),
             "Google Cloud TPU v5p system architecture, peak compute per chip 459 TFLOPS bf16 "
             "(https://cloud.google.com/tpu/docs/v5p-training)", without=("lite", "v5e")),
    GpuEntry("TPU v6e", ("tpu", "v6e"), 0, _dense(bf16=918, int8=1836),
             "Google Cloud TPU v6e (Trillium) system architecture, peak compute per chip 918 TFLOPS bf16, 1836 TOPS "
             "int8 (https://docs.cloud.google.com/tpu/docs/v6e)"),
    GpuEntry("TPU v6 lite", ("tpu", "v6", "lite"), 0, _dense(bf16=918, int8=1836),
             "Google Cloud TPU v6e (Trillium) system architecture, peak compute per chip 918 TFLOPS bf16, 1836 TOPS "
             "int8 (https://docs.cloud.google.com/tpu/docs/v6e)"),
)
#: Parts asked for whose dense per-dtype peaks were not found in a vendor source yet: no entry (an unknown part
#: gets a null MFU with its reason, never a guessed peak), until a datasheet figure is recorded here.
NOT_IN_TABLE = {
    "MI325X": "no AMD page with its per-dtype peaks could be read: ROCm's GPU specification table "
              "(reference/gpu-arch-specs) gives its 304 CUs but no rates or clock, ROCm's MI300 page tabulates the "
              "MI300X only, and amd.com's MI325X page and datasheet were not reachable",
    "MI355X": "no AMD page with its per-dtype peaks could be read: ROCm's GPU specification table gives its 256 CUs, "
              "ROCm's MI350 page only links the CDNA 4 white paper (amd.com PDF, not reachable), and amd.com's "
              "MI355X page was not reachable",
    "Gaudi 2": "no Intel page with its per-dtype peaks could be read: docs.habana.ai's Gaudi Architecture and TPC "
               "pages describe the MME and TPC without TFLOPS, and intel.com's Gaudi 2 pages were not reachable",
    "Gaudi 3": "no Intel page with its per-dtype peaks could be read: docs.habana.ai's Gaudi Architecture page has "
               "no TFLOPS, and intel.com's Gaudi 3 white paper and product brief were not reachable",
    "GB200": "no NVIDIA page with its per-GPU figures could be read: docs.nvidia.com's GB200 NVL multi-node tuning "
             "guide and Blackwell tuning guide give none, and nvidia.com's GB200 NVL72 page and the Blackwell "
             "architecture technical brief were not reachable",
    "B300": "no NVIDIA page with its per-GPU figures could be read: docs.nvidia.com's DGX B300/GB300 pages found are "
            "firmware and release notes, and nvidia.com's HGX B300 datasheet was not reachable",
    "RTX 5090": "no NVIDIA page with its dense tensor figures could be read: the RTX Blackwell GPU architecture "
                "white paper (nvidia.com PDF) was not reachable",
}


#: Each device's memory in GB as its datasheet (the same sources as its peaks) states it, read as JEDEC memory units
#: (1 GB of memory = 2**30 bytes: an "80GB" H100 holds 80 GiB of HBM, of which the driver keeps a little for itself).
#: A part sold with two sizes (A100 40/80 GB, V100 16/32 GB) has none here: the size word of the driver's name
#: ("A100-SXM4-80GB") gives it. MI250X and MI250: one graphics compute die, half the OAM's 128 GB.
MEMORY_GB: Mapping[str, int] = {
    "B200": 180, "H200 NVL": 141, "H200 SXM": 141, "H100 NVL": 94, "H100 PCIe": 80, "H100 SXM": 80,
    "L40S": 48, "L40": 48, "L4": 24, "A10": 24, "T4": 16, "RTX 4090": 24, "RTX 6000 Ada": 48, "RTX A6000": 48,
    "RTX 3090": 24, "MI300X": 192, "MI250X": 64, "MI250": 64, "TPU v4": 32, "TPU v5e": 16, "TPU v5 lite": 16,
    "TPU v5p": 95, "TPU v5": 95, "TPU v6e": 32, "TPU v6 lite": 32,
}


def memory_of(name: str) -> int | None:
    """The memory in bytes of the device called ``name`` (a driver's name or a table key): the size word of the
    name where it has one (``"A100-SXM4-80GB"``), else the table's (:data:`MEMORY_GB`); None when neither knows.

    >>> memory_of("NVIDIA H100 80GB HBM3") // 2**30, memory_of("A100-SXM4-40GB") // 2**30, memory_of("H200")
    (80, 40, 151397597184)
    >>> memory_of("A100") is None
    True
    """
    sizes = [int(w[:-2]) for w in _words(name) if re.fullmatch(r"[0-9]+gb", w)]
    if sizes:
        return sizes[0] * 2**30
    entry = gpu_entry(name)
    gb = MEMORY_GB.get(entry.key) if entry is not None else None
    return None if gb is None else gb * 2**30


def _words(name: str) -> tuple[str, ...]:
    return tuple(w for w in re.split(r"[^a-z0-9]+", name.lower()) if w)


def not_in_table(name: str) -> str | None:
    """Why the part the driver calls ``name`` has no peak, when it is one of :data:`NOT_IN_TABLE` (matched by whole
    words, as :func:`gpu_entry` does); None for any other name."""
    words = set(_words(name))
    for part, reason in NOT_IN_TABLE.items():
        if all(w in words for w in _words(part)):
            return f"{part}: {reason}"
    return None


def gpu_entry(name: str) -> GpuEntry | None:
    """The table row of the GPU the driver calls ``name``, or None when the table does not know it.

    Every word of an entry must appear as a whole word of the name (``"l4"`` does not match ``"l40s"``); the
    entry with the most words that match wins, so ``H100 NVL`` beats ``H100``.
    """
    words = set(_words(name))
    best: GpuEntry | None = None
    for entry in GPUS:
        if all(w in words for w in entry.words) and not any(w in words for w in entry.without):
            if best is None or len(entry.words) > len(best.words):
                best = entry
    return best


@dataclass(frozen=True)
class Peak:
    """A peak in FLOP/s and where it comes from; ``flops_per_s`` is None when it is not known, with the reason in
    ``source``."""

    flops_per_s: float | None
    source: str
    load_per_core: float | None = None  # a measured peak: the machine's load per core when it was measured


@dataclass(frozen=True)
class Device:
    """The device that runs the work, as reports describe it.

    ``kind`` is ``"cpu"`` or ``"cuda"``; ``peaks`` maps a dtype to its :class:`Peak` (only the dtypes the source
    knows); ``details`` holds what was read (SM count, memory, compute capability, driver, CPU cores ...).
    """

    kind: str
    name: str
    index: int | None = None
    peaks: Mapping[str, Peak] = field(default_factory=dict)
    details: Mapping[str, object] = field(default_factory=dict)
    table_entry: str | None = None

    def peak(self, dtype: str) -> Peak:
        """The peak of ``dtype``, or a Peak of None saying why there is none."""
        if dtype in self.peaks:
            return self.peaks[dtype]
        if self.kind == "cuda" and self.table_entry is None:
            searched = not_in_table(self.name)
            return Peak(None, f"unknown device {self.name!r}: no peak in flopcount's table"
                        + (f" ({searched})" if searched else "") + "; give peak_flops= (--peak-flops) from its datasheet")
        return Peak(None, f"{self.name} has no {dtype} peak (the device does not run {dtype}, or it was not "
                    "measured); give peak_flops= (--peak-flops)")

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "index": self.index,
            "table_entry": self.table_entry,
            "peaks": {k: {"flops_per_s": p.flops_per_s, "source": p.source} for k, p in self.peaks.items()},
            "details": dict(self.details),
        }


def cuda_device(index: int | None = None) -> Device:
    """Describe CUDA device ``index`` (the current one by default) from torch's properties and the peak table."""
    import torch

    from flopcount.errors import DeviceError

    if not torch.cuda.is_available():
        raise DeviceError("--device cuda: torch sees no CUDA device (a CPU build of torch, no driver, or "
                          "CUDA_VISIBLE_DEVICES is empty); use --device cpu or install a CUDA build of torch")
    index = torch.cuda.current_device() if index is None else index
    props = torch.cuda.get_device_properties(index)
    details: dict[str, object] = {
        "sm_count": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "compute_capability": f"{props.major}.{props.minor}",
        "cuda_runtime": torch.version.cuda,
    }
    details.update(_nvml_details(index))
    return gpu_device(props.name, props.multi_processor_count, index, details)


def gpu_device(name: str, sm_count: int | None, index: int | None = None,
               details: Mapping[str, object] | None = None) -> Device:
    """A GPU's :class:`Device` from its name and SM count: the table's peaks, scaled by ``sm_count / entry SMs``
    when the device has fewer SMs than its entry (a MIG slice)."""
    entry = gpu_entry(name)
    if entry is not None and entry.sms and sm_count is not None and sm_count > entry.sms:
        entry = None  # more SMs than the part the name matched: another part, whose peak the table does not know
    peaks: dict[str, Peak] = {}
    if entry is not None:
        share = (sm_count or entry.sms) / entry.sms if entry.sms else 1.0  # sms 0: a part without SMs (a TPU)
        for dtype, value in entry.peaks.items():
            if abs(share - 1) < 1e-9:
                peaks[dtype] = Peak(value, entry.source)
            else:
                peaks[dtype] = Peak(value * share, f"{entry.source}, scaled by {sm_count}/{entry.sms} SMs "
                                    "(a MIG slice or a cut-down part)")
    return Device("cuda", name, index, peaks, dict(details or {}), entry.key if entry else None)


def _nvml_details(index: int) -> dict[str, object]:
    """Driver version and max SM clock from NVML when nvidia-ml-py is installed; nothing otherwise."""
    try:
        import pynvml  # the module that nvidia-ml-py installs
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        out: dict[str, object] = {"driver": pynvml.nvmlSystemGetDriverVersion()}
        out["max_sm_clock_mhz"] = pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM)
        return out
    except Exception:  # NVML absent or refused: the details are optional
        return {}


def cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo (Linux), else what :mod:`platform` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def cpu_cores() -> int:
    """Cores this process may run on (its affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def last_level_cache_bytes() -> int | None:
    """The size of the largest cache this process's first core reaches (its last level), from Linux's
    /sys/devices/system/cpu/cpu*/cache; None where the system does not say it."""
    import glob

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    best = None
    for d in glob.glob(f"/sys/devices/system/cpu/cpu{cores[0] if cores else 0}/cache/index*"):
        try:
            with open(os.path.join(d, "size"), encoding="ascii") as f:
                text = f.read().strip()
        except OSError:
            continue
        m = re.fullmatch(r"(\d+)([KMG]?)", text)
        if m:
            size = int(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
            best = size if best is None else max(best, size)
    return best


def _core_times(cores: set[int], path: str = "/proc/stat") -> dict[int, tuple[int, int]] | None:
    """(idle, total) clock ticks of each of ``cores`` since boot, from /proc/stat (Linux), or None where it cannot be
    read or lists none of them (a line it cannot read is passed over)."""
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    out = {}
    for line in lines:
        name, *fields = line.split() or [""]
        if not (name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores and len(fields) >= 5
                and all(v.isdigit() for v in fields[:8])):
            continue
        ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        out[int(name[3:])] = (ticks[3] + ticks[4], sum(ticks))
    return out or None


def busy_cores(seconds: float = 0.25) -> float | None:
    """How many of the cores this process may run on were busy over the next ``seconds`` (each core's busy
    fraction, summed; the waiting on I/O counted idle), from /proc/stat; None where it cannot be read (either
    reading). Unlike the load average, which still holds the processes of the minute before, this is the load now."""
    import time

    cores = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
    before = _core_times(cores)
    if before is None:
        return None
    time.sleep(seconds)
    after = _core_times(cores)
    if after is None:
        return None
    busy = 0.0
    for core, (idle, total) in after.items():
        if core in before and total > before[core][1]:
            fraction = 1.0 - (idle - before[core][0]) / (total - before[core][1])
            busy += min(1.0, max(0.0, fraction))
    return busy


def cpu_device(peaks: Mapping[str, Peak] | None = None) -> Device:
    """Describe this CPU, with ``peaks`` per dtype as given. A CPU's peak is a measurement, never a datasheet
    figure, and describing a device never starts one: :func:`flopcount.measure.machine.ceilings.measured_cpu_device`
    measures (or reads the cached) GEMM ceiling and passes it in here. Without ``peaks`` the peaks are absent."""
    details: dict[str, object] = {"cores": cpu_cores(), "logical_cpus": os.cpu_count(), "machine": platform.machine()}
    theoretical = theoretical_cpu_peak()
    details["theoretical_fp32_peak"] = {"flops_per_s": theoretical.flops_per_s, "source": theoretical.source}
    return Device("cpu", cpu_name(), None, dict(peaks or {}), details)


def theoretical_cpu_peak() -> Peak:
    """cores × frequency × vector lanes × 2 (FMA) × FMA units, only when every factor is known.

    Linux exposes the core count, the vector extensions (cpuinfo flags) and often the maximum frequency, but not
    the number of FMA units per core, so this is given only when ``FLOPCOUNT_CPU_FMA_UNITS`` says it (1 or 2 on
    current x86 parts; see the vendor's optimisation manual).
    """
    units = os.environ.get("FLOPCOUNT_CPU_FMA_UNITS")
    freq = _cpu_max_hz()
    lanes = _fp32_lanes()
    missing = [what for what, v in (("maximum frequency (cpufreq)", freq), ("vector width (cpuinfo flags)", lanes),
                                    ("FMA units per core (FLOPCOUNT_CPU_FMA_UNITS)", units)) if not v]
    if missing:
        return Peak(None, "not known: " + ", ".join(missing) + " cannot be read on this machine")
    value = cpu_cores() * freq * lanes * 2 * int(units)
    return Peak(value, f"{cpu_cores()} cores x {freq / 1e9:.2f} GHz x {lanes} fp32 lanes x 2 (FMA) x {units} FMA units")


def _cpu_max_hz() -> float | None:
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq", encoding="ascii") as f:
            return int(f.read().strip()) * 1e3
    except (OSError, ValueError):
        return None


@functools.lru_cache(maxsize=1)
def _fp32_lanes() -> int | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return None
    if "avx512f" in flags:
        return 16
    if "avx2" in flags or "avx" in flags:
        return 8
    if "sse2" in flags:
        return 4
    return None


def describe(device: str = "cpu", peaks: Mapping[str, Peak] | None = None) -> Device:
    """The :class:`Device` for ``"cpu"`` (with ``peaks`` as given), ``"cuda"`` or ``"cuda:N"``."""
    from flopcount.errors import UsageError

    if device == "cpu":
        return cpu_device(peaks)
    if device == "cuda" or device.startswith("cuda:"):
        index = int(device.split(":", 1)[1]) if ":" in device else None
        return cuda_device(index)
    raise UsageError(f"device {device!r}: expected cpu, cuda or cuda:N")
