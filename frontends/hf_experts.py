"""Routed experts that transformers keeps as one module per expert (a ``ModuleDict`` of ``expert_0`` …
``expert_{E-1}``, each a dense MLP, run by a loop over the experts a batch happens to hit, whose ``nonzero`` has no
shape before the routing is known: SwitchTransformers' ``SwitchTransformersExperts``, NLLB-MoE's
``NllbMoeExperts``) are counted as a batched product, as :data:`flopcount.frontends.hf.EXPERTS_IMPLEMENTATION`
counts stacked experts: each (token, chosen expert) pair's weights (and biases, where the expert's layers have them)
gathered from the experts' stacked weights, so the graph runs exactly k experts per token (the no-drop count), k
being the router's (:data:`EXPERT_MODULES`: 1 for Switch's top-1 router, 2 for NLLB-MoE's top-2 one). Each pair's
output is the expert's MLP (its own activation and dropout, between its two layers) times the pair's routing
weight, then NLLB-MoE's ``moe_token_dropout`` as its loop applies it (a dropout in training, a scale by 1 − p in
inference), summed over the token's k pairs.

**Capacity.** transformers' routers mask out a token routed to an expert that already holds ``expert_capacity``
tokens (Switch: of its sequence; NLLB-MoE: of the batch, the second choices after the first); its eager forward then
runs no expert for that pair (its output is zero). The batched product runs that pair's expert too and multiplies
its output by 0 (its routing weight), so its graph counts the work of every pair: equal to the eager run's when no
expert receives more than ``expert_capacity`` tokens, more when one does (the capacity's bound is the report's
``moe`` summary, ``--capacity-factor``).

**NLLB-MoE's loop.** The installed transformers' ``NllbMoeExperts`` loop takes the router's first-choice mask (one
row of E zeros and ones a token) as expert indices and one-hots it again, so it runs ``expert_0`` on E − 1 rows and
``expert_1`` on one row of each token, whatever the router chose: E expert MLPs a token, not NLLB-MoE's 2. The graph
runs each token's two chosen experts (the first from the mask, the second from the router's combined weights,
``router_probs``, which hold both gates), as the router weighs them: the model's top-2 routing."""

from __future__ import annotations

import types
from typing import Any, NamedTuple

__all__ = ["EXPERT_MODULES", "ExpertsLayout", "batch_experts", "expert_modules", "top_k"]


class ExpertsLayout(NamedTuple):
    """How a per-expert module class routes and holds its experts: ``top_k`` experts a token, the names of each
    expert's input and output layers (``nn.Linear``), and ``routing``: its forward's (mask, weights) arguments as
    ``(index, weight)``, each ``[tokens, top_k]``."""

    top_k: int
    layer_in: str
    layer_out: str
    routing: Any
    token_dropout: bool = False  # the module's ``moe_token_dropout`` (NLLB-MoE) applies to each pair's output


def _top1_routing(selected: Any, weights: Any, tokens: int) -> tuple:
    """Switch: ``selected`` one-hot ``[tokens, 1, E]`` (all zero when dropped), ``weights`` ``[tokens, 1]``."""
    chosen = selected.reshape(tokens, -1)
    weight = weights.reshape(-1, 1) * chosen.sum(-1, keepdim=True).to(weights.dtype)
    return chosen.argmax(-1, keepdim=True), weight


def _top2_routing(first: Any, gates: Any, tokens: int) -> tuple:
    """NLLB-MoE: ``first`` the first choice one-hot ``[tokens, E]`` (all zero when dropped), ``gates``
    ``[tokens, E]`` the two choices' weights (0 where dropped); the second choice is the largest gate off the first."""
    import torch

    first = first.reshape(tokens, -1).to(gates.dtype)
    rest = gates * (1 - first)
    second = rest.argmax(-1, keepdim=True)
    index = torch.cat([first.argmax(-1, keepdim=True), second], -1)
    weight = torch.cat([(gates * first).sum(-1, keepdim=True), rest.gather(-1, second)], -1)
    return index, weight


#: The per-expert module classes :func:`batch_experts` rewrites, by class name.
EXPERT_MODULES = {
    "SwitchTransformersExperts": ExpertsLayout(1, "wi", "wo", _top1_routing),
    "NllbMoeExperts": ExpertsLayout(2, "fc1", "fc2", _top2_routing, token_dropout=True),
}


def _gathered(layers: list, index: Any, hidden: Any) -> Any:
    """``layers``' (one ``nn.Linear`` an expert) product on each pair's ``hidden`` ``[pairs, in, 1]`` with its
    expert's weights (and bias) gathered by ``index`` ``[pairs]``, as one ``bmm``: ``[pairs, out, 1]``."""
    import torch

    out = torch.bmm(torch.stack([layer.weight for layer in layers])[index], hidden)
    if layers[0].bias is not None:
        out = out + torch.stack([layer.bias for layer in layers])[index][:, :, None]
    return out


def _batched_forward(self: Any, hidden_states: Any, mask: Any, weights: Any) -> Any:
    """The experts' output of each token: its k chosen experts run on it as one batched product, each times its
    routing weight (0 when dropped), summed (see the module's rules)."""
    layout = EXPERT_MODULES[type(self).__name__]
    experts = [self[f"expert_{i}"] for i in range(self.num_experts)]
    tokens, k = hidden_states.shape[0], layout.top_k
    index, weight = layout.routing(mask, weights, tokens)
    pairs = hidden_states[:, None, :].expand(tokens, k, hidden_states.shape[-1]).reshape(tokens * k, -1, 1)
    index = index.reshape(-1)
    inner = _gathered([getattr(e, layout.layer_in) for e in experts], index, pairs)
    inner = experts[0].dropout(experts[0].act(inner))
    out = _gathered([getattr(e, layout.layer_out) for e in experts], index, inner)[:, :, 0]
    out = out * weight.reshape(-1, 1).to(out.dtype)
    if layout.token_dropout and self.moe_token_dropout > 0:
        out = self.token_dropout(out) if self.training else out * (1 - self.moe_token_dropout)
    return out if k == 1 else out.reshape(tokens, k, -1).sum(1)


def batch_experts(model: Any) -> None:
    """Make every module of :data:`EXPERT_MODULES` in ``model`` run :func:`_batched_forward` (the module's rules)."""
    for module in model.modules():
        if type(module).__name__ in EXPERT_MODULES:
            module.forward = types.MethodType(_batched_forward, module)


def expert_modules(module: Any) -> bool:
    """Whether ``module`` holds its ``num_experts`` experts as one submodule each (:data:`EXPERT_MODULES`)."""
    return type(module).__name__ in EXPERT_MODULES


def top_k(model: Any) -> int | None:
    """The experts a token runs: the configuration's ``num_experts_per_tok`` (or ``moe_topk``), else the router's
    of the model's :data:`EXPERT_MODULES` (1 for Switch, 2 for NLLB-MoE); None when unknown."""
    k = getattr(model.config, "num_experts_per_tok", None) or getattr(model.config, "moe_topk", None)
    if k:
        return int(k)
    return next((EXPERT_MODULES[type(m).__name__].top_k for m in model.modules() if expert_modules(m)), None)
