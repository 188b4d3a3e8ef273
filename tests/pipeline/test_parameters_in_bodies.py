"""Weights stored inside If and Loop bodies are parameters, counted once each, like the main graph's.

spox writes silero-vad's ``silero_vad.onnx`` with every weight a ``Constant`` node inside the If branch of its
sample rate (one set of weights per rate); its parameters were reported as 0.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import flopcount

N = helper.make_node
F = TensorProto.FLOAT
W16K = 16 * 8 * 3 * 3  # Conv weight of the then-branch: C_out · C_in · k · k = 1,152
W8K = 4 * 8 * 3 * 3  # Conv weight of the else-branch: 288
W_LOOP = 32 * 40  # MatMul weight inside a Loop body: 1,280, stored once whatever the trip count


def _constant(name: str, dims) -> onnx.NodeProto:
    value = numpy_helper.from_array(np.ones(dims, np.float32), name + "_value")
    return N("Constant", [], [name], value=value)


def _branch(name: str, c_out: int) -> onnx.GraphProto:
    return helper.make_graph(
        [_constant(f"w_{name}", (c_out, 8, 3, 3)), N("Conv", ["x", f"w_{name}"], [f"y_{name}"])],
        name, [], [helper.make_tensor_value_info(f"y_{name}", F, [1, c_out, 6, 6])],
    )


def test_constants_in_both_if_branches_are_parameters():
    graph = helper.make_graph(
        [
            N("Equal", ["sr", "sr16k"], ["is_16k"]),
            N("If", ["is_16k"], ["y"], then_branch=_branch("then", 16), else_branch=_branch("else", 4)),
        ],
        "rates",
        [helper.make_tensor_value_info("x", F, [1, 8, 8, 8]), helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", F, [1, None, 6, 6])],
        [numpy_helper.from_array(np.array(16000, np.int64), "sr16k")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    report = flopcount.count(model, input_values={"sr": 16000})
    assert report.params == W16K + W8K
    assert report.forward.macs == 16 * 6 * 6 * 8 * 3 * 3  # only the branch taken runs: C_out · H · W · C_in · k · k


def test_a_constant_in_a_loop_body_is_counted_once():
    body = helper.make_graph(
        [_constant("w_loop", (32, 40)), N("MatMul", ["h_in", "w_loop"], ["h_wide"]),
         N("Identity", ["cond_in"], ["cond_out"]), N("ReduceSum", ["h_wide"], ["h_sum"], keepdims=0),
         N("Add", ["h_in", "h_sum"], ["h_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F, [2, 32])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), helper.make_tensor_value_info("h_out", F, [2, 32])],
    )
    graph = helper.make_graph(
        [N("Loop", ["trips", "", "h0"], ["h"], body=body)],
        "loop",
        [helper.make_tensor_value_info("h0", F, [2, 32])],
        [helper.make_tensor_value_info("h", F, [2, 32])],
        [numpy_helper.from_array(np.array(3, np.int64), "trips")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    report = flopcount.count(model)
    assert report.params == W_LOOP
    assert report.forward.macs == 3 * 2 * 32 * 40  # trips · M · K · N
