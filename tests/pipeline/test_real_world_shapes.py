"""Shapes and inputs as real exporters write them: -1 dims (Paddle2ONNX), If bodies shaped from the
outer scope (a sample-rate switch with Conv + LSTM in both branches), recurrent states taken
through Slice/Unsqueeze of a state input, and errors that name the input whose value or shape is
missing with placeholders, never made-up sizes. Models are built here with onnx.helper."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.errors import ShapeError

N = helper.make_node
F, I64 = TensorProto.FLOAT, TensorProto.INT64
C_OUT, HID, K = 6, 5, 3  # conv channels (the LSTM's input size), LSTM hidden size, conv kernel


def i64(name, values):
    return numpy_helper.from_array(np.asarray(values, np.int64), name)


def zeros(name, shape):
    return numpy_helper.from_array(np.zeros(shape, np.float32), name)


def model(nodes, inputs, outputs, inits, opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                          [helper.make_tensor_value_info(o, F, None) for o in outputs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


# --- -1 dims ----------------------------------------------------------------------------------------


def paddle_conv():
    """Conv 3→8, 3×3, on an input declared [-1, 3, -1, -1], as Paddle2ONNX writes dynamic dims."""
    return model([N("Conv", ["x", "w"], ["y"])], {"x": (F, [-1, 3, -1, -1])}, ["y"], [zeros("w", (8, 3, 3, 3))])


def test_minus_one_dims_are_fixed_by_input_shape():
    r = flopcount.count(paddle_conv(), input_shapes={"x": (2, 3, 17, 23)})
    assert r.total.flops == 2 * 2 * 8 * 15 * 21 * 3 * 3 * 3  # 2·N·C_out·H_out·W_out·K²·C_in
    assert r.model.inputs[0].shape == (2, 3, 17, 23)


def test_minus_one_dims_left_open_get_placeholders_not_ones():
    with pytest.raises(ShapeError) as e:
        flopcount.count(paddle_conv(), batch=2)
    msg = str(e.value)
    assert "--input-shape x=2x3xD2xD3" in msg and "sizes for the placeholders" in msg
    assert "x=2x3x1x1" not in msg


def test_symbolic_dims_are_named_in_the_suggestion():
    m = model([N("Relu", ["x"], ["y"])], {"x": (F, ["batch", 3, "H", "W"])}, ["y"], [])
    with pytest.raises(ShapeError, match=r"--input-shape x=BATCHx3xHxW"):
        flopcount.count(m)


# --- a value-dependent shape names the input and --input-value ---------------------------------------


def test_shape_from_an_input_value_names_the_input():
    m = model([N("Reshape", ["x", "target"], ["r"]), N("MatMul", ["r", "w"], ["y"])],
              {"x": (F, [6, 20]), "target": (I64, [2])}, ["y"], [zeros("w", (10, 7))])
    with pytest.raises(ShapeError) as e:
        flopcount.count(m)
    assert "input 'target' (int64 2)" in str(e.value) and "--input-value target=" in str(e.value)
    r = flopcount.count(m, input_values={"target": [12, 10]})
    assert r.total.flops == 2 * 12 * 10 * 7


# --- If on a sample rate, Conv + LSTM in both branches, states through Slice/Unsqueeze -------------


def sample_rate_model(state_inside: bool):
    """out = If(sr == 16000): Conv(stride 1) → LSTM, else Conv(stride 2) → LSTM. The input is
    reshaped to [N, 1, L] by a Shape/Gather/Concat subgraph (shaped only after folding); the LSTMs'
    initial_h and initial_c are Unsqueeze(Slice(state)), inside each branch or once outside."""

    def branch(tag, stride):
        nodes = [N("Conv", ["x3", f"w_{tag}"], [f"c_{tag}"], strides=[stride], name=f"conv_{tag}"),
                 N("Transpose", [f"c_{tag}"], [f"t_{tag}"], perm=[2, 0, 1])]
        h0 = "h0"
        if state_inside:
            nodes += [N("Slice", ["state", "s0", "s1", "ax0"], [f"sl_{tag}"]),
                      N("Unsqueeze", [f"sl_{tag}", "ax0"], [f"h0_{tag}"])]
            h0 = f"h0_{tag}"
        nodes.append(N("LSTM", [f"t_{tag}", f"W_{tag}", f"R_{tag}", "", "", h0, h0], [f"y_{tag}"],
                       hidden_size=HID, name=f"lstm_{tag}"))
        return helper.make_graph(nodes, tag, [], [helper.make_tensor_value_info(f"y_{tag}", F, None)])

    nodes = [N("Shape", ["x"], ["xs"]), N("Gather", ["xs", "i0"], ["n"], axis=0),
             N("Concat", ["n", "one", "minus1"], ["target"], axis=0), N("Reshape", ["x", "target"], ["x3"]),
             N("Equal", ["sr", "k16000"], ["cond"])]
    if not state_inside:
        nodes += [N("Slice", ["state", "s0", "s1", "ax0"], ["sl"]), N("Unsqueeze", ["sl", "ax0"], ["h0"])]
    nodes.append(N("If", ["cond"], ["out"], then_branch=branch("then", 1), else_branch=branch("else", 2)))
    inits = [i64("k16000", 16000), i64("s0", [0]), i64("s1", [-1]), i64("ax0", [0]), i64("i0", [0]),
             i64("one", [1]), i64("minus1", [-1])]
    for tag in ("then", "else"):  # weights live in the outer graph, as exporters put them
        inits += [zeros(f"w_{tag}", (C_OUT, 1, K)), zeros(f"W_{tag}", (1, 4 * HID, C_OUT)),
                  zeros(f"R_{tag}", (1, 4 * HID, HID))]
    inputs = {"x": (F, [-1, -1]), "sr": (I64, []), "state": (F, [-1, -1, HID])}
    return model(nodes, inputs, ["out"], inits)


def branch_flops(n, length, stride):
    steps = (length - K) // stride + 1
    conv = 2 * n * C_OUT * steps * K * 1  # 2·N·C_out·L_out·K·C_in
    lstm = 2 * steps * n * 4 * HID * (C_OUT + HID) + 9 * steps * n * HID  # 2·S·B·4H·(I+H) + 9·S·B·H
    return conv + lstm


@pytest.mark.parametrize("state_inside", [pytest.param(True, id="state-in-branch"),
                                          pytest.param(False, id="state-outside")])
@pytest.mark.parametrize("rate, stride", [pytest.param(16000, 1, id="16k-then"),
                                          pytest.param(8000, 2, id="8k-else")])
@pytest.mark.parametrize("state_shape", [pytest.param(True, id="state-shaped"),
                                         pytest.param(False, id="state-open")])
def test_sample_rate_if_counts_the_branch_taken(state_inside, rate, stride, state_shape):
    shapes = {"x": (2, 101)} | ({"state": (3, 2, HID)} if state_shape else {})
    r = flopcount.count(sample_rate_model(state_inside), input_shapes=shapes, input_values={"sr": rate})
    assert r.total.flops == branch_flops(2, 101, stride)
    assert not r.upper_bounds and not r.unsupported
    assert r.params == 2 * (C_OUT * K + 4 * HID * C_OUT + 4 * HID * HID)


def test_sample_rate_if_without_the_rate_is_the_larger_branch_and_says_so():
    r = flopcount.count(sample_rate_model(True), input_shapes={"x": (2, 101), "state": (3, 2, HID)})
    assert r.total.flops == branch_flops(2, 101, 1)
    assert "If" in r.upper_bounds


def test_sample_rate_if_with_an_open_input_names_the_rate_and_the_shape():
    with pytest.raises(ShapeError) as e:
        flopcount.count(sample_rate_model(True))
    msg = str(e.value)
    assert "--input-value sr=VALUE" in msg and "--input-shape x=NxD1" in msg


def test_sample_rate_if_trains_through_the_branch():
    r = flopcount.count(sample_rate_model(False), input_shapes={"x": (2, 101), "state": (3, 2, HID)},
                        input_values={"sr": 16000}, mode="train")
    # the then-branch weights are trained (read from the outer graph); the else-branch ones too, as
    # parameters of the model, though this run does not take their branch
    assert r.trainable_params == 2 * (C_OUT * K + 4 * HID * C_OUT + 4 * HID * HID)
    assert r.backward.flops > 0 and not r.backward_unsupported
