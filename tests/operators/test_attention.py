"""Attention, FlexAttention, LinearAttention, RotaryEmbedding, SwiGLU.

Sizes are distinct and odd: B = 3 batch, S_q = 7 queries, S_kv = 11 keys, P = 19 cached keys,
E = 13 (Q/K head size), E_v = 9 (V head size), H_q = 5 or 15 query heads, H_kv = 5 (MHA), 5 of 15
(GQA) or 1 (MQA). With R = B·H_q·S_q score rows of T = P + S_kv scores each, the ONNX Attention
computes: Q·Kᵀ (R·T·E MACs), √scale on Q and on K (B·H_q·S_q·E + B·H_kv·T·E multiplies),
softcap (3 per score, a tanh each), the bias add (1 per score), softmax (5T − 2 per row, T exps)
and probs·V (R·T·E_v MACs).
"""

import pytest
from helpers import model, node_backward, typed_model, weight
from onnx import TensorProto, helper

import flopcount

B, S_Q, S_KV, P, E, E_V = 3, 7, 11, 19, 13, 9


def expected(h_q, h_kv, t, *, masked=False, softcap=False, flops_per_mac=2):
    """(FLOPs, MACs, transcendentals) of the dense ONNX Attention, spelled out term by term."""
    rows = B * h_q * S_Q
    qk_macs = rows * t * E
    pv_macs = rows * t * E_V
    scaling = B * h_q * S_Q * E + B * h_kv * t * E
    softmax = rows * (5 * t - 2)
    flops = flops_per_mac * (qk_macs + pv_macs) + scaling + softmax
    trans = rows * t
    if masked:
        flops += rows * t
    if softcap:
        flops += 3 * rows * t
        trans += rows * t
    return flops, qk_macs + pv_macs, trans


def attention(h_q, h_kv, layout, *, mask=None, past=False, nonpad=False, opset=24, **attrs):
    """One Attention node; ``mask`` is None, ("float", shape) or ("bool", shape)."""
    if layout == 4:
        q, k, v = (B, h_q, S_Q, E), (B, h_kv, S_KV, E), (B, h_kv, S_KV, E_V)
    else:
        q, k, v = (B, S_Q, h_q * E), (B, S_KV, h_kv * E), (B, S_KV, h_kv * E_V)
        attrs.update(q_num_heads=h_q, kv_num_heads=h_kv)
    inputs = {"Q": q, "K": k, "V": v}
    names = ["Q", "K", "V", "", "", "", ""]
    inits = []
    if mask is not None:
        kind, shape = mask
        if kind == "float":
            inputs["mask"] = shape
        else:
            inits.append(weight("mask", shape, TensorProto.BOOL))
        names[3] = "mask"
    if past:
        inputs["past_key"] = (B, h_kv, P, E)
        inputs["past_value"] = (B, h_kv, P, E_V)
        names[4:6] = ["past_key", "past_value"]
    if nonpad:
        inits.append(weight("nonpad", (B,), TensorProto.INT64))
        names[6] = "nonpad"
    while names and not names[-1]:
        names.pop()
    outputs = ["Y", "present_key", "present_value"] if past else ["Y"]
    node = helper.make_node("Attention", names, outputs, **attrs)
    return model([node], inputs, outputs, inits, opset=opset)


CASES = [
    # id: H_q, H_kv, layout, builder options, T, masked, softcap
    pytest.param(5, 5, 4, {}, S_KV, False, False, id="mha-4d"),
    pytest.param(5, 5, 3, {}, S_KV, False, False, id="mha-3d"),
    pytest.param(15, 5, 4, {}, S_KV, False, False, id="gqa-4d"),
    pytest.param(15, 5, 3, {}, S_KV, False, False, id="gqa-3d"),
    pytest.param(15, 1, 3, {}, S_KV, False, False, id="mqa-3d"),
    pytest.param(5, 5, 4, {"is_causal": 1}, S_KV, True, False, id="causal-dense"),
    pytest.param(5, 5, 4, {"mask": ("float", (S_Q, S_KV))}, S_KV, True, False, id="float-mask-2d"),
    pytest.param(5, 5, 4, {"mask": ("bool", (B, 5, S_Q, S_KV))}, S_KV, True, False, id="bool-mask-4d"),
    pytest.param(5, 5, 4, {"softcap": 2.5}, S_KV, False, True, id="softcap"),
    pytest.param(5, 5, 4, {"scale": 0.125}, S_KV, False, False, id="explicit-scale"),
    pytest.param(5, 5, 4, {"past": True}, P + S_KV, False, False, id="kv-cache-4d"),
    pytest.param(15, 5, 3, {"past": True, "is_causal": 1}, P + S_KV, True, False, id="kv-cache-gqa-3d-causal"),
    pytest.param(15, 5, 3, {"past": True, "mask": ("float", (S_Q, P + S_KV)), "softcap": 30.0},
                 P + S_KV, True, True, id="kv-cache-mask-softcap"),
    pytest.param(5, 5, 4, {"nonpad": True}, S_KV, True, False, id="nonpad-kv-seqlen"),
    pytest.param(5, 5, 4, {"is_causal": 1, "left_window_size": 3, "opset": 25}, S_KV, True, False,
                 id="sliding-window-opset25"),
    pytest.param(5, 5, 4, {"opset": 23}, S_KV, False, False, id="opset23"),
]


