"""Energy counters: joules read before and after a window, or nothing, with the reason.

* NVIDIA GPUs: NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules since the driver
  loaded; Volta and newer) through ``nvidia-ml-py``. It updates about every 100 ms, so windows shorter than
  :data:`NVML_MIN_WINDOW_S` are not reported as energy.
* CPUs: RAPL through ``/sys/class/powercap`` (``intel-rapl:N`` package zones, microjoules, wrapping at
  ``max_energy_range_uj``) when readable; the sub-zones (cores, uncore, dram) are parts of their package and are not
  added again.
* Anything else: :class:`NoEnergy`, whose reason every energy figure of the report carries. Never 0 J for "no
  counter", and never a TDP or a modelled wattage presented as a measurement.
"""

from __future__ import annotations

import glob
import os
from typing import Protocol

NVML_MIN_WINDOW_S = 1.0
RAPL_ROOT = "/sys/class/powercap"


class EnergySource(Protocol):
    kind: str
    min_window_s: float

    def read_j(self) -> float:
        """A cumulative reading in joules (only differences mean anything)."""
        ...


class NoEnergy:
    kind = "unavailable"
    min_window_s = float("inf")

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def read_j(self) -> float:  # pragma: no cover - never called: the meter checks kind first
        raise RuntimeError(self.reason)


class RaplEnergy:
    """Sum of the RAPL package zones under ``root`` (one per socket)."""

    kind = "rapl"
    min_window_s = 0.0

    def __init__(self, zones: list[str]) -> None:
        self._zones = zones
        self._max = [_read_int(os.path.join(z, "max_energy_range_uj")) for z in zones]
        self._last = [_read_int(os.path.join(z, "energy_uj")) for z in zones]
        self._total_uj = 0

    def read_j(self) -> float:
        for i, zone in enumerate(self._zones):
            now = _read_int(os.path.join(zone, "energy_uj"))
            delta = now - self._last[i]
            if delta < 0:  # the counter wrapped
                delta += self._max[i] or 0
            self._total_uj += delta
            self._last[i] = now
        return self._total_uj / 1e6


class NvmlEnergy:
    kind = "nvml"
    min_window_s = NVML_MIN_WINDOW_S

    def __init__(self, index: int) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.read_j()  # raises here when the counter is not supported

    def read_j(self) -> float:
        return self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle) / 1e3


def _read_int(path: str) -> int:
    with open(path, encoding="ascii") as f:
        return int(f.read().strip())


def rapl(root: str = RAPL_ROOT) -> EnergySource:
    """RAPL package zones under ``root``, or :class:`NoEnergy` saying why not."""
    zones = sorted(z for z in glob.glob(os.path.join(root, "*-rapl:*")) if z.count(":") == 1)
    if not zones:
        return NoEnergy(f"no RAPL energy counter on this machine ({root} has no *-rapl:N zone: a virtual machine, "
                        "a non-Linux OS or a CPU without RAPL)")
    try:
        return RaplEnergy(zones)
    except (OSError, ValueError) as e:
        return NoEnergy(f"RAPL energy counter not readable ({e}; on Linux it is root-only since 2020: run as root "
                        f"or grant read access to {zones[0]}/energy_uj)")


def nvml(index: int) -> EnergySource:
    """NVML's energy counter of GPU ``index``, or :class:`NoEnergy` saying why not."""
    try:
        import pynvml  # noqa: F401  (installed by nvidia-ml-py)
    except ImportError:
        return NoEnergy("GPU energy needs NVML: pip install nvidia-ml-py")
    try:
        return NvmlEnergy(index)
    except Exception as e:  # NVMLError_NotSupported, driver missing, ...
        return NoEnergy(f"NVML total-energy counter unavailable on GPU {index} ({e}; it needs a Volta or newer GPU)")


def for_device(kind: str, index: int | None = None) -> EnergySource:
    """The energy source of a device kind: NVML for ``"cuda"``, RAPL for ``"cpu"``."""
    if kind == "cuda":
        return nvml(index or 0)
    return rapl()
