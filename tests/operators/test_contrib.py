"""Microsoft contrib operators (domain com.microsoft) that onnxruntime's optimizers write.

Each case is one node; expected costs are written out from the sizes. Sizes are distinct and odd
where the operator allows: batch 3, sequence 7, key length 11, past 13, heads 5, head sizes 3 (Q/K)
and 5 (V), hidden 11 or 13. ONNX shape inference does not know these operators, so the cases whose
formula needs the output shape (FusedConv, FusedMatMul, FusedGemm) declare it, as an onnxruntime
optimized model carries it in its value_info.
"""

import numpy as np
import pytest
from helpers import const, weight
from onnx import TensorProto, helper, numpy_helper

import flopcount

F, I32, I64, U8, BOOL = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.BOOL
MS = "com.microsoft"


def ms(op, inputs, initializers=(), outputs=("y",), out_shape=None, domain=MS, **attrs):
    """One ``op`` node. ``inputs``: name → shape (float graph inputs), or "" for an omitted optional
    input; ``initializers`` follow them as node inputs; ``out_shape`` declares the first output."""
    names = list(inputs) + [t.name for t in initializers]
    node = helper.make_node(op, names, list(outputs), domain=domain, **attrs)
    graph_outputs = [
        helper.make_tensor_value_info(outputs[0], F, out_shape) if out_shape
        else helper.make_empty_tensor_value_info(outputs[0]),
        *(helper.make_empty_tensor_value_info(o) for o in outputs[1:] if o),
    ]
    g = helper.make_graph(
        [node], "contrib",
        [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items() if n],
        graph_outputs, list(initializers),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])


def cost(m, convention="default"):
    r = flopcount.count(m, convention=convention, strict=True).total
    return r.flops, r.macs, r.transcendentals, r.int_ops


# --- convolution ----------------------------------------------------------------------------
# X (3, 5, 11, 13), W (7, 5, 3, 3), no padding: Y (3, 7, 9, 11); MACs = |Y|·5·3·3
Y_CONV = 3 * 7 * 9 * 11
CONV_MACS = Y_CONV * 5 * 3 * 3


def fused_conv(bias=True, z=False, op="FusedConv", nhwc=False, **attrs):
    x, y = ((3, 11, 13, 5), (3, 9, 11, 7)) if nhwc else ((3, 5, 11, 13), (3, 7, 9, 11))
    inputs = {"X": x, "Z": y} if z else {"X": x}
    inits = [weight("W", (7, 5, 3, 3))] + ([weight("B", (7,))] if bias else [])
    node_inputs = ["X", "W", "B" if bias else ""] + (["Z"] if z else [])
    node = helper.make_node(op, node_inputs, ["y"], domain=MS, kernel_shape=[3, 3], **attrs)
    g = helper.make_graph(
        [node], "conv", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info("y", F, y)], inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])


CONV_CASES = [
    pytest.param({"bias": False}, (2 * CONV_MACS, CONV_MACS, 0, 0), id="no-bias"),
    pytest.param({}, (2 * CONV_MACS + Y_CONV, CONV_MACS, 0, 0), id="bias"),
    pytest.param({"activation": "Relu"}, (2 * CONV_MACS + 2 * Y_CONV, CONV_MACS, 0, 0), id="bias-relu"),
    pytest.param({"activation": "Sigmoid"}, (2 * CONV_MACS + 2 * Y_CONV, CONV_MACS, Y_CONV, 0), id="bias-sigmoid"),
    pytest.param({"z": True, "activation": "Relu"}, (2 * CONV_MACS + 3 * Y_CONV, CONV_MACS, 0, 0), id="bias-sum-relu"),
    pytest.param({"op": "NhwcFusedConv", "nhwc": True, "z": True, "activation": "Relu"},
                 (2 * CONV_MACS + 3 * Y_CONV, CONV_MACS, 0, 0), id="nhwc-bias-sum-relu"),
    pytest.param({"op": "NhwcConv", "nhwc": True}, (2 * CONV_MACS + Y_CONV, CONV_MACS, 0, 0), id="nhwc-conv"),
]


@pytest.mark.parametrize("opts, expected", CONV_CASES)
def test_fused_conv(opts, expected):
    assert cost(fused_conv(**opts)) == expected


def test_fused_conv_table3_drops_only_the_bias():
    # the product at 2 per MAC (Table 3 convolution), no bias, the activation still counted
    assert cost(fused_conv(activation="Relu"), "table3")[0] == 2 * CONV_MACS + Y_CONV


def test_fused_conv_unknown_activation_is_an_error():
    with pytest.raises(flopcount.InvalidGraphError, match="Frobnicate"):
        cost(fused_conv(activation="Frobnicate"))


# --- matrix products ------------------------------------------------------------------------
# Y (3, 7, 13) from A (3, 7, 11)·B (3, 11, 13): MACs = 3·7·13·11 = 3003
MM_Y, MM_MACS = 3 * 7 * 13, 3 * 7 * 13 * 11

MATMUL_CASES = [
    pytest.param("FusedMatMul", (3, 7, 11), {}, (2 * MM_MACS, MM_MACS, 0, 0), id="plain"),
    pytest.param("FusedMatMul", (3, 11, 7), {"transA": 1}, (2 * MM_MACS, MM_MACS, 0, 0), id="transA"),
    pytest.param("FusedMatMul", (7, 3, 11), {"transBatchA": 1}, (2 * MM_MACS, MM_MACS, 0, 0), id="transBatchA"),
    pytest.param("FusedMatMul", (11, 3, 7), {"transBatchA": 1, "transA": 1}, (2 * MM_MACS, MM_MACS, 0, 0),
                 id="transBatchA-transA"),
    pytest.param("FusedMatMul", (3, 7, 11), {"alpha": 0.125}, (2 * MM_MACS + MM_Y, MM_MACS, 0, 0), id="alpha"),
    pytest.param("TransposeMatMul", (3, 7, 11), {"transB": 1}, (2 * MM_MACS, MM_MACS, 0, 0), id="transpose-matmul"),
    pytest.param("FusedMatMulActivation", (3, 7, 11), {"activation": "Tanh", "alpha": 0.5},
                 (2 * MM_MACS + 2 * MM_Y, MM_MACS, MM_Y, 0), id="activation-tanh-alpha"),
]


@pytest.mark.parametrize("op, a, attrs, expected", MATMUL_CASES)
def test_fused_matmul(op, a, attrs, expected):
    b = (3, 13, 11) if attrs.get("transB") else (3, 11, 13)
    assert cost(ms(op, {"A": a, "B": b}, out_shape=(3, 7, 13), **attrs)) == expected


def test_fused_matmul_table3():
    m = ms("FusedMatMul", {"A": (3, 7, 11), "B": (3, 11, 13)}, out_shape=(3, 7, 13), alpha=0.125)
    assert cost(m, "table3")[0] == MM_MACS  # one FLOP per MAC, no scaling term


# FusedGemm: A (7, 11)·B (11, 13) + C (13): M·K·N = 7·11·13 = 1001 MACs, M·N = 91
@pytest.mark.parametrize(
    "attrs, expected",
    [
        pytest.param({}, (2 * 1001 + 91, 1001, 0, 0), id="gemm-bias"),
        pytest.param({"activation": "LeakyRelu", "activation_alpha": 0.01}, (2 * 1001 + 2 * 91, 1001, 0, 0),
                     id="leaky-relu"),
        pytest.param({"activation": "Tanh", "transA": 1}, (2 * 1001 + 2 * 91, 1001, 91, 0), id="transA-tanh"),
        pytest.param({"activation": "Relu", "alpha": 2.0, "beta": 0.5}, (2 * 1001 + 91 + 13 + 91 + 91, 1001, 0, 0),
                     id="alpha-beta-relu"),
    ],
)
def test_fused_gemm(attrs, expected):
    a = (11, 7) if attrs.get("transA") else (7, 11)
    m = ms("FusedGemm", {"A": a}, [weight("B", (11, 13)), weight("C", (13,))], out_shape=(7, 13), **attrs)
    assert cost(m) == expected


def test_gemm_fast_gelu():
    # X (3, 7, 11)·W (11, 13): |Y| = 273, MACs = 3003; + bias 273 + FastGelu 273 (one tanh each)
    m = ms("GemmFastGelu", {"X": (3, 7, 11)}, [weight("W", (11, 13)), weight("bias", (13,))])
    assert cost(m) == (2 * 3003 + 273 + 273, 3003, 273, 0)


# MatMulNBits: A (3, 5, 96), K = 96, N = 13, 4 bits in blocks of 32: M = 15 rows, MACs = 15·96·13 = 18720,
# N·K = 1248 weights dequantized: one integer zero-point subtraction and one float scale multiply each
NB_MACS, NB_W, NB_Y = 15 * 96 * 13, 13 * 96, 15 * 13


def nbits(zero_points=None, bias=False):
    """MatMulNBits of A (3, 5, 96) by 4-bit B (13, 3 blocks, 16 bytes) with scales (13, 3)."""
    names = ["A", "B", "scales", zero_points.name if zero_points is not None else ""]
    inits = [weight("B", (13, 3, 16), U8), weight("scales", (13, 3))]
    inits += [zero_points] if zero_points is not None else []
    if bias:
        names += ["", "bias"]
        inits.append(weight("bias", (13,)))
    node = helper.make_node("MatMulNBits", names, ["y"], domain=MS, K=96, N=13, bits=4, block_size=32)
    g = helper.make_graph([node], "nbits", [helper.make_tensor_value_info("A", F, (3, 5, 96))],
                          [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])


@pytest.mark.parametrize(
    "zp, bias, expected",
    [
        pytest.param(None, False, (2 * NB_MACS + NB_W, NB_MACS, 0, NB_W), id="default-zero-point"),
        pytest.param(weight("zp", (13, 2), U8), False, (2 * NB_MACS + NB_W, NB_MACS, 0, NB_W), id="packed-zero-points"),
        pytest.param(weight("zp", (13, 3), F), False, (2 * NB_MACS + 2 * NB_W, NB_MACS, 0, 0), id="float-zero-points"),
        pytest.param(None, True, (2 * NB_MACS + NB_W + NB_Y, NB_MACS, 0, NB_W), id="bias"),
    ],
)
def test_matmul_nbits(zp, bias, expected):
    assert cost(nbits(zp, bias)) == expected


def test_matmul_nbits_dense_counts_the_product():
    # the dense convention keeps the product (family matmul), 2 per MAC, nothing else
    assert cost(nbits(), "dense") == (2 * NB_MACS, NB_MACS, 0, 0)


# --- attention ------------------------------------------------------------------------------
B, S, L, P, H, E, EV = 3, 7, 11, 13, 5, 3, 5


