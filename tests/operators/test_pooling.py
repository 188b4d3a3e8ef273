"""Pooling: MaxPool, AveragePool, LpPool and their global forms (K per output element; Table 3: Cin·H·W of the
input); MaxRoiPool (each bin counted as ⌈H/h⌉·⌈W/w⌉ reads: a ROI covering the whole map) and MaxUnpool (free)."""

from math import ceil, floor

import numpy as np
import pytest
from helpers import const, op_backward, shifted_op_model, single

import flopcount


def _ceil(a, b):
    return -(-a // b)


@pytest.mark.parametrize(
    "x, rois, pooled",
    [
        pytest.param((2, 5, 14, 21), 3, (7, 7), id="divisible-14x21-to-7x7"),
        pytest.param((1, 3, 13, 17), 11, (3, 5), id="ceil-13x17-to-3x5"),
    ],
)
def test_max_roi_pool(x, rois, pooled):
    m = single("MaxRoiPool", {"x": x, "rois": (rois, 5)}, opset=22, pooled_shape=list(pooled))
    h, w = pooled
    outputs = rois * x[1] * h * w
    window = _ceil(x[2], h) * _ceil(x[3], w)
    r = flopcount.count(m).total
    assert r.flops == outputs * window
    assert (r.macs, r.transcendentals) == (0, 0)


def test_max_roi_pool_whole_map_per_roi_when_divisible():
    # 14 = 2·7 and 21 = 3·7: each ROI costs C·H·W
    m = single("MaxRoiPool", {"x": (2, 5, 14, 21), "rois": (3, 5)}, opset=22, pooled_shape=[7, 7])
    assert flopcount.count(m).total.flops == 3 * 5 * 14 * 21


def test_max_unpool_is_free():
    indices = const("i", np.zeros((2, 3, 5, 7)))  # I has X's shape
    m = single("MaxUnpool", {"x": (2, 3, 5, 7)}, [indices], opset=22, kernel_shape=[2, 2], strides=[2, 2])
    (node,) = flopcount.count(m).nodes
    assert (node.status, node.cost.flops) == ("zero-cost", 0)


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): LpPool, GlobalLpPool, MaxRoiPool.
#
# Every expected value is a closed form written here from the sizes. To make an input need a gradient the
# graphs feed it through ``Add(x, shift)`` with a trainable ``shift``; an input fed straight from the graph
# inputs is data (no gradient, like a first layer's). Only the node under test (named "op") is asserted.
# Operators whose ONNX schema marks every input non-differentiable (AffineGrid, DFT, STFT) never get a gradient
# from a count; their formulas are also called directly on a hand-built context.
# -----------------------------------------------------------------------------------------------------------------


LP = [
    # id: p, FLOPs per window element (before the accumulation), per output, transcendentals per element, per output
    pytest.param(1, 2, 0, 0, 0, id="p1"),  # sign(x)·dY
    pytest.param(2, 1, 1, 0, 0, id="p2"),  # x·(dY/y)
    pytest.param(3, 4, 2, 1, 1, id="p3"),  # x·|x|^(p−2)·t (abs, power, 2 multiplies); t = dY/y^(p−1)
]


@pytest.mark.parametrize("p, per_element, per_output, trans_element, trans_output", LP)
def test_lp_pool_backward(p, per_element, per_output, trans_element, trans_output):
    # X[2, 3, 11, 13], kernel 3x2, strides 2x1, pads 1 → Y[2, 3, 6, 14]
    m = shifted_op_model("LpPool", ["x"], {"x": (2, 3, 11, 13)}, learned=("x",), kernel_shape=[3, 2], strides=[2, 1],
                 pads=[1, 1, 1, 1], p=p)
    y = 2 * 3 * ((11 + 2 - 3) // 2 + 1) * ((13 + 2 - 2) // 1 + 1)
    assert y == 2 * 3 * 6 * 14
    b = op_backward(m)
    assert b.flops == (per_element + 1) * 6 * y + per_output * y  # + 1 addition into dX per window element
    assert b.transcendentals == trans_element * 6 * y + trans_output * y


@pytest.mark.parametrize("p, per_element, per_output, trans_element, trans_output", LP)
def test_global_lp_pool_backward(p, per_element, per_output, trans_element, trans_output):
    x, y = 2 * 3 * 11 * 13, 2 * 3
    b = op_backward(shifted_op_model("GlobalLpPool", ["x"], {"x": (2, 3, 11, 13)}, learned=("x",), p=p))
    assert b.flops == per_element * x + per_output * y  # each element in one window: written, not added
    assert b.transcendentals == trans_element * x + trans_output * y


def test_lp_pool_of_data_has_no_backward():
    r = flopcount.count(shifted_op_model("LpPool", ["x"], {"x": (2, 3, 11, 13)}, kernel_shape=[3, 3]), mode="train")
    assert r.backward == flopcount.Cost() and not r.backward_unsupported


def test_max_roi_pool_backward_scatters_to_the_argmax():
    m = shifted_op_model("MaxRoiPool", ["x", "rois"], {"x": (1, 3, 11, 13), "rois": (7, 5)}, learned=("x", "rois"),
                 pooled_shape=[2, 3])
    assert op_backward(m).flops == 7 * 3 * 2 * 3  # |Y|; the ROIs (non-differentiable) get nothing


# -----------------------------------------------------------------------------------------------------------------
# Pooling windows: K per output element (Table 3: Cin·H·W of the input).
# -----------------------------------------------------------------------------------------------------------------


POOL = [
    # id: op, input, attrs, expected output spatial (derived here), K
    pytest.param("MaxPool", (2, 5, 17, 19), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                 (floor((17 + 2 - 3) / 2) + 1, floor((19 + 2 - 3) / 2) + 1), 9, id="maxpool-3x3-s2"),
    pytest.param("AveragePool", (1, 3, 23, 29), {"kernel_shape": [2, 3]}, (22, 27), 6, id="avgpool-2x3"),
    pytest.param("AveragePool", (1, 3, 23, 29), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
                 (ceil((23 - 3) / 2) + 1, ceil((29 - 3) / 2) + 1), 9, id="avgpool-ceil"),
    pytest.param("MaxPool", (2, 7, 31), {"kernel_shape": [5], "strides": [3]}, (floor((31 - 5) / 3) + 1,), 5, id="maxpool1d"),
    pytest.param("LpPool", (1, 2, 9, 9), {"kernel_shape": [3, 3]}, (7, 7), 9, id="lppool"),
]


@pytest.mark.parametrize("op, x, attrs, out, k", POOL)
def test_pooling(op, x, attrs, out, k):
    m = single(op, {"x": x}, **attrs)
    y = x[0] * x[1]
    for d in out:
        y *= d
    r = flopcount.count(m)
    assert r.total.flops == k * y
    assert r.total.macs == 0
    if op == "LpPool":
        assert r.total.transcendentals == (k + 1) * y
    x_elems = 1
    for d in x:
        x_elems *= d
    assert flopcount.count(m, convention="table3").total.flops == x_elems


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op):
    r = flopcount.count(single(op, {"x": (3, 5, 7, 11)}))
    assert r.total.flops == 3 * 5 * 7 * 11
