"""Memory per rank against 2 real TP ranks on gloo: a tiny decoder written with Megatron-style local shards
(column-parallel Q, K, V, gate, up and LM head, row-parallel O and down whose outputs are summed by all_reduce,
replicated RMSNorm weights), its parameters and the unique storages ``saved_tensors_hooks`` catch in each rank's
forward equal the ledger's figures for that rank of ``tp=2``, and the peak of one Adam step on each rank (torch's
MemTracker) is within 5% of the ledger's; under FSDP2 on 2 gloo ranks FSDPMemTracker's model states equal the
ledger's for ``dp=2,fsdp`` and its peak is within 5% of the ledger's, the remaining bytes stated in each test."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from helpers import gloo_ranks

from flopcount.memory.ledger import MemorySettings  # noqa: E402
from flopcount.memory.ranks import per_rank  # noqa: E402
from flopcount.parallel.plan import parse_parallel  # noqa: E402

H, L, HEADS, FFN, V = 32, 2, 4, 48, 64
D = H // HEADS
B, S = 2, 8


def build(t: int, rank: int, reduce=None, copy=None):
    """The decoder on TP rank ``rank`` of ``t`` (whole with t = 1), module names as Hugging Face's Llama writes
    them; ``reduce``/``copy``: the all_reduce of the forward and of the backward (identity on one rank)."""
    nn = torch.nn
    reduce = reduce or (lambda x: x)
    copy = copy or (lambda x: x)
    torch.manual_seed(0)

    def linear(out_features, in_features, dim):
        m = nn.Linear(in_features, out_features, bias=False)
        with torch.no_grad():
            w = m.weight.chunk(t, dim)[rank].clone()  # a storage of the shard's own, as a TP rank holds
        m.weight = nn.Parameter(w)
        return m

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(H))

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (linear(H, H, 0) for _ in range(3))
            self.o_proj = linear(H, H, 1)

        def forward(self, y):
            h = HEADS // t
            q, k, v = (p(y).view(B, S, h, D).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
            a = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5, -1) @ v
            return reduce(self.o_proj(a.transpose(1, 2).reshape(B, S, h * D)))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj = linear(FFN, H, 0), linear(FFN, H, 0)
            self.down_proj = linear(H, FFN, 1)

        def forward(self, y):
            return reduce(self.down_proj(torch.nn.functional.silu(self.gate_proj(y)) * self.up_proj(y)))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm, self.self_attn = Norm(), Attention()
            self.post_attention_layernorm, self.mlp = Norm(), Mlp()

        def forward(self, x):
            x = x + self.self_attn(copy(self.input_layernorm(x)))
            return x + self.mlp(copy(self.post_attention_layernorm(x)))

    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(L))
            self.norm = Norm()
            self.lm_head = linear(V, H, 0)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(copy(self.norm(x))).sum()

    return Decoder()


def saved_storages(module, x) -> int:
    """Bytes of the unique storages the autograd graph keeps during a forward, weights left out."""
    stored = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in stored:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    return sum(seen.values())


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # in place on the row-parallel output, as Megatron's: no buffer of its own
            ctx.mark_dirty(x)
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            g = g.clone()
            dist.all_reduce(g)
            return g

    module = build(world, rank, Reduce.apply, Copy.apply)
    x = torch.randn(B, S, H, requires_grad=False)
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    saved = saved_storages(module, x)
    opt = torch.optim.Adam(module.parameters(), foreach=False)

    def step():
        opt.zero_grad(set_to_none=True)
        module(x).backward()
        opt.step()

    step()  # the first step makes the optimizer's states
    tracker = MemTracker()
    tracker.track_external(module, opt)
    with tracker:
        step()
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"params": params, "saved": saved, "peak": {str(getattr(k, "value", k)): v for k, v in peak.items()}}, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def report():
    import flopcount

    return flopcount.from_torch(build(1, 0), (torch.randn(B, S, H),), training=True, optimizer="adam",
                                cache_dir=False, memory=MemorySettings(device="cpu"))


def exported_extra(t: int) -> int:
    """What the exported graph keeps beyond torch's autograd on a TP rank of t, per op: SiLU is exported as
    x·Sigmoid(x), whose Mul keeps the sigmoid's output besides x (torch's silu keeps x only), B·S·FFN/t float32 per
    layer; rsqrt as a Sqrt and a reciprocal Div, the Div keeping the Sqrt's output besides its own (torch's rsqrt
    keeps its output only), B·S float32 per norm of a layer (2 a layer), whole on every TP rank without sp."""
    return L * B * S * (FFN // t) * 4 + 2 * L * B * S * 4


def test_one_rank_ledger_equals_saved_storages(report):
    """The base the per-rank figures are cut from: on one rank the ledger equals torch's saved storages, but for
    the exported graph's per-op differences."""
    module = build(1, 0)
    saved = saved_storages(module, torch.randn(B, S, H))
    assert report.memory.ranks[0].activations_bytes == saved + exported_extra(1)