def core(t, h_kv=H, e_v=EV, s=S):
    """(FLOPs, MACs, transcendentals) of the attention core as the ONNX Attention counts it:
    Q·Kᵀ and probs·V, √scale on Q and on K, softmax of R = B·H·S rows of t scores."""
    rows = B * H * s
    macs = rows * t * (E + e_v)
    flops = 2 * macs + rows * E + B * h_kv * t * E + rows * (5 * t - 2)
    return flops, macs, rows * t


def ms_attention(qkv=(15, 15, 25), mask=False, past=False, bias=True, attention_bias=False, **attrs):
    """Attention over input (3, 7, 37); D_q = D_k = 15, D_v = 25 (E = 3, E_v = 5)."""
    width = sum(qkv)
    inputs = {"input": (B, S, 37)}
    inits = [weight("weights", (37, width))]
    names = ["input", "weights", "", "", "", ""]
    if bias:
        inits.append(weight("bias", (width,)))
        names[2] = "bias"
    if mask:
        inits.append(weight("mask_index", (B, S), I32))
        names[3] = "mask_index"
    if past:
        inputs["past"] = (2, B, H, P, E)
        names[4] = "past"
    if attention_bias:
        inputs["attention_bias"] = (1, H, S, S + (P if past else 0))
        names[5] = "attention_bias"
    while not names[-1]:
        names.pop()
    if qkv != (15, 15, 15):
        attrs["qkv_hidden_sizes"] = list(qkv)
    node = helper.make_node("Attention", names, ["y", "present"] if past else ["y"], domain=MS, num_heads=H, **attrs)
    graph_inputs = [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()]
    g = helper.make_graph([node], "att", graph_inputs, [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])


PROJ_MACS = B * S * 37 * (15 + 15 + 25)  # 3·7·37·55
PROJ_BIAS = B * S * (15 + 15 + 25)


def attention_expected(t, *, masks=0, bias=True, rotary=0):
    f, m, tr = core(t)
    flops = 2 * PROJ_MACS + f + masks * B * H * S * t + (PROJ_BIAS if bias else 0) + rotary
    return flops, PROJ_MACS + m, tr, 0


ATTENTION_CASES = [
    pytest.param({}, attention_expected(S), id="bert-self-attention"),
    pytest.param({"bias": False}, attention_expected(S, bias=False), id="no-bias"),
    pytest.param({"mask": True}, attention_expected(S, masks=1), id="mask-index"),
    pytest.param({"mask": True, "unidirectional": 1}, attention_expected(S, masks=1), id="mask-and-causal-one-add"),
    pytest.param({"unidirectional": 1, "past": True}, attention_expected(P + S, masks=1), id="gpt2-causal-past"),
    pytest.param({"attention_bias": True, "past": True}, attention_expected(P + S, masks=1), id="attention-bias"),
    pytest.param({"mask": True, "attention_bias": True}, attention_expected(S, masks=2), id="mask-and-attention-bias"),
    # rotary on Q and K: 3 FLOPs per rotated element, all of each head (D_rot = E = 3): 3·B·S·(15 + 15)
    pytest.param({"do_rotary": 1}, attention_expected(S, rotary=3 * B * S * 30), id="rotary"),
]


@pytest.mark.parametrize("opts, expected", ATTENTION_CASES)
def test_attention(opts, expected):
    assert cost(ms_attention(**opts)) == expected


def test_attention_equal_qkv_sizes_from_the_weight():
    # weights (37, 45): D_q = D_k = D_v = 15, E = E_v = 3
    f, m, tr = core(S, e_v=E)
    macs = B * S * 37 * 45
    assert cost(ms_attention(qkv=(15, 15, 15))) == (2 * macs + B * S * 45 + f, macs + m, tr, 0)


def test_attention_shared_buffer_uses_the_past_length_value():
    m = ms_attention(past=True, past_present_share_buffer=1)
    node = m.graph.node[0]
    node.input.extend(["", "past_len"])
    m.graph.initializer.append(const("past_len", 4, np.int32))
    assert cost(m) == attention_expected(4 + S)


def test_attention_dense_keeps_projection_and_products():
    assert cost(ms_attention(mask=True), "dense") == (2 * (PROJ_MACS + core(S)[1]), PROJ_MACS + core(S)[1], 0, 0)


def mha(query, key=None, value=None, *, bias=False, past=False, padding_mask=False, attention_bias_t=None, **attrs):
    inputs = {"query": query}
    names = ["query", "", "", "", "", "", "", ""]
    if key is not None:
        inputs["key"] = key
        names[1] = "key"
    if value is not None:
        inputs["value"] = value
        names[2] = "value"
    inits = []
    if bias:
        inits.append(weight("bias", (15 + 15 + 25,)))
        names[3] = "bias"
    if padding_mask:
        inits.append(weight("key_padding_mask", (B, L), I32))
        names[4] = "key_padding_mask"
    if attention_bias_t:
        inputs["attention_bias"] = (1, H, S, attention_bias_t)
        names[5] = "attention_bias"
    if past:
        inputs["past_key"], inputs["past_value"] = (B, H, P, E), (B, H, P, EV)
        names[6:8] = ["past_key", "past_value"]
    while not names[-1]:
        names.pop()
    node = helper.make_node("MultiHeadAttention", names, ["y"], domain=MS, num_heads=H, **attrs)
    g = helper.make_graph([node], "mha", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
                          [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])


def mha_expected(t, *, e_v=EV, s=S, extra=0, masks=0):
    f, m, tr = core(t, e_v=e_v, s=s)
    return f + extra + masks * B * H * s * t, m, tr, 0


Q3, K3, V3 = (B, S, H * E), (B, L, H * E), (B, L, H * EV)
MHA_CASES = [
    pytest.param(Q3, K3, V3, {}, mha_expected(L), id="cross-attention-3d"),
    # the projection bias is added to Q (B·S·15), K (B·L·15) and V (B·L·25)
    pytest.param(Q3, K3, V3, {"bias": True}, mha_expected(L, extra=B * S * 15 + B * L * 40), id="bias"),
    pytest.param(Q3, K3, V3, {"padding_mask": True}, mha_expected(L, masks=1), id="key-padding-mask"),
    pytest.param(Q3, K3, V3, {"unidirectional": 1}, mha_expected(L, masks=1), id="causal"),
    pytest.param(Q3, K3, V3, {"padding_mask": True, "unidirectional": 1}, mha_expected(L, masks=1),
                 id="mask-and-causal"),
    pytest.param(Q3, K3, V3, {"attention_bias_t": L}, mha_expected(L, masks=1), id="attention-bias"),
    pytest.param(Q3, K3, V3, {"past": True}, mha_expected(P + L), id="past-kv"),
    pytest.param(Q3, (B, H, L, E), (B, H, L, EV), {}, mha_expected(L), id="bnsh-kv"),
    # bias on Q only when K and V come in BNSH (already projected)
    pytest.param(Q3, (B, H, L, E), (B, H, L, EV), {"bias": True}, mha_expected(L, extra=B * S * 15), id="bnsh-kv-bias"),
    pytest.param(Q3, (B, L, H, 2, E), None, {}, mha_expected(L, e_v=E), id="packed-kv"),
    pytest.param((B, S, H, 3, E), None, None, {}, mha_expected(S, e_v=E), id="packed-qkv"),
]


@pytest.mark.parametrize("q, k, v, opts, expected", MHA_CASES)
def test_multi_head_attention(q, k, v, opts, expected):
    assert cost(mha(q, k, v, **opts)) == expected


def test_multi_head_attention_table3_drops_the_projection_bias():
    f = core(L)[0] - 2 * core(L)[1] + core(L)[1]  # products at one FLOP per MAC
    assert cost(mha(Q3, K3, V3, bias=True), "table3")[0] == f


# GroupQueryAttention: 5 query heads share KV heads; head size E = 3 for Q, K and V
def gqa(h_kv=1, *, packed=False, past=True, total=None, cos=False, head_sink=False, qk_norm=False,
        kv_scales=False, attention_bias=False, **attrs):
    inputs = {"query": (B, S, (H + 2 * h_kv) * E) if packed else (B, S, H * E)}
    names = ["query", "", "", "", "", "seqlens_k", "total_sequence_length"]
    if not packed:
        inputs["key"], inputs["value"] = (B, S, h_kv * E), (B, S, h_kv * E)
        names[1:3] = ["key", "value"]
    if past:
        inputs["past_key"], inputs["past_value"] = (B, h_kv, P, E), (B, h_kv, P, E)
        names[3:5] = ["past_key", "past_value"]
    inits = [weight("seqlens_k", (B,), I32)]
    known = total is not None
    inits.append(const("total_sequence_length", total, np.int32) if known else weight("total_sequence_length", (), I32))
    names += [""] * 9
    if cos:
        inits += [weight("cos_cache", (32, 1)), weight("sin_cache", (32, 1))]
        names[7:9] = ["cos_cache", "sin_cache"]
    if attention_bias:
        inputs["attention_bias"] = (1, H, S, (P if past else 0) + S)
        names[10] = "attention_bias"
    if head_sink:
        inits.append(weight("head_sink", (H,)))
        names[11] = "head_sink"
    if kv_scales:
        inits += [weight("k_scale", (1,)), weight("v_scale", (1,))]
        names[12:14] = ["k_scale", "v_scale"]
    if qk_norm:
        inits += [weight("q_norm_weight", (E,)), weight("k_norm_weight", (E,))]
        names[14:16] = ["q_norm_weight", "k_norm_weight"]
    while not names[-1]:
        names.pop()
    node = helper.make_node("GroupQueryAttention", names, ["y"], domain=MS, num_heads=H, kv_num_heads=h_kv, **attrs)
    g = helper.make_graph([node], "gqa", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
                          [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])


def gqa_expected(t, h_kv=1, *, causal=True, extra=0, trans=0, masks=0):
    f, m, tr = core(t, h_kv=h_kv, e_v=E)
    rows_t = B * H * S * t
    return f + (int(causal) + masks) * rows_t + extra, m, tr + trans, 0


