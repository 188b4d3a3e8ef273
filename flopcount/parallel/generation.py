"""FLOPs per rank of generation (``--generate P:N --parallel PLAN``): the prefill and the N − 1 decode steps of a
decoder under tensor, pipeline, context, expert and data parallelism, from the counted prefill graph and the decode
step's graphs that :mod:`flopcount.frontends.generate` keeps (the first and last context of each piece of steps).

Generation is inference: no backward, no optimizer step, no gradient collective, no recompute. The rules are the
training ledger's (:mod:`flopcount.parallel.ranks`), applied node by node:

* **prefill**: the prompt's forward, shared out by the ledger's per-layer-kind rules (projections and heads split
  over TP, K/V heads copied when fewer than T, vocab-parallel head, replicated norms and elementwise ops counted
  as redundant work on all but TP rank 0, position tables rebuilt on every stage); under cp each rank runs 1/C
  of its share, as the training ledger splits the sequence (2·cp must divide P);
* **decode**: a step at context c costs ``constant + c · per_position`` node by node (each node's line through
  the two exported contexts of its piece; the slopes must be whole FLOPs per position); each node's constant and
  slope are shared out by the same rules. Under cp, the one-token query cannot be split: every CP rank runs the
  token's constant work (projections, MLP, head; counted as model work on CP rank 0 and redundant work on the
  others), and the KV cache positions are split over the CP ranks, so that each runs 1/C of the per-position
  work (the scores, softmax and product with V over its part of the cache; remainders to the first ranks);
* **data**: each DP rank is a replica that generates the counted batch B of its own sequences (as in training,
  where each DP rank runs the counted batch): the global batch is B·M·dp;
* **experts** (``ep=E``; a MoE model's routed experts, :mod:`flopcount.parallel.experts`): as in training, the E
  EP ranks are drawn from the dp·C ranks of one (stage, TP rank) (:func:`~flopcount.parallel.experts.ep_coords`;
  E must divide dp·C and the R routed experts), EP rank r holding experts r·R/E .. (r+1)·R/E − 1. In each phase
  an EP group pools its members' tokens (the prefill's B·P/C prompt tokens of each member; in each decode step
  the B tokens of each, which every CP rank of a replica routes, as it runs the token's constant work) and each
  member runs the (token, expert) pairs of its experts, its share of the pooled expert work by the load
  (:func:`~flopcount.parallel.experts.ep_divide`, per MoE layer and per phase, model and redundant work each):
  balanced (1/E: its own tokens' work) or read from ``--expert-load FILE``, the training ledger's histogram of
  tokens per expert, which applies to the prefill's and the decode steps' tokens alike. Within a TP group each
  expert is split 1/T; routers are replicated over TP, shared experts split like a dense MLP, as in training;
  every node outside the routed experts is shared out as without ``ep``;
* **microbatches**: M microbatches of the counted batch per DP rank (``--microbatches``; at least pp, as for
  any pipelined plan), each generating P:N; a rank's FLOPs are M times one microbatch's.

**Encoder-decoders** (T5, BART; ``generation.encoder_decoder``): the prefill graph is the encoder over the P prompt
tokens and the decoder over its start token (its cross-attentions' K/V projections read the encoder's output), a
decode step's graph the decoder alone, its cross-attention reading K and V from the cache (graph inputs): both are
shared out by the same rules (:mod:`flopcount.parallel.roles` takes an attention over cached K and V as an
attention), under tp, pp and the data-parallel plans. Under ``pp`` the stages are the training ledger's
(:mod:`flopcount.parallel.stacks`): the model's layers in order, the encoder's then the decoder's, in P stages of
equal layers, as a pipeline split at layers runs them. The prefill runs its graph on them, each stage sending on
what crosses its boundary (the stacks' messages, forward only): the encoder's output to each stage after the
encoder's last layer up to the last one whose cross-attention reads it, the stream, the decoder's looked-up tokens
from stage 0. A decode step's graph holds the decoder's layers alone: each runs on its stage in the whole model
(``within`` of :func:`~flopcount.parallel.layout.layout_of`), the nodes before its first layer where the prefill runs
them, its cross-attention reading K and V from its stage's cache, filled in the prefill, so the encoder's output is
not sent again; a stage of encoder layers alone runs only what is rebuilt on every stage (and, on stage 0, the
decoder's token lookup, whose table it holds).

Not modelled (exit 2): ``sp`` (a decode step has one token to split over the sequence), the interleaved schedule,
an encoder-decoder's ``cp`` (the decoder runs one token a sequence in the prefill and in each decode step, which the
zigzag split of each stack's sequence cannot split, 2·cp dividing it; a split of the decoder's own and
cross-attention caches over cp instead, as a decoder-only model's decode steps split theirs, is no rule of the
training ledger's encoder-decoder plans to follow).

**Communication** for the whole generation (payload each rank hands to a collective, as in the training ledger),
with A_p = B·(P/C)·h·e the prefill's activation and A_d = B·h·e a decode step's, Lₛ the stage's layers, M the
microbatches, n = N − 1 the decode steps:

* TP: ``all_reduce`` of the activation after each attention and MLP block, and after the embedding on stage 0:
  M·((2·Lₛ + first)·A_p + n·(2·Lₛ + first)·A_d); an encoder-decoder's per each stack's stream, from the layouts of
  the prefill and of a decode step: M·B·h·e·((2·Lₑ + 1)·P + (3·L_d + 1)·(1 + n)) (the encoder's lookup and blocks
  over the prompt, the decoder's lookup and self-attention, cross-attention and MLP blocks over one token; no
  lookup term for an encoder without one, Whisper's convolutional front end, replicated); on the last stage an
  ``all_gather`` of the vocab-parallel logits of the last position, M·(1 + n)·B·V·e, to pick the next token;
* PP: ``send_recv`` of the activation to the next stage, M·(A_p + n·A_d) (all stages but the last); the last
  stage sends each new token id back to stage 0 for the next step, M·n·B·8 bytes (int64); an encoder-decoder's
  stages send the messages of the prefill's graph and of each decode step's (a step's bytes affine in its context
  through the two exported contexts of its piece: T5's position bias over the decoder's cache grows with it), one
  microbatch's each, M times: split at the decoder's first layer, M·B·h·e·(P + 1 + n) from the stage before it (the
  encoder's output and the start token's lookup, then one token's lookup a step) and the token ids back;
* CP: the prefill's ``all_gather`` of K/V as in training, M·2·B·P·max(kv/T, 1)·d·e·Lₛ; in each decode step an
  ``all_gather`` of every rank's partial attention output and its log-sum-exp over its part of the cache,
  C·B·(H/T)·(d + 1)·e per layer: M·n·Lₛ·C·B·(H/T)·(d + 1)·e;
* EP: per MoE layer of the stage, forward only (no backward: not the training ledger's ×2), an ``all_to_all``
  that dispatches the rank's tokens' k hidden vectors each (every TP rank all of its tokens: the rule without
  ``sp``, :mod:`flopcount.parallel.experts`), with their k routing probabilities (p bytes each), and
  brings back the outputs of the pairs its experts ran (E·f_r times as many, f_r its experts' fraction of the load;
  1/E balanced), the training forward's payload (:func:`~flopcount.parallel.experts.all_to_all_bytes`) for the
  prefill's and each step's tokens: M·Σ_layers (a2a(B·(P/C)·k·h·e) + n·a2a(B·k·h·e) + (B·P/C + n·B)·k·p),
  a2a(v) = v + ⌊E·v·f_r⌋ (an encoder-decoder's encoder layers route the B·P prompt tokens in the prefill alone,
  its decoder layers the B start tokens in the prefill and B in each step: :func:`_routed_tokens`); and before each
  dispatch the
  router's statistics as in training (:mod:`flopcount.parallel.experts`): an ``all_gather`` (group ``tp_ep``) of
  the R int64 token counts per expert of each of the T·E ranks in each phase that runs a MoE layer of the stage,
  M·(1 + n)·Lₛ·T·E·R·8 for a decoder (the routing runs in every forward); the auxiliary loss's ``all_reduce`` over ``tp_cp`` is training's only
  (Megatron computes it only in training with autograd recording), none here. That is the all-to-all dispatcher,
  the default under ep > 1; with ``--token-dispatcher alltoall`` under ep = 1, no ``all_to_all`` and the counts of
  the T ranks gathered where T > 1. Under ``--token-dispatcher allgather`` and ep > 1 (T = 1: without ``sp``, which
  generation does not take, the all-gather dispatcher under tp and ep is refused), per MoE layer and phase the
  routing map, probabilities and hidden states of the E ranks' tokens all-gathered over ``tp_ep`` and the outputs
  reduce-scattered there (:func:`~flopcount.parallel.experts.allgather_calls`, forward only), no ``all_to_all``
  and no counts;
* DP: nothing (replicas); with ``fsdp``, the ``all_gather`` of the rank's parameters G before each forward
  (each phase of each microbatch): M·(1 + n)·G over dp (dp_cp under cp), a routed expert's over its expert
  data-parallel group (``edp``, dp·C/E ranks; none when that is 1). ``zero1``/``zero2`` shard optimizer
  states and gradients, which generation has not: no change.

**Bubble.** Each phase (the prefill, then each decode step) runs the M microbatches forward through the P stages
(the pipeline's forward-only order, :func:`flopcount.parallel.schedules.simulate_schedule`), and the next phase waits
for the last stage's tokens (stage lengths with balanced experts, as in training). A forward-only phase of stage
lengths τₛ lasts Στₛ + (M − 1)·max τₛ; a decode step's τₛ(c) is affine in c, and the sum over the steps of its max
is exact (cut where two stages' lines cross).
``bubble_fraction`` = 1 − busy / (P × makespan) over the whole generation, with TP rank 0's FLOPs per stage;
(P − 1)/(M + P − 1) with equal stages. Serialising the phases is an upper bound on the bubble of a server that
starts a microbatch's next step while the others finish theirs.

**Reconcile.** Over all ranks, ``model_flops`` sums to M·dp times the report's generation total (prefill plus the
decode steps), ``hardware_flops`` = ``model_flops`` + ``redundant_flops`` on every rank, and the same holds for
each phase (``phases.prefill``, ``phases.decode``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from itertools import combinations, pairwise
from typing import Any

from ..cost import Cost
from ..errors import UsageError
from ..reporting.tiled import check_listable
from . import experts as px
from .plan import ParallelPlan, Recompute
from .layout import layout_of, rank_id
from .ranks import Collective, ParallelLedger, RankFlops, param_groups, plan_shares
from .schedules import Schedule, simulate_schedule

__all__ = ["check_plan", "generation_ledger", "sum_of_max"]


def _dims(d: Any, moe: Any, moe_layers: int) -> dict[str, int]:
    """The ledger's ``dims`` of a generation: the model's sizes, and its MoE layers' experts (none: 0)."""
    return {"batch": d.batch, "seq": d.seq, "hidden": d.hidden, "heads": d.heads, "kv_heads": d.kv_heads,
            "head_dim": d.head_dim, "ffn": d.ffn, "vocab": d.vocab, "layers": d.layers,
            "activation_bytes": d.act_bytes, "param_bytes": d.param_bytes, "moe_layers": moe_layers,
            "experts": moe.experts if moe_layers else 0, "top_k": moe.top_k if moe_layers else 0,
            "prob_bytes": d.prob_bytes}


