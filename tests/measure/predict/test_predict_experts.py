"""Experts' weights gathered per token (the export's batched product) priced as the grouped product torch runs: the
gather and its views are no work, and each product reads its parameter once as E products, against closed forms
written here; the whole Mixtral step no longer moves T·k copies of the experts' weights."""

from __future__ import annotations

import pytest


def test_a_grouped_product_reads_each_experts_weights_once():
    pytest.importorskip("transformers")
    import transformers

    import flopcount
    from flopcount.measure.predict import work_of

    h, i, e, k, b, s, layers = 32, 48, 4, 2, 2, 8, 2
    config = transformers.MixtralConfig(hidden_size=h, intermediate_size=i, num_hidden_layers=layers,
                                        num_attention_heads=2, num_key_value_heads=2, num_local_experts=e,
                                        num_experts_per_tok=k, vocab_size=64)
    report = flopcount.from_hf(config, (b, s), cache_dir=False, mode="train")
    nodes = work_of(report).ranks[0].chunks[0]
    pairs = b * s * k  # (token, expert) pairs
    gate_up = 4 * (e * 2 * i * h + pairs * h + pairs * 2 * i)  # [E, 2I, H] once, the pairs' inputs and outputs
    down = 4 * (e * h * i + pairs * i + pairs * h)  # [E, H, I] once
    grouped = sorted(w.bytes for w in nodes if w.kind == "gemm" and w.matrices == e)
    assert grouped == sorted([gate_up, down] * layers)
    gathered = 4 * pairs * 2 * i * h  # one copy of an expert's gate_up weights per pair
    assert max(w.bytes for w in nodes) < gathered
    assert all(w.kind != "attention" or w.matrices != pairs for w in nodes)
