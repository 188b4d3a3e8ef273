"""Pooling (K per output element; Table 3: Cin·H·W of the input) and normalization (one per element)."""

from math import ceil, floor

import pytest
from helpers import single, weight

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
