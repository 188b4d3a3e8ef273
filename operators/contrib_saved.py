"""What the backward of com.microsoft's fused operators keeps (:mod:`flopcount.saved`): the union of what the rules
of their default-domain parts keep, just as their backward formulas (:mod:`.contrib`, :mod:`.contrib_normalization`)
sum the parts' backward formulas.

A part's tensor that is the fused node's own input or output is named by its position; an intermediate tensor (a
pre-activation, the sum a skip normalization normalizes) is kept once, in bytes of the node's element type, as a
framework that runs the parts one by one keeps it. A statistic the node also writes as an output (SkipLayerNorm's
mean and inverse standard deviation) is kept as that output, not twice. The attention operators keep what a fused
attention kernel keeps (Q, K, V, the mask, Y and a log-sum-exp per query row, as the default-domain Attention).
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

from flopcount.context import NodeContext, TensorInfo
from flopcount.errors import ShapeError
from flopcount.operators import contrib_parts as fused
from flopcount.operators.contrib_parts import MS
from flopcount.registry import lookup_saved, saves
from flopcount.saved import STAT_BYTES, Saved, element_bytes

__all__: list[str] = []  # the rules are reached through flopcount.registry


class _Kept:
    """What the parts keep, gathered: the fused node's inputs and outputs by position, intermediates by name."""

    def __init__(self, ctx: NodeContext) -> None:
        self.ctx = ctx
        self.own_in = {t.name: i for i, t in enumerate(ctx.inputs) if t is not None}
        self.own_out = {t.name: j for j, t in enumerate(ctx.outputs) if t is not None}
        self.inputs: set[int] = set()
        self.outputs: set[int] = set()
        self.extra: list[tuple[str, int]] = []
        self.seen: set[str] = set()

    def tensor(self, t: TensorInfo) -> None:
        if t.name in self.own_in:
            self.inputs.add(self.own_in[t.name])
        elif t.name in self.own_out:
            self.outputs.add(self.own_out[t.name])
        elif t.name not in self.seen:
            self.seen.add(t.name)
            self.extra.append((t.name.rsplit("/", 1)[-1], prod(t.shape) * element_bytes(t.elem_type)))

    def part(self, p: NodeContext, **attrs) -> None:
        if not any(p.grads):  # a part no gradient flows through runs no backward: it keeps nothing
            return
        rule = lookup_saved(p.domain, p.op_type)
        if rule is None:
            raise ValueError(f"{self.ctx.name}: fused {p.op_type!r} has no saved-for-backward rule")
        s = rule(p, **attrs)
        for i in s.inputs:
            if p.has_input(i):
                self.tensor(p.inputs[i])
        for j in s.outputs:
            self.tensor(p.outputs[j])
        self.extra.extend(s.extra)

    def saved(self) -> Saved:
        return Saved(tuple(sorted(self.inputs)), tuple(sorted(self.outputs)), tuple(self.extra))


def _between(ctx: NodeContext, what: str, shape: Sequence[int], elem_type: int | None = None) -> TensorInfo:
    """An intermediate tensor of the fused node, of its first output's element type unless given."""
    kind = elem_type if elem_type is not None else (ctx.outputs[0].elem_type if ctx.outputs else 0)
    if shape is None:
        raise ShapeError(f"node {ctx.name!r} ({ctx.op_type}): the shape of its {what} is unknown, so what its backward "
                         "keeps cannot be sized; declare its outputs' shapes in the model's value_info, or install "
                         "onnxruntime (pip install '.[ort]'), whose shape inference knows more operators")
    return TensorInfo(f"{ctx.name}/{what}", kind, tuple(shape))


def _output(ctx: NodeContext, j: int) -> TensorInfo | None:
    return ctx.outputs[j] if j < len(ctx.outputs) and ctx.outputs[j] is not None else None


def _activated(kept: _Kept, activation: str, before: TensorInfo, y: TensorInfo, needs: bool) -> None:
    if activation:
        kept.part(fused.part(kept.ctx, activation, [before], [y], [needs]))


@saves("FusedConv", "NhwcFusedConv", domain=MS)
def fused_conv_saved(ctx: NodeContext, *, activation: str = "", **_) -> Saved:
    """Y = act(Conv(X, W, B) + Z): Conv's X and W, and what the activation keeps (Relu, Sigmoid, Tanh: Y; the
    others: their input, the convolution's output (plus Z), an intermediate)."""
    kept, y = _Kept(ctx), ctx.outputs[0]
    conv_needs = fused.needs(ctx, 0, 1, 2)
    tail = bool(activation) or ctx.has_input(3)
    conv_out = _between(ctx, "convolution output", y.shape) if tail else y
    kept.part(fused.part(ctx, "Conv", list(ctx.inputs[:3]), [conv_out], [ctx.needs_grad(i) for i in range(3)]))
    summed = conv_out
    if ctx.has_input(3):
        summed = _between(ctx, "sum with Z", y.shape) if activation else y
        kept.part(fused.part(ctx, "Add", [conv_out, ctx.inputs[3]], [summed], [conv_needs, ctx.needs_grad(3)]))
    _activated(kept, activation, summed, y, conv_needs or ctx.needs_grad(3))
    return kept.saved()


