"""Microsoft contrib operators (domain ``com.microsoft``) that ONNX Runtime's optimizers write into graphs.

``onnxruntime.transformers.optimizer`` fuses BERT and GPT-2 graphs into Attention,
SkipLayerNormalization, EmbedLayerNormalization, Gelu, BiasGelu, FastGelu ...; the session-level
graph optimizer writes FusedConv, FusedGemm and FusedMatMul; the weight quantizer writes
MatMulNBits. A fused operator costs the sum of its parts, each counted as the default-domain
operator it replaces: products as MatMul and Conv (1 MAC = 2 FLOPs, ``table3``: 1), activations one
FLOP per element (Gelu and its tanh approximation FastGelu alike, as ONNX Gelu), normalization one
FLOP per normalized element plus one transcendental per statistic (as LayerNormalization and
RMSNormalization), attention as the ONNX Attention (:mod:`flopcount.operators.attention`) and
softmax as :func:`~flopcount.operators.softmax.softmax_rows`.

Biases: the bias of a product fused into a product-family operator (FusedConv, FusedGemm,
MatMulNBits, GemmFastGelu, the Q/K/V projection bias of Attention and MultiHeadAttention) is
counted when ``ctx.convention.count_bias`` (dropped by ``table3``, as for Conv and Gemm). A bias
added inside an element-wise or normalization fusion (BiasGelu, FastGelu, SkipLayerNormalization,
BiasAdd, ...) is one element-wise addition, counted under every convention, as the separate Add it
replaces would be.

Weighted conventions (``aiperf``): each part is priced as the default-domain operator it replaces
is under that convention: activations by their primitive operations
(:data:`~flopcount.operators.elementwise.DECOMPOSITION`; FastGelu and GemmFastGelu as the tanh
approximation of Gelu), normalizations by their arithmetic
(:func:`~flopcount.operators.normalization.standardize`, ``root_mean_square``), softmax and the
attention core as in :mod:`flopcount.operators.attention`, bias and skip additions and scale
multiplies at their weights.

Shapes: ONNX shape inference does not know these operators. Formulas read input shapes wherever
the operator allows, but the tensors downstream of a contrib node need shapes in the model's
``value_info`` (the dynamo exporter writes them and the transformers optimizer keeps them; for other
graphs run ``onnxruntime.tools.symbolic_shape_infer`` first).

Training (``mode="train"``): a fused operator's backward is the sum of the backward formulas of the
default-domain operators it fuses (MatMul, Gemm, Conv, Add, Mul, the activations, Dropout, Gather,
LayerNormalization, RMSNormalization, GroupNormalization, Softmax, Attention), each called on a
node context of its own (:func:`_part`) that holds the part's shapes and which of its inputs need a
gradient: for a fused input its own flag, for an intermediate tensor whether any input it is
computed from needs one, as the training plan decides in the unfused graph. Biases follow the
forward's rule (a product's bias under ``count_bias``, element-wise ones always). Gradients summed
where a tensor fans out (a fused operator's extra outputs such as input_skip_bias_sum) are not
counted, as they are not in the unfused graph. The rotary embedding (dX rotated back, 3 FLOPs per
rotated element) and GroupQueryAttention's head sink are counted here. The weight-quantized MatMulNBits
is not trained and has no backward formula: train mode lists it as unsupported. ONNX knows no
schema of these operators, so every input is taken as differentiable except those declared
``buffers`` (rotary cos/sin caches, dropout ratios, the quantized cache scales): never trained.
"""

from __future__ import annotations

from math import prod

from onnx import TensorProto

from flopcount.context import NodeContext, TensorInfo
from flopcount.cost import Cost
from flopcount.operators.attention import attention_backward, rotary, sdpa_cost, softcap_cost
from flopcount.operators.conv import conv, conv_backward
from flopcount.operators.elementwise import ELEMENTWISE, ELEMENTWISE_BACKWARD, dropout_backward, elementwise_backward
from flopcount.operators.elementwise import activation as activation_cost
from flopcount.operators.layout import gather_backward
from flopcount.operators.matmul import gemm, gemm_backward, matmul_backward
from flopcount.operators.normalization import normalization_backward, root_mean_square, standardize
from flopcount.operators.softmax import softmax_backward, softmax_rows
from flopcount.registry import backward, formula, saves
from flopcount.saved import STAT_BYTES, Saved, keeps

MS = "com.microsoft"


def _activation(ctx: NodeContext, name: str, y: int) -> Cost:
    """One FLOP per output element for a fused activation (with its transcendentals from the
    element-wise table; weighted conventions: its primitive operations); nothing when ``name`` is
    empty."""
    if not name:
        return Cost()
    if name not in ELEMENTWISE:
        raise ValueError(f"unknown fused activation {name!r}; known: {', '.join(sorted(ELEMENTWISE))}")
    return activation_cost(ctx.convention, name, y)


def _given(ctx: NodeContext, i: int) -> int:
    return 1 if ctx.has_input(i) else 0


# --------------------------------------------------------------------------------------------
# convolution


@formula("FusedConv", "NhwcFusedConv", family="conv", domain=MS)
def fused_conv(ctx: NodeContext, *, activation: str = "", **_) -> Cost:
    """FLOPs = 2·N·C_out·S_out·K·C_in/G [Conv] + |Y| [bias B] + |Y| [sum input Z] + |Y| [activation];
    MACs = N·C_out·S_out·K·C_in/G.

    The Conv formula (:func:`flopcount.operators.conv.conv`), then Z added element-wise and the
    activation (Relu, LeakyRelu, Clip, HardSigmoid, Sigmoid, Tanh ...) one FLOP per output element,
    with its transcendentals as the element-wise operator has them; each term only when its input or
    attribute is given. The bias term follows ``count_bias`` (``table3`` drops it); Z and the
    activation are element-wise work, always counted. NhwcFusedConv (channels-last X, Y, Z; the
    weight keeps the [C_out, C_in/G, k...] layout) counts the same. Needs Y's shape.
    """
    y = ctx.out_numel()
    return conv(ctx) + ctx.convention.weighted(add=_given(ctx, 3) * y) + _activation(ctx, activation, y)


