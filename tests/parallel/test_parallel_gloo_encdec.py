"""FLOPs, collective bytes and parameters per rank against 2 real TP ranks on gloo, for an encoder-decoder written
with Megatron-style local shards: one vocab-parallel token table looked up by the encoder and by the decoder (each
lookup all-reduced), post-norm encoder layers (self-attention, a GELU MLP) on SE tokens and decoder layers on SD
tokens (self-attention, cross-attention, MLP), the Q, K, V and MLP-up projections column-parallel (identity forward,
gradient all-reduced: Megatron's ``copy_to_tensor_model_parallel_region``), the cross-attention's K and V reading
the encoder's output through their own such copy, as Megatron's T5 ``key_value`` ``ColumnParallelLinear`` does, the
output and MLP-down projections row-parallel (all-reduced in the forward); no biases; and the same under ``sp``
(each all-reduce a reduce-scatter and an all-gather, the norms' partial gradients summed once a step). Each rank's
``FlopCounterMode`` total, the bytes it hands to each collective and its parameter bytes equal the ledger's, and the
bytes the closed form written here."""

from __future__ import annotations

import json

import pytest
from gloo_shards import Recorder, ledger_bytes, phased, predicted_calls, recorded
from helpers import gloo_ranks

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

torch = pytest.importorskip("torch")

H, L, HEADS, FFN, V = 32, 2, 4, 64, 64  # hidden, layers of each stack, heads, MLP width, vocabulary
D = H // HEADS
B, SE, SD = 2, 8, 6  # batch, encoder tokens, decoder tokens


def encoder_decoder(t: int = 1, rank: int = 0, rec: Recorder | None = None, sp: bool = False):
    """The model on TP rank ``rank`` of ``t`` (whole with t = 1), its weights drawn in the same order whatever t;
    ``rec``: its collectives (none on one rank). Under ``sp`` each stream is split over the sequence: the lookups
    reduce-scattered, the tokens gathered before each column-parallel product (the cross-attention's K and V gather
    the encoder's output) and reduce-scattered after each row-parallel one, the decoder's output gathered."""
    nn = torch.nn

    def same(x):
        return x

    reduce, copy, leave = (same, same, same) if rec is None else (rec.reduce, rec.copy, same)
    if rec is not None and sp:
        reduce, copy, leave = rec.scatter, rec.gather, rec.whole
    torch.manual_seed(0)
    heads = HEADS // t

    class Column(nn.Module):
        def __init__(self, n_in: int, n_out: int):
            super().__init__()
            self.weight = nn.Parameter((torch.randn(n_in, n_out) * 0.1).chunk(t, 1)[rank].contiguous())

        def forward(self, x):
            return x @ self.weight

    class Row(nn.Module):
        def __init__(self, n_in: int, n_out: int):
            super().__init__()
            self.weight = nn.Parameter((torch.randn(n_in, n_out) * 0.1).chunk(t, 0)[rank].contiguous())

        def forward(self, x):
            return reduce(x @ self.weight) if t > 1 else x @ self.weight

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            return nn.functional.layer_norm(x, (H,), self.weight)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = Column(H, H), Column(H, H), Column(H, H), Row(H, H)

        def forward(self, y, memory=None):  # memory: the encoder's output, for a cross-attention
            src = copy(y) if memory is None else copy(memory)
            q = self.q(copy(y) if memory is not None else src).view(B, -1, heads, D).transpose(1, 2)
            k, v = (p(src).view(B, -1, heads, D).transpose(1, 2) for p in (self.k, self.v))
            a = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, -1) @ v
            return self.o(a.transpose(1, 2).reshape(B, -1, heads * D))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = Column(H, FFN), Row(FFN, H)

        def forward(self, x):
            return self.down(nn.functional.gelu(self.up(copy(x))))

    class EncoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.norm1, self.mlp, self.norm2 = Attention(), Norm(), Mlp(), Norm()

        def forward(self, x):
            x = self.norm1(x + self.attn(x))
            return self.norm2(x + self.mlp(x))

    class DecoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.norm1, self.cross, self.norm2 = Attention(), Norm(), Attention(), Norm()
            self.mlp, self.norm3 = Mlp(), Norm()

        def forward(self, x, memory):
            x = self.norm1(x + self.attn(x))
            x = self.norm2(x + self.cross(x, memory))
            return self.norm3(x + self.mlp(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Parameter(torch.randn(V, H).chunk(t, 0)[rank].contiguous())  # vocab-parallel, shared
            self.encoder = nn.ModuleList(EncoderLayer() for _ in range(L))
            self.decoder = nn.ModuleList(DecoderLayer() for _ in range(L))

        def lookup(self, ids):  # Megatron's: ids outside the rank's rows zeroed, the parts summed over TP
            n = self.tokens.shape[0]
            outside = (ids < rank * n) | (ids >= (rank + 1) * n)
            x = nn.functional.embedding((ids - rank * n).masked_fill(outside, 0), self.tokens)
            x = x.masked_fill(outside[..., None], 0)
            return reduce(x) if t > 1 else x

        def forward(self, ids, decoder_ids):
            memory = self.lookup(ids)
            for layer in self.encoder:
                memory = layer(memory)
            x = self.lookup(decoder_ids)
            for layer in self.decoder:
                x = layer(x, memory)
            return leave(x).sum()

    return Model()


def inputs():
    torch.manual_seed(1)
    return torch.randint(0, V, (B, SE)), torch.randint(0, V, (B, SD))


@pytest.fixture(scope="module")
def report():
    import flopcount

    return flopcount.from_torch(encoder_decoder(), inputs(), training=True, optimizer="sgd", cache_dir=False,
                                memory=MemorySettings(device="cpu"))


def _worker(rank: int, world: int, init: str, out: str, sp: bool) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec = Recorder()
    module = encoder_decoder(world, rank, rec, sp)
    with FlopCounterMode(display=False) as counter:
        loss = module(*inputs())
        forward = len(rec.calls)
        loss.backward()
    backward = len(rec.calls)
    norms = [p.grad for name, p in module.named_parameters() if sp and "norm" in name]
    if norms:  # the norms saw the rank's tokens only: summed, in one flattened call as Megatron makes it
        flat = rec.all_reduce(torch.cat([g.reshape(-1) for g in norms]))
        for g, part in zip(norms, flat.split([g.numel() for g in norms])):
            g.copy_(part.view_as(g))
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes(), "params": params,
                   "calls": phased(rec.calls, forward, backward)}, f)
    dist.destroy_process_group()


