"""Scatter: writing updates into a copy of data at given indices. A plain write is free; a
``reduction`` combines each update with the element it lands on."""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import formula, zero_cost


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
