"""Mixture-of-experts layers: what a token runs, and how many parameters it touches.

A routed MoE block (Mixtral, Qwen-MoE, DeepSeek) has a router (a linear layer to E logits, a top-k), E routed
experts of which every token visits exactly k, and optionally shared experts every token visits. The graph a
frontend exports runs, for each token, its k experts (see :mod:`flopcount.frontends.hf`), so the count is exact
with no routing assumption: the FLOPs are the router's, k experts' per token and the shared experts'.

Arithmetic on plain numbers: the frontend finds the blocks and the FLOPs of their routed experts, this record
derives the rest.

``capacity_factor`` C: a router with a capacity lets each expert take at most ⌊C·T·k/E⌋ of the T·k (token, expert)
pairs of a layer and drops the rest. It changes nothing when C·T·k/E ≥ T (no expert can be over-full); otherwise
the routed experts' work is *at most* E·⌊C·T·k/E⌋ pairs, which the record reports beside the no-drop count (how
many are dropped depends on the routing, which is data). The totals stay the no-drop count.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MixtureOfExperts"]


@dataclass(frozen=True)
class MixtureOfExperts:
    """The MoE layers of one model and one input.

    ``layers`` MoE blocks, each with ``experts`` routed experts of ``expert_params`` parameters each, of which a
    token visits ``top_k``; ``shared_params`` the parameters of the shared experts of all blocks; ``params`` every
    parameter of the model; ``tokens`` the tokens each block routes (B·S); ``routed_flops`` the forward FLOPs of
    the routed experts of all blocks (the router and shared experts are not in it).
    """

    layers: int
    experts: int
    top_k: int
    expert_params: int
    shared_params: int
    params: int
    tokens: int
    routed_flops: int
    capacity_factor: float | None = None

    @property
    def active_params(self) -> int:
        """Parameters a token touches: all but the E − k routed experts it does not visit in each block."""
        return self.params - self.layers * (self.experts - self.top_k) * self.expert_params

    @property
    def pairs(self) -> int:
        """(token, expert) pairs per block: T·k."""
        return self.tokens * self.top_k

    @property
    def capacity_pairs(self) -> int | None:
        """Pairs per block an expert capacity lets through at most: min(T·k, E·⌊C·T·k/E⌋); None without C."""
        if self.capacity_factor is None:
            return None
        per_expert = min(int(self.capacity_factor * self.pairs / self.experts), self.tokens)
        return min(self.pairs, self.experts * per_expert)

    @property
    def routed_flops_at_capacity(self) -> int | None:
        """The routed experts' FLOPs when only :attr:`capacity_pairs` pairs run: an upper bound of the work
        with drops (every pair costs the same)."""
        if self.capacity_pairs is None or not self.pairs:
            return None
        return self.routed_flops * self.capacity_pairs // self.pairs

    def as_dict(self) -> dict:
        return {
            "layers": self.layers, "experts": self.experts, "top_k": self.top_k,
            "expert_params": self.expert_params, "shared_params": self.shared_params,
            "params": self.params, "active_params": self.active_params,
            "tokens": self.tokens, "pairs_per_layer": self.pairs, "routed_expert_flops": self.routed_flops,
            "capacity_factor": self.capacity_factor, "capacity_pairs_per_layer": self.capacity_pairs,
            "routed_expert_flops_at_capacity": self.routed_flops_at_capacity,
        }  # fmt: skip
