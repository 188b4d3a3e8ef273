"""Conv: FLOPs = 2·N·C_out·S_out·K·C_in/G + bias, checked against closed forms written here."""

from math import ceil, floor

import pytest
from conftest import single, weight

import flopcount


def out_dim(size, k, stride=1, pad=(0, 0), dilation=1):
    return floor((size + pad[0] + pad[1] - dilation * (k - 1) - 1) / stride) + 1


CASES = [
    # id, N, C_in, C_out, G, input spatial, kernel, attrs, expected output spatial (derived here)
    pytest.param(2, 6, 9, 1, (11, 13), (3, 5), {}, (out_dim(11, 3), out_dim(13, 5)), id="group1-3x5-valid"),
    pytest.param(2, 6, 9, 3, (11, 13), (3, 5), {"group": 3}, (9, 9), id="group3"),
    pytest.param(3, 7, 7, 7, (17, 19), (3, 3), {"group": 7, "pads": [1, 1, 1, 1]}, (17, 19), id="depthwise"),
    pytest.param(1, 5, 11, 1, (23, 29), (3, 3), {"dilations": [2, 2]}, (out_dim(23, 3, dilation=2), out_dim(29, 3, dilation=2)), id="dilation2"),
    pytest.param(1, 5, 11, 1, (23, 29), (3, 3), {"strides": [2, 3], "pads": [1, 0, 2, 1]},
                 (out_dim(23, 3, 2, (1, 2)), out_dim(29, 3, 3, (0, 1))), id="stride-asymmetric-pads"),
    pytest.param(1, 5, 11, 1, (23, 29), (4, 4), {"strides": [2, 2], "auto_pad": "SAME_UPPER"},
                 (ceil(23 / 2), ceil(29 / 2)), id="same-upper"),
    pytest.param(2, 3, 13, 1, (37,), (5,), {"strides": [3]}, (out_dim(37, 5, 3),), id="conv1d"),
    pytest.param(1, 4, 6, 2, (7, 9, 11), (3, 3, 3), {"group": 2}, (5, 7, 9), id="conv3d-group2"),
]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("n, c_in, c_out, g, spatial, kernel, attrs, out", CASES)
def test_conv(n, c_in, c_out, g, spatial, kernel, attrs, out, bias):
    inits = [weight("W", (c_out, c_in // g, *kernel))] + ([weight("B", (c_out,))] if bias else [])
    m = single("Conv", {"x": (n, c_in, *spatial)}, inits, **attrs)
    r = flopcount.count(m)
    k = 1
    for d in kernel:
        k *= d
    s_out = 1
    for d in out:
        s_out *= d
    macs = n * c_out * s_out * k * (c_in // g)
    assert r.total.macs == macs
    assert r.total.flops == 2 * macs + (n * c_out * s_out if bias else 0)
    assert r.params == c_out * (c_in // g) * k + (c_out if bias else 0)


def test_conv_table3_drops_bias_keeps_factor_two():
    # Table 3: 2·K²·Cin·H·W·Cout. 3x3 kernel, Cin 4, Cout 8, output 5x5 (valid on 7x7): 2*9*4*25*8 = 14400
    m = single("Conv", {"x": (1, 4, 7, 7)}, [weight("W", (8, 4, 3, 3)), weight("B", (8,))])
    assert flopcount.count(m, convention="table3").total.flops == 14400
    assert flopcount.count(m).total.flops == 14400 + 8 * 25


def test_depthwise_equals_table3_depthwise_row():
    # Table 3 depth-wise row: 2·K²·Cin·H·W. Cin 32, 3x3, output 14x14 (pads 1): 2*9*32*196 = 112896
    m = single("Conv", {"x": (1, 32, 14, 14)}, [weight("W", (32, 1, 3, 3))], group=32, pads=[1, 1, 1, 1])
    assert flopcount.count(m).total.flops == 112896
