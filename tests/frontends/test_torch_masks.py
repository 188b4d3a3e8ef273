"""``--attention executed`` on real exports, outside ``--hf``: transformers' Llama and Mistral build their causal and
sliding-window masks from position ranges in the graph; exported with ``from_torch``, the masks are found in the
graph and the attention products count the true entries of the mask, brute-forced here."""

from __future__ import annotations

import numpy as np
import pytest

import flopcount

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, KV_HEADS, HEADS, FFN, LAYERS, VOCAB = 64, 2, 4, 176, 2, 97


def kept_pairs(s: int, window: int | None = None, lengths=(None,)) -> int:
    """True entries of the causal (sliding-window, key-padding) mask of each sequence, entry by entry: query i keeps
    key j when j ≤ i, i − j < window and j is a valid token."""
    total = 0
    for n in lengths:
        i, j = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")
        keep = j <= i
        if window is not None:
            keep &= i - j < window
        if n is not None:  # a valid key, and a padded query runs nothing
            keep &= (j < n) & (i < n)
        total += int(keep.sum())
    return total


def attention_flops(pairs: int) -> int:
    """Q·Kᵀ and probs·V: 2 FLOPs per MAC, H = heads · head size MACs per kept pair and product, every layer."""
    return LAYERS * 2 * 2 * pairs * H


def model(kind: str, window: int | None = None):
    common = dict(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  num_key_value_heads=KV_HEADS, vocab_size=VOCAB, attn_implementation="eager")
    if kind == "llama":
        made = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        made = transformers.MistralForCausalLM(transformers.MistralConfig(sliding_window=window, **common))
    return made.eval()


@pytest.mark.slow
@pytest.mark.parametrize("kind, window, s", [
    pytest.param("llama", None, 32, id="llama-causal"),
    pytest.param("mistral", 5, 32, id="mistral-sliding-window"),
    # from 128 positions torch folds the position ranges into int64 initializers of 1 KiB or more, whose values
    # the weightless export keeps (positions and indices are not weights)
    pytest.param("llama", None, 300, id="llama-causal-300"),
    pytest.param("mistral", 37, 300, id="mistral-sliding-window-300"),
])
def test_exported_mask_counts_the_kept_pairs(kind, window, s):
    m = model(kind, window)
    inputs = {"input_ids": ((1, s), torch.int64), "use_cache": False}
    full = flopcount.from_torch(m, inputs, convention="dense", cache_dir=False)
    executed = flopcount.from_torch(m, inputs, convention="dense", cache_dir=False, attention="executed")
    assert full.total.flops - executed.total.flops == attention_flops(s * s - kept_pairs(s, window))
    expected = "causal" if window is None else f"causal + sliding window {window}"
    assert executed.attention == f"executed: {expected}, from position comparisons in the graph ({LAYERS} attentions)"


@pytest.mark.slow
def test_exported_padding_mask_from_attention_mask_values():
    """Right-padded sequences of 16 and 9 valid tokens: each valid query keeps the valid keys at or before it; the
    same count as ``--hf``, which takes the mask from the configuration."""
    s, lengths = 16, (16, 9)
    values = [[1] * n + [0] * (s - n) for n in lengths]
    inputs = {"input_ids": ((2, s), torch.int64), "attention_mask": ((2, s), torch.int64), "use_cache": False}
    m = model("llama")
    full = flopcount.from_torch(m, inputs, convention="dense", cache_dir=False, input_values={"attention_mask": values})
    executed = flopcount.from_torch(m, inputs, convention="dense", cache_dir=False, attention="executed",
                                    input_values={"attention_mask": values})
    assert full.total.flops - executed.total.flops == attention_flops(2 * s * s - kept_pairs(s, None, lengths))
    assert "causal + padding (lengths 16, 9)" in executed.attention and "attention_mask values" in executed.attention
    config = flopcount.from_hf(m.config, {"input_ids": (2, s), "attention_mask": (2, s)}, convention="dense",
                               cache_dir=False, attention="executed", input_values={"attention_mask": values})
    assert config.total.flops == executed.total.flops
    without = flopcount.from_torch(m, inputs, convention="dense", cache_dir=False, attention="executed")
    assert without.total.flops == full.total.flops and "is data, not structure" in without.attention


@pytest.mark.slow
def test_exported_packed_sequences_from_position_id_values():
    """Sequences of 3, 2 and 3 tokens packed in one row (positions restart at 0): causal within each."""
    inputs = {"input_ids": ((1, 8), torch.int64), "position_ids": ((1, 8), torch.int64), "use_cache": False}
    values = {"position_ids": [[0, 1, 2, 0, 1, 0, 1, 2]]}
    m = model("llama")
    full = flopcount.from_torch(m, inputs, convention="dense", cache_dir=False, input_values=values)
    executed = flopcount.from_torch(m, inputs, convention="dense", cache_dir=False, attention="executed",
                                    input_values=values)
    kept = sum(kept_pairs(n) for n in (3, 2, 3))  # 6 + 3 + 6
    assert full.total.flops - executed.total.flops == attention_flops(8 * 8 - kept)
    assert "causal + packed sequences (3, 2, 3)" in executed.attention and "position_ids values" in executed.attention
