"""Conv-like ops (Conv, ConvTranspose, DeformConv, Col2Im, CausalConvWithState), checked against closed
forms written here and, for ConvTranspose, against torch.utils.flop_counter."""

from math import ceil, floor, prod

import pytest
from helpers import const, model, single, weight
from onnx import helper

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


# --- ConvTranspose: MACs over the INPUT, N·C_in·S_in·K·C_out/G ---------------------------------


def tr_out_dim(size, k, stride=1, pad=(0, 0), dilation=1, output_padding=0):
    """ConvTranspose output size from the ONNX spec's equation."""
    return stride * (size - 1) + output_padding + (k - 1) * dilation + 1 - pad[0] - pad[1]


CONV_TRANSPOSE = [
    # N, C_in, C_out, G, input spatial, kernel, attrs, expected output spatial (derived here)
    pytest.param(2, 5, 7, 1, (9, 11), (3, 5), {}, (tr_out_dim(9, 3), tr_out_dim(11, 5)), id="2d"),
    pytest.param(1, 9, 15, 3, (9, 11), (3, 3), {"group": 3, "strides": [2, 3], "pads": [1, 0, 1, 2]},
                 (tr_out_dim(9, 3, 2, (1, 1)), tr_out_dim(11, 3, 3, (0, 2))), id="group3-strides-pads"),
    pytest.param(1, 5, 7, 1, (9, 11), (3, 3), {"strides": [3, 2], "output_padding": [2, 1]},
                 (tr_out_dim(9, 3, 3, output_padding=2), tr_out_dim(11, 3, 2, output_padding=1)), id="output-padding"),
    pytest.param(1, 5, 7, 1, (9, 11), (3, 3), {"dilations": [2, 3]},
                 (tr_out_dim(9, 3, dilation=2), tr_out_dim(11, 3, dilation=3)), id="dilations"),
    pytest.param(1, 5, 7, 1, (9, 11), (4, 4), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (18, 22), id="same-upper"),
    pytest.param(1, 5, 7, 1, (9, 11), (3, 3), {"strides": [2, 2], "output_shape": [19, 24]}, (19, 24),
                 id="output-shape"),
    pytest.param(3, 5, 7, 1, (13,), (5,), {"strides": [2]}, (tr_out_dim(13, 5, 2),), id="1d"),
    pytest.param(1, 4, 6, 2, (5, 7, 9), (3, 3, 3), {"group": 2}, (7, 9, 11), id="3d-group2"),
    pytest.param(1, 6, 6, 6, (9, 11), (3, 3), {"group": 6, "strides": [2, 2]},
                 (tr_out_dim(9, 3, 2), tr_out_dim(11, 3, 2)), id="depthwise"),
]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("n, c_in, c_out, g, spatial, kernel, attrs, out", CONV_TRANSPOSE)
def test_conv_transpose(n, c_in, c_out, g, spatial, kernel, attrs, out, bias):
    inits = [weight("W", (c_in, c_out // g, *kernel))] + ([weight("B", (c_out,))] if bias else [])
    m = single("ConvTranspose", {"x": (n, c_in, *spatial)}, inits, **attrs)
    r = flopcount.count(m)
    k = prod(kernel)
    s_in, s_out = prod(spatial), prod(out)
    assert r.nodes[0].outputs[0].shape == (n, c_out, *out)
    macs = n * c_in * s_in * k * (c_out // g)
    assert r.total.macs == macs
    assert r.total.flops == 2 * macs + (n * c_out * s_out if bias else 0)
    assert flopcount.count(m, convention="table3").total.flops == 2 * macs


@pytest.mark.parametrize("n, c_in, c_out, g, spatial, kernel, attrs, out", CONV_TRANSPOSE[:4] + CONV_TRANSPOSE[6:])
def test_conv_transpose_matches_torch_flop_counter(n, c_in, c_out, g, spatial, kernel, attrs, out):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    fn = {1: torch.nn.functional.conv_transpose1d, 2: torch.nn.functional.conv_transpose2d,
          3: torch.nn.functional.conv_transpose3d}[len(kernel)]
    x = torch.empty(n, c_in, *spatial, device="meta")
    w = torch.empty(c_in, c_out // g, *kernel, device="meta")
    # torch's count, like ours, does not depend on pads (it pads symmetrically; ONNX may not)
    with FlopCounterMode(display=False) as fc:
        fn(x, w, stride=attrs.get("strides", 1), dilation=attrs.get("dilations", 1), groups=g,
           output_padding=attrs.get("output_padding", 0))
    m = single("ConvTranspose", {"x": (n, c_in, *spatial)}, [weight("W", (c_in, c_out // g, *kernel))], **attrs)
    assert flopcount.count(m).total.flops == fc.get_total_flops()


# --- DeformConv: Conv product + bilinear sampling (+ mask) -------------------------------------

DEFORM = [
    # N, C_in, C_out, G, offset_group, input spatial, kernel, attrs, output spatial (derived here)
    pytest.param(1, 6, 9, 3, 2, (11, 13), (3, 3), {"group": 3, "offset_group": 2, "pads": [1, 1, 1, 1]},
                 (11, 13), id="2d-group3-og2-same"),
    pytest.param(2, 5, 7, 1, 1, (11, 13), (3, 5), {"strides": [2, 2]},
                 (out_dim(11, 3, 2), out_dim(13, 5, 2)), id="2d-stride2"),
    pytest.param(1, 3, 5, 1, 1, (7, 9, 11), (3, 3, 3), {}, (5, 7, 9), id="3d"),
]


@pytest.mark.parametrize("mask", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("n, c_in, c_out, g, og, spatial, kernel, attrs, out", DEFORM)
def test_deform_conv(n, c_in, c_out, g, og, spatial, kernel, attrs, out, bias, mask):
    d = len(kernel)
    k, s_out = prod(kernel), prod(out)
    inits = [weight("W", (c_out, c_in // g, *kernel)), weight("offset", (n, og * k * d, *out))]
    inits += [weight("B", (c_out,))] if bias else []
    inits += [weight("mask", (n, og * k, *out))] if mask else []
    names = ["x", "W", "offset", "B" if bias else "", "mask" if mask else ""]
    node = helper.make_node("DeformConv", names, ["y"], **attrs)
    r = flopcount.count(model([node], {"x": (n, c_in, *spatial)}, ["y"], inits, opset=22))
    assert r.nodes[0].outputs[0].shape == (n, c_out, *out)
    macs = n * c_out * s_out * k * (c_in // g)
    samples = n * c_in * k * s_out  # every input channel sampled at each tap of each output position
    points = n * og * k * s_out  # sampling positions, shared by the channels of an offset group
    per_sample = (2**d + 2**d - 1) + (1 if mask else 0)  # 2^d weighted corner reads (+ mask multiply)
    per_point = d + 2 * d + 2**d * (d - 1)  # position, fractions and complements, corner weights
    assert {2: (7, 10), 3: (15, 25)}[d] == (2**d + 2**d - 1, per_point)  # the docstring's 2-D numbers
    assert r.total.macs == macs
    assert r.total.flops == 2 * macs + per_sample * samples + per_point * points + (n * c_out * s_out if bias else 0)


# --- Col2Im: one add per input element -----------------------------------------------------------


@pytest.mark.parametrize("dtype, field", [(1, "flops"), (6, "int_ops")], ids=["float", "int32"])
def test_col2im(dtype, field):
    # N 2, C 3, block 2x3 → 18 rows; image 7x9 with stride 1 → L = (7 − 2 + 1)·(9 − 3 + 1) = 42
    m = single("Col2Im", {"x": (2, 3 * 2 * 3, 6 * 7)}, [const("image_shape", [7, 9]), const("block_shape", [2, 3])],
               dtype=dtype)
    r = flopcount.count(m)
    assert r.nodes[0].outputs[0].shape == (2, 3, 7, 9)
    assert getattr(r.total, field) == 2 * 18 * 42
    assert r.total.macs == 0


# --- CausalConvWithState: depth-wise causal 1-D conv over the output ---------------------------

CAUSAL = [
    # inputs besides x and W, activation, extra FLOPs per output element, transcendentals per output
    pytest.param(False, False, "none", 0, 0, id="plain"),
    pytest.param(True, False, "none", 1, 0, id="bias"),
    pytest.param(False, True, "none", 0, 0, id="past-state"),
    pytest.param(True, True, "silu", 1 + 1, 1, id="bias-past-silu"),
    pytest.param(False, False, "swish", 1, 1, id="swish"),
]


@pytest.mark.parametrize("bias, past, activation, extra, trans", CAUSAL)
def test_causal_conv_with_state(bias, past, activation, extra, trans):
    n, c, length, k = 3, 5, 7, 4
    names = ["x", "W", "B" if bias else "", "past" if past else ""]
    inits = [weight("W", (c, 1, k))] + ([weight("B", (c,))] if bias else [])
    inputs = {"x": (n, c, length)} | ({"past": (n, c, k - 1)} if past else {})
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], activation=activation)
    m = model([node], inputs, ["y", "state"], inits, opset=27)
    r = flopcount.count(m)
    y = n * c * length
    assert r.total.macs == y * k
    assert r.total.flops == 2 * y * k + extra * y
    assert r.total.transcendentals == trans * y