def generation_ledger(report: Any, plan: ParallelPlan, expert_load: px.ExpertLoad | None = None) -> ParallelLedger:
    """The per-rank ledger of ``report.generation`` under ``plan`` (see the module's rules);
    :class:`~flopcount.errors.UsageError` (exit 2) for a plan or model that is not modelled. ``expert_load``: the
    routing histogram of a MoE model (:func:`flopcount.parallel.experts.load_expert_load`), balanced if None."""
    gen = _checked(report, plan)
    where = report.model.path or report.model.graph_name or "the model"
    base = ParallelPlan(tp=plan.tp, pp=plan.pp, cp=plan.cp, ep=plan.ep, dp=plan.dp, microbatches=plan.microbatches,
                        schedule=plan.schedule)  # the ledger's splits; cp and ep kept for their checks
    d, prefill, ex_prefill = _stage_sums(report, base, gen.prefill.flops, "prefill")
    single = ParallelPlan(tp=plan.tp, pp=plan.pp, microbatches=plan.microbatches, schedule=plan.schedule)
    reports = dict(gen.step_reports)
    within = _decoder_within(report, base, gen)
    lines = []  # per piece: (first, last, constant sums, per-position sums)
    ex_lines = []  # per piece: (first, last, constant, per-position) of the routed experts per MoE layer
    for piece in gen.pieces:
        const, slope = _node_lines(reports, piece, where, report.moe)
        _, c_sums, c_ex = _stage_sums(const, single, piece.constant.flops, f"decode constant of {piece.formula()}",
                                      within)
        _, p_sums, p_ex = _stage_sums(slope, single, piece.per_position.flops, f"decode slope of {piece.formula()}",
                                      within)
        lines.append((piece.first, piece.last, c_sums, p_sums))
        ex_lines.append((piece.first, piece.last, c_ex, p_ex))
    t, p, c_, m = plan.tp, plan.pp, plan.cp, plan.microbatches
    load = expert_load or px.ExpertLoad(None)
    moe_layers = sorted({layer for per in ex_prefill.values() for layer in per})
    load.check_layers(len(moe_layers))
    fractions = {layer: load.fractions(j, report.moe.experts, plan.ep) for j, layer in enumerate(moe_layers)}
    ranks, comms = [], {}
    for s in range(p):
        for dp in range(plan.dp):
            for cp in range(c_):
                group, ep = px.ep_coords(dp, cp, plan)
                members = px.ep_members(group, plan)
                for i in range(t):
                    pm, pr = (px.cp_split(v, c_, cp) for v in prefill[(s, i)])
                    dm = dr = 0
                    for first, last, c_sums, p_sums in lines:
                        n, sc = last - first + 1, (first + last) * (last - first + 1) // 2
                        dm += n * (c_sums[(s, i)][0] if cp == 0 else 0) + sc * px.cp_split(p_sums[(s, i)][0], c_, cp)
                        dr += n * c_sums[(s, i)][1] + sc * px.cp_split(p_sums[(s, i)][1], c_, cp)
                    for layer, share in ((x, fractions[x]) for x in ex_prefill[(s, i)]):
                        # out: the expert work of the rank's own tokens (members[ep] is this rank); in: its EP
                        # rank's part of the work the group's members pool, by the load
                        own_p = [px.cp_split(ex_prefill[(s, i)][layer], c_, q) for q in members]
                        own_m = [_decode_experts(ex_lines, (s, i), layer, c_, q, False) for q in members]
                        own_r = [_decode_experts(ex_lines, (s, i), layer, c_, q, True) for q in members]
                        got_p = px.ep_divide(own_p, share)[ep]
                        got_m = px.ep_divide(own_m, share)[ep]
                        got_x = px.ep_divide([r - mm for r, mm in zip(own_r, own_m)], share)[ep]
                        pm, pr = pm - own_p[ep] + got_p, pr - own_p[ep] + got_p
                        dm, dr = dm - own_m[ep] + got_m, dr - own_r[ep] + got_m + got_x
                    phases = {"prefill": _phase(m * pm, m * pr), "decode": _phase(m * dm, m * dr)}
                    coords = {"tp": i, "pp": s, "cp": cp, "ep": ep, "dp": dp}
                    rank = rank_id(plan, i, cp, dp, s)
                    key = (s, tuple((layer, fractions[layer][ep]) for layer in ex_prefill[(s, i)]))
                    if key not in comms:  # the same for the stage's ranks of one EP rank and load
                        comms[key] = _communication(plan, d, report, s, gen, key[1], within)
                    comm = comms[key]
                    ranks.append(RankFlops(rank, coords, s, m * (pm + dm), m * (pr + dr), m * (pr + dr - pm - dm), 0,
                                           {"model_flops": pm + dm, "hardware_flops": pr + dr,
                                            "redundant_flops": pr + dr - pm - dm, "recompute_flops": 0},
                                           comm, phases=phases))
    ranks.sort(key=lambda r: r.rank)
    slowest = max(ranks, key=lambda r: (r.hardware_flops, -r.rank))
    mean = sum(r.hardware_flops for r in ranks) / len(ranks)
    schedule = _schedule(plan, prefill, lines)
    whole = {"batch": gen.batch, "prompt_tokens": gen.prompt_tokens, "new_tokens": gen.new_tokens,
             "decode_steps": gen.steps, "prefill_flops": gen.prefill.flops, "decode_flops": gen.decode.flops,
             "total_flops": gen.total.flops}
    return ParallelLedger(
        plan, Recompute(), "generate", gen.total.flops, _dims(d, report.moe, len(moe_layers)), tuple(ranks), schedule.bubble_fraction if schedule is not None else 0.0, slowest.rank,
        slowest.hardware_flops / mean if mean else 1.0,
        layout_of(report, base).kv_rule, expert_load=load.source if moe_layers else None,
        optimizer_note="generation is inference: no optimizer step",
        generation=whole, schedule=schedule)


