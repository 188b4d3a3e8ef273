"""What torch's CPU layer norm keeps of a 16-bit input: its statistics in the input's type.

``aten.native_layer_norm`` on the CPU makes its mean and rstd in the parameters' type where the input, weight and
bias share one type (``param_scalar_type``: float32 only for a mixed call, a 16-bit input with float32
parameters), so a float16 or bfloat16 layer norm keeps 16-bit statistics; the LayerNormalization rule's float32
statistics are CUDA's (its accumulation type) and the mixed call's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..reporting.report import NodeCount
from ..saved import Saved, element_bytes

__all__ = ["cpu_statistics"]

#: ONNX element types: float16, bfloat16.
_HALF = frozenset({10, 16})
_STATS = "mean, rstd"


def cpu_statistics(nodes: Sequence[NodeCount], saved: Mapping[int, Saved]) -> dict[int, Saved]:
    """The layer norms of ``nodes`` whose input, weight and bias share a 16-bit type, their statistics in it."""
    out: dict[int, Saved] = {}
    for n in nodes:
        s = saved.get(n.index)
        if n.op_type != "LayerNormalization" or s is None or not n.inputs or n.inputs[0] is None:
            continue
        kind = n.inputs[0].elem_type
        if kind not in _HALF or any(t is not None and t.elem_type != kind for t in n.inputs[1:3]):
            continue
        width = element_bytes(kind)
        out[n.index] = s._replace(extra=tuple(
            (f"{_STATS} (the input's type, torch's CPU kernel)", b * width // 4) if what.startswith(_STATS)
            else (what, b) for what, b in s.extra))
    return out