@saves("NhwcConv", domain=MS)
def nhwc_conv_saved(ctx: NodeContext, **_) -> Saved:
    """X and W, as Conv (the channels-last layout changes nothing kept)."""
    kept = _Kept(ctx)
    kept.part(fused.part(ctx, "Conv", list(ctx.inputs[:3]), [ctx.outputs[0]], [ctx.needs_grad(i) for i in range(3)]))
    return kept.saved()


@saves("FusedGemm", "FusedMatMulActivation", domain=MS)
def fused_product_saved(ctx: NodeContext, *, activation: str = "", **_) -> Saved:
    """act(A·B (+ C)): each operand when the other needs a gradient, as MatMul and Gemm, and what the activation
    keeps (Y, or its input, the product: an intermediate). The transposes and alpha keep nothing more."""
    kept, y = _Kept(ctx), ctx.outputs[0]
    product = _between(ctx, "product", y.shape) if activation else y
    kept.part(fused.part(ctx, "MatMul", list(ctx.inputs[:2]), [product], [ctx.needs_grad(0), ctx.needs_grad(1)]))
    _activated(kept, activation, product, y, fused.needs(ctx, *range(len(ctx.inputs))))
    return kept.saved()


@saves("GemmFastGelu", domain=MS)
def gemm_fast_gelu_saved(ctx: NodeContext, **_) -> Saved:
    """Gelu(X·W + bias): X when W needs a gradient, W when X does, and Gelu's input, the biased product (an
    intermediate of Y's size)."""
    kept, y = _Kept(ctx), ctx.outputs[0]
    shape = (*ctx.shape(0)[:-1], ctx.shape(1)[1])  # X[..., K]·W[K, N]
    product = _between(ctx, "product", shape)
    kept.part(fused.part(ctx, "MatMul", list(ctx.inputs[:2]), [product], [ctx.needs_grad(0), ctx.needs_grad(1)]))
    before = product
    if ctx.has_input(2):
        before = _between(ctx, "biased product", shape)
    kept.part(fused.part(ctx, "Gelu", [before], [y], [fused.needs(ctx, 0, 1, 2)]))
    return kept.saved()


@saves("ScaledSiLU", domain=MS)
def scaled_silu_saved(ctx: NodeContext, **_) -> Saved:
    """SiLU(alpha·X): SiLU's input, alpha·X (an intermediate of X's size); the scalar multiply keeps nothing."""
    kept = _Kept(ctx)
    scaled = _between(ctx, "alpha·X", ctx.shape(0))
    kept.part(fused.part(ctx, "Swish", [scaled], [ctx.outputs[0]], [ctx.needs_grad(0)]))
    return kept.saved()


@saves("BiasSplitGelu", domain=MS)
def bias_split_gelu_saved(ctx: NodeContext, **_) -> Saved:
    """Y = L·Gelu(R), L and R the halves of X + bias: Gelu keeps R, the product keeps L and Gelu(R), three
    intermediates of Y's size (the whole sum and Gelu(R), as torch keeps the halves as views of the sum)."""
    if not fused.needs(ctx, 0, 1):
        return Saved()
    kept, y = _Kept(ctx), ctx.outputs[0]
    left, right, gelu = (_between(ctx, w, y.shape) for w in ("left half", "right half", "Gelu(right half)"))
    kept.part(fused.part(ctx, "Gelu", [right], [gelu], [True]))
    kept.part(fused.part(ctx, "Mul", [left, gelu], [y], [True, True]))
    return kept.saved()


