"""Backward (mode="train") formulas of the spatial operators: ConvTranspose, Col2Im, DeformConv,
CausalConvWithState, LpPool, GlobalLpPool, MaxRoiPool, Resize, Upsample, AffineGrid, DFT, STFT, RoiAlign.

Every expected value is a closed form written here from the sizes. To make an input need a gradient the
graphs feed it through ``Add(x, shift)`` with a trainable ``shift``; an input fed straight from the graph
inputs is data (no gradient, like a first layer's). Only the node under test (named "op") is asserted.
Operators whose ONNX schema marks every input non-differentiable (AffineGrid, DFT, STFT) never get a gradient
from a count; their formulas are also called directly on a hand-built context.
"""

from math import log2, prod

import pytest
from helpers import const, model, weight
from onnx import helper

import flopcount
from flopcount.context import NodeContext, TensorInfo
from flopcount.conventions import CONVENTIONS
from flopcount.registry import lookup_backward

N = helper.make_node
FLOAT = 1


def op_model(op_type, node_inputs, data, params=(), consts=(), learned=(), opset=18, n_outputs=1, **attrs):
    """One node "op" reading ``node_inputs``; ``data`` are graph inputs (name → shape); ``params`` trainable
    initializers; ``learned`` names of data inputs routed through Add(x, shift) so that they need a
    gradient (the node then reads "<name>_t"); the shift has x's shape, as a learned table has (a
    one-element shift would be a folded constant, not trained)."""
    nodes = [N("Add", [x, f"{x}_shift"], [f"{x}_t"], name=f"shift_{x}") for x in learned]
    names = [f"{x}_t" if x in learned else x for x in node_inputs]
    outs = [f"y{i}" for i in range(n_outputs)]
    nodes.append(N(op_type, names, outs, name="op", **attrs))
    inits = list(params) + list(consts) + [weight(f"{x}_shift", data[x]) for x in learned]
    return model(nodes, data, outs, inits, opset=opset)


def backward_of(m, **kw):
    r = flopcount.count(m, mode="train", **kw)
    assert not r.backward_unsupported
    return next(n for n in r.nodes if n.name == "op").backward


def direct(op_type, inputs, outputs, grads, opset, values=None, **attrs):
    """Call the registered backward formula on a hand-built context (shapes given, nothing inferred)."""
    values = values or {}
    ins = tuple(TensorInfo(name, FLOAT, shape) if name else None for name, shape in inputs)
    outs = tuple(TensorInfo(f"y{i}", FLOAT, shape) for i, shape in enumerate(outputs))
    ctx = NodeContext("op", op_type, "", opset, ins, outs, CONVENTIONS["default"], values.get, grads=tuple(grads))
    return lookup_backward("", op_type)(ctx, **attrs)


# --- ConvTranspose: dX = Conv(dY, W) and dW, each the forward MACs |X|·K·C_out/G; dB = |Y| additions ----


def tr_out(size, k, stride=1, pads=(0, 0), dilation=1, output_padding=0):
    """ConvTranspose output size, from the ONNX spec's equation."""
    return stride * (size - 1) + output_padding + (k - 1) * dilation + 1 - pads[0] - pads[1]


