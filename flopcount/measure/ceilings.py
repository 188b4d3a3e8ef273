"""Measured ceilings of this machine: what its GEMM reaches per dtype, timed through torch.

The harness reads :func:`cached_gemm` for the CPU's "peak" (a measured ceiling, never a datasheet guess); the
calibration is short (about a second) and cached per machine, keyed by the CPU model, the cores this process may
use, torch's thread count and version, under the cache folder of the frontends (``$FLOPCOUNT_CACHE``, ``0`` to
disable, else ``~/.cache/flopcount``).
"""

from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)

#: torch dtype names of the dtypes a GEMM ceiling can be measured for on a CPU.
CPU_GEMM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp64": "float64"}
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class GemmCeiling:
    """The best median FLOP/s of square ``n×n @ n×n`` products over the sizes tried."""

    device: str
    dtype: str
    flops_per_s: float
    n: int  # the size that reached it
    repeats: int
    threads: int
    torch_version: str

    def describe(self) -> str:
        return (f"measured GEMM ceiling of this {self.device} ({self.dtype}, {self.n}x{self.n}x{self.n}, median of "
                f"{self.repeats} after warm-up, {self.threads} threads, torch {self.torch_version})")


def measure_gemm(device: str = "cpu", dtype: str = "fp32", sizes: tuple[int, ...] = (512, 1024, 2048),
                 repeats: int = 7, budget_s: float = 3.0) -> GemmCeiling:
    """Time square GEMMs of each size (warm-up, then ``repeats``; median), stopping a size early once ``budget_s``
    is spent, and return the fastest size's median FLOP/s (2·n³ FLOPs a product)."""
    import torch

    tdtype = getattr(torch, CPU_GEMM_DTYPES[dtype])
    best: tuple[float, int] | None = None
    start = time.perf_counter()
    for n in sizes:
        a = torch.randn(n, n, dtype=torch.float32).to(tdtype)
        b = torch.randn(n, n, dtype=torch.float32).to(tdtype)
        out = torch.empty(n, n, dtype=tdtype)
        for _ in range(2):
            torch.mm(a, b, out=out)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b, out=out)
            times.append(time.perf_counter() - t0)
            if time.perf_counter() - start > budget_s and len(times) >= 3:
                break
        rate = 2 * n ** 3 / statistics.median(times)
        if best is None or rate > best[0]:
            best = (rate, n)
        if time.perf_counter() - start > budget_s:
            break
    assert best is not None
    return GemmCeiling(device, dtype, best[0], best[1], repeats, torch.get_num_threads(), torch.__version__)


def _cache_path(device: str, dtype: str):
    import torch

    from flopcount.frontends.common import cache_key, default_cache_dir

    from .devices import cpu_cores, cpu_name

    folder = default_cache_dir()
    if folder is None:
        return None
    key = cache_key([_CACHE_FORMAT, device, dtype, cpu_name(), cpu_cores(), torch.get_num_threads(),
                     torch.__version__])
    return folder / f"ceiling-gemm-{key[:20]}.json"


def cached_gemm(device: str = "cpu", dtype: str = "fp32") -> GemmCeiling | None:
    """The GEMM ceiling of ``dtype`` on this machine, from the cache or measured now (and cached); None when torch
    is not installed or the dtype cannot run here."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    if dtype not in CPU_GEMM_DTYPES:
        return None
    path = _cache_path(device, dtype)
    if path is not None and path.is_file():
        try:
            return GemmCeiling(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            log.debug("ignoring an unreadable ceiling cache file %s", path)
    log.info("measuring this machine's %s GEMM ceiling (about a second; cached)", dtype)
    try:
        ceiling = measure_gemm(device, dtype)
    except RuntimeError as e:  # the dtype has no kernel here
        log.info("no %s GEMM on this machine: %s", dtype, e)
        return None
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(asdict(ceiling)), encoding="utf-8")
        except OSError:
            log.debug("cannot write the ceiling cache %s", path)
    return ceiling
