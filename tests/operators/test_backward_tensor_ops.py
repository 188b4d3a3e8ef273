"""Backward (mode="train") formulas of normalization, reduction, loss, attention-block, element-wise,
cumulative, linalg, scatter, softmax and sorting operators.

Each expected value is a closed form written here from the sizes (distinct odd sizes, so that a
swapped dimension cannot pass). A tensor needs a gradient when it is a trainable float initializer
(``weight``) fed to a differentiable input, or computed from one; graph inputs are data and need none.
Which inputs may get a gradient at all is the schema's say (``onnx.defs.get_schema``), checked in
``test_schema_categories`` before the cases rely on it.
"""

import onnx
import pytest
from helpers import const, direct_backward, weight
from onnx import TensorProto, helper

import flopcount

N = helper.make_node
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def graph(nodes, inputs, outputs, inits=(), opset=18):
    """A model whose graph inputs are ``{name: (elem_type, shape)}``."""
    g = helper.make_graph(
        list(nodes), "test",
        [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_empty_tensor_value_info(n) for n in outputs], list(inits),
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def node_backward(m, op_type):
    """The (only) ``op_type`` node's backward cost; also checks the op is never reported as lacking one."""
    r = flopcount.count(m, mode="train")
    assert op_type not in r.backward_unsupported
    (n,) = [n for n in r.nodes if n.op_type == op_type]
    return n.backward


def one(op_type, x_shape, *, trainable=True, extra_inits=(), opset=18, n_outputs=1, **attrs):
    """One node on input ``x`` (a trainable weight, or a data input when not ``trainable``)."""
    names = ["x"] + [t.name for t in extra_inits]
    outs = [f"y{i}" for i in range(n_outputs)]
    nodes = [N(op_type, names, outs, **attrs)]
    if trainable:
        return graph(nodes, {}, outs, [weight("x", x_shape), *extra_inits], opset)
    return graph(nodes, {"x": (F, x_shape)}, outs, list(extra_inits), opset)


def category(op_type, opset, i):
    schema = onnx.defs.get_schema(op_type, opset, "")
    return schema.inputs[min(i, len(schema.inputs) - 1)].differentiation_category


@pytest.mark.parametrize("op_type, opset, i, differentiable", [
    pytest.param("SoftmaxCrossEntropyLoss", 13, 2, False, id="sce-13-weights-non-diff"),
    pytest.param("SoftmaxCrossEntropyLoss", 12, 2, True, id="sce-12-weights-unknown"),
    pytest.param("NegativeLogLikelihoodLoss", 22, 2, False, id="nll-22-weight-non-diff"),
    pytest.param("NegativeLogLikelihoodLoss", 12, 2, True, id="nll-12-weight-unknown"),
    pytest.param("Mod", 13, 1, False, id="mod-13-divisor-non-diff"),
    pytest.param("Mod", 10, 1, True, id="mod-10-divisor-unknown"),
    pytest.param("RotaryEmbedding", 23, 1, True, id="rotary-cos-unknown"),
    pytest.param("LinearAttention", 27, 3, False, id="linear-attention-past-state-non-diff"),
    pytest.param("LinearAttention", 27, 4, True, id="linear-attention-decay-diff"),
    pytest.param("ScatterND", 18, 1, False, id="scatter-nd-indices-non-diff"),
    pytest.param("ScatterElements", 18, 2, True, id="scatter-elements-updates-diff"),
    pytest.param("CumProd", 26, 1, False, id="cumprod-axis-non-diff"),
    pytest.param("TopK", 24, 1, False, id="topk-k-non-diff"),
])  # fmt: skip
def test_schema_categories(op_type, opset, i, differentiable):
    # the cases below rely on these: NonDifferentiable inputs never get a gradient, others may
    non = category(op_type, opset, i) == onnx.defs.OpSchema.DifferentiationCategory.NonDifferentiable
    assert non is not differentiable


# --- normalization --------------------------------------------------------------------------------

X4 = (3, 7, 5, 9)  # N, C, H, W
NX4 = 3 * 7 * 5 * 9  # 945


@pytest.mark.parametrize("size", [3, 5])
def test_lrn(size):
    # per element: dY·Y/s (2), the window sum (size − 1), × 2αβ/size and × X (2), dY/s^β (1), subtraction (1)
    back = node_backward(one("LRN", X4, size=size, alpha=0.001), "LRN")
    assert (back.flops, back.transcendentals) == ((size + 5) * NX4, 0)


@pytest.mark.parametrize("axes", [None, [1]], ids=["default-axes", "axes-1"])
def test_mean_variance_normalization(axes):
    # Σ dY and Σ dY·Y per statistic (3 per element), per element Y·b, 2 subtractions, × 1/σ (4)
    attrs = {"axes": axes} if axes else {}
    assert node_backward(one("MeanVarianceNormalization", X4, **attrs), "MeanVarianceNormalization").flops == 7 * NX4


@pytest.mark.parametrize("axis, p, flops", [
    # V = 3·5·9 vectors of 7 along axis 1: Σ dY·Y (2·7 − 1), g·Σ (7), − (7), / norm (7) per vector
    pytest.param(1, 2, 3 * 5 * 9 * (5 * 7 - 1), id="p2-axis1"),
    # p = 1: sign select (7) + one negation of the sum per vector
    pytest.param(1, 1, 3 * 5 * 9 * 5 * 7, id="p1-axis1"),
    # default axis −1: V = 3·7·5 vectors of 9
    pytest.param(-1, 2, 3 * 7 * 5 * (5 * 9 - 1), id="p2-last-axis"),
])  # fmt: skip
def test_lp_normalization(axis, p, flops):
    assert node_backward(one("LpNormalization", X4, axis=axis, p=p), "LpNormalization").flops == flops


@pytest.mark.parametrize("op_type, attrs", [
    pytest.param("LRN", {"size": 3}, id="lrn"),
    pytest.param("MeanVarianceNormalization", {}, id="mvn"),
    pytest.param("LpNormalization", {}, id="lp"),
    pytest.param("Shrink", {}, id="shrink"),
    pytest.param("Hardmax", {}, id="hardmax"),
])  # fmt: skip
def test_data_input_needs_no_gradient(op_type, attrs):
    # fed by data only: no input needs a gradient, so the node costs nothing and is not "unsupported"
    assert node_backward(one(op_type, X4, trainable=False, **attrs), op_type) == flopcount.Cost()


# --- reductions -------------------------------------------------------------------------------------

XR = (5, 7, 9)
NXR, NYR = 5 * 7 * 9, 5 * 9  # reduced over axis 1, keepdims


@pytest.mark.parametrize("op_type, flops, trans", [
    pytest.param("ReduceL1", NXR, 0, id="l1-sign-multiply"),  # dY·sign(x) per input element
    pytest.param("ReduceLogSum", NYR, 0, id="logsum-one-division-per-output"),  # dY / Σx
    pytest.param("ReduceLogSumExp", 3 * NXR, NXR, id="logsumexp"),  # dY·exp(x − y): sub, exp, mul
    pytest.param("ReduceProd", NXR + NYR, 0, id="prod"),  # dY·y once per output, / x per input
])  # fmt: skip
def test_reductions(op_type, flops, trans):
    back = node_backward(one(op_type, XR, extra_inits=[const("axes", [1])]), op_type)
    assert (back.flops, back.transcendentals) == (flops, trans)


def test_reduction_keepdims_0_and_data_input():
    back = node_backward(one("ReduceProd", XR, extra_inits=[const("axes", [0, 2])], keepdims=0), "ReduceProd")
    assert back.flops == NXR + 7  # |Y| = 7 outputs
    assert node_backward(one("ReduceLogSumExp", XR, trainable=False, extra_inits=[const("axes", [1])]),
                         "ReduceLogSumExp") == flopcount.Cost()


# --- losses -------------------------------------------------------------------------------------------

NB, C, D = 3, 7, 5  # batch, classes, one extra position dim
T = NB * D  # 15 target positions


def loss(op, reduction, *, weighted=False, scores_trainable=True, weights_trainable=True, opset=13, n_outputs=1):
    outs = [f"y{i}" for i in range(n_outputs)]
    names = ["scores", "labels"] + (["w"] if weighted else [])
    inputs, inits = {"labels": (I64, (NB, D))}, []
    if scores_trainable:
        inits.append(weight("scores", (NB, C, D)))
    else:
        inputs["scores"] = (F, (NB, C, D))
    if weighted:
        if weights_trainable:
            inits.append(weight("w", (C,)))
        else:
            inputs["w"] = (F, (C,))
    return graph([N(op, names, outs, reduction=reduction)], inputs, outs, inits, opset)


@pytest.mark.parametrize("reduction, weighted, flops", [
    pytest.param("none", False, T, id="none"),  # −dL_t at the target entry
    pytest.param("sum", True, 2 * T, id="sum-weighted"),  # −dL·w_t
    pytest.param("mean", True, 2 * T + 1, id="mean-weighted"),  # + dL/Σw once
    pytest.param("mean", False, T + 1, id="mean"),  # + dL/T once
])  # fmt: skip
def test_nll_loss(reduction, weighted, flops):
    r = flopcount.count(loss("NegativeLogLikelihoodLoss", reduction, weighted=weighted), mode="train")
    assert r.trainable_params == NB * C * D  # the class weights are NonDifferentiable from opset 13 on
    assert node_backward(loss("NegativeLogLikelihoodLoss", reduction, weighted=weighted),
                         "NegativeLogLikelihoodLoss").flops == flops


@pytest.mark.parametrize("reduction, weighted, n_outputs, flops", [
    # per position: C exps of log_prob, × g_t (C), − g_t at the label (1)
    pytest.param("mean", False, 1, T * (2 * C + 1) + 1, id="mean"),
    pytest.param("sum", True, 1, T * (2 * C + 1) + T, id="sum-weighted"),
    # log_prob's gradient too: Σ dLP (C − 1), × softmax (C), − (C), added into dS (C)
    pytest.param("none", False, 2, T * (2 * C + 1) + T * (4 * C - 1), id="none-with-log-prob"),
])  # fmt: skip
def test_softmax_cross_entropy(reduction, weighted, n_outputs, flops):
    m = loss("SoftmaxCrossEntropyLoss", reduction, weighted=weighted, n_outputs=n_outputs)
    back = node_backward(m, "SoftmaxCrossEntropyLoss")
    assert (back.flops, back.transcendentals) == (flops, T * C)


@pytest.mark.parametrize("op, reduction, flops", [
    # the class weights' gradient (opset 12 leaves their category unknown; flopcount takes opset 13's
    # NonDifferentiable, so a count never asks for it): the formula on its own
    pytest.param("NegativeLogLikelihoodLoss", "none", 3 * T, id="nll-none"),  # −x, × dL_t, scatter-add
    pytest.param("NegativeLogLikelihoodLoss", "sum", 2 * T + C, id="nll-sum"),  # −x, add; × dL per class
    pytest.param("SoftmaxCrossEntropyLoss", "mean", 3 * T + C + 1, id="sce-mean"),  # (a − L), dL/W once
])  # fmt: skip
def test_loss_weight_gradient_formula(op, reduction, flops):
    inputs = [("scores", (NB, C, D)), ("labels", (NB, D), I64), ("w", (C,))]
    out = [(NB, D) if reduction == "none" else ()]
    assert direct_backward(op, inputs, out, (False, False, True), 12, reduction=reduction).flops == flops
    # the scores too: both gradients, the mean's division counted once
    scores = (T * (2 * C + 1) if op == "SoftmaxCrossEntropyLoss" else T) + T
    assert direct_backward(op, inputs, out, (True, False, True), 12, reduction=reduction).flops == flops + scores


def test_loss_weights_are_not_trained_at_opset_12():
    m = loss("NegativeLogLikelihoodLoss", "sum", weighted=True, opset=12)
    r = flopcount.count(m, mode="train")
    assert r.trainable_params == NB * C * D  # the scores only
    assert node_backward(m, "NegativeLogLikelihoodLoss").flops == T + T  # dS: −dL scattered, × w


def test_loss_with_data_scores_costs_nothing():
    m = loss("SoftmaxCrossEntropyLoss", "mean", weighted=True, scores_trainable=False, weights_trainable=False)
    assert node_backward(m, "SoftmaxCrossEntropyLoss") == flopcount.Cost()


# --- RotaryEmbedding, SwiGLU, LinearAttention ---------------------------------------------------------

BR, HR, SR, DR = 3, 5, 7, 22  # batch, heads, sequence, head size (even)


def rotary(*, x_trainable=True, caches_trainable=False, rot_dim=0, layout=4, positions=0):
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
    return graph([N("RotaryEmbedding", names, ["y"], **attrs)], inputs, ["y"], inits, opset=23)


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
def test_rotary_embedding(kwargs, flops):
    assert node_backward(rotary(**kwargs), "RotaryEmbedding").flops == flops


def test_rotary_caches_are_not_trainable_parameters():
    r = flopcount.count(rotary(caches_trainable=True), mode="train")
    assert r.trainable_params == BR * HR * SR * DR  # X only


def test_rotary_embedding_data_only():
    assert node_backward(rotary(x_trainable=False), "RotaryEmbedding") == flopcount.Cost()


SW = (3, 5, 7)
NSW = 3 * 5 * 7


@pytest.mark.parametrize("a, b, flops", [
    # σ(αA) again: αA, exp, +1, ÷ (4); dA: 1 − σ, × αA, + 1, × σ, × dY, × B (6); dB: A·σ, × dY (2)
    pytest.param(True, True, 12 * NSW, id="both"),
    pytest.param(True, False, 10 * NSW, id="gate-only"),
    pytest.param(False, True, 6 * NSW, id="value-only"),
])  # fmt: skip
def test_swiglu(a, b, flops):
    inits = [weight(n, SW) for n, trained in (("a", a), ("b", b)) if trained]
    inputs = {n: (F, SW) for n, trained in (("a", a), ("b", b)) if not trained}
    m = graph([N("SwiGLU", ["a", "b"], ["y"], alpha=1.702)], inputs, ["y"], inits, opset=28)
    back = node_backward(m, "SwiGLU")
    assert (back.flops, back.transcendentals) == (flops, NSW)


BL, TL, HQ, HKV, DK, DV = 3, 11, 9, 3, 5, 7  # batch, tokens, query heads, KV heads, key dim, value dim
TOK, P = BL * TL, DK * DV  # tokens in the batch, state size


def linear_attention(rule, trained, *, decay_per_head=False, past=False):
    """LinearAttention with the inputs in ``trained`` as trainable weights, the others data."""
    shapes = {"q": (BL, TL, HQ * DK), "k": (BL, TL, HKV * DK), "v": (BL, TL, HKV * DV)}
    names = ["q", "k", "v", "", "", ""]
    if past:
        shapes["past"], names[3] = (BL, HKV, DK, DV), "past"
    if rule in ("gated", "gated_delta"):
        shapes["decay"], names[4] = (BL, TL, HKV if decay_per_head else HKV * DK), "decay"
    if rule in ("delta", "gated_delta"):
        shapes["beta"], names[5] = (BL, TL, HKV), "beta"
    while not names[-1]:
        names.pop()
    inputs = {n: (F, s) for n, s in shapes.items() if n not in trained}
    inits = [weight(n, s) for n, s in shapes.items() if n in trained]
    node = N("LinearAttention", names, ["y", "state"], q_num_heads=HQ, kv_num_heads=HKV, update_rule=rule)
    return graph([node], inputs, ["y", "state"], inits, opset=27)


SCALE = TOK * HQ * DV  # scale·dO, once
LA_CASES = [
    # rule, trained, options, MACs, non-MAC FLOPs
    # linear, all three: dQ = S·a and dS += q ⊗ a per query head; dK = dS·v, dV = dSᵀk per KV head
    pytest.param("linear", "qkv", {}, TOK * P * (2 * HQ + 2 * HKV), SCALE, id="linear-qkv"),
    # linear, Q only: dQ alone, no state gradient
    pytest.param("linear", "q", {}, TOK * P * HQ, SCALE, id="linear-q-only"),
    # delta, Q only: the same (the state chain is not needed)
    pytest.param("delta", "q", {}, TOK * P * HQ, SCALE, id="delta-q-only"),
    # delta, K only: dS from the read-out; dw = dSᵀk and the correction k ⊗ β·dw; dK = dS·w − S'·β·dw;
    # β·dw per KV head (d_v multiplies)
    pytest.param("delta", "k", {}, TOK * P * (HQ + 2 * HKV + 2 * HKV), SCALE + TOK * HKV * DV, id="delta-k"),
    # gated, decay only (per head): dS from the read-out, dg = exp(g)·Σ dS'·S (P MACs, |decay| multiplies),
    # the carry exp(g)·dS (P multiplies per KV head)
    pytest.param("gated", ("decay",), {"decay_per_head": True}, TOK * P * (HQ + HKV),
                 SCALE + TOK * HKV * P + TOK * HKV, id="gated-decay-per-head"),
    # gated delta, everything but Q, with a past state (never a gradient): K (2), V via β·dw (0), decay (1),
    # the chain (2) per KV head, dβ = uᵀdw (d_v MACs); carry, β·dw, |decay| = TOK·HKV·DK multiplies
    pytest.param("gated_delta", ("k", "v", "decay", "beta"), {"past": True},
                 TOK * P * (HQ + 5 * HKV) + TOK * HKV * DV,
                 SCALE + TOK * HKV * (P + DV) + TOK * HKV * DK, id="gated-delta-kv-decay-beta-past"),
]


@pytest.mark.parametrize("rule, trained, opts, macs, extra", LA_CASES)
def test_linear_attention(rule, trained, opts, macs, extra):
    trained = tuple(trained) if isinstance(trained, str) else trained
    back = node_backward(linear_attention(rule, trained, **opts), "LinearAttention")
    assert (back.flops, back.macs, back.transcendentals) == (2 * macs + extra, macs, 0)


def test_linear_attention_past_state_gets_no_gradient():
    # a trainable-looking float initializer on past_state is NonDifferentiable: not trained, no dS_0 cost
    r = flopcount.count(linear_attention("linear", ("q", "past"), past=True), mode="train")
    assert r.trainable_params == BL * TL * HQ * DK
    (n,) = r.nodes
    assert n.backward.macs == TOK * P * HQ


def test_linear_attention_backward_products_are_twice_the_forward():
    # with every input needing a gradient, the products of linear and delta rules are 2× the forward's
    for rule, trained in (("linear", "qkv"), ("delta", ("q", "k", "v", "beta"))):
        r = flopcount.count(linear_attention(rule, tuple(trained)), mode="train")
        (n,) = r.nodes
        extra = TOK * HKV * DV if rule == "delta" else 0  # dβ = uᵀdw, beyond the state products
        assert n.backward.macs == 2 * n.cost.macs + extra


def test_linear_attention_products_equal_flop_counter():
    # the linear rule's recurrence in torch, its products as bmm (MHA: H_q = H_kv = 3); FlopCounterMode
    # counts forward and backward bmm; flopcount's forward + backward MACs at 2 FLOPs each must agree
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    h = HKV
    q = torch.randn(BL * h, TL, DK, device="meta", requires_grad=True)
    k = torch.randn(BL * h, TL, DK, device="meta", requires_grad=True)
    v = torch.randn(BL * h, TL, DV, device="meta", requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        state = torch.zeros(BL * h, DK, DV, device="meta")
        outs = []
        for t in range(TL):
            state = state + torch.bmm(k[:, t, :, None], v[:, t, None, :])  # k ⊗ v
            outs.append(torch.bmm(q[:, t, None, :], state))  # qᵀ S
        torch.cat(outs, 1).sum().backward()
    shapes = {"q": (BL, TL, h * DK), "k": (BL, TL, h * DK), "v": (BL, TL, h * DV)}
    node = N("LinearAttention", ["q", "k", "v"], ["y", "state"], q_num_heads=h, kv_num_heads=h, update_rule="linear")
    r = flopcount.count(graph([node], {}, ["y"], [weight(n, s) for n, s in shapes.items()], opset=27), mode="train")
    assert counter.get_total_flops() == 2 * (r.forward.macs + r.backward.macs)


# --- element-wise: Shrink, Mod --------------------------------------------------------------------------


def test_shrink():
    assert node_backward(one("Shrink", XR, lambd=0.25, bias=0.5), "Shrink").flops == NXR  # masked dY


def mod(a_shape, b_shape, *, a_trainable, b_trainable, opset):
    inputs = {n: (F, s) for n, s, tr in (("a", a_shape, a_trainable), ("b", b_shape, b_trainable)) if not tr}
    inits = [weight(n, s) for n, s, tr in (("a", a_shape, a_trainable), ("b", b_shape, b_trainable)) if tr]
    return graph([N("Mod", ["a", "b"], ["y"], fmod=1)], inputs, ["y"], inits, opset)


def test_mod_divisor_is_non_differentiable_from_opset_13():
    m = mod(XR, (7, 1), a_trainable=True, b_trainable=True, opset=13)
    assert flopcount.count(m, mode="train").trainable_params == NXR  # B is not trained
    assert node_backward(m, "Mod").flops == 0  # dA = dY, A not broadcast
    # A broadcast over the batch dim: dA sums dY back, |Y| − |A|
    m = mod((7, 9), XR, a_trainable=True, b_trainable=False, opset=13)
    assert node_backward(m, "Mod").flops == NXR - 7 * 9


def test_mod_divisor_gradient_formula():
    # B[7, 1] broadcast over 5 and 9: dB = dY·(Y − A)/B (3 per element), summed back: |Y| − |B|.
    # Opset 10 leaves B's category unknown and opset 13 calls it NonDifferentiable, which flopcount
    # applies to both: a count never asks for dB, so the formula is called on its own.
    inputs = [("a", XR), ("b", (7, 1))]
    assert direct_backward("Mod", inputs, [XR], (False, True), 10, fmod=1).flops == 3 * NXR + NXR - 7
    assert direct_backward("Mod", inputs, [XR], (True, True), 10, fmod=1).flops == 3 * NXR + NXR - 7 + 0
    m = mod(XR, (7, 1), a_trainable=True, b_trainable=True, opset=10)
    assert flopcount.count(m, mode="train").trainable_params == NXR


# --- cumulative, Det ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("op_type, opset, attrs, flops", [
    # 5·9 = 45 lines of L = 7 along axis 1: the reverse running sum, L − 1 adds per line
    pytest.param("CumSum", 18, {}, 45 * 6, id="cumsum"),
    pytest.param("CumSum", 18, {"exclusive": 1, "reverse": 1}, 45 * 5, id="cumsum-exclusive-reverse"),
    # revcumsum(dY·Y)/X: 2 per element and the running sum
    pytest.param("CumProd", 26, {}, 2 * NXR + 45 * 6, id="cumprod"),
    pytest.param("CumProd", 26, {"exclusive": 1}, 2 * NXR + 45 * 5, id="cumprod-exclusive"),
])  # fmt: skip
def test_cumulative(op_type, opset, attrs, flops):
    m = one(op_type, XR, extra_inits=[const("axis", 1)], opset=opset, **attrs)
    assert node_backward(m, op_type).flops == flops


