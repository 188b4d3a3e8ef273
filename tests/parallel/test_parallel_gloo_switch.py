"""Expert parallelism of a Switch-style encoder-decoder (transformers' SwitchTransformers: a top-1 router with a
capacity, routed experts in every other layer of the encoder and of the decoder) on 2 real gloo ranks at
``dp=2,ep=2``. Each rank runs transformers' own model (same weights on both) on its own batch, holding only its 2 of
the 4 experts of each MoE layer; its experts' forward is replaced by an expert-parallel one: the rank's token counts
per expert all-gathered over the EP group (int64, to size the exchange), each token's hidden vector sent by
``all_to_all_single`` to the rank holding its expert with its routing probability, the experts run on what arrives,
their outputs weighed there and sent back. After the step the dense gradients are all-reduced over the 2 data-parallel
ranks; each expert is held by dp·cp/ep = 1 rank, so its gradient is summed over no one. The router is the model's own,
so the load is whatever it routes: each rank records its tokens per expert and MoE layer, and the ledger is given
their sum over the EP group as ``--expert-load``. Each rank's ``FlopCounterMode`` total, the bytes it hands to each
collective and group, and its parameter bytes equal the ledger's.

The router's jitter is 0 (it multiplies the router's input by uniform noise in training: another draw on each run)
and the capacity (``expert_capacity``, per expert and sequence) is the encoder's sequence, so no token is dropped:
transformers' eager forward drops a token over capacity (it runs no expert for it), which the exported graph does not
(:mod:`flopcount.frontends.hf_experts`); :func:`test_eager_run_drops_tokens_over_capacity` shows both."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from gloo_shards import Recorder, ledger_bytes
from helpers import gloo_ranks, products_only

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.experts import ExpertLoad
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, D, HEADS, FF, V, L = 32, 8, 4, 48, 64, 2  # hidden, head dim, heads, expert/MLP width, vocabulary, layers a stack
E, EP, WORLD = 4, 2, 2  # routed experts a MoE layer, EP ranks, ranks (dp=2)
PER = E // EP
B, SE, SD = 2, 8, 6  # batch, encoder tokens, decoder tokens
MOE_TOKENS = (B * SE, B * SD)  # a rank's tokens into its encoder's MoE layer and its decoder's
F32 = 4


def config(capacity: int = SE):
    """The tiny Switch: 2 layers a stack, the second of each a MoE layer of 4 experts (sparse step 2)."""
    c = transformers.SwitchTransformersConfig(
        d_model=H, d_kv=D, d_ff=FF, num_layers=L, num_decoder_layers=L, num_heads=HEADS, vocab_size=V,
        num_experts=E, expert_capacity=capacity, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
        router_jitter_noise=0.0, dropout_rate=0.0, decoder_start_token_id=0)
    c._attn_implementation = "eager"
    return c


def batch(seed: int):
    torch.manual_seed(seed)
    return torch.randint(0, V, (B, SE)), torch.randint(0, V, (B, SD))


def step(model, ids, dec) -> None:
    out = model(input_ids=ids, decoder_input_ids=dec)
    (out.last_hidden_state.sum() + out.encoder_last_hidden_state.sum()).backward()


def expert_parallel(model, ep: int, group, rec: Recorder, counts_rec: Recorder, counts: list,
                    tp: tuple[int, int, Recorder] | None = None) -> None:
    """Keep EP rank ``ep``'s experts of each MoE layer of ``model`` and run them expert-parallel (module docstring);
    ``counts``: each MoE layer's tokens per expert on this rank, in the order the layers run; ``group`` the tensor-
    and expert-parallel group the counts are gathered over (None: the default one; its ranks in (EP, TP) order).
    ``tp``: (TP rank, T, the TP group's recorder) to split each kept expert over TP as a dense MLP is split (``wi``
    column-parallel: its rows; ``wo`` row-parallel: its columns), the gradient of the pairs received all-reduced
    over TP and the experts' partial outputs all-reduced before they are weighed and sent back."""
    import torch.distributed as dist

    mine = range(ep * PER, (ep + 1) * PER)
    tp_rank, t, tp_rec = tp or (0, 1, None)
    copy, reduce = (tp_rec.copy, tp_rec.reduce) if tp_rec is not None else (lambda x: x, lambda x: x)

    def forward(self, hidden, selected, weights):
        chosen = selected.reshape(hidden.shape[0], E)
        assert int(chosen.sum()) == hidden.shape[0]  # no token dropped: each runs its one expert
        ids = chosen.argmax(-1)
        order = ids.argsort(stable=True)  # by expert, so by the rank holding it
        mine_count = chosen.sum(0).to(torch.int64)
        counts.append(mine_count.tolist())
        every = mine_count.new_empty(dist.get_world_size(group) * E)  # the T·E ranks' counts
        counts_rec.note("all_gather", every)
        dist.all_gather_into_tensor(every, mine_count, group=group)
        every = every.view(EP, t, E)[:, tp_rank]  # the counts of this TP rank's EP group, in EP rank order
        sent = [int(mine_count[r * PER:(r + 1) * PER].sum()) for r in range(EP)]
        received = [int(every[q, ep * PER:(ep + 1) * PER].sum()) for q in range(EP)]
        which = torch.tensor([e for q in range(EP) for e in mine for _ in range(int(every[q, e]))])
        x = copy(rec.exchange(hidden[order], sent, received))
        w = rec.exchange(weights.reshape(-1, 1)[order], sent, received)  # the pairs' probabilities, with them
        out = torch.zeros_like(x)
        for e in mine:
            rows = (which == e).nonzero()[:, 0]
            out = out.index_put((rows,), self[f"expert_{e}"](x[rows]))
        back = rec.exchange(reduce(out) * w, received, sent)  # weighed where the experts ran
        return torch.zeros_like(hidden).index_add(0, order, back)

    import types

    for module in model.modules():
        if type(module).__name__ == "SwitchTransformersExperts":
            for e in range(E):
                if e not in mine:
                    del module[f"expert_{e}"]
                elif t > 1:
                    ff = module[f"expert_{e}"]
                    ff.wi.weight = torch.nn.Parameter(ff.wi.weight.detach().chunk(t, 0)[tp_rank].contiguous())
                    ff.wo.weight = torch.nn.Parameter(ff.wo.weight.detach().chunk(t, 1)[tp_rank].contiguous())
            module.forward = types.MethodType(forward, module)


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    moved: Counter = Counter()
    rec, counts_rec = Recorder(None, "ep", moved), Recorder(None, "tp_ep", moved)  # one EP group: both ranks
    dense = Recorder(None, "dp", moved)
    torch.manual_seed(0)
    model = transformers.SwitchTransformersModel(config()).train()
    counts: list = []
    expert_parallel(model, rank % EP, None, rec, counts_rec, counts)
    ids, dec = batch(1 + rank)  # each rank its own batch
    with FlopCounterMode(display=False) as counter:
        step(model, ids, dec)
    for name, p in model.named_parameters():  # each expert on dp·cp/ep = 1 rank: nothing to sum
        if ".experts." not in name:
            p.grad.copy_(dense.all_reduce(p.grad))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes(), "params": params, "counts": counts}, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def report():
    import flopcount

    inputs = {"input_ids": (B, SE), "attention_mask": (B, SE), "decoder_input_ids": (B, SD)}
    return flopcount.from_hf(config(), inputs, cache_dir=False, mode="train", optimizer="sgd",
                             memory=MemorySettings(device="cpu"))