@formula("NhwcConv", family="conv", domain=MS)
def nhwc_conv(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·N·C_out·S_out·K·C_in/G (+ |Y| with a bias B); MACs = N·C_out·S_out·K·C_in/G.

    Conv in the channels-last layout; the weight keeps the [C_out, C_in/G, k...] layout, so the
    Conv formula applies unchanged. Needs Y's shape.
    """
    return conv(ctx)


# --------------------------------------------------------------------------------------------
# matrix products


def _fused_matmul_macs(ctx: NodeContext, trans_a: int, trans_batch_a: int) -> int:
    """|Y|·K for numpy-style A·B with A's last two dims transposed (transA) and/or its leading dim
    moved behind the batch dims (transBatchA)."""
    a = ctx.shape(0)
    if trans_batch_a:
        a = (*a[1:-1], a[0], a[-1])
    return ctx.out_numel() * (a[-2] if trans_a and len(a) > 1 else a[-1])


@formula("FusedMatMul", "TransposeMatMul", family="matmul", domain=MS)
def fused_matmul(ctx: NodeContext, *, transA: int = 0, transBatchA: int = 0, alpha: float = 1.0, **_) -> Cost:
    """FLOPs = 2·|Y|·K (+ |Y| when alpha ≠ 1); MACs = |Y|·K, K the contracted dim of A after its
    transposes.

    MatMul with transposes folded in: transA swaps A's last two dims (K = A.shape[-2]),
    transBatchA moves A's first dim behind its batch dims (K then read there); transposes of B
    change nothing counted. alpha is the fused scalar Mul, one multiply per output element (under
    ``count_bias``, as Gemm counts alpha). Needs Y's shape. TransposeMatMul is the older name.
    """
    macs = _fused_matmul_macs(ctx, transA, transBatchA)
    flops = ctx.convention.fc_flops_per_mac * macs
    if alpha != 1.0 and ctx.convention.count_bias:
        flops += ctx.out_numel()
    return Cost(flops=flops, macs=macs)


@formula("FusedMatMulActivation", family="matmul", domain=MS)
def fused_matmul_activation(ctx: NodeContext, *, activation: str = "", **attrs) -> Cost:
    """FLOPs = 2·|Y|·K (+ |Y| when alpha ≠ 1) + |Y| [activation]; MACs = |Y|·K.

    FusedMatMul followed by its activation, one FLOP per output element (transcendentals as the
    element-wise operator has them). Needs Y's shape.
    """
    return fused_matmul(ctx, **attrs) + _activation(ctx, activation, ctx.out_numel())


@formula("FusedGemm", family="matmul", domain=MS)
def fused_gemm(
    ctx: NodeContext, *, activation: str = "", transA: int = 0, alpha: float = 1.0, beta: float = 1.0, **_
) -> Cost:
    """FLOPs = 2·M·K·N [Gemm] (+ M·N for C, + |C| when beta ≠ 1, + M·N when alpha ≠ 1) + M·N
    [activation]; MACs = M·K·N.

    The Gemm formula (:func:`flopcount.operators.matmul.gemm`, whose bias and scaling terms follow
    ``count_bias``), then the activation, one FLOP per output element. Needs Y's shape.
    """
    return gemm(ctx, transA=transA, alpha=alpha, beta=beta) + _activation(ctx, activation, ctx.out_numel())


@formula("GemmFastGelu", family="matmul", domain=MS)
def gemm_fast_gelu(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·|Y|·K [X·W] + |Y| [bias] + |Y| [FastGelu]; MACs = |Y|·K; transcendentals = |Y|.

    X[..., K]·W[K, N], the bias (when given, under ``count_bias``), then the tanh approximation
    of Gelu at one FLOP and one tanh per element, as FastGelu. |Y| = |X|/K·N from the inputs.
    """
    k, n = ctx.shape(1)
    y = ctx.numel(0) // k * n
    macs = y * k
    flops = ctx.convention.fc_flops_per_mac * macs
    if ctx.has_input(2) and ctx.convention.count_bias:
        flops += y
    return Cost(flops=flops, macs=macs) + activation_cost(ctx.convention, "Gelu", y, approximate="tanh")


@formula("MatMulNBits", family="matmul", domain=MS)
def matmul_nbits(ctx: NodeContext, *, K: int, N: int, **_) -> Cost:
    """FLOPs = 2·M·K·N [A·W, in float] + N·K [× scale] (+ N·K when zero_points is float) + M·N
    [bias]; int_ops = N·K [− zero point, integer]; MACs = M·K·N, M = |A|/K.

    W[K, N] arrives as bits-wide integers in blocks of block_size along K, each block with a scale
    (and a zero point, 2^(bits−1) when none is given). The count assumes the kernel dequantizes
    every weight once per call, w = (q − zero_point)·scale, then runs the product in float: the
    zero point subtraction is integer arithmetic (one int_op per weight; a float zero_points input,
    same type as A, makes it a FLOP), the scale one FLOP per weight. accuracy_level (which may let a
    kernel quantize A to int8 instead) is not modelled; unpacking bits is not counted. The bias
    follows ``count_bias``.
    """
    m = ctx.numel(0) // K
    macs = m * K * N
    weights = N * K
    float_zp = ctx.has_input(3) and ctx.in_is_float(3)
    flops = ctx.convention.fc_flops_per_mac * macs + weights * (2 if float_zp else 1)
    if ctx.has_input(5) and ctx.convention.count_bias:
        flops += m * N
    return Cost(flops=flops, macs=macs, int_ops=0 if float_zp else weights)


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
    biases = (ctx.has_input(3) or bool(unidirectional)) + _given(ctx, 5)
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
    return cost + ctx.convention.weighted(add=scores * ((ctx.has_input(4) or bool(unidirectional)) + _given(ctx, 5)))


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
    cost += conv.weighted(add=scores * (masked + _given(ctx, 10)))
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
    quantized = _given(ctx, 12) + _given(ctx, 13)
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


# --------------------------------------------------------------------------------------------
# normalization


def _rows(x: tuple[int, ...], axis: int = -1) -> int:
    return prod(x[: axis % len(x)]) if x else 1


@formula("SkipLayerNormalization", family="normalization", domain=MS)
def skip_layer_norm(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [+ skip] (+ |X| [+ bias]) + |X| [LayerNormalization]; transcendentals = |X|/D
    (one 1/sqrt per row of D = hidden_size).

    input + skip (+ bias), then LayerNormalization over the last dim, counted as the default-domain
    LayerNormalization: one FLOP per element. The optional input_skip_bias_sum output is that sum,
    free. The skip may broadcast over the batch; the add still costs one FLOP per element of X.
    """
    x = ctx.shape(0)
    n = prod(x)
    skip = ctx.convention.weighted(add=n * (1 + _given(ctx, 4)))
    return skip + standardize(ctx.convention, n, _rows(x), bias=ctx.has_input(3))


@formula("SkipSimplifiedLayerNormalization", family="normalization", domain=MS)
def skip_simplified_layer_norm(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [+ skip] (+ |X| [+ bias]) + |X| [RMSNormalization]; transcendentals = |X|/D.

    input + skip (+ bias), then the root-mean-square normalization over the last dim (no mean), as
    the default-domain RMSNormalization: one FLOP per element and a 1/sqrt per row of D elements.
    """
    x = ctx.shape(0)
    n = prod(x)
    return ctx.convention.weighted(add=n * (1 + _given(ctx, 3))) + root_mean_square(ctx.convention, n, _rows(x))


@formula("SimplifiedLayerNormalization", family="normalization")
def simplified_layer_norm(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = |X|; transcendentals = prod(X.shape[:axis]) (one 1/sqrt(mean(x²) + eps) per row).

    onnxruntime's RMS normalization, registered by onnxruntime in the default domain (LLaMA-style
    graphs); counted as RMSNormalization.
    """
    x = ctx.shape(0)
    if ctx.convention.weights is None or not x:
        return Cost(flops=prod(x), transcendentals=_rows(x, axis))
    return root_mean_square(ctx.convention, prod(x), _rows(x, axis))


@formula("EmbedLayerNormalization", family="normalization", domain=MS)
def embed_layer_norm(ctx: NodeContext, **_) -> Cost:
    """FLOPs = B·S·D [word + position] (+ B·S·D [+ segment]) + B·S·D [LayerNormalization];
    transcendentals = B·S; int_ops = B·S with a mask (the mask_index row sums).

    input_ids (B, S) look up word, position and (optional) segment embeddings of width D (gathers
    are free), the two or three are added, then LayerNormalization over D as the default-domain
    one. With a mask input, mask_index counts each row's ones: one integer add per mask element.
    """
    b, s = ctx.shape(0)
    d = ctx.shape(2)[1]
    tokens = b * s
    adds = 1 + (ctx.has_input(1) and ctx.has_input(4))
    embeddings = ctx.convention.weighted(add=tokens * d * adds)
    return embeddings + standardize(ctx.convention, tokens * d, tokens) + Cost(int_ops=tokens * _given(ctx, 7))


def _group_norm(ctx: NodeContext, groups: int, activation: int, adds: int) -> Cost:
    """GroupNormalization of X with ``adds`` element-wise additions before it and SiLU after it
    when ``activation``; N = X.shape[0] in either layout."""
    x = ctx.shape(0)
    n = prod(x)
    cost = ctx.convention.weighted(add=adds * n) + standardize(ctx.convention, n, x[0] * groups)
    return cost + (activation_cost(ctx.convention, "Swish", n) if activation else Cost())


@formula("GroupNorm", family="normalization", domain=MS)
def ms_group_norm(ctx: NodeContext, *, groups: int, activation: int, **_) -> Cost:
    """FLOPs = |X| [GroupNormalization] (+ |X| [SiLU]); transcendentals = N·groups (+ |X|).

    As the default-domain GroupNormalization (one FLOP per element, a 1/sqrt per group and sample),
    either layout; activation = 1 applies SiLU, one FLOP and one exp per element, as Swish.
    """
    return _group_norm(ctx, groups, activation, 0)


@formula("SkipGroupNorm", family="normalization", domain=MS)
def skip_group_norm(ctx: NodeContext, *, groups: int, activation: int, **_) -> Cost:
    """FLOPs = |X| [+ skip] (+ |X| [+ bias]) + |X| [GroupNormalization] (+ |X| [SiLU]);
    transcendentals = N·groups (+ |X| with SiLU).

    x + skip (+ bias), then GroupNorm as above. The skip may broadcast ((N, 1, 1, C)); the add still
    costs one FLOP per element of X.
    """
    return _group_norm(ctx, groups, activation, 1 + _given(ctx, 4))


# --------------------------------------------------------------------------------------------
# element-wise


@formula("Gelu", family="elementwise", domain=MS)
def ms_gelu(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X|; transcendentals = |X| (one erf per element), as the default-domain Gelu."""
    return activation_cost(ctx.convention, "Gelu", ctx.numel(0))


@formula("FastGelu", family="elementwise", domain=MS)
def fast_gelu(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| (+ |X| with a bias); transcendentals = |X| (one tanh per element).

    The tanh approximation of Gelu counted as the default-domain Gelu (approximate="tanh"): one
    FLOP per element; the optional bias is added first, one FLOP per element.
    """
    n = ctx.numel(0)
    return ctx.convention.weighted(add=_given(ctx, 1) * n) + activation_cost(ctx.convention, "Gelu", n, approximate="tanh")


@formula("BiasGelu", family="elementwise", domain=MS)
def bias_gelu(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·|A| (the bias add, then Gelu); transcendentals = |A| (one erf per element)."""
    n = ctx.numel(0)
    return ctx.convention.weighted(add=n) + activation_cost(ctx.convention, "Gelu", n)


@formula("QuickGelu", family="elementwise", domain=MS)
def quick_gelu(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X|; transcendentals = |X|: x·sigmoid(alpha·x) is Swish, one FLOP and one exp per element."""
    return activation_cost(ctx.convention, "Swish", ctx.numel(0))


@formula("ScaledSiLU", family="elementwise", domain=MS)
def scaled_silu(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·|X| (the scale multiply, then SiLU); transcendentals = |X| (one exp per element)."""
    n = ctx.numel(0)
    return ctx.convention.weighted(mul=n) + activation_cost(ctx.convention, "Swish", n)


@formula("BiasSplitGelu", family="elementwise", domain=MS)
def bias_split_gelu(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [+ bias] + |X|/2 [Gelu of the right half] + |X|/2 [left half × it] = 2·|X|;
    transcendentals = |X|/2 (one erf per output element)."""
    n = ctx.numel(0)
    half = n // 2
    return ctx.convention.weighted(add=n, mul=n - half) + activation_cost(ctx.convention, "Gelu", half)


@formula("BiasAdd", family="elementwise", domain=MS)
def bias_add(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·|X| (X + bias + skip: two additions per element)."""
    return ctx.convention.weighted(add=2 * ctx.numel(0))


def _training(ctx: NodeContext, i: int) -> bool:
    mode = ctx.value(i) if ctx.has_input(i) else None
    return mode is not None and bool(mode.reshape(-1)[0])


@formula("BiasDropout", "BitmaskBiasDropout", family="elementwise", domain=MS)
def bias_dropout(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [+ bias] (+ |X| [+ residual]) (+ |X| [dropout scale, training]).

    Dropout(data + bias) + residual: the dropout multiply by mask/(1 − ratio) counts only when the
    training_mode input is a constant true, as for Dropout; generating the mask is not counted.
    """
    n = ctx.numel(0)
    return ctx.convention.weighted(add=(1 + _given(ctx, 2)) * n, mul=_training(ctx, 4) * n)


@formula("BitmaskDropout", family="elementwise", domain=MS)
def bitmask_dropout(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0 at inference; |X| (one multiply by mask/(1 − ratio) per element) when the
    training_mode input is a constant true, as for Dropout."""
    return ctx.convention.weighted(mul=_training(ctx, 2) * ctx.numel(0))


# --------------------------------------------------------------------------------------------
# softmax


@formula("BiasSoftmax", family="softmax", domain=MS)
def bias_softmax(ctx: NodeContext, *, axis: int = 1, **_) -> Cost:
    """FLOPs = |X| [+ bias] + R·(5n − 2) [softmax]; transcendentals = R·n; n = prod(X.shape[axis:]),
    R = |X|/n rows.

    softmax(data + bias) with the bias (an additive mask) broadcast: one add per element, then the
    stable softmax of :func:`flopcount.operators.softmax.softmax_rows` over the dims from ``axis``
    on (the contrib operator normalizes over all of them, as Softmax before opset 13).
    """
    x = ctx.shape(0)
    a = axis % len(x)
    n = prod(x[a:])
    return ctx.convention.weighted(add=prod(x)) + softmax_rows(ctx.convention, prod(x[:a]), n)


# --------------------------------------------------------------------------------------------
# backward (training): the sum of the backward formulas of the parts


_Part = TensorInfo | tuple[int, ...] | None


def _part(ctx: NodeContext, op_type: str, inputs: list[_Part], outputs: list[_Part], grads: list[bool],
          **fields) -> NodeContext:
    """The node context of ``op_type``, one default-domain operator inside the fused node: its input
    and output tensors (a fused node's own TensorInfo, a shape for an intermediate tensor, None for
    an omitted input) and which of its inputs need a gradient. ``fields`` replace more of the
    context (``opset``)."""

    def info(i: int, t: _Part, side: str) -> TensorInfo | None:
        if t is None or isinstance(t, TensorInfo):
            return t
        return TensorInfo(f"{ctx.name}/{op_type}/{side}{i}", TensorProto.FLOAT, tuple(t))

    return ctx._replace(
        op_type=op_type,
        domain="",
        inputs=tuple(info(i, t, "in") for i, t in enumerate(inputs)),
        outputs=tuple(info(i, t, "out") for i, t in enumerate(outputs)),
        grads=tuple(bool(g) for g in grads),
        **fields,
    )


def _needs(ctx: NodeContext, *inputs: int) -> bool:
    """Whether a tensor computed from these inputs needs a gradient."""
    return any(ctx.needs_grad(i) for i in inputs)


def _input(ctx: NodeContext, i: int) -> TensorInfo | None:
    return ctx.inputs[i] if ctx.has_input(i) else None


def _add_backward(ctx: NodeContext, a: _Part, a_needs: bool, b: int | _Part, b_needs: bool | None = None) -> Cost:
    """Backward of Add(a, b) with output a's shape: dA = dY and dB = dY, free, plus the sum of dY
    over the dims b broadcasts on (|Y| − |b| additions) when b needs a gradient. ``b`` is a fused
    input's position (nothing when omitted) or a part."""
    if isinstance(b, int):
        if not ctx.has_input(b):
            return Cost()
        b, b_needs = ctx.inputs[b], ctx.needs_grad(b)
    if not (a_needs or b_needs):
        return Cost()
    return elementwise_backward(_part(ctx, "Add", [a, b], [a], [a_needs, b_needs]))


def _activation_backward(ctx: NodeContext, name: str, y: _Part, needs: bool) -> Cost:
    """Backward of the element-wise activation ``name`` over ``y``, as the default-domain operator's
    (nothing when ``name`` is empty or its input needs no gradient)."""
    if not name or not needs:
        return Cost()
    if name not in ELEMENTWISE_BACKWARD:
        raise ValueError(
            f"fused activation {name!r} has no backward formula; known: {', '.join(sorted(ELEMENTWISE_BACKWARD))}"
        )
    return elementwise_backward(_part(ctx, name, [y], [y], [True]))


def _rotary_backward(rotated: int) -> Cost:
    """dX = the rotation of dY by −θ: 3 FLOPs per rotated element, as the forward (flat, as every
    backward formula)."""
    return Cost(flops=3 * rotated)


@backward("FusedConv", "NhwcFusedConv", domain=MS)
def fused_conv_backward(ctx: NodeContext, *, activation: str = "", **_) -> Cost:
    """dS = dY·act′(S) [the activation's backward, per element of Y, as the default-domain
    operator's: Relu 1, Sigmoid and Tanh 3 ...] + dZ = dS [free] + Conv's backward of dS: dX and
    dW the forward MACs each (N·C_out·S_out·K·C_in/G), dB = Σ dS (|Y| additions).

    Y = act(Conv(X, W, B) + Z): the backward formulas of the activation, Add and Conv
    (:func:`flopcount.operators.conv.conv_backward`), each input's gradient only when it needs one
    (X fed by data: none); the bias term follows ``count_bias``. The NHWC layout changes nothing
    counted. Needs Y's shape.
    """
    y = ctx.outputs[0] if ctx.outputs else None
    conv_needs = _needs(ctx, 0, 1, 2)
    cost = _activation_backward(ctx, activation, y, conv_needs or ctx.needs_grad(3))
    cost += _add_backward(ctx, y, conv_needs, 3)
    return cost + conv_backward(_part(ctx, "Conv", list(ctx.inputs[:3]), [y], [ctx.needs_grad(i) for i in range(3)]))


@backward("NhwcConv", domain=MS)
def nhwc_conv_backward(ctx: NodeContext, **_) -> Cost:
    """dX and dW: the forward MACs (N·C_out·S_out·K·C_in/G) each, dB = Σ dY (|Y| additions), for the
    inputs that need a gradient: Conv's backward in the channels-last layout. Needs Y's shape."""
    return conv_backward(_part(ctx, "Conv", list(ctx.inputs[:3]), list(ctx.outputs[:1]), list(ctx.grads[:3])))


def _operand(shape: tuple[int, ...], trans: int, trans_batch: int) -> tuple[int, ...]:
    """A FusedMatMul operand after its transposes: transBatch moves the first dim behind the batch
    dims, trans swaps the last two."""
    if trans_batch and len(shape) > 2:
        shape = (*shape[1:-1], shape[0], shape[-1])
    if trans and len(shape) > 1:
        shape = (*shape[:-2], shape[-1], shape[-2])
    return shape


def _fused_matmul_backward(ctx: NodeContext, transA: int, transB: int, transBatchA: int, transBatchB: int,
                           alpha: float) -> Cost:
    a, b = _operand(ctx.shape(0), transA, transBatchA), _operand(ctx.shape(1), transB, transBatchB)
    y = ctx.outputs[0] if ctx.outputs else None
    needs = _needs(ctx, 0, 1)
    cost = matmul_backward(_part(ctx, "MatMul", [a, b], [y], [ctx.needs_grad(0), ctx.needs_grad(1)]))
    if alpha != 1.0 and ctx.convention.count_bias and needs:
        cost += elementwise_backward(_part(ctx, "Mul", [y, ()], [y], [True, False]))
    return cost


@backward("FusedMatMul", "TransposeMatMul", domain=MS)
def fused_matmul_backward(ctx: NodeContext, *, transA: int = 0, transB: int = 0, transBatchA: int = 0,
                          transBatchB: int = 0, alpha: float = 1.0, **_) -> Cost:
    """dA′ = dP·B′ᵀ and dB′ = A′ᵀ·dP: |Y|·K MACs each, for each operand that needs a gradient
    (K the contracted dim of A′, A′ and B′ the operands after their transposes); + |Y| [dP = alpha·dY]
    when alpha ≠ 1.

    MatMul's backward (:func:`flopcount.operators.matmul.matmul_backward`) of the transposed
    operands (transposing the gradients back is free), then the fused scalar Mul's (one multiply
    per element of Y, under ``count_bias``, as the forward and Gemm count alpha). Needs Y's shape.
    """
    return _fused_matmul_backward(ctx, transA, transB, transBatchA, transBatchB, alpha)


@backward("FusedMatMulActivation", domain=MS)
def fused_matmul_activation_backward(ctx: NodeContext, *, activation: str = "", transA: int = 0, transB: int = 0,
                                     transBatchA: int = 0, transBatchB: int = 0, alpha: float = 1.0, **_) -> Cost:
    """dP = dY·act′(P) [the activation's backward per element of Y] + FusedMatMul's backward:
    |Y|·K MACs per operand that needs a gradient, + |Y| when alpha ≠ 1.

    As FusedMatMul's backward after the activation's (as the default-domain operator's). Needs Y's
    shape.
    """
    y = ctx.outputs[0] if ctx.outputs else None
    cost = _activation_backward(ctx, activation, y, _needs(ctx, 0, 1))
    return cost + _fused_matmul_backward(ctx, transA, transB, transBatchA, transBatchB, alpha)


@backward("FusedGemm", domain=MS)
def fused_gemm_backward(ctx: NodeContext, *, activation: str = "", transA: int = 0, alpha: float = 1.0,
                        beta: float = 1.0, **_) -> Cost:
    """dP = dY·act′(P) [the activation's backward per element of Y] + Gemm's backward: dA and dB
    M·K·N MACs each, for each operand that needs a gradient; dC = Σ dP: M·N additions (+ |C| when
    beta ≠ 1); + M·N when alpha ≠ 1.

    Gemm's backward (:func:`flopcount.operators.matmul.gemm_backward`, whose bias and scaling terms
    follow ``count_bias``) after the activation's. Needs Y's shape.
    """
    y = ctx.outputs[0] if ctx.outputs else None
    cost = _activation_backward(ctx, activation, y, _needs(ctx, 0, 1, 2))
    gemm_part = _part(ctx, "Gemm", list(ctx.inputs[:3]), [y], [ctx.needs_grad(i) for i in range(3)])
    return cost + gemm_backward(gemm_part, transA=transA, alpha=alpha, beta=beta)


@backward("GemmFastGelu", domain=MS)
def gemm_fast_gelu_backward(ctx: NodeContext, **_) -> Cost:
    """dS = dY·Gelu′(S) [7·|Y|, |Y| transcendentals, as Gelu's backward] + dbias = Σ dS (|Y| − N
    additions) + dX = dS·Wᵀ and dW = Xᵀ·dS: |Y|·K MACs each, for each input that needs a gradient.

    Y = FastGelu(X·W + bias), X[..., K], W[K, N], |Y| = |X|/K·N: the backward formulas of Gelu
    (the tanh form counted as the erf form), Add and MatMul. The bias is the product's: its
    gradient follows ``count_bias``, as the forward.
    """
    x = ctx.shape(0)
    y = (*x[:-1], ctx.shape(1)[1])
    needs = _needs(ctx, 0, 1, 2)
    cost = _activation_backward(ctx, "Gelu", y, needs)
    if ctx.convention.count_bias:
        cost += _add_backward(ctx, y, _needs(ctx, 0, 1), 2)
    return cost + matmul_backward(_part(ctx, "MatMul", [x, ctx.shape(1)], [y], [ctx.needs_grad(0), ctx.needs_grad(1)]))


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
    proj_needs = _needs(ctx, 0, 1)
    cost = matmul_backward(_part(ctx, "MatMul", [x, w], [qkv], [ctx.needs_grad(0), ctx.needs_grad(1)]))
    if ctx.convention.count_bias:
        cost += _add_backward(ctx, qkv, proj_needs, 2)
    needs = proj_needs or ctx.needs_grad(2)
    if not needs:
        return cost
    e = d_q // num_heads
    if do_rotary:
        cost += _rotary_backward(tokens * (d_q + d_k) // e * (rotary_embedding_dim or e))
    past = ctx.shape(4)[3] if ctx.has_input(4) else 0
    t = _total_length(ctx, past, s, 6 if past_present_share_buffer else None)
    core = _part(ctx, "Attention", [(b, s, d_q), (b, s, d_k), (b, s, d_v), None, _past(b, num_heads, t, s, e)],
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
        cost += _add_backward(ctx, q3, q_in, (h * e,), bias)
        if projected_kv:
            cost += _add_backward(ctx, k3, k_in, (h * e,), bias) + _add_backward(ctx, v3, v_in, (h * e_v,), bias)
    q_in = q_in or bias  # the bias is added to Q, and to K and V when they are projected here
    if projected_kv:
        k_in, v_in = k_in or bias, v_in or bias
    past = ctx.shape(6)[2] if ctx.has_input(6) else 0
    t = _total_length(ctx, past, l, 8)
    core = _part(ctx, "Attention", [q3, k3, v3, None, _past(b, h, t, l, e)], [(b, s, h * e_v)], [q_in, k_in, v_in])
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
            part = _part(ctx, "RMSNormalization", [(b, s, heads, e), ctx.inputs[norm]], [(b, s, heads, e)],
                         [needs_in, ctx.needs_grad(norm)])
            cost += normalization_backward(part)
    q_needs, k_needs = q_in or ctx.needs_grad(14), k_in or ctx.needs_grad(15)
    if do_rotary:
        rot = 2 * ctx.shape(7)[1] if ctx.has_input(7) else e
        cost += _rotary_backward(b * s * rot * (h_q * q_needs + h_kv * k_needs))
    total = ctx.value(6) if ctx.has_input(6) else None
    t = int(total.reshape(-1)[0]) if total is not None else (ctx.shape(3)[2] if ctx.has_input(3) else 0) + s
    core = _part(ctx, "Attention", [(b, s, h_q * e), (b, s, h_kv * e), (b, s, h_kv * e), None, _past(b, h_kv, t, s, e)],
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


# --- normalization --------------------------------------------------------------------------


@backward("SkipLayerNormalization", domain=MS)
def skip_layer_norm_backward(ctx: NodeContext, **_) -> Cost:
    """LayerNormalization's backward of S = input + skip (+ bias) [7·|X| when S needs a gradient;
    else 2·|X| for gamma, + |X| for beta] + dskip = Σ dS over broadcast dims (|X| − |skip|) + dbias
    = Σ dS over tokens (|X| − D), each when it needs a gradient; dinput = dS free.

    The backward formulas of Add, Add and LayerNormalization
    (:func:`flopcount.operators.normalization.normalization_backward`). S needs a gradient when
    input, skip or bias does. A gradient reaching the input_skip_bias_sum output is added to dS at
    the fan-out, not counted (as in the unfused graph).
    """
    x = ctx.inputs[0]
    sum_needs = _needs(ctx, 0, 1)
    s_needs = sum_needs or ctx.needs_grad(4)
    cost = _add_backward(ctx, x, ctx.needs_grad(0), 1) + _add_backward(ctx, x, sum_needs, 4)
    ln = _part(ctx, "LayerNormalization", [x, ctx.inputs[2], _input(ctx, 3)], [x],
               [s_needs, ctx.needs_grad(2), ctx.needs_grad(3)])
    return cost + normalization_backward(ln)


@backward("SkipSimplifiedLayerNormalization", domain=MS)
def skip_simplified_layer_norm_backward(ctx: NodeContext, **_) -> Cost:
    """RMSNormalization's backward of S = input + skip (+ bias) [7·|X| when S needs a gradient, else
    2·|X| for gamma] + dskip = Σ dS over broadcast dims (|X| − |skip|) + dbias = Σ dS over tokens
    (|X| − D), each when it needs a gradient.

    The backward formulas of Add, Add and RMSNormalization (counted as LayerNormalization's, an
    upper bound). S needs a gradient when input, skip or bias does.
    """
    x = ctx.inputs[0]
    sum_needs = _needs(ctx, 0, 1)
    s_needs = sum_needs or ctx.needs_grad(3)
    cost = _add_backward(ctx, x, ctx.needs_grad(0), 1) + _add_backward(ctx, x, sum_needs, 3)
    rms = _part(ctx, "RMSNormalization", [x, ctx.inputs[2]], [x], [s_needs, ctx.needs_grad(2)])
    return cost + normalization_backward(rms)


@backward("SimplifiedLayerNormalization")
def simplified_layer_norm_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 7·|X| when X needs a gradient, else 2·|X| for the scale: RMSNormalization's backward.

    onnxruntime's default-domain RMS normalization, counted as RMSNormalization
    (:func:`flopcount.operators.normalization.normalization_backward`).
    """
    return normalization_backward(_part(ctx, "RMSNormalization", list(ctx.inputs[:2]), [ctx.inputs[0]],
                                        [ctx.needs_grad(0), ctx.needs_grad(1)]))


@backward("EmbedLayerNormalization", domain=MS)
def embed_layer_norm_backward(ctx: NodeContext, **_) -> Cost:
    """LayerNormalization's backward of the embedding sum S [7·B·S·D when an embedding table needs a
    gradient; else 2·B·S·D for gamma, + B·S·D for beta] + B·S·D per embedding table (word, position,
    segment) that needs a gradient [the scatter-add of dS into it, as Gather's backward].

    The unfused graph: Gather of each table by its ids (the position table by position ids, the
    positions 0 … S − 1 of every sequence when none are given), Add, Add (dS passes through, free),
    LayerNormalization. The ids and the mask are integers: no gradient; the mask_index row sums are
    not differentiated. A gradient reaching the embedding_sum output is not counted (fan-out).
    """
    b, s = ctx.shape(0)
    y = (b, s, ctx.shape(2)[1])
    tables = [2, 3] + ([4] if ctx.has_input(1) and ctx.has_input(4) else [])
    cost = Cost()
    for i in tables:
        cost += gather_backward(_part(ctx, "Gather", [ctx.inputs[i], (b, s)], [y], [ctx.needs_grad(i), False]))
    ln = _part(ctx, "LayerNormalization", [y, ctx.inputs[5], _input(ctx, 6)], [y],
               [_needs(ctx, *tables), ctx.needs_grad(5), ctx.needs_grad(6)])
    return cost + normalization_backward(ln)


def _group_norm_backward(ctx: NodeContext, activation: int, skip: int | None, bias: int | None) -> Cost:
    x = ctx.inputs[0]
    skip_needs = skip is not None and _needs(ctx, 0, skip)
    s_needs = ctx.needs_grad(0) or skip_needs or (bias is not None and ctx.needs_grad(bias))
    cost = Cost()
    if skip is not None:
        cost += _add_backward(ctx, x, ctx.needs_grad(0), skip) + _add_backward(ctx, x, skip_needs, bias)
    if activation:
        cost += _activation_backward(ctx, "Swish", x, s_needs or _needs(ctx, 1, 2))
    gn = _part(ctx, "GroupNormalization", [x, ctx.inputs[1], ctx.inputs[2]], [x],
               [s_needs, ctx.needs_grad(1), ctx.needs_grad(2)])
    return cost + normalization_backward(gn)


@backward("GroupNorm", domain=MS)
def ms_group_norm_backward(ctx: NodeContext, *, activation: int = 0, **_) -> Cost:
    """dN = dY·SiLU′(N) [5·|X|, |X| transcendentals, with activation = 1] + GroupNormalization's
    backward [7·|X| when X needs a gradient; else 2·|X| for gamma, + |X| for beta].

    The backward formulas of Swish and GroupNormalization
    (:func:`flopcount.operators.normalization.normalization_backward`), either layout.
    """
    return _group_norm_backward(ctx, activation, None, None)


@backward("SkipGroupNorm", domain=MS)
def skip_group_norm_backward(ctx: NodeContext, *, activation: int = 0, **_) -> Cost:
    """dN = dY·SiLU′(N) [5·|X|, |X| transcendentals, with activation = 1] + GroupNormalization's
    backward of S = X + skip (+ bias) [7·|X| when S needs a gradient; else 2·|X| for gamma, + |X|
    for beta] + dskip = Σ dS over broadcast dims (|X| − |skip|) + dbias (|X| − C), each when it
    needs a gradient.

    The backward formulas of Add, Add, GroupNormalization and Swish. S needs a gradient when X, skip
    or bias does. A gradient reaching the add_out output is not counted (fan-out).
    """
    return _group_norm_backward(ctx, activation, 3, 4)


# --- element-wise ---------------------------------------------------------------------------


def _bias_activation_backward(ctx: NodeContext, name: str, bias: int | None) -> Cost:
    """Backward of act(X + bias): the activation's per element of X, then dbias = Σ over broadcast
    dims."""
    x = ctx.inputs[0]
    cost = _activation_backward(ctx, name, x, _needs(ctx, 0, *(() if bias is None else (bias,))))
    return cost + (_add_backward(ctx, x, ctx.needs_grad(0), bias) if bias is not None else Cost())


@backward("Gelu", domain=MS)
def ms_gelu_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 7·|X|, transcendentals = |X| when X needs a gradient: dX = dY·(Φ(x) + x·φ(x)), as the
    default-domain Gelu's backward."""
    return _bias_activation_backward(ctx, "Gelu", None)


@backward("FastGelu", domain=MS)
def fast_gelu_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 7·|X|, transcendentals = |X| [Gelu's backward] (+ |X| − |bias| to sum dbias over the
    broadcast dims, when the bias needs a gradient).

    The tanh approximation counted as Gelu's backward (the default-domain table does not tell the
    two apart), after the optional bias Add's.
    """
    return _bias_activation_backward(ctx, "Gelu", 1)


@backward("BiasGelu", domain=MS)
def bias_gelu_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 7·|A|, transcendentals = |A| [Gelu's backward] (+ |A| − |B| to sum dB over the
    broadcast dims, when B needs a gradient): the backward formulas of Add and Gelu."""
    return _bias_activation_backward(ctx, "Gelu", 1)


@backward("QuickGelu", domain=MS)
def quick_gelu_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 5·|X|, transcendentals = |X| when X needs a gradient: x·sigmoid(alpha·x) is Swish,
    counted as Swish's backward."""
    return _bias_activation_backward(ctx, "Swish", None)


@backward("ScaledSiLU", domain=MS)
def scaled_silu_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 5·|X| [SiLU's backward, as Swish's] + |X| [the scale: dY·alpha]; transcendentals =
    |X|, when X needs a gradient: the backward formulas of Swish and Mul."""
    if not ctx.needs_grad(0):
        return Cost()
    x = ctx.inputs[0]
    scale = elementwise_backward(_part(ctx, "Mul", [x, ()], [x], [True, False]))
    return _activation_backward(ctx, "Swish", x, True) + scale


@backward("BiasSplitGelu", domain=MS)
def bias_split_gelu_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 2·|Y| [dL = dY·G, dG = dY·L] + 7·|Y|, |Y| transcendentals [Gelu's backward of the
    right half R] (+ |X| − |bias| to sum dbias), |Y| = |X|/2.

    S = X + bias split in halves L and R along the last dim, Y = L·Gelu(R): the backward formulas
    of Mul, Gelu and Add (concatenating dL and dR is free). S needs a gradient when X or the bias
    does.
    """
    x = ctx.shape(0)
    y = (*x[:-1], x[-1] // 2)
    if not _needs(ctx, 0, 1):
        return Cost()
    mul = elementwise_backward(_part(ctx, "Mul", [y, y], [y], [True, True]))
    return mul + _activation_backward(ctx, "Gelu", y, True) + _add_backward(ctx, ctx.inputs[0], ctx.needs_grad(0), 1)


@backward("BiasAdd", domain=MS)
def bias_add_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| − |bias| [Σ dY over tokens, when the bias needs a gradient] + |X| − |skip| [when
    the skip broadcasts and needs one]: the backward formulas of two Adds; dX passes through."""
    x = ctx.inputs[0]
    return _add_backward(ctx, x, ctx.needs_grad(0), 1) + _add_backward(ctx, x, _needs(ctx, 0, 1), 2)


def _bias_dropout_backward(ctx: NodeContext, data_inputs: tuple[int, ...], mode: int) -> Cost:
    x = ctx.inputs[0]
    needs = _needs(ctx, *data_inputs)
    if not needs:
        return Cost()
    part = _part(ctx, "Dropout", [x, None, _input(ctx, mode)], [x], [True, False, False])
    return dropout_backward(part)


@backward("BiasDropout", "BitmaskBiasDropout", domain=MS, buffers=(3,))
def bias_dropout_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [dY times mask/(1 − ratio), training_mode a constant true] + |X| − |bias| [dbias,
    summed over tokens], when data or bias needs a gradient; dresidual = dY, free.

    The backward formulas of Add, Dropout and Add. The ratio is never trained (a buffer).
    """
    x = ctx.inputs[0]
    cost = _bias_dropout_backward(ctx, (0, 1), 4)
    return cost + _add_backward(ctx, x, ctx.needs_grad(0), 1) + _add_backward(ctx, x, _needs(ctx, 0, 1), 2)


@backward("BitmaskDropout", domain=MS, buffers=(1,))
def bitmask_dropout_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| (dY times mask/(1 − ratio)) when X needs a gradient and training_mode is a
    constant true, else 0: Dropout's backward. The ratio is never trained (a buffer)."""
    return _bias_dropout_backward(ctx, (0,), 2)


@backward("BiasSoftmax", domain=MS)
def bias_softmax_backward(ctx: NodeContext, *, axis: int = 1, **_) -> Cost:
    """FLOPs = R·(4n − 1) [Softmax's backward: dS = Y·(dY − Σ dY·Y) per row] + |X| − |bias| [dbias
    summed over the broadcast dims]; n = prod(X.shape[axis:]), R = |X|/n, each when it needs a
    gradient.

    The backward formulas of Add and Softmax over the dims from ``axis`` on (as Softmax before opset
    13, which coerces X to 2-D). S = data + bias needs a gradient when either does.
    """
    x = ctx.inputs[0]
    needs = _needs(ctx, 0, 1)
    soft = _part(ctx, "Softmax", [x], [x], [needs], opset=11)
    return softmax_backward(soft, axis=axis) + _add_backward(ctx, x, ctx.needs_grad(0), 1)


# --------------------------------------------------------------------------------------------
# saved for backward (flopcount.saved)

@saves("SimplifiedLayerNormalization")
def simplified_layer_norm_saved(ctx: NodeContext, *, axis: int = -1, **_) -> Saved:
    """X, the scale, and the reciprocal root mean square of each row in float32 (4·rows bytes), as RMS
    normalization keeps them."""
    x = ctx.shape(0)
    rows = prod(x[: axis % len(x)]) if x else 1
    return Saved(inputs=tuple(i for i in (0, 1) if ctx.has_input(i)), extra=(("rstd (float32)", STAT_BYTES * rows),))


@saves("Gelu", "FastGelu", "QuickGelu", "BiasGelu", domain=MS)
def ms_gelu_saved(ctx: NodeContext, **_) -> Saved:
    """X (and the bias, whose sum with X the derivative reads)."""
    return keeps(*(i for i in (0, 1) if ctx.has_input(i)))


@saves("FusedMatMul", "TransposeMatMul", domain=MS)
def ms_matmul_saved(ctx: NodeContext, **_) -> Saved:
    """Each operand when the other needs a gradient, as MatMul."""
    return keeps(*(j for j in (0, 1) if ctx.needs_grad(1 - j)))


@saves("BiasSoftmax", domain=MS)
def bias_softmax_saved(ctx: NodeContext, **_) -> Saved:
    """Y, as Softmax."""
    return keeps(outputs=(0,))


@saves("BiasAdd", domain=MS)
def bias_add_saved(ctx: NodeContext, **_) -> Saved:
    """Nothing: dY passes to all three inputs."""
    return Saved()