@pytest.mark.parametrize("shape, flops", [
    # B = 3·5 matrices of M = 7: dY·det (1), M right-hand sides through L and U (2M² − M each)
    pytest.param((3, 5, 7, 7), 15 * (2 * 7**3 - 7**2 + 1), id="batched-7x7"),
    pytest.param((9, 9), 2 * 9**3 - 9**2 + 1, id="single-9x9"),
])  # fmt: skip
def test_det(shape, flops):
    assert node_backward(one("Det", shape), "Det").flops == flops
    assert node_backward(one("Det", shape, trainable=False), "Det") == flopcount.Cost()


# --- scatter ----------------------------------------------------------------------------------------------


def scatter(op_type, reduction, data_trainable, updates_trainable):
    if op_type == "ScatterElements":  # updates [5, 3, 9] along axis 1 of data [5, 7, 9]
        idx, upd, attrs = const("idx", [[[0] * 9, [2] * 9, [6] * 9]] * 5), (5, 3, 9), {"axis": 1}
    else:  # ScatterND: 3 index pairs into data [5, 7, 9], each writing a row of 9
        idx, upd, attrs = const("idx", [[0, 1], [4, 6], [2, 3]]), (3, 9), {}
    inputs = {n: (F, s) for n, s, tr in (("data", XR, data_trainable), ("upd", upd, updates_trainable)) if not tr}
    inits = [weight(n, s) for n, s, tr in (("data", XR, data_trainable), ("upd", upd, updates_trainable)) if tr]
    node = N(op_type, ["data", "idx", "upd"], ["y"], reduction=reduction, **attrs)
    return graph([node], inputs, ["y"], [*inits, idx], opset=18)


