"""Convolution (HPC AI500 V3.0 Table 3: convolution, depth-wise and group convolution)."""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import formula


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