@pytest.mark.parametrize("h_q, h_kv, layout, opts, t, masked, softcap", CASES)
def test_attention(h_q, h_kv, layout, opts, t, masked, softcap):
    r = flopcount.count(attention(h_q, h_kv, layout, **opts)).total
    assert (r.flops, r.macs, r.transcendentals) == expected(h_q, h_kv, t, masked=masked, softcap=softcap)


def test_attention_spelled_out():
    # 4-D MHA, no mask: R = 3·5·7 = 105 rows, T = 11
    # Q·Kᵀ 105·11·13 = 15015 MACs, probs·V 105·11·9 = 10395 MACs → 2·25410 = 50820
    # √scale: |Q| = 3·5·7·13 = 1365, |K| = 3·5·11·13 = 2145; softmax 105·(5·11 − 2) = 5565
    r = flopcount.count(attention(5, 5, 4)).total
    assert (r.flops, r.macs, r.transcendentals) == (50820 + 1365 + 2145 + 5565, 25410, 105 * 11)


def test_gqa_products_are_per_query_head():
    # GQA with 15 query heads over 5 KV heads costs the products of 15 heads, not 5
    mha15 = flopcount.count(attention(15, 15, 4)).total
    gqa = flopcount.count(attention(15, 5, 4)).total
    assert gqa.macs == mha15.macs
    # only the √scale on K shrinks: 3·(15 − 5)·11·13 fewer multiplies
    assert mha15.flops - gqa.flops == B * (15 - 5) * S_KV * E


def test_layouts_agree():
    assert flopcount.count(attention(15, 5, 3)).total == flopcount.count(attention(15, 5, 4)).total


def test_attention_table3():
    r = flopcount.count(attention(5, 5, 4), convention="table3").total
    assert r.flops == expected(5, 5, S_KV, flops_per_mac=1)[0]


def test_attention_products_match_torch_sdpa():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    q = torch.randn(B, 5, S_Q, E)
    k = torch.randn(B, 5, S_KV, E)
    v = torch.randn(B, 5, S_KV, E_V)
    with FlopCounterMode(display=False) as fc:
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
    # torch counts only the two products
    assert flopcount.count(attention(5, 5, 4)).total.macs * 2 == fc.get_total_flops()


# --- FlexAttention (ai.onnx.preview) ---------------------------------------------------------


def flex(h_q, h_kv, l, s, e, e_v, **attrs):
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain="ai.onnx.preview", **attrs)
    inputs = {"Q": (B, h_q, l, e), "K": (B, h_kv, s, e), "V": (B, h_kv, s, e_v)}
    return model([node], inputs, ["Y"], opset=26, extra_opsets={"ai.onnx.preview": 1})


def score_mod_graph():
    """scores + 1.0 — a subgraph whose cost FlexAttention leaves out."""
    s_in = helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["B", "H", "L", "S"])
    s_out = helper.make_tensor_value_info("scores_out", TensorProto.FLOAT, ["B", "H", "L", "S"])
    bias = helper.make_tensor("bias", TensorProto.FLOAT, [], [1.0])
    return helper.make_graph([helper.make_node("Add", ["scores", "bias"], ["scores_out"])], "mod",
                             [s_in], [s_out], [bias])


