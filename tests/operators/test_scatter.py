"""ScatterElements / ScatterND: |updates| combines with a reduction, else free; Scatter and
TensorScatter are free."""

import pytest
from helpers import model, weight
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
