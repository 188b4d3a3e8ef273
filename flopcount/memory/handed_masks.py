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
tell from is_causal: the ledger reads it as not handed. A handed mask the export folded into a stored tensor (a
window of positions alone, with its conversion) is the float mask the kernel makes of the boolean one at each call,
an activation; a float buffer of the module would export alike.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod
from typing import Any

from ..context import TensorInfo
from ..reporting.report import NodeCount
from ..saved import Saved, element_bytes
from .cuda_sdpa import mask_padding

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


def kept_mask(chain: Sequence[NodeCount], scores: str, saved: Mapping[int, Saved], stored: frozenset[str] = frozenset(),
              padded: bool = False) -> dict[int, Saved]:
    """What a fused kernel keeps of the mask handed to it, given to the chain's node that applies it: an Add's mask
    operand (a float mask as given, or the exporter's conversion of a boolean one, Where(mask, 0, −inf), made per
    call as torch's kernel makes it); a Where selecting the scores by a boolean condition keeps the float mask
    torch makes of it (the condition's shape, in the scores' type). A mask operand the export folded into a stored
    constant (``stored``: a boolean mask made in the forward from positions alone, converted and folded) is the
    float mask torch's kernel makes of it at each call, an activation of its bytes. ``padded``: the
    memory-efficient kernel's copy of each mask whose rows are not a multiple of 8 elements
    (:func:`.cuda_sdpa.mask_padding`)."""
    out: dict[int, Saved] = {}
    tensor = scores
    for n in chain:
        names = [t.name if t is not None else None for t in n.inputs]
        if tensor not in names or n.op_type == "Softmax":
            continue
        y = n.outputs[0] if n.outputs else None
        mask, s = None, None
        if n.op_type == "Add" and n.index in saved:
            given = [i for i, name in enumerate(names) if name != tensor]
            folded = [i for i in given if names[i] in stored and n.inputs[i].is_static]
            s = Saved(inputs=tuple(i for i in given if i not in folded))
            for i in folded:
                mask = n.inputs[i]
                s = s._replace(extra=s.extra + (("the mask made in the forward, converted to the scores' type per "
                                                 "call (the fused kernel; the export folded it)", _bytes(mask)),))
            mask = n.inputs[given[0]] if given and mask is None else mask
        elif n.op_type == "Where" and n.index in saved and n.inputs[0] is not None and n.inputs[0].is_static \
                and y is not None:
            mask = n.inputs[0]
            converted = prod(mask.shape) * element_bytes(y.elem_type)
            s = Saved(extra=(("the mask converted to the scores' type (the fused kernel)", converted),))
        if s is not None:
            pad = mask_padding(mask.shape, element_bytes(y.elem_type if y is not None else mask.elem_type)) \
                if padded and mask is not None and mask.is_static else 0
            out[n.index] = s._replace(extra=s.extra + (
                (("the mask padded to rows of 8 (memory-efficient kernel)", pad),) if pad else ()))
        tensor = y.name if y is not None else tensor
    return out


def _bytes(t: TensorInfo) -> int:
    return prod(t.shape) * element_bytes(t.elem_type)
