"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

NLL over T = |target| positions: one negation per picked value, plus one multiply by the class
weight when weighted (w = 1); reduction none 0, sum T − 1, mean T − 1 + 1 + w·(T − 1).
SCE adds a log-softmax over the C classes of every position: 5C − 1 FLOPs, C + 1 transcendentals.
"""

import pytest
from helpers import model, weight
from onnx import TensorProto, helper

import flopcount


def loss(op, scores, target, weighted, reduction, n_outputs=1):
    names = ["scores", "target"] + (["w"] if weighted else [])
    outs = ["loss", "log_prob"][:n_outputs]
    node = helper.make_node(op, names, outs, reduction=reduction)
    inits = [weight("target", target, TensorProto.INT64)] + ([weight("w", (scores[1],))] if weighted else [])
    return flopcount.count(model([node], {"scores": scores}, outs, inits, opset=13)).total


# scores [N, C, d1, d2] = [3, 7, 5, 11]: T = 3·5·11 = 165 positions, C = 7
T, C = 3 * 5 * 11, 7
REDUCTIONS = [
    # id: weighted, reduction, expected NLL FLOPs (derived here)
    pytest.param(False, "none", T, id="none"),
    pytest.param(True, "none", 2 * T, id="none-weighted"),
    pytest.param(False, "sum", T + (T - 1), id="sum"),
    pytest.param(False, "mean", T + (T - 1) + 1, id="mean"),
    pytest.param(True, "mean", 2 * T + (T - 1) + 1 + (T - 1), id="mean-weighted"),
]


@pytest.mark.parametrize("weighted, reduction, nll", REDUCTIONS)
def test_nll_loss(weighted, reduction, nll):
    r = loss("NegativeLogLikelihoodLoss", (3, C, 5, 11), (3, 5, 11), weighted, reduction)
    assert (r.flops, r.transcendentals) == (nll, 0)


@pytest.mark.parametrize("weighted, reduction, nll", REDUCTIONS)
@pytest.mark.parametrize("n_outputs", [1, 2])
def test_softmax_cross_entropy(weighted, reduction, nll, n_outputs):
    r = loss("SoftmaxCrossEntropyLoss", (3, C, 5, 11), (3, 5, 11), weighted, reduction, n_outputs)
    assert r.flops == T * (5 * C - 1) + nll
    assert r.transcendentals == T * (C + 1)


def test_softmax_cross_entropy_2d():
    # scores [N, C] = [13, 9]: 13 positions
    r = loss("SoftmaxCrossEntropyLoss", (13, 9), (13,), False, "mean")
    assert r.flops == 13 * (5 * 9 - 1) + 13 + 12 + 1
