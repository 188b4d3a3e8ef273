"""Reductions: one per input element (exps and logs where the reduction takes them); forward and backward."""

import pytest
from helpers import const, node_backward, one_node, single

import flopcount


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


def test_reduction_of_an_empty_tensor_costs_nothing():
    from helpers import const

    m = single("ReduceSum", {"x": (2, 0, 4)}, [const("axes", [1])], keepdims=1)
    assert flopcount.count(m).total.flops == 0


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): reductions.
# -----------------------------------------------------------------------------------------------------------------


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
