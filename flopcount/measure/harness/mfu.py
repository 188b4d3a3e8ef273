"""Which dtype does the work, and the peak that MFU divides by.

Model FLOPs split into three parts read from the counting report's operator families: convolutions, matrix
products (MatMul, Gemm, attention, recurrent cells) and everything else. Each product part runs in the dtype the
run gives it:

* autocast (bf16/fp16) on: both product parts in that dtype;
* fp32 on a CUDA device: convolutions in TF32 when ``torch.backends.cudnn.allow_tf32`` (PyTorch's default: True),
  matrix products in TF32 when ``torch.backends.cuda.matmul.allow_tf32`` (``float32_matmul_precision`` "high" or
  "medium" sets it; default False), else FP32;
* on a CPU: the dtype itself (a CPU has no TF32);
* fp8 (torchao ``Float8Linear`` modules, TransformerEngine's ``fp8_autocast``): the matrix products in fp8,
  attention and convolutions in the run's other dtype, the peak weighted by each dtype's work.

The rest (element-wise, normalization, pooling ...) is attributed to the dtype of the larger product part, which is
the convention of MFU as PaLM and Megatron define it (model FLOPs over the tensor-core peak), so that a run whose
products share one dtype gets exactly FLOPS / peak(dtype). When the two product parts run in different dtypes the
peak is the work-weighted harmonic combination: C / Σ_i (C_i / peak_i), the time the device would need at peak.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Mapping

from flopcount.measure.machine.devices import Device

CONV_FAMILIES = frozenset({"conv"})
PRODUCT_FAMILIES = frozenset({"matmul", "attention", "recurrent", "einsum"})
PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


def split_work(report) -> dict[str, float]:
    """Training FLOPs per sample of a counting report split into ``conv``, ``matmul`` and ``other``; ``attention``
    is the share of ``matmul`` that attention operators do (fp8 recipes keep it in bf16)."""
    parts = {"conv": 0, "matmul": 0, "other": 0, "attention": 0}
    for summary in report.by_op_type.values():
        flops = summary.cost.flops + summary.backward.flops
        part = "conv" if summary.family in CONV_FAMILIES else "matmul" if summary.family in PRODUCT_FAMILIES else "other"
        parts[part] += flops
        if summary.family == "attention":
            parts["attention"] += flops
    return {k: v / report.batch for k, v in parts.items()}


def fp8_modules(module) -> int:
    """How many torchao ``Float8Linear`` modules ``module`` holds (their matrix products run in fp8)."""
    modules = getattr(module, "modules", None)
    if modules is None:
        return 0
    return sum(1 for m in modules() if type(m).__name__ == "Float8Linear")


def transformer_engine_fp8() -> bool:
    """Whether TransformerEngine's ``fp8_autocast`` is active now (False when TransformerEngine is not imported)."""
    te = sys.modules.get("transformer_engine.pytorch")
    manager = getattr(getattr(te, "fp8", None), "FP8GlobalStateManager", None)
    try:
        return bool(manager is not None and manager.is_fp8_enabled())
    except (AttributeError, RuntimeError, TypeError):
        return False


@dataclass(frozen=True)
class Precision:
    """The dtype of each product part and how it was decided."""

    conv: str
    matmul: str
    how: str
    attention: str | None = None  # attention's products when they run in another dtype than the others (fp8)

    @property
    def label(self) -> str:
        label = self.conv if self.conv == self.matmul else f"conv {self.conv}, matmul {self.matmul}"
        return label if self.attention in (None, self.matmul) else f"{label}, attention {self.attention}"