R_GQA = B * H * S  # 105 score rows
GQA_CASES = [
    pytest.param({}, gqa_expected(P + S), id="mqa-past-causal"),
    pytest.param({"h_kv": 5}, gqa_expected(P + S, 5), id="mha-past-causal"),
    pytest.param({"total": 9}, gqa_expected(9), id="total-length-value"),
    pytest.param({"past": False}, gqa_expected(S), id="prompt-no-past"),
    pytest.param({"packed": True}, gqa_expected(P + S), id="packed-qkv"),
    pytest.param({"causal": 0}, gqa_expected(P + S, causal=False), id="bidirectional"),
    pytest.param({"causal": 1, "local_window_size": 4}, gqa_expected(P + S), id="sliding-window"),
    pytest.param({"attention_bias": True}, gqa_expected(P + S, masks=1), id="attention-bias"),
    pytest.param({"softcap": 30.0}, gqa_expected(P + S, extra=3 * R_GQA * 20, trans=R_GQA * 20), id="softcap"),
    pytest.param({"head_sink": True}, gqa_expected(P + S, extra=3 * R_GQA, trans=R_GQA), id="head-sink"),
    pytest.param({"smooth_softmax": 1}, gqa_expected(P + S, extra=3 * R_GQA, trans=R_GQA), id="smooth-softmax"),
    # rotary on Q (5 heads) and the new K (1 head): D_rot = 2·1 of E = 3, 3 FLOPs per rotated element
    pytest.param({"do_rotary": 1, "cos": True}, gqa_expected(P + S, extra=3 * B * S * 6 * 2), id="rotary"),
    # per-head RMS norm of Q and K: one FLOP per element, one 1/sqrt per head and token
    pytest.param({"qk_norm": True}, gqa_expected(P + S, extra=B * S * 6 * E, trans=B * S * 6), id="qk-norm"),
    # quantized cache: dequantize T = 20 rows and quantize S = 7 new rows, for K and for V
    pytest.param({"kv_scales": True}, gqa_expected(P + S, extra=2 * B * 1 * (20 + 7) * E), id="quantized-kv-cache"),
]


@pytest.mark.parametrize("opts, expected", GQA_CASES)
def test_group_query_attention(opts, expected):
    assert cost(gqa(**opts)) == expected


def test_gqa_products_are_per_query_head():
    assert cost(gqa(h_kv=1))[1] == cost(gqa(h_kv=5))[1] == B * H * S * 20 * 2 * E


# --- rotary embedding -----------------------------------------------------------------------
@pytest.mark.parametrize(
    "x, cos, attrs, rotated",
    [
        # (3, 7, 5·6): head 6 = 2·3, every element rotated
        pytest.param((3, 7, 30), (32, 3), {"num_heads": 5}, 3 * 7 * 30, id="3d-full"),
        pytest.param((3, 7, 30), (32, 3), {}, 3 * 7 * 30, id="3d-no-num-heads"),
        # partial: D_rot = 4 of each head of 6
        pytest.param((3, 7, 30), (32, 2), {"num_heads": 5, "rotary_embedding_dim": 4}, 3 * 7 * 5 * 4, id="3d-partial"),
        pytest.param((3, 5, 7, 6), (32, 2), {}, 3 * 5 * 7 * 4, id="4d-partial"),
        pytest.param((21, 30), (32, 3), {"num_heads": 5, "is_packed_batching": 1}, 21 * 30, id="packed"),
    ],
)
def test_rotary_embedding(x, cos, attrs, rotated):
    caches = [weight("position_ids", (1,), I64), weight("cos", cos), weight("sin", cos)]
    m = ms("RotaryEmbedding", {"X": x}, caches, **attrs)
    assert cost(m) == (3 * rotated, 0, 0, 0)


# --- normalization --------------------------------------------------------------------------
X3 = (3, 7, 11)  # |X| = 231, 21 rows of 11
N3, ROWS3 = 231, 21


@pytest.mark.parametrize(
    "op, extra, expected",
    [
        pytest.param("SkipLayerNormalization", [], (2 * N3, 0, ROWS3, 0), id="skip-ln"),
        pytest.param("SkipLayerNormalization", ["beta"], (2 * N3, 0, ROWS3, 0), id="skip-ln-beta"),
        pytest.param("SkipLayerNormalization", ["beta", "bias"], (3 * N3, 0, ROWS3, 0), id="skip-ln-beta-bias"),
        pytest.param("SkipLayerNormalization", ["", "bias"], (3 * N3, 0, ROWS3, 0), id="skip-ln-bias"),
        pytest.param("SkipSimplifiedLayerNormalization", [], (2 * N3, 0, ROWS3, 0), id="skip-rms"),
        pytest.param("SkipSimplifiedLayerNormalization", ["bias"], (3 * N3, 0, ROWS3, 0), id="skip-rms-bias"),
    ],
)
def test_skip_layer_norm(op, extra, expected):
    inits = [weight("gamma", (11,))] + [weight(n, (11,)) for n in extra if n]
    names = ["input", "skip", "gamma", *extra]
    node = helper.make_node(op, names, ["y"], domain=MS)
    g = helper.make_graph([node], "sln", [helper.make_tensor_value_info("input", F, X3),
                                          helper.make_tensor_value_info("skip", F, (1, 7, 11))],
                          [helper.make_empty_tensor_value_info("y")], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])
    assert cost(m) == expected


@pytest.mark.parametrize("axis, rows", [pytest.param(-1, 21, id="last-axis"), pytest.param(1, 3, id="axis-1")])
def test_simplified_layer_norm_default_domain(axis, rows):
    scale = weight("scale", (7, 11) if axis == 1 else (11,))
    m = ms("SimplifiedLayerNormalization", {"X": X3}, [scale], domain="", axis=axis)
    assert cost(m) == (N3, 0, rows, 0)


def embed(segment=True, mask=False):
    names = ["input_ids", "segment_ids" if segment else "", "word", "position", "segment" if segment else "",
             "gamma", "beta"] + (["mask"] if mask else [])
    inits = [weight("word", (101, 13)), weight("position", (29, 13)), weight("gamma", (13,)), weight("beta", (13,))]
    if segment:
        inits.append(weight("segment", (2, 13)))
    inputs = [helper.make_tensor_value_info("input_ids", I32, (3, 7))]
    if segment:
        inputs.append(helper.make_tensor_value_info("segment_ids", I32, (3, 7)))
    if mask:
        inputs.append(helper.make_tensor_value_info("mask", I32, (3, 7)))
    node = helper.make_node("EmbedLayerNormalization", names, ["y", "mask_index"], domain=MS)
    g = helper.make_graph([node], "embed", inputs, [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])


@pytest.mark.parametrize(
    "opts, expected",
    [
        # 21 tokens of width 13 = 273 elements: word + position + segment (2 adds), LayerNorm (1)
        pytest.param({}, (3 * 273, 0, 21, 0), id="bert"),
        pytest.param({"segment": False}, (2 * 273, 0, 21, 0), id="no-segment"),
        pytest.param({"mask": True}, (3 * 273, 0, 21, 21), id="mask-index"),
    ],
)
def test_embed_layer_norm(opts, expected):
    assert cost(embed(**opts)) == expected


# GroupNorm, NHWC X (3, 5, 7, 10), 5 groups: |X| = 1050, 15 statistics
@pytest.mark.parametrize(
    "op, activation, expected",
    [
        pytest.param("GroupNorm", 0, (1050, 0, 15, 0), id="group-norm"),
        pytest.param("GroupNorm", 1, (2 * 1050, 0, 15 + 1050, 0), id="group-norm-silu"),
        pytest.param("SkipGroupNorm", 0, (2 * 1050, 0, 15, 0), id="skip-group-norm"),
        pytest.param("SkipGroupNorm", 1, (3 * 1050, 0, 15 + 1050, 0), id="skip-group-norm-silu"),
    ],
)
def test_group_norm(op, activation, expected):
    inits = [weight("gamma", (10,)), weight("beta", (10,))]
    inputs = {"X": (3, 5, 7, 10)}
    if op == "SkipGroupNorm":
        inputs["skip"] = (3, 1, 1, 10)
    m = ms(op, inputs, inits, groups=5, activation=activation)
    if op == "SkipGroupNorm":  # node inputs: X, gamma, beta, skip
        m.graph.node[0].ClearField("input")
        m.graph.node[0].input.extend(["X", "gamma", "beta", "skip"])
    assert cost(m) == expected


def test_skip_group_norm_bias():
    m = ms("SkipGroupNorm", {"X": (3, 5, 7, 10), "skip": (3, 1, 1, 10)},
           [weight("gamma", (10,)), weight("beta", (10,)), weight("bias", (10,))], groups=5, activation=0)
    m.graph.node[0].ClearField("input")
    m.graph.node[0].input.extend(["X", "gamma", "beta", "skip", "bias"])
    assert cost(m) == (3 * 1050, 0, 15, 0)


# --- element-wise ---------------------------------------------------------------------------
XE = (3, 7, 22)  # |X| = 462


@pytest.mark.parametrize(
    "op, inputs, inits, attrs, expected",
    [
        pytest.param("Gelu", {"X": XE}, [], {}, (462, 0, 462, 0), id="gelu"),
        pytest.param("FastGelu", {"X": XE}, [], {}, (462, 0, 462, 0), id="fast-gelu"),
        pytest.param("FastGelu", {"X": XE}, [weight("bias", (22,))], {}, (2 * 462, 0, 462, 0), id="fast-gelu-bias"),
        pytest.param("BiasGelu", {"A": XE}, [weight("B", (22,))], {}, (2 * 462, 0, 462, 0), id="bias-gelu"),
        pytest.param("QuickGelu", {"X": XE}, [], {"alpha": 1.702}, (462, 0, 462, 0), id="quick-gelu"),
        pytest.param("ScaledSiLU", {"X": XE}, [], {"alpha": 0.5}, (2 * 462, 0, 462, 0), id="scaled-silu"),
        # bias add on 462, Gelu of the right half (231 erfs), product with the left half (231)
        pytest.param("BiasSplitGelu", {"X": XE}, [weight("bias", (22,))], {}, (462 + 231 + 231, 0, 231, 0),
                     id="bias-split-gelu"),
        # X + bias + skip
        pytest.param("BiasAdd", {"X": XE}, [weight("bias", (22,)), weight("skip", XE)], {}, (2 * 462, 0, 0, 0),
                     id="bias-add"),
        pytest.param("BitmaskDropout", {"X": XE}, [], {}, (0, 0, 0, 0), id="bitmask-dropout-inference"),
    ],
)
def test_elementwise(op, inputs, inits, attrs, expected):
    assert cost(ms(op, inputs, inits, **attrs)) == expected


def dropout(op, residual, training):
    names = ["data", "bias", "residual" if residual else "", "ratio", "training_mode"]
    inits = [weight("bias", (22,)), const("ratio", 0.1, np.float32), const("training_mode", training, np.bool_)]
    inputs = [helper.make_tensor_value_info("data", F, XE)]
    if residual:
        inputs.append(helper.make_tensor_value_info("residual", F, XE))
    node = helper.make_node(op, names, ["y"], domain=MS)
    g = helper.make_graph([node], "bd", inputs, [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(MS, 1)])


