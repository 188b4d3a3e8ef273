"""Scatter: writing updates into a copy of data at given indices. A plain write is free; a
``reduction`` combines each update with the element it lands on."""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, formula, saves, zero_cost
from flopcount.saved import Saved, keeps


@formula("ScatterElements", "ScatterND", family="scatter")
def scatter(ctx: NodeContext, *, reduction: str = "none", **_) -> Cost:
    """FLOPs = |updates| with ``reduction`` add, mul, max or min (one combine per update element);
    0 with ``reduction="none"`` (the default: updates overwrite, no arithmetic).

    Integer data counts ``int_ops`` instead. Index normalisation (negative indices) is not counted.
    """
    if reduction == "none":
        return Cost()
    n = ctx.numel(2)
    return Cost(flops=n) if ctx.in_is_float(0) else Cost(int_ops=n)


# reduction → (FLOPs per update element for dData, for dUpdates)
SCATTER_BACKWARD: dict[str, tuple[int, int]] = {
    "none": (0, 0),  # dData = dY with the written positions zeroed; dUpdates = dY gathered
    "add": (0, 0),  # dData = dY; dUpdates = dY gathered
    "mul": (1, 2),  # dData = dY·Π updates landing there; dUpdates = dY·Y/update
    "max": (1, 1),  # dY routed to the data or update equal to Y: one comparison each
    "min": (1, 1),
}


@backward("ScatterElements", "ScatterND")
def scatter_backward(ctx: NodeContext, *, reduction: str = "none", **_) -> Cost:
    """FLOPs = (a·[data needs a gradient] + b·[updates need one])·|updates| with (a, b) = (0, 0) for
    reduction none and add, (1, 2) for mul, (1, 1) for max and min: none: dData = dY with the written
    positions zeroed, dUpdates = dY gathered at the indices; add: dData = dY, dUpdates gathered; mul:
    dData = dY·Π(updates at the position), dUpdates = dY·Y/update; max, min: dY goes where data or an
    update equals Y.

    none and add move values (zeroing, copying, gathering): no FLOPs. mul: the product of the n_p
    updates landing on a position times dY is n_p multiplies, |updates| in all whatever the duplicates;
    dUpdates per update dY·Y at its position and the division by it (zeros in the updates are not
    special-cased, as ReduceProd's backward). max, min: one comparison with Y per update, and one per
    written position of data (counted as one per update: exact with distinct indices, an upper bound
    otherwise); splitting dY among ties (as PyTorch does) depends on the values and is not counted. The
    indices never get a gradient.
    """
    a, b = SCATTER_BACKWARD[reduction]
    return Cost(flops=(a * ctx.needs_grad(0) + b * ctx.needs_grad(2)) * ctx.numel(2))


zero_cost(
    "Scatter",
    family="scatter",
    reason="deprecated ScatterElements without reduction: overwrites elements at indices; no arithmetic",
)
zero_cost(
    "TensorScatter",
    family="scatter",
    reason="writes the update into the cache along the sequence axis (a KV-cache append); copies only",
)


@saves("ScatterElements", "ScatterND", "Scatter")
def scatter_saved(ctx: NodeContext, **_) -> Saved:
    """The indices: dData is dY with the scattered positions cleared, dUpdates dY gathered at them."""
    return keeps(1)


@saves("TensorScatter")
def tensor_scatter_saved(ctx: NodeContext, **_) -> Saved:
    """The write indices (when given): dCache is dY with the written rows cleared, dUpdate dY gathered at them."""
    return keeps(2) if ctx.has_input(2) else keeps()
