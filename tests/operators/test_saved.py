"""Saved-for-backward rules (flopcount.saved, registered with registry.saves beside the backward formulas): what
each operator's backward keeps, in bytes, on one-node graphs whose inputs need a gradient."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto

import flopcount
import flopcount.operators  # noqa: F401  (fills the registry)
from flopcount.errors import RegistryError
from flopcount.registry import BACKWARD, SAVED, saves
from helpers import const, shifted_op_model, weight

F32 = 4
N, C, HW = 3, 5, 6  # distinct sizes, so that a swapped dim cannot pass
X = F32 * N * C * HW * HW


def kept(m) -> tuple[int, int]:
    """(activations, of which statistics) of a training count of ``m``, with no rule missing."""
    report = flopcount.count(m, mode="train", memory=True)
    assert not report.memory.missing
    (r,) = report.memory.ranks
    return r.activations_bytes, r.statistics_bytes


def x_model(op, n_outputs=1, consts=(), params=(), opset=18, extra=(), **attrs):
    return shifted_op_model(op, ["x", *extra], {"x": [N, C, HW, HW]}, params=params, consts=consts,
                            learned=["x"], opset=opset, n_outputs=n_outputs, **attrs)


@pytest.mark.parametrize("op, expected", [
    pytest.param("Relu", X, id="Relu keeps Y"),
    pytest.param("Sigmoid", X, id="Sigmoid keeps Y"),
    pytest.param("Tanh", X, id="Tanh keeps Y"),
    pytest.param("Exp", X, id="Exp keeps Y"),
    pytest.param("Softplus", X, id="Softplus keeps X"),
    pytest.param("Neg", 0, id="Neg keeps nothing"),
    pytest.param("Flatten", 0, id="Flatten keeps nothing"),
    pytest.param("GlobalAveragePool", X, id="GlobalAveragePool keeps X"),
    pytest.param("ReduceSumSquare", X, id="ReduceSumSquare keeps X"),
])
def test_one_input_ops(op, expected):
    assert kept(x_model(op)) == (expected, 0)


def test_gelu_keeps_its_input():
    assert kept(x_model("Gelu", opset=20)) == (X, 0)


def test_add_keeps_nothing_and_mul_keeps_each_factor_for_the_other():
    both = shifted_op_model("Mul", ["a", "b"], {"a": [N, C], "b": [N, C]}, learned=["a", "b"])
    one = shifted_op_model("Mul", ["a", "b"], {"a": [N, C], "b": [N, C]}, learned=["a"])
    add = shifted_op_model("Add", ["a", "b"], {"a": [N, C], "b": [N, C]}, learned=["a", "b"])
    assert kept(both) == (2 * F32 * N * C, 0)
    assert kept(one) == (F32 * N * C, 0)  # b, for dA = dY·b; a is kept only for dB, which nothing needs
    assert kept(add) == (0, 0)


def test_softmax_keeps_its_output():
    """x·W then Softmax (a shift added before a Softmax would be taken for a mask, not a weight): MatMul keeps x for
    dW, Softmax its output."""
    from onnx import helper

    from helpers import model

    nodes = [helper.make_node("MatMul", ["x", "w"], ["s"]), helper.make_node("Softmax", ["s"], ["y"], axis=-1)]
    m = model(nodes, {"x": [N, 7]}, ["y"], [weight("w", (7, 11))])
    assert kept(m) == (F32 * N * 7 + F32 * N * 11, 0)


def test_max_pool_keeps_x_and_int64_indices():
    out = N * C * (HW // 2) ** 2
    assert kept(x_model("MaxPool", kernel_shape=[2, 2], strides=[2, 2])) == (X + 8 * out, 8 * out)


def test_batch_norm_keeps_x_and_per_channel_float32_statistics():
    params = [weight("scale", (C,)), weight("bias", (C,)), weight("mean", (C,)), weight("var", (C,))]
    m = x_model("BatchNormalization", params=params, extra=["scale", "bias", "mean", "var"], n_outputs=1)
    assert kept(m) == (X + 2 * 4 * C, 2 * 4 * C)


def test_conv_keeps_x():
    m = x_model("Conv", params=[weight("w", (7, C, 3, 3))], extra=["w"], pads=[1, 1, 1, 1])
    assert kept(m) == (X, 0)


def test_embedding_keeps_its_indices():
    m = shifted_op_model("Gather", ["table", "ids"], {"ids": [N, 11]}, params=[weight("table", (13, 17))])
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.INT64
    assert kept(m) == (8 * N * 11, 0)


def test_softmax_cross_entropy_keeps_the_log_probabilities_and_labels():
    m = shifted_op_model("SoftmaxCrossEntropyLoss", ["scores", "labels"], {"scores": [N, 7], "labels": [N]},
                         learned=["scores"])
    m.graph.input[1].type.tensor_type.elem_type = TensorProto.INT64
    assert kept(m) == (F32 * N * 7 + 8 * N, F32 * N * 7)


def test_dropout_of_ratio_zero_keeps_nothing():
    consts = [const("ratio", 0.0, np.float32), const("train", True, np.bool_)]
    assert kept(x_model("Dropout", consts=consts, extra=["ratio", "train"])) == (0, 0)
    consts = [const("ratio", 0.25, np.float32), const("train", True, np.bool_)]
    assert kept(x_model("Dropout", consts=consts, extra=["ratio", "train"])) == (X // 4, X // 4)


def test_registering_a_rule_twice_raises():
    with pytest.raises(RegistryError, match="registered twice"):
        saves("Relu")(lambda ctx, **_: None)


#: Operators with a backward formula and no saved-for-backward rule yet: the ledger lists them (a lower bound).
NOT_YET = {
    "AffineGrid", "Bernoulli", "CausalConvWithState", "Col2Im", "DFT", "DeformConv", "DequantizeLinear", "Det",
    "DynamicQuantizeLinear", "GRU", "GridSample", "If", "LSTM", "LinearAttention", "Loop", "MaxRoiPool",
    "MeanVarianceNormalization", "QuantizeLinear", "RNN", "RoiAlign", "STFT", "Scan", "SequenceMap",
    "ai.onnx.ml:Binarizer", "ai.onnx.ml:TreeEnsemble", "ai.onnx.ml:TreeEnsembleClassifier",
    "ai.onnx.ml:TreeEnsembleRegressor", "ai.onnx.preview:FlexAttention", "ai.onnx.preview.training:Adagrad",
    "ai.onnx.preview.training:Adam", "ai.onnx.preview.training:Momentum", "com.microsoft:Attention",
    "com.microsoft:BiasDropout", "com.microsoft:BiasSplitGelu", "com.microsoft:BitmaskBiasDropout",
    "com.microsoft:BitmaskDropout", "com.microsoft:EmbedLayerNormalization", "com.microsoft:FusedConv",
    "com.microsoft:FusedGemm", "com.microsoft:FusedMatMulActivation", "com.microsoft:GemmFastGelu",
    "com.microsoft:GroupNorm", "com.microsoft:GroupQueryAttention", "com.microsoft:MultiHeadAttention",
    "com.microsoft:NhwcConv", "com.microsoft:NhwcFusedConv", "com.microsoft:RotaryEmbedding",
    "com.microsoft:ScaledSiLU", "com.microsoft:SkipGroupNorm", "com.microsoft:SkipLayerNormalization",
    "com.microsoft:SkipSimplifiedLayerNormalization",
}


def test_inventory_every_backward_has_a_rule_or_is_listed():
    missing = {f"{d}:{o}" if d else o for d, o in BACKWARD if (d, o) not in SAVED}
    assert missing == NOT_YET
