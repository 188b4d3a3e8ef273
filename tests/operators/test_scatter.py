"""ScatterElements / ScatterND: |updates| combines with a reduction, else free; Scatter and
TensorScatter are free."""

import pytest
from helpers import const, model, node_backward, typed_model, weight
from onnx import TensorProto, helper

import flopcount


def scatter(op, data, indices, updates, dtype=TensorProto.FLOAT, opset=18, **attrs):
    node = helper.make_node(op, ["data", "indices", "updates"], ["y"], **attrs)
    m = model([node], {"data": data, "updates": updates}, ["y"], [weight("indices", indices, TensorProto.INT64)],
              opset=opset, dtype=dtype)
    return flopcount.count(m)


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_elements_reduction(reduction):
    r = scatter("ScatterElements", (7, 11), (5, 3), (5, 3), axis=1, reduction=reduction)
    assert r.total.flops == 5 * 3


@pytest.mark.parametrize("reduction", ["add", "mul", "max", "min"])
def test_scatter_nd_reduction(reduction):
    # indices [3, 1] pick 3 rows of data [7, 11, 13]; updates [3, 11, 13]
    r = scatter("ScatterND", (7, 11, 13), (3, 1), (3, 11, 13), reduction=reduction)
    assert r.total.flops == 3 * 11 * 13


@pytest.mark.parametrize(
    "op, data, indices, updates",
    [
        pytest.param("ScatterElements", (7, 11), (5, 3), (5, 3), id="elements"),
        pytest.param("ScatterND", (7, 11, 13), (3, 1), (3, 11, 13), id="nd"),
    ],
)
def test_scatter_without_reduction_is_free(op, data, indices, updates):
    assert scatter(op, data, indices, updates).total.flops == 0


def test_integer_reduction_counts_int_ops():
    r = scatter("ScatterND", (7, 11), (3, 1), (3, 11), dtype=TensorProto.INT32, reduction="add")
    assert (r.total.flops, r.total.int_ops) == (0, 3 * 11)


def test_deprecated_scatter_is_free():
    (node,) = scatter("Scatter", (7, 11), (5, 3), (5, 3), opset=10, axis=1).nodes
    assert node.status == "zero-cost"


def test_tensor_scatter_is_free():
    node = helper.make_node("TensorScatter", ["past", "update"], ["present"], axis=2)
    m = model([node], {"past": (2, 3, 64, 5), "update": (2, 3, 7, 5)}, ["present"], opset=24)
    (n,) = flopcount.count(m).nodes
    assert (n.status, n.cost.flops) == ("zero-cost", 0)


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): ScatterElements, ScatterND.
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


def scatter_train(op_type, reduction, data_trainable, updates_trainable):
    if op_type == "ScatterElements":  # updates [5, 3, 9] along axis 1 of data [5, 7, 9]
        idx, upd, attrs = const("idx", [[[0] * 9, [2] * 9, [6] * 9]] * 5), (5, 3, 9), {"axis": 1}
    else:  # ScatterND: 3 index pairs into data [5, 7, 9], each writing a row of 9
        idx, upd, attrs = const("idx", [[0, 1], [4, 6], [2, 3]]), (3, 9), {}
    inputs = {n: (F, s) for n, s, tr in (("data", XR, data_trainable), ("upd", upd, updates_trainable)) if not tr}
    inits = [weight(n, s) for n, s, tr in (("data", XR, data_trainable), ("upd", upd, updates_trainable)) if tr]
    node = N(op_type, ["data", "idx", "upd"], ["y"], reduction=reduction, **attrs)
    return typed_model([node], inputs, ["y"], [*inits, idx], opset=18)


@pytest.mark.parametrize("op_type, u", [("ScatterElements", 5 * 3 * 9), ("ScatterND", 3 * 9)])
@pytest.mark.parametrize("reduction, data, updates, per_update", [
    pytest.param("none", True, True, 0, id="none"),  # zeroed dY, gathered dY: moves
    pytest.param("add", True, True, 0, id="add"),  # dY, gathered dY: moves
    pytest.param("mul", True, True, 1 + 2, id="mul"),  # dY·Π updates; dY·Y/update
    pytest.param("mul", True, False, 1, id="mul-data-only"),
    pytest.param("max", True, True, 1 + 1, id="max"),  # one comparison with Y per update, each side
    pytest.param("min", False, True, 1, id="min-updates-only"),
])  # fmt: skip
def test_scatter(op_type, u, reduction, data, updates, per_update):
    assert node_backward(scatter_train(op_type, reduction, data, updates), op_type).flops == per_update * u
