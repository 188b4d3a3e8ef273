"""Normalization (HPC AI500 V3.0 Table 3: normalization, Cin·H·W).

Every normalization op costs one FLOP per element of its input X, as Table 3 counts it. Each
also reports one transcendental (a reciprocal square root, or a power for LRN) per statistic it
normalizes by, stated per op.

Weighted conventions (``aiperf``) count each op's arithmetic instead, as the ONNX function that
defines it computes it, each primitive at its weight: :func:`standardize` for the
mean-and-variance ops (LayerNormalization, InstanceNormalization, GroupNormalization),
:func:`root_mean_square` for RMSNormalization, and stated per op for the others. Backward formulas
stay flat under every convention.
"""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.conventions import Convention
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves
from flopcount.saved import STAT_BYTES, Saved, keeps


def standardize(convention: Convention, n: int, stats: int, *, scale: bool = True, bias: bool = True) -> Cost:
    """``n`` elements in ``stats`` groups (of m = n/stats each) normalized by their mean and variance,
    as ONNX LayerNormalization's function does it. Flat: one FLOP per element, one transcendental
    per group.

    Weighted, per group: the mean (m − 1 adds, 1 div), x − mean (m adds), the variance (m squares,
    m − 1 adds, 1 div), + ε (1 add), the sqrt, its reciprocal (1 div), × 1/σ (m muls); then per
    element × γ (with ``scale``) and + β (with ``bias``). Adds 3n − stats (+ n), muls 2n (+ n),
    divs 3·stats, sqrts stats.
    """
    if convention.weights is None:
        return Cost(flops=n, transcendentals=stats)
    if n == 0:
        return Cost()
    return convention.weighted(add=3 * n - stats + bias * n, mul=2 * n + scale * n, div=3 * stats, sqrt=stats)


def root_mean_square(convention: Convention, n: int, stats: int, *, scale: bool = True) -> Cost:
    """``n`` elements in ``stats`` groups (of m = n/stats each) divided by their root mean square, as
    ONNX RMSNormalization's function does it. Flat: one FLOP per element, one transcendental per
    group.

    Weighted, per group: the squares (m muls), their mean (m − 1 adds, 1 div), + ε (1 add), the
    sqrt, its reciprocal (1 div), × 1/rms (m muls); then × γ per element (with ``scale``). Adds n,
    muls 2n (+ n), divs 2·stats, sqrts stats.
    """
    if convention.weights is None:
        return Cost(flops=n, transcendentals=stats)
    if n == 0:
        return Cost()
    return convention.weighted(add=n, mul=2 * n + scale * n, div=2 * stats, sqrt=stats)


def _rows(x: tuple[int, ...], axis: int) -> int:
    """Number of groups when X normalizes over its dims from ``axis`` on."""
    return prod(x[: axis % len(x)])


