"""Tensor and expert parallelism of Switch Transformers' MoE layers on 4 real gloo ranks at ``tp=2,dp=2,ep=2`` (rank =
tp + 2·dp; EP rank = dp; the EP groups {0, 2} and {1, 3} join the ranks of one TP rank). Each rank runs transformers'
own model (same weights everywhere) on its data-parallel rank's batch, its MoE layers as test_parallel_gloo_switch
runs them (the router the model's own, its EP rank's 2 of the 4 experts, the tokens moved by ``all_to_all_single``
within its EP group, the counts gathered over the 4 ranks of the tensor- and expert-parallel group), each kept expert
split over TP as a dense MLP (``wi`` column-parallel, ``wo`` row-parallel: 1/T of every expert's work), the gradient
of the pairs received all-reduced over TP and the experts' partial outputs before they are weighed by their
probabilities (sent with the tokens) and sent back. Without ``sp`` every TP rank holds the whole sequence, so it
routes and dispatches all of its tokens; the router runs whole on every TP rank. In training the auxiliary loss's
counts (int64) are all-reduced over the TP group (``tp_cp``), as the ledger lists them.

The layers outside the MoE blocks run whole (unsplit) here: the comparison is of the MoE blocks, whose
``FlopCounterMode`` counts (forward and backward, by module) on each rank equal the ledger's shares of the blocks'
products on that rank (the rest of the report made free), and whose collectives in groups ``ep``, ``tp_ep`` and
``tp_cp`` equal the ledger's; their TP all-reduces equal the closed form: the pairs its experts ran × h × 4 in the
forward and again in the backward (the ledger's TP rules reduce a block's own tokens instead, as a dense MLP's:
equal when the load is balanced)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import pytest
from gloo_shards import Recorder, ledger_bytes, tp_ep_groups
from helpers import gloo_ranks
from test_parallel_gloo_switch import (
    EP,
    MOE_TOKENS,
    SD,
    SE,
    B,
    E,
    H,
    batch,
    config,
    expert_parallel,
    step,
)

from flopcount.parallel.experts import ExpertLoad, moe_blocks
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

TP, DP = 2, 2
WORLD = TP * DP
F32 = 4


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    tp, dp = rank % TP, rank // TP
    tp_group, ep_group = tp_ep_groups(TP, DP)
    moved: Counter = Counter()
    rec, counts_rec = Recorder(ep_group, "ep", moved), Recorder(None, "tp_ep", moved)
    tp_rec, aux = Recorder(tp_group, "tp", moved), Recorder(tp_group, "tp_cp", moved)
    torch.manual_seed(0)
    model = transformers.SwitchTransformersModel(config()).train()
    counts: list = []
    expert_parallel(model, dp % EP, None, rec, counts_rec, counts, (tp, TP, tp_rec))

    def summed(_module, _args, out) -> None:  # the router's counts per expert (its one-hot choices), int64
        aux.all_reduce(out[0].sum((0, 1)).to(torch.int64))

    for module in model.modules():  # the auxiliary loss's counts summed over TP in each MoE layer's forward
        if type(module).__name__ == "SwitchTransformersTop1Router":
            module.register_forward_hook(summed)
    ids, dec = batch(1 + dp)  # each data-parallel rank its own batch, the same on its TP ranks
    with FlopCounterMode(display=False) as counter:
        step(model, ids, dec)
    moe = {m for m, ops in counter.get_flop_counts().items() if m.endswith(".mlp")
           and any(k.startswith(m + ".router") for k in counter.get_flop_counts())}
    flops = sum(sum(counter.get_flop_counts()[m].values()) for m in moe)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": flops, "bytes": {f"{k}({g})": b for (k, g), b in moved.items()}, "counts": counts}, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def report():
    import flopcount

    inputs = {"input_ids": (B, SE), "attention_mask": (B, SE), "decoder_input_ids": (B, SD)}
    return flopcount.from_hf(config(), inputs, cache_dir=False, mode="train", optimizer="sgd")


def moe_products(report):
    """``report`` with every node but the products inside its routed MoE blocks made free."""
    blocks = moe_blocks(report.modules.nodes)

    def kept(n, scopes):
        return n.family in ("matmul", "gemm") and any(s == b or s.startswith(b + ".") for s in scopes for b in blocks)

    def free(n):
        return n._replace(cost=n.cost._replace(flops=0), backward=n.backward._replace(flops=0))

    return dataclasses.replace(report, nodes=tuple(n if kept(n, sc) else free(n)
                                                   for n, sc in zip(report.nodes, report.modules.nodes)))


def test_tp_ep_moe_layers_on_gloo_equal_the_ledger(report, tmp_path):
    seen = gloo_ranks(_worker, tmp_path, world=WORLD)
    for r in seen:  # top-1, nothing dropped: each rank routes each of its tokens once per MoE layer
        assert [sum(c) for c in r["counts"]] == list(MOE_TOKENS)
    for i in range(DP):  # the TP ranks of a data-parallel rank route the same tokens
        assert seen[i * TP]["counts"] == seen[i * TP + 1]["counts"]
    load = ExpertLoad([[sum(x) for x in zip(*layer)] for layer in zip(*(seen[d * TP]["counts"] for d in range(DP)))])
    p = parse_parallel(f"tp={TP},dp={DP},ep={EP}")
    led = ledger(report, p, expert_load=load)
    flops = ledger(moe_products(report), p, expert_load=load)
    groups = ("ep", "tp_ep", "tp_cp")
    for rank, r in enumerate(seen):
        tp, dp = rank % TP, rank // TP
        assert led.ranks[rank].coords == {"tp": tp, "pp": 0, "cp": 0, "ep": dp, "dp": dp}
        assert r["flops"] == flops.ranks[rank].hardware_flops
        received = [sum(layer[e] for e in range(dp * E // EP, (dp + 1) * E // EP)) for layer in load.per_layer]
        mine = {k: b for g in groups for k, b in ledger_bytes(led.ranks[rank], g).items()}
        assert {k: b for k, b in r["bytes"].items() if not k.endswith("(tp)")} == mine == {
            # per MoE layer, forward and backward: its own tokens out and back, its experts' pairs in and back; its
            # tokens' probabilities out, and the gradient of those its experts received back
            "all_to_all(ep)": sum(2 * (t + n) * H * F32 + (t + n) * F32 for t, n in zip(MOE_TOKENS, received)),
            "all_gather(tp_ep)": 2 * TP * EP * E * 8,  # each MoE layer's counts of the 4 ranks, int64
            "all_reduce(tp_cp)": 2 * E * 8}  # each MoE layer's counts summed over TP, once (no recompute)
        # each MoE layer's experts' partial outputs summed over TP, and the gradient of the pairs they received
        assert r["bytes"]["all_reduce(tp)"] == sum(2 * n * H * F32 for n in received)
