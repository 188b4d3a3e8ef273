"""Microsoft contrib operators (domain com.microsoft) that onnxruntime's optimizers write.

Each case is one node; expected costs are written out from the sizes. Sizes are distinct and odd
where the operator allows: batch 3, sequence 7, key length 11, past 13, heads 5, head sizes 3 (Q/K)
and 5 (V), hidden 11 or 13. ONNX shape inference does not know these operators, so the cases whose
formula needs the output shape (FusedConv, FusedMatMul, FusedGemm) declare it, as an onnxruntime
optimized model carries it in its value_info.
"""

import numpy as np
import pytest
from conftest import const, weight
from onnx import TensorProto, helper

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
