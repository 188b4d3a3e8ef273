"""Nsight Compute: its exports parsed into FLOPs per kernel, and the analytic count beside them.

* :mod:`.parse` ncu CSV exports (raw and details pages) → kernels with FLOPs from the SASS and tensor counters
* :mod:`.crosscheck` kernels and PyTorch's counters grouped by family beside the count, with the reason for each gap
* :mod:`.step` one profiled steady-state step on CUDA, the work of ``python -m flopcount.measure.ncu_step``

``flopcount.measure.ncu`` was one module: what it offered is re-exported here from :mod:`.parse`.
"""

from .parse import (CUDA_CORE_PRECISION, CUDA_CORE_RE, FLOAT_TENSOR_SOURCES, FLOPS_PER_INSTRUCTION, HALF_PACKING,
                    NCU_METRIC_NAMES, NCU_METRIC_REGEXES, TENSOR_RE, KernelFlops, MetricPlan, NcuExport, TensorMetric,
                    ncu_command, nvtx_ranges, parse_ncu_csv, parse_tensor_metric, plan_metrics, read_ncu_csv)

__all__ = ["CUDA_CORE_PRECISION", "CUDA_CORE_RE", "FLOAT_TENSOR_SOURCES", "FLOPS_PER_INSTRUCTION", "HALF_PACKING",
           "NCU_METRIC_NAMES", "NCU_METRIC_REGEXES", "TENSOR_RE", "KernelFlops", "MetricPlan", "NcuExport",
           "TensorMetric", "ncu_command", "nvtx_ranges", "parse_ncu_csv", "parse_tensor_metric", "plan_metrics",
           "read_ncu_csv"]
