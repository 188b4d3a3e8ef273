"""Resampling: Resize, Upsample, GridSample, AffineGrid (and CenterCropPad, which only copies).

Interpolation follows one convention, shared with DeformConv: an output element interpolated from
P input points costs a weighted sum, P multiplies and P − 1 adds = 2P − 1 FLOPs. Over d
interpolated axes P = 2^d for (multi)linear, 4^d for (multi)cubic and nearest needs no arithmetic
on the data (it copies one element).
"""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves, saves_nothing, zero_cost
from flopcount.saved import Saved, keeps

# interpolation mode → taps per interpolated axis (older opsets spell the modes differently)
TAPS: dict[str, int] = {
    "nearest": 1, "linear": 2, "bilinear": 2, "trilinear": 2, "cubic": 4, "bicubic": 4,
}  # fmt: skip


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@formula("Resize", "Upsample", family="resize")
def resize(ctx: NodeContext, *, mode: str = "nearest", antialias: int = 0, **_) -> Cost:
    """FLOPs = (2P − 1)·|Y| with P = ∏ t_a over the resized axes a (those whose size changes):
    t_a = 2 (linear) or 4 (cubic) per axis, so P = 2^d or 4^d for d resized axes; nearest: 0.

    With ``antialias=1`` (linear, cubic) a downscaled axis (Y_a < X_a) reads the stretched filter
    of the ONNX reference, t_a = 2·⌈X_a/Y_a⌉ (linear) or 2·⌈2·X_a/Y_a⌉ (cubic). Nearest copies
    one element per output (0 FLOPs). The interpolation coordinates and per-axis weights depend
    only on the output index along each axis and are not counted (O(Σ Y_a), precomputed); an axis
    whose size does not change is taken as copied even when ``roi`` (tf_crop_and_resize) shifts
    it. Integer X counts the same number as ``int_ops``.
    """
    y = ctx.out_shape()
    points = _resize_points(ctx.shape(0), y, mode, antialias)
    ops = (2 * points - 1) * prod(y) if points > 1 else 0
    return Cost(flops=ops) if ctx.in_is_float(0) else Cost(int_ops=ops)


def _resize_points(x: tuple[int, ...], y: tuple[int, ...], mode: str, antialias: int) -> int:
    """P = ∏ t_a, the input points each output element reads (1: a copy); see :func:`resize`."""
    base = TAPS[mode]
    if base == 1:
        return 1
    points = 1
    for xa, ya in zip(x, y):
        if xa == ya:
            continue
        if antialias and ya < xa:
            points *= 2 * _ceil_div(xa * base, 2 * ya)
        else:
            points *= base
    return points


@backward("Upsample", buffers=(1,))  # scales: its schema says nothing; never trained
@backward("Resize")
def resize_backward(ctx: NodeContext, *, mode: str = "nearest", antialias: int = 0, **_) -> Cost:
    """FLOPs = 2P·|Y| when X needs a gradient (nearest, or no axis resized: |Y|), with the forward's
    P = ∏ t_a taps per output element (2^d linear, 4^d cubic over the d resized axes, the stretched
    antialias filter when downscaling).

    dX is the adjoint of the interpolation: each output gradient is multiplied by the weight of each
    of the P input taps it read and added into dX there (P multiplies + P additions, the forward's
    P multiply-adds once more); nearest adds each dY into the one element it copied (|Y| additions).
    The first write into each dX element is counted as an addition, as for every scatter-add. Tap
    positions and weights depend only on the output index along each axis (O(Σ Y_a)) and are not
    counted. roi, scales and sizes get no gradient (Resize's schema marks them non-differentiable;
    Upsample's ``scales`` is taken the same way).
    """
    if not ctx.needs_grad(0):
        return Cost()
    y = ctx.out_shape()
    points = _resize_points(ctx.shape(0), y, mode, antialias)
    return Cost(flops=(2 * points if points > 1 else 1) * prod(y))


@formula("GridSample", family="resize")
def grid_sample(ctx: NodeContext, *, mode: str = "linear", align_corners: int = 0, **_) -> Cost:
    """FLOPs = (2P − 1)·|Y| + (u·r + w)·N·S_out, with r spatial dims, S_out = ∏ D_out, P = 2^r
    (linear) or 4^r (cubic) points per output element, u = 3 (align_corners=0) or 2 (align_corners=1)
    FLOPs to unnormalize each grid coordinate, and per grid point weight work w = 2r + 2^r·(r − 1)
    (linear), 25r + 4^r·(r − 1) (cubic), 0 (nearest).

    Each of the N·C·S_out outputs is a weighted sum of P input points (nearest: a copy, 0 FLOPs).
    Each of the N·S_out grid points, shared by the C channels, is unnormalized per coordinate,
    ((g + 1)·size − 1)/2 or (g + 1)·(size − 1)/2 with the size factor precomputed; linear then
    forms the fractional part and its complement per axis (2 FLOPs) and the 2^r corner weights
    (r − 1 multiplies each); cubic evaluates 4 Keys coefficients per axis (the fractional part plus
    4 cubics in Horner form, 1 + 4·6 FLOPs) and the 4^r products. Padding-mode clamps and
    reflections and the rounding of nearest are not counted. Intermediate values are floating point
    for every input type (as the spec says), so this is always FLOPs.
    """
    x, y = ctx.shape(0), ctx.out_shape()
    r = len(x) - 2
    base = TAPS[mode]
    points = base**r
    interp = (2 * points - 1) * prod(y) if base > 1 else 0
    return Cost(flops=interp + _grid_point_flops(r, base, align_corners) * y[0] * prod(y[2:]))