@pytest.mark.parametrize(
    "op, residual, training, per_element",
    [
        pytest.param("BiasDropout", False, False, 1, id="bias-inference"),
        pytest.param("BiasDropout", True, False, 2, id="bias-residual-inference"),
        pytest.param("BiasDropout", True, True, 3, id="bias-residual-training"),
        pytest.param("BitmaskBiasDropout", True, True, 3, id="bitmask-bias-residual-training"),
    ],
)
def test_bias_dropout(op, residual, training, per_element):
    assert cost(dropout(op, residual, training)) == (per_element * 462, 0, 0, 0)


def test_bitmask_dropout_training():
    m = ms("BitmaskDropout", {"X": XE}, [const("ratio", 0.1, np.float32), const("training_mode", True, np.bool_)])
    assert cost(m) == (462, 0, 0, 0)


# --- softmax --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "axis, rows, n",
    [pytest.param(3, 3 * 5 * 7, 11, id="last-axis"), pytest.param(1, 3, 5 * 7 * 11, id="axis-1-coerced")],
)
def test_bias_softmax(axis, rows, n):
    m = ms("BiasSoftmax", {"data": (3, 5, 7, 11), "bias": (3, 1, 7, 11)}, axis=axis, is_inner_broadcast=0)
    assert cost(m) == (1155 + rows * (5 * n - 2), 0, 1155, 0)


# --- families -------------------------------------------------------------------------------
def test_dense_convention_drops_elementwise_and_normalization_fusions():
    assert cost(ms("BiasGelu", {"A": XE}, [weight("B", (22,))]), "dense") == (0, 0, 0, 0)
    assert cost(embed(), "dense") == (0, 0, 0, 0)


# -----------------------------------------------------------------------------------------------------------------
# Backward (training) formulas of the Microsoft contrib operators (domain com.microsoft).
#
# Each fused operator's backward is checked twice: against a closed form written here from the
# sizes, and against the same graph with the fused node replaced by the default-domain operators it
# fuses (built side by side; their backward formulas summed by flopcount must give the same total,
# and the same trainable parameters). A tensor "needs a gradient" either because it is a trainable
# initializer or because it comes out of a prefix ``x_data + x_w`` with a trainable ``x_w`` (whose own
# backward is free: same shapes, nothing summed), which makes ``x`` need a gradient at no cost.
# ONNX shape inference does not know the contrib operators: the cases whose formula needs an output
# shape declare it in the graph, as an onnxruntime-optimized model carries it in value_info.
#
# Sizes are distinct and odd where the operator allows: batch 3, sequence 7, key length 11, past 13,
# heads 5, head sizes 3 (Q/K) and 5 (V).
# -----------------------------------------------------------------------------------------------------------------


N = helper.make_node


def needs_grad(name, shape):
    """A prefix making ``name`` need a gradient: ``name = name_data + name_w`` (free backward)."""
    return N("Add", [f"{name}_data", f"{name}_w"], [name], name=f"make_{name}"), {f"{name}_data": shape}, \
        [weight(f"{name}_w", shape)]


def build(nodes, inputs, inits=(), shapes=None, grad=(), opset=24, outputs=("y",)):
    """A graph of ``nodes``. ``inputs``: name → shape (float) or (shape, dtype); ``grad``: name → shape
    of tensors that get a :func:`needs_grad` prefix; ``shapes``: declared float value_info (outputs
    included)."""
    nodes, inputs, inits = list(nodes), dict(inputs), list(inits)
    for name, shape in dict(grad).items():
        node, extra, w = needs_grad(name, shape)
        nodes.insert(0, node)
        inputs.update(extra)
        inits += w
    shapes = dict(shapes or {})
    graph_inputs = []
    for name, spec in inputs.items():
        shape, dtype = spec if spec and isinstance(spec[0], tuple) else (spec, F)  # (shape, dtype) or a shape
        graph_inputs.append(helper.make_tensor_value_info(name, dtype, shape))
    outs = [helper.make_tensor_value_info(o, F, shapes.pop(o)) if o in shapes else helper.make_empty_tensor_value_info(o)
            for o in outputs]
    g = helper.make_graph(nodes, "g", graph_inputs, outs, inits,
                          value_info=[helper.make_tensor_value_info(n, F, s) for n, s in shapes.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])


def ms_train(op, names, outputs=("y",), **attrs):
    return N(op, list(names), list(outputs), domain=MS, name="fused", **attrs)


def train(m, convention="default", **kw):
    return flopcount.count(m, mode="train", convention=convention, strict=True, **kw)


def fused(m, convention="default", **kw):
    """(FLOPs, MACs, transcendentals) of the fused node's backward."""
    node = next(n for n in train(m, convention, **kw).nodes if n.name == "fused")
    return tuple(node.backward)[:3]


def assert_same_as_unfused(fused_model, unfused_model, convention="default", **kw):
    a, b = train(fused_model, convention, **kw), train(unfused_model, convention, **kw)
    assert a.backward == b.backward
    assert a.trainable_params == b.trainable_params


