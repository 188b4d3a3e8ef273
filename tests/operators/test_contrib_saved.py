"""What the backward of com.microsoft's fused operators keeps (operators/contrib_saved.py).

Each fused node is checked against the same graph with the fused node replaced by the default-domain operators it
fuses (the pairs of test_contrib.py, built side by side): the memory ledger of the unfused graph keeps real graph
tensors (the pre-activation, the sum before the normalization) by the default-domain rules, so its saved
activations must equal the fused node's in bytes. Where a fused kernel keeps less than its parts by design (a
bitmask instead of a bool mask, a fused attention's log-sum-exp instead of the probabilities), a closed form
written here is checked instead.
"""

from __future__ import annotations

import pytest
from onnx import TensorProto

import flopcount
from helpers import weight
from test_contrib import (
    CONV_CASES_TRAIN, ELEMENTWISE_CASES, MATMUL_CASES_TRAIN, SKIP_LN_CASES, build, conv_models, dropout_models,
    elementwise_models, embed_models, gemm_fast_gelu_models, gemm_models, group_norm_models, matmul_models,
    ms_train, skip_ln_models,
)

F32 = 4


def saved(m) -> tuple[int, int]:
    """(activations, of which statistics) of a training count of ``m``, with no rule missing."""
    report = flopcount.count(m, mode="train", memory=True, strict=True)
    assert not report.memory.missing
    (r,) = report.memory.ranks
    return r.activations_bytes, r.statistics_bytes


def same_as_unfused(fused_model, unfused_model) -> int:
    fused_bytes, unfused_bytes = saved(fused_model)[0], saved(unfused_model)[0]
    assert fused_bytes == unfused_bytes
    return fused_bytes


@pytest.mark.parametrize("opts, _", CONV_CASES_TRAIN)
def test_fused_conv_keeps_what_conv_add_and_activation_keep(opts, _):
    same_as_unfused(*conv_models(**opts))


def test_fused_conv_with_a_sigmoid_keeps_x_and_y():
    # X (3, 5, 11, 13) fed by a trained prefix, Y (3, 7, 9, 11): Conv keeps X, Sigmoid keeps Y
    assert same_as_unfused(*conv_models(x_grad=True, activation="Sigmoid")) == F32 * (3 * 5 * 11 * 13 + 3 * 7 * 9 * 11)


def test_fused_conv_with_leaky_relu_keeps_its_pre_activation():
    # LeakyRelu keeps its input: the convolution's output, an intermediate of Y's size, besides X
    assert same_as_unfused(*conv_models(x_grad=True, activation="LeakyRelu")) == F32 * (3 * 5 * 11 * 13
                                                                                       + 3 * 7 * 9 * 11)


@pytest.mark.parametrize("flags, opts, _", MATMUL_CASES_TRAIN)
def test_fused_matmul_keeps_each_operand_for_the_other(flags, opts, _):
    same_as_unfused(*matmul_models(flags, **opts))


@pytest.mark.parametrize("activation", ["Relu", "LeakyRelu", "Tanh"])
def test_fused_gemm_and_matmul_activation(activation):
    same_as_unfused(*gemm_models(a_grad=True, activation=activation))
    same_as_unfused(*matmul_models(a_grad=True, op="FusedMatMulActivation", activation=activation))


@pytest.mark.parametrize("bias", [True, False])
def test_gemm_fast_gelu_keeps_gelus_input(bias):
    same_as_unfused(*gemm_fast_gelu_models(bias=bias, x_grad=True))


@pytest.mark.parametrize("opts, _", SKIP_LN_CASES)
def test_skip_layer_norms_keep_the_sum_and_their_statistics(opts, _):
    same_as_unfused(*skip_ln_models(**opts))


def test_skip_layer_norm_keeps_its_sum_and_statistics_outputs_once():
    # X, skip (3, 7, 11): with outputs mean and inv_std_var (3, 7, 1) and the sum, those are what is kept
    x = (3, 7, 11)
    node = ms_train("SkipLayerNormalization", ["X", "skip", "gamma", "beta"], ["y", "mean", "istd", "sum"])
    m = build([node], {"skip": x}, [weight("gamma", (11,)), weight("beta", (11,))],
              {"y": x, "mean": (3, 7, 1), "istd": (3, 7, 1), "sum": x}, {"X": x}, outputs=("y", "mean", "istd", "sum"))
    assert saved(m)[0] == F32 * (3 * 7 * 11 + 2 * 3 * 7)


@pytest.mark.parametrize("opts", [{}, {"segment": False}, {"tables_trained": False}])
def test_embed_layer_norm_keeps_the_ids_and_the_embedding_sum(opts):
    n = same_as_unfused(*embed_models(**opts))
    tokens = 3 * 7
    # int32 token (and segment) ids, for the scatter-add into trained tables (frozen tables: no backward, nothing)
    ids = 4 * tokens * (1 if opts.get("segment", True) is False else 2) * opts.get("tables_trained", True)
    assert n == ids + F32 * tokens * 13 + 2 * F32 * tokens  # + the sum (3, 7, 13) and mean and rstd per token


