"""Pooling (K per output element; Table 3: Cin·H·W of the input) and normalization (one per element)."""

from math import ceil, floor

import pytest
from helpers import const, node_backward, one_node, single, weight

import flopcount

POOL = [
    # id: op, input, attrs, expected output spatial (derived here), K
    pytest.param("MaxPool", (2, 5, 17, 19), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
                 (floor((17 + 2 - 3) / 2) + 1, floor((19 + 2 - 3) / 2) + 1), 9, id="maxpool-3x3-s2"),
    pytest.param("AveragePool", (1, 3, 23, 29), {"kernel_shape": [2, 3]}, (22, 27), 6, id="avgpool-2x3"),
    pytest.param("AveragePool", (1, 3, 23, 29), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1},
                 (ceil((23 - 3) / 2) + 1, ceil((29 - 3) / 2) + 1), 9, id="avgpool-ceil"),
    pytest.param("MaxPool", (2, 7, 31), {"kernel_shape": [5], "strides": [3]}, (floor((31 - 5) / 3) + 1,), 5, id="maxpool1d"),
    pytest.param("LpPool", (1, 2, 9, 9), {"kernel_shape": [3, 3]}, (7, 7), 9, id="lppool"),
]


@pytest.mark.parametrize("op, x, attrs, out, k", POOL)
def test_pooling(op, x, attrs, out, k):
    m = single(op, {"x": x}, **attrs)
    y = x[0] * x[1]
    for d in out:
        y *= d
    r = flopcount.count(m)
    assert r.total.flops == k * y
    assert r.total.macs == 0
    if op == "LpPool":
        assert r.total.transcendentals == (k + 1) * y
    x_elems = 1
    for d in x:
        x_elems *= d
    assert flopcount.count(m, convention="table3").total.flops == x_elems


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool(op):
    r = flopcount.count(single(op, {"x": (3, 5, 7, 11)}))
    assert r.total.flops == 3 * 5 * 7 * 11


NORM = [
    # id: op, X shape, initializers, attrs, expected transcendentals
    pytest.param("BatchNormalization", (2, 5, 7, 9), ["s", "b", "m", "v"], {}, 5, id="batchnorm"),
    pytest.param("InstanceNormalization", (2, 5, 7, 9), ["s", "b"], {}, 2 * 5, id="instancenorm"),
    pytest.param("LayerNormalization", (3, 7, 11), ["s", "b"], {"axis": -1}, 3 * 7, id="layernorm-last"),
    pytest.param("LayerNormalization", (3, 7, 11), ["s", "b"], {"axis": 1}, 3, id="layernorm-axis1"),
    pytest.param("GroupNormalization", (2, 6, 7, 9), ["s", "b"], {"num_groups": 3}, 2 * 3, id="groupnorm"),
    pytest.param("LRN", (2, 5, 7, 9), [], {"size": 3}, 2 * 5 * 7 * 9, id="lrn"),
]


@pytest.mark.parametrize("op, x, params, attrs, trans", NORM)
def test_normalization(op, x, params, attrs, trans):
    if op == "GroupNormalization":
        pshape = (x[1],)
    elif op == "LayerNormalization":
        pshape = x[attrs["axis"]:]
    else:
        pshape = (x[1],)
    m = single(op, {"x": x}, [weight(p, pshape) for p in params], opset=21, **attrs)
    r = flopcount.count(m)
    elems = 1
    for d in x:
        elems *= d
    assert r.total.flops == elems  # Table 3: Cin·H·W per element
    assert r.total.transcendentals == trans
    assert flopcount.count(m, convention="table3").total.flops == elems


REDUCE = [
    # id: op, attrs, extra FLOPs beyond |X| − |Y| as a function of (|X|, |Y|), transcendentals
    pytest.param("ReduceSum", lambda x, y: 0, lambda x, y: 0, id="sum"),
    pytest.param("ReduceMean", lambda x, y: y, lambda x, y: 0, id="mean"),
    pytest.param("ReduceMax", lambda x, y: 0, lambda x, y: 0, id="max"),
    pytest.param("ReduceL2", lambda x, y: x + y, lambda x, y: y, id="l2"),
    pytest.param("ReduceLogSumExp", lambda x, y: x + y, lambda x, y: x + y, id="logsumexp"),
    pytest.param("ReduceSumSquare", lambda x, y: x, lambda x, y: 0, id="sumsquare"),
]