CONV_TRANSPOSE = [
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
@pytest.mark.parametrize("n, c_in, c_out, g, spatial, kernel, attrs, out", CONV_TRANSPOSE)
def test_conv_transpose_backward(n, c_in, c_out, g, spatial, kernel, attrs, out, x_grad, bias):
    params = [weight("W", (c_in, c_out // g, *kernel))] + ([weight("B", (c_out,))] if bias else [])
    m = op_model("ConvTranspose", ["x", "W"] + (["B"] if bias else []), {"x": (n, c_in, *spatial)}, params,
                 learned=("x",) if x_grad else (), **attrs)
    forward_macs = n * c_in * prod(spatial) * prod(kernel) * (c_out // g)  # each input element into K·C_out/G
    y = n * c_out * prod(out)
    b = backward_of(m)
    assert b.macs == forward_macs * (2 if x_grad else 1)  # dX only for an inner layer; dW always
    assert b.flops == 2 * b.macs + (y if bias else 0)  # dB = Σ dY: one addition per output element
    assert backward_of(m, convention="table3").flops == 2 * b.macs  # no bias term


def test_conv_transpose_backward_of_data_weight_is_dx_only():
    # W a graph input (not trained), X needs a gradient: dX only, 2·3·7·11·(3·3)·5 MACs
    m = op_model("ConvTranspose", ["x", "W"], {"x": (2, 3, 7, 11), "W": (3, 5, 3, 3)}, learned=("x",))
    assert backward_of(m).macs == 2 * 3 * 7 * 11 * 9 * 5


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

    m = op_model("ConvTranspose", ["x", "W"], {"x": (n, c_in, h, w)}, [weight("W", (c_in, c_out // g, k, k))],
                 learned=("x",) if x_grad else (), group=g, strides=[stride] * 2, pads=[pad] * 4,
                 output_padding=[out_pad] * 2)
    assert backward_of(m, convention="dense").flops == expected


# --- Col2Im: dX = Im2Col(dY), a gather: no arithmetic ---------------------------------------------


def test_col2im_backward_is_a_gather():
    m = op_model("Col2Im", ["x", "image_shape", "block_shape"], {"x": (2, 3 * 2 * 3, 6 * 7)},
                 consts=[const("image_shape", [7, 9]), const("block_shape", [2, 3])], learned=("x",))
    r = flopcount.count(m, mode="train")
    node = next(n for n in r.nodes if n.name == "op")
    assert node.backward.flops == node.backward.int_ops == 0 and not r.backward_unsupported
    assert node.cost.flops == 2 * 3 * 2 * 3 * 6 * 7  # the forward's adds, for contrast


# --- DeformConv -------------------------------------------------------------------------------------------

DEFORM = [
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
@pytest.mark.parametrize("n, c_in, c_out, g, og, spatial, kernel, attrs, out", DEFORM)
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
    m = op_model("DeformConv", names, data, params, learned=learned, opset=22, **attrs)

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
    b = backward_of(m)
    assert (b.macs, b.flops) == (macs, flops)


def test_deform_conv_1d_offset_slope_needs_no_multiply():
    # 1-D: v = (1 − f)·X_lo + f·X_hi, ∂v/∂q = X_hi − X_lo (1 FLOP), then ·g and accumulate: 3 per sample
    n, c, l, k = 2, 3, 11, 3
    m = op_model("DeformConv", ["x", "W", "offset"], {"x": (n, c, l), "W": (5, c, k), "offset": (n, k, l - k + 1)},
                 learned=("offset",), opset=22)
    samples = n * c * k * (l - k + 1)
    b = backward_of(m)
    assert b.macs == n * 5 * (l - k + 1) * k * c  # dcol
    assert b.flops == 2 * b.macs + 3 * samples


# --- CausalConvWithState: dX and dW the forward MACs N·C·L·K each; dB; SiLU derivative -------------------


@pytest.mark.parametrize("activation", ["none", "silu"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("x_grad", [False, True], ids=["first-layer", "inner"])
def test_causal_conv_with_state_backward(x_grad, bias, activation):
    n, c, length, k = 3, 5, 7, 4
    params = [weight("W", (c, 1, k))] + ([weight("B", (c,))] if bias else [])
    m = op_model("CausalConvWithState", ["x", "W", "B" if bias else "", "past"],
                 {"x": (n, c, length), "past": (n, c, k - 1)}, params, learned=("x",) if x_grad else (),
                 opset=27, n_outputs=2, activation=activation)
    y = n * c * length
    b = backward_of(m)
    assert b.macs == y * k * (2 if x_grad else 1)
    silu = activation == "silu"
    # silu' as the element-wise Swish backward: 5 FLOPs and one exp per element
    assert b.flops == 2 * b.macs + (5 * y if silu else 0) + (y if bias else 0)
    assert b.transcendentals == (y if silu else 0)


def test_causal_conv_with_state_past_state_takes_no_gradient():
    # x and W data, past_state through a trained shift: past_state is non-differentiable, so nothing is owed
    n, c, length, k = 3, 5, 7, 4
    m = op_model("CausalConvWithState", ["x", "W", "", "past"], {"x": (n, c, length), "W": (c, 1, k),
                 "past": (n, c, k - 1)}, learned=("past",), opset=27, n_outputs=2)
    r = flopcount.count(m, mode="train")
    assert next(n for n in r.nodes if n.name == "op").backward == flopcount.Cost()


# --- LpPool, GlobalLpPool, MaxRoiPool ----------------------------------------------------------------------

LP = [
    # id: p, FLOPs per window element (before the accumulation), per output, transcendentals per element, per output
    pytest.param(1, 2, 0, 0, 0, id="p1"),  # sign(x)·dY
    pytest.param(2, 1, 1, 0, 0, id="p2"),  # x·(dY/y)
    pytest.param(3, 4, 2, 1, 1, id="p3"),  # x·|x|^(p−2)·t (abs, power, 2 multiplies); t = dY/y^(p−1)
]


@pytest.mark.parametrize("p, per_element, per_output, trans_element, trans_output", LP)
def test_lp_pool_backward(p, per_element, per_output, trans_element, trans_output):
    # X[2, 3, 11, 13], kernel 3x2, strides 2x1, pads 1 → Y[2, 3, 6, 14]
    m = op_model("LpPool", ["x"], {"x": (2, 3, 11, 13)}, learned=("x",), kernel_shape=[3, 2], strides=[2, 1],
                 pads=[1, 1, 1, 1], p=p)
    y = 2 * 3 * ((11 + 2 - 3) // 2 + 1) * ((13 + 2 - 2) // 1 + 1)
    assert y == 2 * 3 * 6 * 14
    b = backward_of(m)
    assert b.flops == (per_element + 1) * 6 * y + per_output * y  # + 1 addition into dX per window element
    assert b.transcendentals == trans_element * 6 * y + trans_output * y


@pytest.mark.parametrize("p, per_element, per_output, trans_element, trans_output", LP)
def test_global_lp_pool_backward(p, per_element, per_output, trans_element, trans_output):
    x, y = 2 * 3 * 11 * 13, 2 * 3
    b = backward_of(op_model("GlobalLpPool", ["x"], {"x": (2, 3, 11, 13)}, learned=("x",), p=p))
    assert b.flops == per_element * x + per_output * y  # each element in one window: written, not added
    assert b.transcendentals == trans_element * x + trans_output * y


def test_lp_pool_of_data_has_no_backward():
    r = flopcount.count(op_model("LpPool", ["x"], {"x": (2, 3, 11, 13)}, kernel_shape=[3, 3]), mode="train")
    assert r.backward == flopcount.Cost() and not r.backward_unsupported


def test_max_roi_pool_backward_scatters_to_the_argmax():
    m = op_model("MaxRoiPool", ["x", "rois"], {"x": (1, 3, 11, 13), "rois": (7, 5)}, learned=("x", "rois"),
                 pooled_shape=[2, 3])
    assert backward_of(m).flops == 7 * 3 * 2 * 3  # |Y|; the ROIs (non-differentiable) get nothing


# --- Resize, Upsample: the adjoint interpolation, 2P·|Y| (nearest |Y|) -----------------------------------

RESIZE = [
    # id: mode, X, output sizes, attrs, P taps per output element (derived here)
    pytest.param("nearest", (2, 3, 5, 7), (2, 3, 10, 21), {}, 1, id="nearest"),
    pytest.param("linear", (2, 3, 5, 7), (2, 3, 10, 21), {}, 2 * 2, id="bilinear"),
    pytest.param("linear", (2, 3, 5, 7), (2, 3, 5, 21), {}, 2, id="linear-one-axis"),
    pytest.param("cubic", (2, 3, 5, 7), (2, 3, 10, 21), {}, 4 * 4, id="bicubic"),
    pytest.param("linear", (2, 3, 5, 7, 9), (2, 3, 10, 14, 18), {}, 2 * 2 * 2, id="trilinear"),
    pytest.param("linear", (2, 3, 20, 21), (2, 3, 6, 7), {"antialias": 1},
                 (2 * -(-20 * 2 // (2 * 6))) * (2 * -(-21 * 2 // (2 * 7))), id="antialias-down"),
]


@pytest.mark.parametrize("mode, x, y, attrs, points", RESIZE)
def test_resize_backward(mode, x, y, attrs, points):
    m = op_model("Resize", ["x", "", "", "sizes"], {"x": x}, consts=[const("sizes", y)], learned=("x",),
                 opset=19, mode=mode, **attrs)
    scatter = 2 * points if points > 1 else 1  # P multiplies + P additions; nearest: one addition
    assert backward_of(m).flops == scatter * prod(y)


def test_resize_of_data_has_no_backward():
    m = op_model("Resize", ["x", "", "", "sizes"], {"x": (2, 3, 5, 7)}, consts=[const("sizes", [2, 3, 10, 21])],
                 opset=19, mode="linear")
    assert flopcount.count(m, mode="train").backward == flopcount.Cost()


def test_upsample_backward():
    import numpy as np

    m = op_model("Upsample", ["x", "scales"], {"x": (2, 3, 5, 7)}, consts=[const("scales", [1, 1, 3, 2], np.float32)],
                 learned=("x",), opset=9, mode="linear")
    assert backward_of(m).flops == 2 * 4 * 2 * 3 * 15 * 14  # bilinear: P = 4 taps


# --- AffineGrid, DFT, STFT: schema non-differentiable; formulas checked directly --------------------------


def test_affine_grid_theta_is_not_trained_by_the_schema():
    m = op_model("AffineGrid", ["theta", "size"], {}, [weight("theta", (3, 2, 3))], [const("size", [3, 5, 7, 11])],
                 opset=20)
    r = flopcount.count(m, mode="train")
    assert r.trainable_params == 0 and r.backward == flopcount.Cost() and not r.backward_unsupported


@pytest.mark.parametrize("grid, d", [pytest.param((3, 7, 11), 2, id="2d"), pytest.param((3, 5, 7, 11), 3, id="3d")])
def test_affine_grid_backward_formula(grid, d):
    n, spatial = grid[0], grid[1:]
    theta = ("theta", (n, d, d + 1))
    out = [(*grid, d)]
    b = direct("AffineGrid", [theta, ("size", (d + 2,))], out, (True, False), 20)
    assert b.macs == n * prod(spatial) * d * (d + 1)  # dθ = Σ_s dY[s]·base[s]ᵀ: d·(d + 1) per grid point
    assert b.flops == 2 * b.macs
    assert direct("AffineGrid", [theta, ("size", (d + 2,))], out, (False, False), 20) == flopcount.Cost()


def test_dft_signal_is_not_trained_by_the_schema():
    m = op_model("DFT", ["x"], {"x": (3, 16, 2)}, learned=("x",), opset=17, axis=1)
    r = flopcount.count(m, mode="train")
    assert next(n for n in r.nodes if n.name == "op").backward == flopcount.Cost() and not r.backward_unsupported


DFT = [
    # id: X, output, attrs, transforms, N, real-sided, 1/N scaling of |Y|
    pytest.param((3, 16, 2), (3, 16, 2), {}, 3, 16, False, 0, id="complex"),
    pytest.param((3, 16, 2), (3, 16, 2), {"inverse": 1}, 3, 16, False, 3 * 16 * 2, id="inverse"),
    pytest.param((5, 32, 1), (5, 17, 2), {"onesided": 1}, 5, 32, True, 0, id="rfft"),
    pytest.param((5, 17, 2), (5, 32, 1), {"onesided": 1, "inverse": 1}, 5, 32, True, 5 * 32, id="irfft"),
]


@pytest.mark.parametrize("x, y, attrs, t, n, real, scaling", DFT)
def test_dft_backward_formula(x, y, attrs, t, n, real, scaling):
    b = direct("DFT", [("x", x)], [y], (True,), 17, axis=1, **attrs)
    assert b.flops == t * (2.5 if real else 5) * n * log2(n) + scaling  # the adjoint transform, same real side
    assert direct("DFT", [("x", x)], [y], (False,), 17, axis=1, **attrs) == flopcount.Cost()


@pytest.mark.parametrize("g_signal, g_window", [(True, False), (False, True), (True, True)],
                         ids=["signal", "window", "both"])
@pytest.mark.parametrize("channels", [1, 2], ids=["real", "complex"])
def test_stft_backward_formula(channels, g_signal, g_window):
    import numpy as np

    b_, length, step, n = 2, 64, 8, 16
    frames = (length - n) // step + 1
    bins = n // 2 + 1 if channels == 1 else n
    inputs = [("x", (b_, length, channels)), ("step", ()), ("w", (n,))]
    values = {"step": np.array(step)}
    cost = direct("STFT", inputs, [(b_, frames, bins, 2)], (g_signal, False, g_window), 17, values,
                  onesided=int(channels == 1))
    fft = (2.5 if channels == 1 else 5) * n * log2(n)  # once, shared by both gradients
    per_frame = fft + (2 * n * channels if g_signal else 0) + (2 * n * channels if g_window else 0)
    # signal: ·window and overlap-add; window: Σ dframe·x (a multiply and an add per real component)
    assert cost.flops == b_ * frames * per_frame
    no_window = direct("STFT", inputs[:2] + [("", None), ("len", ())], [(b_, frames, bins, 2)],
                       (True, False, False, False), 17, values | {"len": np.array(n)}, onesided=int(channels == 1))
    assert no_window.flops == b_ * frames * (fft + n * channels)  # overlap-add only


# --- RoiAlign: each sample scatters dY/S to its 4 corners (avg); the argmax corner (max) -----------------

ROI = [
    # id: sampling_ratio, mode, S (derived here), FLOPs per output element
    pytest.param(2, "avg", 2 * 2, 8 * 4 + 1, id="ratio2-avg"),
    pytest.param(0, "avg", -(-11 // 3) * -(-13 // 2), 8 * 4 * 7 + 1, id="adaptive-avg"),
    pytest.param(3, "max", 3 * 3, 2, id="ratio3-max"),
]


@pytest.mark.parametrize("ratio, mode, s, per_output", ROI)
def test_roi_align_backward(ratio, mode, s, per_output):
    if ratio == 0:
        assert s == 4 * 7
    m = op_model("RoiAlign", ["x", "rois", "batch_indices"], {"x": (1, 5, 11, 13), "rois": (7, 4)},
                 consts=[const("batch_indices", [0] * 7)], learned=("x",), opset=22, output_height=3,
                 output_width=2, sampling_ratio=ratio, mode=mode)
    assert backward_of(m).flops == per_output * 7 * 5 * 3 * 2


def test_roi_align_rois_take_no_gradient():
    m = op_model("RoiAlign", ["x", "rois", "batch_indices"], {"x": (1, 5, 11, 13), "rois": (7, 4)},
                 consts=[const("batch_indices", [0] * 7)], learned=("rois",), opset=22, sampling_ratio=2)
    assert backward_of(m) == flopcount.Cost()
