"""Tensor, sequence and expert parallelism of an MoE on 4 real gloo ranks: a tiny Mixtral (4 routed experts, 2 per
token, no shared expert) at ``tp=2,sp=megatron,dp=2,ep=2`` (rank = tp + 2·dp; EP rank = dp: the EP groups {0, 2} and
{1, 3} join the ranks of one TP rank; the TP groups {0, 1} and {2, 3}), written with Megatron-style local shards.
Attention and the LM head as in test_parallel_gloo_sp_moe (gloo_shards' ``megatron_moe_model``). The MoE block as
Megatron-Core's router and all-to-all token dispatcher run it under TP with sp (``MoEAlltoAllTokenDispatcher``): the
router on the rank's S/T tokens; the counts of its pairs per expert (int64) gathered over the tensor- and
expert-parallel group (the 4 ranks) and, for the auxiliary loss, summed over the TP group; its own pairs and their
probabilities sent by ``all_to_all_single`` within its EP group; the pairs received and their probabilities
all-gathered over the expert-tensor-parallel group (its TP group: ``gather_from_sequence_parallel_region``, the
gradient reduce-scattered); each expert split over TP (gate and up column-parallel, down row-parallel) on all the
gathered pairs, the probabilities applied there; the outputs reduce-scattered over that group (the gradient
all-gathered) and sent back. The routing is fixed and uneven, the same on every rank: each of a rank's 8 tokens goes
to expert 0 and to one of experts 1-3 in turn (8, 3, 3, 2 pairs), so EP rank 0 (experts 0, 1) receives 11 pairs from
each EP rank and EP rank 1 (experts 2, 3) 5, given to the ledger as ``--expert-load``. Each rank's
``FlopCounterMode`` total, the bytes it hands to each collective by group (``tp``, ``etp``, ``ep``, ``tp_ep``,
``tp_cp``) and the calls by phase the step-time predictor prices equal the ledger's, and the memory ledger's
``all_to_all`` buffers are those the rank hands that collective; run again with each layer under a non-reentrant
checkpoint, its bytes equal the ledger's under ``--recompute non-reentrant``. Run again with the MoE block as
Megatron-Core's all-gather token dispatcher runs it under TP with sp and EP (``MoEAllGatherTokenDispatcher``,
``--token-dispatcher allgather``): the routing map (a byte an entry, no grad), the probabilities and the hidden
states of the rank's S/T tokens all-gathered over ``tp_ep`` (the 4 ranks; the gradients of the last two
reduce-scattered), each rank's experts split over TP on the pairs of the gathered tokens routed to them, the outputs
reduce-scattered over ``tp_ep`` (the gradient all-gathered): no ``all_to_all``, no counts gathered, nothing over
``etp``; the same FLOPs."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
from gloo_shards import (
    HEADS,
    KV,
    B,
    H,
    L,
    Recorder,
    S,
    V,
    ledger_bytes,
    megatron_moe_model,
    phased,
    predicted_calls,
    recorded,
    tp_ep_groups,
)
from helpers import gloo_ranks, mixtral_config, products_only
from test_parallel_gloo_sp import megatron_column

from flopcount.memory.ranks import per_rank
from flopcount.parallel.experts import ExpertLoad
from flopcount.parallel.plan import parse_parallel, parse_recompute
from flopcount.parallel.ranks import ledger

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

E, K, I = 4, 2, 24
TP = DP = EP = 2
PER = E // EP  # experts an EP rank holds
OWN = B * S // TP  # the tokens a rank routes
PLAN = "tp=2,sp=megatron,dp=2,ep=2"
GROUPS = ("tp", "etp", "ep", "tp_ep", "tp_cp")


def route() -> list[tuple[int, int]]:
    """The 2 experts of each of a rank's tokens: expert 0 and one of experts 1-3 in turn."""
    return [(0, 1 + t % 3) for t in range(OWN)]


def load() -> list[int]:
    """The pairs each expert receives from each rank (8, 3, 3, 2)."""
    return [sum(e in chosen for chosen in route()) for e in range(E)]


