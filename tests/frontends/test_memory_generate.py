"""``--generate P:N --memory``: the ledger of the prefill with the KV cache after the last step beside it."""

from __future__ import annotations

import pytest

import flopcount

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

H, KV_HEADS, HEADS, FFN, LAYERS, VOCAB = 64, 2, 4, 176, 2, 97
KV = H // HEADS * KV_HEADS  # width of the keys (and values)


def test_generate_reports_the_kv_cache_and_inference_memory():
    config = transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                      architectures=["LlamaForCausalLM"])
    report = flopcount.from_hf(config, generate=(6, 4), batch=3, memory=True, cache_dir=False)
    (rank,) = report.memory.ranks
    # keys and values of every layer for the 6 + 4 − 1 positions the last step attends to, float32
    assert rank.kv_cache_bytes == LAYERS * 2 * 3 * KV * 9 * 4
    real = transformers.LlamaForCausalLM(config)
    assert rank.params_bytes == 4 * sum(p.numel() for p in real.parameters())
    assert (rank.grads_bytes, rank.optimizer_bytes, rank.activations_bytes) == (0, 0, 0)
    assert rank.peak_phase == "forward" and rank.peak_bytes > rank.params_bytes


def test_hf_stack_of_identical_layers_carries_the_ledger():
    """The ledger of a stack of identical layers comes through the extension from 1 and 2 layers
    (tests/frontends/test_hf_memory_extension.py checks it against the whole export)."""
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=53,
                                      architectures=["LlamaForCausalLM"])
    report = flopcount.from_hf(config, {"input_ids": (1, 8)}, mode="train", optimizer="adamw", memory=True,
                               cache_dir=False)
    assert report.layers.method == "extended", report.layers.reason
    (rank,) = report.memory.ranks
    real = transformers.LlamaForCausalLM(config)
    assert rank.params_bytes == rank.grads_bytes == 4 * sum(p.numel() for p in real.parameters())
    assert rank.optimizer_bytes == 2 * rank.params_bytes + 4 * len(list(real.parameters()))


def test_generate_memory_and_plan_on_an_extended_stack():
    """``--generate --memory --parallel`` on a stack extended from 1 and 2 layers (3 here): the decode steps extend
    for the FLOPs per rank (their own memory ledgers, whose past keys and values come in one input per layer, are
    not extended), and each TP rank holds its K/V head's share of the cache."""
    layers, kv_heads, heads, h = 3, 2, 4, 32
    config = transformers.LlamaConfig(hidden_size=h, intermediate_size=48, num_hidden_layers=layers,
                                      num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=54,
                                      architectures=["LlamaForCausalLM"])
    report = flopcount.from_hf(config, generate=(4, 3), memory=True, parallel="tp=2", cache_dir=False)
    assert report.layers.method == "extended", report.layers.reason
    assert len(report.generation.step_reports) == 2  # the first and last context of the one piece of steps
    # the whole generation's FLOPs shared out: the ranks' model FLOPs sum to it (one DP rank, one microbatch)
    assert sum(r.model_flops for r in report.parallel.ranks) == report.generation.total.flops
    # per TP rank, keys and values of 3 layers, of kv_heads / 2 = 1 head of h / heads = 8 wide, for the
    # 4 + 3 − 1 = 6 positions the last step attends to, float32
    assert [r.kv_cache_bytes for r in report.memory.ranks] == [layers * 2 * 1 * 8 * 6 * 4] * 2
