"""Selection and sorting: TopK and Unique. Both are data-dependent; each counts an upper bound of
its comparisons (comparisons of floating-point values are FLOPs, of integers ``int_ops``)."""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Bound, Cost
from flopcount.registry import backward, formula, saves
from flopcount.saved import Saved, keeps


def _ceil_log2(n: int) -> int:
    """⌈log2 n⌉ for n ≥ 1."""
    return (n - 1).bit_length()


def _ops(ctx: NodeContext, n: int) -> Cost:
    return Cost(flops=n) if ctx.in_is_float(0) else Cost(int_ops=n)


@formula("TopK", family="sorting")
def top_k(ctx: NodeContext, *, axis: int = -1, k: int | None = None, **_) -> Cost:
    """FLOPs ≤ |X|·⌈log2(k + 1)⌉ comparisons (``int_ops`` for integer X): upper bound: each of
    the L elements of a row along ``axis`` enters a heap of the k best, at most ⌈log2(k + 1)⌉
    comparisons each.

    k is the ``K`` input's value (the ``k`` attribute before opset 10), else Y.shape[axis], else
    (K computed at run time) its maximum L = X.shape[axis]. k = 1 is a plain max (|X| comparisons,
    counting the first); k = L is a full sort, L·⌈log2(L + 1)⌉ per row. Producing the sorted order
    of the k winners and the indices is not counted separately.
    """
    x = ctx.shape(0)
    a = axis % len(x)
    value = ctx.value(1) if ctx.has_input(1) else None
    y = ctx.outputs[0].shape if ctx.outputs and ctx.outputs[0] is not None else None
    if value is not None:
        k = int(value.reshape(-1)[0])
    elif k is None:
        k = y[a] if y is not None and isinstance(y[a], int) else x[a]
    return Bound(_ops(ctx, prod(x) * _ceil_log2(min(k, x[a]) + 1)),
                 "selection comparisons bounded by |X|·⌈log2(k + 1)⌉; the real number depends on the data")


@backward("TopK")
def top_k_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0: dX = dY scattered into the k selected positions of each row, zero elsewhere: |Y|
    moves, no additions.

    The k indices of a row are distinct, so each dY element is written to its own position of a zeroed
    dX (a scatter, not a scatter-add as for Gather's backward): no arithmetic. The Indices output and
    the K input never carry gradients.
    """
    return Cost()


@formula("Unique", family="sorting")
def unique(ctx: NodeContext, *, axis: int | None = None, **_) -> Cost:
    """FLOPs ≤ s·(n·⌈log2 n⌉ + n − 1) comparisons (``int_ops`` for integer X): upper bound: a
    merge sort of n items, then n − 1 comparisons of neighbours, each comparison touching s
    elements; n = |X|, s = 1 without ``axis`` (the flattened tensor), n = X.shape[axis] slices of
    s = |X|/n elements with it.

    ``sorted=0`` (first-occurrence order) is counted the same. Building indices, inverse indices
    and counts is integer bookkeeping, not counted. String inputs count as ``int_ops``.
    """
    x = ctx.shape(0)
    total = prod(x)
    if axis is None:
        n, s = total, 1
    else:
        n = x[axis % len(x)]
        s = total // n if n else 0
    comparisons = s * (n * _ceil_log2(n) + n - 1) if n > 0 else 0
    return Bound(_ops(ctx, comparisons), "a full sort of every slice; the real work depends on the values")


@saves("TopK")
def top_k_saved(ctx: NodeContext, **_) -> Saved:
    """The indices (the second output): dX scatters dY back to them."""
    return keeps(outputs=(1,))
