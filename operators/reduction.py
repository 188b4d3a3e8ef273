"""Reductions. X reduces to Y; each output element combines |X|/|Y| inputs with |X|/|Y| − 1
binary operations, so a plain reduction costs |X| − |Y|. Each op's extra per-element or
per-output work is stated below; integer inputs count as ``int_ops``.
"""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula

# op → (FLOPs per input element, FLOPs per output element, transcendentals per input, per output)
# on top of the |X| − |Y| combining operations
REDUCTIONS: dict[str, tuple[int, int, int, int]] = {
    "ReduceSum": (0, 0, 0, 0),
    "ReduceMax": (0, 0, 0, 0),
    "ReduceMin": (0, 0, 0, 0),
    "ReduceProd": (0, 0, 0, 0),
    "ReduceMean": (0, 1, 0, 0),  # one division per output
    "ReduceSumSquare": (1, 0, 0, 0),  # one square per input
    "ReduceL1": (1, 0, 0, 0),  # one absolute value per input
    "ReduceL2": (1, 1, 0, 1),  # squares, then one square root per output
    "ReduceLogSum": (0, 1, 0, 1),  # one log per output
    "ReduceLogSumExp": (1, 1, 1, 1),  # one exp per input, one log per output
    "ArgMax": (0, 0, 0, 0),
    "ArgMin": (0, 0, 0, 0),
}


@formula(*REDUCTIONS, family="reduction")
def reduce(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| − |Y| + a·|X| + b·|Y| with (a, b) per op: ReduceMean (0, 1) = |X|,
    ReduceSumSquare and ReduceL1 (1, 0), ReduceL2 (1, 1) plus |Y| square roots, ReduceLogSum (0, 1)
    plus |Y| logs, ReduceLogSumExp (1, 1) plus |X| exps and |Y| logs; Sum, Max, Min, Prod, ArgMax,
    ArgMin (0, 0). An empty X costs nothing (Y is filled with the reduction's identity).
    """
    x, y = ctx.numel(0), ctx.out_numel()
    per_in, per_out, t_in, t_out = REDUCTIONS[ctx.op_type]
    if x == 0:  # reducing an empty tensor only writes the identity (0, 1, ±inf) to Y
        return Cost()
    ops = x - y + per_in * x + per_out * y
    if not ctx.in_is_float(0):
        return Cost(int_ops=ops)
    return Cost(flops=ops, transcendentals=t_in * x + t_out * y)


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