def _checked(report: Any, plan: ParallelPlan) -> Any:
    """``report.generation``, where ``plan`` can split it (:class:`~flopcount.errors.UsageError` otherwise)."""
    gen = report.generation
    if gen is None:
        raise UsageError("--parallel: the report has no generation; count it with --generate P:N")
    check_plan(plan, gen.encoder_decoder)
    if gen.steps and not gen.step_reports:
        raise UsageError(f"--parallel {plan} with --generate {gen.prompt_tokens}:{gen.new_tokens}: the decode steps' "
                         "graphs were not kept with this generation record (made from numbers, or a stack whose "
                         "steps did not extend); count it again with --generate, or with --repeated-layers export")
    return gen


def check_plan(plan: ParallelPlan, encoder_decoder: bool = False) -> None:
    """:class:`~flopcount.errors.UsageError` (exit 2) for the parts of ``plan`` not modelled for generation, before
    anything is counted; ``encoder_decoder``: of an encoder-decoder's generation."""
    if encoder_decoder and plan.cp > 1:
        raise UsageError(f"--parallel {plan} with --generate of an encoder-decoder: cp is not modelled for its "
                         "generation: the decoder runs one token a sequence in the prefill and in each decode step, "
                         "which the zigzag split of each stack's sequence (2·cp dividing it) cannot split, and no "
                         "rule splits the decoder's own and cross-attention caches over cp instead; give cp=1")
    if plan.sp:
        raise UsageError("--parallel sp with --generate: sp splits the sequence, and a decode step has one token; "
                         "leave out sp")
    if plan.schedule == "interleaved" and plan.pp > 1:
        raise UsageError("--schedule interleaved with --generate: not modelled for generation; give --schedule "
                         "gpipe or 1f1b")


