"""Resize, Upsample, GridSample, AffineGrid, CenterCropPad.

Interpolation from P points costs 2P − 1 FLOPs per output element (P multiplies, P − 1 adds);
P = 2^d (linear) or 4^d (cubic) over the d axes whose size changes; nearest copies (0).
"""

import numpy as np
import pytest
from helpers import const, direct_backward, model, op_backward, shifted_op_model, single, weight
from onnx import TensorProto, helper

import flopcount
from math import prod


def _ceil(a, b):
    return -(-a // b)


RESIZE = [
    # id: mode, X, sizes (the output), extra attrs, points read per output element (derived here)
    pytest.param("nearest", (3, 5, 7, 11), (3, 5, 13, 17), {}, 1, id="nearest-is-free"),
    pytest.param("linear", (3, 5, 7, 11), (3, 5, 13, 17), {}, 2 * 2, id="bilinear-H-W"),
    pytest.param("linear", (3, 5, 7, 11), (3, 5, 7, 17), {}, 2, id="linear-only-W-changes"),
    pytest.param("linear", (3, 5, 7, 11, 9), (3, 5, 13, 17, 19), {}, 2 * 2 * 2, id="trilinear"),
    pytest.param("cubic", (3, 5, 7, 11), (3, 5, 13, 17), {}, 4 * 4, id="bicubic"),
    pytest.param("linear", (3, 5, 7, 11), (3, 9, 13, 17), {}, 2 * 2 * 2, id="linear-channel-axis-too"),
    # antialias downscaling 29 → 9 (linear: 2·⌈29/9⌉ = 8 taps) and 31 → 7 (cubic: 2·⌈2·31/7⌉ = 18)
    pytest.param("linear", (3, 5, 29, 11), (3, 5, 9, 17), {"antialias": 1}, 2 * _ceil(29, 9) * 2,
                 id="linear-antialias"),
    pytest.param("cubic", (3, 5, 31, 11), (3, 5, 7, 17), {"antialias": 1}, 2 * _ceil(2 * 31, 7) * 4,
                 id="cubic-antialias"),
    pytest.param("linear", (3, 5, 29, 11), (3, 5, 9, 17), {}, 2 * 2, id="linear-downscale-no-antialias"),
]


def resize_to(x, sizes, dtype=TensorProto.FLOAT, **attrs):
    """Resize X to ``sizes`` (roi and scales omitted)."""
    node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], **attrs)
    return model([node], {"x": x}, ["y"], [const("sizes", sizes)], opset=19, dtype=dtype)


@pytest.mark.parametrize("mode, x, y, attrs, points", RESIZE)
def test_resize(mode, x, y, attrs, points):
    m = resize_to(x, y, mode=mode, **attrs)
    out = int(np.prod(y))
    r = flopcount.count(m).total
    assert r.flops == ((2 * points - 1) * out if points > 1 else 0)
    assert (r.macs, r.transcendentals, r.int_ops) == (0, 0, 0)


def test_resize_integer_image_counts_int_ops():
    m = resize_to((1, 3, 7, 11), (1, 3, 13, 17), dtype=TensorProto.UINT8, mode="linear")
    r = flopcount.count(m).total
    assert (r.flops, r.int_ops) == (0, (2 * 4 - 1) * 3 * 13 * 17)


def test_resize_with_scales():
    # scales (1, 1, 2, 3) on X (2, 3, 5, 7) → Y (2, 3, 10, 21), bilinear
    m = single("Resize", {"x": (2, 3, 5, 7), "": None}, [const("scales", [1, 1, 2, 3], np.float32)],
               opset=13, mode="linear")
    assert flopcount.count(m).total.flops == (2 * 4 - 1) * 2 * 3 * 10 * 21


def test_upsample_opset9():
    m = single("Upsample", {"x": (2, 3, 5, 7)}, [const("scales", [1, 1, 3, 2], np.float32)], opset=9, mode="linear")
    assert flopcount.count(m).total.flops == (2 * 4 - 1) * 2 * 3 * 15 * 14


