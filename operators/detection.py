"""Object-detection operators: RoiAlign and NonMaxSuppression.

Both depend on data (ROI extents, how many boxes survive); each formula states the bound it counts.
"""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Bound, Cost
from flopcount.registry import backward, formula, saves
from flopcount.saved import Saved, keeps

BILINEAR_SAMPLE = 7  # 4 multiplies + 3 adds (avg) or 3 maxes (max) per sample and channel
SAMPLE_POINT = 14  # per sample point, shared by the channels: 2·3 coordinates + 2 fractions, 2 complements, 4 weights
IOU = 13  # 4 min/max (intersection corners), 2 subs + 2 clamps (its sides), 1 mul, 2 for the union, 1 div, 1 compare


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _sort_comparisons(n: int) -> int:
    """Merge-sort bound on the comparisons that sort n keys: n·⌈log2 n⌉."""
    return n * (n - 1).bit_length() if n > 1 else 0


@formula("RoiAlign", family="detection")
def roi_align(ctx: NodeContext, *, sampling_ratio: int = 0, mode: str = "avg", **_) -> Cost:
    """FLOPs = |Y|·(8S − [max]) + 14·R·h·w·S for R ROIs, output_height × output_width = h × w and
    S sample points per output bin: S = sampling_ratio² or, when sampling_ratio = 0 (adaptive),
    the upper bound S = ⌈H/h⌉·⌈W/w⌉ of a ROI covering the whole H × W feature map.

    Each of the |Y| = R·C·h·w outputs combines S bilinear samples, each 4 weighted corners
    (4 multiplies + 3 adds, or 3 maxes in ``max`` mode, as the ONNX reference takes the max of the
    weighted corners): 7S, then S − 1 adds and one division (avg) or S − 1 maxes (max). Each of the
    R·h·w·S sample points, shared by the C channels, costs 14 FLOPs: 3 per coordinate
    (y0 + p·bin + (i + ½)·bin/s), 2 fractional parts, 2 complements and 4 corner weights. Per-ROI
    setup (scaling and bin sizes, about 12 FLOPs per ROI) and the bounds checks are not counted.
    """
    r, _, h, w = ctx.out_shape()
    s = _samples_per_bin(ctx, sampling_ratio)
    per_output = BILINEAR_SAMPLE * s + (s if mode == "avg" else s - 1)
    return Cost(flops=per_output * ctx.out_numel() + SAMPLE_POINT * r * h * w * s)


def _samples_per_bin(ctx: NodeContext, sampling_ratio: int) -> int:
    """S: sampling_ratio², or for sampling_ratio = 0 the bound ⌈H/h⌉·⌈W/w⌉ (see :func:`roi_align`)."""
    if sampling_ratio > 0:
        return sampling_ratio * sampling_ratio
    x, y = ctx.shape(0), ctx.out_shape()
    return _ceil_div(x[2], y[2]) * _ceil_div(x[3], y[3])


@backward("RoiAlign", buffers=(1, 2))  # the boxes and their batch indices: coordinates, never trained
def roi_align_backward(ctx: NodeContext, *, sampling_ratio: int = 0, mode: str = "avg", **_) -> Cost:
    """FLOPs = (8S + 1)·|Y| (avg) or 2·|Y| (max) when X needs a gradient, with the forward's S sample
    points per bin (the same bound when sampling_ratio = 0).

    avg: each output gradient is divided by S once, then each of its S samples scatters it to the 4
    corners through their bilinear weights (4 multiplies + 4 additions into dX, the first write
    included, as for every scatter-add). max: the output took the largest weighted corner, so dY
    times that corner's weight is added there (1 multiply + 1 addition; the argmax is kept from the
    forward). The sample points' coordinates and weights (14 FLOPs per point, shared by the
    channels) are taken as kept from the forward, not recomputed (kernels that recompute them add
    14·R·h·w·S). The ROIs get no gradient (torchvision and Detectron treat the boxes as constants),
    nor do the integer batch indices.
    """
    if not ctx.needs_grad(0):
        return Cost()
    per_output = 8 * _samples_per_bin(ctx, sampling_ratio) + 1 if mode == "avg" else 2
    return Cost(flops=per_output * ctx.out_numel())


@formula("NonMaxSuppression", family="detection")
def non_max_suppression(ctx: NodeContext, *, center_point_box: int = 0, **_) -> Cost:
    """FLOPs ≤ B·n·a + B·C·(n·⌈log2 n⌉ + t·n + 13·I) for boxes [B, n, 4] and scores [B, C, n]:
    upper bound: per batch and class, sorting the n scores, t = 1 score-threshold comparison per
    box when ``score_threshold`` is given, and I = Σ_{i<n} min(i, M) IoU tests of 13 FLOPs each,
    with M = max_output_boxes_per_class; per box a = 7 (corner boxes) or 9 (center_point_box=1).

    Greedy NMS compares each candidate, in score order, with the boxes already selected, at most
    min(i, M) for the i-th, so I = n(n − 1)/2 when M ≥ n − 1 (also when M is not a constant) and
    M(M + 1)/2 + (n − 1 − M)·M otherwise; when the ``max_output_boxes_per_class`` input is omitted
    (M = 0: nothing is selected, per the spec) the count is 0. An IoU test is 4 min/max for the
    intersection corners, 2 subtractions and 2 clamps for its sides, 1 multiply for its area,
    2 for the union (area_a + area_b − inter), 1 division and 1 comparison with the threshold.
    Each box costs its area (2 subtractions, 1 multiply) once per batch, plus ordering its corners
    (4 min/max) or converting it from center form (2 halvings, 4 adds). Sorting counts the
    merge-sort bound of comparisons; building the output indices is not counted.
    """
    b, n, _ = ctx.shape(0)
    classes = ctx.shape(1)[1]
    if not ctx.has_input(2):
        return Cost()
    value = ctx.value(2)
    m = int(value.reshape(-1)[0]) if value is not None else n
    m = max(m, 0)
    if m >= n - 1:
        iou_tests = n * (n - 1) // 2
    else:
        iou_tests = m * (m + 1) // 2 + (n - 1 - m) * m
    per_box = (6 if center_point_box else 4) + 3
    per_class = _sort_comparisons(n) + (n if ctx.has_input(4) else 0) + IOU * iou_tests
    return Bound(
        Cost(flops=b * n * per_box + b * classes * per_class),
        "IoUs counted up to the declared max_output_boxes_per_class (all box pairs when it is not a constant); "
        "the real number depends on the scores",
    )


@saves("RoiAlign")
def roi_align_saved(ctx: NodeContext, **_) -> Saved:
    """The boxes and their batch indices, from which the backward finds each sample's corners again (torchvision's
    ``roi_align`` keeps the boxes), when X needs a gradient."""
    return keeps(1, 2) if ctx.needs_grad(0) else Saved()
