"""Conv-like ops (Conv, ConvTranspose, DeformConv, Col2Im, CausalConvWithState), checked against closed
forms written here and, for ConvTranspose, against torch.utils.flop_counter."""

from math import ceil, floor, prod

import pytest
from helpers import const, model, op_backward, shifted_op_model, single, weight
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


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): ConvTranspose, Col2Im, DeformConv, CausalConvWithState.
#
# Every expected value is a closed form written here from the sizes. To make an input need a gradient the
# graphs feed it through ``Add(x, shift)`` with a trainable ``shift``; an input fed straight from the graph
# inputs is data (no gradient, like a first layer's). Only the node under test (named "op") is asserted.
# Operators whose ONNX schema marks every input non-differentiable (AffineGrid, DFT, STFT) never get a gradient
# from a count; their formulas are also called directly on a hand-built context.
# -----------------------------------------------------------------------------------------------------------------


def tr_out(size, k, stride=1, pads=(0, 0), dilation=1, output_padding=0):
    """ConvTranspose output size, from the ONNX spec's equation."""
    return stride * (size - 1) + output_padding + (k - 1) * dilation + 1 - pads[0] - pads[1]


CONV_TRANSPOSE_TRAIN = [
    # id: N, C_in, C_out, G, input spatial, kernel, attrs, output spatial (derived here)
    pytest.param(2, 5, 7, 1, (9, 11), (3, 5), {}, (tr_out(9, 3), tr_out(11, 5)), id="plain"),
    pytest.param(1, 6, 9, 3, (7, 11), (3, 3), {"group": 3, "strides": [2, 3], "pads": [1, 0, 1, 2]},
                 (tr_out(7, 3, 2, (1, 1)), tr_out(11, 3, 3, (0, 2))), id="group3-strides-pads"),
    pytest.param(3, 5, 7, 1, (9, 11), (3, 3), {"strides": [3, 2], "output_padding": [2, 1], "dilations": [2, 1]},
                 (tr_out(9, 3, 3, dilation=2, output_padding=2), tr_out(11, 3, 2, output_padding=1)),
                 id="output-padding-dilation"),
]


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("x_grad", [False, True], ids=["first-layer", "inner"])
@pytest.mark.parametrize("n, c_in, c_out, g, spatial, kernel, attrs, out", CONV_TRANSPOSE_TRAIN)
def test_conv_transpose_backward(n, c_in, c_out, g, spatial, kernel, attrs, out, x_grad, bias):
    params = [weight("W", (c_in, c_out // g, *kernel))] + ([weight("B", (c_out,))] if bias else [])
    m = shifted_op_model("ConvTranspose", ["x", "W"] + (["B"] if bias else []), {"x": (n, c_in, *spatial)}, params,
                 learned=("x",) if x_grad else (), **attrs)
    forward_macs = n * c_in * prod(spatial) * prod(kernel) * (c_out // g)  # each input element into K·C_out/G
    y = n * c_out * prod(out)
    b = op_backward(m)
    assert b.macs == forward_macs * (2 if x_grad else 1)  # dX only for an inner layer; dW always
    assert b.flops == 2 * b.macs + (y if bias else 0)  # dB = Σ dY: one addition per output element
    assert op_backward(m, convention="table3").flops == 2 * b.macs  # no bias term


def test_conv_transpose_backward_of_data_weight_is_dx_only():
    # W a graph input (not trained), X needs a gradient: dX only, 2·3·7·11·(3·3)·5 MACs
    m = shifted_op_model("ConvTranspose", ["x", "W"], {"x": (2, 3, 7, 11), "W": (3, 5, 3, 3)}, learned=("x",))
    assert op_backward(m).macs == 2 * 3 * 7 * 11 * 9 * 5


@pytest.mark.parametrize("x_grad", [False, True], ids=["first-layer", "inner"])
@pytest.mark.parametrize("g", [1, 3], ids=["group1", "group3"])
def test_conv_transpose_backward_matches_torch_flop_counter(g, x_grad):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    n, c_in, c_out, h, w, k, stride, pad, out_pad = 2, 6, 9, 7, 5, 3, 2, 1, 1
    ho, wo = (tr_out(size, k, stride, (pad, pad), output_padding=out_pad) for size in (h, w))
    forward = 2 * n * c_in * h * w * k * k * (c_out // g)  # FLOPs of the forward products
    expected = forward * (2 if x_grad else 1)  # dX (inner layer only) + dW, both the forward's products

    layer = torch.nn.ConvTranspose2d(c_in, c_out, k, stride=stride, padding=pad, output_padding=out_pad,
                                     groups=g, bias=False, device="meta")
    x = torch.empty(n, c_in, h, w, device="meta", requires_grad=x_grad)
    with FlopCounterMode(display=False) as fc:
        out = layer(x)
        out.sum().backward()
    assert tuple(out.shape) == (n, c_out, ho, wo)
    counts = fc.get_flop_counts()["Global"]
    assert counts[torch.ops.aten.convolution] == forward
    # FlopCounterMode counts a grouped weight gradient G times (tests/acceptance/test_training_reconcile.py): correct it
    torch_backward = counts[torch.ops.aten.convolution_backward] - (g - 1) * forward
    assert torch_backward == expected

    m = shifted_op_model("ConvTranspose", ["x", "W"], {"x": (n, c_in, h, w)}, [weight("W", (c_in, c_out // g, k, k))],
                 learned=("x",) if x_grad else (), group=g, strides=[stride] * 2, pads=[pad] * 4,
                 output_padding=[out_pad] * 2)
    assert op_backward(m, convention="dense").flops == expected


def test_col2im_backward_is_a_gather():
    m = shifted_op_model("Col2Im", ["x", "image_shape", "block_shape"], {"x": (2, 3 * 2 * 3, 6 * 7)},
                 consts=[const("image_shape", [7, 9]), const("block_shape", [2, 3])], learned=("x",))
    r = flopcount.count(m, mode="train")
    node = next(n for n in r.nodes if n.name == "op")
    assert node.backward.flops == node.backward.int_ops == 0 and not r.backward_unsupported
    assert node.cost.flops == 2 * 3 * 2 * 3 * 6 * 7  # the forward's adds, for contrast


DEFORM_TRAIN = [
    # id: N, C_in, C_out, G, offset_group, input spatial, kernel, attrs, output spatial (derived here)
    pytest.param(2, 4, 6, 2, 2, (7, 9), (3, 2), {"group": 2, "offset_group": 2}, (5, 8), id="2d-group2-og2"),
    pytest.param(1, 3, 5, 1, 1, (5, 7, 6), (3, 3, 2), {}, (3, 5, 5), id="3d"),
]


def slope(d):
    """One axis' derivative of a d-linear sample: Σ over 2^(d−1) corner pairs of (X_hi − X_lo)·(other weights)."""
    pairs = 2 ** (d - 1)
    return pairs + (pairs if d > 1 else 0) + (pairs - 1)  # subtractions, multiplies, additions


# which of X, W, offset, B, mask need a gradient (B and mask only when given)
GRADS = [
    pytest.param((False, True, False, False, False), id="only-W"),
    pytest.param((True, True, False, True, False), id="X-W-B"),
    pytest.param((False, False, True, False, False), id="only-offset"),
    pytest.param((False, False, False, False, True), id="only-mask"),
    pytest.param((True, True, True, True, True), id="all"),
]


@pytest.mark.parametrize("grads", GRADS)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("n, c_in, c_out, g, og, spatial, kernel, attrs, out", DEFORM_TRAIN)
def test_deform_conv_backward(n, c_in, c_out, g, og, spatial, kernel, attrs, out, masked, grads):
    g_x, g_w, g_off, g_b, g_mask = grads
    g_mask = g_mask and masked
    d, k, s_out = len(kernel), prod(kernel), prod(out)
    data = {"x": (n, c_in, *spatial), "offset": (n, og * k * d, *out), "mask": (n, og * k, *out)}
    data = {name: s for name, s in data.items() if name != "mask" or masked}
    params, names = [], ["x", "W", "offset", "B", "mask" if masked else ""]
    for name, shape, trained in (("W", (c_out, c_in // g, *kernel), g_w), ("B", (c_out,), g_b)):
        if trained:
            params.append(weight(name, shape))
        else:
            data[name] = shape
    learned = [name for name, flag in (("x", g_x), ("offset", g_off), ("mask", g_mask)) if flag]
    m = shifted_op_model("DeformConv", names, data, params, learned=learned, opset=22, **attrs)

    conv_macs = n * c_out * s_out * k * (c_in // g)
    samples = n * c_in * k * s_out
    points = n * og * k * s_out
    macs = conv_macs * (g_w + (g_x or g_off or g_mask))  # dW = dY·colᵀ; dcol = Wᵀ·dY
    flops = 2 * macs
    flops += samples if masked and (g_x or g_off) else 0  # g = m·dcol
    flops += 2 * 2**d * samples if g_x else 0  # scatter to 2^d corners: a multiply and an add each
    flops += 2 * samples if g_mask else 0  # dmask = Σ dcol·v
    if g_off:  # per axis: slope, times g, accumulate; from 3-D on, products of the other weights per point
        flops += d * (slope(d) + 2) * samples + d * 2 ** (d - 1) * (d - 2) * points
    flops += n * c_out * s_out if g_b else 0  # dB = Σ dY
    assert {2: 5, 3: 11}[d] == slope(d)  # 2-D: 2 subtractions, 2 multiplies, 1 addition
    b = op_backward(m)
    assert (b.macs, b.flops) == (macs, flops)


def test_deform_conv_1d_offset_slope_needs_no_multiply():
    # 1-D: v = (1 − f)·X_lo + f·X_hi, ∂v/∂q = X_hi − X_lo (1 FLOP), then ·g and accumulate: 3 per sample
    n, c, l, k = 2, 3, 11, 3
    m = shifted_op_model("DeformConv", ["x", "W", "offset"], {"x": (n, c, l), "W": (5, c, k), "offset": (n, k, l - k + 1)},
                 learned=("offset",), opset=22)
    samples = n * c * k * (l - k + 1)
    b = op_backward(m)
    assert b.macs == n * 5 * (l - k + 1) * k * c  # dcol
    assert b.flops == 2 * b.macs + 3 * samples


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("x_grad", [False, True], ids=["first-layer", "inner"])
def test_causal_conv_with_state_backward(x_grad, bias, activation):
    n, c, length, k = 3, 5, 7, 4
    params = [weight("W", (c, 1, k))] + ([weight("B", (c,))] if bias else [])
    m = shifted_op_model("CausalConvWithState", ["x", "W", "B" if bias else "", "past"],
                 {"x": (n, c, length), "past": (n, c, k - 1)}, params, learned=("x",) if x_grad else (),
                 opset=27, n_outputs=2, activation=activation)
    y = n * c * length
    b = op_backward(m)
    assert b.macs == y * k * (2 if x_grad else 1)
    silu = activation == "silu"
    # silu' as the element-wise Swish backward: 5 FLOPs and one exp per element
    assert b.flops == 2 * b.macs + (5 * y if silu else 0) + (y if bias else 0)
    assert b.transcendentals == (y if silu else 0)


def test_causal_conv_with_state_past_state_takes_no_gradient():
    # x and W data, past_state through a trained shift: past_state is non-differentiable, so nothing is owed
    n, c, length, k = 3, 5, 7, 4
    m = shifted_op_model("CausalConvWithState", ["x", "W", "", "past"], {"x": (n, c, length), "W": (c, 1, k),
                 "past": (n, c, k - 1)}, learned=("past",), opset=27, n_outputs=2)
    r = flopcount.count(m, mode="train")
    assert next(n for n in r.nodes if n.name == "op").backward == flopcount.Cost()