@pytest.mark.parametrize("op_type, u", [("ScatterElements", 5 * 3 * 9), ("ScatterND", 3 * 9)])
@pytest.mark.parametrize("reduction, data, updates, per_update", [
    pytest.param("none", True, True, 0, id="none"),  # zeroed dY, gathered dY: moves
    pytest.param("add", True, True, 0, id="add"),  # dY, gathered dY: moves
    pytest.param("mul", True, True, 1 + 2, id="mul"),  # dY·Π updates; dY·Y/update
    pytest.param("mul", True, False, 1, id="mul-data-only"),
    pytest.param("max", True, True, 1 + 1, id="max"),  # one comparison with Y per update, each side
    pytest.param("min", False, True, 1, id="min-updates-only"),
])  # fmt: skip
def test_scatter(op_type, u, reduction, data, updates, per_update):
    assert node_backward(scatter(op_type, reduction, data, updates), op_type).flops == per_update * u


# --- Hardmax, TopK: explicit zeros ------------------------------------------------------------------------


def test_hardmax_gradient_is_an_explicit_zero():
    # piecewise constant: dX = 0; the node has a formula (not reported missing), costing nothing
    r = flopcount.count(one("Hardmax", XR, axis=1), mode="train")
    assert not r.backward_unsupported and r.backward == flopcount.Cost()


def test_topk_scatters_dy_into_distinct_positions():
    # dX gets the |Y| = 5·3·9 values moved to their k = 3 positions per row of 7: no arithmetic
    m = one("TopK", XR, extra_inits=[const("k", [3])], n_outputs=2, axis=1)
    r = flopcount.count(m, mode="train")
    assert not r.backward_unsupported and r.backward == flopcount.Cost()
    assert r.trainable_params == NXR
