"""Context and expert parallelism in FLOPs per rank: the rules :mod:`flopcount.parallel.ranks` applies on top of its
tensor, pipeline and data-parallel shares.

**Ranks.** Megatron's order, tensor parallel fastest: rank = tp + T·(cp + C·(dp + D·pp)). Expert parallelism
makes no ranks of its own: as Megatron and DeepSpeed do, the E EP ranks are drawn from the D·C data- and
context-parallel ranks of one (stage, TP rank): with q = dp·C + cp, the rank's EP group is q // E and its EP rank
q mod E (E must divide D·C).

**Context parallelism (cp=C).** The sequence of s tokens is cut into 2C chunks of c = s/(2C) tokens; CP rank i
holds chunks i and 2C−1−i (the zigzag that balances causal attention), so 2C must divide s. Every per-token op
(projections, norms, MLP, LM head, loss) runs on s/C tokens: 1/C of its work. Attention scores: a query of chunk
a sees the keys of chunks 0..a under a causal mask, so chunk a's (query, key) pairs are a·c² + c(c+1)/2 and rank
i's two chunks give

    c²·(i + 2C−1−i) + c(c+1) = 2C·c² + c = s(s+1)/(2C),

exactly 1/C of the s(s+1)/2 pairs of the whole sequence, for every i (contiguous chunks would give rank i
(s/C)²·i + (s/C)(s/C+1)/2 instead, the last rank the most). Without a mask every rank's s/C queries meet all s
keys: 1/C again. So every node's work is split 1/C over CP (a remainder to the first CP ranks, one FLOP each).
K/V travel by **all_gather** (as Llama 3 trains; not a ring of send_recv): in each layer's forward each rank
gathers the K and V of the whole sequence, 2·b·s·kv_T·d·e bytes (kv_T the K/V heads of its TP rank, e the
activation's element bytes), once more when ``full`` or ``non-reentrant`` recompute runs the layer again, and in
the backward reduce-scatters their gradients, the same bytes. The TP, PP and DP payloads are those of s/C tokens;
gradients are all-reduced over the D·C ranks of the data- and context-parallel groups (group ``dp_cp``).

**Expert parallelism (ep=E).** A routed MoE block (scopes ``*.mlp``, ``*.block_sparse_moe``, ``*.feed_forward``
or ``*.ffn`` holding ``experts``) has R routed experts; EP rank r holds experts r·R/E .. (r+1)·R/E − 1 (E must divide R). The
nodes under ``experts`` are each (token, expert) pair's work; each EP group's ranks route their own tokens, and the
pairs go to the ranks holding their experts, so the group's expert work (the sum of its members' own shares) is
divided among its ranks in proportion to the tokens their experts receive: balanced (top-k tokens spread evenly,
1/E each) or read from ``--expert-load FILE``: JSON, a list of R token counts for all MoE layers, or a list of
such lists, one per MoE layer in order. Within a TP group the experts are split like a dense MLP (expert tensor
parallelism = T: 1/T of every expert's work). The router (``gate``) and the ops of the MoE block itself (shared
expert gate, the sum of shared and routed outputs) run whole on every TP rank: replicated (under ``sp`` on the
rank's s/T tokens). Shared experts are dense MLPs: split over TP. Per MoE layer and microbatch, each rank hands
``all_to_all`` its T·k (token, expert) hidden vectors to dispatch (T the tokens it routes: b·s_C, or its b·s_C/T
under ``sp``, :func:`routing_ranks`; k the experts per token), h·e bytes each, and with them their T·k routing
probabilities (p bytes each, below), which the rank holding the expert applies to its output; and back the outputs
of the pairs its experts ran, E·T·k·f_r of them (f_r its experts' fraction of the load; T·k balanced), h·e bytes
each; in the backward the same two again, reversed, and the gradient of the E·T·k·f_r probabilities it received
back to the ranks that routed them (:func:`exchange_bytes`, once for the vectors and once for the probabilities).

**Which dispatcher** (``--token-dispatcher``, Megatron-Core's ``--moe-token-dispatcher-type``; :func:`dispatcher`).
The ledgers run Megatron-Core's all-to-all token dispatcher (``MoEAlltoAllTokenDispatcher``, ``alltoall``) or its
all-gather dispatcher (``MoEAllGatherTokenDispatcher``, ``allgather``, Megatron-Core's own default). A plan that names
none runs ``allgather`` under ep = 1 and ``alltoall`` under ep > 1. The FLOPs per rank are the same under both (each
rank's experts run the pairs of its EP group's tokens routed to them, split over TP); what travels differs. Under
``alltoall`` (the rules above and below) the routing map stays on the rank that routed (only its counts travel,
below); the tokens and their probabilities go by ``all_to_all`` over the EP group (none under ep = 1, whose group is
the rank alone), the probabilities to be applied by the experts' rank (as Megatron-Core has applied them in the
experts' activation since its r0.13 release). Under ``allgather``, see the all-gather dispatcher below: no
``all_to_all`` and no counts gathered.

**Tensor and expert parallelism** (T > 1, E > 1). With ``sp``, which Megatron-Core requires here (its
``TransformerConfig`` refuses expert and tensor parallelism without sequence parallelism), the ledger runs the
dispatcher as Megatron-Core does: the router on the rank's s/T tokens; each TP rank dispatches the pairs of its own
b·s_C/T tokens (the T of the rules above) over its EP group (``alltoall``); the pairs it receives, n = E·T·k·f_r, and their
probabilities are all-gathered over the expert-tensor-parallel group (``etp``: the T ranks of its TP group, expert TP
being TP), the received counts as split sizes (``gather_from_sequence_parallel_region``; their gradients
reduce-scattered in the backward); the experts run split over TP on the T·n pairs gathered (1/T of their work: the
FLOPs of 1/T of each expert on the group's pairs, as above); their outputs are reduce-scattered over ``etp``
(``reduce_scatter_to_sequence_parallel_region``, in the probabilities' dtype, to which Megatron-Core casts them; their
gradient all-gathered in the backward) and sent back by ``all_to_all``. Per MoE layer and microbatch, of G = T·n pairs
(:func:`expert_tp_gathered`): ``all_gather`` G·(h·e + p) in the forward and G·h·p in the backward, ``reduce_scatter``
G·h·p in the forward and G·(h·e + p) in the backward, a rerun's dispatch gathering and its combine reduce-scattering
again. So an MoE block of routed experts alone is no TP block (nothing of it gathered or reduce-scattered over ``tp``:
:mod:`flopcount.parallel.layout`'s blocks); a shared expert keeps its own, as Megatron-Core's ``SharedExpertMLP`` (a
dense MLP under sp). Without ``sp`` the ledger keeps its own model of the plan Megatron-Core refuses: every TP rank
holds the whole sequence, routes it (the router replicated) and dispatches the pairs of all of its tokens (T times the
``all_to_all`` bytes of sp), the experts' partial outputs summed with the layer's TP block as a dense MLP's;
generation, which takes no ``sp``, runs this rule.

**Recompute.** A rerun of an MoE layer's forward in the backward (``full``, ``non-reentrant``) runs its collectives
again where it passes them: the dispatch (its ``all_to_all`` of the rank's T·k vectors and probabilities, and the
counts; the all-gather dispatcher's gathers) when it runs one of the layer's expert nodes, whose first ops read the
dispatched tokens; the combine (the ``all_to_all`` of the E·T·k·f_r outputs; the all-gather dispatcher's reduce-scatter)
when it runs a node of the layer after the experts' last product, which reads the combined outputs (the all-gather
dispatcher's, whose unpermuting precedes its reduce-scatter, when it runs a node of the layer after the MoE block:
:func:`block_ends`; so not under ``non-reentrant``, whose rerun stops before the residual add, which keeps
nothing); the router when it
runs the router's nodes. ``full`` reruns the whole layer: all three.

**The router's statistics** (Megatron-Core's ``TopKRouter`` and ``MoEAlltoAllTokenDispatcher``), R token counts
per MoE layer, int64 (8 bytes each, the sum of a boolean routing map):

* under the all-to-all dispatcher with T·E > 1, before each dispatch the rank gathers every rank's counts of the
  tensor- and expert-parallel group (T·E ranks, group ``tp_ep``) to size its all_to_all (:func:`counts_gathered`): an ``all_gather`` of T·E·R·8 bytes per MoE layer and
  forward pass, once more when the rerun dispatches again;
* in training with an auxiliary load-balancing loss (``aux_loss``, with ``--moe-aux-loss-coeff`` above 0, as the
  published MoE recipes set it), when the sequence is split over TP and CP ranks (T·C > 1), the counts are summed
  over that group (group ``tp_cp``) so that the loss sees the whole sequence: an ``all_reduce`` of R·8 bytes per
  MoE layer and microbatch. Megatron computes the loss only while autograd records (``torch.is_grad_enabled()``):
  under ``full`` (a reentrant checkpoint, whose first forward runs without grad) only in the rerun, so once; under
  ``non-reentrant`` (whose first forward and rerun both record) twice when the rerun reaches the router.

**The all-gather dispatcher** (``MoEAllGatherTokenDispatcher``; :func:`allgather_calls`). Before each dispatch the
rank's routing map (a boolean a (token, expert), 1 byte, no gradient) and its probabilities (p bytes each, below) are
all-gathered over the group ``tp_ep`` (T·E ranks), so that every rank sees the routes of the E sequences of its EP
group (s_C the CP rank's tokens of a sequence): ``all_gather`` calls of E·b·s_C·R and E·b·s_C·R·p bytes per MoE
layer and forward pass, once more when a recompute's rerun dispatches again; in the backward the probabilities'
gradient is reduce-scattered back to the rank's tokens, E·b·s_C·R·p. Under ep = 1 the hidden states are the layer's
TP block (gathered over ``tp`` before the MoE block and its output reduce-scattered there, as a dense MLP's under sp:
:mod:`flopcount.parallel.layout`); under ep > 1 they are gathered over ``tp_ep`` too (``use_global_buffer``: a third
``all_gather`` call, E·b·s_C·h·e; its gradient reduce-scattered in the backward), each rank runs its experts on the
pairs of the gathered tokens routed to them (1/T of each expert's work: the FLOPs of the all-to-all dispatcher), and
the outputs, in the probabilities' dtype to which Megatron-Core casts them, are reduce-scattered over ``tp_ep``
(E·b·s_C·h·p, once more when a rerun combines again; their gradient all-gathered in the backward): the MoE block of
routed experts alone is then no TP block. Under T > 1 this needs ``sp``, as Megatron-Core trains MoE under TP only
with it (its ``MoELayer`` refuses training otherwise): without ``sp`` every TP rank holds the whole sequence and the
gather over ``tp_ep`` would hand each expert T copies of every token; the ledger refuses that plan (generation, which
takes no ``sp``, runs ``alltoall`` there). Without ``sp`` under ep = 1 every TP rank routes the whole sequence itself:
nothing is gathered. No router counts are gathered (the all-gather dispatcher reads its local routing map); the
auxiliary loss's ``all_reduce`` over ``tp_cp`` is the router's and stays.

**The all-to-all dispatcher under ep = 1** (``--token-dispatcher alltoall`` with ep = 1): no ``all_to_all`` (an EP group
of one rank, which Megatron-Core's ``all_to_all`` passes through); under T > 1 the counts are gathered over ``tp_ep``
(T ranks) before each dispatch as above, and with ``sp`` the pairs of the rank's s/T tokens are gathered over ``etp``
and their outputs reduce-scattered there as under ep > 1 (n = T·k·f_r with f_r = 1): the MoE block of routed experts
alone is no TP block.

**The probabilities' dtype** p follows the model: the element of the routing weights its router hands on, read off
the graph as the first floating-point tensor an expert node reads that descends, in its layer, from the router's
product (:func:`prob_bytes`). transformers' routers differ: Mixtral's softmax runs on ``float()`` logits and
DeepSeek-V3's sigmoid on fp32 logits, so their weights are fp32 whatever the model's dtype; Qwen3-MoE's top-k
weights are cast back to the logits' dtype and Switch's probabilities (a softmax in ``router_dtype``) to its input's,
so theirs are the model's (2 bytes in a bf16 model). Where no expert reads such a tensor, fp32 (:data:`PROB_BYTES`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from ..errors import UsageError

__all__ = ["COUNT_BYTES", "AllGatherCalls", "ExpertLoad", "PROB_BYTES", "Rerun", "all_to_all_bytes",
           "allgather_calls", "cp_split", "dispatch_buffers", "dispatcher", "exchange_bytes", "ep_coords", "ep_divide",
           "ep_members", "expert_tp_gathered", "block_ends", "is_expert", "load_expert_load", "moe_blocks", "no_tp_block",
           "prob_bytes", "routing_gathered", "routing_ranks", "zigzag_pairs"]

_EXPERTS = re.compile(r"(.*\.(?:mlp|block_sparse_moe|feed_forward|ffn))\.experts(?:\.|$)")


def zigzag_pairs(seq: int, cp: int, rank: int) -> int:
    """Causal (query, key) pairs of CP rank ``rank`` under the zigzag split (chunks ``rank`` and 2C−1−rank of
    s/(2C) tokens), counted chunk by chunk.

    >>> [zigzag_pairs(16, 4, i) for i in range(4)], 16 * 17 // 2 // 4
    ([34, 34, 34, 34], 34)
    """
    c = seq // (2 * cp)
    return sum(a * c * c + c * (c + 1) // 2 for a in (rank, 2 * cp - 1 - rank))


def cp_split(f: int, cp: int, i: int) -> int:
    """CP rank ``i``'s part of ``f``: 1/C, the remainder to the first ranks, one each."""
    return f // cp + (1 if i < f % cp else 0)


