"""Attention and the fused transformer-block operators around it.

Vocabulary: B batch, H_q query heads, H_kv key/value heads (H_kv divides H_q: GQA, MQA when
H_kv = 1), S_q query length, S_kv key/value length of this call, P past (cached) length,
T = P + S_kv the total key length, E the Q/K head size, E_v the V head size, R = B·H_q·S_q the
number of score rows. K/V heads are shared by H_q / H_kv query heads but every product is per
*query* head, so H_q appears in the product terms and H_kv only where K itself is touched.

Dense counting: the formulas count the whole S_q × T score matrix, as ONNX defines the
computation, also under causal, sliding-window or padding masks (a kernel that skips masked
blocks does less). Softmax over a score row of T elements is the stable form of
:func:`flopcount.operators.softmax.softmax_rows`: 5T − 2 FLOPs and T exponentials.

Weighted conventions (``aiperf``): products at the convention's FLOPs per MAC (2), the scaling,
mask and bias terms as the multiplies and additions they are (weight 1), the softmax at its
primitives' weights (15T − 2 per row), softcap as a divide, a tanh and a multiply per score.
"""

from __future__ import annotations

from math import prod

from flopcount.context import NodeContext
from flopcount.conventions import Convention
from flopcount.cost import Cost
from flopcount.masks import AttentionMask, ExecutedPairs
from flopcount.operators.elementwise import activation
from flopcount.registry import backward, formula, saves
from flopcount.saved import STAT_BYTES, Saved, element_bytes, keeps


def _attention_dims(ctx: NodeContext, q_num_heads: int | None, kv_num_heads: int | None):
    """(B, H_q, H_kv, S_q, S_kv, E, E_v) from Q, K, V in the 3-D or the 4-D layout."""
    q, k, v = ctx.shape(0), ctx.shape(1), ctx.shape(2)
    if len(q) == 3:
        if not q_num_heads or not kv_num_heads:
            raise ValueError("3-D Q, K, V need the q_num_heads and kv_num_heads attributes")
        b, s_q, hidden_q = q
        return b, q_num_heads, kv_num_heads, s_q, k[1], hidden_q // q_num_heads, v[2] // kv_num_heads
    b, h_q, s_q, e = q
    return b, h_q, k[1], s_q, k[2], e, v[3]


def sdpa_cost(convention: Convention, b: int, h_q: int, h_kv: int, s_q: int, t: int, e: int, e_v: int,
          kept: ExecutedPairs | None = None) -> Cost:
    """Q·Kᵀ and probs·V products, √scale applied to Q and to K, softmax of the R score rows (probs); over the
    ``kept`` score entries (per head, summed over the batch) when a masked kernel runs only those."""
    kept = kept or ExecutedPairs(b * s_q * t, b * s_q)
    macs = h_q * kept.pairs * (e + e_v)
    scaling = convention.weighted(mul=b * h_q * s_q * e + b * h_kv * t * e)
    return Cost(flops=convention.fc_flops_per_mac * macs, macs=macs) + scaling + softmax_entries(
        convention, h_q * kept.rows, h_q * kept.pairs)


def softmax_entries(convention: Convention, rows: int, entries: int) -> Cost:
    """A stable softmax over ``entries`` elements in ``rows`` non-empty rows: per row of n, n − 1 comparisons,
    2n − 1 additions, n exps and n divisions (:func:`~flopcount.operators.softmax.softmax_rows` when every row
    has the same n)."""
    if rows == 0:
        return Cost()
    return convention.weighted(cmp=entries - rows, add=2 * entries - rows, exp=entries, div=entries)


def executed_pairs(convention: Convention, b: int, s_q: int, t: int, mask: AttentionMask | None) -> ExecutedPairs:
    """The score entries (per head, over the batch) that are computed: all B·S_q·T under ``--attention full``
    (the default, what the graph computes), those ``mask`` keeps under ``--attention executed``."""
    if convention.executed is None or mask is None or not mask.structured:
        return ExecutedPairs(b * s_q * t, b * s_q)
    return mask.pairs(b, s_q, t)