GRID = [
    # id: mode, align_corners, X (N, C, spatial), grid spatial; P points, u per coordinate, w per grid point
    pytest.param("linear", 0, (3, 5, 7, 11), (13, 9), 4, 3, 2 * 2 + 4 * 1, id="bilinear"),
    pytest.param("linear", 1, (3, 5, 7, 11), (13, 9), 4, 2, 2 * 2 + 4 * 1, id="bilinear-align-corners"),
    pytest.param("nearest", 0, (3, 5, 7, 11), (13, 9), 1, 3, 0, id="nearest"),
    pytest.param("cubic", 0, (3, 5, 7, 11), (13, 9), 16, 3, 25 * 2 + 16 * 1, id="bicubic"),
    pytest.param("linear", 0, (3, 5, 7, 11, 9), (13, 9, 5), 8, 3, 2 * 3 + 8 * 2, id="trilinear-volumetric"),
]


@pytest.mark.parametrize("mode, align, x, g, points, u, w", GRID)
def test_grid_sample(mode, align, x, g, points, u, w):
    n, c, r = x[0], x[1], len(x) - 2
    m = single("GridSample", {"x": x, "grid": (n, *g, r)}, opset=22, mode=mode, align_corners=align)
    grid_points = n * int(np.prod(g))
    interp = (2 * points - 1) * c * grid_points if points > 1 else 0
    assert flopcount.count(m).total.flops == interp + (u * r + w) * grid_points


@pytest.mark.parametrize("mode, align, x, g, points, u, w", GRID)
def test_grid_sample_backward(mode, align, x, g, points, u, w):
    # X is a trainable initializer, so it needs a gradient; the grid (a graph input) is non-differentiable
    n, c, r = x[0], x[1], len(x) - 2
    m = model([helper.make_node("GridSample", ["x", "grid"], ["y"], mode=mode, align_corners=align)],
              {"grid": (n, *g, r)}, ["y"], [weight("x", x)], opset=22)
    grid_points = n * int(np.prod(g))
    # dX: dY times each of the P weights, added into dX (2P per output; nearest: one add); the
    # coordinates and weights of every grid point recomputed as in the forward
    scatter = 2 * points * c * grid_points if points > 1 else c * grid_points
    report = flopcount.count(m, mode="train")
    assert report.backward.flops == scatter + (u * r + w) * grid_points
    assert report.trainable_params == int(np.prod(x)) and not report.backward_unsupported


def test_grid_sample_backward_needs_a_trainable_input():
    # X is data: nothing needs a gradient, so the backward is empty and nothing is reported missing
    m = single("GridSample", {"x": (3, 5, 7, 11), "grid": (3, 13, 9, 2)}, opset=22)
    report = flopcount.count(m, mode="train")
    assert report.backward.flops == 0 and not report.backward_unsupported


def test_grid_sample_opset16_mode_names():
    m = single("GridSample", {"x": (3, 5, 7, 11), "grid": (3, 13, 9, 2)}, opset=16, mode="bilinear")
    assert flopcount.count(m).total.flops == (7 * 5 + 3 * 2 + 8) * 3 * 13 * 9


@pytest.mark.parametrize(
    "theta, size, d",
    [
        pytest.param((3, 2, 3), (3, 5, 7, 11), 2, id="2d"),
        pytest.param((3, 3, 4), (3, 5, 7, 11, 13), 3, id="3d"),
    ],
)
def test_affine_grid(theta, size, d):
    m = single("AffineGrid", {"theta": theta}, [const("size", size)], opset=20)
    points = size[0] * int(np.prod(size[2:]))
    r = flopcount.count(m).total
    assert r.macs == points * d * (d + 1)
    assert r.flops == 2 * points * d * (d + 1)
    assert flopcount.count(m, convention="table3").total.flops == points * d * (d + 1)


