"""Softmax-like operators, counted per row: a row is the n elements one softmax normalizes.

The numerically stable form is counted, as the ONNX reference computes it: for a row of n
elements, the maximum (n − 1 comparisons), n subtractions of it, n exponentials, the sum
(n − 1 additions) and n divisions, so Softmax is 5n − 2 FLOPs per row, n of them transcendental.
:func:`softmax_rows` is shared with the attention formulas, which apply this same softmax to
their score rows.

Rows: from opset 13 on, the softmax runs along the single dimension ``axis`` (default −1), so
n = X.shape[axis] and there are |X| / n rows. Before opset 13 (versions 1 and 11), the input is
coerced to 2-D at ``axis`` (default 1): n = prod(X.shape[axis:]) and rows = prod(X.shape[:axis]).

These counts are primitive operations (comparisons, additions, exponentials, divisions, a log), so
a weighted convention prices each at its weight: ``aiperf`` makes Softmax 15n − 2 per row.
"""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.conventions import Convention
from flopcount.cost import Cost
from flopcount.masks import executed_entries
from flopcount.registry import backward, formula, saves, saves_nothing
from flopcount.saved import NOTHING, Saved, keeps


def softmax_rows(convention: Convention, rows: int, n: int) -> Cost:
    """Cost of a numerically stable softmax over ``rows`` rows of ``n`` elements each: per row
    n − 1 comparisons (max), 2n − 1 additions (n subtractions, the sum), n exps, n divisions:
    5n − 2 FLOPs flat, 15n − 2 under ``aiperf``; n transcendentals."""
    if rows == 0 or n == 0:
        return Cost()
    return convention.weighted(cmp=rows * (n - 1), add=rows * (2 * n - 1), exp=rows * n, div=rows * n)


def _rows(ctx: NodeContext, axis: int) -> tuple[int, int]:
    """(rows, n): the number of rows the op normalizes and the elements in each."""
    x = ctx.shape(0)
    if not x:  # a scalar is one row of one element
        return 1, 1
    axis %= len(x)
    if ctx.opset < 13:
        return prod(x[:axis]), prod(x[axis:])
    n = x[axis]
    return (prod(x) // n if n else 0), n


@formula("Softmax", family="softmax")
def softmax(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = R·(5n − 2), transcendentals = R·n, for R rows of n elements (R·n = |X|): per row
    the max (n − 1 comparisons), n subtractions, n exps, the sum (n − 1 additions), n divisions.

    n = X.shape[axis] from opset 13 on; before opset 13, X is coerced to 2-D at ``axis`` and
    n = prod(X.shape[axis:]). Nothing else is counted. Weighted conventions price each operation
    (``aiperf``: R·(15n − 2)).

    Under ``--attention executed`` the Softmax of an eager attention runs over the kept score entries: E entries
    in R non-empty rows cost E − R comparisons, 2E − R additions, E exps and E divisions (5E − 2R flat), as a
    masked kernel computes them (:func:`flopcount.masks.executed_entries`).
    """
    kept = _executed(ctx, axis)
    if kept is not None:
        if kept.rows == 0:
            return Cost()
        return ctx.convention.weighted(cmp=kept.pairs - kept.rows, add=2 * kept.pairs - kept.rows,
                                       exp=kept.pairs, div=kept.pairs)
    return softmax_rows(ctx.convention, *_rows(ctx, axis))


def _executed(ctx: NodeContext, axis: int):
    """The kept score entries and rows of an eager attention's Softmax (over the last axis, from opset 13 on)
    under ``--attention executed``, or None."""
    if ctx.convention.executed is None or ctx.opset < 13:
        return None
    shape = ctx.shape(0)
    if not shape or axis % len(shape) != len(shape) - 1:
        return None
    return executed_entries(ctx.convention.executed, ctx.name, shape)


@formula("LogSoftmax", family="softmax")
def log_softmax(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = R·(5n − 1), transcendentals = R·(n + 1), for R rows of n elements: per row the max
    (n − 1), n subtractions, n exps, the sum (n − 1), one log of the sum and n subtractions of it.

    Rows as for Softmax (single ``axis`` from opset 13 on, 2-D coercion before). Weighted
    conventions price each operation (``aiperf``: R·(12n − 1)).
    """
    rows, n = _rows(ctx, axis)
    if rows == 0 or n == 0:
        return Cost()
    return ctx.convention.weighted(cmp=rows * (n - 1), add=rows * (3 * n - 1), exp=rows * n, log=rows)


@formula("Hardmax", family="softmax")
def hardmax(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = R·(n − 1) = |X| − R comparisons: the arg-max of each of the R rows of n elements.

    Writing the one-hot output is not arithmetic and is not counted. Rows as for Softmax.
    """
    rows, n = _rows(ctx, axis)
    return ctx.convention.weighted(cmp=rows * (n - 1)) if n else Cost()


@backward("Hardmax")
def hardmax_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0: dX = 0. The one-hot output is piecewise constant in the input (it changes only where
    the arg-max switches, where it has no derivative), so no gradient passes to X.

    An explicit zero, not a missing formula: nothing upstream of a Hardmax gets a gradient through it
    (an implementation writes zeros, no arithmetic).
    """
    return Cost()


@backward("Softmax")
def softmax_backward(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = R·(4n − 1): dX = Y·(dY − Σ dY·Y) per row: n products, n − 1 additions, n
    subtractions, n products.

    Under ``--attention executed``, for an eager attention: 4E − R over its E kept entries in R rows (as the
    forward)."""
    if not ctx.needs_grad(0):
        return Cost()
    kept = _executed(ctx, axis)
    if kept is not None:
        return Cost(flops=4 * kept.pairs - kept.rows)
    rows, n = _rows(ctx, axis)
    return Cost(flops=rows * (4 * n - 1)) if n else Cost()


@backward("LogSoftmax")
def log_softmax_backward(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = R·(4n − 1), transcendentals = R·n: dX = dY − exp(Y)·Σ dY per row: n exps, n − 1
    additions, n products, n subtractions."""
    rows, n = _rows(ctx, axis)
    return Cost(flops=rows * (4 * n - 1), transcendentals=rows * n) if ctx.needs_grad(0) and n else Cost()


@saves("Softmax", "LogSoftmax")
def softmax_saved(ctx: NodeContext, **_) -> Saved:
    """Y: dX = Y·(dY − Σ dY·Y) for Softmax, dX = dY − exp(Y)·Σ dY for LogSoftmax."""
    return keeps(outputs=(0,)) if ctx.needs_grad(0) else NOTHING


saves_nothing("Hardmax")  # its gradient is zero
