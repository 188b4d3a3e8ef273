"""Normalization (HPC AI500 V3.0 Table 3: normalization, Cin·H·W).

Every normalization op costs one FLOP per element of its input X, as Table 3 counts it. Each
also reports one transcendental (a reciprocal square root, or a power for LRN) per statistic it
normalizes by, stated per op.
"""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula


@formula("BatchNormalization", family="normalization")
def batch_norm(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| = N·C·H·W; transcendentals = C (one 1/sqrt(var + eps) per channel).

    Training-mode statistics (mean and variance over the batch) are not part of this inference
    count.
    """
    x = ctx.shape(0)
    return Cost(flops=prod(x), transcendentals=x[1] if len(x) > 1 else 1)


@formula("InstanceNormalization", family="normalization")
def instance_norm(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| = N·C·H·W; transcendentals = N·C (one 1/sqrt per instance and channel)."""
    x = ctx.shape(0)
    return Cost(flops=prod(x), transcendentals=prod(x[:2]))


@formula("LayerNormalization", family="normalization")
def layer_norm(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = |X|; transcendentals = prod(X.shape[:axis]) (one 1/sqrt per normalized row)."""
    x = ctx.shape(0)
    return Cost(flops=prod(x), transcendentals=prod(x[: axis % len(x)]) if x else 1)


@formula("GroupNormalization", family="normalization")
def group_norm(ctx: NodeContext, *, num_groups: int, **_) -> Cost:
    """FLOPs = |X| = N·C·H·W; transcendentals = N·num_groups (one 1/sqrt per group)."""
    x = ctx.shape(0)
    return Cost(flops=prod(x), transcendentals=x[0] * num_groups)


@formula("LRN", family="normalization")
def lrn(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| = N·C·H·W; transcendentals = |X| (one power (bias + alpha/size·Σx²)^beta per element)."""
    x = ctx.numel(0)
    return Cost(flops=x, transcendentals=x)


@formula("RMSNormalization", family="normalization")
def rms_norm(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = |X|; transcendentals = prod(X.shape[:axis]) (one 1/sqrt(mean(x²) + eps) per normalized row).

    Same convention as LayerNormalization: one FLOP per element of X (HPC AI500 Table 3,
    Cin·H·W), not the squares, sums and scale multiplies one by one.
    """
    x = ctx.shape(0)
    return Cost(flops=prod(x), transcendentals=prod(x[: axis % len(x)]) if x else 1)


@formula("MeanVarianceNormalization", family="normalization")
def mean_variance_norm(ctx: NodeContext, *, axes: list[int] = (0, 2, 3), **_) -> Cost:
    """FLOPs = |X|; transcendentals = |X| / prod(X.shape[a] for a in axes) (one sqrt of the variance
    per statistic, i.e. per position of the dims not in ``axes``; C for the default axes [0, 2, 3]).

    Same convention as the other normalization ops: one FLOP per element of X (HPC AI500 Table 3,
    Cin·H·W), not the mean, variance, subtraction and division one by one.
    """
    x = ctx.shape(0)
    reduced = {a % len(x) for a in axes} if x else set()
    return Cost(flops=prod(x), transcendentals=prod(d for i, d in enumerate(x) if i not in reduced))


@formula("LpNormalization", family="normalization")
def lp_norm(ctx: NodeContext, *, axis: int = -1, p: int = 2, **_) -> Cost:
    """FLOPs = |X|; transcendentals = |X| / X.shape[axis] for p = 2 (one sqrt per normalized vector),
    0 for p = 1.

    Same convention as the other normalization ops: one FLOP per element of X (HPC AI500 Table 3,
    Cin·H·W), not the abs/square, sum and division one by one.
    """
    x = ctx.shape(0)
    n = prod(x)
    vectors = n // x[axis % len(x)] if x and x[axis % len(x)] else 0
    return Cost(flops=n, transcendentals=vectors if p == 2 else 0)


@backward("BatchNormalization", buffers=(3, 4))
@backward("InstanceNormalization", "LayerNormalization", "GroupNormalization", "RMSNormalization")
def normalization_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 7·|X| when X needs a gradient: dβ = Σ dY (|X|), dγ = Σ dY·x̂ (2·|X|) and
    dX = (γ/σ)·(dY − dβ/m − x̂·dγ/m) (4·|X|), the sums over each statistic's m elements; without
    dX only the parameter gradients: 2·|X| for the scale and |X| for the bias.

    BatchNormalization's running mean and variance (inputs 3 and 4) are buffers, never trained.
    RMSNormalization, which has no mean, is counted the same way (an upper bound).
    """
    x = ctx.numel(0)
    if ctx.needs_grad(0):
        return Cost(flops=7 * x)
    return Cost(flops=2 * x * ctx.needs_grad(1) + x * ctx.needs_grad(2))
