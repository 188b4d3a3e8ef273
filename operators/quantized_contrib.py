"""Quantized operators of ONNX Runtime (domain ``com.microsoft``) that its quantizer and graph optimizer write:
``quantize_dynamic`` (DynamicQuantizeLSTM, QAttention), ``quantize_static`` in the QOperator format (QGemm and
the QLinear element-wise, pooling, softmax, concat and where ops), the session optimizer (MatMulIntegerToFloat,
DynamicQuantizeMatMul) and its channels-last transformer (QLinearConv with ``channels_last``).

The house rule of :mod:`flopcount.operators.quantized` applies: a quantized op costs what its float
counterpart costs, plus its (de)quantization arithmetic.

* Integer products: MACs in ``macs``, two integer operations per MAC in ``int_ops`` (never FLOPs); a zero
  point subtracted costs one integer operation per element of its tensor whenever the zero point input is
  given (for dynamically quantized activations always: DynamicQuantizeLinear makes one).
* Dequantizing a tensor, x = (q − zero_point)·scale: one FLOP per element (the scale) and, when its zero
  point is given, one integer operation per element. Quantizing, q = round(x/scale) + zero_point: one FLOP per
  element, two with a zero point (as QuantizeLinear). A product's output dequantized by the combined scale
  costs one FLOP per output element; requantized to an 8-bit output, two (as QLinearMatMul).
* Element-wise, pooling, reduction and softmax ops dequantize their inputs, compute in float as their float
  counterpart is counted (under every convention) and quantize their output. Where onnxruntime evaluates a
  lookup table instead (QLinearSigmoid, QLinearLeakyRelu), the count is still the arithmetic it stands for.
* Forming combined scales (a_scale·b_scale/y_scale), rounding, saturation and type conversion are not counted.
* Every op here is of the ``quantized`` family, QAttention and DynamicQuantizeLSTM included: the products-only
  conventions (``dense``, ``macs``) leave them out as they leave out MatMulInteger, so that integer MACs never
  become FLOPs (their float attention core and gate arithmetic go with them).

Shapes: ONNX's inference does not know these operators; a shape function registered beside each formula
gives its output types (ONNX's own inference of the float counterpart where one exists, so ``auto_pad``,
``ceil_mode`` and channels-last layouts follow the spec), and inference carries on downstream.

These operators run inference only: none has a backward formula, so train mode lists them as unsupported.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np
import onnx
from onnx import TensorProto, helper

from flopcount.context import NodeContext, TensorInfo
from flopcount.cost import Bound, Cost
from flopcount.operators.contrib_attention import projected_attention
from flopcount.operators.contrib_normalization import embed_layer_norm
from flopcount.operators.elementwise import activation
from flopcount.operators.pooling import global_pool, pool
from flopcount.operators.quantized import INT_OPS_PER_MAC, REQUANTIZE_FLOPS, dynamic_quantize_linear, qlinear_conv
from flopcount.operators.quantized import dequantize_linear, quantize_linear
from flopcount.operators.recurrent import lstm
from flopcount.operators.reduction import reduce
from flopcount.operators.softmax import softmax_rows
from flopcount.operators.contrib_parts import static_shapes, type_of
from flopcount.registry import formula, shape_function

MS = "com.microsoft"
FLOAT = TensorProto.FLOAT
UINT8 = TensorProto.UINT8
SHAPE_OPSET = 21  # the ONNX opset whose float counterparts give these operators' shapes


# --------------------------------------------------------------------------------------------
# (de)quantization arithmetic


def dequantize(ctx: NodeContext, data: int, zero_point: int) -> Cost:
    """x = (q − zero_point)·scale on input ``data``: |X| FLOPs, and |X| int_ops when input ``zero_point`` is given."""
    n = ctx.numel(data)
    return Cost(flops=n, int_ops=n if ctx.has_input(zero_point) else 0)


def quantize(ctx: NodeContext, n: int, zero_point: int) -> Cost:
    """q = round(x/scale) + zero_point on ``n`` elements: n FLOPs, 2n when input ``zero_point`` is given."""
    return Cost(flops=n * (2 if ctx.has_input(zero_point) else 1))


def _float_view(ctx: NodeContext, op_type: str, inputs: Sequence[int]) -> NodeContext:
    """The node as its float counterpart ``op_type`` sees it: the data inputs at ``inputs``, float-typed."""

    def as_float(t: TensorInfo | None) -> TensorInfo | None:
        return None if t is None else TensorInfo(t.name, FLOAT, t.shape)

    return ctx._replace(op_type=op_type, domain="", inputs=tuple(as_float(ctx.inputs[i]) for i in inputs),
                        outputs=tuple(map(as_float, ctx.outputs)))


# --------------------------------------------------------------------------------------------
# shapes


def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(np.broadcast_shapes(*shapes))


def _to_channels_first(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], shape[-1], *shape[1:-1])


def _to_channels_last(shape: tuple[int, ...]) -> tuple[int, ...]:
    return (shape[0], *shape[2:], shape[1])


def infer_as(op_type: str, inputs: Sequence[TensorInfo | None], **attrs) -> tuple[tuple[int, tuple], ...]:
    """Output (elem_type, shape) of the default-domain ``op_type`` on ``inputs``, by ONNX's own inference."""
    names = [f"i{k}" if t is not None else "" for k, t in enumerate(inputs)]
    node = helper.make_node(op_type, names, ["y"], **attrs)
    types = {n: helper.make_tensor_type_proto(t.elem_type, list(t.shape)) for n, t in zip(names, inputs) if n}
    out = onnx.shape_inference.infer_node_outputs(onnx.defs.get_schema(op_type, SHAPE_OPSET), node, types)
    tt = out["y"].tensor_type
    return ((tt.elem_type, tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)),)


