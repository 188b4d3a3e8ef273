"""Sequence parallelism against 2 real TP ranks on gloo: a Llama-like model (RMSNorms, Q/K/V/O without biases, 2
K/V heads, a SwiGLU MLP, an untied LM head) at ``tp=2,sp``, written with Megatron-style local shards. Each rank holds
the residual stream of its S/T tokens: the norms and residual adds run on them, the tokens are all-gathered before
each column-parallel product (their gradient reduce-scattered) and reduce-scattered after each row-parallel one
(their gradient all-gathered); the vocab-parallel embedding's lookup is reduce-scattered, the LM head's input
gathered, its loss a vocab-parallel cross-entropy (all_reduces of b·s maxima, target logits and sums). The norm weights, whole on every rank, see only the rank's tokens: their gradients are partial and are
all-reduced over TP once per step (Megatron's ``_allreduce_layernorm_grads``), (2L+1)·h elements. And the
GPT-2-like model of gloo_shards at ``tp=2,sp`` as Megatron runs a model with learned positions: the embedding's
lookup all-reduced, the positions added to the whole sequence and each rank keeping its tokens (their gradient
gathered); the row-parallel biases, added after the reduce-scatter to the rank's tokens, have partial gradients
too, all-reduced with the LayerNorms' weights and biases. Under recompute (each Llama layer under
torch.utils.checkpoint, reentrant for ``--recompute full``, non-reentrant for ``--recompute non-reentrant``) the
rerun forward gathers and reduce-scatters again where it passes them. Each rank's ``FlopCounterMode`` total, the
bytes it hands to each collective, and its parameter bytes equal the ledger's."""

from __future__ import annotations

import json

import pytest
import gloo_shards as g2
from gloo_shards import Recorder, gpt2_like, ledger_bytes, rms_norm, vocab_lookup
from helpers import gloo_ranks

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

torch = pytest.importorskip("torch")

H, L, HEADS, KV, FFN, V = 32, 2, 4, 2, 48, 64
D = H // HEADS
B, S = 2, 8


