"""Normalization: one FLOP per element of X (HPC AI500 Table 3), and a transcendental per statistic; forward and
backward."""

import pytest
from helpers import node_backward, one_node, single, weight

import flopcount


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


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): LRN, MeanVarianceNormalization, LpNormalization (and data-fed Shrink and Hardmax, which need no gradient either).
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
