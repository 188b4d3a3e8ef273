"""Expert parallelism of a Hugging Face Mixtral for ``step_time.py``, as docs/parallel.md counts ``ep=E``
(Megatron-Core's router and all-to-all dispatcher): the E ranks of an EP group are its data-parallel ranks, each
with its own batch; EP rank r holds experts r·R/E .. (r+1)·R/E − 1 of every MoE layer (R routed experts), the
router (``gate``) whole on every rank. In each MoE layer's forward a rank routes its own tokens (top-k of the
router's scores), gathers every rank's int64 token counts per expert over the group (``all_gather``, E·R·8 bytes)
to size what it receives, sends each (token, expert) pair's hidden vector to the rank holding that expert
(``all_to_all``: its T·k vectors, T its tokens) and the pair's routing weight with it (``all_to_all``: T·k
probabilities), runs its experts on the pairs it received, weighted (transformers' own experts forward, the grouped
product of the model's configuration), sends the outputs back (``all_to_all``: the pairs its experts ran), and sums
them into its tokens; the backward runs the three ``all_to_all`` again, reversed (the weights' gradient back to the
ranks that routed them). The experts' gradients stay on their rank (each expert has dp·cp/ep = 1 copy here); the dense
gradients are all-reduced over the data-parallel ranks by DDP, the experts' parameters left out of its buckets.

Each layer's token counts per expert (the whole group's, from the gathered counts) are added up while ``record`` is
on: the routing of the real run, which the prediction is given as ``--expert-load``."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _Exchange(torch.autograd.Function):
    """``all_to_all`` of rows: ``sent[r]`` rows of ``x`` to rank r, ``received[r]`` from it; reversed backward."""

    @staticmethod
    def forward(ctx, x, sent, received, group):
        ctx.splits, ctx.group = (sent, received), group
        y = x.new_empty(sum(received), *x.shape[1:])
        dist.all_to_all_single(y, x.contiguous(), received, sent, group=group)
        return y

    @staticmethod
    def backward(ctx, g):
        sent, received = ctx.splits
        dx = g.new_empty(sum(sent), *g.shape[1:])
        dist.all_to_all_single(dx, g.contiguous(), sent, received, group=ctx.group)
        return dx, None, None, None


class ExpertParallelMoe(nn.Module):
    """EP rank ``rank`` of ``ep`` of a Mixtral ``block`` (its ``MixtralSparseMoeBlock``): the block's router, and its
    experts cut to this rank's (the module kept, so that transformers' experts forward runs them)."""

    def __init__(self, block, rank: int, ep: int, group):
        super().__init__()
        experts = block.experts
        self.routed, self.top_k, self.ep, self.group = experts.num_experts, block.top_k, ep, group
        self.per = self.routed // ep
        self.lo = rank * self.per
        mine = slice(self.lo, self.lo + self.per)
        experts.gate_up_proj = nn.Parameter(experts.gate_up_proj.detach()[mine].clone())
        experts.down_proj = nn.Parameter(experts.down_proj.detach()[mine].clone())
        experts.num_experts = self.per
        self.gate, self.experts = block.gate, experts
        self.record = False
        self.counts = torch.zeros(self.routed, dtype=torch.float64)  # the group's tokens per expert, recorded

    def forward(self, hidden_states):
        b, s, h = hidden_states.shape
        x = hidden_states.reshape(-1, h)
        _, weights, index = self.gate(x)
        flat = index.reshape(-1)  # the (token, expert) pairs, token-major
        order = torch.sort(flat, stable=True).indices  # the pairs by expert
        tokens = order // self.top_k
        local = torch.bincount(flat, minlength=self.routed)  # int64: this rank's pairs per expert
        every = local.new_empty(self.ep * self.routed)
        dist.all_gather_into_tensor(every, local, group=self.group)
        every = every.view(self.ep, self.routed)
        if self.record:
            self.counts += every.sum(0).double()
        sent = [int(local[r * self.per:(r + 1) * self.per].sum()) for r in range(self.ep)]
        mine = every[:, self.lo:self.lo + self.per]  # what each rank sends this rank's experts
        received = mine.sum(1).tolist()
        which = torch.cat([torch.repeat_interleave(torch.arange(self.per), mine[r]) for r in range(self.ep)])
        y = _Exchange.apply(x[tokens], sent, received, self.group)
        w = _Exchange.apply(weights.reshape(-1)[order, None], sent, received, self.group)  # the pairs' weights
        out = self.experts(y, which[:, None], w)
        done = _Exchange.apply(out, received, sent, self.group)
        return x.new_zeros(x.shape).index_add(0, tokens, done).view(b, s, h)


def expert_parallel(model, rank: int, ep: int, group) -> list[ExpertParallelMoe]:
    """Each decoder layer's MoE block of ``model`` replaced by its EP rank ``rank`` of ``ep`` over ``group``; the
    blocks, in layer order."""
    blocks = []
    for layer in model.model.layers:
        layer.mlp = ExpertParallelMoe(layer.mlp, rank, ep, group)
        blocks.append(layer.mlp)
    return blocks


def expert_names(model) -> list[str]:
    """The names of the routed experts' parameters (left out of DDP's buckets: each rank holds its own)."""
    return [n for n, _ in model.named_parameters() if ".experts." in n]
