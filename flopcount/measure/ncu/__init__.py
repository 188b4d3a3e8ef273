"""Nsight Compute: its exports parsed into FLOPs per kernel, and the analytic count beside them.

* :mod:`.parse` ncu CSV exports (raw and details pages) → kernels with FLOPs from the SASS and tensor counters
* :mod:`.crosscheck` kernels and PyTorch's counters grouped by family beside the count, with the reason for each gap
* :mod:`.step` one profiled steady-state step on CUDA, the work of ``python -m flopcount.measure.ncu_step``
"""

from .parse import (HALF_PACKING, KernelFlops, MetricPlan, NcuExport, ncu_command, nvtx_ranges, parse_ncu_csv,
                    plan_metrics, read_ncu_csv)

__all__ = ["HALF_PACKING", "KernelFlops", "MetricPlan", "NcuExport", "ncu_command", "nvtx_ranges", "parse_ncu_csv",
           "plan_metrics", "read_ncu_csv"]