def own_mask(convention: Convention, is_causal: int, left_window_size: int, right_window_size: int,
             index: int | None = None) -> AttentionMask | None:
    """The mask an Attention node states by its attributes (``is_causal``, ``right_window_size`` = 0: causal;
    ``left_window_size`` = w − 1: a window of w keys), with the structure the model's configuration gives for
    the attention at ``index``; None (count full) where neither gives one, or a right window wider than 0
    without ``is_causal`` (keys ahead of the query: not modelled)."""
    given = convention.executed.mask(index or 0) if convention.executed is not None else None
    if not isinstance(given, AttentionMask):
        given = None  # a mask evaluated from an eager attention's graph holds that attention's rows only
    causal = bool(is_causal) or right_window_size == 0
    if right_window_size > 0 and not causal:
        return None
    window = left_window_size + 1 if left_window_size >= 0 else None
    if not causal and window is None:
        return given
    return AttentionMask(causal=causal or bool(given and given.causal), window=window or (given and given.window),
                         lengths=given.lengths if given else (), segments=given.segments if given else (),
                         source="the Attention node's attributes")


def with_graph_mask(mask: AttentionMask | None, graph) -> AttentionMask | None:
    """The mask of an Attention node from its attributes (``mask``) and the one evaluated from its ``attn_mask``
    input (``graph``, a :class:`flopcount.pipeline.graph_masks.GraphMask`): the graph's alone where the attributes give none;
    both kept (causal, the narrower window) where the graph's has a known structure; else the attributes' (which
    keep at least what both keep)."""
    if graph is None:
        return mask
    if mask is None:
        return graph
    s = graph.structure
    if s is None:
        return mask
    windows = [w for w in (mask.window, s.window) if w is not None]
    return AttentionMask(causal=mask.causal or s.causal, window=min(windows) if windows else None,
                         lengths=s.lengths or mask.lengths, segments=s.segments or mask.segments,
                         source=f"{mask.source} and {s.source}")


def score_product_macs(ctx: NodeContext, macs: int) -> int:
    """The MACs of an eager attention's MatMul (Q·Kᵀ → scores [B, …, S_q, T], or probs [B, …, S_q, T]·V) under
    ``--attention executed``: the kept pairs times the inner (Q·Kᵀ: E) or outer (probs·V: E_v) head size per
    head; ``macs`` unchanged for any other MatMul or under ``--attention full``."""
    executed = ctx.convention.executed
    role = executed.role(ctx.name) if executed is not None else None
    if role is None or role[0] not in ("scores", "values"):
        return macs
    kind, index = role
    scores = ctx.out_shape() if kind == "scores" else ctx.shape(0)
    if len(scores) < 3:
        return macs
    b, s_q, t = scores[0], scores[-2], scores[-1]
    heads = prod(scores[1:-2])
    width = ctx.shape(0)[-1] if kind == "scores" else ctx.out_shape()[-1]
    return heads * executed_pairs(ctx.convention, b, s_q, t, executed.mask(index)).pairs * width


def softcap_cost(convention: Convention, scores: int) -> Cost:
    """softcap·tanh(s/softcap) on ``scores`` scores: a divide, a tanh and a multiply each (3 FLOPs and
    a tanh flat)."""
    return convention.weighted(div=scores, mul=scores) + activation(convention, "Tanh", scores)


