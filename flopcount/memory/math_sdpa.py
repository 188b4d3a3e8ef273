"""sdpa's math path in 16-bit types: what it keeps, in float32.

torch's ``_scaled_dot_product_attention_math`` keeps Q, K and V of a float16 or bfloat16 call in float32 for
accuracy (``query.to(kFloat)``, likewise K and V), runs the whole attention in float32 (the scaled Q and Kᵀ, their
product, the softmax, dropout and the product with V) and casts only its output back to the query's type. So
everything its backward keeps (the scaled Q and Kᵀ or the copies ``matmul`` makes of them, the softmax's output,
CPU dropout's noise and the dropped probabilities, V) is float32, where the exporters' nodes are of the query's
type: each kept tensor of the region counts 4 bytes an element. A bool dropout mask (CUDA's ``native_dropout``)
is no float and stays as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod

from ..reporting.report import NodeCount
from ..saved import Saved, element_bytes

__all__ = ["upcast"]

#: ONNX element types: float16, bfloat16.
_HALF = frozenset({10, 16})
_F32 = 4


def upcast(regions: Sequence[Sequence[NodeCount]], out: Mapping[int, Saved], saved: Mapping[int, Saved]
           ) -> dict[int, Saved]:
    """What each math-path region of a 16-bit query keeps, in float32: ``regions`` each one attention's nodes,
    its scaled Q first (as :attr:`flopcount.memory.kernels._Attention.nodes` lists them), ``out`` the kernels'
    reading so far and ``saved`` the graph's rules (a node in neither keeps nothing)."""
    found: dict[int, Saved] = {}
    for nodes in regions:
        q = nodes[0].outputs[0] if nodes and nodes[0].outputs else None  # the scaled Q, of Q's type
        if q is None or q.elem_type not in _HALF:
            continue
        seen: set[str] = set()  # a tensor two nodes keep (the softmax's output, the product's operand) widened once
        for n in nodes:
            s = out.get(n.index, saved.get(n.index))
            if s is not None and (s.inputs or s.outputs or s.extra):
                found[n.index] = _in_float32(n, s, seen)
    return found


def _in_float32(n: NodeCount, s: Saved, seen: set[str]) -> Saved:
    """``s`` with every kept tensor of ``n`` counted in float32: the graph's tensors it keeps (inputs, outputs)
    widened by the bytes float32 adds, once per tensor (``seen``), and its extras in its type (copies, noise)
    scaled to float32."""
    widened = []
    for t in [n.inputs[i] for i in s.inputs] + [n.outputs[i] for i in s.outputs]:
        if t is not None and t.is_static and t.name not in seen:
            seen.add(t.name)
            widened.append(("kept in float32 (sdpa's math path of a 16-bit query)",
                            prod(t.shape) * (_F32 - element_bytes(t.elem_type))))
    width = element_bytes(n.inputs[0].elem_type) if n.inputs and n.inputs[0] is not None else _F32
    extra = tuple((what, b * _F32 // width if not what.startswith("dropout mask") else b) for what, b in s.extra)
    return s._replace(extra=extra + tuple(widened))