def same_as_input(inputs, **_):
    """Shape function: the shape and type of input 0."""
    (shape,) = static_shapes(inputs, 0)
    return ((type_of(inputs[0], UINT8), shape),)


# --------------------------------------------------------------------------------------------
# products


def _matmul_macs(ctx: NodeContext) -> int:
    return ctx.out_numel() * ctx.shape(0)[-1]


@shape_function("MatMulIntegerToFloat", "DynamicQuantizeMatMul", domain=MS)
def matmul_to_float_shape(inputs, **_):
    """numpy matmul of A and B; the output type is that of the scale (input 2)."""
    a, b = static_shapes(inputs, 0, 1)
    (_, shape), = infer_as("MatMul", [TensorInfo("a", FLOAT, a), TensorInfo("b", FLOAT, b)])
    return ((type_of(inputs[2], FLOAT), shape),)


@formula("MatMulIntegerToFloat", family="quantized", domain=MS, quantized=(0, 1, 6))
def matmul_integer_to_float(ctx: NodeContext, **_) -> Cost:
    """int_ops = 2·|Y|·K (+ |A| with a_zero_point, + |B| with b_zero_point); FLOPs = |Y| [× a_scale·b_scale]
    (+ |Y| with a bias); MACs = |Y|·K.

    MatMulInteger (numpy matmul semantics, K the last dim of A), then its int32 result dequantized by the
    combined scale, one multiply per output element, and the float bias added (under ``count_bias``).
    """
    y = ctx.out_numel()
    macs = _matmul_macs(ctx)
    zero_points = (ctx.numel(0) if ctx.has_input(4) else 0) + (ctx.numel(1) if ctx.has_input(5) else 0)
    bias = y if ctx.has_input(6) and ctx.convention.count_bias else 0
    return Cost(flops=y + bias, macs=macs, int_ops=INT_OPS_PER_MAC * macs + zero_points)


