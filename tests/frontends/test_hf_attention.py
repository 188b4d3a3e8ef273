"""``--attention executed`` for ``--hf``: the mask of each layer from the configuration (causal, sliding windows),
the eager Q·Kᵀ and probs·V products counted over the kept pairs, against closed forms and a brute-force count."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import flopcount

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

H, KV_HEADS, HEADS, FFN, LAYERS, VOCAB = 64, 2, 4, 176, 2, 97
KV = H // HEADS * KV_HEADS


def products_outside_attention(s: int) -> int:
    return LAYERS * s * (2 * (2 * H * H + 2 * H * KV) + 2 * 3 * H * FFN) + 2 * s * H * VOCAB


def window_pairs(s: int, window: int | None) -> int:
    """True entries of the causal (and sliding-window) mask, entry by entry."""
    i, j = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")
    keep = j <= i
    if window is not None:
        keep &= i - j < window
    return int(keep.sum())


def llama(**extra):
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                    attn_implementation="eager", **extra)


def test_llama_causal_pairs():
    s = 13
    full = flopcount.from_hf(llama(), (1, s), convention="dense", cache_dir=False)
    executed = flopcount.from_hf(llama(), (1, s), convention="dense", cache_dir=False, attention="executed")
    # Q·Kᵀ and probs·V: 2 products of H per kept pair and layer (H = heads · head size)
    assert full.total.flops == products_outside_attention(s) + LAYERS * 2 * 2 * s * s * H
    assert executed.total.flops == products_outside_attention(s) + LAYERS * 2 * 2 * (s * (s + 1) // 2) * H
    assert executed.attention == "executed: causal, from the llama configuration"


def test_mistral_sliding_window_pairs():
    s, window = 11, 4
    config = transformers.MistralConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                        sliding_window=window, attn_implementation="eager")
    r = flopcount.from_hf(config, (1, s), convention="dense", cache_dir=False, attention="executed")
    assert r.total.flops == products_outside_attention(s) + LAYERS * 2 * 2 * window_pairs(s, window) * H
    assert "sliding window 4" in r.attention


def test_layer_types_mix_full_and_sliding_layers():
    s, window = 10, 3
    config = llama()
    config = transformers.Qwen2Config(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                      use_sliding_window=True, sliding_window=window, max_window_layers=1,
                                      attn_implementation="eager")
    kinds = list(config.layer_types)
    assert sorted(kinds) == ["full_attention", "sliding_attention"]
    r = flopcount.from_hf(config, (1, s), convention="dense", cache_dir=False, attention="executed")
    attention = sum(2 * 2 * window_pairs(s, window if k == "sliding_attention" else None) * H for k in kinds)
    # Qwen2's Q, K, V projections carry biases: dense counting leaves them out
    assert r.total.flops == products_outside_attention(s) + attention


def test_cli_states_the_attention_used(tmp_path):
    llama().save_pretrained(tmp_path)
    p = subprocess.run([sys.executable, "-m", "flopcount", "--hf", str(tmp_path), "--input-shape", "input_ids=1x6",
                        "--convention", "dense", "--attention", "executed"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "Attention: executed: causal, from the llama configuration" in p.stdout
    assert f"Total FLOPs: {products_outside_attention(6) + LAYERS * 2 * 2 * 21 * H:,}" in p.stdout


def test_padding_from_attention_mask_values():
    """Right-padded sequences of 6 and 3 valid tokens of 6: causal pairs within each valid length."""
    s, lengths = 6, (6, 3)
    mask = [[1] * 6, [1, 1, 1, 0, 0, 0]]
    r = flopcount.from_hf(llama(), {"input_ids": (2, s), "attention_mask": (2, s)}, convention="dense",
                          cache_dir=False, attention="executed", input_values={"attention_mask": mask})
    kept = sum(window_pairs(n, None) for n in lengths)  # padded queries run nothing
    assert r.total.flops == 2 * products_outside_attention(s) + LAYERS * 2 * 2 * kept * H
    assert "padding (lengths 6, 3)" in r.attention


def test_bert_padding_is_bidirectional_within_lengths():
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=48, vocab_size=50, attn_implementation="eager")
    s, lengths = 5, (5, 2)
    mask = [[1] * 5, [1, 1, 0, 0, 0]]
    kwargs = dict(convention="dense", cache_dir=False, input_values={"attention_mask": mask})
    shapes = {"input_ids": (2, s), "attention_mask": (2, s)}
    full = flopcount.from_hf(config, shapes, **kwargs)
    executed = flopcount.from_hf(config, shapes, attention="executed", **kwargs)
    # Q·Kᵀ and probs·V of hidden 32: 2·2·32 per pair; full runs 2·5·5 pairs, executed 5·5 + 2·2
    assert full.total.flops - executed.total.flops == 2 * 2 * 32 * (2 * s * s - sum(n * n for n in lengths))
    assert "bidirectional + padding (lengths 5, 2)" in executed.attention


def test_packed_sequences_from_position_id_resets():
    """Three sequences of 3, 2 and 3 tokens packed in one row: causal within each."""
    positions = [[0, 1, 2, 0, 1, 0, 1, 2]]
    r = flopcount.from_hf(llama(), {"input_ids": (1, 8), "position_ids": (1, 8)}, convention="dense",
                          cache_dir=False, attention="executed", input_values={"position_ids": positions})
    kept = sum(window_pairs(n, None) for n in (3, 2, 3))  # 6 + 3 + 6
    assert r.total.flops == products_outside_attention(8) + LAYERS * 2 * 2 * kept * H
    assert "packed sequences (3, 2, 3)" in r.attention


def test_training_backward_runs_the_causal_pairs():
    s = 9
    kw = dict(convention="dense", cache_dir=False, mode="train")
    full = flopcount.from_hf(llama(), (1, s), **kw)
    executed = flopcount.from_hf(llama(), (1, s), attention="executed", **kw)
    saved = LAYERS * 2 * 2 * (s * s - s * (s + 1) // 2) * H  # Q·Kᵀ and probs·V over the masked pairs
    assert full.forward.flops - executed.forward.flops == saved
    assert full.backward.flops - executed.backward.flops == 2 * saved  # two gradient products per product


def test_executed_llama_runs_every_term_over_the_causal_pairs():
    """Default convention, forward and backward: the eager graph's scale (Mul), causal mask Add and Softmax run over
    the kept pairs as the products do. Per layer and head, of the s·s score entries the causal mask drops
    m = s·s − s(s + 1)/2: the products 2·2·m·head size, the scale and the add 1 each, the Softmax 5 each (its 2
    per row stay: every row keeps its diagonal); backward: the products twice, the scale 1, the Softmax 4 each."""
    s = 9
    kw = dict(cache_dir=False, mode="train")
    full = flopcount.from_hf(llama(), (1, s), **kw)
    executed = flopcount.from_hf(llama(), (1, s), attention="executed", **kw)
    dropped = s * s - window_pairs(s, None)
    products = LAYERS * 2 * 2 * dropped * H
    assert full.forward.flops - executed.forward.flops == products + LAYERS * HEADS * dropped * (1 + 1 + 5)
    assert full.backward.flops - executed.backward.flops == 2 * products + LAYERS * HEADS * dropped * (1 + 4)
    softmax = [n for n in executed.nodes if n.op_type == "Softmax"]
    assert len(softmax) == LAYERS and all(n.cost.flops == HEADS * (5 * window_pairs(s, None) - 2 * s) for n in softmax)
