"""Microsoft contrib operators (domain ``com.microsoft``) that ONNX Runtime's optimizers write into graphs.

This module holds the fused convolutions, matrix products, element-wise operators and softmax; the attention
family is in :mod:`.contrib_attention`, the normalizations in :mod:`.contrib_normalization`, and what all three
share (the node context of a part, a fused activation) in :mod:`.contrib_parts`. What follows holds for all.

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

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.operators import contrib_parts as fused
from flopcount.operators.contrib_parts import MS
from flopcount.operators.conv import conv, conv_backward
from flopcount.operators.elementwise import activation as activation_cost
from flopcount.operators.elementwise import dropout_backward, elementwise_backward
from flopcount.operators.matmul import gemm, gemm_backward, matmul_backward
from flopcount.operators.softmax import softmax_backward, softmax_rows
from flopcount.registry import backward, formula, saves, shape_function
from flopcount.saved import Saved, keeps

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
    return conv(ctx) + ctx.convention.weighted(add=fused.given(ctx, 3) * y) + fused.activation(ctx, activation, y)


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
    return fused_matmul(ctx, **attrs) + fused.activation(ctx, activation, ctx.out_numel())


@formula("FusedGemm", family="matmul", domain=MS)
def fused_gemm(
    ctx: NodeContext, *, activation: str = "", transA: int = 0, alpha: float = 1.0, beta: float = 1.0, **_
) -> Cost:
    """FLOPs = 2·M·K·N [Gemm] (+ M·N for C, + |C| when beta ≠ 1, + M·N when alpha ≠ 1) + M·N
    [activation]; MACs = M·K·N.

    The Gemm formula (:func:`flopcount.operators.matmul.gemm`, whose bias and scaling terms follow
    ``count_bias``), then the activation, one FLOP per output element. Needs Y's shape.
    """
    return gemm(ctx, transA=transA, alpha=alpha, beta=beta) + fused.activation(ctx, activation, ctx.out_numel())


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
    return ctx.convention.weighted(add=fused.given(ctx, 1) * n) + activation_cost(ctx.convention, "Gelu", n, approximate="tanh")


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


@shape_function("BiasSplitGelu", domain=MS)
def bias_split_gelu_shape(inputs, **_):
    """Y (N, S, D/2) of X (N, S, D) in X's type (onnxruntime's schema)."""
    (x,) = fused.static_shapes(inputs, 0)
    if not x or x[-1] % 2:
        raise ValueError(f"the last dim of X, {x[-1] if x else None}, is not even")
    return ((fused.type_of(inputs[0]), (*x[:-1], x[-1] // 2)),)


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
    return ctx.convention.weighted(add=(1 + fused.given(ctx, 2)) * n, mul=_training(ctx, 4) * n)


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
    conv_needs = fused.needs(ctx, 0, 1, 2)
    cost = fused.activation_backward(ctx, activation, y, conv_needs or ctx.needs_grad(3))
    cost += fused.add_backward(ctx, y, conv_needs, 3)
    return cost + conv_backward(fused.part(ctx, "Conv", list(ctx.inputs[:3]), [y], [ctx.needs_grad(i) for i in range(3)]))


@backward("NhwcConv", domain=MS)
def nhwc_conv_backward(ctx: NodeContext, **_) -> Cost:
    """dX and dW: the forward MACs (N·C_out·S_out·K·C_in/G) each, dB = Σ dY (|Y| additions), for the
    inputs that need a gradient: Conv's backward in the channels-last layout. Needs Y's shape."""
    return conv_backward(fused.part(ctx, "Conv", list(ctx.inputs[:3]), list(ctx.outputs[:1]), list(ctx.grads[:3])))


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
    needs = fused.needs(ctx, 0, 1)
    cost = matmul_backward(fused.part(ctx, "MatMul", [a, b], [y], [ctx.needs_grad(0), ctx.needs_grad(1)]))
    if alpha != 1.0 and ctx.convention.count_bias and needs:
        cost += elementwise_backward(fused.part(ctx, "Mul", [y, ()], [y], [True, False]))
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
    cost = fused.activation_backward(ctx, activation, y, fused.needs(ctx, 0, 1))
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
    cost = fused.activation_backward(ctx, activation, y, fused.needs(ctx, 0, 1, 2))
    gemm_part = fused.part(ctx, "Gemm", list(ctx.inputs[:3]), [y], [ctx.needs_grad(i) for i in range(3)])
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
    needs = fused.needs(ctx, 0, 1, 2)
    cost = fused.activation_backward(ctx, "Gelu", y, needs)
    if ctx.convention.count_bias:
        cost += fused.add_backward(ctx, y, fused.needs(ctx, 0, 1), 2)
    return cost + matmul_backward(fused.part(ctx, "MatMul", [x, ctx.shape(1)], [y], [ctx.needs_grad(0), ctx.needs_grad(1)]))


# --- element-wise ---------------------------------------------------------------------------


def _bias_activation_backward(ctx: NodeContext, name: str, bias: int | None) -> Cost:
    """Backward of act(X + bias): the activation's per element of X, then dbias = Σ over broadcast
    dims."""
    x = ctx.inputs[0]
    cost = fused.activation_backward(ctx, name, x, fused.needs(ctx, 0, *(() if bias is None else (bias,))))
    return cost + (fused.add_backward(ctx, x, ctx.needs_grad(0), bias) if bias is not None else Cost())


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
    scale = elementwise_backward(fused.part(ctx, "Mul", [x, ()], [x], [True, False]))
    return fused.activation_backward(ctx, "Swish", x, True) + scale


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
    if not fused.needs(ctx, 0, 1):
        return Cost()
    mul = elementwise_backward(fused.part(ctx, "Mul", [y, y], [y], [True, True]))
    return mul + fused.activation_backward(ctx, "Gelu", y, True) + fused.add_backward(ctx, ctx.inputs[0], ctx.needs_grad(0), 1)


@backward("BiasAdd", domain=MS)
def bias_add_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| − |bias| [Σ dY over tokens, when the bias needs a gradient] + |X| − |skip| [when
    the skip broadcasts and needs one]: the backward formulas of two Adds; dX passes through."""
    x = ctx.inputs[0]
    return fused.add_backward(ctx, x, ctx.needs_grad(0), 1) + fused.add_backward(ctx, x, fused.needs(ctx, 0, 1), 2)