@pytest.mark.parametrize("op, extra, trans", REDUCE)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions(op, extra, trans, keepdims):
    from helpers import const

    # X [3, 5, 7] reduced over axes (1, 2) → |Y| = 3; |X| = 105
    m = single(op, {"x": (3, 5, 7)}, [const("axes", [1, 2])], keepdims=keepdims)
    r = flopcount.count(m)
    assert r.total.flops == 105 - 3 + extra(105, 3)
    assert r.total.transcendentals == trans(105, 3)


def test_argmax():
    r = flopcount.count(single("ArgMax", {"x": (4, 9)}, axis=1))
    assert r.total.flops == 36 - 4


# --- RMSNormalization, MeanVarianceNormalization, LpNormalization -------------------------------
# Same convention as the other normalization ops: one FLOP per element of X (Table 3, Cin·H·W),
# plus one transcendental (a square root) per statistic normalized by.

MORE_NORM = [
    # id: op, opset, X shape, initializer shapes, attrs, expected transcendentals (derived here)
    pytest.param("RMSNormalization", 23, (3, 5, 7), [(7,)], {}, 3 * 5, id="rmsnorm-default-last-axis"),
    pytest.param("RMSNormalization", 23, (3, 5, 7), [(5, 7)], {"axis": 1}, 3, id="rmsnorm-axis1"),
    pytest.param("RMSNormalization", 23, (3, 5, 7), [(5, 7)], {"axis": -2}, 3, id="rmsnorm-axis-neg2"),
    pytest.param("MeanVarianceNormalization", 13, (3, 5, 7, 9), [], {}, 5, id="mvn-default-axes-0-2-3"),
    pytest.param("MeanVarianceNormalization", 13, (3, 5, 7, 9), [], {"axes": [2, 3]}, 3 * 5, id="mvn-axes-2-3"),
    pytest.param("MeanVarianceNormalization", 13, (3, 5, 7), [], {"axes": [-1]}, 3 * 5, id="mvn-negative-axis"),
    pytest.param("LpNormalization", 22, (3, 5, 7), [], {}, 3 * 5, id="lpnorm-p2-last-axis"),
    pytest.param("LpNormalization", 22, (3, 5, 7), [], {"axis": 1}, 3 * 7, id="lpnorm-p2-axis1"),
    pytest.param("LpNormalization", 22, (3, 5, 7), [], {"p": 1}, 0, id="lpnorm-p1-no-sqrt"),
]


@pytest.mark.parametrize("op, opset, x, params, attrs, trans", MORE_NORM)
def test_more_normalization(op, opset, x, params, attrs, trans):
    m = single(op, {"x": x}, [weight(f"w{i}", s) for i, s in enumerate(params)], opset=opset, **attrs)
    elems = 1
    for d in x:
        elems *= d
    r = flopcount.count(m).total
    assert (r.flops, r.macs, r.transcendentals) == (elems, 0, trans)
    assert flopcount.count(m, convention="table3").total.flops == elems


def test_reduction_of_an_empty_tensor_costs_nothing():
    from helpers import const

    m = single("ReduceSum", {"x": (2, 0, 4)}, [const("axes", [1])], keepdims=1)
    assert flopcount.count(m).total.flops == 0


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): normalization and reductions (and data-fed Shrink and Hardmax, which need no gradient either).
#
# Each expected value is a closed form written here from the sizes (distinct odd sizes, so that a
# swapped dimension cannot pass). A tensor needs a gradient when it is a trainable float initializer
# (``weight``) fed to a differentiable input, or computed from one; graph inputs are data and need none.
# Which inputs may get a gradient at all is the schema's say (``onnx.defs.get_schema``), checked in
# ``tests/core/test_schema.py`` before the cases rely on it.
# -----------------------------------------------------------------------------------------------------------------


