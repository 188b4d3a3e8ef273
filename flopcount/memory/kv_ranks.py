"""The KV cache one rank of each pipeline stage holds under a parallel plan after the last decode step
(:mod:`.ranks`' ``kv_cache_bytes``; the rule is stated in that module's text)."""

from __future__ import annotations

from typing import Any

from ..errors import UsageError
from ..parallel.plan import ParallelPlan

__all__ = ["kv_share"]


def kv_share(report: Any, plan: ParallelPlan, layout: Any, kv: int) -> list[int] | None:
    """The KV cache one rank of each stage holds after the last decode step, its M microbatches' (see
    :mod:`.ranks`' docstring); None without ``--generate``. ``kv``: min(T, K/V heads)."""
    whole = report.memory.ranks[0].kv_cache_bytes
    generation = getattr(report, "generation", None)
    if whole is None or generation is None:
        return None
    windowed = len(generation.pieces) > 1
    if windowed and (plan.pp > 1 or plan.cp > 1):
        raise UsageError(f"--parallel pp={plan.pp},cp={plan.cp} with --generate: a sliding window crops the KV cache "
                         "of some layers, so the cache per stage or per sequence share is not modelled; give pp=1 "
                         "and cp=1")
    positions = generation.prompt_tokens + generation.new_tokens - 1
    if positions % plan.cp:
        raise UsageError(f"--parallel cp={plan.cp} with --generate {generation.prompt_tokens}:"
                         f"{generation.new_tokens}: cp must divide the P + N - 1 = {positions} positions of the KV "
                         "cache (an equal share on each CP rank); give N so that it does")
    first = layout.stacks[-1][1] if generation.encoder_decoder else 0  # an encoder-decoder's decoder layers cache
    layers = layout.dims.layers - first
    out = []
    for s in range(plan.pp):
        share, rest = divmod(whole * sum(n >= first for n in layout.stage_layers(s)), layers * kv * plan.cp)
        if rest:
            raise UsageError(f"--parallel tp={plan.tp},pp={plan.pp},cp={plan.cp} with --generate: the KV cache's "
                             f"{whole} bytes do not divide into equal shares of {layers} layers, {kv} K/V head groups "
                             f"and {plan.cp} sequence shares; this cache's layout is not modelled per rank")
        out.append(share * plan.microbatches)
    return out
