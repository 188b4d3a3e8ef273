"""Expert parallelism with an expert-data-parallel group on 4 real gloo ranks: a tiny Mixtral (4 routed experts, 2 per
token, no shared expert) at ``dp=4,ep=2``. The ranks form two EP groups, {0, 1} and {2, 3} (EP rank q mod 2 of
data-parallel rank q); EP rank r holds experts 2r and 2r + 1, so each expert is held by dp·cp/ep = 2 ranks, {r,
r + 2}: its expert data-parallel group. Each rank runs M microbatches of its own batch, a fixed router sending
every expert the same number of (token, expert) pairs (the ledger's balanced load), the pairs moved by
all_to_all_single within the EP group; after the step it all-reduces its dense gradients over the 4 data-parallel
ranks and its experts' over their 2-rank group. Each rank's ``FlopCounterMode`` total, the bytes it hands to each
collective and group, and its parameter bytes equal the ledger's."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from gloo_shards import Recorder, ledger_bytes, rms_norm
from helpers import gloo_ranks, mixtral_config

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, L, HEADS, KV, V, E, K, I = 32, 2, 4, 2, 64, 4, 2, 24
D = H // HEADS
B, S, M = 2, 8, 2
T = B * S  # tokens of a microbatch on each rank
EP, WORLD = 2, 4
PER = E // EP  # experts per EP rank


def route() -> list[tuple[int, int]]:
    """The 2 experts of each token: t mod 4 and t + 1 mod 4, so each expert receives T·K/E pairs from every rank."""
    return [(t % E, (t + 1) % E) for t in range(T)]


def mixtral(ep: int, rec: Recorder | None = None):
    """The model on EP rank ``ep`` (its experts ep·PER .. ; all of them when ``rec`` is None, the whole model)."""
    nn = torch.nn
    torch.manual_seed(0)
    mine = range(E) if rec is None else range(ep * PER, (ep + 1) * PER)
    pairs = sorted((e, t) for t, chosen in enumerate(route()) for e in chosen)  # by expert
    tokens, experts = torch.tensor([t for _, t in pairs]), torch.tensor([e for e, _ in pairs])
    # what each rank of the group sends to each: its pairs for that rank's experts; it receives as many from each
    sent = [sum(1 for e, _ in pairs if e // PER == r) for r in range(EP)]
    came = torch.tensor([e for _ in range(EP) for e, _ in pairs if e // PER == ep])

    Norm = rms_norm(H)

    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            up, down = torch.randn(E, 2 * I, H) * 0.1, torch.randn(E, H, I) * 0.1
            self.gate_up_proj, self.down_proj = nn.Parameter(up[list(mine)]), nn.Parameter(down[list(mine)])

        def forward(self, x, which):
            out = torch.zeros_like(x)
            for j, e in enumerate(mine):
                rows = (which == e).nonzero()[:, 0]
                g, u = (x[rows] @ self.gate_up_proj[j].T).chunk(2, -1)
                out = out.index_put((rows,), (nn.functional.silu(g) * u) @ self.down_proj[j].T)
            return out

    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.experts = nn.Linear(H, E, bias=False), Experts()

        def forward(self, y):
            x = y.reshape(T, H)
            weights = torch.softmax(self.gate(x), -1)[tokens, experts]
            if rec is None:
                done = self.experts(x[tokens], experts) * weights[:, None]
            else:  # the probabilities travel with the tokens and weigh the experts' outputs where they run
                w = rec.exchange(weights[:, None], sent, sent)
                done = rec.exchange(self.experts(rec.exchange(x[tokens], sent, sent), came) * w, sent, sent)
            return torch.zeros_like(x).index_add(0, tokens, done).view(B, S, H)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_norm, self.post_norm = Norm(), Norm()
            self.q, self.o = nn.Linear(H, H, bias=False), nn.Linear(H, H, bias=False)
            self.k, self.v = (nn.Linear(H, KV * D, bias=False) for _ in range(2))
            self.mlp = Moe()

        def forward(self, x):
            y = self.input_norm(x)
            q = self.q(y).view(B, S, HEADS, D).transpose(1, 2)
            k, v = (p(y).view(B, S, KV, D).transpose(1, 2).repeat_interleave(HEADS // KV, 1)
                    for p in (self.k, self.v))
            causal = torch.full((S, S), float("-inf")).triu(1)
            a = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + causal, -1) @ v
            x = x + self.o(a.transpose(1, 2).reshape(B, S, H))
            return x + self.mlp(self.post_norm(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(V, H)
            self.layers = nn.ModuleList(Layer() for _ in range(L))
            self.norm, self.lm_head = Norm(), nn.Linear(H, V, bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return nn.functional.cross_entropy(self.lm_head(self.norm(x)).reshape(-1, V), ids.reshape(-1))

    return Model()


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ep_groups = [dist.new_group([g * EP + r for r in range(EP)]) for g in range(world // EP)]
    edp_groups = [dist.new_group(list(range(r, world, EP))) for r in range(EP)]  # the ranks holding the same experts
    ep = rank % EP
    moved: Counter = Counter()
    rec = Recorder(ep_groups[rank // EP], "ep", moved)
    dense, edp = Recorder(None, "dp", moved), Recorder(edp_groups[ep], "edp", moved)
    model = mixtral(ep, rec)
    torch.manual_seed(1 + rank)  # each rank its own batch
    ids = torch.randint(0, V, (M, B, S))
    with FlopCounterMode(display=False) as counter:
        for j in range(M):
            model(ids[j]).backward()
    for name, p in model.named_parameters():  # once a step: experts over their group, the rest over dp
        p.grad.copy_((edp if ".experts." in name else dense).all_reduce(p.grad))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes(), "params": params}, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def report():
    import flopcount

    config = mixtral_config(H, I, L, HEADS, KV, V, E, K)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train", optimizer="sgd",
                             memory=MemorySettings(device="cpu"))


def test_whole_model_is_the_one_counted(report):
    whole = sum(p.numel() for p in mixtral(0).parameters())
    layer = 2 * H + 2 * H * H + 2 * KV * D * H + E * H + E * 3 * I * H  # norms, attention, router, experts
    assert report.params == whole == V * H + L * layer + H + V * H
    assert counts_per_expert() == [T * K // E] * E  # the fixed router's load is balanced


def counts_per_expert() -> list[int]:
    return [sum(e in chosen for chosen in route()) for e in range(E)]


def test_ep_with_expert_data_parallel_group_on_gloo_equals_the_ledger(report, tmp_path):
    seen = gloo_ranks(_worker, tmp_path, world=WORLD)
    p = parse_parallel(f"dp={WORLD},ep={EP}", microbatches=M)
    led = ledger(report, p)
    mem = {x: r for r in per_rank(report, p).ranks for x in r.replicas}  # one row per class of ranks
    shares = node_shares(report, p)
    products = [x for x in shares if report.nodes[x.index].family in ("matmul", "gemm")]
    routed = sum(x.forward + x.backward for x in products if x.rule == "expert")
    assert routed == L * 3 * (T * K * 2 * 3 * H * I)  # each pair's 3 projections, forward and backward
    experts = L * PER * 3 * I * H  # a rank's experts' elements
    for rank, r in enumerate(seen):
        assert led.ranks[rank].coords == {"tp": 0, "pp": 0, "cp": 0, "ep": rank % EP, "dp": rank}
        # balanced: the pairs a rank's experts receive are as many as its own tokens send
        assert r["flops"] == M * sum(x.forward + x.backward for x in products)
        assert r["params"] == 4 * (report.params - L * E * 3 * I * H + experts)
        listed = ledger_bytes(led.ranks[rank])
        # the router's counts per expert, gathered over the 2 EP ranks before each dispatch (int64), which this
        # run's fixed router need not send: test_parallel_gloo_router.py runs them
        assert listed.pop("all_gather(tp_ep)") == M * L * EP * E * 8
        assert r["bytes"] == listed == {
            "all_reduce(dp)": r["params"] - 4 * experts, "all_reduce(edp)": 4 * experts,
            # each layer's dispatch and combine, both ways, and the pairs' fp32 probabilities out and their gradient
            "all_to_all(ep)": M * L * (2 * 2 * T * K * H * 4 + 2 * T * K * 4)}
        assert r["params"] == mem[rank].params_bytes == 4 * led.ranks[rank].optimizer_flops // 2