@pytest.mark.parametrize("h_q, h_kv", [pytest.param(5, 5, id="mha"), pytest.param(15, 5, id="gqa")])
def test_flex_attention(h_q, h_kv):
    l, s, e, e_v = 7, 11, 13, 9
    rows = B * h_q * l
    macs = rows * s * (e + e_v)
    flops = 2 * macs + B * h_q * l * e + B * h_kv * s * e + rows * (5 * s - 2)
    r = flopcount.count(flex(h_q, h_kv, l, s, e, e_v)).total
    assert (r.flops, r.macs, r.transcendentals) == (flops, macs, rows * s)


def test_flex_attention_subgraphs_not_counted():
    plain = flopcount.count(flex(5, 5, 7, 11, 13, 9)).total
    modded = flopcount.count(flex(5, 5, 7, 11, 13, 9, score_mod=score_mod_graph())).total
    assert modded == plain


# --- LinearAttention (opset 27) ----------------------------------------------------------------

T_LA, HQ_LA, HKV_LA, DK, DV = 11, 9, 3, 5, 7  # tokens, query heads, KV heads, key dim, value dim


def linear_attention(rule, *, decay_per_head=False, past=False, h_q=HQ_LA):
    inputs = {"q": (B, T_LA, h_q * DK), "k": (B, T_LA, HKV_LA * DK), "v": (B, T_LA, HKV_LA * DV)}
    names = ["q", "k", "v", "", "", ""]
    if past:
        inputs["past"] = (B, HKV_LA, DK, DV)
        names[3] = "past"
    if rule in ("gated", "gated_delta"):
        inputs["decay"] = (B, T_LA, HKV_LA if decay_per_head else HKV_LA * DK)
        names[4] = "decay"
    if rule in ("delta", "gated_delta"):
        inputs["beta"] = (B, T_LA, HKV_LA)
        names[5] = "beta"
    while not names[-1]:
        names.pop()
    node = helper.make_node("LinearAttention", names, ["y", "state"], q_num_heads=h_q,
                            kv_num_heads=HKV_LA, update_rule=rule)
    return model([node], inputs, ["y", "state"], opset=27)


N_TOK = B * T_LA
STATE = DK * DV
UPDATE = N_TOK * HKV_LA * STATE  # S += k ⊗ v, MACs
READ = N_TOK * HQ_LA * STATE  # qᵀ S per query head, MACs
SCALE = N_TOK * HQ_LA * DV  # scale · output
RETRIEVE = N_TOK * HKV_LA * STATE  # Sᵀ k, MACs (delta rules)
DELTA_EW = 2 * N_TOK * HKV_LA * DV  # v − Sᵀk, then · β
DECAY_MUL = N_TOK * HKV_LA * STATE  # exp(g) · S
EXPS_PER_KEY = N_TOK * HKV_LA * DK  # |decay| for per-key-dimension decay
EXPS_PER_HEAD = N_TOK * HKV_LA  # |decay| for per-head decay

LINEAR_ATTENTION = [
    # id: rule, options, MACs, extra (non-MAC) FLOPs, transcendentals
    pytest.param("linear", {}, UPDATE + READ, SCALE, 0, id="linear"),
    pytest.param("gated", {}, UPDATE + READ, SCALE + DECAY_MUL + EXPS_PER_KEY, EXPS_PER_KEY, id="gated"),
    pytest.param("gated", {"decay_per_head": True}, UPDATE + READ, SCALE + DECAY_MUL + EXPS_PER_HEAD,
                 EXPS_PER_HEAD, id="gated-per-head-decay"),
    pytest.param("delta", {}, UPDATE + RETRIEVE + READ, SCALE + DELTA_EW, 0, id="delta"),
    pytest.param("gated_delta", {"past": True}, UPDATE + RETRIEVE + READ,
                 SCALE + DELTA_EW + DECAY_MUL + EXPS_PER_KEY, EXPS_PER_KEY, id="gated-delta-with-past"),
]


@pytest.mark.parametrize("rule, opts, macs, extra, trans", LINEAR_ATTENTION)
def test_linear_attention(rule, opts, macs, extra, trans):
    r = flopcount.count(linear_attention(rule, **opts)).total
    assert (r.flops, r.macs, r.transcendentals) == (2 * macs + extra, macs, trans)


def test_linear_attention_default_rule_is_gated_delta():
    inputs = {"q": (B, T_LA, HQ_LA * DK), "k": (B, T_LA, HKV_LA * DK), "v": (B, T_LA, HKV_LA * DV),
              "decay": (B, T_LA, HKV_LA * DK), "beta": (B, T_LA, HKV_LA)}
    node = helper.make_node("LinearAttention", ["q", "k", "v", "", "decay", "beta"], ["y", "state"],
                            q_num_heads=HQ_LA, kv_num_heads=HKV_LA)
    r = flopcount.count(model([node], inputs, ["y", "state"], opset=27)).total
    assert r == flopcount.count(linear_attention("gated_delta")).total


