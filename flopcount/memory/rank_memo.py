"""What the per-rank walks of one graph (:mod:`.ranks`) keep for the next plan: :class:`GraphMemo`, one per graph
(the last :data:`KEPT_MEMOS` graphs walked), and the keys of its shares: a stored tensor's share reads the plan's
tp, ep and FSDP shards (:func:`stored_of`), that of a tensor a stage makes or receives tp, sp, cp, ep and the EP
rank's load (:func:`sizes_key`), a stored tensor's ZeRO share besides the D·C ranks (:func:`zero_memo`). ``w`` is
a rank's walk (:mod:`.ranks`' plan walk: its ``plan``, graph ``g``, ``kv`` and ``fractions``). The memos of graphs
that differ in their recompute units alone, holding the same node list, tensors, saved records and gradients'
flags (a plan search's counts of the policies), share what reads none of the units (:data:`SHARED`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..context import TensorInfo
from .ledger import Graph
from .rank_graph import GatheredKV

__all__ = ["GraphMemo", "KEPT_MEMOS", "KEPT_SIZES", "SHARED", "Shares", "memo_of", "sizes_key", "sizes_of",
           "stored_bytes_of", "stored_of", "zero_memo"]


@dataclass
class GraphMemo:
    """What the walks of one graph under any plan share: each stored tensor's first reader, the K and V gathered
    under cp, each stage's nodes' record (the ranks' stage) and its tensors in the walk's order (by its nodes), each tensor's share
    on a rank (stored: :func:`stored_of`; made by the stage, received, and the nodes' statistics: :func:`sizes_key`),
    each stage's walk structure (:class:`~flopcount.memory.ledger.OnRank`'s ``structure``), each node's
    parameters and trained tensors (``held``) and each stage's (``stage_reads``), each stage's nodes by the
    layout's chunks (``keeps``) and each stage's graph at a rank's shares (``graphs``), each
    stage's tensors at a rank's shares with their bytes (``tensors``), found the first time asked."""

    graph: Graph
    reader: dict[str, int] | None = None
    gathered: "GatheredKV | None" = None
    stages: dict[tuple[int, ...], Any] = field(default_factory=dict)
    # per stage's nodes: its names, those stored, made and received, its views, and the three kinds' sets
    names: dict[tuple[int, ...], tuple] = field(default_factory=dict)
    sizes: dict[tuple, "Shares"] = field(default_factory=dict)
    walks: dict[tuple, dict] = field(default_factory=dict)
    sp_whole: frozenset[str] | None = None  # sp=torch's gathered inputs and the storages they view
    stored: dict[tuple, dict] = field(default_factory=dict)
    stored_bytes: dict[tuple, dict] = field(default_factory=dict)
    held: list[tuple[int, frozenset[str]]] | None = None
    stage_reads: dict[tuple, list] = field(default_factory=dict)
    graphs: dict[tuple, Any] = field(default_factory=dict)
    keeps: dict[tuple, list[tuple[int, ...]]] = field(default_factory=dict)
    forwards: dict[tuple, dict] = field(default_factory=dict)
    zero: dict[tuple, dict] = field(default_factory=dict)  # ZeRO's shares of stored tensors (:func:`zero_memo`)
    parts: dict[tuple, Any] = field(default_factory=dict)  # a stage's graph's parts whatever the shares
    states: dict[tuple, list] = field(default_factory=dict)  # :func:`~flopcount.memory.ranks.stage_states`' answers by what they read
    # a stage's tensors at a rank's shares, their bytes and its most gathered K and V (by the stage graph's key)
    tensors: dict[tuple, tuple] = field(default_factory=dict)


#: The fields of a :class:`GraphMemo` that read the graph's nodes, tensors, saved records, gradients' flags and
#: stored tensors, not its recompute units: the memos of graphs that differ in their units alone share them
#: (:func:`memo_of`); ``parts``, ``walks``, ``graphs`` and ``forwards`` read the units and are each graph's own.
SHARED = ("reader", "gathered", "stages", "names", "sizes", "sp_whole", "stored", "stored_bytes", "held",
          "stage_reads", "keeps", "zero", "states", "tensors")


#: The :class:`GraphMemo` of the last four graphs walked (a plan search walks the plans of each node shares under
#: each recompute policy, one count's graph each, in turn).
_memos: list[GraphMemo] = []
KEPT_MEMOS = 4
#: The shares a :class:`GraphMemo` keeps (the last asked: a plan search runs the plans of the same tp and sp in turn)
KEPT_SIZES = 16


def memo_of(g: Graph) -> GraphMemo:
    """``g``'s :class:`GraphMemo` (by identity). A new one shares the :data:`SHARED` fields of a kept memo whose
    graph has the same node list, tensors, saved records and gradients' flags (the same objects: a plan search's
    counts of the recompute policies hold them once, ``flopcount.cli.plan.reports``) and equal other fields, its
    recompute units aside."""
    for m in _memos:
        if m.graph is g:
            return m
    memo = GraphMemo(g)
    same = next((m for m in reversed(_memos) if _same_but_units(m.graph, g)), None)
    for name in SHARED if same is not None else ():
        setattr(memo, name, getattr(same, name))
    _memos[:] = [*_memos[1 - KEPT_MEMOS:], memo]
    return memo


def _same_but_units(a: Graph, b: Graph) -> bool:
    """Whether graphs ``a`` and ``b`` are the same but for their recompute units: the node list, tensors, saved
    records and gradients' flags the same objects, the other fields equal."""
    return a.nodes is b.nodes and a.tensors is b.tensors and a.saved is b.saved and a.grads is b.grads and all(
        getattr(a, f) == getattr(b, f) for f in ("params", "trainable", "buffers", "stored", "inputs", "outputs",
                                                 "gathers", "views", "copies"))


