"""Tensor parallelism of a Hugging Face Llama for ``step_time.py``, as Megatron-LM splits it and as
docs/parallel.md counts it: q/k/v, gate and up projections split by columns, o and down projections by rows, each
attention and MLP block's input copied (its gradient all-reduced in the backward) and its output all-reduced in
the forward; the embedding and the LM head split over the vocabulary (the lookup masked and all-reduced, the head's
input gradient all-reduced), and the loss computed on the vocabulary shards with three all_reduces (max, sum of
exponentials, target logit).

With ``sp`` (sequence parallelism, as Megatron-LM runs it and docs/parallel.md counts ``sp``): between the blocks
each rank holds 1/T of the tokens (the norms and residual adds on them); a block's input is all-gathered over the
sequence (its gradient reduce-scattered) and its output reduce-scattered (its gradient all-gathered); the
embedding's output is reduce-scattered, and the final hidden states all-gathered before the LM head. The gathered
input is kept for the backward (torch's rule, ``sp=torch``). The tensors are batch-first, so each gather and
scatter moves the sequence axis to the front and back (copies torch's own SequenceParallel makes too)."""

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


class _Gather(torch.autograd.Function):
    """All-gather over the sequence (axis 1) forward; reduce-scatter of the gradient over it backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, group)

    @staticmethod
    def backward(ctx, g):
        return _scatter(g, ctx.group), None


class _Scatter(torch.autograd.Function):
    """Reduce-scatter over the sequence (axis 1) forward; all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _scatter(x, group)

    @staticmethod
    def backward(ctx, g):
        return _gather(g, ctx.group), None


def _gather(x, group):
    t = dist.get_world_size(group)
    s = x.transpose(0, 1).contiguous()
    out = s.new_empty((s.shape[0] * t, *s.shape[1:]))
    dist.all_gather_into_tensor(out, s, group=group)
    return out.transpose(0, 1).contiguous()


def _scatter(x, group):
    t = dist.get_world_size(group)
    s = x.transpose(0, 1).contiguous()
    out = s.new_empty((s.shape[0] // t, *s.shape[1:]))
    dist.reduce_scatter_tensor(out, s, group=group)
    return out.transpose(0, 1).contiguous()


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
    def __init__(self, inner, group, sp: bool = False):
        super().__init__()
        self.inner, self.group = inner, group
        self.enter, self.leave = (_Gather, _Scatter) if sp else (_Copy, _Reduce)

    def forward(self, hidden_states, **kw):
        out, w = self.inner(self.enter.apply(hidden_states, self.group), **kw)
        return self.leave.apply(out, self.group), w


class _Block(nn.Module):
    def __init__(self, inner, group, sp: bool = False):
        super().__init__()
        self.inner, self.group = inner, group
        self.enter, self.leave = (_Gather, _Scatter) if sp else (_Copy, _Reduce)

    def forward(self, x):
        return self.leave.apply(self.inner(self.enter.apply(x, self.group)), self.group)


class _Embedding(nn.Module):
    def __init__(self, emb: nn.Embedding, i: int, t: int, group, sp: bool = False):
        super().__init__()
        w = emb.weight.detach().chunk(t, 0)[i]
        self.weight = nn.Parameter(w.clone())
        self.lo, self.group, self.leave = i * w.shape[0], group, _Scatter if sp else _Reduce

    def forward(self, ids):
        local = ids - self.lo
        outside = (local < 0) | (local >= self.weight.shape[0])
        e = F.embedding(local.masked_fill(outside, 0), self.weight) * (~outside)[..., None]
        return self.leave.apply(e, self.group)


class TensorParallelLM(nn.Module):
    """TP rank ``i`` of ``t`` of a ``LlamaForCausalLM``; ``forward(ids)`` gives the mean next-token loss."""

    def __init__(self, model, i: int, t: int, group, sp: bool = False):
        super().__init__()
        for layer in model.model.layers:
            a, mlp = layer.self_attn, layer.mlp
            a.q_proj, a.k_proj, a.v_proj = (_cols(p, i, t) for p in (a.q_proj, a.k_proj, a.v_proj))
            a.o_proj = _rows(a.o_proj, i, t)
            mlp.gate_proj, mlp.up_proj = _cols(mlp.gate_proj, i, t), _cols(mlp.up_proj, i, t)
            mlp.down_proj = _rows(mlp.down_proj, i, t)
            layer.self_attn, layer.mlp = _Attention(a, group, sp), _Block(mlp, group, sp)
        model.model.embed_tokens = _Embedding(model.model.embed_tokens, i, t, group, sp)
        model.lm_head = _cols(model.lm_head, i, t)
        self.model, self.group, self.lo, self.sp = model, group, i * model.lm_head.weight.shape[0], sp

    def reduce_norm_grads(self) -> None:
        """Under sp, sum the norms' weight gradients over the group, once a step (each rank's come from its tokens
        alone: Megatron's all-reduce of the layer-norm gradients, (2L + 1)·h elements in one message)."""
        if not self.sp:
            return
        norms = [p for n, p in self.model.named_parameters() if n.endswith("norm.weight") and p.grad is not None]
        flat = torch.cat([p.grad.flatten() for p in norms])
        dist.all_reduce(flat, group=self.group)
        for p, g in zip(norms, flat.split([p.numel() for p in norms])):
            p.grad.copy_(g.view_as(p))

    def forward(self, ids):
        if self.sp:  # the rotary table and the causal mask over the whole sequence, not the rank's tokens
            pos = torch.arange(ids.shape[1]).unsqueeze(0)
            h = self.model.model(input_ids=ids, position_ids=pos).last_hidden_state
            logits = self.model.lm_head(_Gather.apply(h, self.group))
        else:
            h = self.model.model(input_ids=ids).last_hidden_state
            logits = self.model.lm_head(_Copy.apply(h, self.group))
        return _VocabLoss.apply(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten(), self.lo, self.group)
