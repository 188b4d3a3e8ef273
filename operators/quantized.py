"""Quantized products and (de)quantization.

Integer products count like their float counterparts: MACs in ``macs`` and two integer
operations per MAC in ``int_ops`` (never FLOPs, whatever the convention). Subtracting a zero point
costs one integer operation per element of the tensor it belongs to, counted whenever the zero
point input is given (its value is never read). Float rescaling is counted in ``flops``: a
requantized output costs 2 FLOPs per element (multiply by the combined scale, add the output zero
point). Rounding, saturation and type conversion are not counted anywhere.
"""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves
from flopcount.saved import BOOL_BYTES, Saved, keeps

INT_OPS_PER_MAC = 2
REQUANTIZE_FLOPS = 2  # per output element: multiply by x_scale·w_scale/y_scale, add y_zero_point


def _zero_points(ctx: NodeContext, pairs: tuple[tuple[int, int], ...]) -> int:
    """One integer subtraction per element of each data input whose zero point input is given."""
    return sum(ctx.numel(data) for data, zp in pairs if ctx.has_input(zp))


@formula("ConvInteger", family="quantized", quantized=(0, 1))
def conv_integer(ctx: NodeContext, **_) -> Cost:
    """int_ops = 2·N·C_out·S_out·K·C_in/G (+ |X| with x_zero_point, + |W| with w_zero_point); FLOPs = 0.

    MACs = N·C_out·S_out·K·C_in/G as for Conv (read off W[C_out, C_in/G, k1, ..., kd]). Each
    given zero point costs one integer subtraction per element of its tensor.
    """
    macs = ctx.out_numel() * prod(ctx.shape(1)[1:])
    return Cost(macs=macs, int_ops=INT_OPS_PER_MAC * macs + _zero_points(ctx, ((0, 2), (1, 3))))


@formula("QLinearConv", family="quantized", quantized=(0, 3, 8))
def qlinear_conv(ctx: NodeContext, **_) -> Cost:
    """int_ops = 2·N·C_out·S_out·K·C_in/G + |X| + |W| (+ |Y| with a bias B); FLOPs = 2·|Y| (requantization).

    MACs = N·C_out·S_out·K·C_in/G as for Conv. The zero points of x and w (required inputs) cost one
    integer subtraction per element of X and W; the int32 bias one integer add per output element
    (dropped by ``table3``). Requantizing each output costs 2 FLOPs (multiply by
    x_scale·w_scale/y_scale, add y_zero_point); forming that scale ratio (per channel) is not counted.
    """
    y = ctx.out_numel()
    macs = y * prod(ctx.shape(3)[1:])
    int_ops = INT_OPS_PER_MAC * macs + _zero_points(ctx, ((0, 2), (3, 5)))
    if ctx.has_input(8) and ctx.convention.count_bias:
        int_ops += y
    return Cost(flops=REQUANTIZE_FLOPS * y, macs=macs, int_ops=int_ops)


@formula("MatMulInteger", family="quantized", quantized=(0, 1))
def matmul_integer(ctx: NodeContext, **_) -> Cost:
    """int_ops = 2·|Y|·K (+ |A| with a_zero_point, + |B| with b_zero_point); FLOPs = 0.

    MACs = |Y|·K with K the last dim of A, numpy matmul semantics as for MatMul. Each given zero
    point costs one integer subtraction per element of its matrix.
    """
    macs = ctx.out_numel() * ctx.shape(0)[-1]
    return Cost(macs=macs, int_ops=INT_OPS_PER_MAC * macs + _zero_points(ctx, ((0, 2), (1, 3))))


@formula("QLinearMatMul", family="quantized", quantized=(0, 3))
def qlinear_matmul(ctx: NodeContext, **_) -> Cost:
    """int_ops = 2·|Y|·K + |A| + |B|; FLOPs = 2·|Y| (requantization).

    MACs = |Y|·K with K the last dim of A, numpy matmul semantics as for MatMul. The zero points of
    a and b (required inputs) cost one integer subtraction per element of A and B; requantizing each
    output costs 2 FLOPs (multiply by a_scale·b_scale/y_scale, add y_zero_point).
    """
    y = ctx.out_numel()
    macs = y * ctx.shape(0)[-1]
    int_ops = INT_OPS_PER_MAC * macs + _zero_points(ctx, ((0, 2), (3, 5)))
    return Cost(flops=REQUANTIZE_FLOPS * y, macs=macs, int_ops=int_ops)


