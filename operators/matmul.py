"""Matrix products: Gemm and MatMul (HPC AI500 V3.0 Table 3: fully-connected)."""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.operators.attention import score_product_macs
from flopcount.registry import backward, formula, saves
from flopcount.saved import Saved, keeps


@formula("MatMul", family="matmul")
def matmul(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·|Y|·K, MACs = |Y|·K, with K the last dim of A.

    numpy semantics: batch dims broadcast (|Y| includes them), a 1-D A is a row vector and a 1-D B
    a column vector (their unit dim is dropped from Y, which leaves |Y|·K unchanged). For
    Y[B, M, N] this is 2·B·M·K·N. ``table3``: FLin·FLout, one FLOP per MAC. Under ``--attention
    executed`` the Q·Kᵀ and probs·V products of eager attention count the pairs their mask keeps
    (:func:`flopcount.operators.attention.score_product_macs`).
    """
    macs = score_product_macs(ctx, ctx.out_numel() * ctx.shape(0)[-1])
    return Cost(flops=ctx.convention.fc_flops_per_mac * macs, macs=macs)


@formula("Gemm", family="matmul")
def gemm(ctx: NodeContext, *, transA: int = 0, alpha: float = 1.0, beta: float = 1.0, **_) -> Cost:
    """FLOPs = 2·M·K·N (+ M·N for the bias C, + |C| when beta ≠ 1, + M·N when alpha ≠ 1).

    Y = alpha·A'·B' + beta·C with A' [M, K]; MACs = M·K·N. ``table3`` counts FLin·FLout = M·K·N
    and no bias or scaling terms.
    """
    a = ctx.shape(0)
    y = ctx.out_numel()
    macs = y * (a[0] if transA else a[1])
    flops = ctx.convention.fc_flops_per_mac * macs
    if ctx.convention.count_bias:
        if ctx.has_input(2):
            flops += y + (ctx.numel(2) if beta != 1.0 else 0)
        if alpha != 1.0:
            flops += y
    return Cost(flops=flops, macs=macs)


@backward("MatMul")
def matmul_backward(ctx: NodeContext, **_) -> Cost:
    """dA = dY·Bᵀ and dB = Aᵀ·dY: |Y|·K MACs each, for each operand that needs a gradient.

    Summing dB over broadcast batch dims is part of those accumulations. Under ``--attention executed`` the
    gradients of eager attention's Q·Kᵀ and probs·V run over the pairs the forward kept, as a masked kernel's do.
    """
    macs = score_product_macs(ctx, ctx.out_numel() * ctx.shape(0)[-1]) * (ctx.needs_grad(0) + ctx.needs_grad(1))
    return Cost(flops=ctx.convention.fc_flops_per_mac * macs, macs=macs)


@backward("Gemm")
def gemm_backward(ctx: NodeContext, *, transA: int = 0, alpha: float = 1.0, beta: float = 1.0, **_) -> Cost:
    """dA and dB: M·K·N MACs each, for each operand that needs a gradient; dC = Σ dY over the dims
    C broadcasts on: |Y| additions (+ |C| when beta ≠ 1); + |Y| to scale dY when alpha ≠ 1.
    """
    a = ctx.shape(0)
    y = ctx.out_numel()
    macs = y * (a[0] if transA else a[1]) * (ctx.needs_grad(0) + ctx.needs_grad(1))
    flops = ctx.convention.fc_flops_per_mac * macs
    if ctx.convention.count_bias:
        if ctx.has_input(2) and ctx.needs_grad(2):
            flops += y + (ctx.numel(2) if beta != 1.0 else 0)
        if alpha != 1.0 and (ctx.needs_grad(0) or ctx.needs_grad(1)):
            flops += y
    return Cost(flops=flops, macs=macs)


@saves("MatMul", "Gemm")
def product_saved(ctx: NodeContext, **_) -> Saved:
    """B for dA = dY·Bᵀ, A for dB = Aᵀ·dY: each operand only when the other needs a gradient (Gemm's C: nothing)."""
    return keeps(*(j for j in (0, 1) if ctx.needs_grad(1 - j)))