def _phase(model: int, hardware: int) -> dict[str, int]:
    return {"model_flops": model, "hardware_flops": hardware, "redundant_flops": hardware - model}


def _stage_sums(report: Any, plan: ParallelPlan, expected: int, what: str, within: tuple[int, int] | None = None):
    """(dims, {(stage, TP rank): [model, executed] FLOPs}, {(stage, TP rank): {MoE layer: FLOPs}}) of ``report``'s
    nodes under ``plan``, the last the routed experts' part of the first (one sequence's, before EP; the MoE layers
    numbered in the whole model), after checking that its nodes add up to ``expected`` (the generation's figure): a
    count whose nodes are not all listed cannot be shared out. ``within``: an encoder-decoder's decode step, the
    decoder's layers (:func:`_decoder_within`)."""
    check_listable(report.nodes, "--parallel", "nodes, which the ledger shares out one by one,")
    listed = sum(n.cost.flops for n in report.nodes)
    if listed != expected:
        raise UsageError(f"--parallel with --generate: the {what} graph's nodes add up to {listed:,} FLOPs, not "
                         f"the {expected:,} of the count (a stack of layers extended from fewer?); FLOPs per rank "
                         "need every node listed")
    d, shares, *_ = plan_shares(report, plan, None, within)
    acc = {(s, i): [0, 0] for s in range(plan.pp) for i in range(plan.tp)}
    experts: dict[tuple[int, int], dict[int, int]] = {k: {} for k in acc}
    layer_of, first = layout_of(report, plan, within).layer, within[0] if within else 0
    for x in shares:
        a = acc[(x.stage, x.tp)]
        a[0] += x.model_forward
        a[1] += x.forward
        if x.rule == "expert":  # split over TP: model work = executed work
            per = experts[(x.stage, x.tp)]
            layer = first + layer_of[x.index]
            per[layer] = per.get(layer, 0) + x.forward
    return d, acc, experts