@formula("QuantizeLinear", family="quantized")
def quantize_linear(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| (+ |X| with y_zero_point): y = saturate(round(x / y_scale) + y_zero_point).

    One division by the scale per element, plus one addition of the zero point per element when
    y_zero_point is given; rounding and saturation are not counted. Per-tensor, per-axis and
    blocked scales cost the same.
    """
    x = ctx.numel(0)
    return Cost(flops=x * (2 if ctx.has_input(2) else 1))


@formula("DequantizeLinear", family="quantized")
def dequantize_linear(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X|, int_ops = |X| with x_zero_point: y = (x − x_zero_point)·x_scale.

    One multiplication by the scale per element (FLOPs) and, when x_zero_point is given, one
    subtraction per element in the quantized type (``int_ops``; FLOPs for float8/float4 inputs).
    """
    x = ctx.numel(0)
    sub = x if ctx.has_input(2) else 0
    if ctx.in_is_float(0):
        return Cost(flops=x + sub)
    return Cost(flops=x, int_ops=sub)


@backward("QuantizeLinear", buffers=(1, 2), straight_through=True)
def quantize_linear_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| when X needs a gradient: the straight-through estimator of quantization-aware
    training, dX = dY where x/y_scale falls inside the quantized range, else 0 (one masked select
    per element).

    Rounding has no useful derivative, so training graphs with fake quantization (QuantizeLinear →
    DequantizeLinear) pass the gradient straight through it; the integer output carries that
    gradient to DequantizeLinear. y_scale and y_zero_point are taken as fixed (not learned, as in
    LSQ): they get no gradient.
    """
    return Cost(flops=ctx.numel(0) if ctx.needs_grad(0) else 0)


@backward("DequantizeLinear", buffers=(1, 2))
def dequantize_linear_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| when X needs a gradient: dX = dY·x_scale (one multiply per element), the
    straight-through gradient of fake quantization flowing back to QuantizeLinear.

    x_scale and x_zero_point are taken as fixed: they get no gradient.
    """
    return Cost(flops=ctx.numel(0) if ctx.needs_grad(0) else 0)


@backward("DynamicQuantizeLinear", straight_through=True)
def dynamic_quantize_linear_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| when X needs a gradient: the straight-through estimator, as QuantizeLinear's
    (dX = dY masked to the quantized range). The scale's dependence on min and max of X is not
    differentiated (as fake quantization is trained).
    """
    return Cost(flops=ctx.numel(0) if ctx.needs_grad(0) else 0)


@formula("DynamicQuantizeLinear", family="quantized")
def dynamic_quantize_linear(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·(|X| − 1) + 6 + 2·|X|: min and max of X, the scale and zero point, then quantization.

    The min and max reductions take |X| − 1 comparisons each; the scale
    (max(0, max x) − min(0, min x)) / (qmax − qmin) takes 4 FLOPs and the zero point
    qmin − min(x)/scale 2 more; quantizing y = saturate(round(x / scale) + zero_point) takes 2 FLOPs
    per element (divide, add). Rounding and saturation are not counted.
    """
    x = ctx.numel(0)
    return Cost(flops=2 * max(x - 1, 0) + 6 + 2 * x)


# --------------------------------------------------------------------------------------------
# saved for backward (flopcount.saved)


@saves("QuantizeLinear", "DynamicQuantizeLinear")
def quantize_saved(ctx: NodeContext, **_) -> Saved:
    """Whether each element fell inside the quantized range, as bools (|X| bytes), when X needs a gradient: the
    straight-through estimator's mask, as torch's fake quantization (``fake_quantize_*_cachemask``) keeps it."""
    return Saved(extra=(("in-range mask (bool)", BOOL_BYTES * ctx.numel(0)),)) if ctx.needs_grad(0) else Saved()


@saves("DequantizeLinear")
def dequantize_saved(ctx: NodeContext, **_) -> Saved:
    """The scale (dX = dY·x_scale), when X needs a gradient: a stored tensor, no activation."""
    return keeps(1) if ctx.needs_grad(0) else Saved()
