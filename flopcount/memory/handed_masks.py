"""Whether a fused attention kernel is handed a mask, and what it keeps of it.

The exporters write every ``scaled_dot_product_attention`` with its mask in the graph: a mask tensor handed to
sdpa, ``is_causal=True`` (onnxscript writes a Trilu mask) and the mask transformers builds while tracing, which it
cannot drop then, all look alike. The program that ran hands the kernel no mask where transformers drops it
(``sdpa_mask`` skips a mask that keeps every key, or every key up to the query from the first, with no sliding
window cutting it, no padding and as many queries as keys) and is_causal is such a mask: then the kernel keeps none,
and transformers asks sdpa for grouped-query attention itself (K and V at their own heads). Any other mask is
handed to it: transformers repeats K and V to the query heads first (it asks for grouped-query attention only
without a mask), and torch's kernel keeps them so and the mask, a boolean one converted to the query's type
(``aten._scaled_dot_product_flash_attention_for_cpu``, the CUDA kernels alike). The graph's mask, evaluated
(:mod:`flopcount.pipeline.graph_masks`), says which: a mask recognised as one of the dropped kinds is not handed;
one that is not structure (it reads data: a position bias, padding values not given) or keeps keys apart (a
symmetric local window) is. A program that hands sdpa an explicit causal mask keeps it, which the graph cannot
tell from is_causal: the ledger reads it as not handed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

from ..reporting.report import NodeCount
from ..saved import Saved, element_bytes

__all__ = ["handed", "kept_mask"]


def handed(mask: Any) -> bool:
    """Whether the program hands the fused kernel the mask ``mask`` (a ``GraphMask`` of
    :mod:`flopcount.pipeline.graph_masks`, or why the graph's mask is not structure: then it is handed)."""
    structure = getattr(mask, "structure", None)
    if structure is None:
        return True
    if structure.lengths or structure.segments or structure.window is not None:
        return True
    return structure.causal and mask.kept.shape[-1] != mask.t  # causal, fewer queries than keys: a mask


def kept_mask(chain: Sequence[NodeCount], scores: str, saved: Mapping[int, Saved]) -> dict[int, Saved]:
    """What a fused kernel keeps of the mask handed to it, given to the chain's node that applies it: an Add's mask
    operand (a float mask as given, or the exporter's conversion of a boolean one, Where(mask, 0, −inf), made per
    call as torch's kernel makes it); a Where selecting the scores by a boolean condition keeps the float mask
    torch makes of it (the condition's shape, in the scores' type)."""
    out: dict[int, Saved] = {}
    tensor = scores
    for n in chain:
        names = [t.name if t is not None else None for t in n.inputs]
        if tensor not in names or n.op_type == "Softmax":
            continue
        y = n.outputs[0] if n.outputs else None
        if n.op_type == "Add" and n.index in saved:
            out[n.index] = Saved(inputs=tuple(i for i, name in enumerate(names) if name != tensor))
        elif n.op_type == "Where" and n.index in saved and n.inputs[0] is not None and n.inputs[0].is_static \
                and y is not None:
            converted = prod(n.inputs[0].shape) * element_bytes(y.elem_type)
            out[n.index] = Saved(extra=(("the mask converted to the scores' type (the fused kernel)", converted),))
        tensor = y.name if y is not None else tensor
    return out
