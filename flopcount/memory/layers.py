"""The memory ledger of a stack of L identical layers from the counts of its 1- and 2-layer versions
(:func:`flopcount.derived.extension.extend`), exactly as the whole model's export would give it.

The peak of a step is a maximum over the liveness walk, and where it falls can move as the stack grows, so the ledger
is not extended affinely: the walk (:func:`flopcount.memory.ledger.ledger`, linear in the nodes) is run again on the graph
of L layers, built from the 2-layer one kept on its count. The nodes of the second block are copied for each added
block after the last of them, as the extended report copies them; each tensor made inside the block (and each
weight only the block reads) gets a name per copy, and the copy reads, where the second block read what the first
one made, what the copy before it made (the first block's and the second block's nodes run the same operators in
the same order, which pairs their tensors). Nodes after the stack read the last copy's tensors; tensors made
before the stack (rotary tables, masks) stay shared. Recompute units inside the block get one unit per copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..context import TensorInfo
from ..reporting.report import NodeCount, Report
from .ledger import Graph, Memory, ledger, without_cyclic_gc

__all__ = ["Copies", "Unwired", "extend_memory"]


class Unwired(Exception):
    """The 2-layer graph does not show how the copies of its second block connect; the message says why (the
    extension then exports the whole model: :class:`flopcount.derived.extension.NotExtendable`)."""


def _affine_int(a: int, b: int, k: int) -> int:
    """``b + k·(b − a)``: the 2-layer figure and k more blocks."""
    return b + k * (b - a)


def _affine_counts(a: Mapping[str, int], b: Mapping[str, int], k: int) -> dict[str, int]:
    """:func:`_affine_int` per key, the zero entries left out; :class:`Unwired` where a figure shrinks."""
    if any(b.get(key, 0) < a.get(key, 0) for key in a):
        raise Unwired("--memory: a figure per operator is smaller with 2 layers than with 1")
    out = {key: _affine_int(a.get(key, 0), b.get(key, 0), k) for key in sorted(set(a) | set(b))}
    return {key: v for key, v in out.items() if v}


@dataclass(frozen=True)
class Copies:
    """How the extended report's ``nodes`` come from the 2-layer report's: ``origin``, in the same order, their
    (position in the 2-layer report, copy) pairs: copy 0 the node itself, copy t ≥ 1 a copy of a node of the second
    block (``inside``: its positions); ``block0``: the positions of the first block's nodes, in the order ``inside``
    has the second's; ``suffixes[t]``: what copy t's tensor names end with; ``k``: the copies added."""

    inside: Sequence[int]
    block0: Sequence[int]
    nodes: Sequence[NodeCount]
    origin: Sequence[tuple[int, int]]
    suffixes: Sequence[str]
    k: int


@dataclass(frozen=True)
class _Wiring:
    """How the copies of the second block connect: each tensor's producer (position), the tensors renamed per copy
    (made inside the block, or weights only it reads), the first block's tensors paired with the second's
    (:func:`_pairs`) and the first block's positions."""

    producer: Mapping[str, int]
    renamed: set[str]
    pairs: Mapping[str, str]
    first_block: set[int]


@without_cyclic_gc
def extend_memory(one: Report, two: Report, copies: Copies) -> Memory:
    """The :class:`~flopcount.memory.ledger.Memory` of the extended report whose nodes are ``copies.nodes``
    (:class:`Copies`). :class:`Unwired` where the 2-layer graph does not show the wiring exactly."""
    m1, m2 = one.memory, two.memory
    if m1 is None or m2 is None or m2.graph is None or m2.settings is None:
        raise Unwired("--memory: the smaller counts keep no graph for the ledger to walk")
    g = m2.graph
    if len(g.nodes) != len(two.nodes) or any(a.name != b.name for a, b in zip(g.nodes, two.nodes)):
        raise Unwired("--memory: the ledger's graph is not the 2-layer report's")
    if len(m2.ranks) != 1 or len(m1.ranks) != 1:
        raise Unwired("--memory: a ledger of several ranks is not extended")
    k = copies.k
    graph = _copied(g, copies, _wiring(g, copies.inside, copies.block0))
    missing = _affine_counts(m1.missing, m2.missing, k)
    memory = ledger(graph, m2.mode, m2.optimizer, m2.settings, missing, m2.ranks[0].kv_cache_bytes)
    (a,), (b,), (got,) = m1.ranks, m2.ranks, memory.ranks
    for field in ("params_bytes", "buffers_bytes", "grads_bytes", "optimizer_bytes", "inputs_bytes"):
        want = _affine_int(getattr(a, field), getattr(b, field), k)
        if getattr(got, field) != want:
            raise Unwired(f"--memory: the walked ledger's {field} is {getattr(got, field):,}, not the "
                                f"{want:,} that one more layer at a time gives")
    return memory