def _dropout_mask(ctx: NodeContext, ratio: int, mode: int, bitmask: bool) -> Saved:
    """The dropout mask: the node's mask output when it writes one, else as bools (a bitmask of 32-bit words for
    the Bitmask operators); nothing outside training mode or at ratio 0, as Dropout."""
    kept = _Kept(ctx)
    x = ctx.inputs[0]
    kept.part(fused.part(ctx, "Dropout", [x, fused.input_info(ctx, ratio), fused.input_info(ctx, mode)], [x],
                         [True, False, False]))
    if not kept.extra:
        return Saved()
    if _output(ctx, 1) is not None:
        return Saved(outputs=(1,))
    if bitmask:
        return Saved(extra=(("dropout bitmask (uint32 words)", 4 * -(-ctx.numel(0) // 32)),))
    return kept.saved()


@saves("BiasDropout", domain=MS)
def bias_dropout_saved(ctx: NodeContext, **_) -> Saved:
    """Dropout(X + bias) + residual: the mask (the additions keep nothing)."""
    return _dropout_mask(ctx, 3, 4, bitmask=False) if fused.needs(ctx, 0, 1) else Saved()


@saves("BitmaskBiasDropout", domain=MS)
def bitmask_bias_dropout_saved(ctx: NodeContext, **_) -> Saved:
    """Dropout(X + bias) + residual: the mask as a bitmask (one bit per element, in 32-bit words)."""
    return _dropout_mask(ctx, 3, 4, bitmask=True) if fused.needs(ctx, 0, 1) else Saved()


@saves("BitmaskDropout", domain=MS)
def bitmask_dropout_saved(ctx: NodeContext, **_) -> Saved:
    """The mask as a bitmask (one bit per element, in 32-bit words)."""
    return _dropout_mask(ctx, 1, 2, bitmask=True) if ctx.needs_grad(0) else Saved()


def _normalized_sum(ctx: NodeContext, kept: _Kept, adds: Sequence[int], sum_output: int | None) -> TensorInfo:
    """The sum a skip normalization normalizes (X + skip (+ bias)): the node's sum output, else an intermediate."""
    out = _output(ctx, sum_output) if sum_output is not None else None
    return out if out is not None else _between(ctx, "sum", ctx.shape(adds[0]))


def _with_stat_outputs(saved: Saved, ctx: NodeContext, stats: tuple[int, ...]) -> Saved:
    """``saved`` with the normalization's statistics kept as the node's outputs ``stats`` when it writes them all."""
    if not all(_output(ctx, j) is not None for j in stats):
        return saved
    extra = tuple((w, b) for w, b in saved.extra if "float32" not in w)
    return Saved(saved.inputs, tuple(sorted({*saved.outputs, *stats})), extra)


@saves("SkipLayerNormalization", domain=MS)
def skip_layer_norm_saved(ctx: NodeContext, **_) -> Saved:
    """LayerNorm(X + skip (+ bias)): the sum (output 3 when written), the scale and bias, and the mean and inverse
    standard deviation per row (outputs 1 and 2 when written, else float32 statistics)."""
    kept = _Kept(ctx)
    s = _normalized_sum(ctx, kept, (0, 1), 3)
    beta = fused.input_info(ctx, 3)
    kept.part(fused.part(ctx, "LayerNormalization", [s, ctx.inputs[2], beta], [ctx.outputs[0]],
                         [fused.needs(ctx, 0, 1, 4), ctx.needs_grad(2), ctx.needs_grad(3)]))
    return _with_stat_outputs(kept.saved(), ctx, (1, 2))


@saves("SkipSimplifiedLayerNormalization", domain=MS)
def skip_simplified_layer_norm_saved(ctx: NodeContext, **_) -> Saved:
    """RMSNorm(X + skip (+ bias)): the sum (output 3 when written), the scale, and the reciprocal root mean square
    per row (float32)."""
    kept = _Kept(ctx)
    s = _normalized_sum(ctx, kept, (0, 1), 3)
    kept.part(fused.part(ctx, "SimplifiedLayerNormalization", [s, ctx.inputs[2]], [ctx.outputs[0]],
                         [fused.needs(ctx, 0, 1, 3), ctx.needs_grad(2)]))
    return kept.saved()


@saves("EmbedLayerNormalization", domain=MS)
def embed_layer_norm_saved(ctx: NodeContext, **_) -> Saved:
    """LayerNorm(word[ids] + position[positions] (+ segment[segment ids])): the token ids, the position ids when
    given (implicit positions 0 … S − 1 scatter their gradient by shape alone), the segment ids, the embedding
    sum (output 2 when written), the scale and bias, and the mean and reciprocal standard deviation per token."""
    kept = _Kept(ctx)
    for table, index in ((2, 0), (3, 8), (4, 1)):
        if ctx.has_input(table) and ctx.has_input(index):
            kept.part(fused.part(ctx, "Gather", [ctx.inputs[table], ctx.inputs[index]], [None],
                                 [ctx.needs_grad(table), False]))
    y = ctx.outputs[0]
    s = _output(ctx, 2) or _between(ctx, "embedding sum", y.shape)
    kept.part(fused.part(ctx, "LayerNormalization", [s, ctx.inputs[5], ctx.inputs[6]], [y],
                         [fused.needs(ctx, 2, 3, 4), ctx.needs_grad(5), ctx.needs_grad(6)]))
    return kept.saved()


def _group_norm_saved(ctx: NodeContext, groups: int, activation: int, skip: int | None) -> Saved:
    kept, y = _Kept(ctx), ctx.outputs[0]
    x = ctx.inputs[0]
    data_needs = fused.needs(ctx, 0, *((skip, skip + 1) if skip is not None else ()))
    if skip is not None:
        x = _output(ctx, 1) or _between(ctx, "sum", ctx.shape(0))
    normed = _between(ctx, "normalized", y.shape) if activation else y
    kept.part(fused.part(ctx, "GroupNormalization", [x, ctx.inputs[1], ctx.inputs[2]], [normed],
                         [data_needs, ctx.needs_grad(1), ctx.needs_grad(2)]), num_groups=groups)
    _activated(kept, "Swish" if activation else "", normed, y, True)
    return kept.saved()


@saves("GroupNorm", domain=MS)
def ms_group_norm_saved(ctx: NodeContext, *, groups: int, activation: int = 0, **_) -> Saved:
    """GroupNorm over channels-last X, then Swish when ``activation`` is 1: X, the scale, the mean and reciprocal
    standard deviation per (sample, group) in float32, and Swish's input (the normalized tensor, an
    intermediate)."""
    return _group_norm_saved(ctx, groups, activation, None)


@saves("SkipGroupNorm", domain=MS)
def skip_group_norm_saved(ctx: NodeContext, *, groups: int, activation: int = 0, **_) -> Saved:
    """As GroupNorm, of the sum X + skip (+ bias): the sum (output 1 when written, else an intermediate) instead
    of X."""
    return _group_norm_saved(ctx, groups, activation, 3)


@saves("RotaryEmbedding", domain=MS)
def ms_rotary_saved(ctx: NodeContext, **_) -> Saved:
    """The position ids and the cos and sin caches: dX is dY rotated back by the same angles."""
    return Saved(inputs=tuple(i for i in (1, 2, 3) if ctx.has_input(i)))


def _attention(ctx: NodeContext, kept: _Kept, rows: int, masks: Sequence[int]) -> Saved:
    """Y, the masks given, and a log-sum-exp per query row in float32, besides what ``kept`` holds."""
    for i in masks:
        if ctx.has_input(i):
            kept.inputs.add(i)
    kept.outputs.add(0)
    kept.extra.append(("log-sum-exp (float32)", STAT_BYTES * rows))
    return kept.saved()


@saves("Attention", domain=MS)
def ms_attention_saved(ctx: NodeContext, *, num_heads: int, **_) -> Saved:
    """X·W (+ bias) then attention: X when W needs a gradient, W when X does, Q, K and V (the projection, an
    intermediate of B·S·W's columns), the mask, Y, and a log-sum-exp per query row and head (float32)."""
    kept = _Kept(ctx)
    b, s = ctx.shape(0)[:2]
    qkv = _between(ctx, "Q, K, V", (b, s, ctx.shape(1)[-1]))
    kept.part(fused.part(ctx, "MatMul", list(ctx.inputs[:2]), [qkv], [ctx.needs_grad(0), ctx.needs_grad(1)]))
    kept.tensor(qkv)
    return _attention(ctx, kept, b * num_heads * s, (3, 5))


@saves("MultiHeadAttention", domain=MS)
def multi_head_attention_saved(ctx: NodeContext, *, num_heads: int, **_) -> Saved:
    """Q, K and V (the inputs; with a bias, their biased sums: intermediates of the same sizes), the masks, Y, and a
    log-sum-exp per query row and head (float32)."""
    kept = _Kept(ctx)
    q = ctx.shape(0)
    for i in (0, 1, 2):
        if ctx.has_input(i):
            kept.tensor(_between(ctx, f"biased input {i}", ctx.shape(i)) if ctx.has_input(3) else ctx.inputs[i])
    return _attention(ctx, kept, q[0] * num_heads * q[1], (4, 5))


@saves("GroupQueryAttention", domain=MS)
def group_query_attention_saved(ctx: NodeContext, *, num_heads: int, kv_num_heads: int, do_rotary: int = 0,
                                **_) -> Saved:
    """The query, key and value (the present key and value when a past is given; with ``do_rotary``, the rotated
    query and key: intermediates of the same sizes, and the cos and sin caches), Y, and a log-sum-exp per query row
    and head (float32)."""
    kept = _Kept(ctx)
    q = ctx.shape(0)
    for i, present in ((0, None), (1, 1), (2, 2)):
        if not ctx.has_input(i):
            continue
        t = _output(ctx, present) if present is not None and ctx.has_input(3) else None
        if do_rotary and i < 2 and t is None:
            t = _between(ctx, f"rotated input {i}", ctx.shape(i))
        kept.tensor(t or ctx.inputs[i])
    if do_rotary:
        kept.inputs.update(i for i in (7, 8) if ctx.has_input(i))
    return _attention(ctx, kept, q[0] * num_heads * q[1], ())
