"""MaxRoiPool (each bin counted as ⌈H/h⌉·⌈W/w⌉ reads: a ROI covering the whole map) and MaxUnpool (free)."""

import numpy as np
import pytest
from helpers import const, single

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