# --- RotaryEmbedding (opset 23), SwiGLU (opset 28) ---------------------------------------------

H_R, S_R, D_R = 5, 7, 22  # heads, sequence, head size (even)


def rotary(layout, rot_dim=0):
    x = (B, H_R, S_R, D_R) if layout == 4 else (B, S_R, H_R * D_R)
    half = (rot_dim or D_R) // 2
    attrs = {"rotary_embedding_dim": rot_dim} if rot_dim else {}
    if layout == 3:
        attrs["num_heads"] = H_R
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], **attrs)
    return model([node], {"x": x, "cos": (B, S_R, half), "sin": (B, S_R, half)}, ["y"], opset=23)


@pytest.mark.parametrize("layout, rot_dim, flops", [
    # 3 FLOPs per rotated element (a pair costs 2 multiplies + 1 add/sub for each of its 2 outputs)
    pytest.param(4, 0, 3 * B * H_R * S_R * D_R, id="4d-full"),
    pytest.param(3, 0, 3 * B * H_R * S_R * D_R, id="3d-full"),
    pytest.param(4, 10, 3 * B * H_R * S_R * 10, id="4d-partial-10-of-22"),
    pytest.param(3, 10, 3 * B * H_R * S_R * 10, id="3d-partial-10-of-22"),
])
def test_rotary_embedding(layout, rot_dim, flops):
    r = flopcount.count(rotary(layout, rot_dim)).total
    assert (r.flops, r.macs, r.transcendentals) == (flops, 0, 0)


def test_swiglu():
    node = helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=1.702)
    r = flopcount.count(model([node], {"a": (3, 5, 7), "b": (3, 5, 7)}, ["y"], opset=28)).total
    # Swish of A (1 FLOP, 1 transcendental) then times B (1 FLOP), per element
    assert (r.flops, r.transcendentals) == (2 * 3 * 5 * 7, 3 * 5 * 7)


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): RotaryEmbedding, SwiGLU, LinearAttention.
#
# Each expected value is a closed form written here from the sizes (distinct odd sizes, so that a
# swapped dimension cannot pass). A tensor needs a gradient when it is a trainable float initializer
# (``weight``) fed to a differentiable input, or computed from one; graph inputs are data and need none.
# Which inputs may get a gradient at all is the schema's say (``onnx.defs.get_schema``), checked in
# ``tests/pipeline/test_schema.py`` before the cases rely on it.
# -----------------------------------------------------------------------------------------------------------------


N = helper.make_node


F, I64 = TensorProto.FLOAT, TensorProto.INT64


BR, HR, SR, DR = 3, 5, 7, 22  # batch, heads, sequence, head size (even)


def rotary_train(*, x_trainable=True, caches_trainable=False, rot_dim=0, layout=4, positions=0):
    x = (BR, HR, SR, DR) if layout == 4 else (BR, SR, HR * DR)
    half = (rot_dim or DR) // 2
    cache = (positions, half) if positions else (BR, SR, half)
    names = ["x", "cos", "sin"] + (["pos"] if positions else [])
    attrs = {"rotary_embedding_dim": rot_dim} if rot_dim else {}
    if layout == 3:
        attrs["num_heads"] = HR
    inputs, inits = {}, []
    for name, shape, trained in (("x", x, x_trainable), ("cos", cache, caches_trainable), ("sin", cache, caches_trainable)):
        if trained:
            inits.append(weight(name, shape))
        else:
            inputs[name] = (F, shape)
    if positions:
        inputs["pos"] = (I64, (BR, SR))
    return typed_model([N("RotaryEmbedding", names, ["y"], **attrs)], inputs, ["y"], inits, opset=23)