def scalar(name, value):
    """A Constant node (not an initializer: never trained)."""
    return N("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, np.float32), name))


# --- convolution ----------------------------------------------------------------------------
# X (3, 5, 11, 13), W (7, 5, 3, 3), no padding: Y (3, 7, 9, 11)
X_CONV, Y_CONV_SHAPE = (3, 5, 11, 13), (3, 7, 9, 11)


def conv_models(*, bias=True, z=False, activation="", x_grad=False, z_grad=False, nhwc=False, op="FusedConv"):
    """(fused, unfused) graphs: FusedConv(X, W, B, Z) and Conv → Add → activation."""
    x_shape, y_shape = ((3, 11, 13, 5), (3, 9, 11, 7)) if nhwc else (X_CONV, Y_CONV_SHAPE)
    inits = [weight("W", (7, 5, 3, 3))] + ([weight("B", (7,))] if bias else [])
    inputs, grad = {}, {}
    (grad if x_grad else inputs)["X"] = x_shape
    if z:
        (grad if z_grad else inputs)["Z"] = y_shape
    attrs = {"activation": activation} if activation else {}
    fused_node = ms_train(op, ["X", "W", "B" if bias else ""] + (["Z"] if z else []), kernel_shape=[3, 3], **attrs)
    fused_model = build([fused_node], inputs, inits, {"y": y_shape}, grad)

    perm_in, perm_out = ([0, 3, 1, 2], [0, 2, 3, 1]) if nhwc else (None, None)
    nodes, x, c = [], "X", "c"
    if nhwc:
        nodes.append(N("Transpose", ["X"], ["x_nchw"], perm=perm_in))
        x = "x_nchw"
    nodes.append(N("Conv", [x, "W"] + (["B"] if bias else []), ["c_nchw" if nhwc else "c"]))
    if nhwc:
        nodes.append(N("Transpose", ["c_nchw"], ["c"], perm=perm_out))
    if z:
        nodes.append(N("Add", [c, "Z"], ["s"]))
        c = "s"
    nodes.append(N(activation, [c], ["y"]) if activation else N("Identity", [c], ["y"]))
    return fused_model, build(nodes, inputs, inits, {}, grad)


CONV_CASES_TRAIN = [
    # X fed by data: dW only (the forward MACs), dB = Σ dY (|Y|), Relu's mask (|Y|)
    pytest.param({"activation": "Relu"}, (2 * CONV_MACS + Y_CONV + Y_CONV, CONV_MACS, 0), id="first-layer-relu"),
    # X inside the network: dX and dW; Sigmoid's backward dY·y·(1 − y) is 3 per element; dZ = dS free
    pytest.param({"x_grad": True, "z": True, "activation": "Sigmoid"},
                 (4 * CONV_MACS + Y_CONV + 3 * Y_CONV, 2 * CONV_MACS, 0), id="inner-sum-sigmoid"),
    pytest.param({"bias": False}, (2 * CONV_MACS, CONV_MACS, 0), id="no-bias-no-activation"),
    pytest.param({"x_grad": True, "z": True, "z_grad": True, "activation": "Tanh", "nhwc": True, "op": "NhwcFusedConv"},
                 (4 * CONV_MACS + Y_CONV + 3 * Y_CONV, 2 * CONV_MACS, 0), id="nhwc-fused"),
    pytest.param({"x_grad": True, "nhwc": True, "op": "NhwcConv"}, (4 * CONV_MACS + Y_CONV, 2 * CONV_MACS, 0),
                 id="nhwc-conv"),
]


@pytest.mark.parametrize("opts, expected", CONV_CASES_TRAIN)
def test_fused_conv_backward(opts, expected):
    fused_model, unfused_model = conv_models(**opts)
    assert fused(fused_model) == expected
    assert_same_as_unfused(fused_model, unfused_model)


def test_fused_conv_gradient_of_z_only():
    # W and X are data, only Z is trained: the Relu's backward (|Y|) and nothing of the Conv
    node = ms_train("FusedConv", ["X", "W", "", "Z"], kernel_shape=[3, 3], activation="Relu")
    m = build([node], {"X": X_CONV, "W": (7, 5, 3, 3)}, [weight("Z", Y_CONV_SHAPE)], {"y": Y_CONV_SHAPE})
    assert fused(m) == (Y_CONV, 0, 0)


def test_fused_conv_table3_drops_the_bias_gradient():
    fused_model, _ = conv_models(activation="Relu")
    assert fused(fused_model, "table3") == (2 * CONV_MACS + Y_CONV, CONV_MACS, 0)


def test_fused_conv_dense_equals_torch_flop_counter():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.empty(X_CONV, device="meta", requires_grad=True)
    w = torch.empty((7, 5, 3, 3), device="meta", requires_grad=True)
    with FlopCounterMode(display=False) as forward_only:
        torch.nn.functional.conv2d(x, w)
    with FlopCounterMode(display=False) as both:
        torch.relu(torch.nn.functional.conv2d(x, w)).sum().backward()
    torch_backward = both.get_total_flops() - forward_only.get_total_flops()
    fused_model, _ = conv_models(x_grad=True, bias=False, activation="Relu")
    assert torch_backward == 4 * CONV_MACS  # derived: dX and dW, 2 FLOPs per MAC each
    assert fused(fused_model, "dense")[0] == torch_backward


# --- matrix products ------------------------------------------------------------------------
# Y (3, 7, 13) from A (3, 7, 11)·B (3, 11, 13): MACs = 3·7·13·11 = 3003, |Y| = 273
MM_MACS, MM_Y = 3 * 7 * 13 * 11, 3 * 7 * 13


A_SHAPES = {(): (3, 7, 11), ("transA",): (3, 11, 7), ("transBatchA",): (7, 3, 11), ("transA", "transBatchA"): (11, 3, 7)}


A_PERMS = {(): None, ("transA",): [0, 2, 1], ("transBatchA",): [1, 0, 2], ("transA", "transBatchA"): [1, 2, 0]}


def matmul_models(flags=(), *, alpha=1.0, a_grad=False, op="FusedMatMul", activation=""):
    a_shape = A_SHAPES[flags]
    attrs = {f: 1 for f in flags} | ({"alpha": alpha} if alpha != 1.0 else {})
    attrs |= {"activation": activation} if activation else {}
    inputs, grad = ({}, {"A": a_shape}) if a_grad else ({"A": a_shape}, {})
    inits = [weight("B", (3, 11, 13))]
    fused_model = build([ms_train(op, ["A", "B"], **attrs)], inputs, inits, {"y": (3, 7, 13)}, grad)

    nodes, a = [], "A"
    if A_PERMS[flags]:
        nodes.append(N("Transpose", ["A"], ["a_t"], perm=A_PERMS[flags]))
        a = "a_t"
    nodes.append(N("MatMul", [a, "B"], ["p"]))
    p = "p"
    if alpha != 1.0:
        nodes += [scalar("alpha", alpha), N("Mul", ["p", "alpha"], ["q"])]
        p = "q"
    nodes.append(N(activation, [p], ["y"]) if activation else N("Identity", [p], ["y"]))
    return fused_model, build(nodes, inputs, inits, {}, grad)


MATMUL_CASES_TRAIN = [
    pytest.param((), {}, (2 * MM_MACS, MM_MACS, 0), id="first-layer-dB-only"),
    pytest.param((), {"a_grad": True}, (4 * MM_MACS, 2 * MM_MACS, 0), id="inner-dA-dB"),
    pytest.param(("transA",), {"a_grad": True}, (4 * MM_MACS, 2 * MM_MACS, 0), id="transA"),
    pytest.param(("transBatchA",), {"a_grad": True}, (4 * MM_MACS, 2 * MM_MACS, 0), id="transBatchA"),
    pytest.param(("transA", "transBatchA"), {"a_grad": True}, (4 * MM_MACS, 2 * MM_MACS, 0), id="both-transposes"),
    # dP = alpha·dY: one multiply per element of Y
    pytest.param((), {"a_grad": True, "alpha": 0.125}, (4 * MM_MACS + MM_Y, 2 * MM_MACS, 0), id="alpha"),
    # Tanh's backward dY·(1 − y²): 3 per element
    pytest.param((), {"a_grad": True, "alpha": 0.5, "activation": "Tanh", "op": "FusedMatMulActivation"},
                 (4 * MM_MACS + MM_Y + 3 * MM_Y, 2 * MM_MACS, 0), id="activation-tanh-alpha"),
]


@pytest.mark.parametrize("flags, opts, expected", MATMUL_CASES_TRAIN)
def test_fused_matmul_backward(flags, opts, expected):
    fused_model, unfused_model = matmul_models(flags, **opts)
    assert fused(fused_model) == expected
    assert_same_as_unfused(fused_model, unfused_model)


def test_transpose_matmul_with_transposed_b():
    # B (3, 13, 11) transposed: K = 11 still read from A
    node = N("TransposeMatMul", ["A", "B"], ["y"], domain=MS, name="fused", transB=1)
    m = build([node], {}, [weight("B", (3, 13, 11))], {"y": (3, 7, 13)}, {"A": (3, 7, 11)})
    assert fused(m) == (4 * MM_MACS, 2 * MM_MACS, 0)


def test_fused_matmul_table3_one_flop_per_mac_no_alpha():
    fused_model, _ = matmul_models(alpha=0.125, a_grad=True)
    assert fused(fused_model, "table3") == (2 * MM_MACS, 2 * MM_MACS, 0)


def test_fused_matmul_dense_equals_torch_flop_counter():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    a = torch.empty((3, 11, 7), device="meta", requires_grad=True)  # transA
    b = torch.empty((3, 11, 13), device="meta", requires_grad=True)
    with FlopCounterMode(display=False) as forward_only:
        torch.matmul(a.transpose(1, 2), b)
    with FlopCounterMode(display=False) as both:
        torch.matmul(a.transpose(1, 2), b).sum().backward()
    torch_backward = both.get_total_flops() - forward_only.get_total_flops()
    assert torch_backward == 4 * MM_MACS
    assert fused(matmul_models(("transA",), a_grad=True)[0], "dense")[0] == torch_backward


# FusedGemm: A (7, 11)·B (11, 13) + C (13): M·K·N = 1001 MACs, M·N = 91
def gemm_models(*, a_grad=False, activation="", **attrs):
    a_shape = (11, 7) if attrs.get("transA") else (7, 11)
    inputs, grad = ({}, {"A": a_shape}) if a_grad else ({"A": a_shape}, {})
    inits = [weight("B", (11, 13)), weight("C", (13,))]
    act = {"activation": activation} if activation else {}
    fused_model = build([ms_train("FusedGemm", ["A", "B", "C"], **act, **attrs)], inputs, inits, {"y": (7, 13)}, grad)
    nodes = [N("Gemm", ["A", "B", "C"], ["p"], **attrs), N(activation or "Identity", ["p"], ["y"])]
    return fused_model, build(nodes, inputs, inits, {}, grad)


@pytest.mark.parametrize(
    "opts, expected",
    [
        # dB (1001 MACs), dC = Σ dY (91), LeakyRelu's mask (91)
        pytest.param({"activation": "LeakyRelu"}, (2 * 1001 + 91 + 91, 1001, 0), id="first-layer-leaky-relu"),
        # dA and dB; dC 91 + |C| = 13 for beta ≠ 1; alpha·dY 91; Tanh 3·91
        pytest.param({"a_grad": True, "activation": "Tanh", "transA": 1, "alpha": 2.0, "beta": 0.5},
                     (4 * 1001 + 91 + 13 + 91 + 3 * 91, 2 * 1001, 0), id="inner-transA-alpha-beta-tanh"),
    ],
)
def test_fused_gemm_backward(opts, expected):
    fused_model, unfused_model = gemm_models(**opts)
    assert fused(fused_model) == expected
    assert_same_as_unfused(fused_model, unfused_model)


# GemmFastGelu: X (3, 7, 11)·W (11, 13) + bias (13): |Y| = 273, MACs = 3003
def gemm_fast_gelu_models(*, bias=True, x_grad=False):
    inputs, grad = ({}, {"X": (3, 7, 11)}) if x_grad else ({"X": (3, 7, 11)}, {})
    inits = [weight("W", (11, 13))] + ([weight("bias", (13,))] if bias else [])
    fused_model = build([ms_train("GemmFastGelu", ["X", "W"] + (["bias"] if bias else []))], inputs, inits, {}, grad)
    nodes = [N("MatMul", ["X", "W"], ["p"])]
    if bias:
        nodes.append(N("Add", ["p", "bias"], ["q"]))
    nodes.append(N("Gelu", ["q" if bias else "p"], ["y"], approximate="tanh"))
    return fused_model, build(nodes, inputs, inits, {}, grad)


@pytest.mark.parametrize(
    "opts, expected",
    [
        # dW 3003 MACs; dbias = Σ over 21 tokens: 273 − 13; Gelu's backward 7 per element, one transcendental
        pytest.param({}, (2 * 3003 + (273 - 13) + 7 * 273, 3003, 273), id="first-layer"),
        pytest.param({"x_grad": True}, (4 * 3003 + (273 - 13) + 7 * 273, 2 * 3003, 273), id="inner"),
        pytest.param({"bias": False}, (2 * 3003 + 7 * 273, 3003, 273), id="no-bias"),
    ],
)
def test_gemm_fast_gelu_backward(opts, expected):
    fused_model, unfused_model = gemm_fast_gelu_models(**opts)
    assert fused(fused_model) == expected
    assert_same_as_unfused(fused_model, unfused_model)


def test_gemm_fast_gelu_table3_drops_the_bias_gradient():
    assert fused(gemm_fast_gelu_models()[0], "table3") == (3003 + 7 * 273, 3003, 273)


def test_matmul_nbits_is_not_trained():
    node = N("MatMulNBits", ["A", "B", "scales"], ["y"], domain=MS, name="fused", K=96, N=13, bits=4, block_size=32)
    m = build([node], {}, [weight("B", (13, 3, 16), TensorProto.UINT8), weight("scales", (13, 3))], {},
              {"A": (3, 5, 96)})
    r = flopcount.count(m, mode="train")
    assert r.backward_unsupported == {"com.microsoft:MatMulNBits": 1}
    with pytest.raises(flopcount.UnsupportedOperatorError):
        train(m)


# --- attention ------------------------------------------------------------------------------
B, S, L, P, H, E, EV = 3, 7, 11, 13, 5, 3, 5


def core_backward(t, *, q=True, k=True, v=True, h_kv=H, e_v=EV, s=S):
    """(FLOPs, MACs) of the attention core's backward written out: dV = Pᵀ·dO (R·T·E_v MACs); dP =
    dO·Vᵀ (R·T·E_v), dS through the softmax R·(4T − 1), dQ = dS·K and dK = dSᵀ·Q (R·T·E each), the
    √scale on dQ (R·E) and dK (B·H_kv·T·E)."""
    rows = B * H * s
    macs = rows * t * e_v * v
    flops = 0
    if q or k:
        macs += rows * t * e_v + rows * t * E * (q + k)
        flops += rows * (4 * t - 1) + rows * E * q + B * h_kv * t * E * k
    return 2 * macs + flops, macs


def ms_attention_models(*, qkv=(15, 15, 25), x_grad=False, past=False, bias=True, **attrs):
    """Attention over input (3, 7, 37), weights (37, D_q + D_k + D_v), and the unfused graph: MatMul,
    Add, Split, ONNX Attention (3-D, 5 heads)."""
    width = sum(qkv)
    inputs, grad = ({}, {"input": (B, S, 37)}) if x_grad else ({"input": (B, S, 37)}, {})
    inits = [weight("weights", (37, width))] + ([weight("bias", (width,))] if bias else [])
    names = ["input", "weights", "bias" if bias else ""]
    if past:
        inputs["past"] = (2, B, H, P, E)
        names += ["", "past"]
    if qkv != (15, 15, 15):
        attrs["qkv_hidden_sizes"] = list(qkv)
    outs = ["y", "present"] if past else ["y"]
    fused_model = build([ms_train("Attention", names, outs, num_heads=H, **attrs)], inputs, inits, {}, grad)

    std_inputs = {k: v for k, v in inputs.items() if k != "past"}
    nodes = [N("MatMul", ["input", "weights"], ["qkv0"])]
    if bias:
        nodes.append(N("Add", ["qkv0", "bias"], ["qkv"]))
    nodes.append(N("Split", ["qkv" if bias else "qkv0", "sizes"], ["q", "k", "v"], axis=2))
    att_in = ["q", "k", "v"]
    if past:
        std_inputs["past_key"], std_inputs["past_value"] = (B, H, P, E), (B, H, P, E)
        att_in += ["", "past_key", "past_value"]
    nodes.append(N("Attention", att_in, ["y"], q_num_heads=H, kv_num_heads=H,
                   is_causal=attrs.get("unidirectional", 0)))
    std = build(nodes, std_inputs, inits + [const("sizes", list(qkv))], {}, grad)
    return fused_model, std


# projection: B·S·37·55 MACs per dX and dW; dbias = Σ over B·S = 21 tokens: 21·55 − 55
PROJ_MACS, DBIAS = B * S * 37 * 55, B * S * 55 - 55


def ms_attention_expected(t=S, *, x_grad=False, bias=True, rotary=0, e_v=EV, width=55):
    proj = B * S * 37 * width * (1 + x_grad)
    f, m = core_backward(t, e_v=e_v)
    return 2 * proj + f + ((B * S * width - width) if bias else 0) + rotary, proj + m, 0


@pytest.mark.parametrize(
    "opts, expected",
    [
        # input fed by data: dW and dbias, then Q, K, V need gradients through the projection
        pytest.param({}, ms_attention_expected(), id="first-layer"),
        pytest.param({"x_grad": True}, ms_attention_expected(x_grad=True), id="inner"),
        pytest.param({"bias": False}, ms_attention_expected(bias=False), id="no-bias"),
        pytest.param({"unidirectional": 1}, ms_attention_expected(), id="causal-changes-nothing"),
        pytest.param({"qkv": (15, 15, 15), "past": True}, ms_attention_expected(P + S, e_v=E, width=45),
                     id="past"),
    ],
)
def test_ms_attention_backward(opts, expected):
    fused_model, unfused_model = ms_attention_models(**opts)
    assert fused(fused_model) == expected
    assert_same_as_unfused(fused_model, unfused_model)


def test_ms_attention_rotary():
    # the rotary backward rotates dQ and dK back: 3 FLOPs per element of Q and K (D_rot = E = 3)
    fused_model, _ = ms_attention_models(do_rotary=1)
    assert fused(fused_model) == ms_attention_expected(rotary=3 * B * S * 30)


def test_ms_attention_dense_equals_torch_flop_counter():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    def attention(x, w):
        q, k, v = (x @ w).split([15, 15, 25], dim=-1)
        q, k, v = (t.reshape(B, S, H, -1).transpose(1, 2) for t in (q, k, v))
        return (torch.softmax(q @ k.transpose(-1, -2), -1) @ v).sum()

    x = torch.empty((B, S, 37), device="meta")  # data: no gradient
    w = torch.empty((37, 55), device="meta", requires_grad=True)
    with FlopCounterMode(display=False) as forward_only:
        attention(x, w)
    with FlopCounterMode(display=False) as both:
        attention(x, w).backward()
    torch_backward = both.get_total_flops() - forward_only.get_total_flops()
    # dW, and the core's four products: 2·(PROJ_MACS + R·T·(2·E_v + 2·E))
    assert torch_backward == 2 * (PROJ_MACS + B * H * S * S * (2 * EV + 2 * E))
    assert fused(ms_attention_models(bias=False)[0], "dense")[0] == torch_backward


# MultiHeadAttention: query (3, 7, 15), key (3, 11, 15), value (3, 11, 25), bias (55)
Q3, K3, V3 = (B, S, H * E), (B, L, H * E), (B, L, H * EV)


def mha_models(q_shape=Q3, k_shape=K3, v_shape=V3, *, bias=False, grad=(), **attrs):
    shapes = {"query": q_shape, "key": k_shape, "value": v_shape}
    shapes = {n: s for n, s in shapes.items() if s is not None}
    inputs = {n: s for n, s in shapes.items() if n not in grad}
    grads = {n: s for n, s in shapes.items() if n in grad}
    inits = [weight("bias", (55,))] if bias else []
    names = [n if n in shapes else "" for n in ("query", "key", "value")] + (["bias"] if bias else [])
    while not names[-1]:
        names.pop()
    fused_model = build([ms_train("MultiHeadAttention", names, num_heads=H, **attrs)], inputs, inits, {}, grads)
    if len(q_shape) == 5 or (k_shape is not None and len(k_shape) != 3):
        return fused_model, None
    nodes, q, k, v = [], "query", "key", "value"
    if bias:
        nodes += [N("Split", ["bias", "sizes"], ["bq", "bk", "bv"], axis=0), N("Add", ["query", "bq"], ["q"]),
                  N("Add", ["key", "bk"], ["k"]), N("Add", ["value", "bv"], ["v"])]
        q, k, v = "q", "k", "v"
        inits = inits + [const("sizes", [15, 15, 25])]
    nodes.append(N("Attention", [q, k, v], ["y"], q_num_heads=H, kv_num_heads=H))
    return fused_model, build(nodes, inputs, inits, {}, grads)


@pytest.mark.parametrize(
    "q, k, v, opts, expected",
    [
        # the bias makes Q, K and V need gradients; dbias sums each over its tokens
        pytest.param(Q3, K3, V3, {"bias": True},
                     (core_backward(L)[0] + (B * S * 15 - 15) + (B * L * 15 - 15) + (B * L * 25 - 25),
                      core_backward(L)[1], 0), id="bias-trained"),
        # only the query needs a gradient: dP and dQ, no dK and no dV
        pytest.param(Q3, K3, V3, {"grad": ("query",)}, (*core_backward(L, k=False, v=False), 0), id="query-only"),
        pytest.param(Q3, K3, V3, {"grad": ("value",)}, (*core_backward(L, q=False, k=False), 0), id="value-only"),
        # BNSH keys and values are already projected: the bias reaches Q only
        pytest.param(Q3, (B, H, L, E), (B, H, L, EV), {"bias": True},
                     (core_backward(L, k=False, v=False)[0] + B * S * 15 - 15, core_backward(L, k=False, v=False)[1], 0),
                     id="bnsh-kv-bias"),
        pytest.param((B, S, H, 3, E), None, None, {"grad": ("query",)}, (*core_backward(S, e_v=E), 0),
                     id="packed-qkv"),
    ],
)
def test_multi_head_attention_backward(q, k, v, opts, expected):
    fused_model, unfused_model = mha_models(q, k, v, **opts)
    assert fused(fused_model) == expected
    if unfused_model is not None:
        assert_same_as_unfused(fused_model, unfused_model)


def test_multi_head_attention_table3_drops_the_bias_gradient():
    fused_model, _ = mha_models(bias=True)
    f, m = core_backward(L)
    assert fused(fused_model, "table3") == (f - m, m, 0)  # products at one FLOP per MAC, no dbias


# GroupQueryAttention: 5 query heads, 1 KV head, head size 3, past 13: T = 20
def gqa_models(h_kv=1, *, grad=("query", "key", "value"), qk_norm=False, head_sink=False, rotary=False, **attrs):
    shapes = {"query": (B, S, H * E), "key": (B, S, h_kv * E), "value": (B, S, h_kv * E)}
    inputs = {n: s for n, s in shapes.items() if n not in grad}
    grads = {n: s for n, s in shapes.items() if n in grad}
    inputs["past_key"], inputs["past_value"] = (B, h_kv, P, E), (B, h_kv, P, E)
    inputs["seqlens_k"] = ((B,), I32)
    inits = [weight("total_sequence_length", (), I32)]
    names = ["query", "key", "value", "past_key", "past_value", "seqlens_k", "total_sequence_length"] + [""] * 9
    if rotary:
        inits += [weight("cos_cache", (32, 1)), weight("sin_cache", (32, 1))]
        names[7:9] = ["cos_cache", "sin_cache"]
        attrs["do_rotary"] = 1
    if head_sink:
        inits.append(weight("head_sink", (H,)))
        names[11] = "head_sink"
    if qk_norm:
        inits += [weight("q_norm_weight", (E,)), weight("k_norm_weight", (E,))]
        names[14:16] = ["q_norm_weight", "k_norm_weight"]
    while not names[-1]:
        names.pop()
    fused_model = build([ms_train("GroupQueryAttention", names, num_heads=H, kv_num_heads=h_kv, **attrs)], inputs, inits,
                        {}, grads)
    if head_sink or rotary:
        return fused_model, None
    std_inputs = {n: s for n, s in inputs.items() if n != "seqlens_k"}
    nodes, q, k = [], "query", "key"
    std_inits = []
    if qk_norm:
        std_inits = [weight("q_norm_weight", (E,)), weight("k_norm_weight", (E,)),
                     const("q4", [B, S, H, E]), const("k4", [B, S, h_kv, E]), const("flat", [B, S, -1])]
        nodes += [N("Reshape", ["query", "q4"], ["q_heads"]), N("RMSNormalization", ["q_heads", "q_norm_weight"], ["qn"]),
                  N("Reshape", ["qn", "flat"], ["q"]), N("Reshape", ["key", "k4"], ["k_heads"]),
                  N("RMSNormalization", ["k_heads", "k_norm_weight"], ["kn"]), N("Reshape", ["kn", "flat"], ["k"])]
        q, k = "q", "k"
    nodes.append(N("Attention", [q, k, "value", "", "past_key", "past_value"], ["y"], q_num_heads=H,
                   kv_num_heads=h_kv, is_causal=1))
    return fused_model, build(nodes, std_inputs, std_inits, {}, grads)


R_GQA, T_GQA = B * H * S, P + S


@pytest.mark.parametrize(
    "opts, expected",
    [
        pytest.param({}, (*core_backward(T_GQA, h_kv=1, e_v=E), 0), id="mqa"),
        pytest.param({"h_kv": 5}, (*core_backward(T_GQA, h_kv=5, e_v=E), 0), id="mha"),
        pytest.param({"grad": ("value",)}, (*core_backward(T_GQA, q=False, k=False, h_kv=1, e_v=E), 0),
                     id="value-only"),
        # Q/K norm weights trained, query and key data: Q and K need gradients through the norms
        # (2 per element of Q and K for the norm weights); V needs none
        pytest.param({"grad": (), "qk_norm": True},
                     (core_backward(T_GQA, v=False, h_kv=1, e_v=E)[0] + 2 * B * S * H * E + 2 * B * S * 1 * E,
                      core_backward(T_GQA, v=False, h_kv=1, e_v=E)[1], 0), id="qk-norm-weights"),
        pytest.param({"qk_norm": True},
                     (core_backward(T_GQA, h_kv=1, e_v=E)[0] + 7 * B * S * H * E + 7 * B * S * 1 * E,
                      core_backward(T_GQA, h_kv=1, e_v=E)[1], 0), id="qk-norm-inner"),
        pytest.param({"softcap": 30.0, "local_window_size": 4}, (*core_backward(T_GQA, h_kv=1, e_v=E), 0),
                     id="softcap-window-as-onnx-attention"),
    ],
)
def test_group_query_attention_backward(opts, expected):
    fused_model, unfused_model = gqa_models(**opts)
    assert fused(fused_model) == expected
    if unfused_model is not None:
        assert_same_as_unfused(fused_model, unfused_model)


def test_gqa_head_sink_gradient():
    # query, key, value data: only the sink is trained. Per score row exp(sink − L) (2) times the
    # row's Σ dP·P (1), summed over each head's 21 rows (R − H additions); one exp per row
    assert fused(gqa_models(grad=(), head_sink=True)[0]) == (4 * R_GQA - H, 0, R_GQA)


def test_gqa_rotary_and_its_caches_are_buffers():
    fused_model, _ = gqa_models(rotary=True)
    # D_rot = 2·1 of each head; dQ (5 heads) and dK (1 head) rotated back, 3 FLOPs per rotated element
    f, m = core_backward(T_GQA, h_kv=1, e_v=E)
    assert fused(fused_model) == (f + 3 * B * S * 2 * (H + 1), m, 0)
    r = train(fused_model)
    assert r.trainable_params == B * S * (H * E + 2 * E)  # the prefixes' weights; no cos/sin cache


def rotary_model(x, cos, *, grad=True, **attrs):
    inits = [weight("cos", cos), weight("sin", cos)]
    node = ms_train("RotaryEmbedding", ["X", "position_ids", "cos", "sin"], **attrs)
    inputs = {"position_ids": ((1, x[-2] if len(x) == 4 else x[1]), I64)}
    if not grad:
        inputs["X"] = x
    return build([node], inputs, inits, {}, {"X": x} if grad else {})


@pytest.mark.parametrize(
    "x, cos, attrs, rotated",
    [
        pytest.param((3, 7, 30), (32, 3), {"num_heads": 5}, 3 * 7 * 30, id="3d-full"),
        pytest.param((3, 7, 30), (32, 2), {"num_heads": 5, "rotary_embedding_dim": 4}, 3 * 7 * 5 * 4, id="3d-partial"),
        pytest.param((3, 5, 7, 6), (32, 2), {}, 3 * 5 * 7 * 4, id="4d-partial"),
    ],
)
def test_rotary_embedding_backward(x, cos, attrs, rotated):
    m = rotary_model(x, cos, **attrs)
    assert fused(m) == (3 * rotated, 0, 0)
    assert train(m).trainable_params == np.prod(x)  # the prefix weight only: caches are buffers


def test_rotary_embedding_of_data_has_no_backward():
    r = train(rotary_model((3, 7, 30), (32, 3), grad=False, num_heads=5))
    assert r.backward.flops == 0 and r.trainable_params == 0


N3 = 231


def skip_ln_models(op="SkipLayerNormalization", *, grad=(), trained=("gamma", "beta"), bias=False, beta=True):
    """SkipLayerNormalization(input, skip (1, 7, 11), gamma, beta, bias) and Add, Add, LayerNormalization."""
    rms = op == "SkipSimplifiedLayerNormalization"
    shapes = {"input": X3, "skip": (1, 7, 11), "gamma": (11,), "beta": (11,), "bias": (11,)}
    used = ["input", "skip", "gamma"] + ([] if rms or not beta else ["beta"]) + (["bias"] if bias else [])
    inputs = {n: shapes[n] for n in used if n not in grad and n not in trained}
    grads = {n: shapes[n] for n in used if n in grad}
    inits = [weight(n, shapes[n]) for n in used if n in trained]
    names = ["input", "skip", "gamma"] + ([] if rms else ["beta" if beta else ""]) + (["bias"] if bias else [])
    fused_model = build([ms_train(op, names)], inputs, inits, {}, grads)
    nodes = [N("Add", ["input", "skip"], ["t"])]
    s = "t"
    if bias:
        nodes.append(N("Add", ["t", "bias"], ["s"]))
        s = "s"
    if rms:
        nodes.append(N("RMSNormalization", [s, "gamma"], ["y"]))
    else:
        nodes.append(N("LayerNormalization", [s, "gamma"] + (["beta"] if beta else []), ["y"]))
    return fused_model, build(nodes, inputs, inits, {}, grads)


SKIP_LN_CASES = [
    # input and skip are data: dγ = Σ dY·x̂ (2 per element), dβ = Σ dY (1 per element)
    pytest.param({}, (3 * N3, 0, 0), id="first-layer-gamma-beta"),
    pytest.param({"beta": False}, (2 * N3, 0, 0), id="no-beta"),
    # a trained bias makes S need a gradient: 7 per element; dbias sums 21 rows: 231 − 11
    pytest.param({"bias": True, "trained": ("gamma", "beta", "bias")}, (7 * N3 + N3 - 11, 0, 0), id="trained-bias"),
    # input inside the network, skip trained and broadcast over the batch: dskip = 231 − 77
    pytest.param({"grad": ("input",), "trained": ("gamma", "beta", "skip")}, (7 * N3 + N3 - 77, 0, 0),
                 id="inner-trained-skip"),
    pytest.param({"op": "SkipSimplifiedLayerNormalization"}, (2 * N3, 0, 0), id="rms-first-layer"),
    pytest.param({"op": "SkipSimplifiedLayerNormalization", "grad": ("input",), "bias": True,
                  "trained": ("gamma", "bias")}, (7 * N3 + N3 - 11, 0, 0), id="rms-inner-bias"),
]


@pytest.mark.parametrize("opts, expected", SKIP_LN_CASES)
def test_skip_layer_norm_backward(opts, expected):
    fused_model, unfused_model = skip_ln_models(**opts)
    assert fused(fused_model) == expected
    assert_same_as_unfused(fused_model, unfused_model)


@pytest.mark.parametrize("grad, expected", [pytest.param(False, 2 * N3, id="scale-only"),
                                            pytest.param(True, 7 * N3, id="inner")])
def test_simplified_layer_norm_backward_default_domain(grad, expected):
    node = N("SimplifiedLayerNormalization", ["X", "scale"], ["y"], name="fused", axis=-1)
    inits = [weight("scale", (11,))]
    m = build([node], {} if grad else {"X": X3}, inits, {}, {"X": X3} if grad else {})
    std = build([N("RMSNormalization", ["X", "scale"], ["y"], axis=-1)], {} if grad else {"X": X3}, inits, {},
                {"X": X3} if grad else {})
    assert fused(m) == (expected, 0, 0)
    assert_same_as_unfused(m, std)


def embed_models(*, segment=True, tables_trained=True):
    """EmbedLayerNormalization over ids (3, 7), width 13 (21 tokens, 273 elements), and Gather,
    Gather by position ids (1, 7), Add (broadcast over the batch), Gather, Add, LayerNormalization."""
    tables = {"word": (101, 13), "position": (29, 13)} | ({"segment": (2, 13)} if segment else {})
    inputs = {"input_ids": ((3, 7), I32)} | ({"segment_ids": ((3, 7), I32)} if segment else {})
    inits = [weight("gamma", (13,)), weight("beta", (13,))]
    if tables_trained:
        inits += [weight(n, s) for n, s in tables.items()]
    else:
        inputs |= tables
    names = ["input_ids", "segment_ids" if segment else "", "word", "position", "segment" if segment else "",
             "gamma", "beta"]
    fused_model = build([ms_train("EmbedLayerNormalization", names, ["y", "mask_index"])], inputs, inits, {})
    nodes = [N("Gather", ["word", "input_ids"], ["w"]), N("Gather", ["position", "position_ids"], ["p"]),
             N("Add", ["w", "p"], ["wp"])]
    s = "wp"
    if segment:
        nodes += [N("Gather", ["segment", "segment_ids"], ["g"]), N("Add", ["wp", "g"], ["s"])]
        s = "s"
    nodes.append(N("LayerNormalization", [s, "gamma", "beta"], ["y"]))
    std = build(nodes, inputs, inits + [const("position_ids", [list(range(7))])], {})
    return fused_model, std


@pytest.mark.parametrize(
    "opts, expected",
    [
        # each trained table: the scatter-add of dS, 273; LayerNormalization with dS: 7·273
        pytest.param({}, (3 * 273 + 7 * 273, 0, 0), id="bert"),
        pytest.param({"segment": False}, (2 * 273 + 7 * 273, 0, 0), id="no-segment"),
        pytest.param({"tables_trained": False}, (3 * 273, 0, 0), id="frozen-tables"),
    ],
)
def test_embed_layer_norm_backward(opts, expected):
    fused_model, unfused_model = embed_models(**opts)
    assert fused(fused_model) == expected
    assert_same_as_unfused(fused_model, unfused_model)


# GroupNorm, NHWC X (3, 5, 7, 10), 5 groups: |X| = 1050
XG = (3, 5, 7, 10)


def group_norm_models(op="GroupNorm", *, activation=0, grad=(), trained=("gamma", "beta"), bias=False):
    shapes = {"X": XG, "gamma": (10,), "beta": (10,), "skip": (3, 1, 1, 10), "bias": (10,)}
    used = ["X", "gamma", "beta"] + (["skip"] + (["bias"] if bias else []) if op == "SkipGroupNorm" else [])
    inputs = {n: shapes[n] for n in used if n not in grad and n not in trained}
    grads = {n: shapes[n] for n in used if n in grad}
    inits = [weight(n, shapes[n]) for n in used if n in trained]
    fused_model = build([ms_train(op, used, groups=5, activation=activation, channels_last=1)], inputs, inits, {}, grads)
    nodes, x = [], "X"
    if op == "SkipGroupNorm":
        nodes.append(N("Add", ["X", "skip"], ["t"]))
        x = "t"
        if bias:
            nodes.append(N("Add", ["t", "bias"], ["s"]))
            x = "s"
    nodes += [N("Transpose", [x], ["x_nchw"], perm=[0, 3, 1, 2]),
              N("GroupNormalization", ["x_nchw", "gamma", "beta"], ["n_nchw"], num_groups=5),
              N("Transpose", ["n_nchw"], ["n"], perm=[0, 2, 3, 1]), N("Swish" if activation else "Identity", ["n"], ["y"])]
    # onnx infers no output shape for GroupNormalization: declared, as for the contrib nodes
    return fused_model, build(nodes, inputs, inits, {"n_nchw": (3, 10, 5, 7)}, grads)


@pytest.mark.parametrize(
    "op, opts, expected",
    [
        # X data: dγ (2·|X|), dβ (|X|); SiLU's backward 5 per element, one exp
        pytest.param("GroupNorm", {"activation": 1}, (3 * 1050 + 5 * 1050, 0, 1050), id="group-norm-silu"),
        pytest.param("GroupNorm", {"grad": ("X",)}, (7 * 1050, 0, 0), id="group-norm-inner"),
        # trained skip (3, 1, 1, 10) and bias: S needs a gradient; dskip 1050 − 30, dbias 1050 − 10
        pytest.param("SkipGroupNorm", {"activation": 1, "bias": True, "trained": ("gamma", "beta", "skip", "bias")},
                     (7 * 1050 + (1050 - 30) + (1050 - 10) + 5 * 1050, 0, 1050), id="skip-group-norm-silu"),
        pytest.param("SkipGroupNorm", {}, (3 * 1050, 0, 0), id="skip-group-norm-first-layer"),
    ],
)
def test_group_norm_backward(op, opts, expected):
    fused_model, unfused_model = group_norm_models(op, **opts)
    assert fused(fused_model) == expected
    assert_same_as_unfused(fused_model, unfused_model)


def elementwise_models(op, unfused, *, x_grad=True, bias=None, extra=(), **attrs):
    """``op``(X [, bias] [, extra ...]) and the unfused nodes (which read X, bias, extra and write y)."""
    inputs, grads = ({}, {"X": XE}) if x_grad else ({"X": XE}, {})
    inits = ([weight("bias", bias)] if bias else []) + [weight(n, s) for n, s in extra]
    names = ["X"] + (["bias"] if bias else []) + [n for n, _ in extra]
    fused_model = build([ms_train(op, names, **attrs)], inputs, inits, {}, grads)
    return fused_model, build(unfused, inputs, inits, {}, grads)


ELEMENTWISE_CASES = [
    # Gelu's backward dY·(Φ(x) + x·φ(x)): 7 per element, one transcendental
    pytest.param("Gelu", {}, [N("Gelu", ["X"], ["y"])], (7 * 462, 0, 462), id="gelu"),
    # X data, bias trained: dbias sums 21 rows: 462 − 22
    pytest.param("FastGelu", {"x_grad": False, "bias": (22,)},
                 [N("Add", ["X", "bias"], ["s"]), N("Gelu", ["s"], ["y"], approximate="tanh")],
                 (7 * 462 + 462 - 22, 0, 462), id="fast-gelu-bias"),
    pytest.param("FastGelu", {}, [N("Gelu", ["X"], ["y"], approximate="tanh")], (7 * 462, 0, 462),
                 id="fast-gelu-inner"),
    pytest.param("BiasGelu", {"bias": (22,)}, [N("Add", ["X", "bias"], ["s"]), N("Gelu", ["s"], ["y"])],
                 (7 * 462 + 462 - 22, 0, 462), id="bias-gelu"),
    # Swish's backward: 5 per element, one exp
    pytest.param("QuickGelu", {"alpha": 1.702}, [N("Swish", ["X"], ["y"], alpha=1.702)], (5 * 462, 0, 462),
                 id="quick-gelu"),
    pytest.param("ScaledSiLU", {"alpha": 0.5},
                 [scalar("alpha", 0.5), N("Mul", ["X", "alpha"], ["s"]), N("Swish", ["s"], ["y"])],
                 (6 * 462, 0, 462), id="scaled-silu"),
    # halves of 231: dL = dY·G and dG = dY·L (2·231), Gelu's backward of R (7·231), dbias 462 − 22
    pytest.param("BiasSplitGelu", {"x_grad": False, "bias": (22,)},
                 [N("Add", ["X", "bias"], ["s"]), N("Split", ["s"], ["l", "r"], axis=-1, num_outputs=2),
                  N("Gelu", ["r"], ["g"]), N("Mul", ["l", "g"], ["y"])],
                 (2 * 231 + 7 * 231 + 462 - 22, 0, 231), id="bias-split-gelu"),
    # X data; dbias 462 − 22; the skip has X's shape: nothing to sum
    pytest.param("BiasAdd", {"x_grad": False, "bias": (22,), "extra": [("skip", XE)]},
                 [N("Add", ["X", "bias"], ["t"]), N("Add", ["t", "skip"], ["y"])], (462 - 22, 0, 0), id="bias-add"),
]


@pytest.mark.parametrize("op, opts, unfused, expected", ELEMENTWISE_CASES)
def test_elementwise_backward(op, opts, unfused, expected):
    fused_model, unfused_model = elementwise_models(op, unfused, **opts)
    assert fused(fused_model) == expected
    assert_same_as_unfused(fused_model, unfused_model)


def test_elementwise_of_data_has_no_backward():
    fused_model, _ = elementwise_models("Gelu", [N("Gelu", ["X"], ["y"])], x_grad=False)
    r = train(fused_model)
    assert r.backward.flops == 0 and r.trainable_params == 0


def dropout_models(op, *, residual, training):
    names = ["data", "bias", "residual" if residual else "", "ratio", "training_mode"]
    inits = [weight("bias", (22,)), const("ratio", 0.1, np.float32), const("training_mode", training, np.bool_)]
    inputs = {"data": XE} | ({"residual": XE} if residual else {})
    fused_model = build([ms_train(op, names)], inputs, inits, {})
    nodes = [N("Add", ["data", "bias"], ["t"]), N("Dropout", ["t", "ratio", "training_mode"], ["d"]),
             N("Add", ["d", "residual"], ["y"]) if residual else N("Identity", ["d"], ["y"])]
    return fused_model, build(nodes, inputs, inits, {})


@pytest.mark.parametrize(
    "op, residual, training, expected",
    [
        # dbias = Σ over 21 rows (462 − 22); dropout's mask multiply only when training
        pytest.param("BiasDropout", True, True, 462 + 462 - 22, id="training"),
        pytest.param("BiasDropout", True, False, 462 - 22, id="inference-mode"),
        pytest.param("BitmaskBiasDropout", False, True, 462 + 462 - 22, id="bitmask-no-residual"),
    ],
)
def test_bias_dropout_backward(op, residual, training, expected):
    fused_model, unfused_model = dropout_models(op, residual=residual, training=training)
    assert fused(fused_model) == (expected, 0, 0)
    assert_same_as_unfused(fused_model, unfused_model)
    assert train(fused_model).trainable_params == 22  # the ratio is a buffer


def test_bitmask_dropout_backward():
    inits = [const("ratio", 0.1, np.float32), const("training_mode", True, np.bool_)]
    m = build([ms_train("BitmaskDropout", ["X", "ratio", "training_mode"])], {}, inits, {}, {"X": XE})
    std = build([N("Dropout", ["X", "ratio", "training_mode"], ["y"])], {}, inits, {}, {"X": XE})
    assert fused(m) == (462, 0, 0)
    assert_same_as_unfused(m, std)


@pytest.mark.parametrize(
    "axis, rows, n",
    [pytest.param(3, 3 * 5 * 7, 11, id="last-axis"), pytest.param(1, 3, 5 * 7 * 11, id="axis-1-coerced")],
)
def test_bias_softmax_backward(axis, rows, n):
    # data inside the network, bias (3, 1, 7, 11) trained: Softmax's backward R·(4n − 1), dbias 1155 − 231
    bias = [weight("bias", (3, 1, 7, 11))]
    m = build([ms_train("BiasSoftmax", ["data", "bias"], axis=axis, is_inner_broadcast=0)], {}, bias, {},
              {"data": (3, 5, 7, 11)}, opset=11)
    std = build([N("Add", ["data", "bias"], ["s"]), N("Softmax", ["s"], ["y"], axis=axis)], {}, bias, {},
                {"data": (3, 5, 7, 11)}, opset=11)
    # A table added to scores that feed a Softmax is a mask or a position bias for the graph's rule
    # (flopcount.pipeline.parameters): named trainable here (with the prefix weight), it is trained in both graphs.
    named = ["bias", "data_w"]
    assert fused(m, trainable=named) == (rows * (4 * n - 1) + 1155 - 231, 0, 0)
    assert_same_as_unfused(m, std, trainable=named)
    assert train(std).trainable_params == train(m).trainable_params == 3 * 5 * 7 * 11  # the prefix weight only


# --- inventory ------------------------------------------------------------------------------
def test_every_contrib_formula_has_a_backward_but_the_quantized_one():
    import flopcount.operators  # noqa: F401

    from flopcount.registry import BACKWARD, RULES

    missing = sorted(o for (d, o), r in RULES.items() if d == MS and not r.zero_cost and (d, o) not in BACKWARD)
    # the 8-bit quantized ops of onnxruntime's quantizer run inference only, as ONNX's own quantized ops
    inference_only = {o for o in missing if RULES[MS, o].fn.__module__.startswith("flopcount.operators.quantized")}
    assert inference_only >= {"QAttention", "QGemm", "DynamicQuantizeLSTM", "MatMulIntegerToFloat"}
    assert sorted(set(missing) - inference_only) == ["MatMulNBits"]
    assert ("", "SimplifiedLayerNormalization") in BACKWARD


@pytest.mark.parametrize("model, expected", [
    # ids (3, 7), tables of width 13: output and embedding sum (3, 7, 13), mask_index (3,)
    pytest.param(lambda: embed_models()[0], {"y": (3, 7, 13), "mask_index": (3,)}, id="embed-layer-norm"),
    pytest.param(lambda: group_norm_models("GroupNorm")[0], {"y": XG}, id="group-norm"),
    pytest.param(lambda: group_norm_models("SkipGroupNorm")[0], {"y": XG}, id="skip-group-norm"),
    # X (3, 7, 22): the halves' product (3, 7, 11)
    pytest.param(lambda: elementwise_models("BiasSplitGelu", [], bias=(22,))[0], {"y": (3, 7, 11)},
                 id="bias-split-gelu"),
])
def test_shapes_settle_without_onnxruntime(monkeypatch, model, expected):
    """These operators' output shapes come from the shape functions beside their formulas: the count is the same
    where onnxruntime's symbolic inference is absent (a bare install) as where it runs."""
    from flopcount.pipeline.shapes import contrib

    monkeypatch.setattr(contrib, "_ort_symbolic", lambda *_: {})
    report = flopcount.count(model(), mode="train", memory=True, strict=True)
    (node,) = [n for n in report.nodes if n.domain == MS]
    assert {t.name: t.shape for t in node.outputs if t is not None and t.name in expected} == expected
