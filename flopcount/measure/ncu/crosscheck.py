"""Analytic FLOPs beside measured ones, per family: kernel attribution, comparison, likely reasons, rendering.

The analytic side is a counting :class:`flopcount.Report` (forward + backward in train mode, the optimizer step when
it was asked for). The measured side is either an ncu export (:mod:`.parse`) or, without a GPU, PyTorch's own counter
(:func:`measure_with_flop_counter`, :func:`measure_with_profiler`). Both are grouped into :data:`FAMILIES`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from .parse import NcuExport

FAMILIES = ("convolution", "matrix product", "element-wise", "normalization", "pooling", "reduction", "optimizer",
            "other")

#: Counting families (``Report.by_op_type[...].family``) → crosscheck family; any other is "other".
ANALYTIC_FAMILY = {
    "conv": "convolution",
    "matmul": "matrix product",
    "attention": "matrix product",  # products Q·Kᵀ and P·V dominate; fused attention kernels are matched likewise
    "recurrent": "matrix product",  # gate products; cuDNN RNN kernels are GEMMs
    "quantized": "matrix product",
    "elementwise": "element-wise",
    "normalization": "normalization",
    "softmax": "normalization",  # a softmax normalises each row; its kernels are named softmax
    "pooling": "pooling",
    "reduction": "reduction",
    "training": "optimizer",
}

# Kernel and operator names → family, first match wins (convolution before matrix product: implicit-GEMM convs).
_NAME_RULES: tuple[tuple[str, re.Pattern], ...] = tuple((fam, re.compile(rx, re.IGNORECASE)) for fam, rx in (
    ("optimizer", r"adam|sgd|\blamb\b|momentum|multi_tensor_apply|_foreach_|fused_optim"),
    ("convolution", r"conv(?!ert)|winograd|fft|fprop|dgrad|wgrad|implicit_?gemm|implicit_convolve"),
    ("matrix product", r"gemm|gemv|matmul|\bmm\b|addmm|bmm|linear|cublas|cutlass|xmma|hmma|wgmma|nvjet|flash|fmha"
                       r"|attention|sdpa|lstm|gru|rnn"),
    ("normalization", r"batch_?norm|bn_fw|bn_bw|layer_?norm|group_?norm|instance_?norm|rms_?norm|softmax"),
    ("pooling", r"pool"),
    ("reduction", r"reduce|sum|mean|cub::|argmax|argmin|norm_kernel"),
    ("element-wise", r"elementwise|element_wise|vectorized|unrolled|pointwise|relu|gelu|silu|sigmoid|tanh|threshold"
                     r"|add|mul|div|sub|fill|copy|dropout|where|clamp|exp|sqrt|pow|neg|abs|cat|index"),
))

_PHASE = re.compile(r"flopcount/(forward|loss|backward|optimizer|calibration)")
_OPERATOR = re.compile(r"aten::[A-Za-z0-9_]+|\b[A-Z][A-Za-z0-9]*Backward\d*\b")


def family_of_name(name: str) -> str | None:
    """The family a kernel or operator name suggests, or None.

    >>> family_of_name("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_f32"), family_of_name("aten::addmm")
    ('convolution', 'matrix product')
    >>> family_of_name("ThresholdBackward0"), family_of_name("mystery_kernel")
    ('element-wise', None)
    """
    for fam, rx in _NAME_RULES:
        if rx.search(name):
            return fam
    return None


def attribute(kernel_name: str, nvtx: str) -> tuple[str, str]:
    """(family, how) for one kernel: the ``flopcount/optimizer`` and ``flopcount/loss`` phases first, then the
    innermost operator range (``aten::...`` or ``...Backward``), then the kernel name; "other" when none decides."""
    phases = _PHASE.findall(nvtx)
    if phases and phases[-1] == "optimizer":
        return "optimizer", "NVTX phase flopcount/optimizer"
    if phases and phases[-1] == "loss":
        return "other", "NVTX phase flopcount/loss (the loss is not part of the model graph)"
    ops = _OPERATOR.findall(nvtx)
    if ops:
        fam = family_of_name(ops[-1])
        if fam:
            return fam, f"NVTX range {ops[-1]}"
    fam = family_of_name(kernel_name)
    if fam:
        return fam, "kernel name"
    return "other", "neither its NVTX ranges nor its name match a family"


# ---------------------------------------------------------------------------------------------------------------
# Analytic side
# ---------------------------------------------------------------------------------------------------------------


def analytic_by_family(report) -> dict[str, int | None]:
    """FLOPs of the report per crosscheck family: forward + backward; the optimizer family from
    ``report.optimizer`` (None when no optimizer was asked for: it cannot be compared)."""
    out: dict[str, int | None] = {fam: 0 for fam in FAMILIES}
    for s in report.by_op_type.values():
        fam = ANALYTIC_FAMILY.get(s.family, "other")
        out[fam] += s.cost.flops + s.backward.flops
    if report.optimizer is not None:
        out["optimizer"] += report.optimizer[1].flops
    elif out["optimizer"] == 0:
        out["optimizer"] = None
    return out


def grouped_convolutions(report) -> int:
    """Number of Conv nodes whose weight's C_in/G is smaller than the input's C_in (grouped or depth-wise)."""
    n = 0
    for node in report.nodes:
        if node.op_type == "Conv" and len(node.inputs) > 1 and node.inputs[0] and node.inputs[1]:
            x, w = node.inputs[0].shape, node.inputs[1].shape
            if x and w and len(x) > 1 and len(w) > 1 and isinstance(x[1], int) and isinstance(w[1], int) \
                    and w[1] < x[1]:
                n += 1
    return n


# ---------------------------------------------------------------------------------------------------------------
# Comparison
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KernelRow:
    name: str
    family: str
    attributed_by: str
    invocations: int | None
    measured_flops: Mapping[str, Any]  # {"cuda_core": {precision: n}, "tensor_core": {...}, "total": n}

    def as_dict(self) -> dict:
        return {"name": self.name, "family": self.family, "attributed_by": self.attributed_by,
                "invocations": self.invocations, "measured_flops": dict(self.measured_flops)}


@dataclass(frozen=True)
class FamilyRow:
    analytic_flops: int | None
    measured_flops: int | None
    reasons: tuple[str, ...] = ()

    @property
    def ratio(self) -> float | None:
        if not self.analytic_flops or self.measured_flops is None:
            return None
        return self.measured_flops / self.analytic_flops

    def as_dict(self) -> dict:
        return {"analytic_flops": self.analytic_flops, "measured_flops": self.measured_flops, "ratio": self.ratio,
                "reasons": list(self.reasons)}


@dataclass(frozen=True)
class Measured:
    """A measured side: FLOPs per family (None: this source cannot measure the family, with the reason), the
    kernels (or operators) it came from, and how it was measured."""

    families: Mapping[str, int | None]
    kernels: tuple[KernelRow, ...]
    source: Mapping[str, Any]  # the JSON ``ncu`` object
    unmeasured: Mapping[str, str] = field(default_factory=dict)  # family → why it is None
    evidence: Mapping[str, frozenset[str]] = field(default_factory=dict)  # family → facts seen in its kernels


@dataclass(frozen=True)
class Crosscheck:
    families: Mapping[str, FamilyRow]
    total: FamilyRow
    kernels: tuple[KernelRow, ...]
    ncu: Mapping[str, Any]

    def as_dict(self) -> dict:
        return {"families": {k: v.as_dict() for k, v in self.families.items()}, "total": self.total.as_dict(),
                "kernels": [k.as_dict() for k in self.kernels], "ncu": dict(self.ncu)}


_EVIDENCE = {
    "winograd": re.compile(r"winograd", re.IGNORECASE),
    "fft": re.compile(r"fft", re.IGNORECASE),
    "split-k": re.compile(r"split_?k|splitk|reduce_?kernel|_red_|stream_?k", re.IGNORECASE),
}


def from_ncu(export: NcuExport) -> Measured:
    """Per-kernel FLOPs of an export grouped by kernel name and family, and the family totals."""
    families: dict[str, int | None] = {fam: 0 for fam in FAMILIES}
    groups: dict[tuple[str, str], dict] = {}
    evidence: dict[str, set[str]] = {fam: set() for fam in FAMILIES}
    for k in export.kernels:
        fam, how = attribute(k.name, k.nvtx)
        families[fam] += k.flops
        for fact, rx in _EVIDENCE.items():
            if rx.search(k.name):
                evidence[fam].add(fact)
        if k.tensor_core.get("tf32"):
            evidence[fam].add("tf32")
        if k.tensor_core and any(k.tensor_core.values()) and fam in ("convolution", "matrix product"):
            evidence[fam].add("tensor")
        if "backward" in _PHASE.findall(k.nvtx) and "recompute" in k.nvtx.lower():
            evidence[fam].add("recompute")
        g = groups.setdefault((k.name, fam), {"how": how, "n": 0, "cuda": {}, "tensor": {}})
        g["n"] += 1
        for prec, v in k.cuda_core.items():
            g["cuda"][prec] = g["cuda"].get(prec, 0) + v
        for prec, v in k.tensor_core.items():
            g["tensor"][prec] = g["tensor"].get(prec, 0) + v
    kernels = tuple(
        KernelRow(name, fam, g["how"], g["n"], {"cuda_core": g["cuda"], "tensor_core": g["tensor"],
                                                "total": sum(g["cuda"].values()) + sum(g["tensor"].values())})
        for (name, fam), g in sorted(groups.items(), key=lambda kv: -(sum(kv[1]["cuda"].values())
                                                                       + sum(kv[1]["tensor"].values())))
    )
    source = {
        "source": "ncu",
        "file": export.path,
        "layout": export.layout,
        "version": export.version,
        "kernel_launches": len(export.kernels),
        "metrics_found": list(export.plan.used),
        "metrics_ignored": dict(export.plan.ignored),
        "conventions": export.conventions(),
    }
    return Measured(families, kernels, source, {}, {f: frozenset(v) for f, v in evidence.items()})


def _reasons(fam: str, analytic: int | None, measured: int | None, facts: frozenset[str], source: str,
             context: Mapping[str, Any]) -> list[str]:
    """The likely reasons for the gap of one family, given the direction of the gap and what its kernels show."""
    if analytic is None and measured is None:
        return []
    if analytic is None:
        return [context.get("analytic_none", {}).get(fam, "the analytic count has no figure for this family")]
    if measured is None:
        return [context.get("unmeasured", {}).get(fam, "not measured")]
    if analytic == 0:
        if measured == 0:
            return []
        return [{
            "optimizer": "work outside the model graph: the optimizer step (pass --optimizer to count it)",
            "other": "work outside the model graph: the loss, AMP gradient scaling and other kernels of the step",
        }.get(fam, f"the graph has no {fam} work: these kernels come from outside it (loss, casts, AMP scaling, "
                   "data layout) or were attributed here by name")]
    ratio = measured / analytic
    if abs(ratio - 1) <= 0.02:
        return []
    low, out = ratio < 1, []
    if source == "torch-profiler":
        if fam == "convolution" and low:
            out.append("torch.profiler estimates aten::conv2d calls only: convolution_backward (dX and dW) is not "
                       "estimated")
        elif fam == "element-wise" and low:
            out.append("torch.profiler estimates aten::add and aten::mul only (no activations, no backward)")
        elif fam == "matrix product" and low:
            if "sdpa" in facts:
                out.append("torch.profiler estimates no FLOPs for scaled-dot-product attention "
                           "(aten::scaled_dot_product_attention): its Q·Kᵀ and attention·V products are missing")
        return out or ["torch.profiler and the graph disagree here; compare the per-operator table"]
    if source == "torch":
        if fam in ("convolution", "matrix product") and context.get("convention") != "dense":
            if low:
                out.append("FlopCounterMode counts products only (no bias adds, no fused activations); "
                           "--convention dense counts the same")
        if fam == "convolution" and not low and context.get("grouped_convolutions"):
            out.append(f"FlopCounterMode counts a grouped or depth-wise convolution's weight gradient G times "
                       f"({context['grouped_convolutions']} grouped convolutions in this model)")
        if fam == "matrix product" and low and context.get("attention_on_cpu"):
            out.append("torch.profiler does not estimate attention kernels")
        return out or ["torch's counter and the graph disagree here; compare the per-kernel table"]
    if fam == "convolution":
        if low:
            if "winograd" in facts:
                out.append("Winograd convolution kernels do fewer multiplies than the direct form")
            if "fft" in facts:
                out.append("FFT convolution kernels do fewer multiplies than the direct form")
            if not facts & {"winograd", "fft"}:
                out.append("fewer multiplies than the direct form (Winograd/FFT algorithms), or bias and fused work "
                           "counted analytically but done in other kernels")
        else:
            out.append("tile padding and split-K reductions do extra work beyond the direct form")
    elif fam == "matrix product":
        out.append("tile padding and split-K reductions do extra work" if not low else
                   "part of the products ran in kernels attributed to another family, or fused (attention)")
        if not low:
            out.append("recomputation (attention backward, activation checkpointing)")
    elif fam == "element-wise":
        if low:
            out.append("comparisons, max/min (ReLU), conversions and special functions (exp, rcp, rsqrt) are not "
                       "counted by any FP counter")
        else:
            out.append("transcendentals expanded into several FMAs; half-precision work computed in FP32")
    elif fam == "normalization":
        out.append("rsqrt and divisions are not counted by FP counters; statistics recomputed in backward" if low
                   else "transcendentals expanded into FMAs; statistics recomputed in backward")
    elif fam == "pooling":
        out.append("max-pool compares values: FP counters do not count comparisons" if low
                   else "average-pool kernels divide per window (counted as multiplies)")
    elif fam == "reduction":
        out.append("reductions fused into other kernels" if low else "tree reductions add partial sums twice")
    elif fam == "optimizer":
        out.append("the optimizer implementation fuses or adds work (foreach kernels, weight decay, bias correction)")
    else:
        out.append("loss, AMP gradient scaling and casts are outside the model graph")
    if "tf32" in facts:
        out.append("TF32: FP32 products ran on tensor cores (counted under tensor_core tf32)")
    return out


def compare(analytic: Mapping[str, int | None], measured: Measured, source: str = "ncu",
            context: Mapping[str, Any] | None = None) -> Crosscheck:
    """Side by side per family and in total. ``source`` is "ncu", "torch" (FlopCounterMode) or "torch-profiler":
    which reasons apply. The total sums the families that both sides give, and says which it leaves out."""
    context = dict(context or {})
    context.setdefault("unmeasured", measured.unmeasured)
    context.setdefault("analytic_none", {"optimizer": "the analytic count has no optimizer step: pass --optimizer "
                                                      "sgd|momentum|adam with --mode train to count it"})
    rows = {}
    for fam in FAMILIES:
        a, m = analytic.get(fam), measured.families.get(fam)
        rows[fam] = FamilyRow(a, m, tuple(_reasons(fam, a, m, measured.evidence.get(fam, frozenset()), source,
                                                   context)))
    # totals over the families both sides measured; a family one side cannot give is left out and said so
    both = [f for f, r in rows.items() if r.analytic_flops is not None and r.measured_flops is not None]
    no_analytic = [f for f in rows if rows[f].analytic_flops is None]
    unmeasured = [f for f in rows if f not in both and f not in no_analytic]
    total_reasons = [f"left out of both totals ({why}): {', '.join(fams)}" for why, fams in
                     (("not measured", unmeasured), ("no analytic figure", no_analytic)) if fams]
    total = FamilyRow(sum(rows[f].analytic_flops for f in both), sum(rows[f].measured_flops for f in both),
                      tuple(total_reasons))
    return Crosscheck(rows, total, measured.kernels, measured.source)


# ---------------------------------------------------------------------------------------------------------------
# PyTorch's counters (no GPU needed)
# ---------------------------------------------------------------------------------------------------------------


def float_outputs(out) -> list:
    """The floating-point tensors of a module's output (a tensor, or dicts, lists and tuples of them)."""
    if hasattr(out, "is_floating_point"):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in float_outputs(o)]
    return []


