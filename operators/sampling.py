"""Random sampling. Generating random numbers is not counted: it is bit manipulation in a
generator, not arithmetic on the model's tensors (the same choice as Dropout's mask). What a
sampling op computes *from its input* is counted: Bernoulli's comparison with the probability,
Multinomial's distribution over the classes."""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves_nothing, zero_cost


@formula("Bernoulli", family="random")
def bernoulli(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y|: one comparison u < p of a uniform draw u with the input probability p per element.

    Drawing u is not counted (random generation; see the module).
    """
    return Cost(flops=ctx.out_numel())


@backward("Bernoulli")
def bernoulli_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = 0: a draw is piecewise constant in the probability p, so dp = 0 (as torch's
    bernoulli gives): no arithmetic, stated rather than left unsupported.

    A trained p that should learn through the draw needs an estimator (straight-through,
    REINFORCE) written into the graph itself; its own ops are counted there.
    """
    return Cost()


@formula("Multinomial", family="random")
def multinomial(ctx: NodeContext, **_) -> Cost:
    """FLOPs = B·(2C − 1) + B·S·(1 + ⌈log2 C⌉) with B·C transcendentals, for input [B, C] of
    unnormalized log-probabilities and output [B, S] (S = sample_size).

    Per row: C exps and C − 1 adds build the cumulative distribution. Per sample: one multiply scales
    a uniform draw by the total, and a binary search of the C-entry distribution takes ⌈log2 C⌉
    comparisons. Drawing the uniforms is not counted (random generation; see the module).
    """
    b, c = ctx.shape(0)
    s = ctx.out_shape()[1]
    return Cost(flops=b * (2 * c - 1) + b * s * (1 + (c - 1).bit_length()), transcendentals=b * c)


zero_cost(
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
    family="random",
    reason="generates random numbers (not counted, like Dropout's mask); no arithmetic on input data",
)  # fmt: skip


saves_nothing("Bernoulli")  # dp = 0: nothing is read (torch's bernoulli keeps nothing)