def ep_coords(dp: int, cp: int, plan: Any) -> tuple[int, int]:
    """(EP group, EP rank) of the rank at data-parallel ``dp`` and context-parallel ``cp``."""
    q = dp * plan.cp + cp
    return q // plan.ep, q % plan.ep


def ep_members(group: int, plan: Any) -> list[int]:
    """The CP ranks of EP group ``group``'s members, in EP rank order (their q = dp·C + cp run over the group)."""
    return [q % plan.cp for q in range(group * plan.ep, (group + 1) * plan.ep)]


def routing_ranks(plan: Any) -> int:
    """The TP ranks that share out the tokens of a sequence each rank routes and dispatches (see the module's rules):
    T under ``sp`` (each TP rank its s/T tokens), else 1 (every TP rank all of its tokens).

    >>> from flopcount.parallel.plan import ParallelPlan
    >>> routing_ranks(ParallelPlan(tp=2, dp=2, ep=2, sp=True)), routing_ranks(ParallelPlan(tp=2, dp=2, ep=2))
    (2, 1)
    """
    return plan.tp if plan.sp else 1


def dispatcher(plan: Any) -> str:
    """The token dispatcher the ledgers run under ``plan`` (see the module's rules): its ``token_dispatcher``, or
    ``allgather`` under ep = 1 and ``alltoall`` under ep > 1; :class:`UsageError` for ``allgather`` under tp and ep
    without sp.

    >>> from flopcount.parallel.plan import ParallelPlan
    >>> dispatcher(ParallelPlan(dp=2, ep=2)), dispatcher(ParallelPlan(tp=2)), dispatcher(
    ...     ParallelPlan(dp=2, ep=2, token_dispatcher="allgather"))
    ('alltoall', 'allgather', 'allgather')
    """
    found = plan.token_dispatcher or ("alltoall" if plan.ep > 1 else "allgather")
    if found == "allgather" and plan.ep > 1 and plan.tp > 1 and not plan.sp:
        raise UsageError(f"--token-dispatcher allgather under tp={plan.tp} and ep={plan.ep} without sp is not "
                         "modelled: every TP rank would gather the tokens of the whole sequence over tp_ep, T copies "
                         "of each (Megatron-Core trains MoE under tp only with sp); give sp (training: generation "
                         "takes none), or --token-dispatcher alltoall")
    return found