def _torch_op_family(name: str) -> str:
    name = name.split(".")[-1] if name.startswith("aten.") else name
    return "convolution" if "conv" in name else "matrix product"


def _on(inputs: tuple | Mapping[str, Any], device: str) -> tuple | dict[str, Any]:
    """``inputs`` with every tensor moved to ``device`` (plain values as they are)."""
    move = lambda x: x.to(device) if hasattr(x, "to") else x  # noqa: E731
    if isinstance(inputs, Mapping):
        return {name: move(x) for name, x in inputs.items()}
    return tuple(move(x) for x in inputs)


def _call_forward(module, inputs: tuple | Mapping[str, Any]):
    """``module(**inputs)`` for inputs by ``forward()`` parameter name (as :func:`flopcount.frontends.torch.
    forward_inputs` makes them), ``module(*inputs)`` for a tuple."""
    return module(**inputs) if isinstance(inputs, Mapping) else module(*inputs)


def measure_with_flop_counter(module, inputs: tuple | Mapping[str, Any], mode: str = "train") -> Measured:
    """FLOPs per family from ``torch.utils.flop_counter.FlopCounterMode`` over one forward (and, in train mode,
    backward of the sum of the float outputs). First on the meta device, on a copy of the module: nothing is
    computed, and there it counts scaled-dot-product attention and LSTMs. A model that reads tensor values on the
    way (transformers' attention masks call ``Tensor.item()``) cannot run on meta: then it runs once on the CPU with
    the given (small) inputs, attention in SDPA's math form so that its products are counted, and the source says
    why. It counts products only (convolutions and matrix products); the other families are None. ``inputs`` are
    forward()'s arguments by name (a dict), or positional (a tuple)."""
    import copy

    try:
        return _flop_counter_run(copy.deepcopy(module), inputs, mode, None)
    except (RuntimeError, NotImplementedError) as e:
        if "meta" not in str(e):
            raise
        why = str(e).strip().splitlines()[0]
    return _flop_counter_run(module, inputs, mode, why)


