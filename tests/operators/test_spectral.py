"""DFT, STFT, window functions, MelWeightMatrix.

FFT convention: a complex transform of length N costs 5·N·log2(N) FLOPs (rounded per transform);
a transform with a real input or a real output costs half, 2.5·N·log2(N).
"""

from math import log2

import numpy as np
import pytest
from helpers import const, direct_backward, model, shifted_op_model, single
from onnx import TensorProto, helper

import flopcount


def dft(x, opset, names=("x",), inits=(), **attrs):
    node = helper.make_node("DFT", list(names), ["y"], **attrs)
    return model([node], {"x": x}, ["y"], list(inits), opset=opset)


DFT = [
    # id: X, opset, node inputs, initializers, attrs, T transforms, N, real-sided, |Y| scaled by the inverse
    pytest.param((3, 16, 5, 2), 17, ("x",), (), {"axis": 1}, 3 * 5, 16, False, 0, id="opset17-axis-attr-complex"),
    pytest.param((3, 7, 32, 1), 20, ("x", "", "axis"), (const("axis", 2),), {}, 3 * 7, 32, True, 0,
                 id="opset20-axis-input-real"),
    pytest.param((3, 7, 32, 1), 20, ("x",), (), {}, 3 * 7, 32, True, 0, id="opset20-default-axis"),
    pytest.param((3, 12, 2), 20, ("x", "n"), (const("n", 16),), {}, 3, 16, False, 0, id="dft-length-pads"),
    pytest.param((3, 16, 2), 20, ("x",), (), {"inverse": 1}, 3, 16, False, 3 * 16 * 2, id="inverse-complex"),
    pytest.param((3, 9, 2), 20, ("x",), (), {"inverse": 1, "onesided": 1}, 3, 2 * (9 - 1), True, 3 * 16 * 1,
                 id="irfft"),
    pytest.param((5, 32, 1), 20, ("x",), (), {"onesided": 1}, 5, 32, True, 0, id="rfft"),
]


@pytest.mark.parametrize("x, opset, names, inits, attrs, t, n, real, scaling", DFT)
def test_dft(x, opset, names, inits, attrs, t, n, real, scaling):
    r = flopcount.count(dft(x, opset, names, inits, **attrs))
    per_transform = (2.5 if real else 5) * n * log2(n)  # exact for these powers of two
    assert r.total.flops == t * per_transform + scaling
    assert r.total.transcendentals == 0


def test_dft_length_not_a_power_of_two_rounds_per_transform():
    r = flopcount.count(dft((5, 12, 1), 20))
    assert r.total.flops == 5 * round(2.5 * 12 * log2(12))


def test_rfft_with_runtime_length_is_a_shape_error():
    node = helper.make_node("DFT", ["x", "n"], ["y"], onesided=1)
    m = model([node], {"x": (3, 16, 1)}, ["y"], opset=20)
    m.graph.input.append(helper.make_tensor_value_info("n", TensorProto.INT64, []))
    with pytest.raises(flopcount.ShapeError, match="dft_length"):
        flopcount.count(m)


