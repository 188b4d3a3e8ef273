"""Routed experts that transformers keeps as one module per expert (SwitchTransformers' ``SwitchTransformersExperts``:
a ``ModuleDict`` of ``expert_0`` … ``expert_{E-1}``, each a dense MLP, run by a loop over the experts a batch
happens to hit, whose ``nonzero`` has no shape before the routing is known) are counted as a batched product, as
:data:`flopcount.frontends.hf.EXPERTS_IMPLEMENTATION` counts stacked experts: each token's one expert's weights
gathered from the experts' stacked weights, so the graph runs exactly one expert per token (the no-drop count).

**Capacity.** transformers' top-1 router masks out a token routed to an expert that already holds
``expert_capacity`` tokens of its sequence (the mask's cumulative sum along the sequence); its eager forward then
runs no expert for that token (its MLP output is zero, the residual passes it on). The batched product runs that
token's expert too and multiplies its output by 0 (its row of the mask), so its graph counts the work of every token:
equal to the eager run's when no expert receives more than ``expert_capacity`` tokens of a sequence, more when one
does (the capacity's bound is the report's ``moe`` summary, ``--capacity-factor``)."""

from __future__ import annotations

import types
from typing import Any

__all__ = ["TOP1_EXPERTS", "batch_experts", "expert_modules", "top_k"]

#: The classes of per-expert modules of a top-1 router that :func:`batch_experts` rewrites.
TOP1_EXPERTS = ("SwitchTransformersExperts",)


def _batched_forward(self: Any, hidden_states: Any, selected_experts: Any, routing_weights: Any) -> Any:
    """The experts' output of each token: its chosen expert (the one-hot ``selected_experts``, all zero for a token
    dropped over capacity) run on it as one batched product, times its routing weight (0 when dropped)."""
    import torch

    experts = [self[f"expert_{i}"] for i in range(self.num_experts)]
    chosen = selected_experts.reshape(hidden_states.shape[0], -1)
    index = chosen.argmax(-1)
    weight = routing_weights.reshape(-1, 1) * chosen.sum(-1, keepdim=True).to(hidden_states.dtype)
    w_in = torch.stack([e.wi.weight for e in experts])[index]  # (tokens, d_ff, d_model)
    w_out = torch.stack([e.wo.weight for e in experts])[index]  # (tokens, d_model, d_ff)
    inner = experts[0].dropout(experts[0].act(torch.bmm(w_in, hidden_states[:, :, None])))
    return torch.bmm(w_out, inner)[:, :, 0] * weight


def batch_experts(model: Any) -> None:
    """Make every module of :data:`TOP1_EXPERTS` in ``model`` run :func:`_batched_forward` (see the module's rules)."""
    for module in model.modules():
        if type(module).__name__ in TOP1_EXPERTS:
            module.forward = types.MethodType(_batched_forward, module)


def expert_modules(module: Any) -> bool:
    """Whether ``module`` holds its ``num_experts`` experts as one submodule each (:data:`TOP1_EXPERTS`)."""
    return type(module).__name__ in TOP1_EXPERTS


def top_k(model: Any) -> int | None:
    """The experts a token runs: the configuration's ``num_experts_per_tok`` (or ``moe_topk``), 1 for a model with
    :data:`TOP1_EXPERTS`; None when unknown."""
    k = getattr(model.config, "num_experts_per_tok", None) or getattr(model.config, "moe_topk", None)
    if k:
        return int(k)
    return 1 if any(expert_modules(m) for m in model.modules()) else None
