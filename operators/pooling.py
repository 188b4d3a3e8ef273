"""Pooling (HPC AI500 V3.0 Table 3: pooling, Cin·H·W).

Weighted conventions (``aiperf``) count each output's arithmetic over its window of K elements
instead: a max pool K − 1 comparisons, an average pool K − 1 additions and one division, an Lp
pool (p = 2) K squares, K − 1 additions and a square root (other p: per element an abs, a power
exp(p·log|x|), then the 1/p power of the sum), each at its weight.
"""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.conventions import Convention
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves, zero_cost
from flopcount.saved import INDEX_BYTES, Saved, keeps

# pooling op → what each window computes, for weighted conventions
WINDOW_KIND = {
    "MaxPool": "max", "GlobalMaxPool": "max", "MaxRoiPool": "max",
    "AveragePool": "average", "GlobalAveragePool": "average", "LpPool": "lp", "GlobalLpPool": "lp",
}  # fmt: skip


def window_cost(convention: Convention, kind: str, k: int, outputs: int, p: int = 2) -> Cost:
    """Primitive operations of ``outputs`` windows of ``k`` elements, at the convention's weights:
    max K − 1 cmp; average K − 1 add + 1 div; Lp (p = 2) K mul + (K − 1) add + 1 sqrt, other p
    K·(cmp + log + mul + exp) + (K − 1) add + (log + mul + exp)."""
    if k == 0 or outputs == 0:
        return Cost()
    if kind == "max":
        return convention.weighted(cmp=(k - 1) * outputs)
    if kind == "average":
        return convention.weighted(add=(k - 1) * outputs, div=outputs)
    if p == 2:
        return convention.weighted(mul=k * outputs, add=(k - 1) * outputs, sqrt=outputs)
    powers = k * outputs + outputs  # |x|^p per element, s^(1/p) per output
    return convention.weighted(cmp=k * outputs, add=(k - 1) * outputs, log=powers, mul=powers, exp=powers)


@formula("MaxPool", "AveragePool", "LpPool", family="pooling")
def pool(ctx: NodeContext, *, kernel_shape, p: int = 2, **_) -> Cost:
    """FLOPs = K·|Y|: each output element reads a window of K = prod(kernel_shape) elements.

    Padded positions inside a window are counted as read (the usual convention; an average pool
    with ``count_include_pad=0`` reads slightly fewer at the borders). ``table3`` counts Cin·H·W of
    the input instead: |X|. LpPool also counts K + 1 transcendentals (powers and the root) per output.
    Weighted conventions: each output's window arithmetic (:func:`window_cost`; ``aiperf``: MaxPool
    (K − 1)·|Y|, AveragePool (K + 3)·|Y|).
    """
    if ctx.convention.weights is not None:
        return window_cost(ctx.convention, WINDOW_KIND[ctx.op_type], prod(kernel_shape), ctx.out_numel(), p)
    if ctx.convention.pooling == "input":
        flops = ctx.numel(0)
    else:
        flops = prod(kernel_shape) * ctx.out_numel()
    trans = (prod(kernel_shape) + 1) * ctx.out_numel() if ctx.op_type == "LpPool" else 0
    return Cost(flops=flops, transcendentals=trans)


