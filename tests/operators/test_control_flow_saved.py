"""Saved-for-backward rules of control flow (operators/control_flow.py): a Loop, a Scan and an If whose bodies
are a MatMul with a weight and a Relu, against the same bodies unrolled into a flat graph. Both graphs are built
here with onnx.helper, independently of each other; the flat one is counted by the ordinary rules (MatMul keeps x
for dW, Relu keeps Y), so it is a derivation of what the loop keeps that does not use the control-flow rules. The
closed forms are written out too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
import flopcount.operators  # noqa: F401  (fills the registry)
from flopcount.memory.ledger import MemorySettings

B, N = 5, 7
F32 = 4
W = numpy_helper.from_array(np.ones((N, N), np.float32), "W")


def ledger(m: onnx.ModelProto):
    report = flopcount.count(m, mode="train", memory=MemorySettings(device="cpu"))
    return report.memory


def model(nodes, inits=(), extra_inputs=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, N]), *extra_inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, N])], [W, *inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def unrolled(steps: int) -> onnx.ModelProto:
    nodes, prev = [], "x"
    for t in range(steps):
        out = "y" if t == steps - 1 else f"r{t}"
        nodes += [helper.make_node("MatMul", [prev, "W"], [f"h{t}"]), helper.make_node("Relu", [f"h{t}"], [out])]
        prev = out
    return model(nodes)


def loop(steps: int) -> onnx.ModelProto:
    body = helper.make_graph(
        [helper.make_node("MatMul", ["x_in", "W"], ["h"]), helper.make_node("Relu", ["h"], ["x_out"]),
         helper.make_node("Identity", ["c_in"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [B, N])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [B, N])])
    inits = [numpy_helper.from_array(np.array(steps, np.int64), "M"), numpy_helper.from_array(np.array(True), "cond")]
    return model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)], inits)


@pytest.mark.parametrize("steps", [1, 3, 4])
def test_loop_keeps_what_its_iterations_unrolled_keep(steps):
    looped, flat = ledger(loop(steps)), ledger(unrolled(steps))
    # x for the first dW, then each iteration's Relu output (the next one's x, kept once)
    assert looped.ranks[0].activations_bytes == flat.ranks[0].activations_bytes == F32 * B * N * (1 + steps)
    assert not looped.missing


def test_if_keeps_the_branch_taken_or_the_larger():
    def branch(name: str, relus: int):
        nodes = [helper.make_node("MatMul", ["x", "W"], [f"{name}0"])]
        nodes += [helper.make_node("Relu", [f"{name}{k}"], [f"{name}{k + 1}"]) for k in range(relus)]
        return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(f"{name}{relus}", TensorProto.FLOAT,
                                                                                  [B, N])])

    def with_cond(cond):
        return model([helper.make_node("If", ["c"], ["y"], then_branch=branch("t", 1), else_branch=branch("e", 3))],
                     inits=[numpy_helper.from_array(np.array(cond), "c")] if cond is not None else (),
                     extra_inputs=[helper.make_tensor_value_info("c", TensorProto.BOOL, [])] if cond is None else ())

    # x (the graph's input, kept for dW) and each Relu's output
    assert ledger(with_cond(True)).ranks[0].activations_bytes == F32 * B * N * (1 + 1)
    assert ledger(with_cond(False)).ranks[0].activations_bytes == F32 * B * N * (1 + 3)
    assert ledger(with_cond(None)).ranks[0].activations_bytes == F32 * B * N * (1 + 3)  # the larger: an upper bound


def test_scan_keeps_each_step_as_the_unrolled_steps():
    steps = 3
    body = helper.make_graph(
        [helper.make_node("MatMul", ["s_in", "W"], ["h"]), helper.make_node("Relu", ["h"], ["s_out"]),
         helper.make_node("Add", ["s_out", "u"], ["o"])], "body",
        [helper.make_tensor_value_info("s_in", TensorProto.FLOAT, [B, N]),
         helper.make_tensor_value_info("u", TensorProto.FLOAT, [B, N])],
        [helper.make_tensor_value_info("s_out", TensorProto.FLOAT, [B, N]),
         helper.make_tensor_value_info("o", TensorProto.FLOAT, [B, N])])
    g = helper.make_graph(
        [helper.make_node("Scan", ["x", "us"], ["y", "os"], body=body, num_scan_inputs=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, N]),
         helper.make_tensor_value_info("us", TensorProto.FLOAT, [steps, B, N])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, N]),
         helper.make_tensor_value_info("os", TensorProto.FLOAT, [steps, B, N])], [W])
    scanned = ledger(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    # the state x, then each step's Relu output (the next step's state); Add keeps nothing
    assert scanned.ranks[0].activations_bytes == F32 * B * N * (1 + steps) == \
        ledger(unrolled(steps)).ranks[0].activations_bytes


def test_sequence_map_keeps_each_element_run():
    n = 3
    body = helper.make_graph(
        [helper.make_node("MatMul", ["e", "W"], ["h"]), helper.make_node("Relu", ["h"], ["o"])], "body",
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [B, N])],
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [B, N])])
    nodes = [helper.make_node("Add", ["x", "shift"], ["xs"]),
             helper.make_node("SequenceConstruct", ["xs", "xs", "xs"], ["seq"]),
             helper.make_node("SequenceMap", ["seq"], ["outs"], name="map", body=body),
             helper.make_node("ConcatFromSequence", ["outs"], ["y"], axis=0)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, N])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n * B, N])],
                          [W, numpy_helper.from_array(np.zeros((B, N), np.float32), "shift")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    report = flopcount.count(m, mode="train", memory=MemorySettings(device="cpu"), loop_trips={"map": n})
    assert not report.memory.missing
    # each element's Relu output (n runs), and the elements the MatMul keeps for dW: the SequenceMap's input,
    # which the ledger sizes as one element (shape inference gives a sequence its element's type and shape); here
    # the n elements are the one tensor xs
    assert report.memory.ranks[0].activations_bytes == F32 * B * N * (n + 1)


def test_a_loop_in_a_loop_keeps_what_the_unrolled_steps_keep():
    outer_steps, inner_steps = 2, 3
    inner = loop(inner_steps).graph.node[0]
    inner.input[:] = ["M", "", "x_in"]
    inner.output[:] = ["x_out"]
    body = helper.make_graph(
        [inner, helper.make_node("Identity", ["c_in"], ["c_out"])], "outer_body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [B, N])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [B, N])])
    inits = [numpy_helper.from_array(np.array(inner_steps, np.int64), "M"),
             numpy_helper.from_array(np.array(outer_steps, np.int64), "M_outer")]
    nested = model([helper.make_node("Loop", ["M_outer", "", "x"], ["y"], body=body)], inits)
    steps = outer_steps * inner_steps
    assert ledger(nested).ranks[0].activations_bytes == ledger(unrolled(steps)).ranks[0].activations_bytes == \
        F32 * B * N * (1 + steps)


def test_a_body_tensor_of_unknown_size_is_named(monkeypatch):
    """A tensor a Loop's body keeps whose size is unknown counts 0 bytes and is named in ``unsized_tensors``, the
    activations a stated lower bound. A count refuses a body whose shapes it cannot infer before memory is reached,
    so the body's Relu output (``x_out``, kept by the Relu's backward) is made shapeless where the body's kept
    tensors are sized (:func:`flopcount.memory.bodies.body_saved`), the rest of the count unchanged."""
    from flopcount.context import TensorInfo
    from flopcount.memory import bodies

    real = bodies.body_saved

    def shapeless(g, run, tensors, stored, where):
        return real(g, run, {**tensors, "x_out": TensorInfo("x_out")}, stored, where)

    monkeypatch.setattr(bodies, "body_saved", shapeless)
    steps = 3
    mem = ledger(loop(steps))
    assert mem.unsized == ("x_out",)
    assert mem.lower_bound and mem.as_dict()["unsized_tensors"] == ["x_out"]
    # the Relu outputs of the 3 iterations are not counted: less than x and 3 of them, as a whole size gives
    assert mem.ranks[0].activations_bytes < F32 * B * N * (1 + steps)