def llama_like(t: int = 1, rank: int = 0, rec: Recorder | None = None, checkpoint=None, megatron: bool = False):
    """The model on TP rank ``rank`` of ``t`` under sp (whole with t = 1): ``rec``'s gather and scatter around
    the products and the embedding; ``checkpoint(fn, x)`` wraps each layer's call. Each block's column-parallel
    products (Q, K, V; gate, up; the LM head) read its input gathered once; with ``megatron``, through
    :func:`megatron_column` (the rank's tokens kept, gathered again in the backward), else gathered before them
    and kept so by autograd."""
    nn = torch.nn
    torch.manual_seed(0)
    gather = rec.gather if rec else (lambda x: x)
    scatter = rec.scatter if rec else (lambda x: x)

    def columns(y, *projections):  # the products of a block's input y (the rank's tokens under sp)
        if megatron and rec is not None:
            return megatron_column(rec)(y, *(p.weight for p in projections))
        y = gather(y).contiguous()  # in the layout torch's gather along the sequence gives (DTensor's Shard(1) to
        # Replicate): one storage the products' inputs are views of, kept once
        return tuple(p(y) for p in projections)

    class Proj(nn.Module):  # y·Wᵀ, W in nn.Linear's layout, one module per projection
        def __init__(self, w):
            super().__init__()
            self.weight = nn.Parameter(w.contiguous())

        def forward(self, y):
            return y @ self.weight.T

    def column(n_out: int):  # the output rows split
        return Proj((torch.randn(n_out, H) * 0.1).chunk(t, 0)[rank])

    def row(n_in: int):  # the input columns split
        return Proj((torch.randn(H, n_in) * 0.1).chunk(t, 1)[rank])

    Norm = rms_norm(H, noisy=True)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = column(H), column(KV * D), column(KV * D), row(H)

        def forward(self, y):
            b, s = y.shape[:2]
            q, k, v = columns(y, self.q, self.k, self.v)
            s = q.shape[1]  # the whole sequence
            q = q.view(b, s, HEADS // t, D).transpose(1, 2)
            k, v = (w.view(b, s, KV // t, D).transpose(1, 2).repeat_interleave(HEADS // KV, 1) for w in (k, v))
            causal = torch.full((s, s), float("-inf")).triu(1)
            a = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + causal, -1) @ v
            return self.o(a.transpose(1, 2).reshape(b, s, H // t))

    class Mlp(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate, self.up, self.down = column(FFN), column(FFN), row(FFN)

        def forward(self, y):
            gate, up = columns(y, self.gate, self.up)
            return self.down(nn.functional.silu(gate) * up)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.attn, self.norm2, self.mlp = Norm(), Attention(), Norm(), Mlp()

        def forward(self, x):
            x = x + scatter(self.attn(self.norm1(x)))
            return x + scatter(self.mlp(self.norm2(x)))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Parameter(torch.randn(V, H).chunk(t, 0)[rank].contiguous())  # vocab-parallel
            self.layers = nn.ModuleList(Layer() for _ in range(L))
            self.norm, self.head = Norm(), column(V)

        def forward(self, ids):
            x = vocab_lookup(ids, self.tokens, rank, t, scatter)
            for layer in self.layers:
                x = checkpoint(layer, x) if checkpoint else layer(x)
            logits, = columns(self.norm(x), self.head)  # this rank's V/t logits of every token
            if rec is None:
                return nn.functional.cross_entropy(logits.reshape(-1, V), ids.reshape(-1))
            return vocab_parallel_loss(logits, ids - rank * (V // t), rec)

    return Model()


def megatron_column(rec: Recorder):
    """A block's column-parallel products y·Wᵢᵀ of the rank's tokens y (b, s/T, h) as Megatron-LM's
    ``ColumnParallelLinear`` under ``sequence_parallel`` runs them (``LinearWithGradAccumulationAndAsyncCommunication``,
    one fused weight per block: QKV, gate and up, the LM head): the tokens all-gathered in the forward, only the
    rank's kept for the backward, all-gathered again there for the weights' gradients, the input's gradient
    reduce-scattered; ``.apply``."""
    class Column(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, *weights):
            ctx.save_for_backward(y, *weights)
            whole = rec.gather(y)  # autograd is off in a Function's forward: the collective alone
            return tuple(whole @ w.T for w in weights)

        @staticmethod
        def backward(ctx, *grads):
            y, *weights = ctx.saved_tensors
            whole = rec.gather(y)  # again: only the rank's tokens were kept
            flat = whole.reshape(-1, whole.shape[-1])
            dweights = [g.reshape(-1, g.shape[-1]).T @ flat for g in grads]
            dwhole = sum(g @ w for g, w in zip(grads, weights))
            return (rec.scatter(dwhole), *dweights)

    return Column.apply


def vocab_parallel_loss(logits, target, rec: Recorder):
    """The mean cross-entropy of logits split over the vocabulary, as Megatron's vocab-parallel cross-entropy runs
    it: the all_reduces of each token's maximum logit, of its target's logit (held by one rank) and of its sum of
    exponentials; ``target``: the token ids less this rank's first."""
    import torch.distributed as dist

    top = logits.detach().amax(-1)
    rec.note("all_reduce", top)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    shifted = logits - top[..., None]
    mine = (target >= 0) & (target < logits.shape[-1])
    picked = shifted.gather(-1, target.clamp(0, logits.shape[-1] - 1)[..., None])[..., 0] * mine
    total = rec.reduce(shifted.exp().sum(-1))
    return (torch.log(total) - rec.reduce(picked)).mean()


def ids():
    torch.manual_seed(1)
    return torch.randint(0, V, (B, S))


def norm_grads(module) -> list[float]:
    return torch.cat([p.grad for name, p in module.named_parameters() if "norm" in name]).tolist()


@pytest.fixture(scope="module")
def report():
    import flopcount

    return flopcount.from_torch(llama_like(), (ids(),), training=True, optimizer="sgd", cache_dir=False,
                                memory=MemorySettings(device="cpu"))


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec = Recorder()
    module = llama_like(world, rank, rec)
    with FlopCounterMode(display=False) as counter:
        loss = module(ids())
        loss.backward()
    local = norm_grads(module)
    for name, p in module.named_parameters():  # the partial gradients of the weights whole on every rank
        if "norm" in name:
            p.grad.copy_(rec.all_reduce(p.grad))
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes(), "params": params, "local": local,
                   "summed": norm_grads(module), "loss": loss.item()}, f)
    dist.destroy_process_group()


def test_whole_model_is_the_one_counted(report):
    assert report.params == V * H + L * (2 * H + 2 * H * H + 2 * KV * D * H + 3 * H * FFN) + H + V * H


def test_sp_on_gloo_equals_the_ledger(report, tmp_path):
    whole = llama_like()
    loss = whole(ids())
    loss.backward()
    seen = gloo_ranks(_worker, tmp_path)
    p = parse_parallel("tp=2,sp")
    led = ledger(report, p)
    mem = per_rank(report, p).ranks
    a = B * S * H * 4  # one activation, fp32
    for i, rank in enumerate(seen):
        assert rank["loss"] == pytest.approx(loss.item(), rel=1e-5)  # the vocab-parallel loss is the whole one
        # the norms' gradients: partial on each rank (its tokens), the whole model's once summed over TP
        assert not torch.allclose(torch.tensor(rank["local"]), torch.tensor(norm_grads(whole)), atol=1e-6)
        assert torch.allclose(torch.tensor(rank["summed"]), torch.tensor(norm_grads(whole)), atol=1e-5)
        # every product is split over TP (column, row, heads, vocab): no bias, no replicated product
        assert rank["flops"] == sum(x.forward + x.backward for x in node_shares(report, p)
                                    if x.tp == i and report.nodes[x.index].family in ("matmul", "gemm"))
        assert rank["bytes"] == ledger_bytes(led.ranks[i]) == {
            "all_gather(tp)": 4 * L * a + 2 * a, "reduce_scatter(tp)": 4 * L * a + 2 * a,
            "all_reduce(tp)": (2 * L + 1) * H * 4 + 3 * B * S * 4}  # the norms; the loss's max, target, sum
        assert rank["params"] == mem[i].params_bytes == 4 * led.ranks[i].optimizer_flops // 2


# --- recompute: the rerun forward's gathers and reduce-scatters ------------------------------------------------

def _recompute_worker(rank: int, world: int, init: str, out: str, policy: str) -> None:
    """Each layer under torch.utils.checkpoint: reentrant (``full``, the whole forward again, as Megatron's full
    recompute) or non-reentrant (stopping once every tensor the backward saved is back)."""
    import torch.distributed as dist
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec = Recorder()
    module = llama_like(world, rank, rec, lambda fn, x: checkpoint(fn, x, use_reentrant=policy == "full"))
    with FlopCounterMode(display=False) as counter:
        module(ids()).backward()
    for name, p in module.named_parameters():  # the norms' partial gradients, as without recompute
        if "norm" in name:
            p.grad.copy_(rec.all_reduce(p.grad))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes()}, f)
    dist.destroy_process_group()


@pytest.mark.parametrize("policy,again", [("full", (2, 2)), ("non-reentrant", (2, 1))])
def test_sp_recompute_on_gloo_reruns_the_layers_collectives(report, tmp_path, policy, again):
    """The rerun forward runs its sequence-parallel collectives again, as Megatron's full recompute does (its
    checkpointed layer's forward, gathers and reduce-scatters included, runs again before the backward): per layer
    ``again`` = (all_gathers, reduce_scatters) of A more. The reentrant checkpoint reruns the whole layer (2 and
    2); the non-reentrant one stops once the down projection's input is back, before the product and the
    reduce-scatter after it (2 and 1). The backward's collectives are the same as without recompute."""
    from flopcount.parallel.plan import parse_recompute

    seen = gloo_ranks(_recompute_worker, tmp_path, policy)
    p, r = parse_parallel("tp=2,sp"), parse_recompute(policy)
    led = ledger(report, p, r)
    a = B * S * H * 4  # one activation, fp32
    gathered, scattered = again
    for i, rank in enumerate(seen):
        assert rank["bytes"] == ledger_bytes(led.ranks[i]) == {
            "all_gather(tp)": (4 + gathered) * L * a + 2 * a, "reduce_scatter(tp)": (4 + scattered) * L * a + 2 * a,
            "all_reduce(tp)": (2 * L + 1) * H * 4 + 3 * B * S * 4}
        assert rank["flops"] == sum(x.forward + x.backward + x.recompute for x in node_shares(report, p, r)
                                    if x.tp == i and report.nodes[x.index].family in ("matmul", "gemm"))


# --- the GPT-2-like model: learned positions, LayerNorms and row-parallel biases --------------------------------

def gpt2_ids():
    torch.manual_seed(1)
    return torch.randint(0, g2.V, (g2.B, g2.S))


def partial_grads(module) -> list[float]:
    """The gradients sp leaves partial: the LayerNorms' weights and biases, the row-parallel projections' biases."""
    return torch.cat([p.grad for name, p in module.named_parameters()
                      if "norm" in name or name.endswith(("out.bias", "down.bias"))]).tolist()


@pytest.fixture(scope="module")
def gpt2_report():
    import flopcount

    return flopcount.from_torch(gpt2_like(), (gpt2_ids(),), training=True, optimizer="sgd", cache_dir=False,
                                memory=MemorySettings(device="cpu"))


def _gpt2_worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec = Recorder()
    module = gpt2_like(world, rank, rec, sp=True)
    with FlopCounterMode(display=False) as counter:
        module(gpt2_ids()).backward()
    local = partial_grads(module)
    for name, p in module.named_parameters():
        if "norm" in name or name.endswith(("out.bias", "down.bias")):
            p.grad.copy_(rec.all_reduce(p.grad))
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes(), "params": params, "local": local,
                   "summed": partial_grads(module)}, f)
    dist.destroy_process_group()


def test_sp_with_learned_positions_on_gloo_equals_the_ledger(gpt2_report, tmp_path):
    report, h, n, m = gpt2_report, g2.H, g2.L, g2.M
    whole = gpt2_like()
    whole(gpt2_ids()).backward()
    seen = gloo_ranks(_gpt2_worker, tmp_path)
    p = parse_parallel("tp=2,sp")
    led = ledger(report, p)
    mem = per_rank(report, p).ranks
    a = m * h * 4  # one activation, fp32
    for i, rank in enumerate(seen):
        assert not torch.allclose(torch.tensor(rank["local"]), torch.tensor(partial_grads(whole)), atol=1e-6)
        assert torch.allclose(torch.tensor(rank["summed"]), torch.tensor(partial_grads(whole)), atol=1e-5)
        # torch's addmm leaves out the Gemms' bias adds and their gradients' sums (see test_parallel_gloo_gpt2),
        # M·N each: all 1/T here, the row-parallel ones' added to the rank's M/T tokens after the reduce-scatter
        bias = n * 2 * (m * 3 * h // 2 + m * 4 * h // 2 + 2 * m * h // 2)
        assert rank["flops"] == sum(x.forward + x.backward for x in node_shares(report, p) if x.tp == i and
                                    report.nodes[x.index].family in ("matmul", "gemm")) - bias
        # the lookup's all_reduce, and the LayerNorms' (2L+1)·2h and the row-parallel biases' 2L·h gradients;
        # gathered: per layer 2 forward and 2 backward, the head's input, the embedding's gradient; reduce-scattered:
        # per layer 2 and 2, the head input's gradient
        assert rank["bytes"] == ledger_bytes(led.ranks[i]) == {
            "all_reduce(tp)": a + ((2 * n + 1) * 2 * h + 2 * n * h) * 4,
            "all_gather(tp)": 4 * n * a + 2 * a, "reduce_scatter(tp)": 4 * n * a + a}
        assert rank["params"] == mem[i].params_bytes == 4 * led.ranks[i].optimizer_flops // 2


# --- sp=megatron: the column-parallel products' inputs gathered again in the backward ---------------------------

def _style_worker(rank: int, world: int, init: str, out: str, megatron: bool) -> None:
    """The Llama-like model at tp=2,sp with each block's column-parallel products as torch's autograd keeps them
    (the gathered input) or as Megatron's column-parallel linear does (:func:`megatron_column`): the bytes handed to
    each collective, the storages autograd keeps (``saved_tensors_hooks``), the FLOPs and the gradients."""
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode
    from helpers import saving

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec = Recorder()
    module = llama_like(world, rank, rec, megatron=megatron)
    with FlopCounterMode(display=False) as counter:
        with saving(module) as kept:
            loss = module(ids())
        loss.backward()
    for name, p in module.named_parameters():
        if "norm" in name:
            p.grad.copy_(rec.all_reduce(p.grad))
    grads = torch.cat([p.grad.flatten() for p in module.parameters()]).tolist()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes(), "saved": sum(kept.values()),
                   "grads": grads, "loss": loss.item()}, f)
    dist.destroy_process_group()