def _bias_dropout_backward(ctx: NodeContext, data_inputs: tuple[int, ...], mode: int) -> Cost:
    x = ctx.inputs[0]
    needs = fused.needs(ctx, *data_inputs)
    if not needs:
        return Cost()
    part = fused.part(ctx, "Dropout", [x, None, fused.input_info(ctx, mode)], [x], [True, False, False])
    return dropout_backward(part)


@backward("BiasDropout", "BitmaskBiasDropout", domain=MS, buffers=(3,))
def bias_dropout_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [dY times mask/(1 − ratio), training_mode a constant true] + |X| − |bias| [dbias,
    summed over tokens], when data or bias needs a gradient; dresidual = dY, free.

    The backward formulas of Add, Dropout and Add. The ratio is never trained (a buffer).
    """
    x = ctx.inputs[0]
    cost = _bias_dropout_backward(ctx, (0, 1), 4)
    return cost + fused.add_backward(ctx, x, ctx.needs_grad(0), 1) + fused.add_backward(ctx, x, fused.needs(ctx, 0, 1), 2)


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
    needs = fused.needs(ctx, 0, 1)
    soft = fused.part(ctx, "Softmax", [x], [x], [needs], opset=11)
    return softmax_backward(soft, axis=axis) + fused.add_backward(ctx, x, ctx.needs_grad(0), 1)


# --------------------------------------------------------------------------------------------
# saved for backward (flopcount.saved)

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
