"""Det (Gaussian elimination + pivot product), CumSum/CumProd, Range, and the free Trilu, OneHot,
BitCast, ImageDecoder and Optional operators."""

import numpy as np
import pytest
from helpers import const, model, node_backward, one_node, single
from onnx import TensorProto, helper

import flopcount


def _elimination(m):
    """Gaussian elimination on an m × m matrix, column by column: j = m − k rows below the pivot
    need j divisions and j² multiply-subtracts (2j² FLOPs); then m − 1 multiplies of the pivots."""
    return sum(j + 2 * j * j for j in range(1, m)) + (m - 1)


@pytest.mark.parametrize(
    "x, matrices, m",
    [
        pytest.param((5, 7, 7), 5, 7, id="batch5-7x7"),
        pytest.param((3, 2, 2), 3, 2, id="batch3-2x2"),
        pytest.param((11, 11), 1, 11, id="single-11x11"),
    ],
)
def test_det(x, matrices, m):
    assert flopcount.count(single("Det", {"x": x}, opset=22)).total.flops == matrices * _elimination(m)


def test_det_leading_term_is_two_thirds_n_cubed():
    # the closed form M(M − 1)/2 + M(M − 1)(2M − 1)/3 + M − 1 for M = 31
    m = 31
    assert _elimination(m) == m * (m - 1) // 2 + m * (m - 1) * (2 * m - 1) // 3 + m - 1
    assert abs(_elimination(m) / (2 * m**3 / 3) - 1) < 0.1


CUMULATIVE = [
    # id: X (7, 11, 13), axis (None: computed at run time), exclusive, expected ops (derived here)
    pytest.param(1, 0, 7 * 13 * (11 - 1), id="axis1"),
    pytest.param(-1, 0, 7 * 11 * (13 - 1), id="last-axis"),
    pytest.param(1, 1, 7 * 13 * (11 - 2), id="axis1-exclusive"),
    pytest.param(None, 0, 7 * 11 * (13 - 1), id="runtime-axis-takes-longest"),
]


@pytest.mark.parametrize("op, opset", [("CumSum", 14), ("CumProd", 26)])
@pytest.mark.parametrize("axis, exclusive, ops", CUMULATIVE)
def test_cumulative(op, opset, axis, exclusive, ops):
    node = helper.make_node(op, ["x", "axis"], ["y"], exclusive=exclusive)
    inits = [const("axis", axis)] if axis is not None else []
    m = model([node], {"x": (7, 11, 13)}, ["y"], inits, opset=opset)
    if axis is None:
        m.graph.input.append(helper.make_tensor_value_info("axis", TensorProto.INT64, []))
    assert flopcount.count(m).total.flops == ops


def test_cumsum_integer_counts_int_ops():
    m = single("CumSum", {"x": (7, 11)}, [const("axis", 0)], opset=14, dtype=TensorProto.INT32)
    r = flopcount.count(m).total
    assert (r.flops, r.int_ops) == (0, 11 * (7 - 1))


@pytest.mark.parametrize(
    "start, limit, delta, dtype, n",
    [
        pytest.param(2.0, 31.0, 3.0, np.float32, 10, id="float"),  # ⌈(31 − 2)/3⌉ = 10
        pytest.param(3, 50, 4, np.int64, 12, id="int"),  # ⌈(50 − 3)/4⌉ = 12
    ],
)
def test_range(start, limit, delta, dtype, n):
    inits = [const("start", start, dtype), const("limit", limit, dtype), const("delta", delta, dtype)]
    r = flopcount.count(single("Range", {}, inits, opset=11)).total
    assert (r.flops, r.int_ops) == ((n, 0) if dtype is np.float32 else (0, n))


FREE = [
    # id: op, node inputs, graph inputs, initializers, input dtype, opset, attrs
    pytest.param("Trilu", ["x"], {"x": (7, 11)}, [], TensorProto.FLOAT, 14, {}, id="trilu"),
    pytest.param("OneHot", ["i", "depth", "values"], {"i": (7,)},
                 [const("depth", 11), const("values", [0.0, 1.0], np.float32)], TensorProto.INT64, 11, {}, id="onehot"),
    pytest.param("BitCast", ["x"], {"x": (7, 11)}, [], TensorProto.FLOAT, 26, {"to": TensorProto.INT32}, id="bitcast"),
    pytest.param("ImageDecoder", ["x"], {"x": (1013,)}, [], TensorProto.UINT8, 20, {}, id="image-decoder"),
    pytest.param("OptionalHasElement", ["x"], {"x": (7,)}, [], TensorProto.FLOAT, 18, {}, id="optional-has-element"),
]


@pytest.mark.parametrize("op, names, inputs, inits, dtype, opset, attrs", FREE)
def test_free_ops(op, names, inputs, inits, dtype, opset, attrs):
    node = helper.make_node(op, names, ["y"], **attrs)
    (n,) = flopcount.count(model([node], inputs, ["y"], inits, opset=opset, dtype=dtype)).nodes
    assert (n.status, n.cost.flops) == ("zero-cost", 0)


def test_optional_wrap_and_unwrap_are_free():
    nodes = [helper.make_node("Optional", ["x"], ["o"]), helper.make_node("OptionalGetElement", ["o"], ["y"])]
    r = flopcount.count(model(nodes, {"x": (7, 11)}, ["y"], opset=18))
    assert [n.status for n in r.nodes] == ["zero-cost", "zero-cost"]


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): CumSum, CumProd, Det.
#
# Each expected value is a closed form written here from the sizes (distinct odd sizes, so that a
# swapped dimension cannot pass). A tensor needs a gradient when it is a trainable float initializer
# (``weight``) fed to a differentiable input, or computed from one; graph inputs are data and need none.
# Which inputs may get a gradient at all is the schema's say (``onnx.defs.get_schema``), checked in
# ``tests/pipeline/test_schema.py`` before the cases rely on it.
# -----------------------------------------------------------------------------------------------------------------


XR = (5, 7, 9)


NXR, NYR = 5 * 7 * 9, 5 * 9  # reduced over axis 1, keepdims


@pytest.mark.parametrize("op_type, opset, attrs, flops", [
    # 5·9 = 45 lines of L = 7 along axis 1: the reverse running sum, L − 1 adds per line
    pytest.param("CumSum", 18, {}, 45 * 6, id="cumsum"),
    pytest.param("CumSum", 18, {"exclusive": 1, "reverse": 1}, 45 * 5, id="cumsum-exclusive-reverse"),
    # revcumsum(dY·Y)/X: 2 per element and the running sum
    pytest.param("CumProd", 26, {}, 2 * NXR + 45 * 6, id="cumprod"),
    pytest.param("CumProd", 26, {"exclusive": 1}, 2 * NXR + 45 * 5, id="cumprod-exclusive"),
])  # fmt: skip
def test_cumulative_train(op_type, opset, attrs, flops):
    m = one_node(op_type, XR, extra_inits=[const("axis", 1)], opset=opset, **attrs)
    assert node_backward(m, op_type).flops == flops


@pytest.mark.parametrize("shape, flops", [
    # B = 3·5 matrices of M = 7: dY·det (1), M right-hand sides through L and U (2M² − M each)
    pytest.param((3, 5, 7, 7), 15 * (2 * 7**3 - 7**2 + 1), id="batched-7x7"),
    pytest.param((9, 9), 2 * 9**3 - 9**2 + 1, id="single-9x9"),
])  # fmt: skip
def test_det_train(shape, flops):
    assert node_backward(one_node("Det", shape), "Det").flops == flops
    assert node_backward(one_node("Det", shape, trainable=False), "Det") == flopcount.Cost()