@formula("GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool", family="pooling")
def global_pool(ctx: NodeContext, *, p: int = 2, **_) -> Cost:
    """FLOPs = |X| = N·C·H·W: the window is the whole spatial extent (same under ``table3``).

    GlobalLpPool also counts |X| + N·C transcendentals (powers and roots). Weighted conventions: the
    window arithmetic of each output over its H·W elements, as for the windowed pools.
    """
    if ctx.convention.weights is not None:
        y = ctx.out_numel()
        return window_cost(ctx.convention, WINDOW_KIND[ctx.op_type], ctx.numel(0) // y if y else 0, y, p)
    x = ctx.numel(0)
    trans = x + ctx.out_numel() if ctx.op_type == "GlobalLpPool" else 0
    return Cost(flops=x, transcendentals=trans)


# LpPool backward per p: (FLOPs per window element, FLOPs per output, transcendentals per element,
# transcendentals per output), accumulation into dX excluded (see lp_pool_backward).
LP_BACKWARD: dict[int, tuple[int, int, int, int]] = {
    1: (2, 0, 0, 0),  # sign(x)·dY: sign, multiply
    2: (1, 1, 0, 0),  # x·t with t = dY/y once per output
}
# other p: abs, |x|^(p−2) (a power), ·x, ·t; per output y^(p−1) (a power) and t = dY/y^(p−1)
LP_BACKWARD_POWER = (4, 2, 1, 1)


def _lp_backward(ctx: NodeContext, p: int, k: int, accumulate: bool) -> Cost:
    per_element, per_output, trans_element, trans_output = LP_BACKWARD.get(p, LP_BACKWARD_POWER)
    terms, y = k * ctx.out_numel(), ctx.out_numel()
    return Cost(
        flops=(per_element + accumulate) * terms + per_output * y,
        transcendentals=trans_element * terms + trans_output * y,
    )


@backward("LpPool")
def lp_pool_backward(ctx: NodeContext, *, kernel_shape, p: int = 2, **_) -> Cost:
    """FLOPs = (c_p + 1)·K·|Y| + e_p·|Y|: dX_i += dY·|x_i|^(p−1)·sign(x_i)/y^(p−1) over the K elements
    of each window, with (c_p, e_p) = (2, 0) for p = 1, (1, 1) for p = 2 and (4, 2) otherwise, plus
    (K + 1)·|Y| transcendentals for p ∉ {1, 2}.

    Per output, t = dY/y^(p−1): nothing for p = 1 (t = dY), one division for p = 2, a power and a
    division otherwise. Per window element, the factor |x|^(p−1)·sign(x) times t: p = 1 sign(x)·t (a
    sign and a multiply), p = 2 x·t (one multiply), otherwise x·|x|^(p−2)·t (abs, a power, two
    multiplies); then one addition into dX, as windows may overlap (the first write counted as an
    addition, as in the other pooling backward formulas). Padded window positions are counted as in
    the forward. Powers count one FLOP and one transcendental each.
    """
    return _lp_backward(ctx, p, prod(kernel_shape), accumulate=True) if ctx.needs_grad(0) else Cost()


@backward("GlobalLpPool")
def global_lp_pool_backward(ctx: NodeContext, *, p: int = 2, **_) -> Cost:
    """FLOPs = c_p·|X| + e_p·|Y| with LpPool's (c_p, e_p) = (2, 0) for p = 1, (1, 1) for p = 2,
    (4, 2) otherwise, plus |X| + |Y| transcendentals for p ∉ {1, 2}: dX = dY·|x|^(p−1)·sign(x)/y^(p−1).

    As LpPool's backward with the window the whole spatial extent (K = H·W), except that every input
    element belongs to exactly one window, so its gradient is written, not added.
    """
    if not ctx.needs_grad(0):
        return Cost()
    y = ctx.out_numel()
    return _lp_backward(ctx, p, ctx.numel(0) // y if y else 0, accumulate=False)


@formula("MaxRoiPool", family="pooling")
def max_roi_pool(ctx: NodeContext, *, pooled_shape, **_) -> Cost:
    """FLOPs = R·C·h·w·⌈H/h⌉·⌈W/w⌉ ≈ R·C·H·W for R ROIs, pooled_shape (h, w) and X of spatial size
    H × W: each of the |Y| = R·C·h·w outputs takes the max of its bin, counted as ⌈H/h⌉·⌈W/w⌉
    reads (a ROI covering the whole feature map).

    Data-dependent: a bin is 1/(h·w) of its ROI, and the ROIs are values. The count takes every
    ROI as the whole feature map, the largest ROI that lies inside it, so it bounds ROIs inside the
    map up to the rounding of bin edges (a bin may read one more row or column). The ROI coordinate
    scaling (a few FLOPs per ROI) is not counted; the same under ``table3``. Weighted conventions:
    ⌈H/h⌉·⌈W/w⌉ − 1 comparisons per output, at their weight.
    """
    x = ctx.shape(0)
    h, w = pooled_shape
    window = _ceil_div(x[2], h) * _ceil_div(x[3], w)
    if ctx.convention.weights is not None:
        return window_cost(ctx.convention, "max", window, ctx.out_numel())
    return Cost(flops=window * ctx.out_numel())


@backward("MaxRoiPool", buffers=(1,))  # the boxes: coordinates, never trained
def max_roi_pool_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| = R·C·h·w: each dY is added into the input element its bin's maximum came from.

    The argmax is kept from the forward; the ROIs are not differentiable (schema) and get no gradient.
    """
    return Cost(flops=ctx.out_numel()) if ctx.needs_grad(0) else Cost()


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


zero_cost(
    "MaxUnpool",
    family="pooling",
    reason="scatters each input value to its recorded index in a zero-filled output; no arithmetic",
)


@saves("MaxUnpool")
def max_unpool_saved(ctx: NodeContext, **_) -> Saved:
    """The indices: dX is dY gathered at them."""
    return keeps(1)


@backward("MaxPool", "GlobalMaxPool")
def max_pool_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y|: each dY is added into the input position its window's maximum came from."""
    return Cost(flops=ctx.out_numel()) if ctx.needs_grad(0) else Cost()


@backward("AveragePool")
def average_pool_backward(ctx: NodeContext, *, kernel_shape, **_) -> Cost:
    """FLOPs = (K + 1)·|Y|: each dY is divided by K once and added to the K positions of its window."""
    return Cost(flops=(prod(kernel_shape) + 1) * ctx.out_numel()) if ctx.needs_grad(0) else Cost()


@backward("GlobalAveragePool")
def global_average_pool_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| + |X|: dY divided by H·W, then written to every input position (one add each)."""
    return Cost(flops=ctx.out_numel() + ctx.numel(0)) if ctx.needs_grad(0) else Cost()


@saves("MaxPool", "GlobalMaxPool")
def max_pool_saved(ctx: NodeContext, **_) -> Saved:
    """X and the index of each window's maximum, int64 per output element, as torch's ``max_pool*_with_indices``
    keeps them."""
    return Saved(inputs=(0,), extra=(("argmax indices (int64)", INDEX_BYTES * ctx.out_numel()),))


@saves("AveragePool", "GlobalAveragePool")
def average_pool_saved(ctx: NodeContext, **_) -> Saved:
    """X, as torch's ``avg_pool*`` and ``adaptive_avg_pool*`` keep it (their backward reads its geometry)."""
    return keeps(0)


@saves("LpPool", "GlobalLpPool")
def lp_pool_saved(ctx: NodeContext, **_) -> Saved:
    """X and Y: dX = dY·(X/Y)^(p−1)·sign(X)."""
    return keeps(0, outputs=(0,))


#: Bytes of the int32 argmax torchvision's ``roi_pool`` keeps per output element.
ROI_ARGMAX_BYTES = 4


@saves("MaxRoiPool")
def max_roi_pool_saved(ctx: NodeContext, **_) -> Saved:
    """The boxes and the index of each bin's maximum, int32 per output element, as torchvision's ``roi_pool`` keeps
    them, when X needs a gradient."""
    if not ctx.needs_grad(0):
        return Saved()
    return Saved(inputs=(1,), extra=(("argmax indices (int32)", ROI_ARGMAX_BYTES * ctx.out_numel()),))
