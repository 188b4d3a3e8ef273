"""flopcount.memory.ranks.per_rank as it was before the single walk per (stage, EP load): one liveness walk per
(stage, TP rank, EP load), run twice (plain, then with the held bytes and accumulated gradients). Kept unchanged
as the reference that tests/core/test_memory_ranks_same.py compares the faster per_rank with; not a test module."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

from flopcount.context import TensorInfo
from flopcount.errors import UsageError
from flopcount.parallel.plan import ParallelPlan
from flopcount.reporting.report import tensor_bytes
from flopcount.memory.ledger import VIEWS, Graph, Memory, MemorySettings, RankMemory, ledger

__all__ = ["per_rank"]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_TP_PARAMS = ("q_proj", "gate_proj", "up_proj", "o_proj", "down_proj", "embed_tokens", "lm_head")
_KV = ("k_proj", "v_proj")
_SAME_SIZE = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose"})
_SEQUENCE = ("o_proj", "down_proj", "embed_tokens")  # outputs whole on every TP rank, split over the sequence by sp


@dataclass(frozen=True)
class PlanRankMemory(RankMemory):
    """One rank's :class:`~flopcount.memory.ledger.RankMemory` under a plan: its ``rank`` id and ``coords``, its pipeline
    ``stage``, its DP replicas (``replicas``, whose figures are the same), the microbatches whose activations it
    keeps at once (``microbatches_in_flight``; ``activations_bytes`` is one microbatch's), the FSDP all-gather
    buffer (``allgather_bytes``, in ``peak_bytes``), the gathered K and V of its largest layer under cp
    (``cp_kv_bytes``) and the all_to_all buffers of its largest MoE layer under ep
    (``alltoall_bytes``, in ``peak_bytes``)."""

    rank: int = 0
    coords: Mapping[str, int] = field(default_factory=dict)
    stage: int = 0
    replicas: tuple[int, ...] = ()
    microbatches_in_flight: float = 1.0
    allgather_bytes: int = 0
    cp_kv_bytes: int = 0
    alltoall_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["coords"], d["replicas"] = dict(self.coords), list(self.replicas)
        return d


def in_flight(plan: ParallelPlan, stage: int) -> float:
    """Microbatches whose activations pipeline rank ``stage`` keeps at once (see the module's docstring).

    >>> from flopcount.parallel.plan import parse_parallel
    >>> [in_flight(parse_parallel("pp=4", 8), s) for s in range(4)]
    [4.0, 3.0, 2.0, 1.0]
    >>> in_flight(parse_parallel("pp=4", 8, "interleaved:2"), 0)  # (4·2 + 4 − 1) / 2 chunks
    5.5
    """
    p, m = plan.pp, plan.microbatches
    if p == 1:
        return 1.0
    if plan.schedule == "gpipe":
        return float(m)
    if plan.schedule == "interleaved":
        v = plan.virtual_stages
        return min((p - stage - 1) * 2 + (v - 1) * p + 1, m * v) / v
    return float(min(p - stage, m))


def per_rank(report: Any, plan: ParallelPlan, expert_load: Any = None) -> Memory:
    """``report.memory`` (a one-rank ledger with its graph: ``count(..., memory=...)``) per rank of ``plan``, one
    entry per (stage, TP rank, EP rank) with its data- and context-parallel replicas listed; the returned ledger's
    ``settings.plan`` is ``plan``. ``expert_load``: the routing histogram of a MoE model
    (:func:`flopcount.parallel.experts.load_expert_load`), balanced if None."""
    from flopcount.parallel import experts as px
    from flopcount.parallel.ranks import ledger as flops_ledger, node_shares

    mem = report.memory
    if mem is None or mem.graph is None or mem.settings is None:
        raise UsageError("--parallel with --memory: the count has no memory ledger to split; count with --memory")
    settings = dataclasses.replace(mem.settings, plan=ParallelPlan())
    g = mem.graph
    if len(g.nodes) != len(report.nodes):
        raise UsageError("--parallel with --memory: the ledger's graph is not the report's")
    dims = flops_ledger(report, plan, settings.recompute, expert_load).dims  # checks what the degrees divide
    t, kv = plan.tp, min(plan.tp, dims["kv_heads"])
    scopes = report.modules.nodes
    rule: dict[int, str] = {}
    chunks: dict[int, set[int]] = {}
    for x in node_shares(report, plan, settings.recompute):
        if x.tp == 0:
            rule[x.index] = x.rule
            chunks.setdefault(x.index, set()).add(x.chunk)
    by_scope: dict[tuple, int] = {}
    for k in sorted(rule):
        by_scope.setdefault(tuple(scopes[k]), k)
    prev = None
    for k in range(len(g.nodes)):
        if k not in rule:
            src = by_scope.get(tuple(scopes[k]), prev)
            rule[k] = rule[src] if src is not None else "replicated"
            chunks[k] = chunks[src] if src is not None else {0}
        prev = k
    leaf = [sc[-1].rsplit(".", 1)[-1] if sc else "" for sc in scopes]
    expert = [px.is_expert(sc) for sc in scopes]
    moe_layers = sorted({_layer_of(scopes[k]) for k in range(len(g.nodes)) if expert[k]} - {None})
    load = expert_load or px.ExpertLoad(None)
    load.check_layers(len(moe_layers))
    fractions = {layer: load.fractions(j, report.moe.experts, plan.ep) for j, layer in enumerate(moe_layers)} \
        if moe_layers and plan.ep > 1 else {}

    def act_div(k: int) -> int:
        r = rule[k]
        if leaf[k] in _SEQUENCE or r == "norm":
            return t if plan.sp else 1
        return t if r == "split" else kv if r == "kv" else 1

    def param_div(k: int) -> tuple[int, int]:
        """(TP·EP division, FSDP division) of a weight whose first reader is node k."""
        dp_cp = plan.dp * plan.cp if plan.fsdp else 1
        if expert[k]:
            return t * plan.ep, max(dp_cp // plan.ep, 1)
        return (t if leaf[k] in _TP_PARAMS else kv if leaf[k] in _KV else 1), dp_cp

    reader: dict[str, int] = {}
    for k, n in enumerate(g.nodes):
        for x in n.inputs:
            if x is not None and x.name in g.stored:
                reader.setdefault(x.name, k)
    gathered = _gathered_kv(g, scopes, leaf) if plan.cp > 1 else {}
    top_k = report.moe.top_k if moe_layers else 0
    vec = dims["batch"] * (dims["seq"] // plan.cp) * top_k * dims["hidden"] * dims["activation_bytes"]
    v = plan.virtual_stages if plan.schedule == "interleaved" and plan.pp > 1 else 1
    ranks = []
    walked: dict[tuple, PlanRankMemory] = {}
    for s in range(plan.pp):
        mine = {c for c in range(plan.pp * v) if c % plan.pp == s}
        keep = [k for k in range(len(g.nodes)) if chunks[k] & mine]
        layers = {_layer_of(scopes[k]) for k in keep} & set(fractions)
        for e in range(plan.ep):
            share = {layer: fractions[layer][e] for layer in layers}

            def scale(k: int, e=e) -> tuple[int, int]:
                """(multiplier, divisor) of the activations node k makes on this rank."""
                div = act_div(k) * plan.cp
                if expert[k] and _layer_of(scopes[k]) in fractions:  # the pairs this rank's experts receive
                    num, den = fractions[_layer_of(scopes[k])][e]
                    return plan.ep * num, div * den
                return 1, div

            alltoall = max((vec + plan.ep * vec * num // den for num, den in share.values()), default=0)
            for i in range(t):
                key = (s, i, tuple(sorted(share.items())))  # EP ranks of the same load walk the same graph
                if key not in walked:
                    walked[key] = _rank(report, g, mem, settings, plan, s, i, keep, scale, param_div, reader,
                                        gathered, alltoall)
                ranks.append(_placed(walked[key], plan, s, i, e))
    return dataclasses.replace(mem, ranks=tuple(ranks), settings=dataclasses.replace(settings, plan=plan),
                               kept_by_node=MappingProxyType({}))


def _layer_of(scope) -> int | None:
    found = _LAYER.search(".".join(scope))
    return int(found.group(1)) if found else None


def _root(producer: Mapping[str, Any], name: str) -> str:
    """The storage a view's output shares: back through the views (as the ledger's walk roots them)."""
    while name in producer and producer[name].op_type in VIEWS and producer[name].domain == "" and \
            producer[name].inputs and producer[name].inputs[0] is not None:
        name = producer[name].inputs[0].name
    return name


def _gathered_kv(g: Graph, scopes, leaf) -> dict[str, int]:
    """The storages of K and V that each layer's attention reads (root name → layer): the second operand of its
    score product and of its product with V, the first two products under ``self_attn`` itself in the layer."""
    producer = {x.name: n for n in g.nodes for x in n.outputs if x is not None and x.name}
    products: dict[int, list[int]] = {}
    for k, n in enumerate(g.nodes):
        layer = _layer_of(scopes[k])
        if leaf[k] == "self_attn" and n.op_type in ("MatMul", "Einsum") and layer is not None and len(n.inputs) > 1:
            products.setdefault(layer, []).append(k)
    out: dict[str, int] = {}
    for layer, ks in products.items():
        for k in ks[:2]:
            x = g.nodes[k].inputs[1]
            if x is not None and x.name:
                out[_root(producer, x.name)] = layer
    return out


def _resized(info: TensorInfo, div: int, mul: int = 1) -> TensorInfo:
    """``info`` flattened to its share: ⌈elements · mul / div⌉."""
    n = 1
    for d in info.shape or ():
        n *= d
    if info.shape is None or tensor_bytes(info) is None:
        return info
    return TensorInfo(info.name, info.elem_type, (-(-n * mul // div),))


def _rank(report, g: Graph, mem: Memory, settings: MemorySettings, plan: ParallelPlan, s: int, i: int,
          keep, scale, param_div, reader, gathered, alltoall) -> PlanRankMemory:
    nodes = [g.nodes[k] for k in keep]
    made = {x.name: k for k in keep for x in g.nodes[k].outputs if x is not None and x.name}
    read = {x.name for n in nodes for x in n.inputs if x is not None and x.name}
    tensors: dict[str, TensorInfo] = {}
    for name in read | set(made):
        info = g.tensors.get(name) or TensorInfo(name)
        if name in g.stored:
            div, fsdp = param_div(reader[name]) if name in reader else (1, 1)
            tensors[name] = _resized(_resized(info, div), fsdp if name in g.params else 1)
        elif name in made:
            mul, div = scale(made[name])
            tensors[name] = _resized(info, div // plan.cp if name in gathered else div, mul)
        else:  # the graph's inputs, what the previous stage sends: the rank's tokens
            tensors[name] = _resized(info, plan.cp)
    for n in nodes:  # a view that keeps every element has its input's share (a weight's transpose is a weight's)
        src = n.inputs[0].name if n.inputs and n.inputs[0] is not None else None
        if n.op_type in _SAME_SIZE and src in tensors and n.outputs and n.outputs[0] is not None:
            shape = tensors[src].shape
            tensors[n.outputs[0].name] = TensorInfo(n.outputs[0].name, n.outputs[0].elem_type, shape)

    def stat(k: int, b: int) -> int:
        mul, div = scale(k)
        return -(-b * mul // div)

    saved = {n.index: g.saved[n.index]._replace(extra=tuple((w, stat(k, b)) for w, b in g.saved[n.index].extra))
             for k, n in zip(keep, nodes) if n.index in g.saved}
    received = tuple(x for x in sorted(read - set(made)) if x not in g.stored)
    inside = set(keep)
    outside = {y.name for k, n in enumerate(g.nodes) if k not in inside for y in n.inputs if y is not None}
    sent = frozenset(x for x in made if x in g.outputs or x in outside)
    indexes = {n.index for n in nodes}
    sub = Graph(nodes, {k: f for k, f in g.grads.items() if k in indexes}, saved, tensors,
                g.params & read, g.trainable & read, g.buffers & read, g.stored, received, sent,
                {k: u for k, u in g.units.items() if k in indexes})
    one = ledger(sub, mem.mode, mem.optimizer, settings, mem.missing).ranks[0]
    flight = in_flight(plan, s) if mem.mode == "train" else 1.0
    gather = 0
    if plan.fsdp:
        per_layer: dict[int, int] = {}
        for name in sub.params:
            layer = _layer_of(report.modules.nodes[reader[name]]) if name in reader else None
            if layer is not None:
                # a weight of unknown size is already in the ledger's ``unsized`` (the one-rank walk read the
                # same tensor), which makes the figures a stated lower bound; it adds nothing here
                whole = tensor_bytes(_resized(g.tensors.get(name) or TensorInfo(name), param_div(reader[name])[0])) or 0
                per_layer[layer] = per_layer.get(layer, 0) + whole
        gather = max(per_layer.values(), default=0)
    kv_per_layer: dict[int, int] = {}
    for name, layer in gathered.items():
        if name in tensors:
            kv_per_layer[layer] = kv_per_layer.get(layer, 0) + (tensor_bytes(tensors[name]) or 0)
    others = int(one.activations_bytes * (flight - 1))
    held = others + gather + alltoall
    peak = ledger(sub, mem.mode, mem.optimizer, settings, mem.missing, held=held,
                  accumulated=mem.mode == "train" and plan.microbatches > 1).ranks[0] if (held or (
                      plan.microbatches > 1 and mem.mode == "train")) else one
    return PlanRankMemory(**{**one.__dict__, "peak_bytes": peak.peak_bytes, "peak_phase": peak.peak_phase,
                             "peak_node": peak.peak_node}, stage=s, microbatches_in_flight=flight,
                          allgather_bytes=gather, cp_kv_bytes=max(kv_per_layer.values(), default=0),
                          alltoall_bytes=alltoall)


def _placed(figures: PlanRankMemory, plan: ParallelPlan, s: int, i: int, e: int) -> PlanRankMemory:
    """``figures`` as the rank of stage s, TP rank i and EP rank e: its id (the first of its replicas), coords
    and data- and context-parallel replicas."""
    from flopcount.parallel.experts import ep_coords

    replicas = sorted(i + plan.tp * (c + plan.cp * (d + plan.dp * s)) for d in range(plan.dp) for c in range(plan.cp)
                      if ep_coords(d, c, plan)[1] == e)
    first = replicas[0]
    coords = {"tp": i, "pp": s, "cp": (first // plan.tp) % plan.cp, "ep": e,
              "dp": (first // (plan.tp * plan.cp)) % plan.dp}
    return dataclasses.replace(figures, rank=first, coords=coords, replicas=tuple(replicas))


#: Columns of :func:`rank_rows` (the text report's memory table by rank).
RANK_HEADERS = ("ranks", "tp", "pp", "ep", "params B", "grads B", "optimizer B", "activations B / mb", "in flight",
                "all-gather B", "all_to_all B", "peak B", "peak phase")


def rank_rows(memory: Memory) -> list[list[str]]:
    """One row per distinct rank of a per-rank memory ledger, its data- and context-parallel replicas in the first
    column."""
    return [[",".join(map(str, r.replicas)), str(r.coords["tp"]), str(r.stage), str(r.coords["ep"]),
             f"{r.params_bytes:,}", f"{r.grads_bytes:,}", f"{r.optimizer_bytes:,}", f"{r.activations_bytes:,}",
             f"{r.microbatches_in_flight:g}", f"{r.allgather_bytes:,}", f"{r.alltoall_bytes:,}", f"{r.peak_bytes:,}",
             r.peak_phase]
            for r in memory.ranks if isinstance(r, PlanRankMemory)]
