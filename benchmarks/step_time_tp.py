"""Tensor parallelism of a Hugging Face Llama for ``step_time.py``, as Megatron-LM splits it and as
docs/parallel.md counts it: q/k/v, gate and up projections split by columns, o and down projections by rows, each
attention and MLP block's input copied (its gradient all-reduced in the backward) and its output all-reduced in
the forward; the embedding and the LM head split over the vocabulary (the lookup masked and all-reduced, the head's
input gradient all-reduced), and the loss computed on the vocabulary shards with three all_reduces (max, sum of
exponentials, target logit)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class _Copy(torch.autograd.Function):
    """Identity forward; the gradient all-reduced over the group in the backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g, group=ctx.group)
        return g, None


class _Reduce(torch.autograd.Function):
    """All-reduce forward; identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, g):
        return g, None


class _VocabLoss(torch.autograd.Function):
    """Mean cross-entropy of logits split over the vocabulary (rows N, this rank's V/T columns from ``lo``)."""

    @staticmethod
    def forward(ctx, logits, target, lo, group):
        vl = logits.shape[-1]
        m = logits.max(-1).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        shifted = logits - m[:, None]
        e = shifted.exp()
        s = e.sum(-1)
        dist.all_reduce(s, group=group)
        inside = (target >= lo) & (target < lo + vl)
        idx = (target - lo).clamp(0, vl - 1)
        t = shifted.gather(1, idx[:, None]).squeeze(1) * inside
        dist.all_reduce(t, group=group)
        ctx.save_for_backward(e / s[:, None], idx, inside)
        return (s.log() - t).mean()

    @staticmethod
    def backward(ctx, g):
        p, idx, inside = ctx.saved_tensors
        grad = p.clone()
        grad[torch.arange(len(idx)), idx] -= inside.to(grad.dtype)
        return grad * (g / len(idx)), None, None, None


def _cols(lin: nn.Linear, i: int, t: int) -> nn.Linear:
    w = lin.weight.detach().chunk(t, 0)[i]
    new = nn.Linear(w.shape[1], w.shape[0], bias=False)
    new.weight.data.copy_(w)
    return new


def _rows(lin: nn.Linear, i: int, t: int) -> nn.Linear:
    w = lin.weight.detach().chunk(t, 1)[i]
    new = nn.Linear(w.shape[1], w.shape[0], bias=False)
    new.weight.data.copy_(w)
    return new


class _Attention(nn.Module):
    def __init__(self, inner, group):
        super().__init__()
        self.inner, self.group = inner, group

    def forward(self, hidden_states, **kw):
        out, w = self.inner(_Copy.apply(hidden_states, self.group), **kw)
        return _Reduce.apply(out, self.group), w


class _Block(nn.Module):
    def __init__(self, inner, group):
        super().__init__()
        self.inner, self.group = inner, group

    def forward(self, x):
        return _Reduce.apply(self.inner(_Copy.apply(x, self.group)), self.group)


class _Embedding(nn.Module):
    def __init__(self, emb: nn.Embedding, i: int, t: int, group):
        super().__init__()
        w = emb.weight.detach().chunk(t, 0)[i]
        self.weight = nn.Parameter(w.clone())
        self.lo, self.group = i * w.shape[0], group

    def forward(self, ids):
        local = ids - self.lo
        outside = (local < 0) | (local >= self.weight.shape[0])
        e = F.embedding(local.masked_fill(outside, 0), self.weight) * (~outside)[..., None]
        return _Reduce.apply(e, self.group)


class TensorParallelLM(nn.Module):
    """TP rank ``i`` of ``t`` of a ``LlamaForCausalLM``; ``forward(ids)`` gives the mean next-token loss."""

    def __init__(self, model, i: int, t: int, group):
        super().__init__()
        for layer in model.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            a.q_proj, a.k_proj, a.v_proj = (_cols(p, i, t) for p in (a.q_proj, a.k_proj, a.v_proj))
            a.o_proj = _rows(a.o_proj, i, t)
            mlp.gate_proj, mlp.up_proj = _cols(mlp.gate_proj, i, t), _cols(mlp.up_proj, i, t)
            mlp.down_proj = _rows(mlp.down_proj, i, t)
            layer.self_attn, layer.mlp = _Attention(a, group), _Block(mlp, group)
        model.model.embed_tokens = _Embedding(model.model.embed_tokens, i, t, group)
        model.lm_head = _cols(model.lm_head, i, t)
        self.model, self.group, self.lo = model, group, i * model.lm_head.weight.shape[0]

    def forward(self, ids):
        h = self.model.model(input_ids=ids).last_hidden_state
        logits = self.model.lm_head(_Copy.apply(h, self.group))
        return _VocabLoss.apply(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), self.lo, self.group)
