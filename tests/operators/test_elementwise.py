"""Element-wise ops: one per (broadcast) output element; FLOPs for float inputs, int_ops otherwise."""

import pytest
from helpers import direct_backward, model, node_backward, one_node, single, typed_model, weight
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


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): Shrink, Mod.
#
# Each expected value is a closed form written here from the sizes (distinct odd sizes, so that a
# swapped dimension cannot pass). A tensor needs a gradient when it is a trainable float initializer
# (``weight``) fed to a differentiable input, or computed from one; graph inputs are data and need none.
# Which inputs may get a gradient at all is the schema's say (``onnx.defs.get_schema``), checked in
# ``tests/pipeline/test_schema.py`` before the cases rely on it.
# -----------------------------------------------------------------------------------------------------------------


N = helper.make_node


F, I64 = TensorProto.FLOAT, TensorProto.INT64


XR = (5, 7, 9)


NXR, NYR = 5 * 7 * 9, 5 * 9  # reduced over axis 1, keepdims


def test_shrink():
    assert node_backward(one_node("Shrink", XR, lambd=0.25, bias=0.5), "Shrink").flops == NXR  # masked dY


def mod(a_shape, b_shape, *, a_trainable, b_trainable, opset):
    inputs = {n: (F, s) for n, s, tr in (("a", a_shape, a_trainable), ("b", b_shape, b_trainable)) if not tr}
    inits = [weight(n, s) for n, s, tr in (("a", a_shape, a_trainable), ("b", b_shape, b_trainable)) if tr]
    return typed_model([N("Mod", ["a", "b"], ["y"], fmod=1)], inputs, ["y"], inits, opset)


def test_mod_divisor_is_non_differentiable_from_opset_13():
    m = mod(XR, (7, 1), a_trainable=True, b_trainable=True, opset=13)
    assert flopcount.count(m, mode="train").trainable_params == NXR  # B is not trained
    assert node_backward(m, "Mod").flops == 0  # dA = dY, A not broadcast
    # A broadcast over the batch dim: dA sums dY back, |Y| − |A|
    m = mod((7, 9), XR, a_trainable=True, b_trainable=False, opset=13)
    assert node_backward(m, "Mod").flops == NXR - 7 * 9


def test_mod_divisor_gradient_formula():
    # B[7, 1] broadcast over 5 and 9: dB = dY·(Y − A)/B (3 per element), summed back: |Y| − |B|.
    # Opset 10 leaves B's category unknown and opset 13 calls it NonDifferentiable, which flopcount
    # applies to both: a count never asks for dB, so the formula is called on its own.
    inputs = [("a", XR), ("b", (7, 1))]
    assert direct_backward("Mod", inputs, [XR], (False, True), 10, fmod=1).flops == 3 * NXR + NXR - 7
    assert direct_backward("Mod", inputs, [XR], (True, True), 10, fmod=1).flops == 3 * NXR + NXR - 7 + 0
    m = mod(XR, (7, 1), a_trainable=True, b_trainable=True, opset=10)
    assert flopcount.count(m, mode="train").trainable_params == NXR