def test_center_crop_pad_is_free():
    m = single("CenterCropPad", {"x": (7, 11, 3)}, [const("shape", [5, 13])], opset=18, axes=[0, 1])
    (node,) = flopcount.count(m).nodes
    assert (node.status, node.cost.flops) == ("zero-cost", 0)


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): Resize, Upsample, AffineGrid.
#
# Every expected value is a closed form written here from the sizes. To make an input need a gradient the
# graphs feed it through ``Add(x, shift)`` with a trainable ``shift``; an input fed straight from the graph
# inputs is data (no gradient, like a first layer's). Only the node under test (named "op") is asserted.
# Operators whose ONNX schema marks every input non-differentiable (AffineGrid, DFT, STFT) never get a gradient
# from a count; their formulas are also called directly on a hand-built context.
# -----------------------------------------------------------------------------------------------------------------


RESIZE_TRAIN = [
    # id: mode, X, output sizes, attrs, P taps per output element (derived here)
    pytest.param("nearest", (2, 3, 5, 7), (2, 3, 10, 21), {}, 1, id="nearest"),
    pytest.param("linear", (2, 3, 5, 7), (2, 3, 10, 21), {}, 2 * 2, id="bilinear"),
    pytest.param("linear", (2, 3, 5, 7), (2, 3, 5, 21), {}, 2, id="linear-one-axis"),
    pytest.param("cubic", (2, 3, 5, 7), (2, 3, 10, 21), {}, 4 * 4, id="bicubic"),
    pytest.param("linear", (2, 3, 5, 7, 9), (2, 3, 10, 14, 18), {}, 2 * 2 * 2, id="trilinear"),
    pytest.param("linear", (2, 3, 20, 21), (2, 3, 6, 7), {"antialias": 1},
                 (2 * -(-20 * 2 // (2 * 6))) * (2 * -(-21 * 2 // (2 * 7))), id="antialias-down"),
]


@pytest.mark.parametrize("mode, x, y, attrs, points", RESIZE_TRAIN)
def test_resize_backward(mode, x, y, attrs, points):
    m = shifted_op_model("Resize", ["x", "", "", "sizes"], {"x": x}, consts=[const("sizes", y)], learned=("x",),
                 opset=19, mode=mode, **attrs)
    scatter = 2 * points if points > 1 else 1  # P multiplies + P additions; nearest: one addition
    assert op_backward(m).flops == scatter * prod(y)


def test_resize_of_data_has_no_backward():
    m = shifted_op_model("Resize", ["x", "", "", "sizes"], {"x": (2, 3, 5, 7)}, consts=[const("sizes", [2, 3, 10, 21])],
                 opset=19, mode="linear")
    assert flopcount.count(m, mode="train").backward == flopcount.Cost()


def test_upsample_backward():
    import numpy as np

    m = shifted_op_model("Upsample", ["x", "scales"], {"x": (2, 3, 5, 7)}, consts=[const("scales", [1, 1, 3, 2], np.float32)],
                 learned=("x",), opset=9, mode="linear")
    assert op_backward(m).flops == 2 * 4 * 2 * 3 * 15 * 14  # bilinear: P = 4 taps


def test_affine_grid_theta_is_not_trained_by_the_schema():
    m = shifted_op_model("AffineGrid", ["theta", "size"], {}, [weight("theta", (3, 2, 3))], [const("size", [3, 5, 7, 11])],
                 opset=20)
    r = flopcount.count(m, mode="train")
    assert r.trainable_params == 0 and r.backward == flopcount.Cost() and not r.backward_unsupported


@pytest.mark.parametrize("grid, d", [pytest.param((3, 7, 11), 2, id="2d"), pytest.param((3, 5, 7, 11), 3, id="3d")])
def test_affine_grid_backward_formula(grid, d):
    n, spatial = grid[0], grid[1:]
    theta = ("theta", (n, d, d + 1))
    out = [(*grid, d)]
    b = direct_backward("AffineGrid", [theta, ("size", (d + 2,))], out, (True, False), 20)
    assert b.macs == n * prod(spatial) * d * (d + 1)  # dθ = Σ_s dY[s]·base[s]ᵀ: d·(d + 1) per grid point
    assert b.flops == 2 * b.macs
    assert direct_backward("AffineGrid", [theta, ("size", (d + 2,))], out, (False, False), 20) == flopcount.Cost()
