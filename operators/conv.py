"""Convolution (HPC AI500 V3.0 Table 3: convolution, depth-wise and group convolution)."""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.operators.elementwise import activation as elementwise_activation
from flopcount.registry import backward, formula


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
