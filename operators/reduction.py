"""Reductions. X reduces to Y; each output element combines |X|/|Y| inputs with |X|/|Y| − 1
binary operations, so a plain reduction costs |X| − |Y|. Each op's extra per-element or
per-output work is stated below; integer inputs count as ``int_ops``.

The counts are primitive operations (additions, comparisons for max, min and abs, multiplications,
a division, square root, exp or log), so a weighted convention prices each at its weight.
"""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves, saves_nothing
from flopcount.saved import Saved, keeps

# op → (the |X| − |Y| combining operation, primitive per input element, primitive per output element)
REDUCTIONS: dict[str, tuple[str, str | None, str | None]] = {
    "ReduceSum": ("add", None, None),
    "ReduceMax": ("cmp", None, None),
    "ReduceMin": ("cmp", None, None),
    "ReduceProd": ("mul", None, None),
    "ReduceMean": ("add", None, "div"),  # one division per output
    "ReduceSumSquare": ("add", "mul", None),  # one square per input
    "ReduceL1": ("add", "cmp", None),  # one absolute value per input
    "ReduceL2": ("add", "mul", "sqrt"),  # squares, then one square root per output
    "ReduceLogSum": ("add", None, "log"),  # one log per output
    "ReduceLogSumExp": ("add", "exp", "log"),  # one exp per input, one log per output
    "ArgMax": ("cmp", None, None),
    "ArgMin": ("cmp", None, None),
}


@formula(*REDUCTIONS, family="reduction")
def reduce(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| − |Y| + a·|X| + b·|Y| with (a, b) per op: ReduceMean (0, 1) = |X|,
    ReduceSumSquare and ReduceL1 (1, 0), ReduceL2 (1, 1) plus |Y| square roots, ReduceLogSum (0, 1)
    plus |Y| logs, ReduceLogSumExp (1, 1) plus |X| exps and |Y| logs; Sum, Max, Min, Prod, ArgMax,
    ArgMin (0, 0). An empty X costs nothing (Y is filled with the reduction's identity). Weighted
    conventions price each operation (``aiperf``: ReduceMean |X| + 3·|Y|, a division weighing 4).
    """
    x, y = ctx.numel(0), ctx.out_numel()
    combine, per_in, per_out = REDUCTIONS[ctx.op_type]
    if x == 0:  # reducing an empty tensor only writes the identity (0, 1, ±inf) to Y
        return Cost()
    counts = {combine: x - y}
    if per_in:
        counts[per_in] = counts.get(per_in, 0) + x
    if per_out:
        counts[per_out] = counts.get(per_out, 0) + y
    if not ctx.in_is_float(0):
        return Cost(int_ops=sum(counts.values()))
    return ctx.convention.weighted(**counts)


@backward("ReduceSum")
def reduce_sum_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0: dX is dY broadcast back over the reduced axes."""
    return Cost()


@backward("ReduceMean")
def reduce_mean_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y|: dY divided by the number of reduced elements, then broadcast."""
    return Cost(flops=ctx.out_numel()) if ctx.needs_grad(0) else Cost()


@backward("ReduceMax", "ReduceMin")
def reduce_extreme_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X|: a comparison per input element selects where dY goes."""
    return Cost(flops=ctx.numel(0)) if ctx.needs_grad(0) else Cost()


@backward("ReduceSumSquare", "ReduceL2")
def reduce_square_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·|X|: dX = 2·X·dY (ReduceL2: X·dY/Y, dY/Y once per output, |Y| more)."""
    extra = ctx.out_numel() if ctx.op_type == "ReduceL2" else 0
    return Cost(flops=2 * ctx.numel(0) + extra) if ctx.needs_grad(0) else Cost()


@backward("ReduceL1")
def reduce_l1_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| when X needs a gradient: dX = dY·sign(X), dY broadcast back over the reduced axes.

    One sign-multiply per input element (a select of dY or −dY by the sign of x), as Abs's backward
    counts it; the broadcast is free.
    """
    return Cost(flops=ctx.numel(0)) if ctx.needs_grad(0) else Cost()


@backward("ReduceLogSum")
def reduce_log_sum_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| when X needs a gradient (0 for an empty X): dX = dY/Σx, broadcast back over the
    reduced axes.

    One division per output element by the forward's sum before the log (kept, as autograd keeps the
    Log's input), then the free broadcast; no transcendentals.
    """
    return Cost(flops=ctx.out_numel()) if ctx.needs_grad(0) and ctx.numel(0) else Cost()


@backward("ReduceLogSumExp")
def reduce_log_sum_exp_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 3·|X|, transcendentals = |X|, when X needs a gradient: dX = dY·exp(X − Y), the softmax of
    each reduced group times its dY.

    Per input element: the subtraction of the broadcast Y, one exp and the multiply by the broadcast dY.
    """
    x = ctx.numel(0)
    return Cost(flops=3 * x, transcendentals=x) if ctx.needs_grad(0) else Cost()


@backward("ReduceProd")
def reduce_prod_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| + |Y| when X needs a gradient (0 for an empty X): dX = dY·Y/X, the product of the
    other elements of each group times its dY.

    dY·Y once per output element (|Y| multiplies), then one division by x per input element (|X|).
    Zeros are not special-cased: the count is this closed form's. Where a group holds a zero, Y/x is
    undefined and an implementation (PyTorch's prod_backward) computes the product of the other elements
    instead, from exclusive prefix and suffix products (about 3 operations per element of such a group);
    that depends on the values and is not counted.
    """
    x = ctx.numel(0)
    return Cost(flops=x + ctx.out_numel()) if ctx.needs_grad(0) and x else Cost()


saves_nothing("ReduceSum", "ReduceMean")


@saves("ReduceMax", "ReduceMin", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceProd")
def reduce_saved(ctx: NodeContext, **_) -> Saved:
    """X and Y: the backward compares X with the extreme Y, or scales by X/Y, sign(X), 1/Y, exp(X − Y) or Y/X."""
    return keeps(0, outputs=(0,))


@saves("ReduceSumSquare")
def reduce_sum_square_saved(ctx: NodeContext, **_) -> Saved:
    """X: dX = 2·X·dY."""
    return keeps(0)