@formula("BatchNormalization", family="normalization")
def batch_norm(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| = N·C·H·W; transcendentals = C (one 1/sqrt(var + eps) per channel).

    Training-mode statistics (mean and variance over the batch) are not part of this inference
    count. Weighted conventions: per element (x − mean)·(1/σ)·γ + β, 2 adds and 2 muls; per channel
    var + ε, its sqrt and the reciprocal: 1 add, 1 sqrt, 1 div (``aiperf``: 4·|X| + 9·C).
    """
    x = ctx.shape(0)
    channels = x[1] if len(x) > 1 else 1
    if ctx.convention.weights is None:
        return Cost(flops=prod(x), transcendentals=channels)
    n = prod(x)
    return ctx.convention.weighted(add=2 * n + channels, mul=2 * n, sqrt=channels, div=channels)


@formula("InstanceNormalization", family="normalization")
def instance_norm(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| = N·C·H·W; transcendentals = N·C (one 1/sqrt per instance and channel).

    Weighted conventions: :func:`standardize` of the N·C groups of H·W elements, with scale and B.
    """
    x = ctx.shape(0)
    if ctx.convention.weights is None:
        return Cost(flops=prod(x), transcendentals=prod(x[:2]))
    return standardize(ctx.convention, prod(x), prod(x[:2]))


@formula("LayerNormalization", family="normalization")
def layer_norm(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = |X|; transcendentals = prod(X.shape[:axis]) (one 1/sqrt per normalized row).

    Weighted conventions: :func:`standardize` of the prod(X.shape[:axis]) rows, with Scale, and
    with B when given (``aiperf``: 7·|X| + 15·rows with B, 6·|X| + 15·rows without).
    """
    x = ctx.shape(0)
    if ctx.convention.weights is None or not x:
        return Cost(flops=prod(x), transcendentals=prod(x[: axis % len(x)]) if x else 1)
    return standardize(ctx.convention, prod(x), _rows(x, axis), bias=ctx.has_input(2))


@formula("GroupNormalization", family="normalization")
def group_norm(ctx: NodeContext, *, num_groups: int, **_) -> Cost:
    """FLOPs = |X| = N·C·H·W; transcendentals = N·num_groups (one 1/sqrt per group).

    Weighted conventions: :func:`standardize` of the N·num_groups groups, with scale and bias.
    """
    x = ctx.shape(0)
    if ctx.convention.weights is None:
        return Cost(flops=prod(x), transcendentals=x[0] * num_groups)
    return standardize(ctx.convention, prod(x), x[0] * num_groups)


@formula("LRN", family="normalization")
def lrn(ctx: NodeContext, *, size: int, **_) -> Cost:
    """FLOPs = |X| = N·C·H·W; transcendentals = |X| (one power (bias + alpha/size·Σx²)^beta per element).

    Weighted conventions, per element: its square (1 mul), the window sum over ``size`` channels
    (size − 1 adds, the zero padding at the channel edges included), × alpha/size (1 mul), + bias
    (1 add), the power as exp(beta·log s) (1 log, 1 mul, 1 exp) and x divided by it (1 div).
    """
    x = ctx.numel(0)
    if ctx.convention.weights is None:
        return Cost(flops=x, transcendentals=x)
    return ctx.convention.weighted(add=size * x, mul=3 * x, log=x, exp=x, div=x)


@backward("LRN")
def lrn_backward(ctx: NodeContext, *, size: int, **_) -> Cost:
    """FLOPs = (size + 5)·|X| when X needs a gradient: dX = dY/s^β − (2·alpha·beta/size)·X·Σ_window(dY·Y/s),
    s = bias + (alpha/size)·Σ_window x² the forward's scale.

    Per element: dY·Y/s (1 multiply, 1 division), the window sum over ``size`` channels (size − 1
    additions, the zero padding at the channel edges included, as in the forward), times the constant
    2·alpha·beta/size and times X (2 multiplies), dY divided by s^β (1 division) and the subtraction
    (1). s and s^β are the forward's intermediates, kept (as Caffe's and cuDNN's LRN keep the scale):
    no power is evaluated again, so no transcendentals. X is the only input.
    """
    return Cost(flops=(size + 5) * ctx.numel(0)) if ctx.needs_grad(0) else Cost()


@formula("RMSNormalization", family="normalization")
def rms_norm(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = |X|; transcendentals = prod(X.shape[:axis]) (one 1/sqrt(mean(x²) + eps) per normalized row).

    Same convention as LayerNormalization: one FLOP per element of X (HPC AI500 Table 3,
    Cin·H·W), not the squares, sums and scale multiplies one by one. Weighted conventions count
    them: :func:`root_mean_square` of the rows, with scale (``aiperf``: 4·|X| + 12·rows).
    """
    x = ctx.shape(0)
    if ctx.convention.weights is None or not x:
        return Cost(flops=prod(x), transcendentals=prod(x[: axis % len(x)]) if x else 1)
    return root_mean_square(ctx.convention, prod(x), _rows(x, axis))


@formula("MeanVarianceNormalization", family="normalization")
def mean_variance_norm(ctx: NodeContext, *, axes: list[int] = (0, 2, 3), **_) -> Cost:
    """FLOPs = |X|; transcendentals = |X| / prod(X.shape[a] for a in axes) (one sqrt of the variance
    per statistic, i.e. per position of the dims not in ``axes``; C for the default axes [0, 2, 3]).

    Same convention as the other normalization ops: one FLOP per element of X (HPC AI500 Table 3,
    Cin·H·W), not the mean, variance, subtraction and division one by one. Weighted conventions
    count them as the ONNX function does, per statistic of m elements: E[x] and E[x²] (m squares,
    2(m − 1) adds, 2 divs), E[x]² (1 mul), the variance (1 add), its sqrt, + ε (1 add), x − E[x]
    (m adds) and the division (m divs): adds 3|X|, muls |X| + S, divs |X| + 2S, sqrts S for S
    statistics.
    """
    x = ctx.shape(0)
    reduced = {a % len(x) for a in axes} if x else set()
    stats = prod(d for i, d in enumerate(x) if i not in reduced)
    if ctx.convention.weights is None:
        return Cost(flops=prod(x), transcendentals=stats)
    n = prod(x)
    return ctx.convention.weighted(add=3 * n, mul=n + stats, div=n + 2 * stats, sqrt=stats) if n else Cost()


@backward("MeanVarianceNormalization")
def mean_variance_norm_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 7·|X| when X needs a gradient: dX = (1/σ)·(dY − mean(dY) − Y·mean(dY·Y)), the means over
    each statistic's m elements (the dims in ``axes``) and σ the forward's denominator.

    Per statistic: Σ dY (m − 1 additions), Σ dY·Y (m multiplies, m − 1 additions) and the two
    divisions by m; per element: Y·mean(dY·Y) (1), two subtractions and × 1/σ (1): 7·|X| in all for
    S statistics (7|X| − 2S + 2S), the count of the other normalizations' dX. The per-statistic
    correction for ε being added to σ rather than to the variance ((σ + ε)/σ, 2 operations per
    statistic) is not counted. X is the only input.
    """
    return Cost(flops=7 * ctx.numel(0)) if ctx.needs_grad(0) else Cost()


@formula("LpNormalization", family="normalization")
def lp_norm(ctx: NodeContext, *, axis: int = -1, p: int = 2, **_) -> Cost:
    """FLOPs = |X|; transcendentals = |X| / X.shape[axis] for p = 2 (one sqrt per normalized vector),
    0 for p = 1.

    Same convention as the other normalization ops: one FLOP per element of X (HPC AI500 Table 3,
    Cin·H·W), not the abs/square, sum and division one by one. Weighted conventions count them,
    for V vectors: |X| squares (p = 2) or abs (p = 1, as comparisons), |X| − V adds, V sqrts
    (p = 2) and |X| divisions.
    """
    x = ctx.shape(0)
    n = prod(x)
    vectors = n // x[axis % len(x)] if x and x[axis % len(x)] else 0
    if ctx.convention.weights is None:
        return Cost(flops=n, transcendentals=vectors if p == 2 else 0)
    if n == 0:
        return Cost()
    if p == 2:
        return ctx.convention.weighted(mul=n, add=n - vectors, sqrt=vectors, div=n)
    return ctx.convention.weighted(cmp=n, add=n - vectors, div=n)


@backward("LpNormalization")
def lp_norm_backward(ctx: NodeContext, *, axis: int = -1, p: int = 2, **_) -> Cost:
    """FLOPs = 5·|X| − V for p = 2, 5·|X| for p = 1, when X needs a gradient; V = |X|/n vectors of
    n = X.shape[axis] elements: dX = (dY − g·Σ dY·Y)/‖x‖_p per vector, g = Y (p = 2) or sign(X) (p = 1).

    Per vector: Σ dY·Y (n multiplies, n − 1 additions), g·Σ (n multiplies; p = 1: a select of the sum or
    its negation by the sign of x, n selects and 1 negation), n subtractions and n divisions by the
    norm, which the forward computed. X is the only input.
    """
    if not ctx.needs_grad(0):
        return Cost()
    x = ctx.shape(0)
    n = prod(x)
    vectors = n // x[axis % len(x)] if x and x[axis % len(x)] else 0
    return Cost(flops=5 * n - vectors if p == 2 else 5 * n) if vectors else Cost()


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


def _stat_rows(ctx: NodeContext, axis: int) -> int:
    """Rows over which a layer norm computes its statistics: the product of X's dims before ``axis``."""
    x = ctx.shape(0)
    return prod(x[: axis % len(x)]) if x else 1


@saves("LayerNormalization")
def layer_norm_saved(ctx: NodeContext, *, axis: int = -1, **_) -> Saved:
    """X, the scale and bias, and the mean and reciprocal standard deviation of each row in float32
    (2·4·rows bytes), as torch's ``native_layer_norm`` keeps them."""
    rows = _stat_rows(ctx, axis)
    return Saved(inputs=tuple(i for i in (0, 1, 2) if ctx.has_input(i)),
                 extra=(("mean, rstd (float32)", 2 * STAT_BYTES * rows),))


@saves("RMSNormalization")
def rms_norm_saved(ctx: NodeContext, *, axis: int = -1, **_) -> Saved:
    """X, the scale, and the reciprocal root mean square of each row in float32 (4·rows bytes)."""
    rows = _stat_rows(ctx, axis)
    return Saved(inputs=tuple(i for i in (0, 1) if ctx.has_input(i)), extra=(("rstd (float32)", STAT_BYTES * rows),))


@saves("BatchNormalization")
def batch_norm_saved(ctx: NodeContext, **_) -> Saved:
    """X, the scale, the running statistics, and the batch's mean and inverse standard deviation per channel in
    float32 (2·4·C bytes), as torch's ``native_batch_norm`` keeps them."""
    c = ctx.shape(0)[1] if len(ctx.shape(0)) > 1 else 1
    return Saved(inputs=tuple(i for i in range(5) if ctx.has_input(i)),
                 extra=(("mean, invstd (float32)", 2 * STAT_BYTES * c),))


@saves("InstanceNormalization", "GroupNormalization")
def group_norm_saved(ctx: NodeContext, *, num_groups: int = 0, **_) -> Saved:
    """X, the scale, and the mean and reciprocal standard deviation of each (sample, group) in float32
    (2·4·N·G bytes; instance norm: G = C)."""
    x = ctx.shape(0)
    groups = num_groups or (x[1] if len(x) > 1 else 1)
    return Saved(inputs=tuple(i for i in (0, 1) if ctx.has_input(i)),
                 extra=(("mean, rstd (float32)", 2 * STAT_BYTES * x[0] * groups),))


@saves("LRN", "LpNormalization")
def x_and_y_saved(ctx: NodeContext, **_) -> Saved:
    """X and Y: LRN's dX reads both (and the scale, computed again from X); Lp normalization's dX = (dY − Y·Σ
    dY·Y)/‖X‖, with ‖X‖ = X/Y."""
    return keeps(0, outputs=(0,))


@saves("MeanVarianceNormalization")
def mean_variance_norm_saved(ctx: NodeContext, *, axes: list[int] = (0, 2, 3), **_) -> Saved:
    """X, and the mean and reciprocal standard deviation of each statistic in float32 (2·4·S bytes for S = |X| /
    prod(X.shape[a] for a in axes)): the normalization without scale and bias that torch's ``native_batch_norm``
    (training, axes [0, 2, 3]) and instance norm (axes [2, 3]) compute, keeping what they keep."""
    x = ctx.shape(0)
    reduced = prod(x[a % len(x)] for a in axes) if x else 1
    statistics = prod(x) // reduced if reduced else 0
    return Saved(inputs=(0,), extra=(("mean, rstd (float32)", 2 * STAT_BYTES * statistics),))
