"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

Both pick one value per target position (a gather, free), negate and optionally weight it, then
reduce. With T = |target| positions, a weight vector (w = 1, else 0) and the reduction:
``none`` 0, ``sum`` T − 1 adds, ``mean`` T − 1 adds and 1 division, plus T − 1 adds for the sum of
the picked weights when weighted. ``ignore_index`` skips positions at run time; the count
includes them (an upper bound).

Backward: the gradient with respect to the scores (the log-probabilities for NLL); the labels never
get one (integers, and NonDifferentiable in the schema). The class weights get one only where the
schema lets them (opset 12, whose categories are unknown; from opset 13 on they are NonDifferentiable).
"""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves
from flopcount.saved import Saved, element_bytes, keeps


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


def _weight_gradient(targets: int, classes: int, reduction: str) -> int:
    """FLOPs of dW_c = Σ over the positions of class c of the picked −x (or −log_prob) times the output
    gradient: per position a negation, a multiply by dL_t and the scatter-add into its class (none:
    3T); sum: the negation and the scatter-add per position, then dL times each of the C sums (2T + C);
    mean (L = Σ w·a / Σ w): (a_t − L) per position before the scatter-add, then dL/W times each sum
    (3T + C; the division dL/W is counted once with the mean's division)."""
    if targets == 0:
        return 0
    if reduction == "none":
        return 3 * targets
    return (3 if reduction == "mean" else 2) * targets + classes


def _mean_division(ctx: NodeContext, reduction: str, targets: int) -> int:
    """One division of dL by T (or by the forward's sum of picked weights) under ``mean``."""
    return 1 if reduction == "mean" and targets and (ctx.needs_grad(0) or ctx.needs_grad(2)) else 0


@backward("NegativeLogLikelihoodLoss")
def nll_loss_backward(ctx: NodeContext, *, reduction: str = "mean", **_) -> Cost:
    """FLOPs = (1 + w)·T + m when the input needs a gradient, for T = |target| positions: dX is zero
    except dX[t, target_t] = −w_t·dL_t (dL/T, or dL/Σw, under mean); w = 1 with a ``weight``, m = 1
    under ``mean``.

    Per position the output gradient negated (1) and times the class weight (w), written to the
    target's entry of an otherwise zero dX (the zeros and the writes are free); ``mean`` divides dL by T
    or by the forward's sum of the picked weights once (m). ``ignore_index`` positions are counted (an
    upper bound). The target never gets a gradient; the weight only at opset 12 (see the module), then
    dW adds 3T (none), 2T + C (sum) or 3T + C (mean) for C = |weight| classes.
    """
    t = ctx.numel(1)
    weighted = ctx.has_input(2)
    flops = _mean_division(ctx, reduction, t)
    if ctx.needs_grad(0):
        flops += (1 + weighted) * t
    if weighted and ctx.needs_grad(2):
        flops += _weight_gradient(t, ctx.numel(2), reduction)
    return Cost(flops=flops)


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


@backward("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_backward(ctx: NodeContext, *, reduction: str = "mean", **_) -> Cost:
    """FLOPs = T·(2C + 1) + w·T + m (+ T·(4C − 1) with the ``log_prob`` output), transcendentals = T·C,
    when the scores need a gradient; T = |labels| positions of C classes: dS = g_t·(softmax(s_t) −
    onehot(label_t)) with g_t = w_t·dL_t (dL/T, or dL/Σw, under mean); w = 1 with ``weights``, m = 1
    under ``mean``.

    Per position: softmax = exp(log_prob) from the forward's log-probabilities (C exps), times g_t
    (C multiplies), g_t subtracted at the label (1); g_t is dL_t times the class weight (w per
    position); ``mean`` divides dL once (m). The fused form is counted, not log-softmax's backward
    after NLL's. When the node has the optional ``log_prob`` output, its gradient is taken to reach the
    loss as every output does: dLP − softmax·Σ dLP per position (C − 1 additions, C multiplies, C
    subtractions, the exps shared) added into dS (C), 4C − 1. ``ignore_index`` positions are counted
    (an upper bound). Labels never get a gradient; the weights only at opset 12 (see the module):
    dW as NegativeLogLikelihoodLoss's, from −log_prob.
    """
    scores = ctx.shape(0)
    c = scores[1] if len(scores) > 1 else 1
    t = ctx.numel(1)
    weighted = ctx.has_input(2)
    flops = _mean_division(ctx, reduction, t)
    transcendentals = 0
    if ctx.needs_grad(0):
        flops += t * (2 * c + 1) + weighted * t
        transcendentals = t * c
        if len(ctx.outputs) > 1 and ctx.outputs[1] is not None:
            flops += t * (4 * c - 1)
    if weighted and ctx.needs_grad(2):
        flops += _weight_gradient(t, ctx.numel(2), reduction)
    return Cost(flops=flops, transcendentals=transcendentals)


@saves("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_saved(ctx: NodeContext, **_) -> Saved:
    """The log-probabilities (N·C in the scores' type, the optional second output or an internal tensor), the
    labels and the class weights: dX = (softmax(X) − onehot(labels))·w, as torch's log_softmax and nll_loss keep
    them."""
    log_prob = Saved(outputs=(1,)) if len(ctx.outputs) > 1 and ctx.outputs[1] is not None else Saved(
        extra=(("log-probabilities", ctx.numel(0) * element_bytes(ctx.inputs[0].elem_type)),))
    return log_prob._replace(inputs=tuple(i for i in (1, 2) if ctx.has_input(i)))


@saves("NegativeLogLikelihoodLoss")
def nll_loss_saved(ctx: NodeContext, **_) -> Saved:
    """The targets and the class weights: dX is −w at each target, zero elsewhere."""
    return keeps(*(i for i in (1, 2) if ctx.has_input(i)))
