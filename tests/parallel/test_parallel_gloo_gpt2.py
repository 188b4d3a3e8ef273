"""FLOPs, collective bytes and parameters per rank against 2 real TP ranks on gloo, for a GPT-2-like model the
ledger has never seen by name: a fused QKV projection (Conv1D's layout, one Gemm with its bias), GELU MLP, biases
everywhere, LayerNorms, learned positions and an LM head tied to a vocab-parallel embedding, its modules named
``blocks.N.mix.qkv``/``out`` and ``blocks.N.ff.up``/``down`` (no Hugging Face name), so that the layout finds each
part by its role in the graph. Written with Megatron-style local shards: the fused QKV and the MLP's first
projection column-parallel with their biases split, the two output projections row-parallel with their biases whole
on every rank, added after the all_reduce (Megatron's RowParallelLinear, torch's RowwiseParallel)."""

from __future__ import annotations

import json

import pytest
from helpers import gloo_ranks

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

torch = pytest.importorskip("torch")

H, L, HEADS, V, P = 32, 2, 4, 64, 16
D = H // HEADS
B, S = 2, 8
M = B * S


def build(t: int, rank: int, reduce=None, copy=None):
    """The model on TP rank ``rank`` of ``t`` (whole with t = 1); ``reduce``/``copy``: the all_reduce of the forward
    and of the backward (identity on one rank)."""
    nn = torch.nn
    reduce = reduce or (lambda x: x)
    copy = copy or (lambda x: x)
    torch.manual_seed(0)
    heads = HEADS // t

    def param(x):
        return nn.Parameter(x.contiguous())

    class Projection(nn.Module):
        """x·W + b with W as Conv1D keeps it, (in, out): column-parallel splits the outputs of each of ``blocks``
        (Q, K, V of a fused projection), row-parallel the inputs, its bias added whole after the reduction."""

        def __init__(self, n_in: int, n_out: int, row: bool, blocks: int = 1):
            super().__init__()
            w, b = torch.randn(n_in, n_out) * 0.1, torch.randn(n_out) * 0.1
            self.row = row
            if row:
                w = w.chunk(t, 0)[rank]
            else:
                w = torch.cat([c.chunk(t, 1)[rank] for c in w.chunk(blocks, 1)], 1)
                b = torch.cat([c.chunk(t, 0)[rank] for c in b.chunk(blocks, 0)], 0)
            self.weight, self.bias = param(w), param(b)

        def forward(self, x):
            flat = x.reshape(-1, x.shape[-1])
            if t == 1:
                y = torch.addmm(self.bias, flat, self.weight)
            elif self.row:
                y = reduce(flat @ self.weight) + self.bias
            else:
                y = torch.addmm(self.bias, flat, self.weight)
            return y.view(*x.shape[:-1], -1)

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = param(torch.ones(H)), param(torch.zeros(H))

        def forward(self, x):
            return nn.functional.layer_norm(x, (H,), self.weight, self.bias)

    class Mix(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = Projection(H, 3 * H, False, 3), Projection(H, H, True)

        def forward(self, y):
            q, k, v = (z.view(B, S, heads, D).transpose(1, 2) for z in self.qkv(y).split(heads * D, -1))
            causal = torch.full((S, S), float("-inf")).triu(1)
            a = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + causal, -1) @ v
            return self.out(a.transpose(1, 2).reshape(B, S, heads * D))

    class FeedForward(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = Projection(H, 4 * H, False), Projection(4 * H, H, True)

        def forward(self, y):
            return self.down(nn.functional.gelu(self.up(y), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.mix, self.norm2, self.ff = Norm(), Mix(), Norm(), FeedForward()

        def forward(self, x):
            x = x + self.mix(copy(self.norm1(x)))
            return x + self.ff(copy(self.norm2(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = param(torch.randn(V, H).chunk(t, 0)[rank])  # vocab-parallel, tied to the head
            self.positions = param(torch.randn(P, H))
            self.blocks = nn.ModuleList(Block() for _ in range(L))
            self.norm = Norm()

        def forward(self, ids):
            lo = rank * (V // t)
            outside = (ids < lo) | (ids >= lo + V // t)
            x = nn.functional.embedding((ids - lo).masked_fill(outside, 0), self.tokens)
            x = reduce(x.masked_fill(outside[..., None], 0)) if t > 1 else x
            x = x + nn.functional.embedding(torch.arange(S), self.positions)
            for block in self.blocks:
                x = block(x)
            return (copy(self.norm(x)) @ self.tokens.T).sum()  # this rank's V/t logits of the tied head

    return Model()


def ids():
    torch.manual_seed(1)
    return torch.randint(0, V, (B, S))


@pytest.fixture(scope="module")
def report():
    import flopcount

    return flopcount.from_torch(build(1, 0), (ids(),), training=True, optimizer="sgd", cache_dir=False,
                                memory=MemorySettings(device="cpu"))


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    moved = []

    class Reduce(torch.autograd.Function):  # all_reduce in the forward, identity in the backward
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            moved.append(x.numel() * x.element_size())
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class Copy(torch.autograd.Function):  # identity in the forward, all_reduce of the gradient in the backward
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            g = g.clone()
            moved.append(g.numel() * g.element_size())
            dist.all_reduce(g)
            return g

    module = build(world, rank, Reduce.apply, Copy.apply)
    with FlopCounterMode(display=False) as counter:
        module(ids()).backward()
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": sum(moved), "params": params}, f)
    dist.destroy_process_group()


def test_whole_model_is_the_one_counted(report):
    # the counted model is the t = 1 build: its parameters, the tied embedding once
    assert report.params == V * H + P * H + L * (2 * 2 * H + 3 * H * H + 3 * H + H * H + H + 4 * H * H + 4 * H
                                                 + 4 * H * H + H) + 2 * H


def test_tp_on_gloo_equals_the_ledger(report, tmp_path):
    seen = gloo_ranks(_worker, tmp_path)
    p = parse_parallel("tp=2")
    led = ledger(report, p)
    mem = per_rank(report, p).ranks
    # torch's addmm counts 2·M·K·N: the ledger's Gemms also count their bias adds and the bias gradients' sums,
    # M·N each, split with the column-parallel projections (3H and 4H outputs), whole with the row-parallel ones
    bias = L * 2 * (M * 3 * H // 2 + M * 4 * H // 2 + 2 * M * H)
    for i, rank in enumerate(seen):
        products = sum(x.forward + x.backward for x in node_shares(report, p)
                       if x.tp == i and report.nodes[x.index].family in ("matmul", "gemm"))
        assert rank["flops"] == products - bias
        assert rank["bytes"] == sum(c.bytes for c in led.ranks[i].communication if c.group == "tp")
        # the parameters each rank holds (row-parallel biases whole), in the memory and the optimizer ledgers
        assert rank["params"] == mem[i].params_bytes == 4 * led.ranks[i].optimizer_flops // 2