def test_the_counted_model_has_two_stacks_and_cross_attention(report):
    from flopcount.parallel.layout import layout_of

    layout = layout_of(report, parse_parallel("tp=2"))
    assert layout.stacks == (("encoder", 0), ("decoder", L))
    assert layout.blocks == (2,) * L + (3,) * L and layout.cross == (0,) * L + (SE,) * L
    assert report.params == V * H + L * (4 * H * H + 2 * H * FFN + 2 * H) + L * (8 * H * H + 2 * H * FFN + 3 * H)


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_tp_on_gloo_equals_the_ledger(report, tmp_path, sp):
    seen = gloo_ranks(_worker, tmp_path, sp)
    plan = "tp=2,sp" if sp else "tp=2"
    p = parse_parallel(plan)
    led = ledger(report, p)
    mem = per_rank(report, p).ranks
    ae, ad = B * SE * H * 4, B * SD * H * 4  # an encoder's and a decoder's activation, fp32
    rows = L * 2 * ae + L * 3 * ad  # after the row-parallel products, per block of each layer's stream
    cols = rows + L * ae  # before the column-parallel ones: and each cross-attention's K/V input
    if sp:  # each all_reduce of a block a gather and a reduce-scatter; the lookups', the output gathered, the norms
        want = {"all_gather(tp)": cols + rows + ad + ae + ad, "reduce_scatter(tp)": rows + cols + ae + ad,
                "all_reduce(tp)": (2 * L + 3 * L) * H * 4}
    else:
        # per encoder layer 2 all_reduces in the forward and 2 in the backward; per decoder layer 3 and 3, and the
        # cross-attention's K/V input (the encoder's output) in the backward; the two lookups
        want = {"all_reduce(tp)": rows + cols + ae + ad}
    for i, rank in enumerate(seen):
        products = sum(x.forward + x.backward for x in node_shares(report, p)
                       if x.tp == i and report.nodes[x.index].family in ("matmul", "gemm"))
        assert rank["flops"] == products
        assert rank["bytes"] == ledger_bytes(led.ranks[i]) == want
        assert rank["params"] == mem[i].params_bytes == 4 * led.ranks[i].optimizer_flops // 2
        # each call by phase as the step-time predictor prices it: the encoder's and the decoder's lookups a call
        # each (ae and ad), not one of their sum
        assert predicted_calls(report, plan, i) == recorded(rank)
