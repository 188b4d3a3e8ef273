"""FLOPs per rank under a parallel plan: tensor (with sequence), pipeline, context, expert and data parallelism of a
transformer (decoder or encoder, dense or mixture-of-experts), and data parallelism of any model, from a counted
report's per-node FLOPs. Each node's role (column- or row-parallel projection, K/V projection, heads, MLP inner op,
vocab-parallel head, sequence work, replicated, position table, expert) and its stage come from the model's
:class:`~flopcount.parallel.layout.Layout`, found once from the graph's dataflow (:mod:`flopcount.parallel.layout`
states the rules). The context- and expert-parallel rules (zigzag split, EP ranks, routing histogram, all_to_all)
are stated in :mod:`flopcount.parallel.experts`. A role's FLOPs are shared out over the T ranks of a TP group:

* ``split`` (column- and row-parallel projections, heads, MLP inner ops, the vocab-parallel head and loss): 1/T of
  the work on each TP rank; a row-parallel Gemm's bias add runs whole on every rank, after the reduction;
* ``kv`` (K/V projections and the ops on K/V heads): 1/T, or with K/V heads ``kv`` fewer than T, 1/kv of their
  work on every rank (each TP rank holds one K/V head, copied on T/kv ranks; the first rank of each copy group
  counts it as model work, the others as redundant work); T must divide kv or kv must divide T;
* ``norm`` (sequence work: norms, residual adds; MLA's latent projections; MoE routers, on the rank's tokens as
  Megatron's router): replicated, unless ``sp`` splits it over the sequence: 1/T;
* ``replicated`` (the embedding's masked lookup, ops on one head all share, poolers, the loss's per-token
  ops): whole on every TP rank;
* ``positions`` (position tables, masks): rebuilt on every pipeline stage and replicated over TP;
* ``expert``: 1/T of each routed expert, and over EP by the load.

Replicated work counts as ``model_flops`` on one rank (TP rank 0, pipeline stage 0) and as ``redundant_flops``
on the others, so that the sum of ``model_flops`` over all ranks is the whole model's count times the step's
microbatches times ``dp``, and ``hardware_flops`` = ``model_flops`` + ``redundant_flops`` + the recomputed work.
A split that does not divide a node's FLOPs exactly gives its remainder to the first TP ranks, one FLOP each.

**Pipeline.** The L layers go to P contiguous stages of L/P each (P must divide L); stage 0 carries what comes
before the layers (the embedding), the last stage what comes after (the final norm, the LM head and the loss). With ``interleaved:v``, to P·v chunks of
L/(P·v) layers, chunk c on rank c mod P (P·v must divide L, and P the microbatches).
**Data.** Each DP rank runs M microbatches of the counted batch per optimizer step, so the global batch is b·M·dp.

**Recompute** (train only): ``full`` runs each layer's whole forward again (Megatron's full recompute, torch's
reentrant checkpoint); ``non-reentrant`` runs it again up to the last op that saves a tensor for the backward (as
torch's non-reentrant checkpoint stops: a dense layer's down projection and residual add do not run again);
``selective`` runs each attention core again (in each layer, the ``self_attn`` nodes from the score
product through softmax to the product with V, in graph order); a list of operator types runs those nodes again.

**Communication** bytes per optimizer step by collective, with the group it runs on, as the payload each rank
hands to the collective (the full tensor of an all_reduce, the gathered tensor of an all_gather, the input of a
reduce_scatter; bytes sent for send_recv), not the bytes on the wire; a TP collective's, the sum of its calls
(:mod:`flopcount.parallel.calls_tp`: each call's size, count and phase). With A = b·s·h·e (e the bytes of an
activation element) per microbatch and Lₛ the stage's layers:

* TP without sp: ``all_reduce`` of A after each attention and MLP block in the forward and before them in the
  backward: 4·Lₛ·A, plus A for the vocab-parallel embedding's all_reduce (stage 0, forward) and A for the
  vocab-parallel LM head's input gradient (last stage, backward), none without them (a ViT's patch embedding and
  classifier run whole on every rank); with a loss, 3·b·s·4 for its vocab-parallel max, sum and target logit.
  Per block of a layer, A of that layer's stream (an encoder-decoder's encoder layers b·s_e·h·e, its decoder
  layers b·s_d·h·e, with three blocks each: self-attention, cross-attention, MLP), and A_e more in the backward for
  a cross-attention's K/V input (the encoder's output); A for each vocab-parallel lookup (the encoder's and the
  decoder's), the decoder's stream's for the head and the loss (:meth:`~flopcount.parallel.layout.Layout.stage_tp`);
* TP with sp: each of those all_reduces becomes an ``all_gather`` and a ``reduce_scatter`` of A: 2·Lₛ·A each in
  the forward and again in the backward; the embedding's output is reduce-scattered (A), its gradient gathered
  (A), or without a vocab-parallel embedding only split, its gradient gathered (A); the LM head's input gathered
  (A), its gradient reduce-scattered (A), or without a vocab-parallel head (a replicated classifier) only gathered
  (A), its gradient split with no collective. With position or token-type tables
  looked up and added to the token embedding, the embedding's lookup is all-reduced instead (A) and the sum split
  over the sequence with no collective, its gradient gathered (A), as Megatron's embedding does. Under
  ``sp=megatron`` each gathered input (:mod:`flopcount.parallel.layout`: what a column-parallel, K/V or mixer
  product or the LM head reads, A for a Llama's Q/K/V, MLP and head inputs) is all-gathered again in the backward:
  2·Lₛ·A + A more ``all_gather`` (the head's on the last stage);
* TP in a layer of multi-head latent attention, with or without sp: its column-parallel up projections read the
  latents (:meth:`~flopcount.parallel.layout.Layout.stage_tp`), b·s·(q_lora + kv_lora + rope)·e, which take
  the place of the attention's A among the column-parallel inputs above, as Megatron's ``MLASelfAttention`` runs
  the down projections and the latents' norms on the rank's tokens;
* TP with sp on an MoE without ep: each MoE layer's routing map and probabilities all-gathered over TP (group
  ``tp_ep``, T ranks) in the forward, b·s·R·(1 + p) bytes (p a probability's, the model's router's dtype), and the
  probabilities' gradient reduce-scattered in the backward, b·s·R·p, as Megatron-Core's all-gather token
  dispatcher runs them (:func:`~flopcount.parallel.experts.routing_gathered`; once more in a rerun that dispatches again);
* TP with sp on an MoE under ep: each MoE layer's pairs received all-gathered over expert-TP (group ``etp``, T
  ranks) with their probabilities and their outputs reduce-scattered there, and no TP block for an MoE of routed
  experts alone, as Megatron-Core's all-to-all dispatcher runs them (:mod:`flopcount.parallel.experts`);
  under ``--token-dispatcher allgather``, the routing map, probabilities and hidden states all-gathered over
  ``tp_ep`` (T·E ranks) and the outputs reduce-scattered there instead, again no TP block, as its all-gather
  dispatcher runs them (:func:`~flopcount.parallel.experts.allgather_calls`);
* TP under recompute: the forward's collectives that the rerun passes run again. ``full`` runs each layer's
  whole forward again: 2·Lₛ·A more ``all_reduce`` (with sp, 2·Lₛ·A more ``all_gather`` and ``reduce_scatter``).
  ``non-reentrant`` stops before the layer's last product (its down projection), so its reduction does not run
  again: Lₛ·A more ``all_reduce`` (with sp, 2·Lₛ·A ``all_gather`` and Lₛ·A ``reduce_scatter``). ``selective``
  and an operator list run no collective again (an MoE layer's rerun dispatch, combine and router statistics:
  :mod:`flopcount.parallel.experts`);
* PP: ``send_recv`` of each microbatch's activation to the next stage in the forward and its gradient to the
  previous stage in the backward, A each (A/T under sp, whose activations are split over the sequence); with
  ``interleaved:v``, from each of the rank's v chunks but the model's last (forward) and first (backward); an
  encoder-decoder's, what crosses each boundary (the encoder's output too: :mod:`flopcount.parallel.stacks`);
* DP: ``all_reduce`` of the rank's gradients once per step (G = its parameters × their element bytes); with
  ``fsdp``, FSDP2's convention (``fully_shard`` on each repeated layer and on the root, with its defaults), each
  parameter padded to n·⌈d0/n⌉ rows (:func:`flopcount.parallel.layout.fsdp_shard`; buffers and constants are not
  sharded): ``all_gather`` of a layer's parameters in the forward and again in the backward of each microbatch, of
  the root's (outside the layers) once, the root being kept gathered from its forward to its backward, M·(2·G −
  G_root) a step, and ``reduce_scatter`` of the gradients G in the backward of each microbatch (FSDP2's default:
  each microbatch's unsharded gradients are reduce-scattered into the sharded ones, which accumulate, and freed;
  the memory ledger holds them so, :mod:`flopcount.memory.ranks`); with ``zero1`` (ZeRO stage 1, P_os of
  Rajbhandari et al. 2020: optimizer states sharded), the ``all_reduce`` of G once a step as without sharding,
  and an ``all_gather`` of the updated parameters G once a step (each rank steps its shard and gathers the
  others'); with ``zero2`` (P_os+g: gradients sharded too), ``reduce_scatter`` of the gradients G in the backward
  of each microbatch (as ``fsdp``, FSDP2's default, so M·G a step) in place of the ``all_reduce``, and the
  ``all_gather`` of G once a step (not padded: DeepSpeed's stages 1 and 2 partition one flat buffer, not each
  parameter). The group is ``dp``, or ``dp_cp`` under cp > 1.

**Bubble.** The schedule's actions (GPipe: all forwards, then all backwards; 1F1B: P−1−p warm-up forwards, then
one forward and one backward in turn, then the remaining backwards; interleaved 1F1B as Megatron orders it) are
simulated rank by rank (:mod:`.schedules`), each action waiting for its rank and for the action it needs on the neighbouring
(virtual) stage, each lasting its chunk's FLOPs per microbatch (equal throughput on every rank).
``bubble_fraction`` = 1 − busy time / (P × makespan); with equal stages it is (P−1)/(M+P−1) for GPipe and 1F1B,
and (P−1)/(v·M+P−1) interleaved. A ledger made with ``schedule=False`` (a plan search's) simulates none: its
``schedule`` and ``bubble_fraction`` are None.

**Optimizer step** (with ``--optimizer``): each rank's ``optimizer_flops`` once per step, for the parameter elements
it updates, and ``optimizer_redundant_flops``, those another rank updates too (TP-replicated norms, K/V copies, DP
replicas without ``zero1``, ``zero2`` or ``fsdp``); the rules are in :mod:`flopcount.parallel.optimizer`.

Generation (``--generate``): its own rules, :mod:`flopcount.parallel.generation`. Not modelled yet: the bubble
with unbalanced experts (it is simulated with the stage durations of TP rank 0, before the EP load).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import experts as px
from .calls_tp import Call, tp_calls
from ..errors import UsageError
from ..reporting.tiled import check_listable
from .layout import Dims, Layout, chunks_of, layout_of, rank_id, split
from .plan import ParallelPlan, Recompute, check_recompute_ops
from .schedules import Schedule, pipeline_schedule, schedule_bubble

__all__ = ["Collective", "NodeShare", "ParallelLedger", "RankFlops", "ledger", "node_shares", "plan_shares",
           "param_groups", "pipeline_schedule", "plan_dims", "rank_params", "schedule_bubble"]



@dataclass(frozen=True)
class Collective:
    """Bytes one rank hands to one kind of collective per optimizer step, and the group it runs on."""

    kind: str  # all_reduce, all_gather, reduce_scatter, send_recv
    group: str  # tp, pp, dp
    bytes: int
    calls: tuple[Call, ...] = field(default=(), compare=False)  # group tp: the calls whose sum bytes is (calls_tp)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "group": self.group, "bytes": self.bytes}


@dataclass(frozen=True)
class RankFlops:
    """One rank's work per optimizer step (``per_microbatch``: one microbatch's)."""

    rank: int
    coords: Mapping[str, int]
    stage: int
    model_flops: int
    hardware_flops: int
    redundant_flops: int
    recompute_flops: int
    per_microbatch: Mapping[str, int]
    communication: tuple[Collective, ...]
    optimizer_flops: int | None = None  # the optimizer step, once per step (:mod:`flopcount.parallel.optimizer`)
    optimizer_redundant_flops: int | None = None  # the part of it another rank runs too
    phases: Mapping[str, Mapping[str, int]] | None = None  # generation: prefill and decode (model, hardware, redundant)

    def as_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "coords": dict(self.coords), "stage": self.stage,
                "model_flops": self.model_flops, "hardware_flops": self.hardware_flops,
                "redundant_flops": self.redundant_flops, "recompute_flops": self.recompute_flops,
                "optimizer_flops": self.optimizer_flops, "optimizer_redundant_flops": self.optimizer_redundant_flops,
                "per_microbatch": dict(self.per_microbatch),
                "phases": None if self.phases is None else {k: dict(v) for k, v in self.phases.items()},
                "communication": [c.as_dict() for c in self.communication]}


@dataclass(frozen=True)
class ParallelLedger:
    """The per-rank ledger of a plan (see the module's rules). ``whole_flops``: the counted model's FLOPs of one
    microbatch (forward, plus backward in training); ``dims``: what the rules read off the graph."""

    plan: ParallelPlan
    recompute: Recompute
    mode: str
    whole_flops: int
    dims: Mapping[str, int]
    ranks: tuple[RankFlops, ...]
    bubble_fraction: float | None  # None: not simulated (ledger's schedule=False)
    slowest_rank: int
    imbalance: float
    kv_rule: str
    rules: tuple[str, ...] = field(default=())
    expert_load: str | None = None  # "balanced" or the --expert-load file of a MoE model; None for a dense one
    # under ep with --expert-load: each MoE layer's (by its layer index) share of the load per EP rank, (num, den)
    expert_shares: Mapping[int, tuple[tuple[int, int], ...]] | None = field(default=None, compare=False)
    optimizer: str | None = None  # the counted optimizer; None with the reason in optimizer_note
    whole_optimizer_flops: int | None = None  # the whole model's optimizer step
    optimizer_note: str | None = None
    generation: Mapping[str, int] | None = None  # mode "generate": the whole model's prefill and decode FLOPs
    schedule: Schedule | None = None  # the pipeline's simulated schedule (pp > 1), whose bubble is bubble_fraction

    def as_dict(self) -> dict[str, Any]:
        return {"plan": self.plan.as_dict(), "recompute": str(self.recompute), "mode": self.mode,
                "schedule": None if self.schedule is None else self.schedule.as_dict(),
                "generation": None if self.generation is None else dict(self.generation),
                "whole_flops_per_microbatch": self.whole_flops, "optimizer": self.optimizer,
                "whole_optimizer_flops": self.whole_optimizer_flops, "optimizer_note": self.optimizer_note,
                "dims": dict(self.dims),
                "kv_heads_rule": self.kv_rule, "expert_load": self.expert_load,
                "bubble_fraction": self.bubble_fraction,
                "slowest_rank": self.slowest_rank, "imbalance": self.imbalance,
                "ranks": [r.as_dict() for r in self.ranks]}


#: Ops whose backward keeps none of their tensors (sums, sign changes, moves): they save nothing for the backward.
_KEEPS_NOTHING = frozenset(("Add", "Sub", "Neg", "Sum", "Identity", "Reshape", "Transpose", "Cast", "Squeeze",
                            "Unsqueeze", "Concat", "Split", "Slice", "Expand", "Flatten", "Shape", "Constant",
                            "ConstantOfShape"))
#: Ops whose backward keeps their output only: run before it is saved.
_KEEPS_OUTPUT = frozenset(("Softmax", "LogSoftmax", "Exp", "Sigmoid", "Tanh", "Relu", "Sqrt"))
_HEADS = ("heads", "kv_heads", "shared_head")


def _rerun_layers(nodes: Sequence[Any], layout: Layout) -> set[int]:
    """The nodes a checkpoint around each layer runs again (``--recompute non-reentrant``): the layer's forward in
    order, stopping, as torch's non-reentrant checkpoint does, once every tensor its backward saved is back. The last
    op that saves anything is the cut: an op that saves its inputs (a product: the down projection's input) saves
    them before it runs, so neither it nor what follows runs again (the residual add after it); one that saves
    its output (softmax, an activation) runs first."""
    members: dict[int, list[int]] = {}
    for k, layer in enumerate(layout.layer):
        if layer is not None:
            members.setdefault(layer, []).append(k)
    out: set[int] = set()
    for ks in members.values():
        savers = [k for k in ks if nodes[k].op_type not in _KEEPS_NOTHING]
        if not savers:
            continue
        cut = savers[-1]
        out.update(k for k in ks if k < cut or (k == cut and nodes[k].op_type in _KEEPS_OUTPUT))
    return out


def _recomputed(recompute: Recompute, nodes: Sequence[Any], layout: Layout) -> set[int]:
    if recompute.policy == "none":
        return set()
    if recompute.policy == "full":  # the whole layer, as Megatron and torch's reentrant checkpoint run it
        return {k for k, layer in enumerate(layout.layer) if layer is not None}
    if recompute.policy == "non-reentrant":
        return _rerun_layers(nodes, layout)
    if recompute.policy == "ops":
        return {k for k, n in enumerate(nodes) if n.op_type in recompute.ops}
    core: set[int] = set()  # each layer's attention core: its heads' ops from the score product to the product with V
    for products in layout.attention.values():  # its score products, then its context products, in pairs
        half = max(len(products) // 2, 1)
        for first, last in zip(products[:half], products[-half:]):
            core.update(k for k in range(first, last + 1) if layout.roles[k] in _HEADS)
    return core


class NodeShare(NamedTuple):
    """One node's work on one TP rank of one stage per microbatch: ``model_*`` its share of the model's work,
    ``forward``/``backward`` what the rank runs, ``recompute`` the forward it runs again."""

    index: int  # position in the report's nodes
    stage: int
    tp: int
    rule: str
    model_forward: int
    model_backward: int
    forward: int
    backward: int
    recompute: int
    chunk: int = 0  # virtual stage c·P + p (chunk c of pipeline rank p); the stage itself without interleaving


def node_shares(report: Any, plan: ParallelPlan, recompute: Recompute | None = None) -> tuple[NodeShare, ...]:
    """Every node's work on every (stage, TP rank) of ``plan`` (nodes without work left out): what
    :func:`ledger` sums, and what ``--by-module`` rows per rank are made of. These are one whole sequence's
    shares: under cp a rank runs 1/C of each (:func:`flopcount.parallel.experts.cp_split`), and under ep the
    nodes of rule ``expert`` are redistributed over the EP group by the load (:func:`ledger` does both)."""
    return plan_shares(report, plan, recompute)[1]


#: The last :func:`plan_shares` asked and its answer: ``--parallel --memory`` asks twice for the same nodes and scopes.
_last_shares: list[tuple] = []


def plan_shares(report: Any, plan: ParallelPlan, recompute: Recompute | None, within: tuple[int, int] | None = None):
    """``(dims, shares, has_loss, per_stage, train, recompute)`` of ``report`` under ``plan``, memoized (last asked).
    The shares read the plan's tp, sp, pp and chunks only: a plan that differs in dp, cp, ep, M, the sharding or
    the schedule's name has the memoized shares once its own checks pass. ``within``: ``report`` holds some of a
    model's layers (:func:`~flopcount.parallel.layout.layout_of`)."""
    recompute = recompute or Recompute()
    key = (report.nodes, report.modules.nodes, report.modules.missing, report.moe, report.mode,
           (plan.tp, plan.sp, plan.pp, chunks_of(plan)), recompute, within)
    if _last_shares:  # the same node and scope lists (by identity), and the rest equal
        last = _last_shares[0]
        if last[0] is key[0] and last[1] is key[1] and last[2:] == key[2:]:
            _checked_layout(report, plan, within)
            return _last_shares[1]
    found = _shares_of(report, plan, recompute, within)
    _last_shares[:] = [key, found]
    return found


def _run(fwd: int, bwd: int, rule: str, layout: Layout, i: int, first: bool) -> tuple[tuple[int, int], tuple[int, int]]:
    """(executed, model) (forward, backward) FLOPs of a node of ``rule`` on TP rank ``i`` (``first``: the first
    stage that runs it)."""
    t, kv_group = layout.plan.tp, layout.kv_group
    if rule in ("split", "expert") or (rule == "norm" and layout.plan.sp):
        run = (split(fwd, t, i), split(bwd, t, i))
        return run, run
    if rule == "kv" and kv_group > 1:
        kv = layout.dims.kv_heads
        run = (split(fwd, kv, i // kv_group), split(bwd, kv, i // kv_group))
        return run, run if i % kv_group == 0 else (0, 0)
    if rule == "kv":
        run = (split(fwd, t, i), split(bwd, t, i))
        return run, run
    return (fwd, bwd), (fwd, bwd) if i == 0 and first else (0, 0)  # replicated over TP (positions: and stages)


def _checked_layout(report: Any, plan: ParallelPlan, within: tuple[int, int] | None = None) -> Layout:
    """The layout of ``report`` under ``plan`` once the plan's experts are checked (:class:`UsageError`)."""
    where = report.model.path or report.model.graph_name or "the model"
    nodes = report.nodes
    check_listable(nodes, "--parallel", "nodes, which the ledger shares out one by one,")
    scopes = report.modules.nodes if not report.modules.missing else ()
    blocks = px.moe_blocks(scopes)
    if plan.ep > 1 and not blocks:
        raise UsageError(f"--parallel ep={plan.ep}: {where} has no routed experts (no *.mlp.experts, "
                         "*.block_sparse_moe.experts, *.feed_forward.experts or *.ffn.experts scopes); give ep=1 for a "
                         "dense model")
    if blocks and report.moe is None:
        raise UsageError(f"--parallel: {where} has expert scopes but no mixture-of-experts record; count it with "
                         "--hf so that its routed experts are known")
    layout = layout_of(report, plan, within)
    if blocks and report.moe.experts % plan.ep:
        raise UsageError(f"--parallel ep={plan.ep}: ep must divide the {report.moe.experts} routed experts")
    return layout


def plan_dims(report: Any, plan: ParallelPlan, recompute: Recompute | None, within: tuple[int, int] | None = None
              ) -> Dims:
    """:func:`plan_shares`' dims, its checks passed, without the shares (the memory ledger's walks read no more)."""
    return _checked(report, plan, recompute or Recompute(), within).dims


#: The last node list :func:`_op_types` read (a tuple, by identity) and its operator types: a search checks each plan
_OP_TYPES: list = []


def _op_types(nodes: Sequence[Any]) -> frozenset[str]:
    """The operator types of ``nodes``, found once per node list."""
    if not _OP_TYPES or _OP_TYPES[0] is not nodes:
        _OP_TYPES[:] = [nodes, frozenset(n.op_type for n in nodes)]
    return _OP_TYPES[1]


def _checked(report: Any, plan: ParallelPlan, recompute: Recompute, within: tuple[int, int] | None) -> Layout:
    """The layout of ``report`` under ``plan``, the plan and ``recompute`` checked as :func:`plan_shares` checks."""
    where = report.model.path or report.model.graph_name or "the model"
    if recompute.policy != "none" and report.mode != "train":
        raise UsageError(f"--recompute {recompute}: recompute changes training only; give --mode train")
    layout = _checked_layout(report, plan, within)
    train = report.mode == "train"
    if train and recompute is not None:
        check_recompute_ops(recompute, _op_types(report.nodes))
    if train and recompute.policy in ("full", "non-reentrant", "selective") and not layout.attention:
        raise UsageError(f"--recompute {recompute}: {where} has no repeated attention layers to checkpoint (full, "
                         "non-reentrant) or attention cores to run again (selective); give --recompute none or "
                         "operator types")
    return layout


def _shares_of(report: Any, plan: ParallelPlan, recompute: Recompute, within: tuple[int, int] | None = None):
    nodes = report.nodes
    layout = _checked(report, plan, recompute, within)
    d = layout.dims
    t = plan.tp
    train = report.mode == "train"
    per_stage = d.layers // plan.pp if d.layers else 0
    redo = _recomputed(recompute, nodes, layout) if train else set()
    shares: list[NodeShare] = []
    per_tp: dict[tuple, list[tuple[int, int, int, int]]] = {}  # a node's TP ranks' shares, by what they read
    for k, n in enumerate(nodes):
        fwd, bwd = n.cost.flops, n.backward.flops if train else 0
        if not fwd and not bwd:
            continue
        rule = layout.rule(k)
        whole_f, whole_b = layout.whole_part.get(k, (0, 0))
        if not train:
            whole_b = 0
        chunks = layout.chunks[k]
        stages = [c % plan.pp for c in chunks]
        again = k in redo
        for c, s in zip(chunks, stages):
            asked = (fwd, bwd, whole_f, whole_b, rule, s == stages[0])
            rows = per_tp.get(asked)
            if rows is None:
                rows = per_tp[asked] = [_tp_share(asked, layout, i) for i in range(t)]
            for i, (model_f, model_b, run_f, run_b) in enumerate(rows):
                shares.append(NodeShare(k, s, i, rule, model_f, model_b, run_f, run_b, run_f if again else 0, c))
    return d, tuple(shares), layout.has_loss, per_stage, train, recompute


def _tp_share(asked: tuple, layout: Layout, i: int) -> tuple[int, int, int, int]:
    """(model forward, model backward, executed forward, executed backward) FLOPs on TP rank ``i`` of a node of
    ``asked`` = (forward, backward, their parts whole on each rank, rule, whether the stage is the first that runs
    it): the same for every node of the same (a layer's node and the other layers')."""
    fwd, bwd, whole_f, whole_b, rule, first = asked
    run, own = _run(fwd - whole_f, bwd - whole_b, rule, layout, i, first)
    if whole_f or whole_b:  # a row-parallel Gemm's bias add: whole on each rank, after the reduction
        w_run, w_own = _run(whole_f, whole_b, "norm", layout, i, first)
        run, own = (run[0] + w_run[0], run[1] + w_run[1]), (own[0] + w_own[0], own[1] + w_own[1])
    return own[0], own[1], run[0], run[1]


def ledger(report: Any, plan: ParallelPlan, recompute: Recompute | None = None,
           expert_load: px.ExpertLoad | None = None, replicas: bool = True, schedule: bool = True
           ) -> ParallelLedger:
    """The per-rank ledger of ``report`` (a counted :class:`~flopcount.reporting.report.Report` of one microbatch) under
    ``plan``; :class:`~flopcount.errors.UsageError` (exit 2) when a degree does not divide what it splits, a part
    of the plan is not modelled yet, or the model's scopes are not those of a decoder. ``expert_load``: the
    routing histogram of a MoE model (:func:`flopcount.parallel.experts.load_expert_load`), balanced if None.
    ``replicas=False``: without expert parallelism, the ranks of data-parallel rank 0 only (the others run the
    same FLOPs and collectives; a plan search reads one of them). ``schedule=False``: the pipeline's schedule not
    simulated, its record's ``schedule`` and ``bubble_fraction`` None (a plan search predicts its own)."""
    d, shares, has_loss, per_stage, train, recompute = plan_shares(report, plan, recompute)
    t, p, m, c_, e_ = plan.tp, plan.pp, plan.microbatches, plan.cp, plan.ep
    load = expert_load or px.ExpertLoad(None)
    layout = layout_of(report, plan)
    acc, experts, moe_layers = _summed(shares, layout, p, t)
    load.check_layers(len(moe_layers))
    fractions = {layer: load.fractions(j, report.moe.experts, e_) for j, layer in enumerate(moe_layers)}
    reruns = _moe_reruns(_recomputed(recompute, report.nodes, layout), layout, report.nodes,
                         px.block_ends(() if report.modules.missing else report.modules.nodes, layout.layer)
                         if px.dispatcher(plan) == "allgather" else None) if train and recompute.policy in _RERUN_TP else {}  # its collectives with it
    whole = _whole(report.nodes, train)
    comm = _communication(layout, report, per_stage, train, has_loss,
                          _RERUN_TP.get(recompute.policy) if train else None)
    order = ("tp", "pp", "cp", "ep", "dp")
    from . import optimizer as po

    note = po.optimizer_note(report)
    per_element = po.per_element(report) if note is None else 0
    rows = layout.stage_params(report.modules.params) if note is None else {}
    ranks = []
    for s in range(p):
        kv_tokens = layout.kv_tokens(s)
        for dp in range(plan.dp if replicas or e_ > 1 else 1):
            for cp in range(c_):
                group, ep = px.ep_coords(dp, cp, plan)
                members = px.ep_members(group, plan)  # the group's CP ranks
                for i in range(t):
                    model, run, again = (px.cp_split(v, c_, cp) for v in acc[(s, i)][:3])
                    for layer, (ex_run, ex_again) in experts[(s, i)].items():
                        share = fractions[layer]
                        ex = px.ep_divide([px.cp_split(ex_run, c_, q) for q in members], share)[ep]
                        model, run = model + ex, run + ex
                        again += px.ep_divide([px.cp_split(ex_again, c_, q) for q in members], share)[ep]
                    coords = {"tp": i, "pp": s, "cp": cp, "ep": ep, "dp": dp}
                    rank = rank_id(plan, i, cp, dp, s)
                    extra = _cp_ep_communication(plan, d, report, kv_tokens, train, recompute,
                                                 [(fractions[layer][ep], reruns.get(layer, px.Rerun()),
                                                   layout.seqs[layer]) for layer in experts[(s, i)]])
                    opt = None if note else po.optimizer_elements(rows, layout, po.RankCoords(s, i, dp, cp, group, ep))
                    ranks.append(RankFlops(rank, {k: coords[k] for k in order}, s, m * model, m * (run + again),
                                           m * (run - model), m * again,
                                           {"model_flops": model, "hardware_flops": run + again,
                                            "redundant_flops": run - model, "recompute_flops": again},
                                           comm[s] + extra, *((per_element * opt[0], per_element * opt[1]) if opt
                                                              else (None, None))))
    ranks.sort(key=lambda r: r.rank)
    simulated = pipeline_schedule(plan, shares, train) if schedule else None
    bubble = None if not schedule else simulated.bubble_fraction if simulated is not None else 0.0
    slowest = max(ranks, key=lambda r: (r.hardware_flops, -r.rank))
    mean = sum(r.hardware_flops for r in ranks) / len(ranks)
    return ParallelLedger(plan, recompute, report.mode, whole, {
        "batch": d.batch, "seq": d.seq, "hidden": d.hidden, "heads": d.heads, "kv_heads": d.kv_heads,
        "head_dim": d.head_dim, "ffn": d.ffn, "vocab": d.vocab, "layers": d.layers,
        "activation_bytes": d.act_bytes, "param_bytes": d.param_bytes, "moe_layers": len(moe_layers),
        "experts": report.moe.experts if moe_layers else 0, "top_k": report.moe.top_k if moe_layers else 0,
        "prob_bytes": d.prob_bytes},
        tuple(ranks), bubble, slowest.rank, slowest.hardware_flops / mean if mean else 1.0,
        layout.kv_rule, expert_load=load.source if moe_layers else None,
        expert_shares={k: tuple(v) for k, v in fractions.items()} if load.per_layer is not None and e_ > 1 else None,
        optimizer=None if note else report.optimizer[0],
        whole_optimizer_flops=None if note else report.optimizer[1].flops, optimizer_note=note, schedule=simulated)


#: The last shares summed (by identity) and their sums: a plan search asks again for the shares of plans that differ
#: in what the shares do not read.
_last_sums: list[tuple] = []


def _summed(shares: Sequence[NodeShare], layout: Layout, p: int, t: int) -> tuple[dict, dict, list[int]]:
    """Per (stage, TP rank), its shares' sums but the experts' (model, executed, recomputed, executed forward),
    its experts' per MoE layer (run, recomputed), and the MoE layers in order; memoized (the last shares asked), not
    to be changed."""
    if _last_sums and _last_sums[0] is shares:
        return _last_sums[1]
    acc = {(s, i): [0, 0, 0, 0] for s in range(p) for i in range(t)}  # model, executed, recomputed, executed fwd
    experts: dict[tuple[int, int], dict[int, list[int]]] = {k: {} for k in acc}  # per MoE layer: run, recomputed
    for index, stage, tp, rule, model_f, model_b, fwd, bwd, again, _ in shares:
        if rule == "expert":
            e = experts[(stage, tp)].setdefault(layout.layer[index], [0, 0])
            e[0] += fwd + bwd
            e[1] += again
            continue
        a = acc[(stage, tp)]
        a[0] += model_f + model_b
        a[1] += fwd + bwd
        a[2] += again
        a[3] += fwd
    found = (acc, experts, sorted({layout.layer[x.index] for x in shares if x.rule == "expert"}))
    _last_sums[:] = [shares, found]
    return found


#: The last node list's (by identity) whole FLOPs, forward only and with the backward.
_last_whole: list[Any] = []


def _whole(nodes: Sequence[Any], train: bool) -> int:
    """The FLOPs of ``nodes``, with their backward when ``train``; memoized (the last node list asked)."""
    if not (_last_whole and _last_whole[0] is nodes):
        _last_whole[:] = [nodes, {}]
    found = _last_whole[1]
    if train not in found:
        found[train] = sum(n.cost.flops + (n.backward.flops if train else 0) for n in nodes)
    return found[train]


def _moe_reruns(redo: set[int], layout: Layout, nodes: Sequence[Any], ends: Mapping[int, int] | None = None
                ) -> dict[int, px.Rerun]:
    """Per MoE layer, what the recompute's rerun (the nodes ``redo``) runs again of its dispatch, combine and router
    (:mod:`flopcount.parallel.experts`' rules); ``ends``: under the all-gather dispatcher, each layer's last node of
    its MoE block, after which its combine runs."""
    out: dict[int, px.Rerun] = {}
    if not redo:
        return out
    last: dict[int, int] = {}  # each MoE layer's last expert product
    for k, layer in enumerate(layout.layer):
        if layer is not None and layout.expert[k] and nodes[k].family in ("matmul", "gemm", "einsum"):
            last[layer] = k
    for layer, end in last.items():
        ks = [k for k in redo if layout.layer[k] == layer]
        after = end if ends is None else ends.get(layer, end)
        out[layer] = px.Rerun(any(layout.expert[k] for k in ks), any(k > after for k in ks),
                              any(layout.roles[k] == "router" and k < end for k in ks))
    return out


def _cp_ep_communication(plan: ParallelPlan, d: Dims, report: Any, kv_tokens: int, train: bool,
                         recompute: Recompute, moe: Sequence[tuple[tuple[int, int], px.Rerun, int]]
                         ) -> tuple[Collective, ...]:
    """One rank's CP K/V collectives, EP all_to_alls, router statistics and routing gathers per optimizer step (see
    :mod:`flopcount.parallel.experts`); ``moe``: per MoE layer of its stage, its EP rank's share of the load and
    what the recompute runs again, and its tokens in a sequence (an encoder's and a decoder's differ)."""
    m, out = plan.microbatches, []
    if plan.cp > 1:
        kv = 2 * d.batch * kv_tokens * max(d.kv_heads // plan.tp, 1) * d.head_dim * d.act_bytes
        again = 2 if train and recompute.policy in ("full", "non-reentrant") else 1  # gathered again in the rerun
        out.append(Collective("all_gather", "cp", m * kv * again))
        if train:
            out.append(Collective("reduce_scatter", "cp", m * kv))
    counts = report.moe.experts * px.COUNT_BYTES if moe else 0  # R int64 token counts
    if moe and px.dispatcher(plan) == "alltoall":
        out.extend(_alltoall_communication(plan, d, report, train, moe))
    gathered = [(px.allgather_calls(plan, d.batch * (seq // plan.cp), report.moe.experts, d.hidden, d.act_bytes,
                                    d.prob_bytes), again) for _, again, seq in moe]  # each layer's own tokens
    if any(calls.dispatch for calls, _ in gathered):  # the all-gather dispatcher's, over tp_ep
        back = 1 if train else 0
        out.append(Collective("all_gather", "tp_ep", m * sum(
            (1 + again.dispatch) * sum(calls.dispatch) + back * sum(calls.combine_grad) for calls, again in gathered)))
        scattered = sum((1 + again.combine) * sum(calls.combine) + back * sum(calls.dispatch_grad)
                        for calls, again in gathered)
        if scattered:  # none in inference under ep = 1, whose outputs are the layer's TP block's
            out.append(Collective("reduce_scatter", "tp_ep", m * scattered))
    if train and plan.tp * plan.cp > 1 and moe:  # the auxiliary loss's counts over the split sequence
        twice = recompute.policy == "non-reentrant"  # recorded in the forward and in the rerun (full: the rerun)
        out.append(Collective("all_reduce", "tp_cp", m * counts * sum(
            1 + (twice and again.router) for _, again, _ in moe)))
    return tuple(out)


def _alltoall_communication(plan: ParallelPlan, d: Dims, report: Any, train: bool,
                            moe: Sequence[tuple[tuple[int, int], px.Rerun, int]]) -> list[Collective]:
    """One rank's collectives of the all-to-all dispatcher per optimizer step (:mod:`flopcount.parallel.experts`):
    its ``all_to_all`` over ``ep`` (under ep > 1), the router's counts over ``tp_ep``, the pairs over ``etp``."""
    m, out = plan.microbatches, []
    back = 1 if train else 0  # the backward's combine and dispatch
    pair = d.batch * report.moe.top_k  # b·k pairs of one token in a sequence
    own = [seq // plan.cp // px.routing_ranks(plan) for _, _, seq in moe]  # the tokens the rank dispatches
    if plan.ep > 1:
        sent = sum(px.exchange_bytes(pair * d.hidden * d.act_bytes * n, plan.ep, share, 1 + back + again.dispatch,
                                     1 + back + again.combine)
                   + px.exchange_bytes(pair * d.prob_bytes * n, plan.ep, share, 1 + again.dispatch, back)
                   for (share, again, _), n in zip(moe, own))  # the vectors; their probabilities, with them
        out.append(Collective("all_to_all", "ep", m * sent))
    if px.counts_gathered(plan, report.moe.experts):
        out.append(Collective("all_gather", "tp_ep", m * px.counts_gathered(plan, report.moe.experts) * sum(
            1 + again.dispatch for _, again, _ in moe)))
    # the pairs received gathered over expert-TP with their probabilities (reduce-scattered back in the
    # backward) and the outputs reduce-scattered in the probabilities' dtype (gathered back)
    ins = [(px.expert_tp_gathered(plan, pair * (d.hidden * d.act_bytes + d.prob_bytes) * n, share),
            px.expert_tp_gathered(plan, pair * d.hidden * d.prob_bytes * n, share), again)
           for (share, again, _), n in zip(moe, own)]
    if any(g for g, _, _ in ins):
        out.append(Collective("all_gather", "etp", m * sum((1 + again.dispatch) * g + back * o
                                                           for g, o, again in ins)))
        out.append(Collective("reduce_scatter", "etp", m * sum((1 + again.combine) * o + back * g
                                                               for g, o, again in ins)))
    return out


#: Per layer, the forward's TP reductions and gathers a recompute policy does not run again, of one per block:
#: (all_reduce without sp; all_gather and reduce_scatter with sp). ``non-reentrant`` stops before the layer's last
#: product (the reduction after it).
_RERUN_TP = {"full": (0, 0, 0), "non-reentrant": (1, 0, 1)}


def _communication(layout: Layout, report: Any, per_stage: int, train: bool, has_loss: bool,
                   skipped: tuple[int, int, int] | None):
    """Per stage: the collectives of one rank of that stage per optimizer step (the module's closed forms);
    ``skipped``: of the recompute's rerun, the TP collectives per layer it does not run again (:data:`_RERUN_TP`;
    None: no rerun)."""
    plan, d = layout.plan, layout.dims
    t, p, m = plan.tp, plan.pp, plan.microbatches
    tokens = d.batch * (d.seq // plan.cp)  # a CP rank's tokens
    a = tokens * d.hidden * d.act_bytes
    held = param_groups(report, layout)
    out = []
    for s in range(p):
        c: dict[tuple[str, str], int] = {}

        def add(kind: str, group: str, n: int) -> None:
            if n:
                c[(kind, group)] = c.get((kind, group), 0) + n

        first, last = s == 0, s == p - 1
        calls = tp_calls(layout, s, train, has_loss, skipped, held[s]["sequence"] * d.param_bytes) if t > 1 else ()
        for x in calls:
            add(x.kind, "tp", x.bytes * x.count)
        if t > 1 and layout.kv_group > 1 and train:  # each copy's dWk, dWv summed over the copies, once a step
            add("all_reduce", "tp_kv", held[s]["kv"] * d.param_bytes)
        if p > 1:
            act = a // t if plan.sp else a
            v = layout.virtual  # each of the rank's chunks sends on, but the model's last; and back, but its first
            add("send_recv", "pp", m * (layout.sent(s, train) if layout.messages else  # an encoder-decoder's
                                        act * (v - last) + (act * (v - first) if train else 0)))
            if train and (first or last):  # a tied embedding's two copies, on the first and the last stage
                add("all_reduce", "embedding", layout.tied // t * d.param_bytes)
        if train:
            grp = "dp_cp" if plan.cp > 1 else "dp"
            b, h = d.param_bytes, held[s]
            dense, experts, root = h["dense"] * b, h["expert"] * b, h["root"] * b
            if plan.fsdp:  # FSDP2 gathers and reduce-scatters each parameter padded
                dense, experts = dense + h["padding"] * b, experts + h["expert_padding"] * b
            if plan.ep == 1:
                dense, experts = dense + experts, 0
            for group, g, kept in ((grp, dense, root), ("edp", experts, 0)):
                if plan.group_ranks(group) > 1:
                    _data_parallel(plan, add, group, g, kept)
        out.append(tuple(Collective(k, grp, n, tuple(x for x in calls if x.kind == k) if grp == "tp" else ())
                         for (k, grp), n in c.items()))
    return out


def _data_parallel(plan: ParallelPlan, add, group: str, g: int, root: int = 0) -> None:
    """The gradient collectives of ``g`` bytes of gradients over a data-parallel ``group``, per optimizer step;
    ``root``: the part of ``g`` that the root module holds (outside the layers), which fsdp gathers once a
    microbatch (FSDP2 keeps the root's parameters from its forward to its backward)."""
    m = plan.microbatches
    if plan.fsdp:
        add("all_gather", group, m * (2 * g - root))
        add("reduce_scatter", group, m * g)  # every microbatch, as FSDP2 by default
    elif plan.zero2:
        add("reduce_scatter", group, m * g)  # every microbatch, as fsdp
        add("all_gather", group, g)  # the updated parameters, once a step
    else:
        add("all_reduce", group, g)
        if plan.zero1:
            add("all_gather", group, g)


def param_groups(report: Any, layout: Layout) -> list[dict[str, int]]:
    """Per stage, the parameter elements one of its TP ranks holds, by the group their gradients are reduced on:
    ``dense`` (over DP), ``expert`` (a routed expert's, over its expert data-parallel group), and among the dense,
    ``sequence`` (whole on every TP rank but partial under sp: the norms, a row-parallel projection's bias, MLA's
    down projections, the routers) and
    ``kv`` (a K/V head copied on T/kv ranks); under fsdp, the elements FSDP2's padding adds to the dense and the
    expert ones gathered (``padding``, ``expert_padding``) and the dense ones of the root module, outside the
    layers, with their padding (``root``)."""
    from . import optimizer as po

    keys = ("dense", "expert", "sequence", "kv", "padding", "expert_padding", "root")
    out = [dict.fromkeys(keys, 0) for _ in range(layout.plan.pp)]
    for (s, kind), n in layout.padding.items():
        out[s]["expert_padding" if kind == "expert" else "padding"] += n
        out[s]["root"] += n if kind == "root" else 0
    for s, rows in layout.stage_params(report.modules.params).items():
        for (share, n, layered), times in po.module_kinds(rows, layout):
            x = layout.elements(share, n, 0)[0]
            if share.role == "expert":
                out[s]["expert"] += x // layout.plan.ep * times
                continue
            out[s]["dense"] += x * times
            if not layered:
                out[s]["root"] += x * times
            if share.role in ("sequence", "latent", "router"):  # on the rank's tokens under sp
                out[s]["sequence"] += x * times
            elif share.role == "row":
                out[s]["sequence"] += share.whole * times
            elif share.role in ("kv", "kv_heads") and layout.kv_group > 1:
                out[s]["kv"] += x * times
    return out


def rank_params(report: Any, layout: Layout) -> list[int]:
    """Parameter elements one TP rank of each stage holds (:meth:`flopcount.parallel.layout.Layout.elements`; a
    routed expert's, 1/E of them over EP)."""
    return [x["dense"] + x["expert"] for x in param_groups(report, layout)]


#: Columns of :func:`rank_rows` (the text report's table by rank).
RANK_HEADERS = ("ranks", "tp", "pp", "dp", "model FLOPs", "hardware FLOPs", "redundant FLOPs", "recompute FLOPs",
                "optimizer FLOPs", "communication bytes")


def rank_classes(led: ParallelLedger) -> list[tuple[RankFlops, ...]]:
    """The ledger's ranks by (stage, TP rank), those with the same figures together (DP replicas; under cp or ep,
    those of the same CP and EP rank and load), in the order of their first rank."""
    groups: dict[tuple, list[RankFlops]] = {}
    for r in led.ranks:
        key = (r.stage, r.coords["tp"], r.coords["cp"], r.coords["ep"], r.model_flops, r.hardware_flops,
               r.recompute_flops, r.optimizer_flops, r.optimizer_redundant_flops, r.communication)
        groups.setdefault(key, []).append(r)
    return sorted((tuple(rs) for rs in groups.values()), key=lambda rs: rs[0].rank)


def dp_span(rs: Sequence[RankFlops]) -> str:
    """The DP coordinates of ranks ``rs``: ``0-3`` where consecutive, else listed."""
    dps = sorted({x.coords["dp"] for x in rs})
    return f"{dps[0]}-{dps[-1]}" if dps == list(range(dps[0], dps[-1] + 1)) and len(dps) > 1 else \
        ",".join(map(str, dps))


def rank_rows(led: ParallelLedger) -> list[list[str]]:
    """One row per class of :func:`rank_classes`, per optimizer step, its ranks listed in the first column."""
    rows = []
    for rs in rank_classes(led):
        r = rs[0]
        comm = ", ".join(f"{c.kind}({c.group}) {c.bytes:,}" for c in r.communication) or "-"
        rows.append([",".join(str(x.rank) for x in rs), str(r.coords["tp"]), str(r.stage), dp_span(rs),
                     f"{r.model_flops:,}", f"{r.hardware_flops:,}", f"{r.redundant_flops:,}",
                     f"{r.recompute_flops:,}", _optimizer_cell(r), comm])
    return rows


def _optimizer_cell(r: RankFlops) -> str:
    if r.optimizer_flops is None:
        return "-"
    return f"{r.optimizer_flops:,}" + (f" ({r.optimizer_redundant_flops:,} redundant)"
                                       if r.optimizer_redundant_flops else "")


def summary_line(led: ParallelLedger) -> str:
    """The ledger's one-line summary under its table."""
    if led.generation is not None:
        g = led.generation
        return (f"Parallel ({led.plan}, generate {g['prompt_tokens']}:{g['new_tokens']}): the whole generation of "
                f"{led.plan.microbatches} microbatch{'es' if led.plan.microbatches > 1 else ''} of batch {g['batch']} "
                f"per DP rank; whole model {g['prefill_flops']:,} FLOPs prefill + {g['decode_flops']:,} decode a "
                f"microbatch; bubble {led.bubble_fraction:.4f}; slowest rank {led.slowest_rank}, imbalance "
                f"{led.imbalance:.4f} (max/mean hardware FLOPs); {led.kv_rule}"
                + (f"; expert load {led.expert_load}" if led.expert_load else ""))
    return (f"Parallel ({led.plan}, recompute {led.recompute}, {led.mode}): per optimizer step of "
            f"{led.plan.microbatches} microbatch{'es' if led.plan.microbatches > 1 else ''} per DP rank; whole model "
            f"{led.whole_flops:,} FLOPs a microbatch; bubble {led.bubble_fraction:.4f}; slowest rank "
            f"{led.slowest_rank}, imbalance {led.imbalance:.4f} (max/mean hardware FLOPs); {led.kv_rule}"
            + (f"; expert load {led.expert_load}" if led.expert_load else "")
            + (f"; optimizer {led.optimizer} {led.whole_optimizer_flops:,} FLOPs a step (whole model)"
               if led.optimizer else f"; optimizer FLOPs: {led.optimizer_note}"))
