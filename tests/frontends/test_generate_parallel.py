"""``--generate P:N --memory --parallel PLAN``: the KV cache after the last step, per rank of the plan, against the
closed form 2·L·B·kv·d·(P + N − 1)·bytes divided by the stage's layers, the K/V heads and the sequence share, for each
of the M microbatches (each phase runs them all: every microbatch's cache lives until the last step)."""

from __future__ import annotations

import dataclasses

import pytest

import flopcount
from flopcount.errors import UsageError
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, KV_HEADS, HEADS, FFN, LAYERS, VOCAB = 64, 2, 4, 176, 2, 96
HEAD = H // HEADS  # 16
B, P, N = 3, 8, 5
POSITIONS = P + N - 1  # what the last step attends to: the cache after it
WHOLE = 2 * LAYERS * B * KV_HEADS * HEAD * POSITIONS * 4  # keys and values of every layer, float32
M = 3  # microbatches of B sequences: each rank holds each one's cache


def llama_config():
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                    architectures=["LlamaForCausalLM"])


@pytest.fixture(scope="module")
def report():
    return flopcount.from_hf(llama_config(), generate=(P, N), batch=B, memory=True, cache_dir=False)


def test_one_rank_cache_is_the_closed_form(report):
    (rank,) = report.memory.ranks
    assert rank.kv_cache_bytes == WHOLE


@pytest.mark.parametrize("plan, layers, heads, cp", [
    pytest.param("tp=2", LAYERS, 1, 1, id="tp2-one-head-each"),
    pytest.param("tp=4", LAYERS, 1, 1, id="tp4-heads-copied"),  # kv = 2 < T = 4: each head on 2 ranks
    pytest.param("pp=2", 1, KV_HEADS, 1, id="pp2"),
    pytest.param("tp=2,pp=2,dp=2", 1, 1, 1, id="tp2-pp2-dp2"),
    pytest.param("cp=2,dp=2", LAYERS, KV_HEADS, 2, id="cp2-dp2"),
    pytest.param("tp=2,pp=2,cp=2,dp=2,fsdp", 1, 1, 2, id="tp2-pp2-cp2-dp2-fsdp"),
])
def test_cache_per_rank_is_its_layers_heads_and_positions(report, plan, layers, heads, cp):
    p = parse_parallel(plan, M)
    memory = per_rank(report, p)
    expected = M * 2 * layers * B * heads * HEAD * (POSITIONS // cp) * 4
    assert {r.kv_cache_bytes for r in memory.ranks} == {expected}
    # identity: over one DP replica, the ranks that own their K/V heads (not the copies) hold the whole cache of
    # each microbatch
    group = p.tp // KV_HEADS if KV_HEADS < p.tp else 1
    replica = sum(r.kv_cache_bytes * len(r.replicas) // p.dp for r in memory.ranks if r.coords["tp"] % group == 0)
    assert replica == M * WHOLE
    copies = sum(r.kv_cache_bytes * len(r.replicas) // p.dp for r in memory.ranks if r.coords["tp"] % group)
    assert copies == M * WHOLE * (group - 1)


def test_peak_is_the_prefill_walk_with_the_cache_beside_it(report):
    """As in the one-rank ledger, the peak is the prefill's (run without a cache); the cache is reported beside
    it: the figure without --generate's cache is the same walk."""
    plan = parse_parallel("tp=2,pp=2", 2)
    with_cache = per_rank(report, plan)
    without = per_rank(dataclasses.replace(report, generation=None), plan)
    assert [r.peak_bytes for r in with_cache.ranks] == [r.peak_bytes for r in without.ranks]
    assert {r.kv_cache_bytes for r in without.ranks} == {None}


def test_cp_must_divide_the_cache_positions(report):
    odd = dataclasses.replace(report, generation=dataclasses.replace(report.generation, new_tokens=N - 1))
    with pytest.raises(UsageError, match=r"cp=2 with --generate 8:4: cp must divide the P \+ N - 1 = 11 positions"):
        per_rank(odd, parse_parallel("cp=2,dp=2", 1))


def test_parallel_flags_give_the_flops_per_rank_beside_an_unchanged_memory_ledger(report):
    """``--generate --memory --parallel``: the memory per rank is the one :func:`per_rank` gives, and the FLOPs
    per rank of the generation come beside it (:mod:`flopcount.parallel.generation`)."""
    from flopcount.options import CountOptions
    from flopcount.plans import with_plan

    out = with_plan(report, CountOptions(parallel="tp=2,pp=2", microbatches=2, schedule="1f1b"))
    assert out.memory == per_rank(report, parse_parallel("tp=2,pp=2", 2))
    assert out.parallel.mode == "generate"
    assert sum(r.model_flops for r in out.parallel.ranks) == 2 * report.generation.total.flops


@pytest.mark.slow
def test_stack_of_identical_layers_splits_its_cache_over_stages():
    """Four layers through the identical-layer extension (counted from 1 and 2): each of 2 stages holds 2 layers'
    cache of each of its 2 microbatches, each TP rank of tp=4 one of the 2 K/V heads (copied on 2 ranks)."""
    config = llama_config()
    config.num_hidden_layers = 4
    report = flopcount.from_hf(config, generate=(P, N), batch=B, memory=True, cache_dir=False)
    assert report.layers.method == "extended", report.layers.reason
    assert report.memory.ranks[0].kv_cache_bytes == 2 * 4 * B * KV_HEADS * HEAD * POSITIONS * 4
    memory = per_rank(report, parse_parallel("tp=4,pp=2", 2))
    assert {(r.stage, r.kv_cache_bytes) for r in memory.ranks} == {(s, 2 * 2 * 2 * B * 1 * HEAD * POSITIONS * 4)
                                                                  for s in (0, 1)}


@pytest.mark.slow
def test_sliding_window_layer_cache_is_split_over_tp_and_refused_over_stages():
    """Qwen2 with a sliding window on its second layer only: the layers' caches differ (decode steps in pieces),
    so a stage's share is not modelled (exit 2); TP still halves every layer's K/V heads."""
    config = transformers.Qwen2Config(hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                      use_sliding_window=True, sliding_window=4, max_window_layers=1,
                                      attn_implementation="eager", architectures=["Qwen2ForCausalLM"])
    report = flopcount.from_hf(config, generate=(2, 9), memory=True, cache_dir=False)
    assert len(report.generation.pieces) > 1
    whole = report.memory.ranks[0].kv_cache_bytes
    assert {r.kv_cache_bytes for r in per_rank(report, parse_parallel("tp=2", 1)).ranks} == {whole // 2}
    with pytest.raises(UsageError, match="a sliding window crops the KV cache of some layers"):
        per_rank(report, parse_parallel("pp=2", 2))