def detect_precision(device_kind: str, given: str | None, autocast_dtype: str | None,
                     param_dtype: str | None, fp8: str | None = None) -> Precision:
    """Decide the dtype of convolutions and matrix products (see the module docstring). ``fp8`` says how fp8 was
    seen (torchao ``Float8Linear`` modules, TransformerEngine's ``fp8_autocast``): the matrix products run in fp8,
    attention and convolutions in the run's other dtype."""
    if given is not None:
        if given not in PRECISIONS:
            from flopcount.errors import UsageError

            raise UsageError(f"precision={given!r}: expected one of {', '.join(PRECISIONS)}")
        return Precision(given, given, "given")
    if fp8 is not None:
        base = autocast_dtype or param_dtype or "fp32"
        return Precision(base, "fp8", f"{fp8}: matrix products in fp8, attention and convolutions in {base}", base)
    if autocast_dtype is not None:
        return Precision(autocast_dtype, autocast_dtype, f"autocast to {autocast_dtype} seen in the steps")
    base = param_dtype or "fp32"
    how = f"parameters in {base}" if param_dtype else "fp32 (no autocast seen; give precision= if it runs inside the step)"
    if device_kind != "cuda" or base != "fp32":
        return Precision(base, base, how)
    torch = sys.modules["torch"]
    conv = "tf32" if torch.backends.cudnn.allow_tf32 else "fp32"
    matmul = "tf32" if torch.backends.cuda.matmul.allow_tf32 else "fp32"
    return Precision(conv, matmul, f"{how}; cuDNN allow_tf32={torch.backends.cudnn.allow_tf32}, "
                     f"matmul allow_tf32={torch.backends.cuda.matmul.allow_tf32}")


def _weighted_by_dtype(device: Device, precision: Precision, parts: Mapping[str, float]) -> "EffectivePeak":
    """C / Σ_dtype (work_dtype / peak_dtype) over the products' dtypes: non-attention matrix products in
    ``precision.matmul``, attention in ``precision.attention``, convolutions in ``precision.conv``; the rest with
    the part doing the most work."""
    attention = parts.get("attention", 0)
    work = {"matmul": parts["matmul"] - attention, "attention": attention, "conv": parts["conv"]}
    dtype = {"matmul": precision.matmul, "attention": precision.attention, "conv": precision.conv}
    work[max(work, key=work.get)] += parts["other"]
    by_dtype: dict[str, float] = {}
    for part, flops in work.items():
        if flops:
            by_dtype[dtype[part]] = by_dtype.get(dtype[part], 0) + flops
    total = sum(by_dtype.values())
    peaks = {d: device.peak(d) for d in by_dtype}
    for p in peaks.values():
        if p.flops_per_s is None:
            return EffectivePeak(None, p.source)
    value = total / sum(flops / peaks[d].flops_per_s for d, flops in by_dtype.items())
    shares = ", ".join(f"{flops / total:.1%} at the {d} peak ({peaks[d].source})" for d, flops in by_dtype.items())
    return EffectivePeak(value, f"work-weighted: {shares}")


@dataclass(frozen=True)
class EffectivePeak:
    flops_per_s: float | None
    source: str
    load_per_core: float | None = None  # the load per core when a measured peak (a CPU ceiling) was measured


def effective_peak(device: Device, precision: Precision, parts: Mapping[str, float] | None,
                   peak_flops: float | None = None) -> EffectivePeak:
    """The peak FLOP/s of one device for this work. ``peak_flops`` (the user's figure) wins."""
    if peak_flops is not None:
        return EffectivePeak(float(peak_flops), "given (peak_flops=)")
    if precision.attention not in (None, precision.matmul) and parts is not None:
        return _weighted_by_dtype(device, precision, parts)
    if parts is None or precision.conv == precision.matmul or not (parts["conv"] and parts["matmul"]):
        if parts is not None and parts["conv"] > parts["matmul"]:
            dtype = precision.conv
        else:
            dtype = precision.matmul if parts is None or parts["matmul"] else precision.conv
        peak = device.peak(dtype)
        if peak.flops_per_s is None:
            return EffectivePeak(None, peak.source)
        return EffectivePeak(peak.flops_per_s, f"{dtype} peak: {peak.source}", peak.load_per_core)
    conv_peak, mm_peak = device.peak(precision.conv), device.peak(precision.matmul)
    for p in (conv_peak, mm_peak):
        if p.flops_per_s is None:
            return EffectivePeak(None, p.source)
    major = "conv" if parts["conv"] >= parts["matmul"] else "matmul"
    conv_work = parts["conv"] + (parts["other"] if major == "conv" else 0)
    mm_work = parts["matmul"] + (parts["other"] if major == "matmul" else 0)
    total = conv_work + mm_work
    value = total / (conv_work / conv_peak.flops_per_s + mm_work / mm_peak.flops_per_s)
    return EffectivePeak(value, f"work-weighted: {conv_work / total:.1%} at the {precision.conv} peak "
                         f"({conv_peak.source}), {mm_work / total:.1%} at the {precision.matmul} peak "
                         f"({mm_peak.source})", max((p.load_per_core for p in (conv_peak, mm_peak)
                                                     if p.load_per_core is not None), default=None))
