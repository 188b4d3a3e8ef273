"""Convolution (HPC AI500 V3.0 Table 3: convolution, depth-wise and group convolution)."""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.operators.elementwise import ELEMENTWISE_BACKWARD, activation as elementwise_activation
from flopcount.registry import backward, formula, saves, saves_nothing
from flopcount.saved import Saved, element_bytes, keeps


@formula("Conv", family="conv")
def conv(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·N·C_out·S_out·K·C_in/G  (+ N·C_out·S_out when a bias B is given).

    K is the product of the kernel dims and S_out the product of the output spatial dims (any
    rank: 1-D, 2-D, 3-D). The weight W[C_out, C_in/G, k1, ..., kd] already carries C_in/G, so group
    and depth-wise convolution (G = C_in) need no special case; dilation, strides and padding act
    only through the output shape, which shape inference resolves. MACs = N·C_out·S_out·K·C_in/G.
    Table 3: 2·K²·Cin·H·W·Cout (/groups); ``table3`` drops the bias term.
    """
    y = ctx.out_numel()
    macs = y * prod(ctx.shape(1)[1:])
    flops = ctx.convention.conv_flops_per_mac * macs
    if ctx.has_input(2) and ctx.convention.count_bias:
        flops += y
    return Cost(flops=flops, macs=macs)


@backward("Conv")
def conv_backward(ctx: NodeContext, **_) -> Cost:
    """dX = ConvTranspose(dY, W): the forward MACs, when X needs a gradient (not for a first layer
    fed by data); dW = dY ⋆ X: the forward MACs again; dB = Σ dY over N and space: |Y| additions.

    So the backward of a layer inside the network is exactly twice its forward products, and of a
    first layer once. Grouped and depth-wise convolutions follow from W's shape as in the forward.
    """
    y = ctx.out_numel()
    macs = y * prod(ctx.shape(1)[1:]) * (ctx.needs_grad(0) + ctx.needs_grad(1))
    flops = ctx.convention.conv_flops_per_mac * macs
    if ctx.has_input(2) and ctx.needs_grad(2) and ctx.convention.count_bias:
        flops += y
    return Cost(flops=flops, macs=macs)


@formula("ConvTranspose", family="conv")
def conv_transpose(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·N·C_in·S_in·K·C_out/G  (+ N·C_out·S_out when a bias B is given).

    Counted over the *input*: each of the N·C_in·S_in input elements is multiplied into a K-window
    of each of the C_out/G output channels of its group, so MACs = |X|·K·C_out/G, read off the weight
    W[C_in, C_out/G, k1, ..., kd] (any rank). Strides, dilations, pads, output_padding and
    output_shape change only S_out; products that pads crop off the output are still counted (as
    torch.utils.flop_counter does). The bias adds one FLOP per output element; ``table3`` drops it.
    """
    macs = ctx.numel(0) * prod(ctx.shape(1)[1:])
    flops = ctx.convention.conv_flops_per_mac * macs
    if ctx.has_input(2) and ctx.convention.count_bias:
        flops += ctx.out_numel()
    return Cost(flops=flops, macs=macs)


@backward("ConvTranspose")
def conv_transpose_backward(ctx: NodeContext, **_) -> Cost:
    """dX = Conv(dY, W): the forward MACs N·C_in·S_in·K·C_out/G, when X needs a gradient (not for a
    first layer fed by data); dW = X ⋆ dY: the forward MACs again; dB = Σ dY over N and space: |Y|
    additions.

    Both products pair each input element with the K·C_out/G outputs it fed, so each costs exactly
    the forward's MACs, for any strides, dilations, pads or output_padding (products the forward
    cropped off are counted again, as in the forward). The bias term is dropped by ``table3``.
    """
    y = ctx.out_numel()
    macs = ctx.numel(0) * prod(ctx.shape(1)[1:]) * (ctx.needs_grad(0) + ctx.needs_grad(1))
    flops = ctx.convention.conv_flops_per_mac * macs
    if ctx.has_input(2) and ctx.needs_grad(2) and ctx.convention.count_bias:
        flops += y
    return Cost(flops=flops, macs=macs)


@formula("DeformConv", family="conv")
def deform_conv(ctx: NodeContext, *, offset_group: int = 1, **_) -> Cost:
    """FLOPs = 2·N·C_out·S_out·K·C_in/G + (2^(d+1) − 1 + m)·N·C_in·K·S_out
    + (3d + 2^d·(d − 1))·N·og·K·S_out (+ N·C_out·S_out with a bias B), for d spatial dims,
    og = offset_group and m = 1 with a mask (2-D: 7 + m per sample, 10 per sampling point).

    The first term is the Conv product (MACs = N·C_out·S_out·K·C_in/G). Every input channel is
    sampled at each of the K kernel taps of each output position by d-linear interpolation: a
    weighted sum of the 2^d neighbouring elements, 2^d multiplies and 2^d − 1 adds (7 FLOPs in 2-D),
    times the mask value (1 FLOP) when a mask is given. Each sampling point (shared by the C_in/og
    channels of its offset group) costs d adds (position + offset), 2d for the fractional parts and
    their complements, and 2^d·(d − 1) multiplies forming the corner weights (10 FLOPs in 2-D).
    Bounds checks and floor operations are not counted; ``table3`` drops the bias term.
    """
    x, w = ctx.shape(0), ctx.shape(1)
    d = len(x) - 2
    k = prod(w[2:])
    y = ctx.out_numel()
    s_out = prod(ctx.out_shape()[2:])
    macs = y * prod(w[1:])
    samples = x[0] * x[1] * k * s_out
    points = x[0] * offset_group * k * s_out
    per_sample = 2 ** (d + 1) - 1 + (1 if ctx.has_input(4) else 0)
    flops = ctx.convention.conv_flops_per_mac * macs + per_sample * samples + (3 * d + 2**d * (d - 1)) * points
    if ctx.has_input(3) and ctx.convention.count_bias:
        flops += y
    return Cost(flops=flops, macs=macs)


def _slope_flops(d: int) -> int:
    """FLOPs of one axis' derivative of a d-linear interpolation, ∂v/∂q_a = Σ over the 2^(d−1) corner
    pairs along a of (X_hi − X_lo)·(product of the other axes' weights): 2^(d−1) subtractions,
    2^(d−1) multiplies (none in 1-D, where the product is 1) and 2^(d−1) − 1 additions."""
    pairs = 2 ** (d - 1)
    return pairs + (pairs if d > 1 else 0) + pairs - 1


@backward("DeformConv")
def deform_conv_backward(ctx: NodeContext, *, offset_group: int = 1, **_) -> Cost:
    """FLOPs = 2·M·([W] + [X ∨ offset ∨ mask]) + samples·(m·[X ∨ offset] + 2^(d+1)·[X] + 2·[mask]
    + d·(s_d + 2)·[offset]) + d·2^(d−1)·max(d − 2, 0)·points·[offset] (+ |Y| for dB), with
    M = N·C_out·S_out·K·C_in/G the forward MACs, samples = N·C_in·K·S_out, points = N·og·K·S_out,
    m = 1 with a mask, s_d = 3·2^(d−1) − 1 (1 in 1-D) and [·] = 1 when that input needs a gradient
    (2-D: 1 + 8 for dX, 2 for the mask, 14 for the offsets per sample).

    The forward is Y = W ⋆ col with col = m·v and v the d-linear sample of X at p + Δ (see the
    forward formula). dW = dY·colᵀ and dcol = Wᵀ·dY (needed by X, offset and mask) are each the
    forward's M MACs; g = m·dcol costs 1 multiply per sample with a mask. dX scatters g to the 2^d
    corners through their weights (2^d multiplies + 2^d additions per sample); dmask = Σ dcol·v over
    the C_in/og channels of an offset group (1 multiply + 1 addition per sample); each offset
    coordinate a gets Σ g·∂v/∂q_a (∂v/∂q_a: s_d FLOPs, see :func:`_slope_flops`; then 1 multiply +
    1 addition per sample), its per-point products of the other d − 1 axes' weights costing
    2^(d−1)·(d − 2) multiplies per axis from 3-D on (none in 1-D and 2-D). dB = Σ dY: |Y| additions
    (dropped by ``table3``). Accumulations count one addition per term, the first included. The
    forward's columns, corner weights and fractional parts are taken as kept, not recomputed
    (implementations that recompute them, as torchvision does, add the forward's sampling terms).
    """
    x, w = ctx.shape(0), ctx.shape(1)
    d = len(x) - 2
    k = prod(w[2:])
    y = ctx.out_numel()
    s_out = prod(ctx.out_shape()[2:])
    samples = x[0] * x[1] * k * s_out
    points = x[0] * offset_group * k * s_out
    masked = ctx.has_input(4)
    g_x, g_w, g_offset = ctx.needs_grad(0), ctx.needs_grad(1), ctx.needs_grad(2)
    g_mask = masked and ctx.needs_grad(4)
    macs = y * prod(w[1:]) * (g_w + (g_x or g_offset or g_mask))
    flops = ctx.convention.conv_flops_per_mac * macs
    if masked and (g_x or g_offset):
        flops += samples
    if g_x:
        flops += 2 ** (d + 1) * samples
    if g_mask:
        flops += 2 * samples
    if g_offset:
        flops += d * (_slope_flops(d) + 2) * samples + d * 2 ** (d - 1) * max(d - 2, 0) * points
    if ctx.has_input(3) and ctx.needs_grad(3) and ctx.convention.count_bias:
        flops += y
    return Cost(flops=flops, macs=macs)


@formula("Col2Im", family="conv")
def col2im(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| = N·C·K·L: one addition per input element (every column entry is added into its
    image position).

    Overlapping patches accumulate; counting one add per input element also counts the first write
    into each image position (the image starts at zero), an upper bound by at most |Y|. Integer
    inputs count as ``int_ops``.
    """
    x = ctx.numel(0)
    return Cost(flops=x) if ctx.in_is_float(0) else Cost(int_ops=x)


@backward("Col2Im")
def col2im_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0: dX = Im2Col(dY), a gather; each of the |X| = N·C·K·L column entries reads the
    image gradient at the position it was added into (zero where it fell in the padding).

    The adjoint of a scatter-add is a gather: the overlap additions belong to the forward, the
    backward only moves |X| values (data movement, not counted). image_shape and block_shape are
    shapes, not differentiable.
    """
    return Cost()


@formula("CausalConvWithState", family="conv")
def causal_conv_with_state(ctx: NodeContext, *, activation: str = "none", **_) -> Cost:
    """FLOPs = 2·N·C·L·K (+ N·C·L with a bias, + N·C·L with activation silu/swish).

    A depth-wise causal 1-D convolution: X[N, C, L] and W[C, 1, K] give Y[N, C, L], MACs = N·C·L·K
    (the carried past_state supplies the K − 1 leading positions, so every output is a full K-tap
    sum). The bias adds one FLOP per output element (dropped by ``table3``); the fused SiLU counts one
    FLOP and one transcendental (its sigmoid's exp) per output element, as the element-wise Swish
    does (weighted conventions: its primitive operations, as Swish's). Concatenating past_state and
    slicing present_state are copies and cost nothing.
    """
    y = ctx.out_numel()
    macs = y * ctx.shape(1)[-1]
    flops = ctx.convention.conv_flops_per_mac * macs
    if ctx.has_input(2) and ctx.convention.count_bias:
        flops += y
    cost = Cost(flops=flops, macs=macs)
    if activation.lower() in ("silu", "swish"):
        cost += elementwise_activation(ctx.convention, "Swish", y)
    return cost


@backward("CausalConvWithState")
def causal_conv_with_state_backward(ctx: NodeContext, *, activation: str = "none", **_) -> Cost:
    """FLOPs = 2·N·C·L·K·([X] + [W]) (+ N·C·L for dB, + 5·N·C·L with N·C·L transcendentals for the
    SiLU), [·] = 1 when that input needs a gradient: dX = dZ ⋆ᵀ W and dW = dZ ⋆ X, the forward MACs
    N·C·L·K each; dB = Σ dZ over N and L; dZ = dY·silu'(z) with activation silu/swish.

    dX counts the forward's MACs also for the K(K − 1)/2 products per channel and sample that fall on
    past_state (as Conv's dX counts those falling on padding); past_state and present_state are not
    differentiable (schema), so they take and pass no gradient. The SiLU derivative
    σ(z)·(1 + z·(1 − σ(z))) is counted as the element-wise Swish backward (5 FLOPs, one exp per
    element), once whenever any input needs a gradient. The bias term is dropped by ``table3``.
    """
    y = ctx.out_numel()
    g_x, g_w = ctx.needs_grad(0), ctx.needs_grad(1)
    g_b = ctx.has_input(2) and ctx.needs_grad(2)
    macs = y * ctx.shape(1)[-1] * (g_x + g_w)
    flops = ctx.convention.conv_flops_per_mac * macs
    transcendentals = 0
    if activation.lower() in ("silu", "swish") and (g_x or g_w or g_b):
        per, _, trans = ELEMENTWISE_BACKWARD["Swish"]
        flops += per * y
        transcendentals = trans * y
    if g_b and ctx.convention.count_bias:
        flops += y
    return Cost(flops=flops, macs=macs, transcendentals=transcendentals)


@saves("CausalConvWithState")
def causal_conv_with_state_saved(ctx: NodeContext, *, activation: str = "none", **_) -> Saved:
    """X and past_state for dW (the window of every output reads both), W for dX; with silu/swish the
    pre-activation z (N·C·L elements in the output's type) for its derivative, when any input needs a gradient."""
    inputs = [1] if ctx.needs_grad(0) else []
    if ctx.needs_grad(1):
        inputs += [0, 3] if ctx.has_input(3) else [0]
    extra = ()
    if activation.lower() in ("silu", "swish") and any(ctx.needs_grad(i) for i in range(3)):
        extra = (("pre-activation", ctx.out_numel() * element_bytes(ctx.outputs[0].elem_type)),)
    return Saved(tuple(sorted(inputs)), (), extra)


@saves("Conv", "ConvTranspose")
def conv_saved(ctx: NodeContext, **_) -> Saved:
    """X and W: the backward of a convolution reads both (dX from W, dW from X), as torch's convolution keeps
    them (the bias: nothing)."""
    return keeps(0, 1)


saves_nothing("Col2Im")  # dX = Im2Col(dY), a gather by shapes alone (torch's fold keeps nothing)


@saves("DeformConv")
def deform_conv_saved(ctx: NodeContext, **_) -> Saved:
    """X, W, the offsets and the mask: the backward samples X again at the offset points (torchvision's
    ``deform_conv2d`` keeps them, and the bias)."""
    return keeps(*(i for i in (0, 1, 2, 4) if ctx.has_input(i)))
