"""The types torch's tensors have where the TorchScript exporter's sdpa promoted a 16-bit graph to float32.

The TorchScript exporter writes ``scaled_dot_product_attention`` with its mask in float32 whatever the query's type
(a boolean mask as ``Where(mask, 0., -inf)``, ``is_causal`` as a Trilu mask of float constants). Its type promotion
then casts a float16 or bfloat16 score product up to float32 to add the mask, and V up to float32 for the product
with the softmax, so the attention's output is float32 in the graph; every op after it that meets a 16-bit tensor
casts that tensor up too (a projection's weight, the residual stream), and the float32 spreads through the rest of
the model. torch runs none of it: it converts the boolean mask to the query's type, its kernel writes its output in
the query's type, and the layers after it stay 16-bit. :func:`torch_types` reads the graph as torch runs it:

* the seed: a mask added to a 16-bit score product cast up, made by a Where of two scalar constants, is of the
  score product's type (the mask torch's kernel makes); so is such a mask added to scores the promotion made
  float32 in the graph and torch holds 16-bit (the next layer's attention);
* a float32 tensor a node makes from a tensor torch holds in a 16-bit type h, where each other float operand is
  h in torch too or a scalar (which does not promote a tensor in torch), is h;
* a Cast of an h tensor up to float32 read by such a node beside an h tensor is the exporter's promotion, not the
  program's: its output is h (a Cast to its input's own type, which the ledger reads as the tensor itself).

A Cast the program wrote (``hidden.to(torch.float32)`` in an RMS norm) reads an h tensor and makes a float32 one in
torch too, and ends the promotion there. A program that adds an explicit float32 copy of an h tensor to one the
promotion made h is read as the exporter's promotion (the graph cannot tell them apart).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod

from ..context import TensorInfo
from ..reporting.report import NodeCount

__all__ = ["retyped"]

#: ONNX element types: float32, float16, bfloat16.
_F32 = 1
_HALF = frozenset({10, 16})
_CASTS = frozenset({"Cast", "CastLike"})


def retyped(nodes: Sequence[NodeCount], tensors: Mapping[str, TensorInfo]
            ) -> tuple[Sequence[NodeCount], Mapping[str, TensorInfo]]:
    """``nodes`` and ``tensors`` with the types torch's tensors have (:func:`torch_types`); as given where the graph
    has no promoted sdpa."""
    typed = torch_types(nodes)
    if not typed:
        return nodes, tensors

    def info(t: TensorInfo | None) -> TensorInfo | None:
        return TensorInfo(t.name, typed[t.name], t.shape) if t is not None and t.name in typed else t

    out = [n._replace(inputs=tuple(map(info, n.inputs)), outputs=tuple(map(info, n.outputs))) for n in nodes]
    return out, {name: info(t) if t is not None else t for name, t in tensors.items()}


def torch_types(nodes: Sequence[NodeCount]) -> dict[str, int]:
    """Name → the element type torch's tensor has, where the graph's float32 is the exporter's promotion."""
    producer = {t.name: n for n in nodes for t in n.outputs if t is not None and t.name}
    typed = _seeds(nodes, producer)
    for _ in range(4):  # a promotion Cast found at a later reader retypes readers met before it
        if not typed or not _spread(nodes, producer, typed):
            break
    return typed


def _seeds(nodes: Sequence[NodeCount], producer: Mapping[str, NodeCount]) -> dict[str, int]:
    """The float32 masks the exporter adds to a 16-bit score product cast up: each of that product's type."""
    typed: dict[str, int] = {}
    for n in nodes:
        if n.op_type != "Add" or len(n.inputs) != 2 or any(t is None for t in n.inputs):
            continue
        for i in (0, 1):
            cast, mask = producer.get(n.inputs[i].name), producer.get(n.inputs[1 - i].name)
            if cast is not None and cast.op_type == "Cast" and cast.inputs and cast.inputs[0] is not None \
                    and cast.inputs[0].elem_type in _HALF and n.inputs[i].elem_type == _F32 \
                    and n.inputs[1 - i].elem_type == _F32 and _mask(mask):
                typed[n.inputs[1 - i].name] = cast.inputs[0].elem_type
    return typed


def _mask(n: NodeCount | None) -> bool:
    """Whether ``n`` is the exporter's float mask: a Where of two scalar constants."""
    return n is not None and n.op_type == "Where" and len(n.inputs) == 3 and all(_scalar(t) for t in n.inputs[1:])


def _scalar(t: TensorInfo | None) -> bool:
    return t is not None and t.is_static and prod(t.shape) == 1


def _spread(nodes: Sequence[NodeCount], producer: Mapping[str, NodeCount], typed: dict[str, int]) -> bool:
    """One pass in the graph's order: the float32 outputs of the nodes that read a retyped tensor and no float32
    one of torch's own; the promotion Casts beside them. Whether anything changed."""
    changed = False
    softmaxed = {t.name for n in nodes if n.op_type == "Softmax" for t in n.inputs if t is not None}
    for n in nodes:
        if n.op_type in _CASTS:
            continue
        scores = n.op_type == "Add" and any(t is not None and t.name in softmaxed for t in n.outputs)
        floats = [t for t in n.inputs if t is not None and t.name and (t.elem_type == _F32 or t.name in typed)]
        half = {typed[t.name] for t in floats if t.name in typed}
        if len(half) != 1:
            continue
        (h,) = half
        promoted = []
        for t in floats:
            if t.name in typed or _scalar(t):
                continue
            cast = producer.get(t.name)
            if not (scores and _mask(cast)) and (cast is None or cast.op_type != "Cast" or not cast.inputs or
                                                 cast.inputs[0] is None or
                                                 typed.get(cast.inputs[0].name, cast.inputs[0].elem_type) != h):
                break  # a float32 tensor of torch's own: torch promotes too
            promoted.append(t.name)
        else:
            for name in promoted + [t.name for t in n.outputs if t is not None and t.name and t.elem_type == _F32]:
                if typed.get(name) != h:
                    typed[name], changed = h, True
    return changed