@pytest.fixture(scope="module")
def tp_seen(tmp_path_factory):
    """What each of the 2 TP ranks saw (one gloo run for both tests)."""
    return gloo_ranks(_worker, tmp_path_factory.mktemp("tp"))


def test_tp_on_gloo_equals_the_ledger(report, tp_seen):
    ranks = per_rank(report, parse_parallel("tp=2")).ranks
    for i, seen in enumerate(tp_seen):
        assert ranks[i].params_bytes == seen["params"]
        assert ranks[i].activations_bytes == seen["saved"] + exported_extra(2)


def test_tp_peak_on_gloo_within_5_percent_of_mem_tracker(report, tp_seen):
    """The peak of one Adam step (after a first made the states) on each of 2 TP ranks, against torch's MemTracker
    on that rank. Both peak at the start of the backward, in the LM head's: the gradients then are the head's shard
    and the final norm's (MemTracker's "Gradient" at its peak). The all_reduce of the row-parallel outputs runs in
    place (Megatron's), so it adds no buffer, and the ledger adds none. MemTracker sees what is allocated while it
    tracks: the input batch, made before, is left out of the ledger's peak here. What remains (measured with torch
    2.13, not asserted: a residual read off both tools is no derived figure): the ledger is 1,212 bytes (0.67%) above on each rank; the exported graph keeps 3,328 bytes more than torch's autograd
    (``exported_extra(2)``: SiLU's sigmoid, rsqrt's Sqrt), and the other -2,116 bytes are in MemTracker's
    "Activation" and "Temp" at that moment (what torch's backward has freed or not yet made), not itemized."""
    ranks = per_rank(report, parse_parallel("tp=2")).ranks
    for i, seen in enumerate(tp_seen):
        r, peak = ranks[i], seen["peak"]
        assert peak["Parameter"] == r.params_bytes  # each shard a storage of its own
        assert peak["Gradient"] == 4 * (V // 2 * H + H)  # the LM head's shard and the final norm's
        assert (r.peak_phase, r.peak_node) == ("backward", "/lm_head/MatMul")
        mine = r.peak_bytes - r.inputs_bytes
        assert abs(mine - peak["Total"]) <= 0.05 * peak["Total"]


def _fsdp_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    module = build(1, 0)
    for layer in module.layers:  # one unit per layer, the rest in the root's
        fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    opt = torch.optim.Adam(module.parameters(), foreach=False)
    x = torch.randn(B, S, H)

    def step():
        opt.zero_grad(set_to_none=True)
        module(x).backward()
        opt.step()

    step()  # the first step makes the optimizer's states
    tracker = FSDPMemTracker(module, opt)
    tracker.track_inputs((x,))
    with tracker:
        step()
    snaps = {w: tracker.get_tracker_snapshot(w)[torch.device("cpu")] for w in ("current", "peak")}
    with open(f"{out}.{rank}", "w") as f:
        json.dump({w: {str(getattr(k, "value", k)): v for k, v in snap.items()} for w, snap in snaps.items()}, f)
    dist.destroy_process_group()


def test_fsdp2_on_gloo_equals_fsdp_mem_tracker(report, tmp_path):
    """FSDP2 (fully_shard per layer and at the root) on 2 gloo ranks: FSDPMemTracker's sharded parameters,
    sharded gradients and optimizer states equal the ledger's for dp=2,fsdp, byte for byte (every dim 0 here is
    even, so FSDP2 pads nothing)."""
    whole = report.memory.ranks[0]
    (rank,) = per_rank(report, parse_parallel("dp=2,fsdp")).ranks
    for both in gloo_ranks(_fsdp_worker, tmp_path):
        seen, peak = both["current"], both["peak"]
        assert rank.params_bytes == seen["Sharded Param"] == whole.params_bytes // 2
        assert rank.grads_bytes == seen["Sharded Grad"]
        # Adam: two moments of the shard and a float32 step counter per parameter tensor (9 a layer, 2 outside)
        assert rank.optimizer_bytes == seen["OptState"] == 2 * whole.params_bytes // 2 + 4 * (9 * L + 2)
        # the peak, within 5% of FSDPMemTracker's: at its peak (in the backward) one layer unit's all-gather buffer
        # (the next unit, prefetched) and the running unit's gradients copied for their reduce-scatter, each one
        # layer's parameters whole; the root's parameters (final norm and LM head) gathered whole from its forward
        unit, root = 4 * (4 * H * H + 3 * H * FFN + 2 * H), 4 * (V * H + H)
        assert rank.allgather_bytes == peak["All Gather"] == peak["Reduce Scatter"] == unit
        assert peak["Unsharded Param"] == root
        assert rank.peak_phase == "backward"
        assert abs(rank.peak_bytes - peak["Total"]) <= 0.05 * peak["Total"]
        # what remains (measured with torch 2.13, not asserted), 11,332 bytes (3.8%) below: the walk holds the buffers above throughout, and at its peak
        # (the LM head's backward) its activations, their gradients and the unsharded gradients come to 11,332
        # bytes less than FSDPMemTracker's "Activation", "Temp" and "Unsharded Grad" at its own (a layer's
        # reduce-scatter, later in the backward); not itemized per op