@formula("Attention", family="attention")
def attention(
    ctx: NodeContext,
    *,
    q_num_heads: int | None = None,
    kv_num_heads: int | None = None,
    is_causal: int = 0,
    softcap: float = 0.0,
    left_window_size: int = -1,
    right_window_size: int = -1,
    **_,
) -> Cost:
    """FLOPs = 2·R·T·(E + E_v) [Q·Kᵀ and probs·V, R·T·(E + E_v) MACs] + B·H_q·S_q·E + B·H_kv·T·E [√scale
    on Q and on K] + R·(5T − 2) [softmax] + R·T [bias add, when masked] + 3·R·T [softcap ≠ 0];
    transcendentals = R·T exps (+ R·T tanh with softcap); R = B·H_q·S_q, T = P + S_kv.

    3-D (B, S, heads·head_size) and 4-D (B, heads, S, head_size) layouts alike; the KV cache
    (past_key/past_value) is concatenated at no cost and makes T = P + S_kv. "Masked" means any of
    attn_mask (bool or float), is_causal, a sliding window or nonpad_kv_seqlen: the combined bias
    is added once per score; building it (comparisons, selects, padding) is not counted. Causal
    and windowed attention count the full dense S_q × T score matrix, as ONNX defines it, unless
    ``--attention executed``: then the products, softmax, bias and softcap run over the pairs the causal mask
    (bottom-right aligned over the cache) and the left window keep (:mod:`flopcount.masks`). softcap
    is softcap·tanh(s/softcap): a division, a tanh and a multiply per score. Not counted: the
    scalar √scale, softmax_precision casts, the fully-masked-row guard, the qk_matmul_output copy.
    ``table3``: one FLOP per MAC in the products.
    """
    b, h_q, h_kv, s_q, s_kv, e, e_v = _attention_dims(ctx, q_num_heads, kv_num_heads)
    t = s_kv + (ctx.shape(4)[2] if ctx.has_input(4) else 0)
    mask = own_mask(ctx.convention, is_causal, left_window_size, right_window_size)
    graph = ctx.convention.executed.operator_mask(ctx.name) if ctx.convention.executed is not None else None
    kept = executed_pairs(ctx.convention, b, s_q, t, with_graph_mask(mask, graph))
    cost = sdpa_cost(ctx.convention, b, h_q, h_kv, s_q, t, e, e_v, kept)
    scores = h_q * kept.pairs
    masked = ctx.has_input(3) or ctx.has_input(6) or is_causal or left_window_size >= 0 or right_window_size >= 0
    if masked:
        cost = cost + ctx.convention.weighted(add=scores)
    if softcap:
        cost = cost + softcap_cost(ctx.convention, scores)
    return cost


@backward("Attention")
def attention_backward(ctx: NodeContext, *, q_num_heads: int | None = None, kv_num_heads: int | None = None,
                       is_causal: int = 0, left_window_size: int = -1, right_window_size: int = -1, **_) -> Cost:
    """dP = dO·Vᵀ and dV = Pᵀ·dO: R·T·E_v MACs each; dS through the softmax: R·(4T − 1); dQ = dS·K
    and dK = dSᵀ·Q: R·T·E MACs each; only for the inputs that need a gradient (dP and dS when Q or
    K does). With all three: twice the forward products. The scaling is applied to dQ and dK
    (R·E + B·H_kv·T·E). The forward's mask, softcap and cache need nothing more here. Under
    ``--attention executed`` a masked kernel's backward runs the pairs its forward kept: R·T becomes the kept
    pairs and R the rows that keep any.
    """
    b, h_q, h_kv, s_q, s_kv, e, e_v = _attention_dims(ctx, q_num_heads, kv_num_heads)
    t = s_kv + (ctx.shape(4)[2] if ctx.has_input(4) else 0)
    mask = own_mask(ctx.convention, is_causal, left_window_size, right_window_size)
    graph = ctx.convention.executed.operator_mask(ctx.name) if ctx.convention.executed is not None else None
    kept = executed_pairs(ctx.convention, b, s_q, t, with_graph_mask(mask, graph))
    pairs, rows = h_q * kept.pairs, h_q * kept.rows
    q, k, v = ctx.needs_grad(0), ctx.needs_grad(1), ctx.needs_grad(2)
    macs = pairs * e_v * v
    flops = 0
    if q or k:
        macs += pairs * e_v + pairs * e * (q + k)
        flops += 4 * pairs - rows + h_q * b * s_q * e * q + b * h_kv * t * e * k
    return Cost(flops=ctx.convention.fc_flops_per_mac * macs + flops, macs=macs)