@formula("DynamicQuantizeMatMul", family="quantized", domain=MS, quantized=(0, 1, 4))
def dynamic_quantize_matmul(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 4·|A| + 4 [DynamicQuantizeLinear of A] + |Y| [× a_scale·b_scale] (+ |Y| with a bias);
    int_ops = 2·|Y|·K + |A| (+ |B| with b_zero_point); MACs = |Y|·K.

    A is quantized at run time as DynamicQuantizeLinear does (its min and max, scale and zero point, then
    each element: 2·(|A| − 1) + 6 + 2·|A| FLOPs), multiplied with the quantized B as MatMulInteger (A's zero
    point always subtracted), the int32 result dequantized by the combined scale, then the float bias
    (under ``count_bias``).
    """
    y = ctx.out_numel()
    macs = _matmul_macs(ctx)
    quantized_a = dynamic_quantize_linear(ctx)
    zero_points = ctx.numel(0) + (ctx.numel(1) if ctx.has_input(3) else 0)
    bias = y if ctx.has_input(4) and ctx.convention.count_bias else 0
    return quantized_a + Cost(flops=y + bias, macs=macs, int_ops=INT_OPS_PER_MAC * macs + zero_points)


@shape_function("QGemm", domain=MS)
def qgemm_shape(inputs, *, transA: int = 0, transB: int = 0, **_):
    """Y[M, N]; float (the type of a_scale) without y_scale, else the type of y_zero_point (uint8 when omitted)."""
    a, b = static_shapes(inputs, 0, 3)
    m = a[1] if transA else a[0]
    n = b[0] if transB else b[1]
    if len(inputs) > 7 and inputs[7] is not None:
        elem = type_of(inputs[8], UINT8) if len(inputs) > 8 and inputs[8] is not None else UINT8
    else:
        elem = type_of(inputs[1], FLOAT)
    return ((elem, (m, n)),)


@formula("QGemm", family="quantized", domain=MS, quantized=(0, 3, 6))
def qgemm(ctx: NodeContext, *, transA: int = 0, **_) -> Cost:
    """int_ops = 2·M·K·N + |A| + |B| [zero points] (+ M·N with the int32 bias C); FLOPs = 2·M·N with
    y_scale [requantize], else M·N [× alpha·a_scale·b_scale]; MACs = M·K·N.

    Gemm on quantized A[M, K] (transA: [K, M]) and B, both zero points required inputs. C is the int32
    bias, one integer add per output element (under ``count_bias``, as Gemm's). With y_scale the output is
    requantized to 8 bits (multiply by the combined scale, add y_zero_point), else dequantized to float (one
    multiply; alpha is folded into that scale).
    """
    y = ctx.out_numel()
    a = ctx.shape(0)
    macs = y * (a[0] if transA else a[1])
    int_ops = INT_OPS_PER_MAC * macs + ctx.numel(0) + ctx.numel(3)
    if ctx.has_input(6) and ctx.convention.count_bias:
        int_ops += y
    return Cost(flops=(REQUANTIZE_FLOPS if ctx.has_input(7) else 1) * y, macs=macs, int_ops=int_ops)


# --------------------------------------------------------------------------------------------
# attention and recurrent layers


@shape_function("QAttention", domain=MS)
def qattention_shape(inputs, *, num_heads: int, **_):
    """output (B, S, D) with D = weight.shape[1]/3, the type of input_scale; present (2, B, H, P + S, D/H)."""
    x, w = static_shapes(inputs, 0, 1)
    b, s, d = x[0], x[1], w[1] // 3
    past = inputs[8].shape[3] if len(inputs) > 8 and inputs[8] is not None and inputs[8].is_static else 0
    elem = type_of(inputs[3], FLOAT)
    return ((elem, (b, s, d)), (elem, (2, b, num_heads, past + s, d // num_heads)))


@formula("QAttention", family="quantized", domain=MS, quantized=(0, 1, 2))
def qattention(ctx: NodeContext, *, num_heads: int, unidirectional: int = 0, do_rotary: int = 0, **_) -> Cost:
    """int_ops = 2·B·S·D_in·3D [QKV projection] (+ |input| with input_zero_point, + |weight| with
    weight_zero_point); FLOPs = B·S·3D [× input_scale·weight_scale] + B·S·3D [bias] + the Attention core
    (as com.microsoft Attention: 2·R·T·2E + R·E + B·H·T·E + R·(5T − 2) + R·T when masked); MACs =
    B·S·D_in·3D + 2·R·T·E; H = num_heads, E = D/H, R = B·H·S, T = P + S.

    com.microsoft Attention whose input projection is an integer product: input (B, S, D_in) and
    weight (D_in, 3D) are 8-bit, the int32 product is dequantized by the combined scale (one multiply per
    element), then the float bias (under ``count_bias``) and the attention core in float
    (:func:`~flopcount.operators.contrib.projected_attention`). "Masked": a mask_index input or
    unidirectional = 1. The cache ``past`` (2, B, H, P, E) is concatenated at no cost.
    """
    x, w = ctx.shape(0), ctx.shape(1)
    b, s = x[0], x[1]
    d = w[1] // 3
    projected = b * s * w[1]
    macs = projected * x[-1]
    zero_points = (ctx.numel(0) if ctx.has_input(6) else 0) + (ctx.numel(1) if ctx.has_input(7) else 0)
    bias = projected if ctx.has_input(2) and ctx.convention.count_bias else 0
    cost = Cost(flops=projected + bias, macs=macs, int_ops=INT_OPS_PER_MAC * macs + zero_points)
    t = (ctx.shape(8)[3] if ctx.has_input(8) else 0) + s
    masked = int(ctx.has_input(5) or bool(unidirectional))
    return cost + projected_attention(ctx, b, s, t, (d, d, d), num_heads, masked, do_rotary, 0)


@shape_function("QEmbedLayerNormalization", domain=MS)
def qembed_layer_norm_shape(inputs, **_):
    """layernorm_out (B, S, D) in the type of word_embedding_scale, D = word_embedding.shape[1]; mask_index_out
    (B,) int32."""
    ids, word = static_shapes(inputs, 0, 2)
    return ((type_of(inputs[8], FLOAT), (*ids, word[1])), (TensorProto.INT32, (ids[0],)))


@formula("QEmbedLayerNormalization", family="normalization", domain=MS, quantized=(2, 3, 4, 5, 6))
def qembed_layer_norm(ctx: NodeContext, **_) -> Cost:
    """EmbedLayerNormalization's count (B·S·D per embedding sum + LayerNormalization over D, B·S
    transcendentals, B·S int_ops with a mask) + k·B·S·D + 2·D FLOPs and as many int_ops [dequantizing
    the k = 2 or 3 gathered rows per token, gamma and beta].

    The word, position (and segment) tables, gamma and beta are 8-bit, each with its scale and (required)
    zero point; every gathered element and gamma and beta are dequantized (subtract the zero point, multiply
    by the scale), then the float embedding sum and layer normalization run as
    :func:`~flopcount.operators.contrib.embed_layer_norm`.
    """
    b, s = ctx.shape(0)
    d = ctx.shape(2)[1]
    rows = 2 + (ctx.has_input(1) and ctx.has_input(4))
    dequantized = rows * b * s * d + 2 * d
    return embed_layer_norm(ctx) + Cost(flops=dequantized, int_ops=dequantized)


def _lstm_hidden(w: tuple[int, ...], hidden_size: int | None) -> int:
    """H: the hidden_size attribute, else from W[D, I, 4H]."""
    return hidden_size if hidden_size else w[2] // 4


@shape_function("DynamicQuantizeLSTM", domain=MS)
def dynamic_quantize_lstm_shape(inputs, *, hidden_size: int | None = None, direction: str = "forward", **_):
    """Y (S, D, B, H), Y_h and Y_c (D, B, H) as LSTM's; H = hidden_size, else W.shape[2]/4 (W is [D, I, 4H])."""
    x, w = static_shapes(inputs, 0, 1)
    h = _lstm_hidden(w, hidden_size)
    dirs = 2 if direction == "bidirectional" else 1
    elem = type_of(inputs[0], FLOAT)
    return ((elem, (x[0], dirs, x[1], h)), (elem, (dirs, x[1], h)), (elem, (dirs, x[1], h)))


@formula("DynamicQuantizeLSTM", family="quantized", domain=MS, quantized=(0, 1, 2, 3, 5, 6, 7))
def dynamic_quantize_lstm(ctx: NodeContext, *, hidden_size: int | None = None, direction: str = "forward",
                          **attrs) -> Cost:
    """LSTM's count with its gate products integer: int_ops = 2·D·S·B·4H·(I + H) + |W| + |R| [zero points]
    + D·(|X| + S·B·H) [activation zero points]; FLOPs = LSTM's FLOPs − 2·MACs + D·(4·|X| + 4) + D·S·(4·B·H + 4)
    [dynamic quantization of X and of each H_{t−1}] + 2·D·S·B·4H [dequantizing both products]; MACs =
    D·S·B·4H·(I + H).

    W[D, I, 4H] and R[D, H, 4H] are 8-bit (transposed against LSTM's), H from ``hidden_size`` or W. Per
    direction X is quantized once and H_{t−1} at every step, each as DynamicQuantizeLinear (2·(n − 1) + 6 + 2n
    FLOPs for n elements), their zero points subtracted in the integer products; X·W and H·R are dequantized
    separately (one multiply per gate unit each); the rest (activations, cell update, biases, peepholes,
    clip) is LSTM's element-wise work (:func:`~flopcount.operators.recurrent.lstm`).
    """
    hidden = _lstm_hidden(ctx.shape(1), hidden_size)
    base = lstm(ctx, hidden_size=hidden, direction=direction, layout=0,
                activations=attrs.get("activations"), clip=attrs.get("clip"))
    total = base.total if isinstance(base, Bound) else base
    x = ctx.shape(0)
    steps, batch = x[0], x[1]
    dirs = 2 if direction == "bidirectional" else 1
    states = batch * hidden
    quantizing = dirs * (4 * prod(x) + 4) + dirs * steps * (4 * states + 4)
    dequantizing = 2 * dirs * steps * batch * 4 * hidden
    products = ctx.convention.fc_flops_per_mac * total.macs
    int_ops = (INT_OPS_PER_MAC * total.macs + ctx.numel(1) + ctx.numel(2) + dirs * (prod(x) + steps * states))
    cost = Cost(flops=total.flops - products + quantizing + dequantizing, macs=total.macs,
                transcendentals=total.transcendentals, int_ops=total.int_ops + int_ops)
    return Bound(cost, base.why) if isinstance(base, Bound) else cost


# --------------------------------------------------------------------------------------------
# QLinear element-wise, softmax, concat and where


@shape_function("QLinearAdd", "QLinearMul", domain=MS)
def qlinear_binary_shape(inputs, **_):
    """C: A and B broadcast, in A's type."""
    a, b = static_shapes(inputs, 0, 3)
    return ((type_of(inputs[0], UINT8), _broadcast(a, b)),)


@formula("QLinearAdd", "QLinearMul", family="quantized", domain=MS, quantized=(0, 3))
def qlinear_binary(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |A| + |B| [dequantize] + |C| [Add or Mul] + |C|·(1 + [C_zero_point]) [quantize];
    int_ops = |A|·[A_zero_point] + |B|·[B_zero_point].

    A and B dequantized, added or multiplied in float with broadcasting as Add and Mul (each at its
    convention weight), the result quantized to C.
    """
    c = ctx.out_numel()
    op = "Add" if ctx.op_type == "QLinearAdd" else "Mul"
    return dequantize(ctx, 0, 2) + dequantize(ctx, 3, 5) + activation(ctx.convention, op, c) + quantize(ctx, c, 7)


shape_function("QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", domain=MS)(same_as_input)


@formula("QLinearSigmoid", "QLinearLeakyRelu", family="quantized", domain=MS, quantized=(0,))
def qlinear_activation(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [dequantize] + |Y| [the activation] + |Y|·(1 + [Y_zero_point]) [quantize];
    transcendentals = |Y| for Sigmoid; int_ops = |X|·[X_zero_point].

    Sigmoid or LeakyRelu as the element-wise op counts it, between dequantizing X and quantizing Y.
    """
    y = ctx.out_numel()
    return dequantize(ctx, 0, 2) + activation(ctx.convention, ctx.op_type.removeprefix("QLinear"), y) + quantize(ctx, y, 4)


@formula("QLinearSoftmax", family="quantized", domain=MS, quantized=(0,))
def qlinear_softmax(ctx: NodeContext, *, axis: int = -1, opset: int = 13, **_) -> Cost:
    """FLOPs = |X| [dequantize] + R·(5n − 2) [Softmax] + |Y|·(1 + [y_zero_point]) [quantize];
    transcendentals = R·n; int_ops = |X|·[x_zero_point]; R rows of n elements.

    Softmax as the ONNX op of the ``opset`` attribute counts it: n = X.shape[axis] from opset 13 on, before
    it X is coerced to 2-D at ``axis`` (n = prod(X.shape[axis:])).
    """
    x = ctx.shape(0)
    axis %= max(len(x), 1)
    n = x[axis] if opset >= 13 else prod(x[axis:])
    rows = prod(x) // n if n else 0
    return dequantize(ctx, 0, 2) + softmax_rows(ctx.convention, rows, n) + quantize(ctx, ctx.out_numel(), 4)


@shape_function("QLinearConcat", domain=MS)
def qlinear_concat_shape(inputs, *, axis: int, **_):
    """Concat of the data inputs (positions 2, 5, 8 ...), in the type of Y_zero_point."""
    data = inputs[2::3]
    static_shapes(inputs, *range(2, len(inputs), 3))
    (_, shape), = infer_as("Concat", [TensorInfo(t.name, FLOAT, t.shape) for t in data], axis=axis)
    return ((type_of(inputs[1], UINT8), shape),)


@formula("QLinearConcat", family="quantized", domain=MS, quantized=range(2, 2**31, 3))
def qlinear_concat(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 3·|Y| [each input dequantized, then quantized to Y's scale and zero point]; int_ops = |Y|
    [each input's zero point].

    Inputs come as (X, X_scale, X_zero_point) triples after Y_scale and Y_zero_point (both required); every
    element is requantized, also where an input shares Y's scale (the values are not read). The copy is free.
    """
    cost = Cost()
    for i in range(2, len(ctx.inputs), 3):
        cost += dequantize(ctx, i, i + 2) + quantize(ctx, ctx.numel(i), 1)
    return cost


@shape_function("QLinearWhere", domain=MS)
def qlinear_where_shape(inputs, **_):
    """Z: condition, X and Y broadcast, in the type of z_zero_point."""
    cond, x, y = static_shapes(inputs, 0, 1, 4)
    return ((type_of(inputs[8], type_of(inputs[1], UINT8)), _broadcast(cond, x, y)),)


@formula("QLinearWhere", family="quantized", domain=MS, quantized=(1, 4))
def qlinear_where(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| + |Y| [dequantize] + 2·|Z| [quantize]; int_ops = |X| + |Y| [zero points].

    X and Y dequantized (their zero points are required inputs), the selection is free as Where's, the
    result quantized to Z's scale and zero point.
    """
    return dequantize(ctx, 1, 3) + dequantize(ctx, 4, 6) + quantize(ctx, ctx.out_numel(), 8)


# --------------------------------------------------------------------------------------------
# pooling and reduction


@shape_function("QLinearAveragePool", domain=MS)
def qlinear_average_pool_shape(inputs, *, channels_last: int = 0, **attrs):
    """AveragePool's output shape (channels-last X and Y with ``channels_last``), in X's type."""
    (x,) = static_shapes(inputs, 0)
    nchw = _to_channels_first(x) if channels_last else x
    keep = {k: v for k, v in attrs.items() if k in ("auto_pad", "ceil_mode", "count_include_pad", "kernel_shape",
                                                      "pads", "strides")}
    (_, y), = infer_as("AveragePool", [TensorInfo("x", FLOAT, nchw)], **keep)
    return ((type_of(inputs[0], UINT8), _to_channels_last(y) if channels_last else y),)


@formula("QLinearAveragePool", family="quantized", domain=MS, quantized=(0,))
def qlinear_average_pool(ctx: NodeContext, *, kernel_shape, **_) -> Cost:
    """FLOPs = |X| [dequantize] + K·|Y| [AveragePool] + |Y|·(1 + [y_zero_point]) [quantize];
    int_ops = |X|·[x_zero_point]; K = prod(kernel_shape).

    AveragePool as the ONNX op counts it (``table3``: |X|), channels-last or not.
    """
    y = ctx.out_numel()
    return dequantize(ctx, 0, 2) + pool(_float_view(ctx, "AveragePool", (0,)), kernel_shape=kernel_shape) + quantize(ctx, y, 4)


@shape_function("QLinearGlobalAveragePool", domain=MS)
def qlinear_global_average_pool_shape(inputs, *, channels_last: int = 0, **_):
    """(N, C, 1, ..., 1), or (N, 1, ..., 1, C) with ``channels_last``, in X's type."""
    (x,) = static_shapes(inputs, 0)
    ones = (1,) * (len(x) - 2)
    return ((type_of(inputs[0], UINT8), (x[0], *ones, x[-1]) if channels_last else (x[0], x[1], *ones)),)


@formula("QLinearGlobalAveragePool", family="quantized", domain=MS, quantized=(0,))
def qlinear_global_average_pool(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [dequantize] + |X| [GlobalAveragePool] + 2·|Y| [quantize]; int_ops = |X| [x_zero_point].

    GlobalAveragePool as the ONNX op counts it; both zero points are required inputs.
    """
    pooled = global_pool(_float_view(ctx, "GlobalAveragePool", (0,)))
    return dequantize(ctx, 0, 2) + pooled + quantize(ctx, ctx.out_numel(), 4)


@shape_function("QLinearReduceMean", domain=MS)
def qlinear_reduce_mean_shape(inputs, *, axes: Sequence[int], keepdims: int = 1, **_):
    """ReduceMean's output shape over ``axes`` (``keepdims``), in the data's type."""
    (x,) = static_shapes(inputs, 0)
    axes_t = TensorInfo("axes", TensorProto.INT64, (len(axes),))
    node = helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=keepdims)
    types = {"x": helper.make_tensor_type_proto(FLOAT, list(x)),
             "axes": helper.make_tensor_type_proto(axes_t.elem_type, list(axes_t.shape))}
    data = {"axes": helper.make_tensor("axes", TensorProto.INT64, [len(axes)], list(axes))}
    out = onnx.shape_inference.infer_node_outputs(onnx.defs.get_schema("ReduceMean", SHAPE_OPSET), node, types, data)
    shape = tuple(d.dim_value for d in out["y"].tensor_type.shape.dim)
    return ((type_of(inputs[0], UINT8), shape),)


@formula("QLinearReduceMean", family="quantized", domain=MS, quantized=(0,))
def qlinear_reduce_mean(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [dequantize] + |X| [ReduceMean: |X| − |Y| additions, |Y| divisions] + |Y|·(1 +
    [reduced_zero_point]) [quantize]; int_ops = |X|·[data_zero_point].

    ReduceMean as the ONNX op counts it (weighted conventions price its additions and divisions).
    """
    reduced = reduce(_float_view(ctx, "ReduceMean", (0,)))
    return dequantize(ctx, 0, 2) + reduced + quantize(ctx, ctx.out_numel(), 4)


# --------------------------------------------------------------------------------------------
# convolution, QuantizeLinear and DequantizeLinear of com.microsoft


@shape_function("QLinearConv", domain=MS)
def ms_qlinear_conv_shape(inputs, *, channels_last: int = 0, **attrs):
    """ONNX QLinearConv's output (X and Y channels-last with ``channels_last``; W keeps [C_out, C_in/G, k...])."""
    (x,) = static_shapes(inputs, 0)
    static_shapes(inputs, 3)
    nchw = list(inputs)
    if channels_last:
        nchw[0] = TensorInfo(inputs[0].name, inputs[0].elem_type, _to_channels_first(x))
    keep = {k: v for k, v in attrs.items() if k in ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")}
    (elem, y), = infer_as("QLinearConv", nchw, **keep)
    return ((elem, _to_channels_last(y) if channels_last else y),)


formula("QLinearConv", family="quantized", domain=MS, quantized=(0, 3, 8))(qlinear_conv)
formula("QuantizeLinear", family="quantized", domain=MS, quantized=(0,))(quantize_linear)
formula("DequantizeLinear", family="quantized", domain=MS, quantized=(0,))(dequantize_linear)


@shape_function("QuantizeLinear", domain=MS)
def ms_quantize_linear_shape(inputs, **_):
    """x's shape, in the type of y_zero_point (uint8 when omitted)."""
    (x,) = static_shapes(inputs, 0)
    given = len(inputs) > 2 and inputs[2] is not None
    return ((type_of(inputs[2], UINT8) if given else UINT8, x),)


@shape_function("DequantizeLinear", domain=MS)
def ms_dequantize_linear_shape(inputs, **_):
    """x's shape, in the type of x_scale."""
    (x,) = static_shapes(inputs, 0)
    return ((type_of(inputs[1], FLOAT), x),)
