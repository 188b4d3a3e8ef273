"""Operators of small families: determinant and triangular masks (linalg), running sums and
products (cumulative), Range and OneHot (generation), and the free BitCast, ImageDecoder and
Optional operators."""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import formula, zero_cost


def _ops(ctx: NodeContext, n: int, i: int = 0) -> Cost:
    """``n`` operations as FLOPs on floating-point input ``i``, else as ``int_ops``."""
    return Cost(flops=n) if ctx.in_is_float(i) else Cost(int_ops=n)


# --- linalg -------------------------------------------------------------------------------------


@formula("Det", family="linalg")
def det(ctx: NodeContext, **_) -> Cost:
    """FLOPs = B·(M(M − 1)/2 + M(M − 1)(2M − 1)/3 + M − 1) ≈ B·(2/3)·M³ for B = |X|/M² matrices of
    size M × M: LU factorization by Gaussian elimination, then the product of the M pivots.

    Eliminating column k (j = M − k rows below the pivot) takes j divisions for the multipliers
    and j² multiply-subtract updates (2j² FLOPs); summed over j = 1 … M − 1. The pivot search of
    partial pivoting (comparisons) and the sign of the permutation are not counted.
    """
    x = ctx.shape(0)
    m = x[-1]
    per_matrix = m * (m - 1) // 2 + m * (m - 1) * (2 * m - 1) // 3 + max(m - 1, 0)
    return Cost(flops=prod(x[:-2]) * per_matrix)


zero_cost(
    "Trilu",
    family="linalg",
    reason="keeps the upper or lower triangle and zeroes the rest; a mask, no arithmetic",
)


# --- cumulative ---------------------------------------------------------------------------------


@formula("CumSum", "CumProd", family="cumulative")
def cumulative(ctx: NodeContext, *, exclusive: int = 0, **_) -> Cost:
    """FLOPs = (|X|/L)·(L − 1) = |X| − |X|/L for L = X.shape[axis] (one add or multiply per element
    after the first of each line along the axis); (|X|/L)·(L − 2) when ``exclusive``.

    ``reverse`` runs the same count backwards. An ``axis`` computed at run time takes the longest
    axis (the upper bound). Integer inputs count ``int_ops``.
    """
    x = ctx.shape(0)
    axis = ctx.value(1)
    length = x[int(axis.reshape(-1)[0]) % len(x)] if axis is not None else max(x, default=1)
    if length == 0:
        return Cost()
    return _ops(ctx, prod(x) // length * max(length - 1 - (1 if exclusive else 0), 0))


# --- generation ---------------------------------------------------------------------------------


@formula("Range", family="generation")
def range_(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y|: one add (previous value + delta) per output element; ``int_ops`` for integer
    ranges. The element count ⌈(limit − start)/delta⌉ is not counted."""
    return _ops(ctx, ctx.out_numel())


zero_cost(
    "OneHot",
    family="generation",
    reason="writes the on value at each index and the off value elsewhere; a selection, no arithmetic",
)


# --- free ---------------------------------------------------------------------------------------

zero_cost("BitCast", family="metadata", reason="reinterprets the bits of each element as another type")
zero_cost(
    "ImageDecoder",
    family="image",
    reason="decodes an encoded image byte stream (JPEG, PNG, ...); codec work, not arithmetic on tensors",
)
zero_cost(
    "Optional", "OptionalGetElement", "OptionalHasElement",
    family="optional",
    reason="wraps, unwraps or tests an optional value; no arithmetic",
)  # fmt: skip
