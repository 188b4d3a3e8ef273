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


def _router_weight_bytes(kind: str, config) -> int:
    """Bytes of one routing weight as transformers' router of ``config`` hands them on, in its dtype: its scores'
    element size from a real run of the router module (its top-k weights, which the experts' outputs are scaled by)."""
    import importlib

    import torch

    module = importlib.import_module(f"transformers.models.{kind}.modeling_{kind}")
    router = getattr(module, {"mixtral": "MixtralTopKRouter", "qwen3_moe": "Qwen3MoeTopKRouter"}[kind])(config)
    torch.nn.init.normal_(router.weight)
    _, scores, _ = router.to(torch.bfloat16)(torch.randn(B * S, H, dtype=torch.bfloat16))
    return scores.element_size()


@pytest.mark.parametrize("kind", ["mixtral", "qwen3_moe"])
def test_probabilities_in_the_dtype_the_router_hands_on(kind):
    """In a bf16 model Mixtral's router hands on fp32 weights (its softmax on ``float()`` logits, not cast back) and
    Qwen3-MoE's bf16 ones (its top-k weights cast back to the logits' dtype): the gathered probabilities are
    b·s·R of that size, as a real run of each router gives it."""
    import flopcount
    import transformers

    if kind == "mixtral":
        config = mixtral_config(H, I, L, HEADS, KV, V, R, K, torch_dtype="bfloat16")
    else:
        config = transformers.Qwen3MoeConfig(hidden_size=H, intermediate_size=I, moe_intermediate_size=I,
                                             num_hidden_layers=L, num_attention_heads=HEADS, num_key_value_heads=KV,
                                             head_dim=H // HEADS, vocab_size=V, num_experts=R, num_experts_per_tok=K,
                                             torch_dtype="bfloat16")
    p = _router_weight_bytes(kind, config)
    assert p == {"mixtral": 4, "qwen3_moe": 2}[kind]
    report = flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")
    assert _routing(report, "tp=2,sp")[0] == {"all_gather(tp_ep)": M * L * (MAP + B * S * R * p),
                                              "reduce_scatter(tp_ep)": M * L * B * S * R * p}