STFT = [
    # id: signal, frame_step, window length or None, frame_length or None, onesided, N, frames (derived)
    pytest.param((2, 128, 1), 8, 16, None, 1, 16, (128 - 16) // 8 + 1, id="real-window"),
    pytest.param((2, 128, 2), 8, None, 32, 0, 32, (128 - 32) // 8 + 1, id="complex-frame-length"),
    pytest.param((2, 100, 2), 10, 20, None, 0, 20, (100 - 20) // 10 + 1, id="complex-window-length-20"),
]


@pytest.mark.parametrize("x, step, window, length, onesided, n, frames", STFT)
def test_stft(x, step, window, length, onesided, n, frames):
    names = ["x", "step", "w" if window else "", "len" if length else ""]
    inits = [const("step", step)] + ([const("len", length)] if length else [])
    inputs = {"x": x, **({"w": (window,)} if window else {})}
    node = helper.make_node("STFT", names, ["y"], onesided=onesided)
    r = flopcount.count(model([node], inputs, ["y"], inits, opset=17)).total
    real = x[-1] == 1
    fft = round((2.5 if real else 5) * n * log2(n))
    windowing = n * x[-1] if window else 0  # 1 multiply per real sample, 2 per complex one
    assert r.flops == x[0] * frames * (fft + windowing)


@pytest.mark.parametrize(
    "op, flops, trans",
    [
        pytest.param("HannWindow", 4, 1, id="hann"),
        pytest.param("HammingWindow", 4, 1, id="hamming"),
        pytest.param("BlackmanWindow", 8, 2, id="blackman"),
    ],
)
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, flops, trans, periodic):
    r = flopcount.count(single(op, {}, [const("size", 13)], opset=17, periodic=periodic)).total
    assert (r.flops, r.transcendentals) == (flops * 13, trans * 13)


def test_mel_weight_matrix():
    inits = [const("bins", 9), const("dft", 32), const("rate", 16000), const("lo", 0.0, np.float32),
             const("hi", 8000.0, np.float32)]
    r = flopcount.count(single("MelWeightMatrix", {}, inits, opset=17)).total
    out = (32 // 2 + 1) * 9
    assert (r.flops, r.transcendentals) == (6 * out + 8 * (9 + 2), 9 + 2)


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): DFT, STFT.
#
# Every expected value is a closed form written here from the sizes. To make an input need a gradient the
# graphs feed it through ``Add(x, shift)`` with a trainable ``shift``; an input fed straight from the graph
# inputs is data (no gradient, like a first layer's). Only the node under test (named "op") is asserted.
# Operators whose ONNX schema marks every input non-differentiable (AffineGrid, DFT, STFT) never get a gradient
# from a count; their formulas are also called directly on a hand-built context.
# -----------------------------------------------------------------------------------------------------------------


def test_dft_signal_is_not_trained_by_the_schema():
    m = shifted_op_model("DFT", ["x"], {"x": (3, 16, 2)}, learned=("x",), opset=17, axis=1)
    r = flopcount.count(m, mode="train")
    assert next(n for n in r.nodes if n.name == "op").backward == flopcount.Cost() and not r.backward_unsupported


DFT_TRAIN = [
    # id: X, output, attrs, transforms, N, real-sided, 1/N scaling of |Y|
    pytest.param((3, 16, 2), (3, 16, 2), {}, 3, 16, False, 0, id="complex"),
    pytest.param((3, 16, 2), (3, 16, 2), {"inverse": 1}, 3, 16, False, 3 * 16 * 2, id="inverse"),
    pytest.param((5, 32, 1), (5, 17, 2), {"onesided": 1}, 5, 32, True, 0, id="rfft"),
    pytest.param((5, 17, 2), (5, 32, 1), {"onesided": 1, "inverse": 1}, 5, 32, True, 5 * 32, id="irfft"),
]


@pytest.mark.parametrize("x, y, attrs, t, n, real, scaling", DFT_TRAIN)
def test_dft_backward_formula(x, y, attrs, t, n, real, scaling):
    b = direct_backward("DFT", [("x", x)], [y], (True,), 17, axis=1, **attrs)
    assert b.flops == t * (2.5 if real else 5) * n * log2(n) + scaling  # the adjoint transform, same real side
    assert direct_backward("DFT", [("x", x)], [y], (False,), 17, axis=1, **attrs) == flopcount.Cost()


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
    cost = direct_backward("STFT", inputs, [(b_, frames, bins, 2)], (g_signal, False, g_window), 17, values,
                  onesided=int(channels == 1))
    fft = (2.5 if channels == 1 else 5) * n * log2(n)  # once, shared by both gradients
    per_frame = fft + (2 * n * channels if g_signal else 0) + (2 * n * channels if g_window else 0)
    # signal: ·window and overlap-add; window: Σ dframe·x (a multiply and an add per real component)
    assert cost.flops == b_ * frames * per_frame
    no_window = direct_backward("STFT", inputs[:2] + [("", None), ("len", ())], [(b_, frames, bins, 2)],
                       (True, False, False, False), 17, values | {"len": np.array(n)}, onesided=int(channels == 1))
    assert no_window.flops == b_ * frames * (fft + n * channels)  # overlap-add only