@formula("FlexAttention", family="attention", domain="ai.onnx.preview")
def flex_attention(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·R·S·(E + E_v) [Q·Kᵀ and probs·V, R·S·(E + E_v) MACs] + |Q| + |K| [√scale on Q and K]
    + R·(5S − 2) [softmax]; transcendentals = R·S; R = B·H_q·L rows of S = kv_seq_len scores.

    Rank-4 Q (B, H_q, L, E), K (B, H_kv, S, E), V (B, H_kv, S, E_v); K/V heads shared under GQA.
    The score_mod and prob_mod subgraph attributes are NOT counted (their cost is left out, so a
    mask or bias expressed there adds nothing); nor are the softmax_precision casts.
    ``table3``: one FLOP per MAC in the products.
    """
    b, h_q, h_kv, s_q, s_kv, e, e_v = _attention_dims(ctx, None, None)
    return sdpa_cost(ctx.convention, b, h_q, h_kv, s_q, s_kv, e, e_v)


@backward("FlexAttention", domain="ai.onnx.preview")
def flex_attention_backward(ctx: NodeContext, **_) -> Cost:
    """The backward of scaled dot-product attention, as Attention's: dP = dO·Vᵀ and dV = Pᵀ·dO
    (R·S·E_v MACs each), dS through the softmax R·(4S − 1), dQ = dS·K and dK = dSᵀ·Q (R·S·E MACs
    each), each only for the inputs that need a gradient, plus the scaling of dQ and dK.

    As in the forward, the score_mod and prob_mod subgraphs are not counted.
    """
    return attention_backward(ctx)


@formula("LinearAttention", family="attention")
def linear_attention(
    ctx: NodeContext, *, q_num_heads: int, kv_num_heads: int, update_rule: str = "gated_delta", **_
) -> Cost:
    """MACs = B·T·d_k·d_v·(H_kv·(1 + δ) + H_q); FLOPs = 2·MACs + B·T·H_q·d_v [scale] + γ·(|decay| +
    B·T·H_kv·d_k·d_v) [exp(g), decay of the state] + δ·2·B·T·H_kv·d_v [v − Sᵀk, times β];
    transcendentals = γ·|decay|; γ = 1 for gated rules, δ = 1 for delta rules.

    The recurrence as the spec states it, token by token (T = sequence length, d_k = E/H_q,
    d_v = E_v/H_kv): per KV head the state update S += k⊗v (d_k·d_v MACs), with δ the retrieval
    Sᵀk (d_k·d_v MACs), with γ the decay exp(g)·S (d_k·d_v multiplies, one exp per element of
    decay); per query head the read-out qᵀS (d_k·d_v MACs) and the scale (d_v multiplies). The
    chunk-parallel algorithm an implementation may use instead is not modelled. ``table3``: one
    FLOP per MAC.
    """
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    if gated and not ctx.has_input(4):
        raise ValueError(f"update_rule {update_rule!r} needs the decay input")
    b, t, hidden_q = ctx.shape(0)
    d_k = hidden_q // q_num_heads
    d_v = ctx.shape(2)[2] // kv_num_heads
    tokens = b * t
    state = d_k * d_v
    macs = tokens * state * (kv_num_heads * (1 + delta) + q_num_heads)
    muls = tokens * q_num_heads * d_v  # the scale
    exps = ctx.numel(4) if gated else 0
    if gated:
        muls += tokens * kv_num_heads * state  # the decay of S
    adds = 0
    if delta:
        adds, muls = tokens * kv_num_heads * d_v, muls + tokens * kv_num_heads * d_v  # v − Sᵀk, times β
    products = Cost(flops=ctx.convention.fc_flops_per_mac * macs, macs=macs)
    return products + ctx.convention.weighted(add=adds, mul=muls, exp=exps)


@backward("LinearAttention")
def linear_attention_backward(
    ctx: NodeContext, *, q_num_heads: int, kv_num_heads: int, update_rule: str = "gated_delta", **_
) -> Cost:
    """MACs = B·T·d_k·d_v·(H_q·(q + c) + H_kv·(2δc + k·(1 + δ) + v·(1 − δ) + γ·g)) + δ·b·B·T·H_kv·d_v;
    FLOPs = 2·MACs + B·T·H_q·d_v·[q or c] [scale] + B·T·H_kv·(γ·c·d_k·d_v + δ·c·d_v) + γ·g·|decay|;
    q, k, v, g, b = 1 when query, key, value, decay, beta needs a gradient, c = 1 when any of k, v, g,
    b does (the state gradient dS runs back through the tokens), γ, δ as in the forward.

    Backpropagation through the recurrence token by token, in reverse, with a = scale·dO_t: dQ_t =
    S_t·a per query head (d_k·d_v MACs), dS_t += q_t ⊗ a (d_k·d_v MACs per query head, GQA heads
    accumulating into their KV head's dS). Per KV head, writing S' = exp(g_t)·S_{t−1} (S_{t−1} without
    γ) and S_t = S' + k ⊗ w with w = v (linear rules) or w = β·u, u = v − S'ᵀk (delta rules): dK_t =
    dS_t·w (d_k·d_v MACs); linear rules dV_t = dS_tᵀk (d_k·d_v MACs); delta rules dw = dS_tᵀk and
    dS' = dS_t − k ⊗ β·dw (2·d_k·d_v MACs, d_v multiplies for β·dw), dV_t = β·dw (free), dK_t +=
    −S'·β·dw (d_k·d_v MACs), dβ_t = uᵀdw (d_v MACs); gated rules dS_{t−1} = exp(g_t)·dS' (d_k·d_v
    multiplies) and dg_t = exp(g_t)·Σ(dS'·S_{t−1}) (d_k·d_v MACs, |decay| multiplies). The forward's
    states S_t, S', u and exp(g) are taken as kept (no transcendentals; recomputing the states would
    add the forward's update once more). Terms are counted for every token, the carry of dS into the
    first token's past_state too (it gets no gradient: NonDifferentiable), an over-count of one
    token's carry. ``table3``: one FLOP per MAC.
    """
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    b, t, hidden_q = ctx.shape(0)
    d_k = hidden_q // q_num_heads
    d_v = ctx.shape(2)[2] // kv_num_heads
    tokens = b * t
    state = d_k * d_v
    q, k, v = ctx.needs_grad(0), ctx.needs_grad(1), ctx.needs_grad(2)
    g = gated and ctx.needs_grad(4)
    beta = delta and ctx.needs_grad(5)
    chain = k or v or g or beta
    per_kv = 2 * delta * chain + k * (1 + delta) + v * (1 - delta) + g
    macs = tokens * state * (q_num_heads * (q + chain) + kv_num_heads * per_kv) + beta * tokens * kv_num_heads * d_v
    flops = ctx.convention.fc_flops_per_mac * macs
    flops += tokens * q_num_heads * d_v * (q or chain)
    flops += tokens * kv_num_heads * (gated * chain * state + delta * chain * d_v)
    if g:
        flops += ctx.numel(4)  # × exp(g_t)
    return Cost(flops=flops, macs=macs)


@saves("LinearAttention")
def linear_attention_saved(
    ctx: NodeContext, *, q_num_heads: int, kv_num_heads: int, update_rule: str = "gated_delta", **_
) -> Saved:
    """Every input given (query, key, value, past_state, decay, beta: the backward through the recurrence reads
    each of them) and the states its backward formula takes as kept, in the query's type: S_t per token and KV
    head (B·T·H_kv·d_k·d_v), with γ also S' = exp(g)·S_{t−1} (as many) and exp(g) (|decay|), with δ
    u = v − S'ᵀk (B·T·H_kv·d_v)."""
    gated = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    b, t, hidden_q = ctx.shape(0)
    d_k = hidden_q // q_num_heads
    d_v = ctx.shape(2)[2] // kv_num_heads
    states = b * t * kv_num_heads * d_k * d_v
    e = element_bytes(ctx.inputs[0].elem_type)
    extra = [("states S_t", e * states)]
    if gated:
        extra += [("decayed states S'", e * states), ("exp(g)", e * ctx.numel(4))]
    if delta:
        extra.append(("u = v - S'k", e * b * t * kv_num_heads * d_v))
    return Saved(tuple(i for i in range(len(ctx.inputs)) if ctx.has_input(i)), (), tuple(extra))



@formula("RotaryEmbedding", family="elementwise")
def rotary_embedding(ctx: NodeContext, *, num_heads: int = 0, rotary_embedding_dim: int = 0, **_) -> Cost:
    """FLOPs = 3·|X|·D_rot/D_head: each rotated pair (x1, x2) costs 6 (x1·cos − x2·sin and
    x1·sin + x2·cos), with D_rot = rotary_embedding_dim (D_head when 0) of each head's D_head.

    D_head = X.shape[3] for 4-D X, X.shape[2]/num_heads for 3-D X. cos/sin come from the cache
    inputs (no transcendentals); gathering them by position_ids and copying the unrotated tail
    are free.
    """
    return rotary(ctx.convention, _rotated(ctx, num_heads, rotary_embedding_dim))


def _rotated(ctx: NodeContext, num_heads: int, rotary_embedding_dim: int) -> int:
    """Number of elements of X that RotaryEmbedding rotates: |X|·D_rot/D_head."""
    x = ctx.shape(0)
    elems = prod(x)
    if not rotary_embedding_dim:
        return elems
    if len(x) == 4:
        head = x[3]
    elif num_heads:
        head = x[2] // num_heads
    else:
        raise ValueError("3-D X with rotary_embedding_dim needs the num_heads attribute")
    return (elems // head) * rotary_embedding_dim


def rotary(convention: Convention, rotated: int) -> Cost:
    """Rotation of ``rotated`` elements: per pair 4 multiplies and 2 additions, 3 FLOPs per element."""
    return convention.weighted(mul=2 * rotated, add=rotated)


@backward("RotaryEmbedding", buffers=(1, 2))
def rotary_embedding_backward(ctx: NodeContext, *, num_heads: int = 0, rotary_embedding_dim: int = 0, **_) -> Cost:
    """FLOPs = 3·|X|·D_rot/D_head when X needs a gradient: dx1 = dy1·cos + dy2·sin, dx2 = dy2·cos −
    dy1·sin (the rotation's adjoint, the same multiply-adds as the forward).

    Per rotated pair 4 multiplies and 2 additions; the unrotated tail passes dY through (free).
    cos_cache and sin_cache are buffers: fixed frequency tables, never trained, though the opset-23
    schema leaves their gradient categories unknown; position_ids are integers.
    """
    rotated = _rotated(ctx, num_heads, rotary_embedding_dim)
    return Cost(flops=3 * rotated * ctx.needs_grad(0))


@formula("SwiGLU", family="elementwise")
def swiglu(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·|Y| (Swish of the gate A, then the product with B); transcendentals = |Y|.

    Swish costs one FLOP and one transcendental per element, as the Swish operator does (weighted
    conventions: its decomposition, as the Swish operator's).
    """
    y = ctx.numel(0)
    return activation(ctx.convention, "Swish", y) + ctx.convention.weighted(mul=y)


@backward("SwiGLU")
def swiglu_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 4·|Y| [σ(alpha·A) again, 1 transcendental] + 6·|Y| for dA + 2·|Y| for dB, each only when
    its input needs a gradient: dA = dY·B·σ·(1 + alpha·A·(1 − σ)), dB = dY·A·σ, σ = sigmoid(alpha·A).

    Per element, flat: σ recomputed (alpha·A, then 1/(1 + exp(−z)): a multiply, an exp, an addition and
    a division), as a fused kernel keeps only A and B; dA: 1 − σ, times alpha·A, + 1, times σ (4), then
    times dY and B (2); dB: A·σ, times dY (2). 12·|Y| with both gradients, |Y| transcendentals.
    """
    y = ctx.numel(0)
    a, b = ctx.needs_grad(0), ctx.needs_grad(1)
    if not (a or b):
        return Cost()
    return Cost(flops=y * (4 + 6 * a + 2 * b), transcendentals=y)


@saves("Attention")
def attention_saved(ctx: NodeContext, *, q_num_heads: int | None = None, **_) -> Saved:
    """Q, K, V, the mask, Y, and each query row's log-sum-exp in float32 (4·B·H_q·S_q bytes), as a fused
    attention kernel keeps them (flash and memory-efficient attention recompute the scores in the backward).
    Q is ``[B, H_q, S_q, D]``, or ``[B, S_q, H_q·D]`` with ``q_num_heads``."""
    q = ctx.shape(0)
    rows = prod(q[:-1]) if len(q) == 4 else q[0] * q[1] * (q_num_heads or 1)
    return Saved(inputs=tuple(i for i in range(4) if ctx.has_input(i)), outputs=(0,),
                 extra=(("log-sum-exp (float32)", STAT_BYTES * rows),))


@saves("RotaryEmbedding")
def rotary_saved(ctx: NodeContext, **_) -> Saved:
    """The cos and sin caches and the position ids: dX is dY rotated back by the same angles."""
    return keeps(*(i for i in (1, 2, 3) if ctx.has_input(i)))


@saves("SwiGLU")
def swiglu_saved(ctx: NodeContext, **_) -> Saved:
    """The gate and linear inputs: the derivative of silu(a)·b reads a and b."""
    return keeps(*(i for i in range(len(ctx.inputs)) if ctx.has_input(i)))


@saves("FlexAttention", domain="ai.onnx.preview")
def flex_attention_saved(ctx: NodeContext, **_) -> Saved:
    """Q, K, V, Y and each query row's log-sum-exp in float32 (4·B·H·S_q bytes), as Attention's fused kernel keeps
    them (the score_mod and prob_mod subgraphs keep nothing more here)."""
    return Saved(inputs=(0, 1, 2), outputs=(0,), extra=(("log-sum-exp (float32)", STAT_BYTES * prod(ctx.shape(0)[:-1])),))
