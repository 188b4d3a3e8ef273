"""Microsoft contrib normalizations (domain ``com.microsoft``): SkipLayerNormalization, its simplified (RMS) forms,
EmbedLayerNormalization, GroupNorm and SkipGroupNorm, with their backward and what they keep for it, counted as
:mod:`.contrib` says for every fused operator: one FLOP per normalized element plus one transcendental per
statistic, as LayerNormalization and RMSNormalization."""

from __future__ import annotations

from math import prod

from onnx import TensorProto

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.operators import contrib_parts as fused
from flopcount.operators.contrib_parts import MS
from flopcount.operators.elementwise import activation as activation_cost
from flopcount.operators.layout import gather_backward
from flopcount.operators.normalization import normalization_backward, root_mean_square, standardize
from flopcount.registry import backward, formula, saves, shape_function
from flopcount.saved import STAT_BYTES, Saved

# --------------------------------------------------------------------------------------------
# normalization


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
    skip = ctx.convention.weighted(add=n * (1 + fused.given(ctx, 4)))
    return skip + standardize(ctx.convention, n, fused.rows(x), bias=ctx.has_input(3))


@formula("SkipSimplifiedLayerNormalization", family="normalization", domain=MS)
def skip_simplified_layer_norm(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |X| [+ skip] (+ |X| [+ bias]) + |X| [RMSNormalization]; transcendentals = |X|/D.

    input + skip (+ bias), then the root-mean-square normalization over the last dim (no mean), as
    the default-domain RMSNormalization: one FLOP per element and a 1/sqrt per row of D elements.
    """
    x = ctx.shape(0)
    n = prod(x)
    return ctx.convention.weighted(add=n * (1 + fused.given(ctx, 3))) + root_mean_square(ctx.convention, n, fused.rows(x))


@formula("SimplifiedLayerNormalization", family="normalization")
def simplified_layer_norm(ctx: NodeContext, *, axis: int = -1, **_) -> Cost:
    """FLOPs = |X|; transcendentals = prod(X.shape[:axis]) (one 1/sqrt(mean(x²) + eps) per row).

    onnxruntime's RMS normalization, registered by onnxruntime in the default domain (LLaMA-style
    graphs); counted as RMSNormalization.
    """
    x = ctx.shape(0)
    if ctx.convention.weights is None or not x:
        return Cost(flops=prod(x), transcendentals=fused.rows(x, axis))
    return root_mean_square(ctx.convention, prod(x), fused.rows(x, axis))


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
    return embeddings + standardize(ctx.convention, tokens * d, tokens) + Cost(int_ops=tokens * fused.given(ctx, 7))


@shape_function("EmbedLayerNormalization", domain=MS)
def embed_layer_norm_shape(inputs, **_):
    """output and embedding_sum (B, S, D) in the word table's type, D = word_embedding.shape[1]; mask_index (B,)
    int32 (onnxruntime's schema), so that the operator counts without onnxruntime's inference."""
    ids, word = fused.static_shapes(inputs, 0, 2)
    y = (fused.type_of(inputs[2]), (*ids, word[1]))
    return y, (TensorProto.INT32, (ids[0],)), y


@shape_function("GroupNorm", "SkipGroupNorm", domain=MS)
def group_norm_shape(inputs, **_):
    """Y (and SkipGroupNorm's sum S) of X's shape and type (onnxruntime's schema)."""
    (x,) = fused.static_shapes(inputs, 0)
    y = (fused.type_of(inputs[0]), x)
    return y, y


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
    return _group_norm(ctx, groups, activation, 1 + fused.given(ctx, 4))



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
    sum_needs = fused.needs(ctx, 0, 1)
    s_needs = sum_needs or ctx.needs_grad(4)
    cost = fused.add_backward(ctx, x, ctx.needs_grad(0), 1) + fused.add_backward(ctx, x, sum_needs, 4)
    ln = fused.part(ctx, "LayerNormalization", [x, ctx.inputs[2], fused.input_info(ctx, 3)], [x],
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
    sum_needs = fused.needs(ctx, 0, 1)
    s_needs = sum_needs or ctx.needs_grad(3)
    cost = fused.add_backward(ctx, x, ctx.needs_grad(0), 1) + fused.add_backward(ctx, x, sum_needs, 3)
    rms = fused.part(ctx, "RMSNormalization", [x, ctx.inputs[2]], [x], [s_needs, ctx.needs_grad(2)])
    return cost + normalization_backward(rms)


@backward("SimplifiedLayerNormalization")
def simplified_layer_norm_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 7·|X| when X needs a gradient, else 2·|X| for the scale: RMSNormalization's backward.

    onnxruntime's default-domain RMS normalization, counted as RMSNormalization
    (:func:`flopcount.operators.normalization.normalization_backward`).
    """
    return normalization_backward(fused.part(ctx, "RMSNormalization", list(ctx.inputs[:2]), [ctx.inputs[0]],
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
        cost += gather_backward(fused.part(ctx, "Gather", [ctx.inputs[i], (b, s)], [y], [ctx.needs_grad(i), False]))
    ln = fused.part(ctx, "LayerNormalization", [y, ctx.inputs[5], fused.input_info(ctx, 6)], [y],
               [fused.needs(ctx, *tables), ctx.needs_grad(5), ctx.needs_grad(6)])
    return cost + normalization_backward(ln)


def _group_norm_backward(ctx: NodeContext, activation: int, skip: int | None, bias: int | None) -> Cost:
    x = ctx.inputs[0]
    skip_needs = skip is not None and fused.needs(ctx, 0, skip)
    s_needs = ctx.needs_grad(0) or skip_needs or (bias is not None and ctx.needs_grad(bias))
    cost = Cost()
    if skip is not None:
        cost += fused.add_backward(ctx, x, ctx.needs_grad(0), skip) + fused.add_backward(ctx, x, skip_needs, bias)
    if activation:
        cost += fused.activation_backward(ctx, "Swish", x, s_needs or fused.needs(ctx, 1, 2))
    gn = fused.part(ctx, "GroupNormalization", [x, ctx.inputs[1], ctx.inputs[2]], [x],
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



@saves("SimplifiedLayerNormalization")
def simplified_layer_norm_saved(ctx: NodeContext, *, axis: int = -1, **_) -> Saved:
    """X, the scale, and the reciprocal root mean square of each row in float32 (4·rows bytes), as RMS
    normalization keeps them."""
    x = ctx.shape(0)
    rows = prod(x[: axis % len(x)]) if x else 1
    return Saved(inputs=tuple(i for i in (0, 1) if ctx.has_input(i)), extra=(("rstd (float32)", STAT_BYTES * rows),))
