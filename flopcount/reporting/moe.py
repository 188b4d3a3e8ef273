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

Tokens per block: every block of a decoder-only model routes the same B·S tokens; an encoder-decoder's encoder
blocks route B·S_enc and its decoder blocks B·S_dec, so the pairs and the capacity bound are each block's own.
The bound on the routed work sums the blocks' bounds (every pair of every block costs the same: the blocks
summarised have experts of one size).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MixtureOfExperts"]


@dataclass(frozen=True)
class MixtureOfExperts:
    """The MoE layers of one model and one input.

    ``layers`` MoE blocks, each with ``experts`` routed experts of ``expert_params`` parameters each, of which a
    token visits ``top_k``; ``shared_params`` the parameters of the shared experts of all blocks; ``params`` every
    parameter of the model; ``tokens`` the tokens each block routes: B·S where every block routes the same, else
    one count per block in the blocks' order (an encoder-decoder: B·S_enc in the encoder, B·S_dec in the
    decoder); ``routed_flops`` the forward FLOPs of the routed experts of all blocks (the router and shared
    experts are not in it).
    """

    layers: int
    experts: int
    top_k: int
    expert_params: int
    shared_params: int
    params: int
    tokens: int | tuple[int, ...]
    routed_flops: int
    capacity_factor: float | None = None

    @property
    def active_params(self) -> int:
        """Parameters a token touches: all but the E − k routed experts it does not visit in each block."""
        return self.params - self.layers * (self.experts - self.top_k) * self.expert_params

    def __post_init__(self) -> None:
        if isinstance(self.tokens, tuple) and len(self.tokens) != self.layers:
            raise ValueError(f"tokens: one count per block ({self.layers}), got {len(self.tokens)}")

    @property
    def block_tokens(self) -> tuple[int, ...]:
        """The tokens each block routes, one per block."""
        return self.tokens if isinstance(self.tokens, tuple) else (self.tokens,) * self.layers

    @property
    def uniform(self) -> bool:
        """Every block routes the same number of tokens."""
        return len(set(self.block_tokens)) <= 1

    @property
    def block_pairs(self) -> tuple[int, ...]:
        """(token, expert) pairs of each block: T·k with its own T."""
        return tuple(t * self.top_k for t in self.block_tokens)

    @property
    def block_capacity_pairs(self) -> tuple[int, ...] | None:
        """Pairs each block's expert capacity lets through at most: min(T·k, E·min(⌊C·T·k/E⌋, T)); None without
        C."""
        if self.capacity_factor is None:
            return None
        return tuple(min(t * self.top_k, self.experts * min(int(self.capacity_factor * t * self.top_k / self.experts),
                                                             t)) for t in self.block_tokens)

    @property
    def pairs(self) -> int | None:
        """(token, expert) pairs per block, T·k, where every block routes the same T; None where they differ
        (:attr:`block_pairs`)."""
        return self.block_pairs[0] if self.uniform and self.layers else None

    @property
    def capacity_pairs(self) -> int | None:
        """Pairs per block an expert capacity lets through at most, where every block routes the same T; None
        without C or where they differ (:attr:`block_capacity_pairs`)."""
        caps = self.block_capacity_pairs
        return caps[0] if caps is not None and self.uniform and self.layers else None

    @property
    def routed_flops_at_capacity(self) -> int | None:
        """The routed experts' FLOPs when only each block's capacity pairs run: an upper bound of the work with
        drops (every pair costs the same)."""
        caps, pairs = self.block_capacity_pairs, sum(self.block_pairs)
        if caps is None or not pairs:
            return None
        return self.routed_flops * sum(caps) // pairs

    def as_dict(self) -> dict:
        return {
            "layers": self.layers, "experts": self.experts, "top_k": self.top_k,
            "expert_params": self.expert_params, "shared_params": self.shared_params,
            "params": self.params, "active_params": self.active_params,
            "tokens": self.block_tokens[0] if self.uniform and self.layers else None,
            "pairs_per_layer": self.pairs, "routed_expert_flops": self.routed_flops,
            "capacity_factor": self.capacity_factor, "capacity_pairs_per_layer": self.capacity_pairs,
            "routed_expert_flops_at_capacity": self.routed_flops_at_capacity,
            "blocks": [{"tokens": t, "pairs": p, "capacity_pairs": c} for t, p, c in zip(
                self.block_tokens, self.block_pairs, self.block_capacity_pairs or (None,) * self.layers)],
        }  # fmt: skip