X4 = (3, 7, 5, 9)  # N, C, H, W


NX4 = 3 * 7 * 5 * 9  # 945


@pytest.mark.parametrize("size", [3, 5])
def test_lrn(size):
    # per element: dY·Y/s (2), the window sum (size − 1), × 2αβ/size and × X (2), dY/s^β (1), subtraction (1)
    back = node_backward(one_node("LRN", X4, size=size, alpha=0.001), "LRN")
    assert (back.flops, back.transcendentals) == ((size + 5) * NX4, 0)


@pytest.mark.parametrize("axes", [None, [1]], ids=["default-axes", "axes-1"])
def test_mean_variance_normalization(axes):
    # Σ dY and Σ dY·Y per statistic (3 per element), per element Y·b, 2 subtractions, × 1/σ (4)
    attrs = {"axes": axes} if axes else {}
    assert node_backward(one_node("MeanVarianceNormalization", X4, **attrs), "MeanVarianceNormalization").flops == 7 * NX4


@pytest.mark.parametrize("axis, p, flops", [
    # V = 3·5·9 vectors of 7 along axis 1: Σ dY·Y (2·7 − 1), g·Σ (7), − (7), / norm (7) per vector
    pytest.param(1, 2, 3 * 5 * 9 * (5 * 7 - 1), id="p2-axis1"),
    # p = 1: sign select (7) + one negation of the sum per vector
    pytest.param(1, 1, 3 * 5 * 9 * 5 * 7, id="p1-axis1"),
    # default axis −1: V = 3·7·5 vectors of 9
    pytest.param(-1, 2, 3 * 7 * 5 * (5 * 9 - 1), id="p2-last-axis"),
])  # fmt: skip
def test_lp_normalization(axis, p, flops):
    assert node_backward(one_node("LpNormalization", X4, axis=axis, p=p), "LpNormalization").flops == flops


@pytest.mark.parametrize("op_type, attrs", [
    pytest.param("LRN", {"size": 3}, id="lrn"),
    pytest.param("MeanVarianceNormalization", {}, id="mvn"),
    pytest.param("LpNormalization", {}, id="lp"),
    pytest.param("Shrink", {}, id="shrink"),
    pytest.param("Hardmax", {}, id="hardmax"),
])  # fmt: skip
def test_data_input_needs_no_gradient(op_type, attrs):
    # fed by data only: no input needs a gradient, so the node costs nothing and is not "unsupported"
    assert node_backward(one_node(op_type, X4, trainable=False, **attrs), op_type) == flopcount.Cost()


XR = (5, 7, 9)


NXR, NYR = 5 * 7 * 9, 5 * 9  # reduced over axis 1, keepdims


@pytest.mark.parametrize("op_type, flops, trans", [
    pytest.param("ReduceL1", NXR, 0, id="l1-sign-multiply"),  # dY·sign(x) per input element
    pytest.param("ReduceLogSum", NYR, 0, id="logsum-one-division-per-output"),  # dY / Σx
    pytest.param("ReduceLogSumExp", 3 * NXR, NXR, id="logsumexp"),  # dY·exp(x − y): sub, exp, mul
    pytest.param("ReduceProd", NXR + NYR, 0, id="prod"),  # dY·y once per output, / x per input
])  # fmt: skip
def test_reductions_train(op_type, flops, trans):
    back = node_backward(one_node(op_type, XR, extra_inits=[const("axes", [1])]), op_type)
    assert (back.flops, back.transcendentals) == (flops, trans)


def test_reduction_keepdims_0_and_data_input():
    back = node_backward(one_node("ReduceProd", XR, extra_inits=[const("axes", [0, 2])], keepdims=0), "ReduceProd")
    assert back.flops == NXR + 7  # |Y| = 7 outputs
    assert node_backward(one_node("ReduceLogSumExp", XR, trainable=False, extra_inits=[const("axes", [1])]),
                         "ReduceLogSumExp") == flopcount.Cost()