def _wiring(g: Graph, inside: Sequence[int], block0: Sequence[int]) -> _Wiring:
    """How the copies of the second block (``inside``) connect (:class:`_Wiring`); :class:`Unwired` where the
    2-layer graph does not show it exactly."""
    inside_set = set(inside)
    producer: dict[str, int] = {}
    readers: dict[str, set[int]] = {}
    for i, n in enumerate(g.nodes):
        for t in n.outputs:
            if t is not None and t.name:
                producer[t.name] = i
        for t in n.inputs:
            if t is not None and t.name:
                readers.setdefault(t.name, set()).add(i)
    stored = g.params | g.trainable | g.buffers | g.stored
    own = {x for x, r in readers.items() if r <= inside_set and x not in producer and x in stored}
    renamed = {x for x, i in producer.items() if i in inside_set} | own
    per_layer_inputs = [x for x in g.inputs if readers.get(x) and readers[x] <= inside_set]
    if per_layer_inputs:
        raise Unwired(f"--memory: the graph input {per_layer_inputs[0]} is read by one layer only")
    pairs = _pairs(g.nodes, block0, inside)
    first_block = set(block0)
    for j in inside:
        for t in g.nodes[j].inputs:
            x = t.name if t is not None else ""
            if not x or x in renamed or x not in producer:
                continue
            if producer[x] in first_block and pairs.get(x) not in renamed:
                raise Unwired(f"--memory: the second block reads {x} of the first, and no tensor of its own "
                                    "stands for it")
            if producer[x] not in first_block and producer[x] > block0[0]:
                raise Unwired(f"--memory: the second block reads {x}, made after the first block began and "
                                    "outside it: what each copy would read in its place is not known")
    units_in = {g.units[g.nodes[j].index] for j in inside if g.nodes[j].index in g.units}
    units_out = {u for i, n in enumerate(g.nodes) if i not in inside_set and (u := g.units.get(n.index)) is not None}
    if units_in & units_out:
        raise Unwired("--memory: a recompute unit spans the second block and nodes outside it")
    return _Wiring(producer, renamed, pairs, first_block)


def _copied(g: Graph, copies: Copies, w: _Wiring) -> Graph:
    """The graph of the extended report: ``g``'s nodes as ``copies`` lays them out, each copy's tensors renamed and
    wired as ``w`` says, recompute units inside the block one per copy."""
    suffixes, k, renamed, pairs = copies.suffixes, copies.k, w.renamed, w.pairs

    def name(x: str, t: int) -> str:
        return x + suffixes[t] if t and x in renamed else x

    def info(ti: TensorInfo | None, new: str) -> TensorInfo | None:
        return ti if ti is None or ti.name == new else TensorInfo(new, ti.elem_type, ti.shape)

    last = copies.inside[-1]
    fresh = max(g.units.values(), default=-1) + 1
    unit_of: dict[tuple[int, int], int] = {}
    out_nodes: list[NodeCount] = []
    grads: dict[int, tuple[bool, ...]] = {}
    saved = {}
    units: dict[int, int] = {}
    for pos, (node, (i, t)) in enumerate(zip(copies.nodes, copies.origin)):
        src = g.nodes[i]
        if t:
            ins = tuple(info(x, name(x.name, t) if x.name in renamed else name(pairs[x.name], t - 1)
                             if x.name in pairs and w.producer.get(x.name) in w.first_block else x.name)
                        if x is not None else None for x in src.inputs)
            outs = tuple(info(x, name(x.name, t)) if x is not None else None for x in src.outputs)
        elif i > last:  # after the stack: what the last copy made
            ins = tuple(info(x, name(x.name, k)) if x is not None else None for x in src.inputs)
            outs = src.outputs
        else:
            ins, outs = src.inputs, src.outputs
        out_nodes.append(node._replace(inputs=ins, outputs=outs))
        if src.index in g.grads:
            grads[pos] = g.grads[src.index]
        if src.index in g.saved:
            saved[pos] = g.saved[src.index]
        u = g.units.get(src.index)
        if u is not None:
            units[pos] = u if not t else unit_of.setdefault((u, t), fresh + len(unit_of))
    added = range(1, k + 1)
    tensors = dict(g.tensors)
    for t in added:  # copy by copy, each in the graph's order (never a set's: the order is the optimizer's)
        for x in [x for x in g.tensors if x in renamed]:
            tensors[name(x, t)] = info(g.tensors[x], name(x, t))

    def widened(names: frozenset[str]) -> frozenset[str]:
        return names | {name(x, t) for x in names & renamed for t in added}

    return Graph(out_nodes, grads, saved, tensors, widened(g.params), widened(g.trainable), widened(g.buffers),
                 widened(g.stored), g.inputs, widened(g.outputs), units, widened(g.gathers),
                 widened(g.views), widened(g.copies))


def _pairs(nodes: Sequence[NodeCount], block0: Sequence[int], block1: Sequence[int]) -> Mapping[str, str]:
    """Each tensor the first block makes → the second block's tensor in its place (same operator, same output, in
    the same order)."""
    def ops(block):
        return [(nodes[i].domain, nodes[i].op_type, len(nodes[i].outputs), len(nodes[i].inputs)) for i in block]

    if not block0 or ops(block0) != ops(block1):
        raise Unwired("--memory: the first and the second block do not run the same operators in the same "
                            "order, so what each layer reads of the one before cannot be paired")
    pairs = {}
    for i, j in zip(block0, block1):
        for x, y in zip(nodes[i].outputs, nodes[j].outputs):
            if x is not None and y is not None and x.name and y.name:
                pairs[x.name] = y.name
    return pairs