@pytest.mark.parametrize("kwargs, flops", [
    # the adjoint rotation: per pair 4 multiplies and 2 additions, 3 per rotated element
    pytest.param({}, 3 * BR * HR * SR * DR, id="dx-4d"),
    pytest.param({"layout": 3}, 3 * BR * HR * SR * DR, id="dx-3d"),
    pytest.param({"rot_dim": 10}, 3 * BR * HR * SR * 10, id="dx-partial-10-of-22"),
    # float cos/sin initializers are buffers (fixed frequency tables): no gradient, whatever X needs
    pytest.param({"x_trainable": False, "caches_trainable": True}, 0, id="caches-are-buffers"),
    pytest.param({"caches_trainable": True, "rot_dim": 10, "positions": 13},
                 3 * BR * HR * SR * 10, id="dx-only-with-position-ids"),
])  # fmt: skip
def test_rotary_embedding_train(kwargs, flops):
    assert node_backward(rotary_train(**kwargs), "RotaryEmbedding").flops == flops


def test_rotary_caches_are_not_trainable_parameters():
    r = flopcount.count(rotary_train(caches_trainable=True), mode="train")
    assert r.trainable_params == BR * HR * SR * DR  # X only


def test_rotary_embedding_data_only():
    assert node_backward(rotary_train(x_trainable=False), "RotaryEmbedding") == flopcount.Cost()


SW = (3, 5, 7)


NSW = 3 * 5 * 7


@pytest.mark.parametrize("a, b, flops", [
    # σ(αA) again: αA, exp, +1, ÷ (4); dA: 1 − σ, × αA, + 1, × σ, × dY, × B (6); dB: A·σ, × dY (2)
    pytest.param(True, True, 12 * NSW, id="both"),
    pytest.param(True, False, 10 * NSW, id="gate-only"),
    pytest.param(False, True, 6 * NSW, id="value-only"),
])  # fmt: skip
def test_swiglu_train(a, b, flops):
    inits = [weight(n, SW) for n, trained in (("a", a), ("b", b)) if trained]
    inputs = {n: (F, SW) for n, trained in (("a", a), ("b", b)) if not trained}
    m = typed_model([N("SwiGLU", ["a", "b"], ["y"], alpha=1.702)], inputs, ["y"], inits, opset=28)
    back = node_backward(m, "SwiGLU")
    assert (back.flops, back.transcendentals) == (flops, NSW)


BL, TL, HQ, HKV, DK_TRAIN, DV_TRAIN = 3, 11, 9, 3, 5, 7  # batch, tokens, query heads, KV heads, key dim, value dim


TOK, P_TRAIN = BL * TL, DK_TRAIN * DV_TRAIN  # tokens in the batch, state size


def linear_attention_train(rule, trained, *, decay_per_head=False, past=False):
    """LinearAttention with the inputs in ``trained`` as trainable weights, the others data."""
    shapes = {"q": (BL, TL, HQ * DK_TRAIN), "k": (BL, TL, HKV * DK_TRAIN), "v": (BL, TL, HKV * DV_TRAIN)}
    names = ["q", "k", "v", "", "", ""]
    if past:
        shapes["past"], names[3] = (BL, HKV, DK_TRAIN, DV_TRAIN), "past"
    if rule in ("gated", "gated_delta"):
        shapes["decay"], names[4] = (BL, TL, HKV if decay_per_head else HKV * DK_TRAIN), "decay"
    if rule in ("delta", "gated_delta"):
        shapes["beta"], names[5] = (BL, TL, HKV), "beta"
    while not names[-1]:
        names.pop()
    inputs = {n: (F, s) for n, s in shapes.items() if n not in trained}
    inits = [weight(n, s) for n, s in shapes.items() if n in trained]
    node = N("LinearAttention", names, ["y", "state"], q_num_heads=HQ, kv_num_heads=HKV, update_rule=rule)
    return typed_model([node], inputs, ["y", "state"], inits, opset=27)


SCALE_TRAIN = TOK * HQ * DV_TRAIN  # scale·dO, once


