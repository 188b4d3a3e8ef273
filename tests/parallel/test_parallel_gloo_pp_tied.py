"""Pipeline parallelism with a tied embedding on real gloo ranks: the GPT-2-like model of gloo_shards (its LM head
reads the token embedding's weight) in 2 stages of one block each, ``pp=2`` on 2 ranks and ``tp=2,pp=2`` on 4
(Megatron's rank order, TP fastest). Stage 0 holds the embedding and block 0, stage 1 block 1, the final norm and
a copy of the embedding's weight for the head; each runs M microbatches, sending
each activation to the next stage and its gradient back. Each copy's gradient is partial (the lookups' on stage 0,
the head's on stage 1) until they are all-reduced between the first and the last stage (Megatron's embedding
group), after which both equal the whole model's. Each rank's ``FlopCounterMode`` total, the bytes it hands to each
collective and group, and its parameter bytes equal the ledger's."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from gloo_shards import B, H, L, P, S, V, Recorder, gpt2_like, ledger_bytes
from helpers import gloo_ranks

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

torch = pytest.importorskip("torch")

M = 2  # microbatches per step
TOKENS = B * S


def ids(j: int):
    torch.manual_seed(1 + j)
    return torch.randint(0, V, (B, S))


@pytest.fixture(scope="module")
def report():
    import flopcount

    return flopcount.from_torch(gpt2_like(), (ids(0),), training=True, optimizer="sgd", cache_dir=False,
                                memory=MemorySettings(device="cpu"))


def _run_stage(model, stage: int, rank: int, t: int, moved: Counter) -> None:
    """One step of M microbatches on this rank's stage: stage 0 sends each activation on and runs the backward of
    the gradient it gets back; stage 1 runs forward and backward of each and sends the gradient back."""
    import torch.distributed as dist

    def send(x, to: int):
        moved[("send_recv", "pp")] += x.numel() * x.element_size()
        dist.send(x.contiguous(), to)

    if stage == 0:
        for j in range(M):  # a send returns once received: each microbatch's backward before the next forward
            x = model.blocks[0](model.embed(ids(j)))
            send(x.detach(), rank + t)
            g = torch.empty(B, S, H)
            dist.recv(g, rank + t)
            x.backward(g)
        return
    for _ in range(M):
        x = torch.empty(B, S, H)
        dist.recv(x, rank - t)
        x.requires_grad_()
        model.head(model.blocks[1](x)).backward()
        send(x.grad, rank - t)


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    t = world // 2
    stage, i = divmod(rank, t)
    tp = [dist.new_group([s * t + j for j in range(t)]) for s in range(2)]
    embedding = [dist.new_group([j, t + j]) for j in range(t)]  # the first and the last stage's copies
    moved: Counter = Counter()
    rec, tied = Recorder(tp[stage], "tp", moved), Recorder(embedding[i], "embedding", moved)
    model = gpt2_like(t, i, rec if t > 1 else None)
    with FlopCounterMode(display=False) as counter:
        _run_stage(model, stage, rank, t, moved)
    local = model.tokens.grad.flatten().tolist()
    model.tokens.grad.copy_(tied.all_reduce(model.tokens.grad))
    held = [model.tokens, *((model.positions, *model.blocks[0].parameters()) if stage == 0 else
                            (*model.blocks[1].parameters(), *model.norm.parameters()))]
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes(), "local": local,
                   "summed": model.tokens.grad.flatten().tolist(),
                   "params": sum(p.numel() * p.element_size() for p in held)}, f)
    dist.destroy_process_group()


@pytest.mark.parametrize("t", [1, 2])
def test_pp_with_tied_embedding_on_gloo_equals_the_ledger(report, tmp_path, t):
    whole = gpt2_like()
    for j in range(M):
        whole(ids(j)).backward()
    seen = gloo_ranks(_worker, tmp_path, world=2 * t)
    p = parse_parallel(f"tp={t},pp=2", microbatches=M)
    led = ledger(report, p)
    mem = per_rank(report, p).ranks
    shares = node_shares(report, p)
    a = TOKENS * H * 4  # one activation, fp32
    for rank, r in enumerate(seen):
        stage, i = divmod(rank, t)
        assert led.ranks[rank].coords == {"tp": i, "pp": stage, "cp": 0, "ep": 0, "dp": 0}
        # the embedding's gradient: this stage's part, the whole model's once summed with the other stage's copy
        grad = whole.tokens.grad.chunk(t, 0)[i].flatten()
        assert not torch.allclose(torch.tensor(r["local"]), grad, atol=1e-5)
        assert torch.allclose(torch.tensor(r["summed"]), grad, atol=1e-4)
        # torch's addmm leaves out the Gemms' bias adds and their gradients' sums that the ledger counts, M·N
        # each: the column-parallel ones 1/T (3H and 4H outputs), the row-parallel ones' whole (H outputs each)
        bias = 2 * TOKENS * (7 * H // t + 2 * H) * (L // 2)
        assert r["flops"] == M * (sum(x.forward + x.backward for x in shares if x.stage == stage and x.tp == i
                                      and report.nodes[x.index].family in ("matmul", "gemm")) - bias)
        tp = {"all_reduce(tp)": M * (4 * (L // 2) * a + a)} if t > 1 else {}  # blocks, and embedding or head
        assert r["bytes"] == ledger_bytes(led.ranks[rank]) == {
            "send_recv(pp)": M * a, "all_reduce(embedding)": V * H // t * 4, **tp}
        # stage 0: the embedding, positions and block 0; stage 1: block 1, the final norm and the tied copy
        assert r["params"] == mem[rank].params_bytes == 4 * led.ranks[rank].optimizer_flops // 2
        assert r["params"] == 4 * (V * H // t + (P * H if stage == 0 else 2 * H) + (
            2 * 2 * H + (3 * H * H + 3 * H) // t + H * H // t + H + (4 * H * H + 4 * H) // t + 4 * H * H // t + H))