def test_switch_is_counted_top1_with_its_moe_layers(report):
    torch.manual_seed(0)
    whole = transformers.SwitchTransformersModel(config())
    expert = 2 * H * FF  # wi, wo
    assert report.params == sum(p.numel() for p in whole.parameters())
    assert (report.moe.layers, report.moe.experts, report.moe.top_k, report.moe.expert_params) == (2, E, 1, expert)
    # the graph's products, forward and backward, equal FlopCounterMode over the whole model's eager step
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step(whole.train(), *batch(1))
    products = products_only(report)
    assert sum(n.cost.flops + n.backward.flops for n in products.nodes) == counter.get_total_flops()


def test_ep_on_gloo_equals_the_ledger(report, tmp_path):
    seen = gloo_ranks(_worker, tmp_path, world=WORLD)
    for r in seen:  # top-1, nothing dropped: each rank routes each of its tokens once per MoE layer
        assert [sum(c) for c in r["counts"]] == list(MOE_TOKENS)
    load = ExpertLoad([[sum(x) for x in zip(*layer)] for layer in zip(*(r["counts"] for r in seen))])
    p = parse_parallel(f"dp={WORLD},ep={EP}")
    led = ledger(report, p, expert_load=load)
    flops = ledger(products_only(report), p, expert_load=load)
    mem = {x: r for r in per_rank(report, p, load).ranks for x in r.replicas}
    experts = 2 * PER * 2 * H * FF  # a rank's experts' elements: 2 MoE layers, 2 experts each
    for rank, r in enumerate(seen):
        assert led.ranks[rank].coords == {"tp": 0, "pp": 0, "cp": 0, "ep": rank, "dp": rank}
        assert r["flops"] == flops.ranks[rank].hardware_flops
        # the pairs a rank's experts receive: its experts' tokens from both ranks, per MoE layer
        received = [sum(layer[e] for e in range(rank * PER, (rank + 1) * PER)) for layer in load.per_layer]
        assert r["params"] == F32 * (report.params - 2 * E * 2 * H * FF + experts) == mem[rank].params_bytes
        assert r["bytes"] == ledger_bytes(led.ranks[rank]) == {
            "all_reduce(dp)": r["params"] - F32 * experts,
            # per MoE layer, forward and backward: its own tokens out and back, its experts' pairs in and back; its
            # tokens' probabilities out, and the gradient of those its experts received back
            "all_to_all(ep)": sum(2 * (t + n) * H * F32 + (t + n) * F32 for t, n in zip(MOE_TOKENS, received)),
            "all_gather(tp_ep)": 2 * EP * E * 8}  # each MoE layer's counts of both ranks, int64
        # the all_to_all buffers of its largest MoE layer: its own tokens' vectors and its experts' pairs, each with
        # its probability
        assert mem[rank].alltoall_bytes == max((t + n) * (H + 1) * F32 for t, n in zip(MOE_TOKENS, received))


