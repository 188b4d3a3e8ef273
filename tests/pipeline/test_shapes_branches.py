"""Branches decided from what is known: an If nested in the branch a known condition takes is decided too, and
a scalar input that picks a branch may be given its shape beside its value (silero-vad's ``sr``).

An If nested in a taken branch:

PyTorch exports an LSTM with a rank test (``Size(Shape(x)) == 2``: an unbatched input gets a batch axis)
whose two branches give outputs of different ranks; silero-vad's ``silero_vad_half.onnx`` holds that test
inside the branch an outer If takes. ONNX cannot merge the two ranks, so the LSTM's input had no shape and the
valid model was refused. Here the same structure in small: the inner condition is computed from the input's
shape, which is known, and the product after it is counted exactly.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount

N = helper.make_node
F = TensorProto.FLOAT
SEQ, FEATURES, OUT = 5, 16, 32
MACS = 1 * SEQ * FEATURES * OUT  # [1, 5, 16] · [16, 32]: batch · M · K · N = 2,560


def _const(name, value, dtype=np.int64):
    return N("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype=dtype), name + "_v"))


def _nested(outer_cond: bool) -> onnx.ModelProto:
    """x[5, 16]: an outer If (condition a constant) whose then-branch adds a batch axis when x has rank 2 (an
    inner If, condition from x's shape), then multiplies by W[16, 32]."""
    unbatched = helper.make_graph(
        [_const("axis0", [0]), N("Unsqueeze", ["x", "axis0"], ["x3"])], "unbatched", [],
        [helper.make_tensor_value_info("x3", F, [1, SEQ, FEATURES])],
    )
    batched = helper.make_graph(
        [N("Identity", ["x"], ["x_same"])], "batched", [], [helper.make_tensor_value_info("x_same", F, [SEQ, FEATURES])],
    )
    then_branch = helper.make_graph(
        [
            N("Shape", ["x"], ["shape"]),
            N("Size", ["shape"], ["rank"]),
            _const("two", 2),
            N("Equal", ["rank", "two"], ["is_2d"]),
            N("If", ["is_2d"], ["x_batched"], then_branch=unbatched, else_branch=batched),
            N("MatMul", ["x_batched", "w"], ["y_then"]),
        ],
        "then", [], [helper.make_tensor_value_info("y_then", F, [1, SEQ, OUT])],
    )
    else_branch = helper.make_graph(
        [_const("axis0_else", [0]), N("Unsqueeze", ["x", "axis0_else"], ["y_else"])], "else", [],
        [helper.make_tensor_value_info("y_else", F, [1, SEQ, FEATURES])],
    )
    graph = helper.make_graph(
        [
            _const("cond", outer_cond, np.bool_),
            N("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch, name="outer"),
        ],
        "nested_if",
        [helper.make_tensor_value_info("x", F, [SEQ, FEATURES])],
        [helper.make_tensor_value_info("y", F, [1, SEQ, "n"])],
        [numpy_helper.from_array(np.ones((FEATURES, OUT), np.float32), "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


def test_if_nested_in_a_taken_branch_is_decided():
    report = flopcount.count(_nested(True))
    (outer,) = [n for n in report.nodes if n.name == "outer"]
    assert outer.cost.macs == MACS
    assert not outer.bound  # both conditions known: exact, not an upper bound
    assert report.forward.macs == MACS


def test_the_branch_not_taken_is_not_counted():
    report = flopcount.count(_nested(False))
    assert report.forward.macs == 0  # the else branch only adds an axis to x


def test_onnxruntime_agrees_on_the_shape():
    ort = pytest.importorskip("onnxruntime")
    session = ort.InferenceSession(_nested(True).SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.zeros((SEQ, FEATURES), np.float32)})
    assert y.shape == (1, SEQ, OUT)


def _rate_model() -> onnx.ModelProto:
    """silero-vad's pattern in small: a scalar int64 rate ``sr`` picks the branch; x[5, 16] · W[16, 32] if 16 kHz."""
    then_branch = helper.make_graph([N("MatMul", ["x", "w"], ["y16"])], "then", [],
                                    [helper.make_tensor_value_info("y16", F, [SEQ, OUT])])
    else_branch = helper.make_graph([N("Identity", ["x"], ["y8"])], "else", [],
                                    [helper.make_tensor_value_info("y8", F, [SEQ, FEATURES])])
    graph = helper.make_graph(
        [_const("rate16k", 16000), N("Equal", ["sr", "rate16k"], ["is16k"]),
         N("If", ["is16k"], ["y"], then_branch=then_branch, else_branch=else_branch)],
        "rate",
        [helper.make_tensor_value_info("x", F, [SEQ, FEATURES]), helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", F, [SEQ, None])],
        [numpy_helper.from_array(np.ones((FEATURES, OUT), np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_scalar_input_may_be_given_its_shape_and_its_value():
    """The package feeds x and the scalar sr: naming sr's shape () beside its value is not an error."""
    report = flopcount.count(_rate_model(), input_shapes={"x": (SEQ, FEATURES), "sr": ()}, input_values={"sr": 16000})
    assert report.forward.macs == SEQ * FEATURES * OUT  # M · K · N = 2,560


def test_a_shape_that_contradicts_the_value_is_refused():
    with pytest.raises(flopcount.UsageError, match=r"input 'sr' is given the shape \[1\] and a value of shape \[\]"):
        flopcount.count(_rate_model(), input_shapes={"sr": (1,)}, input_values={"sr": 16000})
