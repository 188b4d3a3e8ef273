"""The all-gather dispatcher's routing as the predictor prices it (group ``tp_ep`` under TP with sp and without ep):
before each MoE layer's dispatch an ``all_gather`` of the routing map and one of the probabilities (two calls, as
Megatron-Core's ``MoEAllGatherTokenDispatcher`` makes them), a layer and microbatch in the forward; the probabilities' gradient reduce-scattered, a call a layer and microbatch in the
backward; against closed forms written here on a Mixtral-like model (L MoE layers, R experts, M microbatches of
b×s tokens, fp32 probabilities, a byte an entry of the map) at ``tp=2,sp``."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import mixtral_config

L, R, K, H, I, B, S, M = 2, 4, 2, 32, 64, 2, 8, 2
ROUTES, PROBS = B * S * R, B * S * R * 4  # the calls' bytes: the whole sequence's routing map and probabilities
SCATTERED = PROBS


@pytest.fixture(scope="module")
def report():
    pytest.importorskip("transformers")
    import flopcount

    return flopcount.from_hf(mixtral_config(H, I, L, 4, 2, 128, R, K), (B, S), cache_dir=False, mode="train")


def _calls(report, recompute=None):
    from flopcount.measure.predict import work_of
    from flopcount.parallel.plan import parse_parallel, parse_recompute
    from flopcount.plans import parallel_ledger

    led = parallel_ledger(report, parse_parallel("tp=2,sp", M, "1f1b"),
                          parse_recompute(recompute) if recompute else None, None)
    return [sorted((x.kind, x.phase, x.count, x.bytes, x.ranks) for x in r.messages if x.group == "tp_ep")
            for r in work_of(dataclasses.replace(report, parallel=led)).ranks]


def test_a_gather_before_each_dispatch_and_a_scatter_in_each_backward(report):
    """M·L gathers in the forward and M·L scatters in the backward, over the 2 TP ranks."""
    assert _calls(report) == [[("all_gather", "forward", M * L, ROUTES, 2), ("all_gather", "forward", M * L, PROBS, 2),
                               ("reduce_scatter", "backward", M * L, SCATTERED, 2)]] * 2


def test_a_recomputed_dispatch_gathers_again_in_the_backward(report):
    """``full`` reruns each MoE layer's dispatch in the backward: M·L more gathers there."""
    assert _calls(report, "full")[0] == [("all_gather", "backward", M * L, ROUTES, 2),
                                         ("all_gather", "backward", M * L, PROBS, 2),
                                         ("all_gather", "forward", M * L, ROUTES, 2),
                                         ("all_gather", "forward", M * L, PROBS, 2),
                                         ("reduce_scatter", "backward", M * L, SCATTERED, 2)]