def _flop_counter_run(module, inputs: tuple | Mapping[str, Any], mode: str, meta_failed: str | None) -> Measured:
    """One FlopCounterMode step on the meta device (``meta_failed`` None) or on real CPU tensors."""
    import contextlib

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    train = mode == "train"
    if meta_failed is None:
        module = module.to("meta").train(train)
        inputs = _on(inputs, "meta")
        backend: contextlib.AbstractContextManager = contextlib.nullcontext()
        device = "meta (shapes only, nothing computed)"
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        module = module.to("cpu").train(train)
        inputs = _on(inputs, "cpu")
        backend = sdpa_kernel([SDPBackend.MATH])  # attention as matmuls, which FlopCounterMode counts on a CPU
        device = (f"cpu (one step on real tensors of the given shapes, attention in SDPA's math form; the meta device "
                  f"could not run it: {meta_failed})")
    with torch.set_grad_enabled(train), backend, FlopCounterMode(display=False) as counter:
        out = _call_forward(module, inputs)
        if train:
            outs = float_outputs(out)
            if outs:
                sum(t.float().sum() for t in outs).backward()
    per_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items() if n}
    families: dict[str, int | None] = {fam: None for fam in FAMILIES}
    families["convolution"] = families["matrix product"] = 0
    kernels = []
    for op, n in sorted(per_op.items(), key=lambda kv: -kv[1]):
        fam = _torch_op_family(op)
        families[fam] += n
        kernels.append(KernelRow(op, fam, "aten operator", None, {"total": n}))
    why = "torch.utils.flop_counter counts only convolutions and matrix products"
    unmeasured = {f: why for f, v in families.items() if v is None}
    source = {"source": "torch.utils.flop_counter.FlopCounterMode", "device": device, "version": torch.__version__,
              "metrics_found": [], "conventions": {"fma": "a multiply-accumulate = 2 FLOPs; products only"}}
    return Measured(families, tuple(kernels), source, unmeasured)


