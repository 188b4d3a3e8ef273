"""Recompute units: which nodes a recompute policy runs again in the backward, and how they group into the units a
checkpoint wraps (numbered layers, attention cores, connected operators of a list). The memory ledger
(:mod:`.ledger`) walks them; the count (:mod:`flopcount.counting`) finds them once."""

from __future__ import annotations

from typing import Any, Callable, Collection, Sequence

from ..parallel.plan import Recompute, check_recompute_ops
from ..reporting.report import NodeCount
from .ledger import VIEWS

__all__ = ["attention_cores", "recompute_units"]


def recompute_units(policy: Recompute, nodes: Sequence[NodeCount], scopes: Sequence[tuple[str, ...]],
                    attention_cores: Callable[[], Sequence[set[int]]],
                    grads: Collection[int] | None = None) -> dict[int, int]:
    """Node index → recompute unit: ``full`` and ``non-reentrant``, each numbered layer of the module scopes
    (``layers.3``, ``encoder.layer.0``: the blocks a checkpoint wraps), or the whole graph when it shows none (both
    keep the same: a unit's inputs; ``full`` makes the unit's outputs again too); ``selective``, each
    attention core (``attention_cores()``: the score product through softmax and dropout to the product with V);
    an operator list (``ops``), the nodes of those types, as selective activation checkpointing runs them again
    under a checkpoint around each layer: within each numbered layer, the listed nodes connected to each other
    through tensors (a listed node reading what another listed node of the same layer made, or a view of it) form
    one unit, and the listed nodes outside every numbered layer are grouped by that connectivity alone. So a chain
    of listed ops is one unit, which keeps only what it reads from outside (the saved ops' outputs, the layer's
    input) and makes the rest again; a tensor a listed op makes and an op not listed keeps for its backward stays
    kept. A unit none of whose nodes' backward runs (``grads``: the node indices whose backward runs, all if None;
    a mask, a rotary table made from the positions) is dropped: it keeps nothing to make again; listed nodes whose
    backward does not run stay in a unit with others that do (the first layer's norm of a graph input), remade
    with them. A listed type that no node has is an error (:func:`~flopcount.parallel.plan.check_recompute_ops`), as
    on the FLOPs side."""
    if policy.policy == "none":
        return {}
    if policy.policy == "selective":
        return {k: u for u, core in enumerate(attention_cores()) for k in core}
    keys = [next((s for s in scope if s.rsplit(".", 1)[-1].isdigit()), None)
            for scope in (scopes or [()] * len(nodes))]
    if policy.policy == "ops":
        check_recompute_ops(policy, {n.op_type for n in nodes})
        units = _connected_ops(policy.ops, nodes, keys)
        run = {u for k, u in units.items() if grads is None or k in grads}
        return {k: u for k, u in units.items() if u in run}
    layer: dict[str, int] = {}
    units: dict[int, int] = {}
    for n, key in zip(nodes, keys):
        if key is not None:
            units[n.index] = layer.setdefault(key, len(layer))
    return units or {n.index: 0 for n in nodes}


def _connected_ops(ops: frozenset[str], nodes: Sequence[NodeCount], keys: Sequence[str | None]) -> dict[int, int]:
    """The ``ops`` units of :func:`recompute_units`: node index → unit, numbered in the order units first run;
    ``keys[k]``: the numbered layer of ``nodes[k]`` (None outside every one)."""
    parent: dict[int, int] = {}

    def find(k: int) -> int:
        while parent[k] != k:
            parent[k] = parent[parent[k]]
            k = parent[k]
        return k

    root: dict[str, str] = {}  # tensor name → the tensor it is a view of
    made: dict[str, int] = {}  # tensor → the listed node (position) that made it
    for k, (n, key) in enumerate(zip(nodes, keys)):
        ins = [t.name for t in n.inputs if t is not None and t.name]
        if n.op_type in ops:
            parent[k] = k
            for x in ins:
                p = made.get(root.get(x, x))
                if p is not None and keys[p] == key:
                    parent[find(p)] = find(k)
        view = (n.op_type in VIEWS and n.domain in ("", "ai.onnx") and n.inputs and n.inputs[0] is not None
                and n.inputs[0].name)
        for t in n.outputs:
            if t is not None and t.name:
                if view:
                    root[t.name] = root.get(n.inputs[0].name, n.inputs[0].name)
                elif k in parent:
                    made[t.name] = k
    unit: dict[int, int] = {}
    return {nodes[k].index: unit.setdefault(find(k), len(unit)) for k in sorted(parent)}


#: Ops that carry K and V into an attention core by reshaping, or repeating grouped-query heads (Expand).
_INTO_CORE = frozenset({"Expand", "Reshape", "Transpose", "Unsqueeze", "Squeeze"})


def attention_cores(index: Any) -> list[set[int]]:
    """The attention cores of a graph (a :class:`~flopcount.pipeline.graph.GraphIndex`): for each eager attention, the node
    indices from its score product through softmax (and dropout) to its product with V, both included, and the
    reshapes and grouped-query repeats (Expand) that only the core reads, as Megatron's core attention repeats K and
    V inside the recomputed region (a checkpoint then keeps K and V at their own heads)."""
    import networkx as nx

    from ..masks import score_products

    at = {name: i for i, name in enumerate(index.names)}
    products: dict[int, dict[str, int]] = {}
    for name, (kind, j) in score_products(index.protos, index.names).items():
        products.setdefault(j, {})[kind] = at[name]
    cores = [({p["scores"]} | nx.descendants(index.dag, p["scores"])) & ({p["values"]} | nx.ancestors(index.dag, p["values"]))
             for p in products.values() if "scores" in p and "values" in p]
    for core in cores:
        todo = list(core)
        while todo:
            for p in index.dag.predecessors(todo.pop()):
                if p not in core and index.node_ops[p][1] in _INTO_CORE and index.node_ops[p][0] in ("", "ai.onnx") \
                        and set(index.dag.successors(p)) <= core:
                    core.add(p)
                    todo.append(p)
    return cores