LA_CASES = [
    # rule, trained, options, MACs, non-MAC FLOPs
    # linear, all three: dQ = S·a and dS += q ⊗ a per query head; dK = dS·v, dV = dSᵀk per KV head
    pytest.param("linear", "qkv", {}, TOK * P_TRAIN * (2 * HQ + 2 * HKV), SCALE_TRAIN, id="linear-qkv"),
    # linear, Q only: dQ alone, no state gradient
    pytest.param("linear", "q", {}, TOK * P_TRAIN * HQ, SCALE_TRAIN, id="linear-q-only"),
    # delta, Q only: the same (the state chain is not needed)
    pytest.param("delta", "q", {}, TOK * P_TRAIN * HQ, SCALE_TRAIN, id="delta-q-only"),
    # delta, K only: dS from the read-out; dw = dSᵀk and the correction k ⊗ β·dw; dK = dS·w − S'·β·dw;
    # β·dw per KV head (d_v multiplies)
    pytest.param("delta", "k", {}, TOK * P_TRAIN * (HQ + 2 * HKV + 2 * HKV), SCALE_TRAIN + TOK * HKV * DV_TRAIN, id="delta-k"),
    # gated, decay only (per head): dS from the read-out, dg = exp(g)·Σ dS'·S (P MACs, |decay| multiplies),
    # the carry exp(g)·dS (P multiplies per KV head)
    pytest.param("gated", ("decay",), {"decay_per_head": True}, TOK * P_TRAIN * (HQ + HKV),
                 SCALE_TRAIN + TOK * HKV * P_TRAIN + TOK * HKV, id="gated-decay-per-head"),
    # gated delta, everything but Q, with a past state (never a gradient): K (2), V via β·dw (0), decay (1),
    # the chain (2) per KV head, dβ = uᵀdw (d_v MACs); carry, β·dw, |decay| = TOK·HKV·DK multiplies
    pytest.param("gated_delta", ("k", "v", "decay", "beta"), {"past": True},
                 TOK * P_TRAIN * (HQ + 5 * HKV) + TOK * HKV * DV_TRAIN,
                 SCALE_TRAIN + TOK * HKV * (P_TRAIN + DV_TRAIN) + TOK * HKV * DK_TRAIN, id="gated-delta-kv-decay-beta-past"),
]


@pytest.mark.parametrize("rule, trained, opts, macs, extra", LA_CASES)
def test_linear_attention_train(rule, trained, opts, macs, extra):
    trained = tuple(trained) if isinstance(trained, str) else trained
    back = node_backward(linear_attention_train(rule, trained, **opts), "LinearAttention")
    assert (back.flops, back.macs, back.transcendentals) == (2 * macs + extra, macs, 0)


def test_linear_attention_past_state_gets_no_gradient():
    # a trainable-looking float initializer on past_state is NonDifferentiable: not trained, no dS_0 cost
    r = flopcount.count(linear_attention_train("linear", ("q", "past"), past=True), mode="train")
    assert r.trainable_params == BL * TL * HQ * DK_TRAIN
    (n,) = r.nodes
    assert n.backward.macs == TOK * P_TRAIN * HQ


def test_linear_attention_backward_products_are_twice_the_forward():
    # with every input needing a gradient, the products of linear and delta rules are 2× the forward's
    for rule, trained in (("linear", "qkv"), ("delta", ("q", "k", "v", "beta"))):
        r = flopcount.count(linear_attention_train(rule, tuple(trained)), mode="train")
        (n,) = r.nodes
        extra = TOK * HKV * DV_TRAIN if rule == "delta" else 0  # dβ = uᵀdw, beyond the state products
        assert n.backward.macs == 2 * n.cost.macs + extra


def test_linear_attention_products_equal_flop_counter():
    # the linear rule's recurrence in torch, its products as bmm (MHA: H_q = H_kv = 3); FlopCounterMode
    # counts forward and backward bmm; flopcount's forward + backward MACs at 2 FLOPs each must agree
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    h = HKV
    q = torch.randn(BL * h, TL, DK_TRAIN, device="meta", requires_grad=True)
    k = torch.randn(BL * h, TL, DK_TRAIN, device="meta", requires_grad=True)
    v = torch.randn(BL * h, TL, DV_TRAIN, device="meta", requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        state = torch.zeros(BL * h, DK_TRAIN, DV_TRAIN, device="meta")
        outs = []
        for t in range(TL):
            state = state + torch.bmm(k[:, t, :, None], v[:, t, None, :])  # k ⊗ v
            outs.append(torch.bmm(q[:, t, None, :], state))  # qᵀ S
        torch.cat(outs, 1).sum().backward()
    shapes = {"q": (BL, TL, h * DK_TRAIN), "k": (BL, TL, h * DK_TRAIN), "v": (BL, TL, h * DV_TRAIN)}
    node = N("LinearAttention", ["q", "k", "v"], ["y", "state"], q_num_heads=h, kv_num_heads=h, update_rule="linear")
    r = flopcount.count(typed_model([node], {}, ["y"], [weight(n, s) for n, s in shapes.items()], opset=27), mode="train")
    assert counter.get_total_flops() == 2 * (r.forward.macs + r.backward.macs)
