"""Operators that move, select or describe data without arithmetic: explicitly zero-cost."""

from __future__ import annotations

from flopcount.registry import zero_cost

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
