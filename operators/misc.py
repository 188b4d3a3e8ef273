"""Operators of small families: determinant and triangular masks (linalg), running sums and
products (cumulative), Range and OneHot (generation), and the free BitCast, ImageDecoder and
Optional operators."""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves, saves_nothing, zero_cost
from flopcount.saved import Saved, element_bytes, keeps


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


@backward("Det")
def det_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = B·(2M³ − M² + 1) when X needs a gradient, for B = |X|/M² matrices of size M × M:
    dA = dY·det(A)·A^{−T}, an inverse per matrix, obtained from the forward's LU factors.

    Per matrix: c = dY·det(A) (1 multiply), then Aᵀ·Z = c·I solved through the kept LU factors (as
    PyTorch's linalg_det backward does with lu_solve), counted like the forward's elimination: for each
    of the M right-hand sides a unit-triangular solve (M(M − 1)/2 multiply-subtracts, M(M − 1) FLOPs)
    and a triangular solve with the pivots (M(M − 1) FLOPs and M divisions): M·(2M² − M). The zeros of
    the identity's columns are not exploited (the dense solve), the permutation is free, and the
    factorization is not counted again. As in the forward, no MACs are reported.
    """
    if not ctx.needs_grad(0):
        return Cost()
    x = ctx.shape(0)
    m = x[-1]
    return Cost(flops=prod(x[:-2]) * (2 * m**3 - m**2 + 1)) if m else Cost()


zero_cost(
    "Trilu",
    family="linalg",
    reason="keeps the upper or lower triangle and zeroes the rest; a mask, no arithmetic",
)
saves_nothing("Trilu")  # dX is dY masked the same way: shapes and k (a small constant) only


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


@backward("CumSum")
def cumsum_backward(ctx: NodeContext, *, exclusive: int = 0, **_) -> Cost:
    """FLOPs = the forward's, (|X|/L)·(L − 1) ((|X|/L)·(L − 2) when ``exclusive``), when x needs a
    gradient: dX = the cumulative sum of dY in the opposite direction (``reverse`` flipped, the same
    ``exclusive``), the same additions.

    An ``axis`` computed at run time takes the longest axis, as in the forward. The axis input never
    gets a gradient.
    """
    return cumulative(ctx, exclusive=exclusive) if ctx.needs_grad(0) else Cost()


@backward("CumProd")
def cumprod_backward(ctx: NodeContext, *, exclusive: int = 0, **_) -> Cost:
    """FLOPs = 2·|X| + (|X|/L)·(L − 1) ((|X|/L)·(L − 2) when ``exclusive``) when x needs a gradient:
    the closed form dX = revcumsum(dY·Y)/X, the cumulative sum taken in the opposite direction.

    Per element dY·Y (1 multiply) and the division by x (1); the opposite-direction cumulative sum
    costs the forward's count of additions. Zeros in x are not special-cased (Y/x is then undefined;
    an implementation such as PyTorch's cumprod_backward switches to products that skip the zero, which
    depends on the values and is not counted). The axis input never gets a gradient.
    """
    if not ctx.needs_grad(0):
        return Cost()
    return Cost(flops=2 * ctx.numel(0)) + cumulative(ctx, exclusive=exclusive)


# --- generation ---------------------------------------------------------------------------------


@formula("Range", family="generation")
def range_(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y|: one add (previous value + delta) per output element; ``int_ops`` for integer
    ranges. The element count ⌈(limit − start)/delta⌉ is not counted."""
    return _ops(ctx, ctx.out_numel())


@backward("Range")
def range_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = (|Y| − 1) for d start + (2|Y| − 1) for d delta, each when it needs a gradient:
    y_i = start + i·delta, so d start = Σ dY and d delta = Σ i·dY; limit only sets the length.
    """
    y = ctx.out_numel()
    if not ctx.out_is_float():
        return Cost()
    return Cost(flops=max(y - 1, 0) * ctx.needs_grad(0) + max(2 * y - 1, 0) * ctx.needs_grad(2))


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


saves_nothing("CumSum", "Range")


@saves("CumProd")
def cumprod_saved(ctx: NodeContext, **_) -> Saved:
    """X and Y: dX is a reverse cumulative sum of dY·Y, divided by X."""
    return keeps(0, outputs=(0,))


@saves("Det")
def det_saved(ctx: NodeContext, **_) -> Saved:
    """A and det(A), and the forward's LU factors (|A| elements of A's type) with their int32 pivots (B·M for B
    matrices of size M × M), from which the backward solves (torch's ``linalg_det`` keeps all four)."""
    x = ctx.shape(0)
    matrices, m = (prod(x[:-2]), x[-1]) if len(x) >= 2 else (1, 1)
    item = element_bytes(ctx.inputs[0].elem_type)
    return Saved(inputs=(0,), outputs=(0,), extra=(("LU factors", item * prod(x)), ("pivots (int32)", 4 * matrices * m)))
