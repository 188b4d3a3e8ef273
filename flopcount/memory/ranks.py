"""Memory per rank under a parallel plan: the liveness walk of :mod:`flopcount.memory.ledger` run again on each rank's
part of the graph, with every tensor resized to that rank's share.

Each node takes its role and its pipeline stages from the model's :class:`~flopcount.parallel.layout.Layout` (the
one the FLOPs and optimizer ledgers read, its parts found by their role in the graph). On TP rank i:

* a **parameter** read first in a column- or row-parallel projection, the vocab-parallel embedding or the LM head
  is 1/T (a row-parallel Gemm's bias whole); in a K/V projection 1/min(T, kv) (one head copied when kv < T); any
  other (norms, latent projections, position tables) is whole on every rank;
* an **activation** made by a split node (projections' outputs, attention heads, the MLP's inner ops, the
  vocab-parallel logits) is 1/T, by a node on K/V heads 1/min(T, kv); the outputs of the row-parallel projections
  and the embedding, and those of the norms and residual adds, are whole without ``sp`` and 1/T with it (split
  over the sequence; a router's and MLA's latents' too: the layout's ``SEQUENCE_ROLES``), but a gathered input
  under ``sp=torch`` (:mod:`flopcount.parallel.layout`: one a
  column-parallel product reads, kept all-gathered for its weight's gradient) is whole (``sp=megatron`` keeps the
  rank's tokens, 1/T); the rest (the loss's per-token ops, position tables) is whole. Statistics kept by a node
  follow its outputs. Sizes are rounded up when T does not divide them.
* **pipeline stage** s walks only its nodes: what it receives from stage s − 1 is an input of its walk, what it
  sends on an output (whose gradient arrives from stage s + 1);
* **FSDP/ZeRO-3**: parameters, gradients and optimizer states are 1/dp, as FSDP2 shards them: dim 0 padded to
  ⌈d0/dp⌉ rows on every rank (:func:`_fsdp_share`); the all-gather buffer of the largest unit is one layer's
  parameters on the rank gathered whole, each padded as FSDP2's all-gather output holds it (dp shards: the bytes
  the FLOPs ledger's ``all_gather`` moves; ``allgather_bytes``); the root's gathered parameters likewise. Held
  throughout the walk: two such buffers (FSDP2 prefetches one unit ahead: the running unit and the next in the
  forward; in the backward the next unit's gather and the running unit's gradients copied for their
  reduce-scatter, as large) and the root's parameters (those outside the layers) whole, gathered from the root's
  forward to the end of the backward. Approximate, as the buffers are not held per phase: at the LM head's
  backward FSDP2 holds one gather (the last layer's, prefetched), at a layer's pre-backward three for a moment (the
  gather being copied out, the parameters it fills, the reduce-scatter input of the layer after it), and a
  layer's gradients are whole until its reduce-scatter; against FSDPMemTracker these offset (docs/memory.md).

* **ZeRO** (Rajbhandari et al. 2020; ``zero1`` is its stage P_os, ``zero2`` P_os+g), over the same D·C ranks as
  ``fsdp`` (D·C/E for a routed expert's weights): the parameters are whole on every rank (after the TP, PP and EP
  divisions). ``zero1``: the optimizer states (the moments, the fp32 master copy under ``master_weights``) are
  1/(D·C) of each tensor's elements, rounded up per tensor, and Adam's step counters 1/(D·C) of the tensors',
  rounded up; so are the step's temporaries (the step runs on the shard); the gradients are whole, made in the
  backward and kept to the step (at the backward's end the rank holds them all). ``zero2``: as ``zero1``, and the
  gradients are 1/(D·C) per tensor, each made at its share's size in the walk; the whole gradients of one layer
  (outside the layers, of one weight), the largest, are held through the walk as the bucket a reduce-scatter
  reads (``gradient_bucket_bytes``). Approximate: the bucket is one layer's, where DeepSpeed's ``reduce_bucket_size``
  sets its own, and it is held in the forward too; the all-gather of the updated parameters after the step writes
  into the whole parameters, with no buffer of its own.

**Microbatches in flight** on pipeline rank p (0-based) of P with M microbatches: GPipe keeps M, 1F1B P − p
(at most M), interleaved:v its (P − p − 1)·2 + (v − 1)·P warm-up chunk-forwards plus one, at most M·v, each a
chunk of 1/v of the rank's layers (Megatron's order; chunks taken as equal). The rank's peak is the walk of one
microbatch with the other in-flight microbatches' kept activations held throughout, and, with M > 1, the
gradients accumulated from the start (a microbatch after the first). The held bytes are alive at every node alike, so they move the
peak by themselves and not where it is: one walk gives the figures and the peak. TP ranks of a stage are symmetric
(the plan refuses degrees that do not divide), so a stage is walked once per EP load and placed on each of them.

**Context parallelism** (``cp=C``, the zigzag split of :mod:`flopcount.parallel.experts`): each CP rank holds 2
chunks of s/(2C) tokens, so every activation (every tensor that is not stored: the graph's inputs, position tables
and masks included) is 1/C, rounded up, except the K and V that attention reads: as the FLOPs per rank assume (an
``all_gather`` of K and V in each layer's forward, again only under ``full`` or ``non-reentrant`` recompute, and a
``reduce_scatter`` of their gradients in the backward), each CP rank gathers the whole sequence's K and V and keeps
them for the backward; these tensors (the storages the score product and the product with V read) are whole over CP
(``cp_kv_bytes``: the largest layer's gathered K and V on the rank, in the activations, or made again with its layer
under ``full`` or ``non-reentrant`` recompute; the local shard before the gather, a transient, is not counted
apart). Parameters, gradients and optimizer states are
whole on every CP rank; under ``fsdp`` they are sharded over the D·C ranks of the ``dp_cp`` group the FLOPs
ledger's gradient collectives run on (Megatron's distributed optimizer over dp·cp).

**Expert parallelism** (``ep=E``, ranks drawn from the D·C data- and context-parallel ranks as in
:mod:`flopcount.parallel.experts`): a parameter read under a routed block's ``experts`` is 1/(T·E) (each EP rank holds
R/E of the R experts, each split over TP as the FLOPs ledger splits it), and under ``fsdp`` 1/(D·C/E) more (the expert
data-parallel group). The activations made under ``experts`` are the (token, expert) pairs that rank's experts run:
E·f_r times the rank's own tokens' pairs (f_r its experts' share of the load, balanced 1/E or from ``--expert-load``);
those that carry an expert's inner dimension (from the gate/up products to the down product's input, found by
dataflow) are 1/T besides, as TP splits the experts' weights; the pairs' token vectors and the down products' outputs
are whole on every TP rank. ``alltoall_bytes``: the buffers one MoE layer hands to its ``all_to_all`` (the T·k token
vectors of the T tokens the rank routes, its s/T under ``sp``, dispatched with their probabilities, its experts'
E·T·k·f_r pairs received and their outputs combined, h·e + p bytes each: the FLOPs ledger's payload with the
probabilities received, :mod:`flopcount.parallel.experts`); under ``--token-dispatcher allgather`` the tensors its
all-gather dispatcher gathers over ``tp_ep`` and the outputs it reduce-scatters there, E·b·s·(R·(1 + p) + h·e +
h·p) (the routing map, probabilities and hidden states of its EP group's tokens, and their outputs), in place of
``all_to_all`` buffers; none under ep = 1 (:func:`~flopcount.parallel.experts.dispatch_buffers`). The largest layer's,
held through the walk and so in the peak. One entry per (stage, TP rank, EP rank), its data- and context-parallel replicas (same figures: zigzag makes
every CP rank's share equal) in ``replicas``.

**KV cache** (``--generate P:N``, ``kv_cache_bytes``: the cache after the last step, beside the peak of the
prefill's walk as in the one-rank ledger): each rank holds the cache of its pipeline stage's layers (L/P of them; an
encoder-decoder's, the decoder's layers on its stage, each holding its own and its cross-attention's cache),
of its K/V heads (1/min(T, kv): a head copied on T/kv ranks when kv < T, as its K/V projections are) and of its
share of the P + N − 1 positions under cp (1/C; cp must divide them), for each of its M microbatches (each phase runs
them all, :mod:`flopcount.parallel.generation`: every microbatch's cache lives until the last step); its DP and EP
replicas the same. The layers
are taken as holding equal caches, so a sliding window that crops some layers' caches (decode steps in more than
one piece) is refused under pp > 1 or cp > 1.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import compress
from types import MappingProxyType
from typing import Any, Mapping, NamedTuple

from ..context import TensorInfo
from ..errors import UsageError
from ..parallel.experts import dispatch_buffers
from ..parallel.layout import fsdp_shard, in_flight, layout_of, rank_id
from ..parallel.plan import ParallelPlan
from ..reporting.report import tensor_bytes
from .kv_ranks import kv_share
from .ledger import (Graph, Memory, MemorySettings, OnRank, RankMemory, Shards, ledger, optimizer_bytes,
                     without_cyclic_gc)
from .rank_graph import GatheredKV, expert_inner, gathered_kv, storage_root
from .rank_memo import (KEPT_SIZES, GraphMemo, Shares, memo_of, sizes_key, sizes_of, stored_bytes_of, stored_of,
                        zero_memo)

__all__ = ["PlanRankMemory", "StageStates", "in_flight", "per_rank", "stage_states"]

_SAME_SIZE = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})


@dataclass(frozen=True)
class PlanRankMemory(RankMemory):
    """One rank's :class:`~flopcount.memory.ledger.RankMemory` under a plan: its ``rank`` id and ``coords``, its pipeline
    ``stage``, its DP replicas (``replicas``, whose figures are the same), the microbatches whose activations it
    keeps at once (``microbatches_in_flight``; ``activations_bytes`` is one microbatch's), the FSDP all-gather
    buffer (``allgather_bytes``, in ``peak_bytes``), the whole gradients of the largest layer that ``zero2``
    reduce-scatters (``gradient_bucket_bytes``, in ``peak_bytes``), the gathered K and V of its largest layer under cp
    (``cp_kv_bytes``) and the all_to_all buffers of its largest MoE layer under ep
    (``alltoall_bytes``, in ``peak_bytes``)."""

    rank: int = 0
    coords: Mapping[str, int] = field(default_factory=dict)
    stage: int = 0
    replicas: tuple[int, ...] = ()
    microbatches_in_flight: float = 1.0
    allgather_bytes: int = 0
    gradient_bucket_bytes: int = 0
    cp_kv_bytes: int = 0
    alltoall_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["coords"], d["replicas"] = dict(self.coords), list(self.replicas)
        return d


@without_cyclic_gc
def per_rank(report: Any, plan: ParallelPlan, expert_load: Any = None) -> Memory:
    """``report.memory`` (a one-rank ledger with its graph: ``count(..., memory=...)``) per rank of ``plan``, one
    entry per (stage, TP rank, EP rank) with its data- and context-parallel replicas listed; the returned ledger's
    ``settings.plan`` is ``plan``. ``expert_load``: the routing histogram of a MoE model
    (:func:`flopcount.parallel.experts.load_expert_load`), balanced if None."""
    w, d, moe_layers = _prepared(report, plan, expert_load)
    top_k = report.moe.top_k if moe_layers else 0
    ranks = _walked_ranks(w, (d, report.moe.experts if moe_layers else 0, top_k))
    cache = kv_share(report, plan, w.layout, w.kv)
    if cache is not None:
        ranks = [dataclasses.replace(r, kv_cache_bytes=cache[r.coords["pp"]]) for r in ranks]
    return dataclasses.replace(w.mem, ranks=tuple(ranks), settings=dataclasses.replace(w.settings, plan=plan),
                               kept_by_node=MappingProxyType({}))


#: The last :func:`_prepared` asked (report by identity, plan, load) and its answer: a search asks twice a plan.
_last_prepared: list[tuple] = []


def _prepared(report: Any, plan: ParallelPlan, expert_load: Any) -> tuple["_PlanWalk", Any, list]:
    """:func:`per_rank`'s checks in its order, and (its walks' shared part, the dims, the MoE layers); memoized."""
    if _last_prepared and _last_prepared[0][0] is report and _last_prepared[0][1:] == (plan, expert_load):
        return _last_prepared[1]
    from ..parallel.ranks import plan_dims

    mem = report.memory
    if mem is None or mem.graph is None or mem.settings is None:
        raise UsageError("--parallel with --memory: the count has no memory ledger to split; count with --memory")
    settings = dataclasses.replace(mem.settings, plan=ParallelPlan())
    g = mem.graph
    if len(g.nodes) != len(report.nodes):
        raise UsageError("--parallel with --memory: the ledger's graph is not the report's")
    # the FLOPs ledger's checks of what the degrees divide, and its dims (the plan record refuses a schedule the
    # ledgers do not simulate)
    d = plan_dims(report, plan, settings.recompute)
    layout = layout_of(report, plan)
    kv = min(plan.tp, d.kv_heads or plan.tp)
    moe_layers, fractions = _expert_fractions(report, g, layout, expert_load)
    _last_prepared[:] = [(report, plan, expert_load), (_PlanWalk.of(report, layout, settings, fractions, kv), d,
                                                       moe_layers)]
    return _last_prepared[1]


def _expert_fractions(report: Any, g: Graph, layout: Any, expert_load: Any) -> tuple[list, dict]:
    """The MoE layers (in order) and, under ep, each one's (numerator, denominator) share of the load per EP rank;
    the load refused as the FLOPs ledger refuses it."""
    from ..parallel import experts as px

    plan = layout.plan
    moe_layers = sorted(set(compress(layout.layer, layout.expert)) - {None})  # a node per entry, as g's
    load = expert_load or px.ExpertLoad(None)
    load.check_layers(len(moe_layers))
    for j in range(len(moe_layers) if plan.ep == 1 else 0):  # refused as the FLOPs ledger refuses it
        load.fractions(j, report.moe.experts, 1)
    fractions = {layer: load.fractions(j, report.moe.experts, plan.ep) for j, layer in enumerate(moe_layers)} \
        if moe_layers and plan.ep > 1 else {}
    return moe_layers, fractions


@dataclass(frozen=True)
class _PlanWalk:
    """What each rank's walk under ``plan`` reads, whatever its stage: the model's ``layout`` and its per-node
    ``roles``, ``layer_of`` and ``expert``, the one-rank ledger ``mem`` and its graph ``g``, the ``settings`` the
    walks run with, each stored tensor's first reader (``reader``), the K and V gathered whole under cp
    (``gathered``), the experts' nodes that carry their inner dimension (``inner``), each MoE layer's share of the
    load per EP rank (``fractions``) and min(T, K/V heads) (``kv``)."""

    plan: ParallelPlan
    layout: Any
    roles: tuple[str, ...]
    layer_of: tuple[int | None, ...]
    expert: tuple[bool, ...]
    mem: Memory
    g: Graph
    settings: MemorySettings
    reader: Mapping[str, int]
    gathered: "GatheredKV"
    inner: frozenset[int]
    fractions: Mapping[Any, Any]
    kv: int

    @classmethod
    def of(cls, report: Any, layout: Any, settings: MemorySettings, fractions: Mapping[Any, Any],
           kv: int) -> "_PlanWalk":
        plan, mem = layout.plan, report.memory
        g, expert, layer_of = mem.graph, layout.expert, layout.layer
        inner = expert_inner(g, list(report.modules.nodes) if not report.modules.missing else [()] * len(g.nodes),
                             expert, layer_of) if plan.tp > 1 and any(expert) else frozenset()  # scopes if read
        memo = memo_of(g)
        if memo.reader is None:
            memo.reader = {}
            for k, n in enumerate(g.nodes):
                for x in n.inputs:
                    if x is not None and x.name in g.stored:
                        memo.reader.setdefault(x.name, k)
        reader = memo.reader
        if plan.cp > 1 and memo.gathered is None:  # the layers' attention products are the model's
            memo.gathered = gathered_kv(g, layout)
        gathered = memo.gathered if plan.cp > 1 else GatheredKV({}, {})
        return cls(plan, layout, layout.roles, layer_of, expert, mem, g, settings, reader, gathered, inner, fractions,
                   kv)

    def act_div(self, k: int) -> int:
        return self.plan.tp if k in self.inner else self.layout.activation_divisor(k)

    def shard_div(self, k: int) -> int:
        """The ranks a weight whose first reader is node k is sharded over by ZeRO or FSDP: the D·C data- and
        context-parallel ranks, D·C/E for a routed expert's."""
        plan = self.plan
        return max(plan.dp * plan.cp // plan.ep, 1) if self.expert[k] else plan.dp * plan.cp

    def stored_share(self, name: str) -> TensorInfo:
        """A stored tensor's share on the rank: over TP (and EP) by its first reader's role, a parameter's over FSDP."""
        n = self.shard_div(self.reader[name]) if self.plan.fsdp and name in self.reader and name in self.g.params else 1
        info = self.g.tensors.get(name) or TensorInfo(name)
        return _fsdp_share(info, _tp_div(self.layout, self.g, self.reader, name), n)

    def scale(self, k: int, e: int) -> tuple[int, int]:
        """(multiplier, divisor) of the activations node k makes on EP rank e."""
        div = self.act_div(k) * self.plan.cp
        if self.expert[k] and self.layer_of[k] in self.fractions:  # the pairs this rank's experts receive
            num, den = self.fractions[self.layer_of[k]][e]
            return self.plan.ep * num, div * den
        return 1, div


def _walked_ranks(w: _PlanWalk, moe: tuple) -> list[PlanRankMemory]:
    """Every (stage, TP rank, EP rank)'s figures, in that order; ``moe``: the dims, routed experts and experts per
    token that size a MoE layer's dispatch buffers (:func:`~flopcount.parallel.experts.dispatch_buffers`, of the
    layer's own tokens: an encoder's and a decoder's differ)."""
    plan, g, fractions = w.plan, w.g, w.fractions
    v = plan.virtual_stages if plan.schedule == "interleaved" and plan.pp > 1 else 1
    ranks = []
    walked: dict[tuple, PlanRankMemory] = {}
    memo = memo_of(g)
    keeps = memo.keeps.get((plan.pp, v, w.layout.chunks))
    if keeps is None:  # each stage's nodes: they read the layout's chunks, pp and v alone
        chunks = [set(c) for c in w.layout.chunks]
        mine = [{c for c in range(plan.pp * v) if c % plan.pp == s} for s in range(plan.pp)]
        keeps = memo.keeps[(plan.pp, v, w.layout.chunks)] = [
            tuple(k for k in range(len(g.nodes)) if chunks[k] & mine[s]) for s in range(plan.pp)]
    for s, keep in enumerate(keeps):
        if keep not in memo.stages:
            memo.stages[keep] = _Stage.of(g, list(keep))
        stage = memo.stages[keep]
        layers = {w.layer_of[k] for k in keep} & set(fractions) if fractions else set()
        for e in range(plan.ep):
            share = {layer: fractions[layer][e] for layer in layers}
            alltoall = max((dispatch_buffers(plan, *moe, w.layout.seqs[layer] // plan.cp, part)
                            for layer, part in share.items()), default=0)
            # the TP ranks of a stage are symmetric (the plan refuses degrees that do not divide), and EP ranks of
            # the same load walk the same graph: one walk per (stage, load), placed on each of them
            key = (s, tuple(sorted(share.items())))
            if key not in walked:
                walked[key] = _rank(w, s, e, stage, alltoall)
            for i in range(plan.tp):
                ranks.append(_placed(walked[key], plan, s, i, e))
    return ranks


class StageStates(NamedTuple):
    """A stage rank's bytes from its walk's start (at its shares; grads accumulated, M > 1) and zero2's bucket."""

    params: int
    states: int
    grads: int
    bucket: int


@without_cyclic_gc
def stage_states(report: Any, plan: ParallelPlan, expert_load: Any = None) -> list[StageStates]:
    """Per pipeline stage, :class:`StageStates` of its ranks under ``plan`` without their walks (:func:`per_rank`'s
    refusals raised alike): the walk's peak adds to params + states + grads."""
    w, _, _ = _prepared(report, plan, expert_load)
    g, mem, memo = w.g, w.mem, memo_of(w.g)
    if memo.held is None:  # each node's parameters and trained tensors, the graph's
        memo.held = [(k, frozenset(names)) for k, n in enumerate(g.nodes) if (names := {
            x.name for x in n.inputs if x is not None and (x.name in g.params or x.name in g.trainable)})]
    # what they read of the plan: the stages' nodes (pp, the chunks), the stored shares (tp, ep, the FSDP shards),
    # the D·C ranks ZeRO shards over and whether gradients accumulate; and the count's mode, optimizer and step (the
    # memos of graphs that differ in their recompute units alone share these answers: memo_of)
    key = (plan.pp, w.layout.chunks, plan.tp, plan.ep, plan.fsdp, plan.dp * plan.cp, plan.zero_stage,
           plan.microbatches > 1, mem.mode, mem.optimizer, w.settings.master_weights,
           w.settings.resolved_implementation)
    if key in memo.states:
        return list(memo.states[key])
    training, out, stored = mem.mode == "train", [], stored_of(w)
    for names, trained, params in _stage_reads(w, memo):
        tensors = {name: stored.get(name) or stored.setdefault(name, w.stored_share(name)) for name in names}
        trained = trained if training else []
        shards = _zero_shards(w, trained, tensors)
        states, _ = optimizer_bytes(mem.optimizer, [shards.optimizer.get(n, tensors[n]) for n in trained],
                                    w.settings, shards.counters)
        grads = sum(tensor_bytes(shards.grads.get(n, tensors[n])) or 0 for n in trained) if plan.microbatches > 1 else 0
        out.append(StageStates(sum(tensor_bytes(tensors[n]) or 0 for n in params), states, grads,
                               _units(w, params)[0] if plan.zero2 and training else 0))
    if len(memo.states) >= 4 * KEPT_SIZES:
        del memo.states[next(iter(memo.states))]
    memo.states[key] = tuple(out)
    return out


def _stage_reads(w: "_PlanWalk", memo: GraphMemo) -> list[tuple[set[str], list[str], frozenset[str]]]:
    """Per pipeline stage of ``w``'s plan, the parameters and trained tensors its nodes read, those trained
    (sorted) and those parameters: they read the layout's chunks alone (its pp and chunks), found once per chunks."""
    g, chunks, pp = w.g, w.layout.chunks, w.plan.pp
    key = (pp, chunks)
    found = memo.stage_reads.get(key)
    if found is None:
        read: list[set[str]] = [set() for _ in range(pp)]
        for k, names in memo.held:
            for c in chunks[k]:
                read[c % pp] |= names
        found = memo.stage_reads[key] = [(names, sorted(g.trainable & names), frozenset(g.params & names))
                                         for names in read]
    return found


def _unread(g: Graph, reader: Mapping[str, int], plan: ParallelPlan) -> dict[str, TensorInfo]:
    """The parameters no node reads, in the graph's order, with their share on a rank: those the one-rank ledger
    holds without a gradient (:func:`flopcount.memory.ledger.with_params`, DINOv2's ``mask_token``), whole on every
    TP rank (no split rule reads them), FSDP2's shard of them over the D·C ranks under fsdp."""
    n = plan.dp * plan.cp if plan.fsdp else 1
    return {name: _fsdp_share(g.tensors[name], 1, n) for name in g.tensors if name in g.params and name not in reader}


def _tp_div(layout: Any, g: Graph, reader: Mapping[str, int], name: str) -> int:
    """The TP (and EP) ranks a stored tensor is split over, by the role of the node that reads it first."""
    k = reader.get(name)
    if k is None:
        return 1
    j = next(j for j, x in enumerate(g.nodes[k].inputs) if x is not None and x.name == name)
    return layout.param_divisor(k, j)


def _fsdp_share(info: TensorInfo, tp: int, n: int) -> TensorInfo:
    """A stored tensor's share on a rank: 1/``tp`` of its elements (rounded up), then FSDP2's shard over ``n`` ranks
    (:func:`flopcount.parallel.layout.fsdp_shard`: dim 0 padded to ⌈d0/n⌉ rows).

    >>> _fsdp_share(TensorInfo("embedding", 1, (65, 32)), 1, 2).shape  # ⌈65/2⌉ = 33 rows of 32, not ⌈2080/2⌉
    (1056,)
    >>> _fsdp_share(TensorInfo("embedding", 1, (50, 32)), 2, 2).shape  # 25 rows on the TP rank: 13 of 32
    (416,)
    """
    local = _resized(info, tp)
    if n == 1 or local.shape is None or tensor_bytes(local) is None:
        return local
    return TensorInfo(info.name, info.elem_type, (fsdp_shard(info.shape, tp, n),))


def _resized(info: TensorInfo, div: int, mul: int = 1) -> TensorInfo:
    """``info`` flattened to its share: ⌈elements · mul / div⌉."""
    return _sized(info, div, mul)[0]


#: :func:`_sized`'s share shapes and bytes by what they read (shape, element type, divisor, multiplier): the layers
#: of a stack hold tensors of the same few shapes, found once (emptied past 4,096)
_SIZED: dict[tuple, tuple] = {}


def _sized(info: TensorInfo, div: int, mul: int = 1) -> tuple[TensorInfo, int | None]:
    """:func:`_resized` and its bytes (None: of unknown size, ``info`` itself)."""
    key = (info.shape if info.shape.__class__ is not list else tuple(info.shape), info.elem_type, div, mul)
    found = _SIZED.get(key)
    if found is None:
        if len(_SIZED) >= 4096:
            _SIZED.clear()
        n = 1
        for d in info.shape or ():
            n *= d
        if info.shape is None or tensor_bytes(info) is None:
            found = _SIZED[key] = (None, None)
        else:
            shape = (-(-n * mul // div),)
            found = _SIZED[key] = (shape, tensor_bytes(TensorInfo("", info.elem_type, shape)))
    if found[0] is None:
        return info, None
    return TensorInfo(info.name, info.elem_type, found[0]), found[1]


@dataclass(frozen=True)
class _Stage:
    """What a pipeline stage's walk reads of the graph, whatever the rank's shares: its nodes (graph positions
    ``keep``), the tensors they make (name → position) and read, what it receives from the stage before and what
    it sends on (a graph output, or read by a node of another stage)."""

    keep: tuple[int, ...]
    made: dict[str, int]
    read: frozenset[str]
    received: tuple[str, ...]
    sent: frozenset[str]

    def names(self, g: Graph) -> list[str]:
        """The tensors the stage reads or makes in the graph's order (the optimizer steps the weights in the
        module's), then those the graph does not list."""
        wanted = self.read | self.made.keys()
        return [n for n in g.tensors if n in wanted] + sorted(wanted - g.tensors.keys())

    @classmethod
    def of(cls, g: Graph, keep: list[int]) -> "_Stage":
        made = {x.name: k for k in keep for x in g.nodes[k].outputs if x is not None and x.name}
        read = frozenset(x.name for k in keep for x in g.nodes[k].inputs if x is not None and x.name)
        received = tuple(x for x in sorted(read - set(made)) if x not in g.stored)
        if len(keep) == len(g.nodes):
            outside: set[str] = set()
        else:
            inside = set(keep)
            outside = {y.name for k, n in enumerate(g.nodes) if k not in inside for y in n.inputs if y is not None}
        sent = frozenset(x for x in made if x in g.outputs or x in outside)
        return cls(tuple(keep), made, read, received, sent)


def _zero_shards(w: "_PlanWalk", trained, tensors: Mapping[str, TensorInfo]) -> Shards:
    """ZeRO's shares on a rank of ``w``'s plan (see the module's docstring): 1/(D·C) of each trained tensor's
    elements (rounded up), the optimizer's under ``zero1`` and ``zero2``, the gradients' under ``zero2``; the step
    counters 1/(D·C) of the tensors' (rounded up). The share of a tensor ``tensors`` holds at its stored share
    (:func:`stored_of`'s) is found once per the stored shares' key and D·C (:func:`zero_memo`)."""
    plan, reader = w.plan, w.reader
    if plan.zero_stage not in (1, 2):
        return Shards()
    divs = {name: w.shard_div(reader[name]) if name in reader else plan.dp * plan.cp for name in trained}
    memo, stored = zero_memo(w), stored_of(w)
    shares = {}
    for name in trained:
        kept = tensors[name] is stored.get(name)
        share = memo.get(name) if kept else None
        if share is None:
            share = _resized(tensors[name], divs[name])
            if kept:
                memo[name] = share
        shares[name] = share
    per_div = Counter(divs.values())  # Σ 1/d over the tensors, exactly: Σ (tensors of d)/d
    counters = math.ceil(sum(Fraction(n, d) for d, n in per_div.items()))
    return Shards(shares if plan.zero2 else {}, shares, counters)


def _stage_tensors(w: _PlanWalk, e: int, stage: _Stage, nodes: list, sizes: Shares,
                   unread: Mapping[str, TensorInfo]) -> tuple[dict[str, TensorInfo], dict[str, int | None]]:
    """Each tensor of ``stage``'s walk on EP rank ``e`` of ``w``'s plan at its share on the rank: the first stage's
    unread parameters (``unread``) whole, the stored tensors' (:func:`stored_of`; in the graph's order, the
    optimizer's), what the stage makes and what it receives (``sizes``: :func:`sizes_of`), and a view that keeps
    every element at its input's share; and the bytes of the stored, made and received ones, found once per their
    share's key (None: of unknown size; a view's and an unread parameter's left to the walk to find)."""
    g, plan, gathered, made = w.g, w.layout.plan, w.gathered, stage.made
    tensors: dict[str, TensorInfo] = dict(unread)
    memo = memo_of(g)
    if stage.keep not in memo.names:  # the stage's tensors in the walk's order, and by kind
        names = stage.names(g)
        memo.names[stage.keep] = (names, [n for n in names if n in g.stored],
                                  [n for n in names if n not in g.stored and n in made],
                                  [n for n in names if n not in g.stored and n not in made],
                                  [(n.inputs[0].name, n.outputs[0].name, n.outputs[0].elem_type) for n in nodes
                                   if n.op_type in _SAME_SIZE and n.inputs and n.inputs[0] is not None and n.outputs
                                   and n.outputs[0] is not None])
        at = {n: i for i, n in enumerate(n for kind in memo.names[stage.keep][1:4] for n in kind)}  # by kind
        memo.names[stage.keep] += ([at[n] for n in names], *map(frozenset, memo.names[stage.keep][1:4]))
    names, stored_names, made_names, received, views, at, *kinds = memo.names[stage.keep]
    stored, stored_bytes = stored_of(w), stored_bytes_of(w)
    # each share found once per its key: a name of each kind looked at only while one is missing (a name's bytes
    # are found with its share, so the bytes hold every stored share found here)
    for name in stored_names if not stored_bytes.keys() >= kinds[0] else ():
        if name not in stored:
            stored[name] = w.stored_share(name)
        if name not in stored_bytes:
            stored_bytes[name] = tensor_bytes(stored[name])
    kept_whole = _kept_whole(w)  # sp=torch's gathered inputs
    for name in made_names if not sizes.made.keys() >= kinds[1] else ():
        if name not in sizes.made:
            mul, div = w.scale(made[name], e)
            info = g.tensors.get(name) or TensorInfo(name)
            whole = plan.cp if name in gathered.names else plan.tp if name in kept_whole else 1
            sizes.made[name], sizes.made_bytes[name] = _sized(info, div // whole, mul)
    # the graph's inputs, what the previous stage sends: the rank's tokens (an encoder-decoder's messages at their
    # TP share, as the FLOPs ledger sends them)
    for name in received if not sizes.received.keys() >= kinds[2] else ():
        if name not in sizes.received:
            sizes.received[name], sizes.received_bytes[name] = _sized(
                g.tensors.get(name) or TensorInfo(name), plan.cp * w.layout.message_divisors().get(name, 1))
    share = [*map(stored.__getitem__, stored_names), *map(sizes.made.__getitem__, made_names),
             *map(sizes.received.__getitem__, received)]
    tensors.update(zip(names, map(share.__getitem__, at)))
    nbytes = dict(zip(stored_names, map(stored_bytes.__getitem__, stored_names)))
    nbytes.update(zip(made_names, map(sizes.made_bytes.__getitem__, made_names)))
    nbytes.update(zip(received, map(sizes.received_bytes.__getitem__, received)))
    for src, out, elem_type in views:  # a view that keeps every element has its input's share (a weight's
        if src in tensors:  # transpose is a weight's)
            tensors[out] = TensorInfo(out, elem_type, tensors[src].shape)
            nbytes.pop(out, None)
    return tensors, nbytes


@dataclass
class _StageGraph:
    """A stage's graph at a rank's shares (``sub``, its ``tensors``) and what else reads only them: the most
    gathered K and V of a layer under cp (``cp_kv``), and by what reads more (the sharding), the ZeRO shards
    (``shards``), the FSDP or ZeRO-2 units (``units``) and the walk's sizes memo (``sizes``:
    :class:`~flopcount.memory.ledger.OnRank`'s)."""

    sub: Graph
    tensors: dict[str, TensorInfo]
    cp_kv: int
    forward: dict | None  # its forward's memo, shared by the graphs of the same storages' sizes (OnRank's)
    # the tensors' bytes and the statistics' (OnRank's ``sizes`` entries, the same whatever the gradients' shards)
    seeds: dict[str, dict]
    shards: dict[tuple, Shards] = field(default_factory=dict)
    units: dict[tuple, tuple[int, int]] = field(default_factory=dict)
    sizes: dict[int, dict] = field(default_factory=dict)


def _stage_graph(w: _PlanWalk, s: int, e: int, stage: _Stage) -> _StageGraph:
    """Stage ``s``'s graph on EP rank ``e`` of ``w``'s plan: it reads the stage's nodes, whether it is the first
    (the unread parameters), the shares of what it makes and receives (:func:`sizes_key`) and of the stored
    tensors (:func:`stored_of`'s key), so the plans of the same share it (made once, the oldest dropped past
    :data:`KEPT_SIZES` times 4)."""
    g, plan, memo = w.g, w.plan, memo_of(w.g)
    key = (stage.keep, s == 0, sizes_key(w, e), (plan.tp, plan.ep, plan.dp * plan.cp if plan.fsdp else 0))
    found = memo.graphs.get(key)
    if found is not None:
        return found
    keep = stage.keep
    parts, shared = memo.parts.get((keep, s == 0)), memo.tensors.get(key)
    unread = _unread(g, w.reader, plan) if s == 0 and (parts is None or shared is None) else {}  # the first stage's
    if parts is None:
        parts = memo.parts[(keep, s == 0)] = _SubParts.of(g, stage, unread)
    nodes = parts.nodes
    sizes = sizes_of(memo, sizes_key(w, e))  # statistics (position → saved), made, received (name → share)
    if shared is None:  # the tensors read no recompute units: shared by the policies' graphs (memo_of)
        tensors, nbytes = _stage_tensors(w, e, stage, nodes, sizes, unread)
        kv_per_layer = {layer: sum(tensor_bytes(tensors[name]) or 0 for name in names if name in tensors)
                        for layer, names in w.gathered.kept.items()}
        # kept up to 16 times the graph's tensors (a plan search's node shares walk each stage at each cp and
        # FSDP shards, policy after policy: about 14 times at most on 64 devices)
        while memo.tensors and sum(len(t[0]) for t in memo.tensors.values()) >= 16 * len(g.tensors):
            del memo.tensors[next(iter(memo.tensors))]
        shared = memo.tensors[key] = (tensors, nbytes, max(kv_per_layer.values(), default=0))
    tensors, nbytes, cp_kv = shared
    if keep not in sizes.stages:  # the stage's statistics at these shares: node index → saved record, → bytes
        saved, extra = sizes.stages[keep] = {}, {}
        for k, n in parts.saved_at:
            found_saved = sizes.saved.get(k)
            if found_saved is None:
                found_saved, sizes.saved_bytes[k] = _scaled(g.saved[n.index], *w.scale(k, e))
                sizes.saved[k] = found_saved
            saved[n.index], extra[n.index] = found_saved, sizes.saved_bytes[k]
    saved, extra = sizes.stages[keep]
    sub = Graph(nodes, parts.grads, saved, tensors, parts.params, parts.trainable, parts.buffers, g.stored,
                stage.received, stage.sent, parts.units, g.gathers, g.views, g.copies)
    if len(memo.graphs) >= 4 * KEPT_SIZES:
        del memo.graphs[next(iter(memo.graphs))]
    # the forward walks the storages the stage makes: sized alike whatever the stored tensors' shares, unless a
    # view of a stored tensor is a storage of its own (a copy), sized as its input's share
    forward = None
    if parts.views_of_stored_free:
        if key[:3] not in memo.forwards and len(memo.forwards) >= 4 * KEPT_SIZES:
            del memo.forwards[next(iter(memo.forwards))]
        forward = memo.forwards.setdefault(key[:3], {})
    found = memo.graphs[key] = _StageGraph(sub, tensors, cp_kv, forward, {"bytes": nbytes, "extra": extra})
    return found


#: :func:`_scaled`'s answers by what they read (the layers' nodes keep equal records; emptied past 4,096)
_SCALED: dict[tuple, tuple] = {}


def _scaled(record: Any, mul: int, div: int) -> tuple[Any, int]:
    """A node's saved ``record`` with its statistics at a rank's share (each ⌈bytes · mul / div⌉), and their
    bytes."""
    try:
        key, found = (record, mul, div), _SCALED.get((record, mul, div))
    except TypeError:  # a record of lists: found anew
        key, found = None, None
    if found is None:
        if len(_SCALED) >= 4096:
            _SCALED.clear()
        scaled = record._replace(extra=tuple((what, -(-b * mul // div)) for what, b in record.extra))
        found = (scaled, scaled.extra_bytes)
        if key is not None:
            _SCALED[key] = found
    return found


class _SubParts(NamedTuple):
    """What a stage's graph (:func:`_stage_graph`) reads of the graph whatever the rank's shares, found once per
    stage's nodes and whether it is the first (its unread parameters): its nodes, their gradients' flags and
    recompute units, the parameters, trained tensors and buffers it reads (and the first stage's unread
    parameters), :func:`_views_of_stored_free` and its nodes that keep statistics (graph position, node)."""

    nodes: list
    grads: dict[int, tuple[bool, ...]]
    units: dict[int, int]
    params: frozenset[str]
    trainable: frozenset[str]
    buffers: frozenset[str]
    views_of_stored_free: bool
    saved_at: tuple[tuple[int, Any], ...]

    @classmethod
    def of(cls, g: Graph, stage: _Stage, unread: Mapping[str, TensorInfo]) -> "_SubParts":
        nodes = [g.nodes[k] for k in stage.keep]
        indexes = {n.index for n in nodes}
        read = stage.read
        return cls(nodes, {k: f for k, f in g.grads.items() if k in indexes}, {k: u for k, u in g.units.items() if
                   k in indexes}, g.params & (read | unread.keys()), g.trainable & read, g.buffers & read,
                   _views_of_stored_free(g, nodes, unread),
                   tuple((k, n) for k, n in zip(stage.keep, nodes) if n.index in g.saved))


def _views_of_stored_free(g: Graph, nodes: list, unread: Mapping[str, TensorInfo]) -> bool:
    """Whether no view in ``nodes`` that keeps every element (sized as its input) of a stored tensor, or of such a
    view, is a storage of its own (a copy, or a node outside the standard domain): the walk's storages are then
    those the stage makes and receives, whatever the stored tensors' shares."""
    stored: set[str] = set()
    for n in nodes:
        if n.op_type in _SAME_SIZE and n.inputs and n.inputs[0] is not None and n.outputs and \
                n.outputs[0] is not None and (n.inputs[0].name in g.stored or n.inputs[0].name in unread or
                                              n.inputs[0].name in stored):
            if n.domain != "" or n.outputs[0].name in g.copies:
                return False
            stored.add(n.outputs[0].name)
    return True


def _rank(w: _PlanWalk, s: int, e: int, stage: _Stage, alltoall: int) -> PlanRankMemory:
    """The figures of the ranks of stage ``s`` (its walk ``stage``) and EP rank ``e``, whose all_to_all buffers are
    ``alltoall`` bytes."""
    g, mem, settings = w.g, w.mem, w.settings
    plan = w.plan
    memo = memo_of(g)
    part = _stage_graph(w, s, e, stage)
    sub, tensors = part.sub, part.tensors
    # one walk gives both the figures and the peak: the held bytes are alive throughout, so they add to the live
    # total at every node alike and move the peak by themselves without moving where it is; only the gradients
    # accumulated from the start (a microbatch after the first) change the walk
    accumulated = mem.mode == "train" and plan.microbatches > 1
    shards = part.shards.get((plan.zero_stage, plan.dp * plan.cp))
    if shards is None:
        shards = part.shards[(plan.zero_stage, plan.dp * plan.cp)] = _zero_shards(
            w, sorted(sub.trainable), tensors)
    # the walk's structure (storage roots, who keeps what) is the stage's nodes' whatever the sizes: found once; its
    # replays at these sizes, once per gradients' shards (ZeRO-2's)
    structure = memo.walks.setdefault((stage.keep, s == 0), {})
    sizes = part.sizes.get(plan.dp * plan.cp if plan.zero2 else 0)
    if sizes is None:
        sizes = part.sizes[plan.dp * plan.cp if plan.zero2 else 0] = dict(part.seeds)
    one = ledger(sub, mem.mode, mem.optimizer, settings, mem.missing,
                 on_rank=OnRank(accumulated=accumulated, shards=shards, structure=structure, sizes=sizes,
                                forward=part.forward)).ranks[0]
    flight = in_flight(plan, s) if mem.mode == "train" else 1.0
    gather = in_flight_units = bucket = 0
    if plan.fsdp or (plan.zero2 and mem.mode == "train"):
        units = (plan.fsdp, plan.zero2)
        gather, root = part.units.get(units) or part.units.setdefault(units, _units(w, sub.params))
    if plan.zero2 and mem.mode == "train":
        # ZeRO-2: a layer's gradients (outside the layers, a weight's) are made whole and reduce-scattered into the
        # rank's shard, then freed; the largest such whole gradients (as large as their parameters) are held
        # through the walk as the bucket
        bucket, gather = gather, 0
        in_flight_units = bucket
    elif plan.fsdp:
        # FSDP2 prefetches one unit ahead: the unit running and the next are gathered at once in the forward; in
        # the backward the next unit's gather meets the running unit's gradients copied for their reduce-scatter
        # (as large). The root's parameters (those outside the layers) are gathered whole from its forward to the
        # end of the backward (the root is not resharded after its forward).
        in_flight_units = 2 * gather + root
    others = int(one.activations_bytes * (flight - 1))
    held = others + in_flight_units + alltoall
    return PlanRankMemory(**{**one.__dict__, "peak_bytes": one.peak_bytes + held}, stage=s,
                          microbatches_in_flight=flight, allgather_bytes=gather, gradient_bucket_bytes=bucket,
                          cp_kv_bytes=part.cp_kv, alltoall_bytes=alltoall)


def _kept_whole(w: _PlanWalk) -> frozenset[str]:
    """The tensors a rank keeps whole over TP under ``sp=torch`` (the layout's gathered inputs, by their names in the
    memory graph, and the storages they are views of); none under any other plan."""
    if not w.layout.sp_kept_whole:
        return frozenset()
    memo = memo_of(w.g)
    if memo.sp_whole is None:
        producer = {x.name: n for n in w.g.nodes for x in n.outputs if x is not None and x.name}
        names = {w.g.nodes[k].outputs[j].name for k, j in w.layout.sp_kept_whole}
        memo.sp_whole = frozenset(names | {storage_root(producer, name, w.g) for name in names})
    return memo.sp_whole


def _units(w: _PlanWalk, params) -> tuple[int, int]:
    """(the largest layer's parameters gathered whole, the root's: those outside the layers) of a rank whose walk
    reads ``params``; under ``zero2`` each weight outside the layers is a unit of its own."""
    layout, reader, plan, stored, known = w.layout, w.reader, w.plan, stored_of(w), stored_bytes_of(w)
    per_layer: dict[Any, int] = {}
    for name in params:
        layer = layout.layer[reader[name]] if name in reader else None
        if layer is None and plan.zero2:  # outside the layers, each weight's gradient is reduced alone
            layer = name
        # a weight of unknown size is already in the ledger's ``unsized`` (the one-rank walk read the same
        # tensor), which makes the figures a stated lower bound; it adds nothing here
        # gathered whole, under fsdp as FSDP2's all-gather output holds it: n shards of dim 0 padded
        n = (w.shard_div(reader[name]) if name in reader else plan.dp * plan.cp) if plan.fsdp else 1
        if name in reader:  # a parameter read: its stored share on the rank (:meth:`_PlanWalk.stored_share`), its
            share = stored.get(name) or stored.setdefault(name, w.stored_share(name))  # bytes found once
            nbytes = known[name] if name in known else known.setdefault(name, tensor_bytes(share))
        else:
            nbytes = tensor_bytes(_fsdp_share(w.g.tensors.get(name) or TensorInfo(name),
                                              _tp_div(layout, w.g, reader, name), n))
        whole = n * (nbytes or 0)
        per_layer[layer] = per_layer.get(layer, 0) + whole
    root = per_layer.pop(None, 0)
    return max(per_layer.values(), default=0), root


def _placed(figures: PlanRankMemory, plan: ParallelPlan, s: int, i: int, e: int) -> PlanRankMemory:
    """``figures`` as the rank of stage s, TP rank i and EP rank e: its id (the first of its replicas), coords
    and data- and context-parallel replicas."""
    from ..parallel.experts import ep_coords

    replicas = sorted(rank_id(plan, i, c, d, s) for d in range(plan.dp) for c in range(plan.cp)
                      if ep_coords(d, c, plan)[1] == e)
    first = replicas[0]
    coords = {"tp": i, "pp": s, "cp": (first // plan.tp) % plan.cp, "ep": e,
              "dp": (first // (plan.tp * plan.cp)) % plan.dp}
    return dataclasses.replace(figures, rank=first, coords=coords, replicas=tuple(replicas))
