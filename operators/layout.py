"""Operators that move, select or describe data without arithmetic: explicitly zero-cost."""

from __future__ import annotations

from flopcount.context import NodeContext
from flopcount.cost import Cost
from flopcount.registry import backward, saves, saves_nothing, zero_cost
from flopcount.saved import Saved, keeps

zero_cost(
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "DepthToSpace",
    "SpaceToDepth", "Expand", "Tile", "Pad",
    family="layout",
    reason="rearranges or replicates elements; no arithmetic",
)  # fmt: skip
zero_cost(
    "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Compress",
    "ReverseSequence", "Where",
    family="indexing",
    reason="selects or copies elements; no arithmetic",
)  # fmt: skip
zero_cost(
    "Shape", "Size", "Cast", "CastLike", "Constant", "ConstantOfShape", "EyeLike", "NonZero",
    family="metadata",
    reason="describes, converts or creates tensors; no arithmetic",
)  # fmt: skip


# Backward passes of zero-cost ops are free (the gradient is reshaped, split, padded ...) except
# where the forward replicated or gathered elements: then the gradient sums them back.


@backward("Gather", "GatherElements", "GatherND")
def gather_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| when the data needs a gradient: a scatter-add of dY into dX (an embedding
    table's gradient, for instance)."""
    return Cost(flops=ctx.out_numel()) if ctx.needs_grad(0) else Cost()


@backward("Expand", "Tile")
def replicate_backward(ctx: NodeContext, **_) -> Cost:
    """FLOPs = |Y| − |X|: dY summed back over the replicated copies; none when Y is empty (zero
    copies: dX is zeros)."""
    y = ctx.out_numel()
    return Cost(flops=y - ctx.numel(0) if y else 0) if ctx.needs_grad(0) else Cost()


# saved for backward: layout ops move dY back by the same shapes; indexing ops by their indices or condition
saves_nothing(
    "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "DepthToSpace", "SpaceToDepth",
    "Expand", "Tile", "Pad", "Concat", "Split", "Slice", "ReverseSequence", "Cast", "CastLike",
)


@saves("Gather", "GatherElements", "GatherND")
def gather_saved(ctx: NodeContext, **_) -> Saved:
    """The indices: dX scatters dY back to them (torch's embedding keeps its index tensor)."""
    return keeps(1)


@saves("Where", "Compress")
def condition_saved(ctx: NodeContext, **_) -> Saved:
    """The condition: dY is routed to the branch (Where) or the positions (Compress) it selects."""
    return keeps(0)
