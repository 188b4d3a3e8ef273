"""The all-gather dispatcher's routing collectives in the per-rank ledger (group ``tp_ep``): under TP with sp and
without ep each MoE layer's routing map (a byte a (token, expert)) and fp32 probabilities all-gathered in the
forward, the probabilities' gradient reduce-scattered in the backward; none without sp or under ep (the all-to-all
dispatcher). Closed forms written here on a tiny Mixtral (L MoE layers, R experts, b×s tokens, M microbatches);
test_parallel_gloo_sp_moe runs them on gloo."""

from __future__ import annotations

import pytest
from gloo_shards import ledger_bytes
from helpers import mixtral_config

from flopcount.parallel.plan import parse_parallel, parse_recompute
from flopcount.parallel.ranks import ledger

pytest.importorskip("transformers")

H, I, L, HEADS, KV, V, R, K = 32, 24, 2, 4, 2, 64, 4, 2
B, S, M = 2, 8, 2
MAP, PROBS = B * S * R, B * S * R * 4  # the whole batch's routing map (bool) and probabilities (fp32)


@pytest.fixture(scope="module")
def train():
    import flopcount

    return flopcount.from_hf(mixtral_config(H, I, L, HEADS, KV, V, R, K), (B, S), cache_dir=False, mode="train")


def _routing(report, plan: str, recompute=None) -> list[dict[str, int]]:
    led = ledger(report, parse_parallel(plan, M), parse_recompute(recompute) if recompute else None)
    return [ledger_bytes(r, "tp_ep") for r in led.ranks]


@pytest.mark.parametrize("plan", ["tp=2,sp", "tp=2,sp=megatron", "tp=2,sp,dp=2"])
def test_every_tp_rank_gathers_the_routes_of_the_whole_sequence(train, plan):
    """Per MoE layer and microbatch: the map and the probabilities gathered, the probabilities' gradient
    reduce-scattered; the same on every rank."""
    assert _routing(train, plan) == [{"all_gather(tp_ep)": M * L * (MAP + PROBS),
                                      "reduce_scatter(tp_ep)": M * L * PROBS}] * len(_routing(train, plan))


def test_a_context_parallel_rank_gathers_its_own_tokens_routes(train):
    """Under cp=2 a TP group routes its CP rank's s/2 tokens of each sequence."""
    assert _routing(train, "tp=2,sp,cp=2") == [{"all_gather(tp_ep)": M * L * (MAP + PROBS) // 2,
                                                "reduce_scatter(tp_ep)": M * L * PROBS // 2}] * 4


def test_a_rerun_that_dispatches_again_gathers_again(train):
    """``full`` reruns each MoE layer's dispatch in the backward: the gather twice, the gradient's scatter once."""
    assert _routing(train, "tp=2,sp", "full")[0] == {"all_gather(tp_ep)": 2 * M * L * (MAP + PROBS),
                                                     "reduce_scatter(tp_ep)": M * L * PROBS}


def test_no_routing_gather_without_sp_or_under_ep(train):
    """Without sp every TP rank routes the whole sequence itself; under ep the all-to-all dispatcher runs, whose
    ``tp_ep`` gather is the router's counts (T·E·R int64 before each dispatch) and no routes."""
    assert _routing(train, "tp=2") == [{}, {}]
    assert {k: v for r in _routing(train, "tp=2,sp,dp=2,ep=2") for k, v in r.items()} == {
        "all_gather(tp_ep)": M * L * 2 * 2 * R * 8}


def test_inference_gathers_with_no_backward():
    """Without a backward only the forward's gather."""
    import flopcount

    report = flopcount.from_hf(mixtral_config(H, I, L, HEADS, KV, V, R, K), (B, S), cache_dir=False)
    assert _routing(report, "tp=2,sp")[0] == {"all_gather(tp_ep)": M * L * (MAP + PROBS)}
