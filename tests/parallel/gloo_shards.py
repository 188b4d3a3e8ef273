"""What the gloo tests of tests/parallel share: the collectives a hand-sharded model calls, each recording the bytes
it hands to torch.distributed by kind, the pieces the hand-sharded models repeat (an RMSNorm, a vocab-parallel
embedding's lookup, the TP and EP groups of rank = tp + T·dp), the GPT-2-like model and the Mixtral-like model's
attention and LM head written with Megatron-style local shards.

Bytes are the payload handed to the collective, as the ledger counts them: the full tensor of an all_reduce, the
gathered output of an all_gather, the input of a reduce_scatter, the tensor sent of a send."""

from __future__ import annotations

import dataclasses
from collections import Counter

from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger

H, L, HEADS, V, P = 32, 2, 4, 64, 16
KV = 2  # the K/V heads of the Llama-like models
D = H // HEADS
B, S = 2, 8
M = B * S  # tokens of a microbatch


class Recorder:
    """Collectives on one rank's process group ``group`` (None: the default one), as autograd functions over the
    sequence axis 1 of a (batch, sequence, hidden) activation where they split it, and the bytes handed to each
    (``moved[(kind, group name)]``, shared with other recorders when given)."""

    def __init__(self, group=None, name: str = "tp", moved: Counter | None = None):
        import torch
        import torch.distributed as dist

        self.moved: Counter = Counter() if moved is None else moved
        self.calls: list[tuple[str, int]] = []  # each call's (kind, bytes), in the order they ran
        rec, moved, n = self, self.moved, dist.get_world_size(group)

        def note(kind: str, x) -> None:
            moved[(kind, name)] += x.numel() * x.element_size()
            rec.calls.append((kind, x.numel() * x.element_size()))

        def all_reduce(x):
            x = x.clone()
            note("all_reduce", x)
            dist.all_reduce(x, group=group)
            return x

        def gather(x):  # along the sequence: (b, s/n, h) -> (b, s, h)
            x = x.transpose(0, 1).contiguous()
            y = x.new_empty(n * x.shape[0], *x.shape[1:])
            note("all_gather", y)
            dist.all_gather_into_tensor(y, x, group=group)
            return y.transpose(0, 1)

        def scatter(x):  # the sum over the group, each rank keeping its s/n tokens: (b, s, h) -> (b, s/n, h)
            x = x.transpose(0, 1).contiguous()
            y = x.new_empty(x.shape[0] // n, *x.shape[1:])
            note("reduce_scatter", x)
            dist.reduce_scatter_tensor(y, x, group=group)
            return y.transpose(0, 1)

        self.all_reduce, self.note = all_reduce, note
        F = torch.autograd.Function

        class Reduce(F):  # all_reduce in the forward, identity in the backward (after a row-parallel product)
            forward = staticmethod(lambda ctx, x: all_reduce(x))
            backward = staticmethod(lambda ctx, g: g)

        class Copy(F):  # identity in the forward, all_reduce of the gradient (before a column-parallel product)
            forward = staticmethod(lambda ctx, x: x.view_as(x))
            backward = staticmethod(lambda ctx, g: all_reduce(g))

        class Gather(F):  # sp: gather the tokens before a column-parallel product, reduce-scatter the gradient
            forward = staticmethod(lambda ctx, x: gather(x))
            backward = staticmethod(lambda ctx, g: scatter(g))

        class Scatter(F):  # sp: reduce-scatter after a row-parallel product, gather the gradient
            forward = staticmethod(lambda ctx, x: scatter(x))
            backward = staticmethod(lambda ctx, g: gather(g))

        class Split(F):  # sp: keep this rank's tokens of a whole activation, gather the gradient
            forward = staticmethod(lambda ctx, x: x.chunk(n, 1)[dist.get_rank(group)].contiguous())
            backward = staticmethod(lambda ctx, g: gather(g))

        class Whole(F):  # sp: gather the tokens for work every rank runs whole, keep its own tokens' gradient
            forward = staticmethod(lambda ctx, x: gather(x))
            backward = staticmethod(lambda ctx, g: g.chunk(n, 1)[dist.get_rank(group)].contiguous())

        class Exchange(F):  # ep: each row of x to the rank given by ``sent`` counts, back in the backward
            @staticmethod
            def forward(ctx, x, sent, received):
                ctx.splits = (sent, received)
                y = x.new_empty(sum(received), *x.shape[1:])
                note("all_to_all", x)
                dist.all_to_all_single(y, x.contiguous(), received, sent, group=group)
                return y

            @staticmethod
            def backward(ctx, g):
                sent, received = ctx.splits
                dx = g.new_empty(sum(sent), *g.shape[1:])
                note("all_to_all", g)
                dist.all_to_all_single(dx, g.contiguous(), sent, received, group=group)
                return dx, None, None

        rec.reduce, rec.copy, rec.gather, rec.scatter = Reduce.apply, Copy.apply, Gather.apply, Scatter.apply
        rec.split, rec.whole, rec.exchange = Split.apply, Whole.apply, Exchange.apply

    def bytes(self, group: str | None = None) -> dict[str, int]:
        """{"kind(group)": bytes} of what was handed, for JSON (only ``group``'s when given)."""
        return {f"{k}({g})": b for (k, g), b in self.moved.items() if group is None or g == group}


def ledger_bytes(rank, group: str | None = None) -> dict[str, int]:
    """The same {"kind(group)": bytes} of one rank of a :class:`~flopcount.parallel.ranks.ParallelLedger`."""
    return {f"{c.kind}({c.group})": c.bytes for c in rank.communication if group is None or c.group == group}


def rms_norm(width: int, noisy: bool = False):
    """The RMSNorm module class of Llama-like models (x·rsqrt(mean(x²) + 1e-6)·w over the last axis of ``width``),
    its weight ones, or with ``noisy`` 1 + 0.1·N(0, 1) drawn from torch's generator as each one is made."""
    import torch

    nn = torch.nn

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(1 + 0.1 * torch.randn(width) if noisy else torch.ones(width))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    return Norm


def vocab_lookup(ids, tokens, rank: int, t: int, reduce):
    """The embedding of ``ids`` on TP rank ``rank`` of ``t`` holding the rows ``tokens`` (its V/t of a
    vocab-parallel table), as Megatron looks it up: ids outside them read row 0 and are zeroed, and ``reduce`` (the
    group's sum) adds the ranks' parts when t > 1."""
    import torch

    n = tokens.shape[0]
    lo = rank * n
    outside = (ids < lo) | (ids >= lo + n)
    x = torch.nn.functional.embedding((ids - lo).masked_fill(outside, 0), tokens)
    return reduce(x.masked_fill(outside[..., None], 0)) if t > 1 else x


def tp_parts(t: int = 1, rank: int = 0, reduce=None):
    """(Projection, Norm): the modules of the hand-sharded models on TP rank ``rank`` of ``t`` (whole with t = 1),
    each drawing its weights from torch's generator in the same order whatever t; ``reduce``: the forward's
    all_reduce after a row-parallel product."""
    import torch

    nn = torch.nn

    def param(x):
        return nn.Parameter(x.contiguous())

    class Projection(nn.Module):
        """x·W + b with W as Conv1D keeps it, (in, out): column-parallel splits the outputs of each of ``blocks``
        (Q, K, V of a fused projection), row-parallel the inputs, its bias added whole after the reduction;
        ``whole``: replicated, the same on every rank."""

        def __init__(self, n_in: int, n_out: int, row: bool = False, blocks: int = 1, whole: bool = False):
            super().__init__()
            w, b = torch.randn(n_in, n_out) * 0.1, torch.randn(n_out) * 0.1
            self.row = row and t > 1
            if row:
                w = w.chunk(t, 0)[rank]
            elif not whole:
                w = torch.cat([c.chunk(t, 1)[rank] for c in w.chunk(blocks, 1)], 1)
                b = torch.cat([c.chunk(t, 0)[rank] for c in b.chunk(blocks, 0)], 0)
            self.weight, self.bias = param(w), param(b)

        def forward(self, x):
            flat = x.reshape(-1, x.shape[-1])
            y = reduce(flat @ self.weight) + self.bias if self.row else torch.addmm(self.bias, flat, self.weight)
            return y.view(x.shape[0], -1, y.shape[-1])  # under sp a row-parallel one returns the rank's tokens

    class Norm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight, self.bias = param(torch.ones(H)), param(torch.zeros(H))

        def forward(self, x):
            return nn.functional.layer_norm(x, (H,), self.weight, self.bias)

    return Projection, Norm


def gpt2_like(t: int = 1, rank: int = 0, rec: Recorder | None = None, sp: bool = False):
    """The GPT-2-like model on TP rank ``rank`` of ``t`` (whole with t = 1): a fused QKV projection (Conv1D's
    layout, one Gemm with its bias), GELU MLP, biases, LayerNorms, learned positions and an LM head tied to a
    vocab-parallel embedding, its modules named ``blocks.N.mix.qkv``/``out`` and ``blocks.N.ff.up``/``down``;
    ``rec``: its collectives (none on one rank). Under ``sp`` as Megatron runs a model with learned positions:
    the embedding's lookup all-reduced, the positions added to the whole sequence, each rank keeping its tokens;
    the tokens gathered before each column-parallel product and reduce-scattered after each row-parallel one."""
    import torch

    nn = torch.nn

    def same(x):
        return x

    reduce, copy, row, split = (same,) * 4 if rec is None else (rec.reduce, rec.copy, rec.reduce, same)
    if rec is not None and sp:
        copy, split = rec.gather, rec.split

        def row(y):
            return rec.scatter(y.view(B, S, -1)).reshape(-1, y.shape[-1])

    torch.manual_seed(0)
    heads = HEADS // t
    Projection, Norm = tp_parts(t, rank, row)

    def param(x):
        return nn.Parameter(x.contiguous())

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

        def embed(self, ids):  # the first stage's: token and position lookups
            x = vocab_lookup(ids, self.tokens, rank, t, reduce)
            return split(x + nn.functional.embedding(torch.arange(S), self.positions))

        def head(self, x):  # the last stage's: this rank's V/t logits of the tied head, summed
            return (copy(self.norm(x)) @ self.tokens.T).sum()

        def forward(self, ids):
            x = self.embed(ids)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return Model()


def megatron_moe_model(t: int, rank: int, rec: Recorder, column, moe, rerun: bool = False):
    """The Mixtral-like model (RMSNorms, Q/K/V/O without biases, KV K/V heads, an untied LM head, L layers) on TP
    rank ``rank`` of ``t`` under ``sp=megatron``, written with Megatron-style local shards: the vocab-parallel
    embedding's lookup reduce-scattered to the rank's tokens; per layer Q, K, V and the LM head column-parallel
    through ``column`` (test_parallel_gloo_sp's ``megatron_column(rec)``), O row-parallel, its output
    reduce-scattered by ``rec``; ``moe(split)``: each layer's MoE block on the rank's tokens (B, S/T, H), made after
    its attention's weights with ``split(w, axis)`` (``w``'s TP shard along ``axis``, a parameter); ``rerun``: each
    layer under a non-reentrant checkpoint (``--recompute non-reentrant``). The weights are drawn from torch's
    generator, seeded 0, in the same order whatever ``t``; the loss is the sum of the rank's V/T logits."""
    import torch

    nn = torch.nn
    torch.manual_seed(0)
    Norm = rms_norm(H)

    def split(w, axis):
        return nn.Parameter(w.chunk(t, axis)[rank].contiguous())

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_norm, self.post_norm = Norm(), Norm()
            self.q, self.k, self.v = split(torch.randn(H, H) * 0.1, 0), *(split(torch.randn(KV * D, H) * 0.1, 0)
                                                                           for _ in range(2))
            self.o = split(torch.randn(H, H) * 0.1, 1)
            self.mlp = moe(split)

        def forward(self, x):
            q, k, v = column(self.input_norm(x), self.q, self.k, self.v)
            q = q.view(B, S, HEADS // t, D).transpose(1, 2)
            k, v = (w.view(B, S, KV // t, D).transpose(1, 2).repeat_interleave(HEADS // KV, 1) for w in (k, v))
            causal = torch.full((S, S), float("-inf")).triu(1)
            a = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + causal, -1) @ v
            x = x + rec.scatter(a.transpose(1, 2).reshape(B, S, H // t) @ self.o.T)
            return x + self.mlp(self.post_norm(x))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = split(torch.randn(V, H), 0)  # vocab-parallel
            self.layers = nn.ModuleList(Layer() for _ in range(L))
            self.norm, self.head = Norm(), split(torch.randn(V, H) * 0.1, 0)

        def forward(self, ids):
            x = vocab_lookup(ids, self.tokens, rank, t, rec.scatter)
            for layer in self.layers:
                x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False) if rerun else layer(x)
            logits, = column(self.norm(x), self.head)  # this rank's V/t logits of every token
            return logits.sum()

    return Model()


def tp_ep_groups(t: int, d: int):
    """This rank's (TP group, EP group) at rank = tp + t·dp over ``t``·``d`` ranks, EP rank = dp: the TP groups
    {dp·t … dp·t + t - 1}, the EP groups joining the ranks of one TP rank. Every rank makes every group, as
    torch.distributed requires."""
    import torch.distributed as dist

    rank = dist.get_rank()
    tp_groups = [dist.new_group([dp * t + i for i in range(t)]) for dp in range(d)]
    ep_groups = [dist.new_group([dp * t + i for dp in range(d)]) for i in range(t)]
    return tp_groups[rank // t], ep_groups[rank % t]


def count_fsdp_collectives(moved: Counter, group: str = "dp") -> None:
    """Wrap the torch.distributed entry points FSDP2 calls (this torch's all_gather_single and
    reduce_scatter_single, older ones' all_gather_into_tensor and reduce_scatter_tensor) so that each adds the bytes
    it is handed to ``moved[(kind, group)]``: the gathered output of an all-gather, the unsharded input of a
    reduce-scatter."""
    import torch.distributed as dist

    def wrap(name, kind, which):
        run = getattr(dist, name)

        def counted(*args, **kwargs):
            t = kwargs[which] if which in kwargs else args[0 if which.startswith("output") else 1]
            moved[(kind, group)] += t.numel() * t.element_size()
            return run(*args, **kwargs)

        setattr(dist, name, counted)

    gather = "all_gather_single" if hasattr(dist, "all_gather_single") else "all_gather_into_tensor"
    scatter = "reduce_scatter_single" if hasattr(dist, "reduce_scatter_single") else "reduce_scatter_tensor"
    wrap(gather, "all_gather", "output_tensor")
    wrap(scatter, "reduce_scatter", "input")


def phased(calls: list, forward: int, backward: int) -> dict[str, list]:
    """A rank's recorded calls (kind, bytes) by phase: the first ``forward`` in the forward, those up to
    ``backward`` in the backward, the rest once the backward is done (``step``)."""
    return {"forward": calls[:forward], "backward": calls[forward:backward], "step": calls[backward:]}


def predicted_calls(report, plan: str, rank: int) -> dict[str, Counter]:
    """The step-time predictor's TP messages of ``rank`` under ``plan``, as (kind, bytes) multisets by phase."""
    from flopcount.measure.predict_report import report_work

    work = report_work(dataclasses.replace(report, parallel=ledger(report, parse_parallel(plan))))
    out: dict[str, Counter] = {"forward": Counter(), "backward": Counter(), "step": Counter()}
    for m in work.ranks[rank].messages:
        if m.group == "tp":
            assert m.count == int(m.count)
            out[m.phase][(m.kind, int(m.bytes))] += int(m.count)
    return out


def recorded(run: dict) -> dict[str, Counter]:
    return {phase: Counter((kind, n) for kind, n in calls) for phase, calls in run["calls"].items()}