def test_sp_megatron_on_gloo_regathers_and_keeps_the_ranks_tokens(report, tmp_path):
    """``sp=megatron`` against a hand-written Megatron-style column-parallel linear (a custom autograd Function that
    keeps the rank's tokens and all-gathers them again in its backward), ``sp`` (= ``sp=torch``) against the gather
    run before the products, whose output autograd keeps: the same loss, gradients and FLOPs; Megatron's all-gathers
    A more per gathered input and microbatch (Q/K/V's and the MLP's of each layer, the LM head's: 2L + 1), and keeps
    A/T of each in place of A."""
    (tmp_path / "torch").mkdir(), (tmp_path / "megatron").mkdir()  # a group's rendezvous file each
    kept_whole = gloo_ranks(_style_worker, tmp_path / "torch", False)
    regathered = gloo_ranks(_style_worker, tmp_path / "megatron", True)
    a, t = B * S * H * 4, 2  # one activation, fp32
    collectives = {"all_gather(tp)": 4 * L * a + 2 * a, "reduce_scatter(tp)": 4 * L * a + 2 * a,
                   "all_reduce(tp)": (2 * L + 1) * H * 4 + 3 * B * S * 4}
    torch_plan, megatron_plan = parse_parallel("tp=2,sp"), parse_parallel("tp=2,sp=megatron")
    assert torch_plan == parse_parallel("tp=2,sp=torch") and megatron_plan.sp_style == "megatron"
    assert str(megatron_plan).startswith("tp=2,pp=1,cp=1,ep=1,dp=1,sp=megatron")
    for i, (mine, theirs) in enumerate(zip(kept_whole, regathered)):
        assert theirs["loss"] == pytest.approx(mine["loss"], rel=1e-6)
        assert torch.allclose(torch.tensor(theirs["grads"]), torch.tensor(mine["grads"]), atol=1e-5)
        assert theirs["flops"] == mine["flops"]
        assert mine["bytes"] == ledger_bytes(ledger(report, torch_plan).ranks[i]) == collectives
        assert theirs["bytes"] == ledger_bytes(ledger(report, megatron_plan).ranks[i]) == {
            **collectives, "all_gather(tp)": collectives["all_gather(tp)"] + (2 * L + 1) * a}
        kept = per_rank(report, torch_plan).ranks[i], per_rank(report, megatron_plan).ranks[i]
        assert mine["saved"] - theirs["saved"] == kept[0].activations_bytes - kept[1].activations_bytes \
            == (2 * L + 1) * (a - a // t)
