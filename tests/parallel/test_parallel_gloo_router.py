"""The router's statistics and the MoE all_to_alls under recompute, on 2 real gloo ranks: a tiny Mixtral (4 routed
experts, 2 per token) at ``cp=2,ep=2``, each rank holding its half of the sequence (T = B·S/2 tokens) and experts
2r, 2r + 1. Each MoE layer runs as Megatron-Core's router and all-to-all dispatcher do: the counts of the rank's
(token, expert) pairs per expert (int64) gathered over the tensor- and expert-parallel group before the dispatch
(here both ranks) to size what each rank receives; in training the auxiliary load-balancing loss, computed only while
autograd records, its counts summed over the tensor- and context-parallel group (here both ranks) so that it sees
the whole sequence; the pairs moved by all_to_all_single there and back, their probabilities (fp32) sent with them and
applied to the experts' outputs on the rank that runs them (their gradient sent back in the backward). Each layer runs
plain, under a reentrant checkpoint (``--recompute full``: its first forward without grad, the loss only in the rerun)
and under a non-reentrant one (``--recompute non-reentrant``: both record). The bytes each rank hands to each of these
collectives equal the ledger's rows of groups ``tp_ep``, ``tp_cp`` and ``ep``, and closed forms written here.

Only the MoE blocks run here (a norm and the block, no attention): the collectives of the router and the dispatcher
depend on the tokens, the experts and the layers, not on the attention, which the ledger's count of the whole model
splits over CP with collectives of its own (group ``cp``), left out of the comparison."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from gloo_shards import Recorder, ledger_bytes, rms_norm
from helpers import gloo_ranks, mixtral_config

from flopcount.parallel.plan import parse_parallel, parse_recompute
from flopcount.parallel.ranks import ledger

pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, L, HEADS, KV, V, E, K, I = 32, 2, 4, 2, 64, 4, 2, 24
B, S, M = 2, 8, 2
CP = EP = 2
T = B * S // CP  # tokens of a microbatch on each rank
PER = E // EP
GROUPS = ("tp_ep", "tp_cp", "ep")


def route() -> list[tuple[int, int]]:
    """The 2 experts of each of a rank's tokens: t mod 4 and t + 1 mod 4 (every expert T·K/E pairs per rank)."""
    return [(t % E, (t + 1) % E) for t in range(T)]