def no_tp_block(plan: Any) -> bool:
    """Whether an MoE block of routed experts alone is no TP block under ``plan`` (see the module's rules): its tokens
    gathered and its outputs reduce-scattered by the dispatcher over ``etp`` (``alltoall`` under tp with sp) or over
    ``tp_ep`` (``allgather`` under ep > 1), not over ``tp``."""
    if dispatcher(plan) == "alltoall":
        return plan.tp > 1 and plan.sp
    return plan.ep > 1


def expert_tp_gathered(plan: Any, vec: int, share: tuple[int, int]) -> int:
    """Bytes one rank's expert-tensor-parallel group (group ``etp``, its T TP ranks) gathers of one MoE layer's
    pairs under the all-to-all dispatcher with ``sp`` (see the module's rules): each of its T ranks receives the
    pairs of its experts, E·vec·f_r (``vec`` the bytes of the pairs it dispatched, ``share`` = f_r as (numerator,
    denominator)), and the group gathers the T ranks' together; 0 where nothing is gathered (T = 1, no ``sp``,
    the all-gather dispatcher).

    >>> from flopcount.parallel.plan import ParallelPlan
    >>> expert_tp_gathered(ParallelPlan(tp=2, dp=2, ep=2, sp=True), 100, (3, 4))  # T · (E·100·3/4)
    300
    >>> expert_tp_gathered(ParallelPlan(tp=2, dp=2, ep=2), 100, (3, 4))
    0
    """
    if plan.tp == 1 or not plan.sp or dispatcher(plan) != "alltoall":
        return 0
    num, den = share
    return plan.tp * (plan.ep * vec * num // den)


def all_to_all_bytes(vec: int, ep: int, shares: Sequence[tuple[int, int]]) -> int:
    """Bytes one EP rank hands to ``all_to_all`` in one forward pass over MoE layers of ``shares`` (its EP rank's
    (numerator, denominator) of each layer's load): per layer, the ``vec`` bytes of its own (token, expert) pairs'
    hidden vectors to dispatch, and back the outputs of the pairs its experts ran, E·vec·f_r.

    >>> all_to_all_bytes(100, 2, [(1, 2), (3, 4)])  # (100 + 100) + (100 + 150)
    450
    """
    return sum(vec + ep * vec * num // den for num, den in shares)


#: Bytes of one token count of the router's statistics: int64, as the sum of a boolean routing map gives it.
COUNT_BYTES = 8


def counts_gathered(plan: Any, experts: int) -> int:
    """Bytes of the router's counts one rank all-gathers before one MoE layer's dispatch, in each forward pass that
    dispatches (training, its rerun, generation's prefill and decode steps alike): the R counts of each of the T·E
    ranks of group ``tp_ep``, int64, under the all-to-all dispatcher; 0 where it has one rank (T·E = 1) and under
    the all-gather dispatcher.

    >>> from flopcount.parallel.plan import ParallelPlan
    >>> counts_gathered(ParallelPlan(tp=2, dp=2, ep=2), 8), counts_gathered(ParallelPlan(tp=2), 8)  # 2·2·8·8
    (256, 0)
    """
    many = plan.tp * plan.ep > 1 and dispatcher(plan) == "alltoall"
    return plan.tp * plan.ep * experts * COUNT_BYTES if many else 0


#: Bytes of one routing probability where the graph shows none (no expert reads a weight of the router's): fp32.
PROB_BYTES = 4


def prob_bytes(g: Any, layer: Sequence[int | None], roles: Sequence[str], expert: Sequence[bool]) -> int:
    """Bytes of one routing probability (see the module's rules): the element of the first floating-point tensor
    an expert node reads that descends, within its layer, from a router's product; :data:`PROB_BYTES` where none
    does. ``g`` the :class:`~flopcount.parallel.roles.Graph`, per node its ``layer``, ``roles`` and ``expert``."""
    from ..reporting.report import element_bits
    from .roles import FLOATS, PRODUCTS

    nodes = g.nodes
    for k, n in enumerate(nodes):
        if roles[k] != "router" or n.family not in PRODUCTS or not g.weights(k) or layer[k] is None:
            continue
        seen, todo = set(), [x.name for x in n.outputs if x is not None and x.name]
        while todo:
            name = todo.pop(0)
            for q in g.consumers.get(name, ()):
                if q <= k or layer[q] != layer[k]:
                    continue
                if expert[q]:
                    info = g.info[name]
                    if info.elem_type in FLOATS:
                        return (element_bits(info.elem_type) or 32) // 8
                elif q not in seen:
                    seen.add(q)
                    todo.extend(x.name for x in nodes[q].outputs if x is not None and x.name)
    return PROB_BYTES


class AllGatherCalls(NamedTuple):
    """The bytes of each call one MoE layer makes over ``tp_ep`` under the all-gather dispatcher (see the module's
    rules): a dispatch's ``all_gather`` calls (the routing map, the probabilities, under ep > 1 the hidden states), a
    combine's ``reduce_scatter`` (under ep > 1 the outputs), and in the backward the dispatch's ``reduce_scatter``
    calls (the probabilities' gradient, under ep > 1 the hidden states') and the combine's ``all_gather``."""

    dispatch: tuple[int, ...] = ()
    combine: tuple[int, ...] = ()
    dispatch_grad: tuple[int, ...] = ()
    combine_grad: tuple[int, ...] = ()


def allgather_calls(plan: Any, tokens: int, experts: int, hidden: int, act: int, prob: int = PROB_BYTES
                    ) -> AllGatherCalls:
    """One MoE layer's calls over ``tp_ep`` under the all-gather dispatcher (see the module's rules): ``tokens`` the
    CP rank's tokens of the batch (b·s_C, the TP group's together), ``experts`` R, ``hidden`` h, ``act`` e (the
    bytes of an activation element), ``prob`` p (:func:`prob_bytes`); none where nothing is gathered (the
    all-to-all dispatcher, T·E = 1, T > 1 without ``sp`` under ep = 1).

    >>> from flopcount.parallel.plan import ParallelPlan
    >>> allgather_calls(ParallelPlan(tp=2, sp=True), 16, 4, 32, 2)
    AllGatherCalls(dispatch=(64, 256), combine=(), dispatch_grad=(256,), combine_grad=())
    >>> allgather_calls(ParallelPlan(dp=2, ep=2, token_dispatcher="allgather"), 16, 4, 32, 2, 4)  # E·b·s_C = 32
    AllGatherCalls(dispatch=(128, 512, 2048), combine=(4096,), dispatch_grad=(512, 2048), combine_grad=(4096,))
    """
    if dispatcher(plan) != "allgather" or plan.tp * plan.ep == 1 or plan.tp > 1 and not plan.sp:
        return AllGatherCalls()
    n = plan.ep * tokens  # the tokens of the E sequences of the EP group, each TP rank's s/T of them gathered
    if plan.ep == 1:  # the hidden states are the layer's TP block
        return AllGatherCalls((n * experts, n * experts * prob), (), (n * experts * prob,), ())
    vectors, out = n * hidden * act, n * hidden * prob  # the outputs in the probabilities' dtype
    return AllGatherCalls((n * experts, n * experts * prob, vectors), (out,), (n * experts * prob, vectors), (out,))


def routing_gathered(plan: Any, tokens: int, experts: int, prob: int = PROB_BYTES) -> tuple[int, int]:
    """(all-gathered, reduce-scattered) bytes of one MoE layer's routing map and probabilities under the all-gather
    dispatcher (:func:`allgather_calls`), per forward pass and per backward; (0, 0) where it gathers none.

    >>> from flopcount.parallel.plan import ParallelPlan
    >>> routing_gathered(ParallelPlan(tp=2, sp=True), 16, 4), routing_gathered(ParallelPlan(tp=2, sp=True), 16, 4, 2)
    ((320, 256), (192, 128))
    >>> routing_gathered(ParallelPlan(tp=2), 16, 4)
    (0, 0)
    """
    calls = allgather_calls(plan, tokens, experts, 0, 0, prob)
    return sum(calls.dispatch[:2]), sum(calls.dispatch_grad[:1])


def dispatch_buffers(plan: Any, d: Any, experts: int, top_k: int, tokens: int, share: tuple[int, int]) -> int:
    """Bytes of the buffers one rank's dispatcher holds for one MoE layer (see the module's rules), ``d`` the
    :class:`~flopcount.parallel.layout.Dims` (batch b, hidden h, act_bytes e, prob_bytes p), ``experts`` R,
    ``top_k`` k, ``tokens`` the CP rank's tokens of a sequence, ``share`` f_r: under the all-to-all dispatcher (ep
    > 1) those it hands to ``all_to_all``, its own pairs' vectors and probabilities (b·k·(h·e + p) per token it
    dispatches) and E·f_r times as many received (:func:`all_to_all_bytes`); under the all-gather dispatcher (ep >
    1) the tensors it gathers over ``tp_ep`` and the outputs it reduce-scatters there, E·b·s_C·(R·(1 + p) + h·e +
    h·p) (:func:`allgather_calls`); 0 under ep = 1.

    >>> from types import SimpleNamespace
    >>> from flopcount.parallel.plan import ParallelPlan
    >>> d = SimpleNamespace(batch=2, hidden=8, act_bytes=2, prob_bytes=4)
    >>> dispatch_buffers(ParallelPlan(dp=2, ep=2), d, 4, 2, 16, (1, 2))  # 2·(2·16·2·(16 + 4))
    2560
    >>> dispatch_buffers(ParallelPlan(dp=2, ep=2, token_dispatcher="allgather"), d, 4, 2, 16, (1, 2))  # 64·(20+16+32)
    4352
    """
    if plan.ep == 1:
        return 0
    if dispatcher(plan) == "allgather":
        calls = allgather_calls(plan, d.batch * tokens, experts, d.hidden, d.act_bytes, d.prob_bytes)
        return sum(calls.dispatch) + sum(calls.combine)
    vec = d.batch * top_k * (d.hidden * d.act_bytes + d.prob_bytes)  # a token's pairs' vectors and probabilities
    return all_to_all_bytes(vec * (tokens // routing_ranks(plan)), plan.ep, [share])


class Rerun(NamedTuple):
    """What a recompute's rerun of one MoE layer runs again (see the module's rules): its ``dispatch``, its
    ``combine``, its ``router``."""

    dispatch: bool = False
    combine: bool = False
    router: bool = False


def exchange_bytes(vec: int, ep: int, share: tuple[int, int], dispatches: int, combines: int) -> int:
    """Bytes one EP rank hands to ``all_to_all`` over one MoE layer's ``dispatches`` passes of ``vec`` bytes (its own
    pairs' vectors: a forward's dispatch, or a backward's combine) and ``combines`` passes of E·vec·f_r (the pairs
    its experts ran: a forward's combine, or a backward's dispatch), ``share`` = f_r as (numerator, denominator).
    With ``vec`` the bytes of its pairs' probabilities, ``dispatches`` counts the dispatches and ``combines`` the
    backward's return of their gradient (the combine carries none).

    >>> exchange_bytes(100, 2, (3, 4), 3, 2)  # 3·100 + 2·150
    600
    """
    num, den = share
    return dispatches * vec + combines * (ep * vec * num // den)


#: The last scopes :func:`moe_blocks` read (a tuple, by identity: a report's, which a plan search checks once a plan)
#: and their blocks.
_last_blocks: list = []


def moe_blocks(scopes: Sequence[Sequence[str]]) -> set[str]:
    """The module paths of the routed MoE blocks: the parents of ``experts`` scopes."""
    if _last_blocks and _last_blocks[0] is scopes:
        return set(_last_blocks[1])
    found = {m.group(1) for sc in scopes for s in sc for m in [_EXPERTS.match(s)] if m}
    if isinstance(scopes, tuple):  # not changed once made
        _last_blocks[:] = [scopes, frozenset(found)]
    return found


#: The last scopes :func:`block_ends` read (a tuple, by identity) and the nodes inside a routed MoE block, in order.
_last_inside: list = []


def block_ends(scopes: Sequence[Sequence[str]], layer: Sequence[int | None]) -> dict[int, int]:
    """Per layer (``layer``: each node's), the last node inside its routed MoE block (:func:`moe_blocks`): the
    all-gather dispatcher's combine reduce-scatters the block's output, after it (see the module's rules). The
    nodes inside a block read the scopes alone: found once per scopes (a tuple, by identity; a plan search asks
    once a plan, of other layouts)."""
    if _last_inside and _last_inside[0] is scopes:
        inside = _last_inside[1]
    else:
        blocks = moe_blocks(scopes)
        inside = tuple(k for k, sc in enumerate(scopes) if blocks and any(
            s[:i] in blocks for s in sc for i in [len(s)] + [j for j, ch in enumerate(s) if ch == "."]))
        if isinstance(scopes, tuple):  # not changed once made
            _last_inside[:] = [scopes, inside]
    out = {}
    for k in inside:
        if layer[k] is not None:
            out[layer[k]] = k
    return out


def is_expert(scope: Sequence[str]) -> bool:
    """Whether a node's scopes put it inside a block's routed experts."""
    return any(_EXPERTS.match(s) for s in scope)


class ExpertLoad:
    """Tokens per routed expert per MoE layer (``None``: balanced)."""

    def __init__(self, per_layer: Sequence[Sequence[float]] | None, source: str = "balanced") -> None:
        self.per_layer = [list(x) for x in per_layer] if per_layer is not None else None
        self.source = source

    def fractions(self, moe_index: int, experts: int, ep: int) -> list[tuple[int, int]]:
        """Each EP rank's (numerator, denominator) share of one MoE layer's pairs."""
        if self.per_layer is None:
            return [(1, ep)] * ep
        counts = self.per_layer[0] if len(self.per_layer) == 1 else self.per_layer[moe_index]
        if len(counts) != experts:
            raise UsageError(f"--expert-load {self.source}: {len(counts)} token counts for a layer of {experts} "
                             f"routed experts; give one count per expert")
        per = experts // ep
        scale = 10**6  # token counts may be fractions (averages); integers keep the split exact
        ints = [round(x * scale) for x in counts]
        total = sum(ints)
        return [(sum(ints[r * per:(r + 1) * per]), total) for r in range(ep)]

    def check_layers(self, moe_layers: int) -> None:
        if self.per_layer is not None and len(self.per_layer) not in (1, moe_layers):
            raise UsageError(f"--expert-load {self.source}: {len(self.per_layer)} layers of token counts for "
                             f"{moe_layers} MoE layers; give one list per MoE layer, or one list for all")


def load_expert_load(path: str | Path | None) -> ExpertLoad:
    """The routing histogram of ``--expert-load FILE`` (see the module's rules); balanced without a file."""
    if path is None:
        return ExpertLoad(None)
    name = str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"--expert-load {name}: cannot read it as JSON ({e.__class__.__name__}); give a JSON list "
                         "of token counts per expert, or a list of such lists per MoE layer") from None

    def numbers(x: Any) -> bool:
        return isinstance(x, list) and bool(x) and all(  # finite, at most 2**48 tokens (no Infinity, no 1e308)
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 2**48 for v in x) and sum(x) > 0

    if numbers(data):
        return ExpertLoad([data], name)
    if isinstance(data, list) and data and all(numbers(x) for x in data):
        return ExpertLoad(data, name)
    raise UsageError(f"--expert-load {name}: not a list of non-negative token counts per expert (finite, at most "
                     "2**48, not all zero), nor a list of such lists per MoE layer")


def ep_divide(own: Sequence[int], shares: Sequence[tuple[int, int]]) -> list[int]:
    """The expert work of one EP group's ranks: the group's total (the sum of ``own``, each member's share of its
    own tokens' pairs) divided by ``shares`` (numerator, denominator per EP rank), cumulatively so that the
    parts sum to the total exactly."""
    total = sum(own)
    out, cum, prev = [], 0, 0
    for num, den in shares:
        cum += num
        upto = total * cum // den
        out.append(upto - prev)
        prev = upto
    return out