def _decode_experts(ex_lines: Sequence, key: tuple[int, int], layer: int, cp: int, q: int, run: bool) -> int:
    """The routed experts' decode work of MoE layer ``layer`` for the tokens of CP rank ``q`` on (stage, TP rank)
    ``key``: executed (``run``; every CP rank runs the token's constant work) or model work (the constant on CP
    rank 0 only); the per-position part split over CP as the module's rules split the cache."""
    total = 0
    for first, last, c_ex, p_ex in ex_lines:
        n, sc = last - first + 1, (first + last) * (last - first + 1) // 2
        const = c_ex[key].get(layer, 0) if run or q == 0 else 0
        total += n * const + sc * px.cp_split(p_ex[key].get(layer, 0), cp, q)
    return total


def _node_lines(reports: Mapping[int, Any], piece: Any, where: str, moe: Any = None):
    """Two copies of the decode step's report at ``piece.first`` whose node costs are each node's constant and its
    FLOPs per context position, from the exported contexts ``piece.first`` and ``piece.last``; ``moe``: the
    prefill's mixture-of-experts record (routed experts and top-k), which the steps' reports do not carry."""
    if piece.first not in reports or piece.last not in reports:
        raise UsageError(f"--parallel with --generate: the decode step at contexts {piece.first}..{piece.last} was "
                         "not kept; count it again with --generate")
    r0, r1 = reports[piece.first], reports[piece.last]
    check_listable(r0.nodes, "--parallel", "nodes, which the ledger shares out one by one,")
    check_listable(r1.nodes, "--parallel", "nodes, which the ledger shares out one by one,")
    n0, n1 = list(r0.nodes), list(r1.nodes)
    if len(n0) != len(n1) or any(a.op_type != b.op_type for a, b in zip(n0, n1)):
        raise UsageError(f"--parallel with --generate: {where}'s decode step graphs at contexts {piece.first} and "
                         f"{piece.last} differ in their nodes; FLOPs per rank of its decode steps are not modelled")
    span = piece.last - piece.first
    const, slope = [], []
    for a, b in zip(n0, n1):
        per, rest = divmod(b.cost.flops - a.cost.flops, span) if span else (0, 0)
        if rest:
            raise UsageError(f"--parallel with --generate: node {a.name!r} of the decode step grows by "
                             f"{b.cost.flops - a.cost.flops} FLOPs over {span} positions, not a whole number per "
                             "position; its share per rank is not modelled")
        const.append(a._replace(cost=Cost(flops=a.cost.flops - piece.first * per)))
        slope.append(a._replace(cost=Cost(flops=per)))
    moe = moe if moe is not None else r0.moe
    return (dataclasses.replace(r0, nodes=tuple(const), moe=moe),
            dataclasses.replace(r0, nodes=tuple(slope), moe=moe))