def _grid_point_flops(r: int, base: int, align_corners: int) -> int:
    """FLOPs per grid point, shared by the channels: u·r to unnormalize the r coordinates (u = 3, or 2 with
    align_corners), plus the interpolation weights: 2r + 2^r·(r − 1) (linear), 25r + 4^r·(r − 1) (cubic),
    0 (nearest)."""
    unnormalize = (2 if align_corners else 3) * r
    weights = {1: 0, 2: 2 * r + 2**r * (r - 1), 4: 25 * r + 4**r * (r - 1)}[base]
    return unnormalize + weights


@backward("GridSample")
def grid_sample_backward(ctx: NodeContext, *, mode: str = "linear", align_corners: int = 0, **_) -> Cost:
    """FLOPs = 2P·|Y| + (u·r + w)·N·S_out when X needs a gradient (nearest: |Y| + u·r·N·S_out), else 0; the
    symbols are the forward's.

    dX is the transpose of the forward's weighted sums: each of the |Y| output gradients is multiplied by the
    weight of each of its P input points and added into dX there (P multiplies + P adds; nearest adds dY to the
    one element it copied). The coordinates and weights of the N·S_out grid points are recomputed, as in the
    forward (PyTorch's grid sampler backward recomputes them rather than storing them). The grid gets no gradient:
    the ONNX schema marks it non-differentiable (an RoIAlign's detached boxes, for instance).
    """
    if not ctx.needs_grad(0):
        return Cost()
    x, y = ctx.shape(0), ctx.out_shape()
    r = len(x) - 2
    base = TAPS[mode]
    scatter = 2 * base**r * prod(y) if base > 1 else prod(y)
    return Cost(flops=scatter + _grid_point_flops(r, base, align_corners) * y[0] * prod(y[2:]))


@formula("AffineGrid", family="resize")
def affine_grid(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·N·S·d·(d + 1) with MACs = N·S·d·(d + 1) = |Y|·(d + 1): each of the N·S output
    points (S = H·W, or D·H·W) is the homogeneous base coordinate (a (d + 1)-vector) times the
    d × (d + 1) matrix theta, for d = 2 or 3.

    The product uses the matrix-product rate (``fc_flops_per_mac``: 1 under ``table3``); the base
    grid (a linspace per axis, O(H + W)) is not counted.
    """
    y = ctx.out_shape()
    d = y[-1]
    macs = prod(y) * (d + 1)
    return Cost(flops=ctx.convention.fc_flops_per_mac * macs, macs=macs)


@backward("AffineGrid")
def affine_grid_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·N·S·d·(d + 1) with MACs = |Y|·(d + 1) when theta needs a gradient: dθ[n] =
    Σ_s dY[n, s]·base[s]ᵀ, the d × (d + 1) outer products summed over the S grid points, the forward
    product once more (MatMul's dB).

    The matrix-product rate applies (``fc_flops_per_mac``). The ONNX schema marks theta (and size)
    non-differentiable, so a training count built from the schema never asks for this gradient; the
    formula states what it would cost where theta is learned (a spatial transformer).
    """
    if not ctx.needs_grad(0):
        return Cost()
    y = ctx.out_shape()
    macs = prod(y) * (y[-1] + 1)
    return Cost(flops=ctx.convention.fc_flops_per_mac * macs, macs=macs)


zero_cost(
    "CenterCropPad",
    family="resize",
    reason="crops or zero-pads each axis around its centre; copies elements, no arithmetic",
)
saves_nothing("CenterCropPad")  # dX is dY padded or cropped back: shapes only


# saved for backward: interpolation's backward scatters dY back with the same weights, from shapes and scales only
saves_nothing("Resize", "Upsample")


@saves("GridSample")
def grid_sample_saved(ctx: NodeContext, **_) -> Saved:
    """X and the grid, whichever needs a gradient: dX scatters dY at the grid's positions, and d(grid) reads X
    around them (torch's ``grid_sampler_2d`` keeps both)."""
    return keeps(0, 1)


saves_nothing("AffineGrid")  # linear in theta: d(theta) sums dGrid against the base grid, rebuilt from shapes
