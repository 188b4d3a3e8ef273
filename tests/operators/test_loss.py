"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

NLL over T = |target| positions: one negation per picked value, plus one multiply by the class
weight when weighted (w = 1); reduction none 0, sum T − 1, mean T − 1 + 1 + w·(T − 1).
SCE adds a log-softmax over the C classes of every position: 5C − 1 FLOPs, C + 1 transcendentals.
"""

import pytest
from helpers import direct_backward, model, node_backward, typed_model, weight
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


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss.
#
# Each expected value is a closed form written here from the sizes (distinct odd sizes, so that a
# swapped dimension cannot pass). A tensor needs a gradient when it is a trainable float initializer
# (``weight``) fed to a differentiable input, or computed from one; graph inputs are data and need none.
# Which inputs may get a gradient at all is the schema's say (``onnx.defs.get_schema``), checked in
# ``tests/pipeline/test_schema.py`` before the cases rely on it.
# -----------------------------------------------------------------------------------------------------------------


N = helper.make_node


F, I64 = TensorProto.FLOAT, TensorProto.INT64


NB, C_TRAIN, D = 3, 7, 5  # batch, classes, one extra position dim


T_TRAIN = NB * D  # 15 target positions


def loss_train(op, reduction, *, weighted=False, scores_trainable=True, weights_trainable=True, opset=13, n_outputs=1):
    outs = [f"y{i}" for i in range(n_outputs)]
    names = ["scores", "labels"] + (["w"] if weighted else [])
    inputs, inits = {"labels": (I64, (NB, D))}, []
    if scores_trainable:
        inits.append(weight("scores", (NB, C_TRAIN, D)))
    else:
        inputs["scores"] = (F, (NB, C_TRAIN, D))
    if weighted:
        if weights_trainable:
            inits.append(weight("w", (C_TRAIN,)))
        else:
            inputs["w"] = (F, (C_TRAIN,))
    return typed_model([N(op, names, outs, reduction=reduction)], inputs, outs, inits, opset)


@pytest.mark.parametrize("reduction, weighted, flops", [
    pytest.param("none", False, T_TRAIN, id="none"),  # −dL_t at the target entry
    pytest.param("sum", True, 2 * T_TRAIN, id="sum-weighted"),  # −dL·w_t
    pytest.param("mean", True, 2 * T_TRAIN + 1, id="mean-weighted"),  # + dL/Σw once
    pytest.param("mean", False, T_TRAIN + 1, id="mean"),  # + dL/T once
])  # fmt: skip
def test_nll_loss_train(reduction, weighted, flops):
    r = flopcount.count(loss_train("NegativeLogLikelihoodLoss", reduction, weighted=weighted), mode="train")
    assert r.trainable_params == NB * C_TRAIN * D  # the class weights are NonDifferentiable from opset 13 on
    assert node_backward(loss_train("NegativeLogLikelihoodLoss", reduction, weighted=weighted),
                         "NegativeLogLikelihoodLoss").flops == flops


@pytest.mark.parametrize("reduction, weighted, n_outputs, flops", [
    # per position: C exps of log_prob, × g_t (C), − g_t at the label (1)
    pytest.param("mean", False, 1, T_TRAIN * (2 * C_TRAIN + 1) + 1, id="mean"),
    pytest.param("sum", True, 1, T_TRAIN * (2 * C_TRAIN + 1) + T_TRAIN, id="sum-weighted"),
    # log_prob's gradient too: Σ dLP (C − 1), × softmax (C), − (C), added into dS (C)
    pytest.param("none", False, 2, T_TRAIN * (2 * C_TRAIN + 1) + T_TRAIN * (4 * C_TRAIN - 1), id="none-with-log-prob"),
])  # fmt: skip
def test_softmax_cross_entropy_train(reduction, weighted, n_outputs, flops):
    m = loss_train("SoftmaxCrossEntropyLoss", reduction, weighted=weighted, n_outputs=n_outputs)
    back = node_backward(m, "SoftmaxCrossEntropyLoss")
    assert (back.flops, back.transcendentals) == (flops, T_TRAIN * C_TRAIN)


@pytest.mark.parametrize("op, reduction, flops", [
    # the class weights' gradient (opset 12 leaves their category unknown; flopcount takes opset 13's
    # NonDifferentiable, so a count never asks for it): the formula on its own
    pytest.param("NegativeLogLikelihoodLoss", "none", 3 * T_TRAIN, id="nll-none"),  # −x, × dL_t, scatter-add
    pytest.param("NegativeLogLikelihoodLoss", "sum", 2 * T_TRAIN + C_TRAIN, id="nll-sum"),  # −x, add; × dL per class
    pytest.param("SoftmaxCrossEntropyLoss", "mean", 3 * T_TRAIN + C_TRAIN + 1, id="sce-mean"),  # (a − L), dL/W once
])  # fmt: skip
def test_loss_weight_gradient_formula(op, reduction, flops):
    inputs = [("scores", (NB, C_TRAIN, D)), ("labels", (NB, D), I64), ("w", (C_TRAIN,))]
    out = [(NB, D) if reduction == "none" else ()]
    assert direct_backward(op, inputs, out, (False, False, True), 12, reduction=reduction).flops == flops
    # the scores too: both gradients, the mean's division counted once
    scores = (T_TRAIN * (2 * C_TRAIN + 1) if op == "SoftmaxCrossEntropyLoss" else T_TRAIN) + T_TRAIN
    assert direct_backward(op, inputs, out, (True, False, True), 12, reduction=reduction).flops == flops + scores


def test_loss_weights_are_not_trained_at_opset_12():
    m = loss_train("NegativeLogLikelihoodLoss", "sum", weighted=True, opset=12)
    r = flopcount.count(m, mode="train")
    assert r.trainable_params == NB * C_TRAIN * D  # the scores only
    assert node_backward(m, "NegativeLogLikelihoodLoss").flops == T_TRAIN + T_TRAIN  # dS: −dL scattered, × w


def test_loss_with_data_scores_costs_nothing():
    m = loss_train("SoftmaxCrossEntropyLoss", "mean", weighted=True, scores_trainable=False, weights_trainable=False)
    assert node_backward(m, "SoftmaxCrossEntropyLoss") == flopcount.Cost()