def moe_stack(ep: int, moved: Counter, policy: str):
    """L blocks of a norm and an MoE on EP rank ``ep``, each run as ``policy`` checkpoints it; the bytes of its
    collectives added to ``moved``."""
    nn, dist = torch.nn, torch.distributed
    rec, counts, aux = (Recorder(None, name, moved) for name in ("ep", "tp_ep", "tp_cp"))
    checkpoint = torch.utils.checkpoint.checkpoint
    torch.manual_seed(0)
    mine = range(ep * PER, (ep + 1) * PER)
    pairs = sorted((e, t) for t, chosen in enumerate(route()) for e in chosen)  # by expert
    tokens, experts = torch.tensor([t for _, t in pairs]), torch.tensor([e for e, _ in pairs])
    routing = torch.zeros(T, E, dtype=torch.bool)
    routing[tokens, experts] = True
    Norm = rms_norm(H)

    class AuxLoss(torch.autograd.Function):  # the loss's gradient joins the output's, as Megatron attaches it
        forward = staticmethod(lambda ctx, out, aux: out.view_as(out))
        backward = staticmethod(lambda ctx, g: (g, g.new_ones(())))

    def counts_gathered(local):  # every rank's counts per expert: what each sends to each rank's experts
        out = local.new_empty(EP * E)
        counts.note("all_gather", out)
        dist.all_gather_into_tensor(out, local)
        return out.view(EP, E)

    class Moe(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(H, E, bias=False)
            self.up = nn.Parameter(torch.randn(E, 2 * I, H)[list(mine)] * 0.1)
            self.down = nn.Parameter(torch.randn(E, H, I)[list(mine)] * 0.1)

        def forward(self, x):
            probs = torch.softmax(self.gate(x), -1)
            local = routing.sum(0)  # int64 counts of the rank's pairs per expert
            if torch.is_grad_enabled():  # the auxiliary loss over the whole sequence's counts, on the router's probs
                probs = AuxLoss.apply(probs, 0.01 * (probs.sum(0) * aux.all_reduce(local)).sum())
            every = counts_gathered(local)
            sent = [int(local[r * PER:(r + 1) * PER].sum()) for r in range(EP)]
            got = [int(every[r, ep * PER:(ep + 1) * PER].sum()) for r in range(EP)]
            came = torch.cat([torch.repeat_interleave(torch.tensor(list(mine)), every[r, ep * PER:(ep + 1) * PER])
                              for r in range(EP)])
            y = rec.exchange(x[tokens], sent, got)
            w = rec.exchange(probs[tokens, experts][:, None], sent, got)  # the pairs' probabilities, with them
            out = torch.zeros_like(y)
            for j, e in enumerate(mine):
                rows = (came == e).nonzero()[:, 0]
                g, u = (y[rows] @ self.up[j].T).chunk(2, -1)
                out = out.index_put((rows,), (nn.functional.silu(g) * u) @ self.down[j].T)
            done = rec.exchange(out * w, got, sent)  # weighed where the experts ran
            return torch.zeros_like(x).index_add(0, tokens, done)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.mlp = Norm(), Moe()

        def forward(self, x):
            return x + self.mlp(self.norm(x))

    blocks = nn.ModuleList(Block() for _ in range(L))

    def run(x):
        for block in blocks:
            x = block(x) if policy == "none" else checkpoint(block, x, use_reentrant=policy == "full")
        return x.sum()

    return run


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    seen = {}
    for policy in ("none", "full", "non-reentrant"):
        moved: Counter = Counter()
        run = moe_stack(rank % EP, moved, policy)
        torch.manual_seed(1 + rank)
        for _ in range(M):
            run(torch.randn(T, H, requires_grad=True)).backward()
        seen[policy] = {f"{k}({g})": b for (k, g), b in moved.items()}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def report():
    import flopcount

    config = mixtral_config(H, I, L, HEADS, KV, V, E, K)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")


def test_router_statistics_and_reruns_on_gloo_equal_the_ledger(report, tmp_path):
    seen = gloo_ranks(_worker, tmp_path)
    vec = T * K * H * 4  # a rank's pairs' vectors, balanced: what it dispatches and what its experts send back
    probs = T * K * 4  # their fp32 probabilities, balanced: what it dispatches and the gradient it sends back
    gathered, summed = EP * E * 8, E * 8  # int64 counts of every rank of the group; the rank's, summed
    expected = {  # per layer and microbatch: (all_to_all passes, dispatches, auxiliary losses)
        "none": (4, 1, 1),  # dispatch and combine, both again in the backward; the loss in the forward
        "full": (6, 2, 1),  # the rerun dispatches and combines again; no grad in the first forward: the loss once
        "non-reentrant": (6, 2, 2),  # the rerun runs to the last saved tensor (after the combine), recording
    }
    for policy, (passes, dispatches, losses) in expected.items():
        led = ledger(report, parse_parallel(f"cp={CP},ep={EP}", microbatches=M), parse_recompute(policy))
        for rank, r in enumerate(seen):
            mine = {k: b for g in GROUPS for k, b in ledger_bytes(led.ranks[rank], g).items()}
            # the probabilities with each dispatch, and their gradient back once
            assert r[policy] == mine == {"all_to_all(ep)": M * L * (passes * vec + (dispatches + 1) * probs),
                                         "all_gather(tp_ep)": M * L * dispatches * gathered,
                                         "all_reduce(tp_cp)": M * L * losses * summed}, (policy, rank)


def test_no_statistics_without_their_groups(report):
    """dp=2,ep=2: the TP and CP ranks are one, so no auxiliary all_reduce; the counts gathered over the 2 EP ranks;
    inference: no auxiliary loss, one dispatch a forward."""
    led = ledger(report, parse_parallel("dp=2,ep=2", microbatches=M))
    assert ledger_bytes(led.ranks[0], "tp_cp") == {}
    assert ledger_bytes(led.ranks[0], "tp_ep") == {"all_gather(tp_ep)": M * L * EP * E * 8}


@pytest.mark.parametrize("policy", ["selective", "MatMul,Softmax"])
def test_recomputed_operators_send_nothing_again(report, policy):
    """Selective recompute and an operator list run single ops again (their products among them), not a layer's
    forward: no dispatch, combine or router statistics again."""
    plan = parse_parallel(f"cp={CP},ep={EP}", microbatches=M)
    plain = ledger(report, plan).ranks[0]
    again = ledger(report, plan, parse_recompute(policy)).ranks[0]
    assert again.recompute_flops > 0
    assert {k: b for g in GROUPS for k, b in ledger_bytes(again, g).items()} == \
        {k: b for g in GROUPS for k, b in ledger_bytes(plain, g).items()}


# --- generation: the routing runs in every forward, the auxiliary loss in none ---------------------------------

P, N = S, 3  # the prompt (B·P/C = T tokens a rank in the prefill) and N new tokens: the prefill, N − 1 decode steps


def _inference_worker(rank: int, world: int, init: str, out: str) -> None:
    """The same MoE blocks run as inference runs them (``torch.no_grad``): M microbatches of the prefill and the
    N − 1 decode steps, each a forward that routes and dispatches."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    moved: Counter = Counter()
    run = moe_stack(rank % EP, moved, "none")
    torch.manual_seed(1 + rank)
    with torch.no_grad():
        for _ in range(M * N):
            run(torch.randn(T, H))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({f"{k}({g})": b for (k, g), b in moved.items() if g != "ep"}, f)
    dist.destroy_process_group()


def test_generation_gathers_the_counts_and_runs_no_auxiliary_loss(tmp_path):
    """``--generate P:N --parallel cp=2,ep=2``: without autograd recording no auxiliary loss runs (no ``tp_cp``
    all_reduce), while every forward routes and gathers the T·E ranks' counts before its dispatch: the generation
    ledger's ``tp_ep`` all_gather, M·N·L·EP·E·8 bytes (the prefill and N − 1 decode steps). The counts' size does
    not depend on the tokens, so each forward here routes the prefill's T tokens; the ``all_to_all`` payloads of
    the decode steps' B tokens are checked against closed forms in tests/frontends/test_generate_parallel_experts.py."""
    import flopcount
    from flopcount.parallel.generation import generation_ledger

    config = mixtral_config(H, I, L, HEADS, KV, V, E, K, architectures=["MixtralForCausalLM"])
    report = flopcount.from_hf(config, generate=(P, N), batch=B, cache_dir=False)
    led = generation_ledger(report, parse_parallel(f"cp={CP},ep={EP}", microbatches=M))
    seen = gloo_ranks(_inference_worker, tmp_path)
    for rank, r in enumerate(seen):
        mine = {k: b for g in ("tp_ep", "tp_cp") for k, b in ledger_bytes(led.ranks[rank], g).items()}
        assert r == mine == {"all_gather(tp_ep)": M * N * L * EP * E * 8}