#: The profiler's names of scaled-dot-product attention, which it estimates no FLOPs for.
SDPA_OPERATORS = ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_efficient_attention",
                  "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention")


def measure_with_profiler(module, inputs: tuple | Mapping[str, Any], mode: str = "train") -> Measured:
    """FLOPs per family from ``torch.profiler.profile(with_flops=True)`` over one real step on the CPU. The profiler
    estimates FLOPs only for the operators it has formulas for (convolution, mm/addmm/bmm, add and mul), for the
    calls it sees (backward operators are not estimated); everything else is None or partial."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    train = mode == "train"
    module = module.train(train)
    with torch.set_grad_enabled(train), profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        out = _call_forward(module, inputs)
        if train:
            outs = float_outputs(out)
            if outs:
                sum(t.float().sum() for t in outs).backward()
    families: dict[str, int | None] = {fam: None for fam in FAMILIES}
    kernels = []
    evidence: dict[str, frozenset[str]] = {}
    for ev in prof.key_averages():
        if ev.key in SDPA_OPERATORS:
            evidence["matrix product"] = frozenset({"sdpa"})
        if not getattr(ev, "flops", 0):
            continue
        fam = family_of_name(ev.key) or "other"
        if families[fam] is None:
            families[fam] = 0
        families[fam] += int(ev.flops)
        kernels.append(KernelRow(ev.key, fam, "aten operator", ev.count, {"total": int(ev.flops)}))
    for fam in ("convolution", "matrix product"):
        families[fam] = families[fam] or 0
    why = "torch.profiler estimates no FLOPs for this family's operators"
    unmeasured = {f: why for f, v in families.items() if v is None}
    source = {"source": "torch.profiler.profile(with_flops=True)", "device": "cpu (one real step)",
              "version": torch.__version__, "metrics_found": [],
              "conventions": {"fma": "a multiply-accumulate = 2 FLOPs; forward operators only (conv, mm, addmm, "
                                     "bmm, add, mul)"}}
    return Measured(families, tuple(sorted(kernels, key=lambda k: -k.measured_flops["total"])), source, unmeasured,
                    evidence)


# ---------------------------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------------------------


_UNITS = ((1e12, "TFLOPs"), (1e9, "GFLOPs"), (1e6, "MFLOPs"), (1e3, "kFLOPs"), (1, "FLOPs"))


def _unit(largest: int) -> tuple[float, str]:
    """The largest unit in which ``largest`` is at least 1 (so small models do not print 0.000)."""
    return next(((scale, name) for scale, name in _UNITS if largest >= scale), (1, "FLOPs"))


def _fmt(n: int | None, scale: float) -> str:
    if n is None:
        return "n/a"
    return f"{n:,}" if scale == 1 else f"{n / scale:,.3f}"


def render_json(result: Crosscheck) -> str:
    return json.dumps(result.as_dict(), indent=2) + "\n"


def render_table(result: Crosscheck, kernels: int = 15) -> str:
    from tabulate import tabulate

    src = result.ncu
    lines = [f"measured by: {src.get('source')}"
             + (f" {src['version']}" if src.get("version") else "")
             + (f", {src['file']} ({src.get('layout')} page, {src.get('kernel_launches')} kernel launches)"
                if src.get("file") else "")
             + (f", on {src['device']}" if src.get("device") else "")]
    for k, v in src.get("conventions", {}).items():
        lines.append(f"  {k}: {v}")
    everything = list(result.families.values()) + [result.total]
    scale, unit = _unit(max([r.analytic_flops or 0 for r in everything] + [r.measured_flops or 0 for r in everything]))
    rows = []
    for fam, r in list(result.families.items()) + [("total", result.total)]:
        rows.append([fam, _fmt(r.analytic_flops, scale), _fmt(r.measured_flops, scale),
                     "n/a" if r.ratio is None else f"{r.ratio:.3f}"])
    lines.append("")
    lines.append(tabulate(rows, headers=["family", f"analytic {unit}", f"measured {unit}", "measured/analytic"],
                          tablefmt="simple", disable_numparse=True, colalign=("left", "right", "right", "right")))
    notes = [(fam, why) for fam, r in list(result.families.items()) + [("total", result.total)] for why in r.reasons]
    if notes:
        lines.append("")
        lines.append("likely reasons:")
        lines.extend(f"  {fam}: {why}" for fam, why in notes)
    if result.kernels:
        lines.append("")
        lines.append(f"largest kernels ({min(kernels, len(result.kernels))} of {len(result.kernels)}; "
                     "--format json lists all):")
        krows = [[k.name[:70], k.family, "" if k.invocations is None else k.invocations,
                  _fmt(k.measured_flops.get("total"), scale)] for k in result.kernels[:kernels]]
        lines.append(tabulate(krows, headers=["kernel", "family", "launches", unit], tablefmt="simple",
                              disable_numparse=True))
    return "\n".join(lines) + "\n"