@pytest.mark.parametrize("op, opts", [("GroupNorm", {"activation": 1}), ("GroupNorm", {"grad": ("X",)}),
                                      ("SkipGroupNorm", {"activation": 1, "bias": True,
                                                         "trained": ("gamma", "beta", "skip", "bias")}),
                                      ("SkipGroupNorm", {})])
def test_group_norms_keep_x_statistics_and_swishs_input(op, opts):
    same_as_unfused(*group_norm_models(op, **opts))


@pytest.mark.parametrize("op, opts, unfused, _", [c.values for c in ELEMENTWISE_CASES
                                                   if c.values[0] in ("ScaledSiLU", "BiasSplitGelu", "QuickGelu",
                                                                      "FastGelu", "BiasAdd")])
def test_fused_elementwise_keep_what_their_parts_keep(op, opts, unfused, _):
    same_as_unfused(*elementwise_models(op, unfused, **opts))


def test_bias_split_gelu_keeps_both_halves_and_gelu_of_the_right():
    # X (3, 7, 22) + bias: Y (3, 7, 11); the halves of the sum and Gelu(R): 3·|Y|
    case = next(c.values for c in ELEMENTWISE_CASES if c.values[0] == "BiasSplitGelu")
    fused_model, _ = elementwise_models(case[0], case[2], **case[1])
    assert saved(fused_model)[0] == 3 * F32 * 231


@pytest.mark.parametrize("op, residual", [("BiasDropout", True), ("BiasDropout", False)])
def test_bias_dropout_keeps_a_bool_mask_in_training_only(op, residual):
    assert same_as_unfused(*dropout_models(op, residual=residual, training=True)) == 462  # one byte per element
    assert saved(dropout_models(op, residual=residual, training=False)[0])[0] == 0


def test_bitmask_dropout_keeps_one_bit_per_element_in_32_bit_words():
    fused_model, _ = dropout_models("BitmaskBiasDropout", residual=False, training=True)
    assert saved(fused_model)[0] == 4 * -(-462 // 32)  # 15 words for 462 elements


def _attention_model(op, inputs, out_shape, **attrs):
    names = list(inputs)
    node = ms_train(op, names, ["y"], **attrs)
    return build([node], {}, [], {"y": out_shape}, inputs)


def test_multi_head_attention_keeps_q_k_v_y_and_a_float32_log_sum_exp_per_row():
    b, s, t, heads, dk, dv = 3, 7, 11, 5, 3, 5
    m = _attention_model("MultiHeadAttention", {"q": (b, s, heads * dk), "k": (b, t, heads * dk),
                                                "v": (b, t, heads * dv)}, (b, s, heads * dv), num_heads=heads)
    q, k, v, y = b * s * heads * dk, b * t * heads * dk, b * t * heads * dv, b * s * heads * dv
    assert saved(m) == (F32 * (q + k + v + y) + F32 * b * heads * s, F32 * b * heads * s)


def test_ms_attention_keeps_x_the_projection_y_and_a_log_sum_exp():
    b, s, hidden, heads = 3, 7, 10, 5
    node = ms_train("Attention", ["X", "W", "bias"], ["y"], num_heads=heads)
    m = build([node], {}, [weight("W", (hidden, 3 * hidden)), weight("bias", (3 * hidden,))], {"y": (b, s, hidden)},
              {"X": (b, s, hidden)})
    x = b * s * hidden  # X, kept for dW (W is a weight: not an activation)
    assert saved(m)[0] == F32 * (x + 3 * x + x) + F32 * b * heads * s  # + Q, K, V (3·|X|) + Y + log-sum-exp


def test_ms_rotary_embedding_keeps_the_position_ids():
    b, s, heads, d = 3, 7, 2, 4
    node = ms_train("RotaryEmbedding", ["X", "pos", "cos", "sin"], ["y"], num_heads=heads)
    m = build([node], {"pos": ((b, s), TensorProto.INT64)}, [weight("cos", (16, d // 2)), weight("sin", (16, d // 2))],
              {"y": (b, s, heads * d)}, {"X": (b, s, heads * d)})
    assert saved(m)[0] == 8 * b * s


def test_the_fused_rules_name_their_parts_registered_beside_them():
    from flopcount.registry import SAVED

    fused = {"FusedConv", "NhwcConv", "NhwcFusedConv", "FusedGemm", "FusedMatMulActivation", "GemmFastGelu",
             "ScaledSiLU", "BiasSplitGelu", "BiasDropout", "BitmaskBiasDropout", "BitmaskDropout",
             "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "EmbedLayerNormalization", "GroupNorm",
             "SkipGroupNorm", "RotaryEmbedding", "Attention", "MultiHeadAttention", "GroupQueryAttention"}
    assert {op for op in fused if ("com.microsoft", op) in SAVED} == fused