def mixtral(tp: int, dp: int, recs: dict, rerun: bool = False, allgather: bool = False):
    """The model on TP rank ``tp`` and EP rank ``dp`` under ``sp=megatron``; ``recs``: the recorders by group;
    ``rerun``: each layer under a non-reentrant checkpoint (``--recompute non-reentrant``); ``allgather``: the MoE
    block under the all-gather dispatcher."""
    nn, dist = torch.nn, torch.distributed
    rec, ep, etp = recs["tp"], recs["ep"], recs["etp"]
    mine = list(range(dp * PER, (dp + 1) * PER))
    pairs = sorted((x, tok) for tok, chosen in enumerate(route()) for x in chosen)  # by expert
    tokens, experts = torch.tensor([tok for _, tok in pairs]), torch.tensor([x for x, _ in pairs])
    local = torch.zeros(OWN, E, dtype=torch.bool)
    local[tokens, experts] = True

    def counts_gathered(counts):  # every rank's counts per expert, over the 4 ranks of tp_ep (rank = tp + 2·dp)
        out = counts.new_empty(TP * EP * E)
        recs["tp_ep"].note("all_gather", out)
        dist.all_gather_into_tensor(out, counts)
        return out.view(EP, TP, E)[:, tp]  # what each rank of the EP group sends to each expert

    def all_gathered(flat, probs, gate_up, down):  # the all-gather dispatcher over the 4 ranks of tp_ep
        group = recs["tp_ep"]
        with torch.no_grad():
            routes = local.to(torch.uint8)  # the boolean routing map, a byte an entry
            whole = routes.new_empty(TP * EP * OWN, E)
            group.note("all_gather", whole)
            dist.all_gather_into_tensor(whole, routes)
        p, x = group.gather(probs[None])[0], group.gather(flat[None])[0]  # every rank's tokens, in rank order
        out = torch.zeros(len(x), H)
        for j, e in enumerate(mine):
            rows = whole[:, e].nonzero()[:, 0]  # the gathered tokens routed to expert e
            g, u = (x[rows] @ gate_up[j].T).chunk(2, -1)
            out = out.index_add(0, rows, (nn.functional.silu(g) * u * p[rows, e][:, None]) @ down[j].T)
        return group.scatter(out[None])[0]  # summed over TP and EP, each rank keeping its own tokens

    class Moe(nn.Module):
        def __init__(self, split):
            super().__init__()
            self.gate = nn.Linear(H, E, bias=False)  # whole on every rank
            gate, up, down = torch.randn(E, I, H) * 0.1, torch.randn(E, I, H) * 0.1, torch.randn(E, H, I) * 0.1
            self.gate_up = nn.Parameter(torch.cat([split(gate[mine], 1), split(up[mine], 1)], 1))  # column
            self.down = split(down[mine], 2)  # row-parallel

        def forward(self, y):  # y: the rank's tokens (B, S/T, H)
            flat = y.reshape(OWN, H)
            probs = torch.softmax(self.gate(flat), -1)  # the router on the rank's tokens
            counts = local.sum(0)  # int64
            recs["tp_cp"].all_reduce(counts)  # the auxiliary loss's counts over the split sequence
            if allgather:
                return all_gathered(flat, probs, self.gate_up, self.down).view(B, S // TP, H)
            every = counts_gathered(counts)
            sent = [int(counts[r * PER:(r + 1) * PER].sum()) for r in range(EP)]
            got = [int(every[r, mine].sum()) for r in range(EP)]
            came = torch.cat([torch.repeat_interleave(torch.tensor(mine), every[r, mine]) for r in range(EP)])
            x = etp.gather(ep.exchange(flat[tokens], sent, got)[None])[0]  # the TP group's pairs received
            w = etp.gather(ep.exchange(probs[tokens, experts][:, None], sent, got)[None])[0]
            came = came.repeat(TP)  # the same routes on every TP rank
            out = torch.zeros(len(came), H)
            for j, e in enumerate(mine):
                rows = (came == e).nonzero()[:, 0]
                g, u = (x[rows] @ self.gate_up[j].T).chunk(2, -1)
                out = out.index_put((rows,), (nn.functional.silu(g) * u * w[rows]) @ self.down[j].T)
            done = ep.exchange(etp.scatter(out[None])[0], got, sent)  # summed over TP, back to the senders
            return torch.zeros(OWN, H).index_add(0, tokens, done).view(B, S // TP, H)

    return megatron_moe_model(TP, tp, rec, megatron_column(rec), Moe, rerun)


def _step(tp: int, dp: int, groups: dict, rerun: bool, allgather: bool = False) -> dict:
    """One training step of the model on this rank: its FLOPs, the bytes it hands each collective by group and its
    calls by phase."""
    from torch.utils.flop_counter import FlopCounterMode

    moved: Counter = Counter()
    recs = {name: Recorder(group, name, moved) for name, group in groups.items()}
    model = mixtral(tp, dp, recs, rerun, allgather)
    torch.manual_seed(1 + dp)  # each data-parallel rank its own batch
    ids = torch.randint(0, V, (B, S))
    with FlopCounterMode(display=False) as counter:
        loss = model(ids)
        forward = {name: len(r.calls) for name, r in recs.items()}
        loss.backward()
    backward = {name: len(r.calls) for name, r in recs.items()}
    partial = [p.grad for name, p in model.named_parameters() if "norm" in name or name.endswith("mlp.gate.weight")]
    flat = recs["tp"].all_reduce(torch.cat([g.reshape(-1) for g in partial]))  # one flattened call, as Megatron
    for g, part in zip(partial, flat.split([g.numel() for g in partial])):
        g.copy_(part.view_as(g))
    return {"flops": counter.get_total_flops(), "bytes": {f"{k}({g})": b for (k, g), b in moved.items()},
            "calls": {name: phased(r.calls, forward[name], backward[name]) for name, r in recs.items()}}


def _worker(rank: int, world: int, init: str, out: str, allgather: bool = False) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    tp, dp = rank % TP, rank // TP
    tp_group, ep_group = tp_ep_groups(TP, DP)
    groups = {"tp": tp_group, "etp": tp_group, "tp_cp": tp_group, "ep": ep_group, "tp_ep": None}
    seen = {policy: _step(tp, dp, groups, policy != "none", allgather) for policy in ("none", "non-reentrant")}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def report():
    import flopcount
    from flopcount.memory.ledger import MemorySettings

    return flopcount.from_hf(mixtral_config(H, I, L, HEADS, KV, V, E, K), (B, S), cache_dir=False, mode="train",
                             memory=MemorySettings(device="cpu"))


def _predicted(report, led, rank: int, sized: bool = False) -> Counter:
    """The step-time predictor's calls of ``rank`` outside ``tp``, (kind, group, phase) → count (``sized``: and
    each call's bytes)."""
    from flopcount.measure.predict_report import report_work

    work = report_work(dataclasses.replace(report, parallel=led))
    found: Counter = Counter()
    for m in work.ranks[rank].messages:
        if m.group in GROUPS and m.group != "tp":
            found[(m.kind, m.group, m.phase) + ((m.bytes,) if sized else ())] += m.count
    return found


def test_tp_sp_ep_moe_on_gloo_equals_the_ledger(report, tmp_path):
    """Plain, and with each layer under a non-reentrant checkpoint, whose rerun runs to the layer's last saved
    tensor (the combine's index, after the experts): attention's gather and reduce-scatter again (the layer ends in
    the dispatched MoE block, whose reduction is no TP one), the counts, the dispatch with the etp gathers, the
    combine with the etp reduce-scatter, the auxiliary loss's counts (autograd records in both passes)."""
    seen = gloo_ranks(_worker, tmp_path, world=TP * DP)
    expert_load = ExpertLoad([load()])
    p = parse_parallel(PLAN)
    led = ledger(report, p, expert_load=expert_load)
    again = ledger(report, p, parse_recompute("non-reentrant"), expert_load)
    flops = ledger(products_only(report), p, expert_load=expert_load)
    flops_again = ledger(products_only(report), p, parse_recompute("non-reentrant"), expert_load)
    mem = {x: r for r in per_rank(report, p, expert_load).ranks for x in r.replicas}
    a = B * S * H * 4  # one activation, fp32
    own = OWN * K  # the pairs a rank dispatches
    for rank, both in enumerate(seen):
        r, rerun = both["none"], both["non-reentrant"]
        tp, dp = rank % TP, rank // TP
        assert led.ranks[rank].coords == {"tp": tp, "pp": 0, "cp": 0, "ep": dp, "dp": dp}
        assert r["flops"] == flops.ranks[rank].hardware_flops
        assert rerun["flops"] == flops_again.ranks[rank].hardware_flops  # each layer's products again
        got = EP * sum(load()[e] for e in range(dp * PER, (dp + 1) * PER))  # the pairs its experts receive
        gathered = TP * got  # and its TP group's, gathered
        listed = {k: b for g in GROUPS for k, b in ledger_bytes(led.ranks[rank], g).items()}
        plain = {
            # attention per layer (its input gathered, again in the backward; its output reduce-scattered), the
            # embedding's lookup and the LM head's input; no MoE block over TP
            "all_gather(tp)": 3 * L * a + 3 * a, "reduce_scatter(tp)": 2 * L * a + 2 * a,
            "all_reduce(tp)": (2 * L + 1) * H * 4 + L * E * H * 4,  # the norms' and routers' partial gradients
            # per MoE layer, forward and backward: its own pairs out and back, those its experts ran in and back,
            # its pairs' probabilities out and the gradient of those received back
            "all_to_all(ep)": L * (2 * (own + got) * H * 4 + (own + got) * 4),
            # the pairs received and their probabilities gathered (their gradients reduce-scattered), the outputs
            # reduce-scattered (their gradient gathered)
            "all_gather(etp)": L * gathered * (2 * H * 4 + 4), "reduce_scatter(etp)": L * gathered * (2 * H * 4 + 4),
            "all_gather(tp_ep)": L * TP * EP * E * 8, "all_reduce(tp_cp)": L * E * 8}
        assert r["bytes"] == listed == plain
        rerun_listed = {k: b for g in GROUPS for k, b in ledger_bytes(again.ranks[rank], g).items()}
        assert rerun["bytes"] == rerun_listed == {k: b + L * {
            "all_gather(tp)": a, "reduce_scatter(tp)": a, "all_to_all(ep)": (own + got) * H * 4 + own * 4,
            "all_gather(etp)": gathered * (H * 4 + 4), "reduce_scatter(etp)": gathered * H * 4,
            "all_gather(tp_ep)": TP * EP * E * 8, "all_reduce(tp_cp)": E * 8}.get(k, 0) for k, b in plain.items()}
        # the memory ledger's all_to_all buffers: the vectors and probabilities the rank hands it, its own pairs
        # and those its experts receive
        assert mem[rank].alltoall_bytes == (own + got) * (H + 1) * 4
        assert predicted_calls(report, PLAN, rank) == recorded({"calls": r["calls"]["tp"]})
        calls = Counter()
        for name, phases in r["calls"].items():
            for phase, made in phases.items():
                for kind, _ in made:
                    if name != "tp":
                        calls[(kind, name, phase)] += 1
        assert _predicted(report, led, rank) == calls


def test_tp_sp_ep_moe_on_gloo_under_the_all_gather_dispatcher_equals_the_ledger(report, tmp_path):
    """``--token-dispatcher allgather``: each rank's FLOPs (the same as under the all-to-all dispatcher), its bytes
    by group (per MoE layer, of the 4 ranks' 4·S/T = 2·S tokens a rank's group gathers: the routing map, the
    probabilities and the hidden states gathered and the outputs reduce-scattered, and in the backward the
    probabilities' and hidden states' gradients reduce-scattered and the outputs' gathered), the predictor's calls
    by phase and size, and the memory ledger's buffers (what it gathers and reduce-scatters). Under a non-reentrant
    checkpoint per layer the rerun gathers again with its dispatch but stops before the combine's reduce-scatter
    (the outputs are unpermuted before it; nothing after it keeps a tensor)."""
    import flopcount

    seen = gloo_ranks(_worker, tmp_path, True, world=TP * DP)
    expert_load = ExpertLoad([load()])
    p = dataclasses.replace(parse_parallel(PLAN), token_dispatcher="allgather")
    assert flopcount.CountOptions(parallel=PLAN, token_dispatcher="allgather").parallel == p
    led = ledger(report, p, expert_load=expert_load)
    flops = ledger(products_only(report), p, expert_load=expert_load)
    again = ledger(report, p, parse_recompute("non-reentrant"), expert_load)
    flops_again = ledger(products_only(report), p, parse_recompute("non-reentrant"), expert_load)
    mem = {x: r for r in per_rank(report, p, expert_load).ranks for x in r.replicas}
    a = B * S * H * 4  # one activation, fp32
    n = TP * EP * OWN  # the tokens gathered: every rank's of the tp_ep group
    for rank, both in enumerate(seen):
        r, rerun = both["none"], both["non-reentrant"]
        assert r["flops"] == flops.ranks[rank].hardware_flops
        assert rerun["flops"] == flops_again.ranks[rank].hardware_flops
        listed = {k: b for g in GROUPS for k, b in ledger_bytes(led.ranks[rank], g).items()}
        plain = {
            "all_gather(tp)": 3 * L * a + 3 * a, "reduce_scatter(tp)": 2 * L * a + 2 * a,
            "all_reduce(tp)": (2 * L + 1) * H * 4 + L * E * H * 4,
            "all_gather(tp_ep)": L * (n * E + n * E * 4 + n * H * 4 + n * H * 4),
            "reduce_scatter(tp_ep)": L * (n * H * 4 + n * E * 4 + n * H * 4), "all_reduce(tp_cp)": L * E * 8}
        assert r["bytes"] == listed == plain
        rerun_listed = {k: b for g in GROUPS for k, b in ledger_bytes(again.ranks[rank], g).items()}
        assert rerun["bytes"] == rerun_listed == {k: b + L * {  # attention's again, the dispatch's gathers again
            "all_gather(tp)": a, "reduce_scatter(tp)": a, "all_gather(tp_ep)": n * (E + E * 4 + H * 4),
            "all_reduce(tp_cp)": E * 8}.get(k, 0) for k, b in plain.items()}
        assert mem[rank].alltoall_bytes == n * (E + E * 4 + H * 4 + H * 4)
        assert predicted_calls(report, PLAN, rank) == recorded({"calls": r["calls"]["tp"]})
        calls = Counter()
        for name, phases in r["calls"].items():
            for phase, made in phases.items():
                for kind, size in made:
                    if name != "tp":
                        calls[(kind, name, phase, size)] += 1
        assert _predicted(report, led, rank, sized=True) == calls
