"""Megatron's sequence parallelism on an MoE, against 2 real TP ranks on gloo: a tiny Mixtral (4 routed experts, 2 per
token, no shared expert) at ``tp=2,sp=megatron``, written with Megatron-style local shards (gloo_shards'
``megatron_moe_model``). Attention and the LM head as in test_parallel_gloo_sp (the column-parallel inputs
all-gathered, only the rank's tokens kept and gathered again in the backward; the row-parallel outputs
reduce-scattered). The MoE block as Megatron-Core's router and all-gather token dispatcher run it under TP with sp
(``MoEAllGatherTokenDispatcher``, group ``tp_ep`` = TP here): the router on the rank's S/T tokens; its routing map
(no grad) and probabilities all-gathered over the group, then the hidden states
(``gather_from_sequence_parallel_region``: all-gather in the forward, reduce-scatter of the gradient), the experts
split over TP (expert tensor parallelism = T) keeping their own inputs, so nothing is gathered again in the backward;
the outputs reduce-scattered back to the rank's tokens (the gradient all-gathered). The router's weight, like the
norms', carries ``sequence_parallel``: its partial gradient is all-reduced over TP once a step. Each rank's
``FlopCounterMode`` total and the bytes it hands to each collective are compared with the ledger's; the routing map
and the probabilities go to a recorder of their own (``route``), compared with the ledger's group ``tp_ep``."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from gloo_shards import HEADS, KV, B, H, L, Recorder, S, V, ledger_bytes, megatron_moe_model
from helpers import gloo_ranks, mixtral_config
from test_parallel_gloo_sp import megatron_column

from flopcount.parallel.layout import layout_of
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

E, K, I = 4, 2, 24
TOKENS = B * S


def route(e: int = E) -> list[tuple[int, int]]:
    """The 2 experts of token t (b·S + s) among ``e``: t mod e and t + 1 mod e, so each expert receives TOKENS·K/e
    pairs."""
    return [(t % e, (t + 1) % e) for t in range(TOKENS)]


def mixtral(t: int, rank: int, rec: Recorder, routed: Recorder, e: int = E):
    """The model of ``e`` experts on TP rank ``rank`` of ``t`` under ``sp=megatron``: ``rec`` the hidden states'
    collectives, ``routed`` the routing map's and probabilities'."""
    nn = torch.nn
    pairs = sorted((x, tok) for tok, chosen in enumerate(route(e)) for x in chosen)  # by expert
    tokens, experts = torch.tensor([tok for _, tok in pairs]), torch.tensor([x for x, _ in pairs])
    routing = torch.zeros(B, S, e, dtype=torch.uint8)  # the boolean routing map, one byte an entry
    routing.view(TOKENS, e)[tokens, experts] = 1
    mine = routing.chunk(t, 1)[rank].contiguous()  # the rank's tokens' rows

    class Moe(nn.Module):
        def __init__(self, split):
            super().__init__()
            self.gate = nn.Linear(H, e, bias=False)  # whole on every rank
            gate, up, down = torch.randn(e, I, H) * 0.1, torch.randn(e, I, H) * 0.1, torch.randn(e, H, I) * 0.1
            self.gate_up = nn.Parameter(torch.cat([split(gate, 1), split(up, 1)], 1))  # column-parallel
            self.down = split(down, 2)  # row-parallel

        def forward(self, y):  # y: the rank's tokens (B, S/T, H)
            probs = torch.softmax(self.gate(y), -1)  # the router on the rank's tokens
            with torch.no_grad():
                whole_map = routing_gather(mine)
            assert torch.equal(whole_map, routing)
            weights = routed.gather(probs).reshape(TOKENS, e)[tokens, experts]
            x = rec.gather(y).reshape(TOKENS, H)
            out = torch.zeros(len(pairs), H)
            for j in range(e):
                rows = (experts == j).nonzero()[:, 0]
                g, u = (x[tokens[rows]] @ self.gate_up[j].T).chunk(2, -1)
                out = out.index_put((rows,), (nn.functional.silu(g) * u) @ self.down[j].T)
            partial = torch.zeros(TOKENS, H).index_add(0, tokens, out * weights[:, None])
            return rec.scatter(partial.view(B, S, H))  # the sum over TP, each rank keeping its tokens

    def routing_gather(local):
        import torch.distributed as dist

        x = local.transpose(0, 1).contiguous()
        whole = x.new_empty(t * x.shape[0], *x.shape[1:])
        routed.note("all_gather", whole)
        dist.all_gather_into_tensor(whole, x)
        return whole.transpose(0, 1)

    return megatron_moe_model(t, rank, rec, megatron_column(rec), Moe)


def _worker(rank: int, world: int, init: str, out: str, e: int = E) -> None:
    import torch.distributed as dist
    from helpers import saving
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    moved: Counter = Counter()
    rec, routed = (Recorder(None, name, moved) for name in ("tp", "route"))
    model = mixtral(world, rank, rec, routed, e)
    torch.manual_seed(1)
    ids = torch.randint(0, V, (B, S))
    with FlopCounterMode(display=False) as counter:
        with saving(model) as saved:  # the storages autograd keeps for the backward
            loss = model(ids)
        loss.backward()
    for name, p in model.named_parameters():  # the partial gradients of the weights sp leaves whole
        if "norm" in name or name.endswith("mlp.gate.weight"):
            p.grad.copy_(rec.all_reduce(p.grad))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "tp": rec.bytes("tp"), "route": rec.bytes("route"),
                   "saved": sum(saved.values())}, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def report():
    import flopcount

    config = mixtral_config(H, I, L, HEADS, KV, V, E, K)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")


def test_sp_megatron_moe_on_gloo_against_the_ledger(report, tmp_path):
    """The hidden states' collectives equal the ledger's: per layer, attention's input all-gathered in the forward
    and again in the backward (A each), the MoE block's once (its gradient reduce-scattered, the experts keeping
    the gathered tokens), the outputs of both reduce-scattered (their gradients gathered); the LM head's input
    gathered twice, the embedding's lookup reduce-scattered: 5L·A + 3A gathered, 4L·A + 2A reduce-scattered, A more
    all-gather than ``sp`` (= ``sp=torch``) per gathered input kept as the rank's tokens: one per layer here (its
    Q/K/V's; not its MoE block's) and the head's. The products' FLOPs equal the ledger's, the router's of the rank's
    S/T tokens; its weight's partial gradient all-reduced with the norms'."""
    seen = gloo_ranks(_worker, tmp_path)
    p = parse_parallel("tp=2,sp=megatron")
    led = ledger(report, p)
    t, a = 2, TOKENS * H * 4  # one activation, fp32
    products = [x for x in node_shares(report, p) if report.nodes[x.index].family in ("matmul", "gemm")]
    roles = layout_of(report, p).roles
    for i, r in enumerate(seen):
        listed = ledger_bytes(led.ranks[i])
        # the auxiliary loss's counts (test_parallel_gloo_router runs them); this run has no auxiliary loss
        assert listed.pop("all_reduce(tp_cp)") == L * E * 8
        # the dispatcher's routing map (1 byte an entry, no grad) and probabilities (fp32, their gradient
        # reduce-scattered), over the TP×EP group (TP here)
        assert r["route"] == {"all_gather(route)": L * (TOKENS * E + TOKENS * E * 4),
                              "reduce_scatter(route)": L * TOKENS * E * 4}
        assert r["route"] == {k.replace("(tp_ep)", "(route)"): listed.pop(k)
                              for k in ("all_gather(tp_ep)", "reduce_scatter(tp_ep)")}
        assert r["tp"] == listed == {"all_gather(tp)": 5 * L * a + 3 * a, "reduce_scatter(tp)": 4 * L * a + 2 * a,
                                     # the partial gradients of the norms and the routers
                                     "all_reduce(tp)": (2 * L + 1) * H * 4 + L * E * H * 4}
        assert listed["all_gather(tp)"] - ledger_bytes(ledger(report, parse_parallel("tp=2,sp")).ranks[i])[
            "all_gather(tp)"] == (2 * L + 1) * a - L * a  # no regather of the MoE block's input
        router = [x for x in products if x.tp == i and roles[x.index] == "router"]
        assert sum(x.forward + x.backward for x in router) == L * 6 * (TOKENS // t) * H * E  # the rank's tokens
        assert r["flops"] == sum(x.forward + x.backward for x in products if x.tp == i)


def _memory_report(e: int):
    import flopcount
    from flopcount.memory.ledger import MemorySettings

    return flopcount.from_hf(mixtral_config(H, I, L, HEADS, KV, V, e, K), (B, S), cache_dir=False, mode="train",
                             memory=MemorySettings(device="cpu"))


def test_sp_megatron_moe_router_outputs_on_gloo_against_the_memory_ledger(tmp_path):
    """The router runs on the rank's S/T tokens and keeps its outputs so: from E to 2E experts each rank's storages
    kept for the backward grow by its probabilities (softmax's output, fp32: B·S/T·E·4 a layer; the routing map has
    no gradient, and the gathered probabilities are read by an index, which keeps the indices only), as the memory
    ledger's activations of that rank do under ``sp`` (1/T, the router's role splitting over the sequence as its
    FLOPs do); without sp the ledger keeps them whole (B·S·E·4 a layer)."""
    from flopcount.memory.ranks import per_rank

    seen = []
    for e in (E, 2 * E):
        (tmp_path / str(e)).mkdir()
        seen.append(gloo_ranks(_worker, tmp_path / str(e), e))
    reports = [_memory_report(e) for e in (E, 2 * E)]
    t = 2
    for plan, grown in (("tp=2,sp=megatron", L * B * S // t * E * 4), ("tp=2", L * B * S * E * 4)):
        led = [per_rank(rep, parse_parallel(plan, microbatches=1)).ranks for rep in reports]
        assert [b.activations_bytes - a.activations_bytes for a, b in zip(*led)] == [grown] * t
    for i in range(t):
        assert seen[1][i]["saved"] - seen[0][i]["saved"] == L * B * S // t * E * 4
