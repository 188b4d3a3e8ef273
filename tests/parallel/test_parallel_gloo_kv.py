"""The gradient sum of K/V heads copied over TP ranks, on 4 real gloo ranks: a one-layer attention block with 4 query
heads and 2 K/V heads at tp=4, each rank holding one query head and a copy of one K/V head (as Megatron lays out GQA
when tp exceeds the K/V heads). Each copy's dWk and dWv come from its own query head only: they differ from the
whole model's gradient until summed over the copies, and the bytes each rank hands to that sum equal the ledger's
``all_reduce`` on the ``tp_kv`` group."""

from __future__ import annotations

import json

import pytest
from helpers import gloo_ranks

from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger

torch = pytest.importorskip("torch")

H, HEADS, KV, B, S = 32, 4, 2, 2, 8
D = H // HEADS
T = 4


def weights():
    torch.manual_seed(0)
    return {name: torch.randn(n, H) * 0.1 for name, n in (("q", H), ("k", KV * D), ("v", KV * D), ("o", H))}


def inputs():
    torch.manual_seed(1)
    return torch.randn(B, S, H)


class Layer(torch.nn.Module):
    """Q, K, V and O projections, K/V heads repeated for their query heads, and the residual."""

    def __init__(self):
        super().__init__()
        w = weights()
        for name in ("q", "k", "v", "o"):
            proj = torch.nn.Linear(H, w[name].shape[0], bias=False)
            proj.weight = torch.nn.Parameter(w[name].clone())
            setattr(self, f"{name}_proj", proj)

    def forward(self, x):
        q = self.q_proj(x).view(B, S, HEADS, D).transpose(1, 2)
        k = self.k_proj(x).view(B, S, KV, D).transpose(1, 2).repeat_interleave(HEADS // KV, 1)
        v = self.v_proj(x).view(B, S, KV, D).transpose(1, 2).repeat_interleave(HEADS // KV, 1)
        a = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, -1) @ v
        return x + self.o_proj(a.transpose(1, 2).reshape(B, S, H))


class Attention(torch.nn.Module):
    """The whole block, one layer of a stack."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer()])

    def forward(self, x):
        return self.layers[0](x).sum()


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    copies = [dist.new_group([2 * g, 2 * g + 1]) for g in range(KV)]  # the ranks holding K/V head g
    w = weights()
    head, kv = rank, rank // (T // KV)
    q = w["q"][head * D:(head + 1) * D].clone().requires_grad_()
    k = w["k"][kv * D:(kv + 1) * D].clone().requires_grad_()
    v = w["v"][kv * D:(kv + 1) * D].clone().requires_grad_()
    o = w["o"][:, head * D:(head + 1) * D].clone().requires_grad_()
    x = inputs()
    qh, kh, vh = ((x @ p.T).view(B, 1, S, D) for p in (q, k, v))
    a = torch.softmax(qh @ kh.transpose(-1, -2) * D ** -0.5, -1) @ vh
    (a.view(B, S, D) @ o.T).sum().backward()  # its share of the row-parallel output; the sum's gradient is 1
    local = torch.cat([k.grad, v.grad]).flatten()
    summed = local.clone()
    dist.all_reduce(summed, group=copies[kv])
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"local": local.tolist(), "summed": summed.tolist(), "bytes": summed.numel() * 4}, f)
    dist.destroy_process_group()


def test_copied_kv_heads_sum_their_gradients(tmp_path):
    import flopcount

    model = Attention()
    x = inputs()
    model(x).backward()
    p = model.layers[0]
    report = flopcount.from_torch(Attention(), (inputs(),), training=True, cache_dir=False)
    led = ledger(report, parse_parallel(f"tp={T}"))
    seen = gloo_ranks(_worker, tmp_path, world=T)
    for rank, r in enumerate(seen):
        kv = rank // (T // KV)
        whole = torch.cat([p.k_proj.weight.grad[kv * D:(kv + 1) * D], p.v_proj.weight.grad[kv * D:(kv + 1) * D]])
        assert not torch.allclose(torch.tensor(r["local"]), whole.flatten(), atol=1e-6)  # one query head's part
        assert torch.allclose(torch.tensor(r["summed"]), whole.flatten(), atol=1e-5)  # summed over the copies
        comm = {(c.kind, c.group): c.bytes for c in led.ranks[rank].communication}
        assert r["bytes"] == comm[("all_reduce", "tp_kv")] == 2 * D * H * 4