def _communication(plan: ParallelPlan, d: Any, report: Any, s: int, gen: Any,
                   moe: Sequence[tuple[int, tuple[int, int]]] = (), within: tuple[int, int] | None = None) -> tuple:
    """One rank of stage ``s``: its collectives over the whole generation (the module's closed forms); ``moe``:
    each MoE layer of its stage and its EP rank's (numerator, denominator) of the layer's load; ``within``: an
    encoder-decoder's decode step's layers (:func:`_decoder_within`)."""
    t, p, c_, m, n = plan.tp, plan.pp, plan.cp, plan.microbatches, gen.steps
    b, e, per_stage = gen.batch, d.act_bytes, d.layers // p
    last = s == p - 1
    a_p, a_d = b * (gen.prompt_tokens // c_) * d.hidden * e, b * d.hidden * e
    out = []
    if t > 1:
        prefill_tokens, step_tokens = _reduced_tokens(report, plan, s, gen, within)
        out.append(Collective("all_reduce", "tp", m * b * d.hidden * e * (prefill_tokens + n * step_tokens)))
        if last:
            out.append(Collective("all_gather", "tp", m * (1 + n) * b * d.vocab * e))
    if p > 1:  # the last stage sends each new token id back to stage 0
        sent = _stacks_sent(report, plan, s, gen, within) if within else 0 if last else a_p + n * a_d
        out.append(Collective("send_recv", "pp", m * (sent + (n * b * 8 if last else 0))))
    if c_ > 1:
        kv = 2 * b * gen.prompt_tokens * max(d.kv_heads // t, 1) * d.head_dim * e * per_stage
        part = n * per_stage * c_ * b * (d.heads // t) * (d.head_dim + 1) * e
        out.append(Collective("all_gather", "cp", m * (kv + part)))
    if moe and px.dispatcher(plan) == "alltoall":  # dispatch and combine, forward only, in each phase that runs it
        out.extend(_alltoall(plan, d, report, gen, moe, within))
    gathered = [(px.allgather_calls(plan, tokens, report.moe.experts, d.hidden, e, d.prob_bytes), passes)
                for layer, _ in moe for tokens, passes in zip(_routed_tokens(gen, layer, within, b, c_), (1, n))]
    if any(calls.dispatch for calls, _ in gathered):  # the all-gather dispatcher's, forward only
        out.append(Collective("all_gather", "tp_ep", m * sum(k * sum(c.dispatch) for c, k in gathered)))
        out.append(Collective("reduce_scatter", "tp_ep", m * sum(k * sum(c.combine) for c, k in gathered)))
    if plan.fsdp:  # a routed expert's parameters gathered over its expert data-parallel group, as in training
        held = param_groups(report, layout_of(report, plan))[s]
        dense = (held["dense"] + held["padding"]) * d.param_bytes  # each parameter padded, as FSDP2 gathers it
        experts = (held["expert"] + held["expert_padding"]) * d.param_bytes
        if plan.ep == 1:
            dense, experts = dense + experts, 0
        out.append(Collective("all_gather", "dp_cp" if c_ > 1 else "dp", m * (1 + n) * dense))
        if plan.dp * c_ // plan.ep > 1:
            out.append(Collective("all_gather", "edp", m * (1 + n) * experts))
    return tuple(x for x in out if x.bytes)


def _alltoall(plan: ParallelPlan, d: Any, report: Any, gen: Any, moe: Sequence[tuple[int, tuple[int, int]]],
              within: tuple[int, int] | None) -> list:
    """The all-to-all dispatcher's collectives over the whole generation (the module's rules): its ``all_to_all``
    (under ep > 1) and the router's counts gathered before each dispatch (no auxiliary loss: training only)."""
    k, n, e = report.moe.top_k, gen.steps, d.act_bytes
    vec = k * d.hidden * e  # one token's k hidden vectors
    sent = passes = 0
    for layer, share in moe:
        pre, step = _routed_tokens(gen, layer, within, gen.batch, plan.cp)
        sent += (px.all_to_all_bytes(pre * vec, plan.ep, [share]) + n * px.all_to_all_bytes(step * vec, plan.ep,
                                                                                          [share])
                 + (pre + n * step) * k * d.prob_bytes)  # its pairs' probabilities, with each dispatch
        passes += (pre > 0) + n * (step > 0)
    m = plan.microbatches
    return [Collective("all_to_all", "ep", m * sent if plan.ep > 1 else 0),
            Collective("all_gather", "tp_ep", m * passes * px.counts_gathered(plan, report.moe.experts))]


def _routed_tokens(gen: Any, layer: int, within: tuple[int, int] | None, b: int, c_: int) -> tuple[int, int]:
    """The tokens MoE layer ``layer`` routes on one rank (prefill, each decode step): a decoder's B·P/C prompt tokens
    and its B new ones; an encoder-decoder's encoder layer the B·P prompt tokens in the prefill alone (a decode step
    runs the decoder), its decoder layer the B start tokens, then the B new ones (``within``: the decoder's
    layers)."""
    if within is None:
        return b * (gen.prompt_tokens // c_), b
    return (b * gen.prompt_tokens, 0) if layer < within[0] else (b, b)


def _decoder_within(report: Any, plan: ParallelPlan, gen: Any) -> tuple[int, int] | None:
    """An encoder-decoder's decode step's layers in the whole model (:func:`~flopcount.parallel.layout.layout_of`'s
    ``within``): the decoder's, numbered after the encoder's, of the prefill's layers; None for a decoder alone."""
    if not gen.encoder_decoder:
        return None
    layout = layout_of(report, plan)
    first, layers = layout.stacks[-1][1], layout.dims.layers
    steps = {layout_of(r, ParallelPlan(tp=plan.tp)).dims.layers for _, r in gen.step_reports}
    if steps - {layers - first}:
        raise UsageError(f"--parallel {plan} with --generate: the decode step's graph holds {sorted(steps)} layers, "
                         f"not the decoder's {layers - first} of the prefill's {layers}; its stages are not known")
    return first, layers


def _stacks_sent(report: Any, plan: ParallelPlan, s: int, gen: Any, within: tuple[int, int]) -> int:
    """Bytes one TP rank of stage ``s`` sends forward over one microbatch's generation of an encoder-decoder: what
    crosses its stage boundary in the prefill and in each decode step (:mod:`flopcount.parallel.stacks`), each
    step's affine in its context through the two exported contexts of its piece."""
    out, reports = layout_of(report, plan).sent(s, False), dict(gen.step_reports)
    for piece in gen.pieces:
        a, b = (layout_of(reports[c], plan, within).sent(s, False) for c in (piece.first, piece.last))
        span = piece.last - piece.first
        per, rest = divmod(b - a, span) if span else (0, 0)
        if rest:
            raise UsageError(f"--parallel {plan} with --generate: what stage {s} sends grows by {b - a} bytes over "
                             f"{span} positions, not a whole number per position; its messages are not modelled")
        n, sc = span + 1, (piece.first + piece.last) * (span + 1) // 2
        out += n * (a - piece.first * per) + sc * per
    return out


def _reduced_tokens(report: Any, plan: ParallelPlan, s: int, gen: Any,
                    within: tuple[int, int] | None = None) -> tuple[int, int]:
    """The tokens of a sequence whose activations stage ``s``'s TP all-reduces (after each block of its layers, and
    after the vocab-parallel lookups on stage 0): in the prefill (over a CP rank's share) and in one decode step."""
    layout, first = layout_of(report, plan), s == 0
    if not gen.encoder_decoder:
        blocks = layout.stage_blocks(s)  # 2·Lₛ: attention and MLP; a Mamba 2 mixer's one more
        return (blocks + first) * (gen.prompt_tokens // plan.cp), blocks + first
    # each block of a layer reduces its stack's stream (the encoder's P tokens, the decoder's one) and each lookup
    # its tokens, read from the layouts of the prefill and of a decode step (the decoder's layers alone)
    prefill = layout.stage_tp(s)[0] + first * layout.embedded
    if not gen.step_reports:
        return prefill, 0
    step = layout_of(gen.step_reports[0][1], ParallelPlan(tp=plan.tp, pp=plan.pp, microbatches=plan.microbatches),
                     within)
    return prefill, step.stage_tp(s)[0] + first * step.embedded


def sum_of_max(lines: Sequence[tuple[int, int]], first: int, last: int) -> int:
    """Σ over c = first … last of max over ``lines`` (a, b) of a + b·c, exactly: the contexts are cut where two
    lines cross, and within each cut the same line is the highest.

    >>> sum_of_max([(10, 0), (0, 2)], 1, 10)  # 10 up to c = 5, then 2·c: 5·10 + 12 + 14 + 16 + 18 + 20
    130
    """
    cuts = {first, last + 1}
    for (a1, b1), (a2, b2) in combinations(lines, 2):
        if b1 != b2:
            x = math.floor(Fraction(a2 - a1, b1 - b2)) + 1
            if first < x <= last:
                cuts.add(x)
    edges = sorted(cuts)
    total = 0
    for lo, hi in pairwise(edges):
        a, b = max(lines, key=lambda ab: (ab[0] + ab[1] * lo, ab[1]))
        total += (hi - lo) * a + b * (lo + hi - 1) * (hi - lo) // 2
    return total


def _schedule(plan: ParallelPlan, prefill: Mapping, lines: Sequence) -> Schedule | None:
    """The pipeline over the whole generation (the module's model), TP rank 0's stage lengths: its makespan and
    each stage's busy time (no action list: the decode steps' lengths are closed forms); None without a pipeline."""
    p, m = plan.pp, plan.microbatches
    if p == 1:
        return None
    tau = [prefill[(s, 0)][1] for s in range(p)]
    makespan, busy = simulate_schedule("gpipe", p, m, tau, [0] * p)
    for first, last, c_sums, p_sums in lines:
        stages = [(c_sums[(s, 0)][1], p_sums[(s, 0)][1]) for s in range(p)]
        n, sc = last - first + 1, (first + last) * (last - first + 1) // 2
        one = [n * a + sc * b for a, b in stages]  # Σ_c τ_s(c) per stage
        makespan += sum(one) + (m - 1) * sum_of_max(stages, first, last)
        busy = [x + m * y for x, y in zip(busy, one)]
    return Schedule(makespan, tuple(busy))
