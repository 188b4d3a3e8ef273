"""Microsoft contrib attention (domain ``com.microsoft``): Attention, MultiHeadAttention, GroupQueryAttention,
RotaryEmbedding and their backward, counted as :mod:`.contrib` says for every fused operator: the projections as
MatMul, the core as the ONNX Attention (:mod:`flopcount.operators.attention`), the rotary embedding at 3 FLOPs
per rotated element."""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.operators import contrib_parts as fused
from flopcount.operators.attention import attention_backward, rotary, sdpa_cost, softcap_cost
from flopcount.operators.contrib_parts import MS
from flopcount.operators.matmul import matmul_backward
from flopcount.operators.normalization import normalization_backward, root_mean_square
from flopcount.registry import backward, formula

# --------------------------------------------------------------------------------------------
# attention


def _rotary(ctx: NodeContext, elements: int, rotated: int, head: int) -> Cost:
    """Rotary embedding on ``elements`` elements of which ``rotated`` of every ``head`` turn: 3 FLOPs
    per rotated element (6 per pair), as the ONNX RotaryEmbedding is counted."""
    return rotary(ctx.convention, (elements // head) * rotated)


def _total_length(ctx: NodeContext, past: int, new: int, past_length_input: int | None) -> int:
    """T = P + S_kv; with a shared KV buffer (a past_sequence_length input), P is that input's value
    when known, else the whole buffer counts as past (an upper bound)."""
    if past_length_input is not None and ctx.has_input(past_length_input):
        value = ctx.value(past_length_input)
        if value is not None:
            return int(value.reshape(-1)[0]) + new
        return past
    return past + new


@formula("Attention", family="attention", domain=MS)
def ms_attention(
    ctx: NodeContext,
    *,
    num_heads: int,
    qkv_hidden_sizes: list[int] | None = None,
    unidirectional: int = 0,
    do_rotary: int = 0,
    rotary_embedding_dim: int = 0,
    past_present_share_buffer: int = 0,
    **_,
) -> Cost:
    """FLOPs = 2·B·S·D_in·(D_q + D_k + D_v) [QKV projection] + B·S·(D_q + D_k + D_v) [its bias]
    + 2·R·T·(E + E_v) [Q·Kᵀ, probs·V] + R·E + B·H·T·E [√scale on Q and K] + R·(5T − 2) [softmax]
    + R·T [mask, when masked] + R·T [attention_bias]; MACs = B·S·D_in·(D_q + D_k + D_v) + R·T·(E + E_v);
    transcendentals = R·T; H = num_heads, E = D_q/H, E_v = D_v/H, R = B·H·S, T = P + S.

    Self-attention with the Q, K, V projections merged into one weight [D_in, D_q + D_k + D_v]
    (D_q = D_k = D_v = weight.shape[1]/3 unless qkv_hidden_sizes says otherwise), then the ONNX
    Attention core (:mod:`flopcount.operators.attention`): dense S × T scores also when causal or
    masked. "Masked": a mask_index input or unidirectional = 1 (one add of the combined mask per
    score; building it is not counted). The cache ``past`` (2, B, H, P, E) is concatenated at no cost;
    with past_present_share_buffer, P is the past_sequence_length value when known, else the buffer
    length (an upper bound). do_rotary adds the rotary embedding of Q and K, 3 FLOPs per rotated
    element. The projection bias follows ``count_bias``.
    """
    x, w = ctx.shape(0), ctx.shape(1)
    d_q, d_k, d_v = qkv_hidden_sizes if qkv_hidden_sizes else (w[1] // 3,) * 3
    b, s = x[0], x[1]
    tokens = prod(x[:-1])
    proj_macs = tokens * x[-1] * w[1]
    cost = Cost(flops=ctx.convention.fc_flops_per_mac * proj_macs, macs=proj_macs)
    if ctx.has_input(2) and ctx.convention.count_bias:
        cost += ctx.convention.weighted(add=tokens * w[1])
    past = ctx.shape(4)[3] if ctx.has_input(4) else 0
    t = _total_length(ctx, past, s, 6 if past_present_share_buffer else None)
    biases = (ctx.has_input(3) or bool(unidirectional)) + fused.given(ctx, 5)
    return cost + projected_attention(ctx, b, s, t, (d_q, d_k, d_v), num_heads, biases, do_rotary, rotary_embedding_dim)


def projected_attention(
    ctx: NodeContext, b: int, s: int, t: int, widths: tuple[int, int, int], num_heads: int, biases: int,
    do_rotary: int, rotary_embedding_dim: int,
) -> Cost:
    """What com.microsoft Attention costs after its QKV projection and the projection's bias: the ONNX
    Attention core over B·H·S query rows and T keys (E = D_q/H, E_v = D_v/H), ``biases`` score-sized
    additions (a mask, an attention bias), the rotary embedding of Q and K when ``do_rotary``. Shared
    with QAttention, whose projection is an integer product."""
    d_q, d_k, d_v = widths
    e, e_v = d_q // num_heads, d_v // num_heads
    cost = sdpa_cost(ctx.convention, b, num_heads, num_heads, s, t, e, e_v)
    cost += ctx.convention.weighted(add=b * num_heads * s * t * biases)
    if do_rotary:
        cost += _rotary(ctx, b * s * (d_q + d_k), rotary_embedding_dim or e, e)
    return cost


@formula("MultiHeadAttention", family="attention", domain=MS)
def multi_head_attention(ctx: NodeContext, *, num_heads: int, unidirectional: int = 0, **_) -> Cost:
    """FLOPs = 2·R·T·(E + E_v) [Q·Kᵀ, probs·V] + R·E + B·H·T·E [√scale on Q and K] + R·(5T − 2)
    [softmax] + B·S·H·E + B·L·H·(E + E_v) [projection bias] + R·T [key_padding_mask or
    unidirectional] + R·T [attention_bias]; MACs = R·T·(E + E_v); transcendentals = R·T;
    H = num_heads, R = B·H·S, T = P + L.

    Q, K, V already projected: query (B, S, H·E) or packed QKV (B, S, H, 3, E); key/value
    (B, L, H·E) and (B, L, H·E_v), packed KV (B, L, H, 2, E), or BNSH (B, H, L, E) as reused
    cross-attention keys. The bias of the input projection (when given, under ``count_bias``) is
    added to Q and to K and V when they are new (not BNSH). past_key/past_value (B, H, P, E) make
    T = P + L; with a past_sequence_length input (shared buffer), P is its value when known, else the
    buffer length (an upper bound). Then the ONNX Attention core, dense scores.
    """
    q = ctx.shape(0)
    h = num_heads
    projected_kv = True
    if len(q) == 5:  # packed QKV
        b, s, e = q[0], q[1], q[4]
        l, e_v = s, e
    else:
        b, s, e = q[0], q[1], q[2] // h
        k = ctx.shape(1)
        if len(k) == 5:  # packed KV
            l, e_v = k[1], k[4]
        elif len(k) == 4:  # BNSH: reused keys and values
            l, e_v, projected_kv = k[2], ctx.shape(2)[3], False
        else:
            l, e_v = k[1], ctx.shape(2)[2] // h
    past = ctx.shape(6)[2] if ctx.has_input(6) else 0
    t = _total_length(ctx, past, l, 8)
    cost = sdpa_cost(ctx.convention, b, h, h, s, t, e, e_v)
    if ctx.has_input(3) and ctx.convention.count_bias:
        cost += ctx.convention.weighted(add=b * s * h * e + (b * l * h * (e + e_v) if projected_kv else 0))
    scores = b * h * s * t
    return cost + ctx.convention.weighted(add=scores * ((ctx.has_input(4) or bool(unidirectional)) + fused.given(ctx, 5)))


@formula("GroupQueryAttention", family="attention", domain=MS)
def group_query_attention(
    ctx: NodeContext,
    *,
    num_heads: int,
    kv_num_heads: int,
    causal: int = 1,
    local_window_size: int = -1,
    softcap: float = 0.0,
    do_rotary: int = 0,
    smooth_softmax: int = -1,
    **_,
) -> Cost:
    """FLOPs = 2·R·T·2E [Q·Kᵀ, probs·V] + R·E + B·H_kv·T·E [√scale on Q and K] + R·(5T − 2) [softmax]
    + R·T [causal or windowed] + R·T [attention_bias] + 3·R·T [softcap] + 3R [head sink]
    + 3·B·S·(H_q + H_kv)·D_rot [rotary] + B·S·(H_q + H_kv)·E [Q/K RMS norm]
    + B·H_kv·(T + S)·E per quantized cache; MACs = 2·R·T·E; transcendentals = R·T (+ R·T softcap,
    + R head sink, + B·S·(H_q + H_kv) norm); R = B·H_q·S.

    query (B, S, H_q·E) with key and value (B, S, H_kv·E), or packed QKV (B, S, (H_q + 2·H_kv)·E);
    the cache past_key (B, H_kv, P, E). T is the total_sequence_length value when known, else P + S
    (an upper bound when the cache is a shared max-length buffer); the dense S × T scores are
    counted also under causal and sliding-window masks. Terms when enabled: the combined mask add
    (causal = 1, the default, or local_window_size ≥ 0), attention_bias, softcap·tanh(s/softcap)
    (3 FLOPs and a tanh per score), head_sink or smooth_softmax = 1 (a subtract, an exp and an add
    per row), do_rotary on Q and the new K (D_rot = 2·cos_cache.shape[1], else E; 3 FLOPs per rotated
    element), q_norm_weight/k_norm_weight (one FLOP per element and a 1/sqrt per head and token, as
    RMSNormalization), k_scale/v_scale (a multiply dequantizing each of the T cached rows read and
    a divide quantizing each of the S new rows; rounding not counted).
    """
    q = ctx.shape(0)
    b, s = q[0], q[1]
    h_q, h_kv = num_heads, kv_num_heads
    e = q[2] // h_q if ctx.has_input(1) else q[2] // (h_q + 2 * h_kv)
    total = ctx.value(6) if ctx.has_input(6) else None
    if total is not None:
        t = int(total.reshape(-1)[0])
    else:
        t = (ctx.shape(3)[2] if ctx.has_input(3) else 0) + s
    conv = ctx.convention
    cost = sdpa_cost(conv, b, h_q, h_kv, s, t, e, e)
    rows = b * h_q * s
    scores = rows * t
    masked = bool(causal) or local_window_size >= 0
    cost += conv.weighted(add=scores * (masked + fused.given(ctx, 10)))
    if softcap:
        cost += softcap_cost(conv, scores)
    if ctx.has_input(11) or smooth_softmax == 1:
        cost += conv.weighted(add=2 * rows, exp=rows)
    heads_tokens = b * s * (h_q + h_kv)
    if do_rotary:
        rot = 2 * ctx.shape(7)[1] if ctx.has_input(7) else e
        cost += _rotary(ctx, heads_tokens * e, rot, e)
    if ctx.has_input(14):
        cost += root_mean_square(conv, heads_tokens * e, heads_tokens)
    quantized = fused.given(ctx, 12) + fused.given(ctx, 13)
    cost += conv.weighted(mul=quantized * b * h_kv * t * e, div=quantized * b * h_kv * s * e)
    return cost


@formula("RotaryEmbedding", family="elementwise", domain=MS)
def ms_rotary_embedding(ctx: NodeContext, *, num_heads: int = 0, rotary_embedding_dim: int = 0, **_) -> Cost:
    """FLOPs = 3·|X|·D_rot/D_head: each rotated pair (x1, x2) costs 6 (x1·cos − x2·sin and
    x1·sin + x2·cos), D_rot = 2·cos_cache.shape[1] of each head's D_head.

    X is (B, S, H·D_head), (B, H, S, D_head) or packed (tokens, H·D_head). D_head = X.shape[3] for
    4-D X, else hidden/num_heads; without num_heads (3-D X) every element is rotated (D_rot =
    D_head). cos/sin come from the caches (no transcendentals); gathering them by position_ids and
    copying the unrotated tail are free. As the ONNX RotaryEmbedding.
    """
    x = ctx.shape(0)
    rot = 2 * ctx.shape(2)[1] if not rotary_embedding_dim else rotary_embedding_dim
    if len(x) == 4:
        head = x[3]
    elif num_heads:
        head = x[-1] // num_heads
    else:
        head = rot
    return _rotary(ctx, prod(x), rot, head)



def _rotary_backward(rotated: int) -> Cost:
    """dX = the rotation of dY by −θ: 3 FLOPs per rotated element, as the forward (flat, as every
    backward formula)."""
    return Cost(flops=3 * rotated)



# --- attention ------------------------------------------------------------------------------


def _past(b: int, heads: int, t: int, new: int, e: int) -> tuple[int, ...] | None:
    """The past_key part of the ONNX Attention that makes its total length T (None when T = new)."""
    return (b, heads, t - new, e) if t > new else None


@backward("Attention", domain=MS)
def ms_attention_backward(
    ctx: NodeContext,
    *,
    num_heads: int,
    qkv_hidden_sizes: list[int] | None = None,
    do_rotary: int = 0,
    rotary_embedding_dim: int = 0,
    past_present_share_buffer: int = 0,
    **_,
) -> Cost:
    """The ONNX Attention's backward with Q, K, V needing gradients (2·R·T·(E + E_v) MACs, R·(4T − 1)
    through the softmax, R·E + B·H·T·E scaling) + 3·B·S·(D_q + D_k)·D_rot/E [rotary, with do_rotary]
    + dbias = Σ over tokens (B·S·D − D additions, D = D_q + D_k + D_v) + dX = dQKV·Wᵀ and
    dW = Xᵀ·dQKV: B·S·D_in·D MACs each, for each that needs a gradient; R = B·H·S, T = P + S.

    The unfused graph: MatMul(input, weights), Add(bias), Split, the rotary embedding of Q and K,
    then the ONNX Attention (:func:`flopcount.operators.attention.attention_backward`, which gives
    the mask, attention_bias and past no gradient). Q, K and V need gradients when the input, the
    weights or the bias does. The bias gradient follows ``count_bias``, as the forward; the rotary
    backward rotates dQ and dK back, 3 FLOPs per rotated element.
    """
    x, w = ctx.shape(0), ctx.shape(1)
    d_q, d_k, d_v = qkv_hidden_sizes if qkv_hidden_sizes else (w[1] // 3,) * 3
    b, s = x[0], x[1]
    tokens = prod(x[:-1])
    qkv = (*x[:-1], w[1])
    proj_needs = fused.needs(ctx, 0, 1)
    cost = matmul_backward(fused.part(ctx, "MatMul", [x, w], [qkv], [ctx.needs_grad(0), ctx.needs_grad(1)]))
    if ctx.convention.count_bias:
        cost += fused.add_backward(ctx, qkv, proj_needs, 2)
    needs = proj_needs or ctx.needs_grad(2)
    if not needs:
        return cost
    e = d_q // num_heads
    if do_rotary:
        cost += _rotary_backward(tokens * (d_q + d_k) // e * (rotary_embedding_dim or e))
    past = ctx.shape(4)[3] if ctx.has_input(4) else 0
    t = _total_length(ctx, past, s, 6 if past_present_share_buffer else None)
    core = fused.part(ctx, "Attention", [(b, s, d_q), (b, s, d_k), (b, s, d_v), None, _past(b, num_heads, t, s, e)],
                 [(b, s, d_v)], [True, True, True])
    return cost + attention_backward(core, q_num_heads=num_heads, kv_num_heads=num_heads)


@backward("MultiHeadAttention", domain=MS)
def multi_head_attention_backward(ctx: NodeContext, *, num_heads: int, **_) -> Cost:
    """The ONNX Attention's backward for the Q, K, V that need gradients (R·T·E_v MACs for dV; when
    dQ or dK, R·T·E_v MACs for dP, R·(4T − 1) through the softmax and R·T·E MACs and the scaling
    per dQ and dK) + dbias = Σ over tokens of dQ, dK, dV (B·S·H·E − H·E + B·L·H·(E + E_v) − H·(E + E_v) additions,
    the K and V terms only when they are projected here); R = B·H·S, T = P + L.

    The unfused graph: Add(query, bias_q), Add(key, bias_k), Add(value, bias_v) (the bias is the
    input projection's: its gradient follows ``count_bias``, as the forward), then the ONNX
    Attention (:func:`flopcount.operators.attention.attention_backward`). Q needs a gradient when
    the query or the bias does; K and V when their input (the packed query or key) or the bias
    does, the bias not for BNSH (already projected) keys and values. Masks, attention_bias and the
    past get no gradient, as in the ONNX Attention.
    """
    q = ctx.shape(0)
    h = num_heads
    projected_kv = True
    bias = ctx.needs_grad(3)
    if len(q) == 5:  # packed QKV: K and V come from the query
        b, s, e = q[0], q[1], q[4]
        l, e_v = s, e
        q_in = k_in = v_in = ctx.needs_grad(0)
    else:
        b, s, e = q[0], q[1], q[2] // h
        k = ctx.shape(1)
        q_in = ctx.needs_grad(0)
        if len(k) == 5:  # packed KV
            l, e_v = k[1], k[4]
            k_in = v_in = ctx.needs_grad(1)
        elif len(k) == 4:  # BNSH: reused keys and values
            l, e_v, projected_kv = k[2], ctx.shape(2)[3], False
            k_in, v_in = ctx.needs_grad(1), ctx.needs_grad(2)
        else:
            l, e_v = k[1], ctx.shape(2)[2] // h
            k_in, v_in = ctx.needs_grad(1), ctx.needs_grad(2)
    q3, k3, v3 = (b, s, h * e), (b, l, h * e), (b, l, h * e_v)
    cost = Cost()
    if ctx.has_input(3) and ctx.convention.count_bias:
        cost += fused.add_backward(ctx, q3, q_in, (h * e,), bias)
        if projected_kv:
            cost += fused.add_backward(ctx, k3, k_in, (h * e,), bias) + fused.add_backward(ctx, v3, v_in, (h * e_v,), bias)
    q_in = q_in or bias  # the bias is added to Q, and to K and V when they are projected here
    if projected_kv:
        k_in, v_in = k_in or bias, v_in or bias
    past = ctx.shape(6)[2] if ctx.has_input(6) else 0
    t = _total_length(ctx, past, l, 8)
    core = fused.part(ctx, "Attention", [q3, k3, v3, None, _past(b, h, t, l, e)], [(b, s, h * e_v)], [q_in, k_in, v_in])
    return cost + attention_backward(core, q_num_heads=h, kv_num_heads=h)


@backward("GroupQueryAttention", domain=MS, buffers=(7, 8, 12, 13))
def group_query_attention_backward(ctx: NodeContext, *, num_heads: int, kv_num_heads: int, do_rotary: int = 0,
                                   **_) -> Cost:
    """The ONNX Attention's backward (GQA) for the Q, K, V that need gradients (R·T·E MACs for dV;
    when dQ or dK, R·T·E MACs for dP, R·(4T − 1) through the softmax and R·T·E MACs and the scaling
    per dQ and dK) + 3·B·S·(H_q·[dQ] + H_kv·[dK])·D_rot [rotary] + 7·|Q| and 7·|K| [Q/K RMS norm; 2·|Q| for the
    norm weight alone] + 4R − H_q, R transcendentals [head_sink]; R = B·H_q·S.

    The unfused graph: RMSNormalization of each Q and K head (q_norm_weight, k_norm_weight), the
    rotary embedding of Q and the new K (the backward rotates dQ and dK back, 3 FLOPs per rotated
    element), then the ONNX Attention (:func:`flopcount.operators.attention.attention_backward`,
    which counts nothing for the mask, causal or windowed, softcap and cache). The head sink's
    gradient, per score row: its probability exp(sink − L) from the row's log-sum-exp L (a
    subtraction and an exp), times the row's Σ dP·P that the softmax backward already has (a
    multiply), summed over each head's B·S rows (R − H_q additions); smooth_softmax alone has no
    parameter. T as in the forward. cos_cache, sin_cache, k_scale and v_scale are never trained
    (buffers); the quantized cache passes no gradient.
    """
    q = ctx.shape(0)
    b, s = q[0], q[1]
    h_q, h_kv = num_heads, kv_num_heads
    packed = not ctx.has_input(1)
    e = q[2] // (h_q + 2 * h_kv) if packed else q[2] // h_q
    q_in = ctx.needs_grad(0)
    k_in, v_in = (q_in, q_in) if packed else (ctx.needs_grad(1), ctx.needs_grad(2))
    cost = Cost()
    for heads, needs_in, norm in ((h_q, q_in, 14), (h_kv, k_in, 15)):
        if ctx.has_input(norm):
            part = fused.part(ctx, "RMSNormalization", [(b, s, heads, e), ctx.inputs[norm]], [(b, s, heads, e)],
                         [needs_in, ctx.needs_grad(norm)])
            cost += normalization_backward(part)
    q_needs, k_needs = q_in or ctx.needs_grad(14), k_in or ctx.needs_grad(15)
    if do_rotary:
        rot = 2 * ctx.shape(7)[1] if ctx.has_input(7) else e
        cost += _rotary_backward(b * s * rot * (h_q * q_needs + h_kv * k_needs))
    total = ctx.value(6) if ctx.has_input(6) else None
    t = int(total.reshape(-1)[0]) if total is not None else (ctx.shape(3)[2] if ctx.has_input(3) else 0) + s
    core = fused.part(ctx, "Attention", [(b, s, h_q * e), (b, s, h_kv * e), (b, s, h_kv * e), None, _past(b, h_kv, t, s, e)],
                 [(b, s, h_q * e)], [q_needs, k_needs, v_in])
    cost += attention_backward(core, q_num_heads=h_q, kv_num_heads=h_kv)
    if ctx.needs_grad(11):
        rows = b * h_q * s
        cost += Cost(flops=4 * rows - h_q, transcendentals=rows)
    return cost


@backward("RotaryEmbedding", domain=MS, buffers=(2, 3))
def ms_rotary_embedding_backward(ctx: NodeContext, *, num_heads: int = 0, rotary_embedding_dim: int = 0,
                                 **_) -> Cost:
    """FLOPs = 3·|X|·D_rot/D_head when X needs a gradient: dX rotates dY back by −θ (per pair
    dy1·cos + dy2·sin and −dy1·sin + dy2·cos, 6 FLOPs), the unrotated tail passes through.

    D_rot and D_head as in the forward. cos_cache and sin_cache are never trained (buffers); the
    position ids are integers.
    """
    if not ctx.needs_grad(0):
        return Cost()
    x = ctx.shape(0)
    rot = 2 * ctx.shape(2)[1] if not rotary_embedding_dim else rotary_embedding_dim
    head = x[3] if len(x) == 4 else (x[-1] // num_heads if num_heads else rot)
    return _rotary_backward(prod(x) // head * rot)
