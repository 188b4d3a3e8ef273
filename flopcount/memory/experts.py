"""Experts' weights gathered per token, read as the resident weights they are in the program that trains.

A mixture-of-experts layer exported with each token's k experts run as one batched product gathers whole slices of
the experts' stacked weights ``[E, out, in]`` along axis 0, one per (token, expert) pair, and multiplies them:
transformers' ``batched_mm`` (:data:`flopcount.frontends.hf.EXPERTS_IMPLEMENTATION`) from its 3-D parameters, and
the batched product that :mod:`flopcount.frontends.hf_experts` makes of experts kept as one module each
(SwitchTransformers, NLLB-MoE) from ``torch.stack`` of the experts' 2-D weights. What runs in training is a grouped
product over the resident weights (``grouped_mm``, or transformers' loop over the experts, whose ``weight[e]`` is a
view of the parameter): nothing of the size of T·k weight slices, nor a stack of the experts' weights, is allocated,
kept, or made a gradient of. So:

* a **stack of parameters** (a Concat along a new axis 0 of the parameters each unsqueezed there, as the
  exporters write ``torch.stack``) that such slices are gathered from (:func:`gathered_stacks`) is a stored tensor,
  the parameters' own storage: never allocated, no activation where a node keeps it, no gradient of its own (each
  parameter's gradient is its own); a stack nothing gathers experts from is the copy torch's ``stack`` makes;
* a Gather/GatherND that selects whole slices along axis 0 of a parameter of rank 3 or more, or of such a stack, or
  of a view of either (:func:`expert_gathers`), is a view of that weight: no storage; a backward that keeps it keeps
  the weight, and a gradient that reaches it is the parameter's own, once.

An embedding lookup (a rank-2 table) stays a new tensor.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from ..reporting.report import NodeCount
from .ledger import VIEWS

__all__ = ["expert_gathers", "gathered_experts", "gathered_stacks"]


def _root(root: Mapping[str, str], name: str) -> str:
    return root.get(name, name)


def _stacks(nodes: Sequence[NodeCount], params: frozenset[str]) -> frozenset[str]:
    """The outputs of the nodes that stack parameters: a Concat of two or more inputs, each a parameter (or a view
    of one) of shape ``[1, *d]``, into ``[inputs, *d]``, d the parameters' shape."""
    root: dict[str, str] = {}
    shape = {t.name: t.shape for n in nodes for t in n.inputs if t is not None and t.name in params}
    found = set()
    for n in nodes:
        first = n.inputs[0].name if n.inputs and n.inputs[0] is not None else ""
        if n.op_type in VIEWS and n.domain == "" and first:
            for t in n.outputs:
                if t is not None and t.name:
                    root[t.name] = _root(root, first)
        if n.op_type != "Concat" or n.domain != "" or len(n.inputs) < 2 or not n.outputs or n.outputs[0] is None:
            continue
        out = n.outputs[0].shape
        ins = [(t.shape, shape.get(_root(root, t.name))) if t is not None else (None, None) for t in n.inputs]
        d = ins[0][1]
        if d is not None and out is not None and tuple(out) == (len(ins), *d) and \
                all(p is not None and x is not None and tuple(x) == (1, *d) and tuple(p) == tuple(d) for x, p in ins):
            found.add(n.outputs[0].name)
    return frozenset(found)


def gathered_stacks(nodes: Sequence[NodeCount], params: frozenset[str]) -> frozenset[str]:
    """The stacks of parameters that experts' weight slices are gathered from (see the module's text)."""
    return frozenset(weight for weight, _ in gathered_experts(nodes, params).values()) - params


def _expert_gather(n: NodeCount, weights: frozenset[str], root: Mapping[str, str]) -> bool:
    """Whether ``n`` gathers whole slices along axis 0 of a weight of rank 3 or more (a parameter, or a stack of
    them): its data is such a weight or a view of one, and its output's last r − 1 dims are the data's last r − 1."""
    if n.op_type not in ("Gather", "GatherND") or n.domain != "" or len(n.inputs) < 2 or not n.outputs:
        return False
    data, out = n.inputs[0], n.outputs[0]
    if data is None or out is None or _root(root, data.name) not in weights:
        return False
    d, o = data.shape, out.shape
    return d is not None and o is not None and len(d) >= 3 and len(o) >= len(d) and \
        tuple(o[len(o) - len(d) + 1:]) == tuple(d[1:]) and all(isinstance(x, int) for x in d)


def expert_gathers(nodes: Sequence[NodeCount], weights: frozenset[str]) -> frozenset[str]:
    """The outputs of the nodes that gather experts' weight slices per token from ``weights`` (the parameters and
    their stacks; see the module's text), found on the graph's own shapes: a per-rank walk, whose tensors
    are flattened to their share, takes them from here."""
    return frozenset(name for name, (_, gather) in gathered_experts(nodes, weights).items() if gather)


def gathered_experts(nodes: Sequence[NodeCount], weights: frozenset[str]) -> dict[str, tuple[str, bool]]:
    """Each tensor that holds experts' weight slices gathered per token, or is a view of one: (the weight they are
    gathered from, whether its node is the gather itself); ``weights``: the parameters (a stack of them is found
    here). A grouped product reads that weight in their place (see the module's text); the step-time prediction
    prices them so (:mod:`flopcount.measure.predict`)."""
    weights = weights | _stacks(nodes, weights)
    root: dict[str, str] = {}
    found: dict[str, tuple[str, bool]] = {}
    for n in nodes:
        first = n.inputs[0].name if n.inputs and n.inputs[0] is not None else ""
        gather = _expert_gather(n, weights, root)
        view = (n.op_type in VIEWS or gather) and n.domain == "" and first
        for t in n.outputs:
            if t is not None and t.name:
                root[t.name] = _root(root, first) if view else t.name
        out = n.outputs[0].name if n.outputs and n.outputs[0] is not None else ""
        if out and (gather or view and first in found):
            found[out] = (root[out], gather)
    return found
