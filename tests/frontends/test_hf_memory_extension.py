"""``--hf CONFIG --memory`` through the identical-layer extension: the ledger of L layers walked on the graph built
from the 2-layer export equals, field by field, the ledger of the whole L-layer export (the independent reference)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

import flopcount
from flopcount.memory.ledger import MemorySettings, module_activations
from flopcount.reporting.layers import EXPORTED, EXTENDED

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, HEADS, KV_HEADS, FFN, VOCAB, SEQ = 64, 4, 2, 176, 256, 16


def llama(layers: int):
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=layers,
                                    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                    architectures=["LlamaForCausalLM"])


def both(config, shape, **kwargs):
    extended = flopcount.from_hf(config, shape, cache_dir=False, **kwargs)
    exported = flopcount.from_hf(config, shape, cache_dir=False, repeated_layers="export", **kwargs)
    assert extended.layers.method == EXTENDED and exported.layers.method == EXPORTED
    return extended, exported


def peak_at(report) -> tuple:
    """The node the peak is at, as its operator and module scope (the extension names its copies differently)."""
    (rank,) = report.memory.ranks
    if not rank.peak_node:
        return ()
    (k,) = [k for k, n in enumerate(report.nodes) if n.name == rank.peak_node]
    return report.nodes[k].op_type, report.modules.nodes[k]


def assert_same_ledger(extended, exported):
    a, b = extended.memory, exported.memory
    unnamed = [dataclasses.replace(m, ranks=tuple(dataclasses.replace(r, peak_node="") for r in m.ranks))
               for m in (a, b)]
    assert unnamed[0] == unnamed[1]  # every field of the ledger (settings, missing rules, unsized, ranks)
    assert a.as_dict() | {"ranks": None} == b.as_dict() | {"ranks": None}
    assert peak_at(extended) == peak_at(exported)
    for depth in (1, 3):
        assert module_activations(a, extended.nodes, extended.modules.nodes, depth) == \
               module_activations(b, exported.nodes, exported.modules.nodes, depth)


@pytest.mark.parametrize("mode,optimizer,recompute,implementation", [
    pytest.param("inference", None, "none", "auto", marks=pytest.mark.slow),
    ("train", "adamw", "none", "fused"),  # no step temporaries: the peak is in the backward
    pytest.param("train", "adamw", "full", "auto", marks=pytest.mark.slow),
    ("train", "adamw", "selective", "single-tensor"),
])
def test_llama_ledger_extended_equals_the_whole_export(mode, optimizer, recompute, implementation):
    settings = MemorySettings(recompute=recompute, implementation=implementation)
    extended, exported = both(llama(4), {"input_ids": (2, SEQ)}, mode=mode, optimizer=optimizer, memory=settings)
    assert_same_ledger(extended, exported)
    (rank,) = extended.memory.ranks
    real = transformers.LlamaForCausalLM(llama(4))
    assert rank.params_bytes == 4 * sum(p.numel() for p in real.parameters())
    if mode == "train" and recompute == "none":
        assert rank.peak_phase == "backward"
    rows = dict(module_activations(extended.memory, extended.nodes, extended.modules.nodes, 3))
    if mode == "train":  # each layer keeps the same bytes for its backward
        per_layer = [rows[f"model.layers.{i}"] for i in range(4)]
        assert len(set(per_layer)) == 1 and per_layer[0] > 0


@pytest.mark.slow
def test_moe_ledger_extended_equals_the_whole_export():
    config = transformers.Qwen2MoeConfig(hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                         shared_expert_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                         vocab_size=64, architectures=["Qwen2MoeForCausalLM"])
    extended, exported = both(config, {"input_ids": (1, 8)}, mode="train", optimizer="adamw",
                              memory=MemorySettings(recompute="full", implementation="fused"))
    assert_same_ledger(extended, exported)


@pytest.mark.slow
def test_a_dense_first_layer_then_identical_moe_layers():
    """DeepSeek-V3's shape: its first layer dense, the rest mixture-of-experts; counted from 2 and 3 layers."""
    config = transformers.DeepseekV3Config(
        hidden_size=32, intermediate_size=40, moe_intermediate_size=24, num_hidden_layers=4, first_k_dense_replace=1,
        num_attention_heads=4, num_key_value_heads=4, vocab_size=64, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=8)
    extended, exported = both(config, {"input_ids": (1, 8)}, mode="train", optimizer="adamw",
                              memory=MemorySettings(recompute="full", implementation="fused"))
    assert "the first 1" in extended.layers.reason
    assert_same_ledger(extended, exported)


@pytest.mark.slow
def test_generate_ledger_carries_the_extended_kv_cache():
    extended, exported = both(llama(3), None, generate=(6, 3), memory=True)
    assert_same_ledger(extended, exported)
    # keys and values of 3 layers for the 6 + 3 − 1 positions the last step attends to, float32
    assert extended.memory.ranks[0].kv_cache_bytes == 3 * 2 * 1 * (H // HEADS * KV_HEADS) * 8 * 4


@pytest.mark.slow
def test_cli_memory_is_extended(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(llama(3).to_json_string())
    command = [sys.executable, "-m", "flopcount", "--hf", str(folder), "--input-shape", f"input_ids=1x{SEQ}",
               "--mode", "train", "--optimizer", "adamw", "--memory", "--format", "json"]
    env = {"FLOPCOUNT_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    doc = json.loads(subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout)
    assert doc["layers"]["method"] == EXTENDED, doc["layers"]
    assert "whole model" not in json.dumps(doc["layers"])
    assert doc["memory"]["ranks"][0]["peak_bytes"] > doc["memory"]["ranks"][0]["params_bytes"]
