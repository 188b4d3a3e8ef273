"""Element-wise ops: one per (broadcast) output element; FLOPs for float inputs, int_ops otherwise."""

import pytest
from helpers import model, single
from onnx import TensorProto, helper

import flopcount


@pytest.mark.parametrize(
    "op, inputs, out_elems",
    [
        pytest.param("Add", {"a": (3, 1, 7), "b": (5, 1)}, 3 * 5 * 7, id="add-broadcast"),
        pytest.param("Mul", {"a": (11, 13), "b": (11, 13)}, 143, id="mul"),
        pytest.param("Div", {"a": (2, 9), "b": ()}, 18, id="div-scalar"),
        pytest.param("Relu", {"x": (2, 3, 5, 7)}, 210, id="relu"),
        pytest.param("Sigmoid", {"x": (17,)}, 17, id="sigmoid"),
        pytest.param("Pow", {"a": (4, 6), "b": (1,)}, 24, id="pow"),
    ],
)
def test_one_flop_per_output_element(op, inputs, out_elems):
    r = flopcount.count(single(op, inputs))
    assert r.total.flops == out_elems
    assert r.total.int_ops == 0


@pytest.mark.parametrize("op, trans_per_elem", [("Exp", 1), ("Tanh", 1), ("Erf", 1), ("Relu", 0), ("Softplus", 2)])
def test_transcendentals_reported_apart(op, trans_per_elem):
    r = flopcount.count(single(op, {"x": (3, 7)}))
    assert (r.total.flops, r.total.transcendentals) == (21, 21 * trans_per_elem)


def test_integer_arithmetic_is_not_flops():
    r = flopcount.count(single("Add", {"a": (5, 7), "b": (5, 7)}, dtype=TensorProto.INT64))
    assert (r.total.flops, r.total.int_ops) == (0, 35)


@pytest.mark.parametrize("op, k, per_elem", [("Sum", 3, 2), ("Max", 4, 3), ("Min", 2, 1), ("Sum", 1, 0), ("Mean", 3, 3)])
def test_variadic(op, k, per_elem):
    names = {f"x{i}": (5, 7) for i in range(k)}
    r = flopcount.count(single(op, names))
    assert r.total.flops == per_elem * 35


def test_dropout_free_at_inference_counted_in_training_mode():
    from helpers import const

    inf = single("Dropout", {"x": (4, 9)}, n_outputs=1)
    assert flopcount.count(inf).total.flops == 0
    train = single("Dropout", {"x": (4, 9), "": None}, [const("mode", True, dtype=bool)], opset=13, n_outputs=1)
    # inputs: x, omitted ratio, training_mode = true
    assert flopcount.count(train).total.flops == 36


def test_layout_ops_are_explicitly_zero_cost():
    n = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]), helper.make_node("Identity", ["t"], ["y"])]
    r = flopcount.count(model(n, {"x": (3, 4)}, ["y"]))
    assert r.total.flops == 0
    assert not r.unsupported
    assert {s.status for s in r.by_op_type.values()} == {"zero-cost"}