def test_eager_run_drops_tokens_over_capacity(report):
    """transformers' eager forward runs no expert for a token over its expert's capacity in its sequence: at
    capacity 1 the experts' products fall below the graph's, which runs every token's expert (the no-drop count,
    whatever the capacity)."""
    from torch.utils.flop_counter import FlopCounterMode

    def expert_products(capacity: int) -> int:
        torch.manual_seed(0)
        model = transformers.SwitchTransformersModel(config(capacity)).eval()
        found = []
        for m in model.modules():
            if type(m).__name__ == "SwitchTransformersExperts":
                m.register_forward_hook(lambda _m, args, _out: found.append(int(args[1].sum())))
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            ids, dec = batch(1)
            model(input_ids=ids, decoder_input_ids=dec)
        return sum(n for mod, ops in counter.get_flop_counts().items() if mod.endswith(".experts")
                   for n in ops.values()), found

    graph = sum(n.cost.flops for n, sc in zip(report.nodes, report.modules.nodes) if any(".experts" in s for s in sc)
                and n.family in ("matmul", "gemm"))
    pair = 2 * 2 * H * FF  # one token through one expert: wi and wo
    whole, kept = expert_products(SE)
    assert kept == list(MOE_TOKENS) and graph == whole == pair * sum(MOE_TOKENS)
    dropped, kept = expert_products(1)
    assert all(k <= B * E < t for k, t in zip(kept, MOE_TOKENS))  # each expert at most 1 token of a sequence
    assert dropped == pair * sum(kept) < graph


def test_top1_router_is_replicated_over_tp(report):
    """Under tp the router (found by the ArgMax its scores reach: Switch has no TopK) runs whole on every TP rank,
    2·T·h·R a MoE layer forward on each (T its stack's tokens), and the experts 1/T: 2·2·T·h·d_ff/T a layer."""
    from flopcount.parallel.ranks import node_shares

    shares = node_shares(report, parse_parallel("tp=2,dp=2,ep=2"))
    scopes = report.modules.nodes
    router = [x for x in shares if any(s.endswith(".router.classifier") for s in scopes[x.index])]
    assert sorted((x.tp, x.forward) for x in router) == sorted(
        (i, 2 * t * H * E) for i in range(2) for t in MOE_TOKENS)
    assert {x.rule for x in router} == {"norm"}  # replicated over TP, on the rank's tokens under sp
    experts = [x for x in shares if x.rule == "expert" and report.nodes[x.index].family == "matmul"]
    for i in range(2):
        assert sum(x.forward for x in experts if x.tp == i) == sum(2 * 2 * t * H * FF // 2 for t in MOE_TOKENS)


def test_expert_gradients_on_their_expert_data_parallel_group(report):
    """At dp=4,ep=2 each expert is held by dp·cp/ep = 2 ranks: its gradient is all-reduced over that group (``edp``),
    the rest over the 4 data-parallel ranks (test_parallel_gloo_edp.py runs that group for real)."""
    led = ledger(report, parse_parallel("dp=4,ep=2"))
    experts = 2 * PER * 2 * H * FF  # a rank's experts' elements
    for r in led.ranks:
        listed = ledger_bytes(r)
        assert listed["all_reduce(edp)"] == F32 * experts
        assert listed["all_reduce(dp)"] == F32 * (report.params - 2 * E * 2 * H * FF)