class Shares(NamedTuple):
    """The shares of one :func:`sizes_key` on a rank: each node's statistics (graph position → its saved record at
    the share), each tensor a stage makes and each it receives (name → its share), their bytes (the statistics'
    per position, the tensors' per name; None: of unknown size), and per stage's nodes its statistics (node index →
    the saved record, and → its bytes)."""

    saved: dict[int, Any]
    made: dict[str, TensorInfo]
    received: dict[str, TensorInfo]
    saved_bytes: dict[int, int]
    made_bytes: dict[str, int | None]
    received_bytes: dict[str, int | None]
    stages: dict[tuple[int, ...], tuple[dict, dict]]


def sizes_of(memo: GraphMemo, key: tuple) -> Shares:
    """``memo``'s shares of ``key`` (:func:`sizes_key`), the oldest dropped past :data:`KEPT_SIZES`."""
    if key not in memo.sizes:
        if len(memo.sizes) >= KEPT_SIZES:
            del memo.sizes[next(iter(memo.sizes))]
        memo.sizes[key] = Shares({}, {}, {}, {}, {}, {}, {})
    return memo.sizes[key]


def stored_of(w: Any) -> dict[str, TensorInfo]:
    """The stored tensors' shares on a rank of ``w``'s plan (the plan walk's ``stored_share``), as found: they read
    tp (and the K/V heads it splits), ep and the FSDP shards only, whatever the stage or EP rank."""
    return _per_stored_key(w, memo_of(w.g).stored)


def stored_bytes_of(w: Any) -> dict[str, int | None]:
    """The bytes of :func:`stored_of`'s shares (None: of unknown size), as found."""
    return _per_stored_key(w, memo_of(w.g).stored_bytes)


def _per_stored_key(w: Any, memo: dict[tuple, dict]) -> dict:
    p = w.plan
    key = (p.tp, p.ep, p.dp * p.cp if p.fsdp else 0)
    if key not in memo and len(memo) >= 4 * KEPT_SIZES:
        del memo[next(iter(memo))]
    return memo.setdefault(key, {})


def sizes_key(w: Any, e: int) -> tuple:
    """Everything the share of a tensor a stage makes or receives (and of a node's statistics) on EP rank ``e`` of
    ``w``'s plan reads besides the graph (the layout's roles, layers and attention are the model's): tp (and K/V
    heads, the experts' inner nodes), sp, cp (the gathered K and V), ep and this EP rank's share of each MoE layer's
    load; not the FSDP shards, which only the stored tensors' read (:func:`stored_of`)."""
    p = w.plan
    return (p.tp, p.sp, p.sp_style, p.cp, p.ep, w.kv,
            tuple(sorted((layer, shares[e]) for layer, shares in w.fractions.items())))


def zero_memo(w: Any) -> dict[str, TensorInfo]:
    """The ZeRO shares of the stored tensors on a rank of ``w``'s plan, as found: they read the stored shares
    (:func:`stored_of`'s key) and the D·C ranks (and ep: a routed expert's D·C/E) they are sharded over."""
    p, zero = w.plan, memo_of(w.g).zero
    key = (p.tp, p.ep, p.dp * p.cp if p.fsdp else 0, p.dp * p.cp)
    if key not in zero and len(zero) >= 4 * KEPT_SIZES:
        del zero[next(iter(zero))]
    return zero.setdefault(key, {})
