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
