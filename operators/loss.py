"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick one value per target position (a gather, free), negate and optionally weight it, then
reduce. With T = |target| positions, a weight vector (w = 1, else 0) and the reduction:
``none`` 0, ``sum`` T − 1 adds, ``mean`` T − 1 adds and 1 division, plus T − 1 adds for the sum of
the picked weights when weighted. ``ignore_index`` skips positions at run time; the count
includes them (an upper bound).
"""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import formula


def _nll(targets: int, weighted: bool, reduction: str) -> int:
    picked = (2 if weighted else 1) * targets  # negate, times the class weight
    if reduction == "none" or targets == 0:
        return picked
    reduce = targets - 1
    if reduction == "mean":
        reduce += 1 + (targets - 1 if weighted else 0)
    return picked + reduce


@formula("NegativeLogLikelihoodLoss", family="loss")
def nll_loss(ctx: NodeContext, *, reduction: str = "mean", **_) -> Cost:
    """FLOPs = (1 + w)·T + R: for T = |target| positions, one negation per picked input value
    and one multiply by its class weight when ``weight`` is given (w = 1); R = 0 (none),
    T − 1 (sum), T + w·(T − 1) (mean: the sum, the sum of picked weights, one division).

    ``ignore_index`` positions are counted (an upper bound).
    """
    return Cost(flops=_nll(ctx.numel(1), ctx.has_input(2), reduction))


@formula("SoftmaxCrossEntropyLoss", family="loss")
def softmax_cross_entropy(ctx: NodeContext, *, reduction: str = "mean", **_) -> Cost:
    """FLOPs = T·(5C − 1) + (1 + w)·T + R with T·(C + 1) transcendentals, for scores [N, C, d1, …]
    and T = |labels| = N·d1·… positions: a log-softmax over the C classes of each position, then the
    NegativeLogLikelihoodLoss count ((1 + w)·T + R, see there).

    Log-softmax per position: C − 1 comparisons (max), C subtractions, C exps, C − 1 adds, 1 log and
    C subtractions = 5C − 1 FLOPs, C + 1 transcendentals; it is also the ``log_prob`` output.
    """
    scores = ctx.shape(0)
    c = scores[1] if len(scores) > 1 else 1
    t = ctx.numel(1)
    flops = t * (5 * c - 1) + _nll(t, ctx.has_input(2), reduction)
    return Cost(flops=flops, transcendentals=t * (c + 1))
