"""``--repeated-layers``: a model of L identical layers counted from exports of 1 and 2 of them and extended to L,
against the whole-model export (every figure), closed forms written here, torch's parameter counts, and the
cases where identity cannot be shown (the whole model is then exported, and the report says why)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import flopcount
from flopcount.errors import UsageError
from flopcount.reporting.layers import EXPORTED, EXTENDED

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, HEADS, KV_HEADS, FFN, VOCAB = 32, 4, 2, 48, 50
KV = H // HEADS * KV_HEADS


def llama(layers: int, **extra):
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=layers,
                                    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                    **extra)


def figures(r) -> dict:
    """Everything a report totals, per operator type and per module (what must not depend on the method)."""
    return {
        "forward": r.forward, "backward": r.backward, "params": r.params, "buffers": r.buffers,
        "trainable": r.trainable_params, "unsupported": dict(r.unsupported),
        "backward_unsupported": dict(r.backward_unsupported), "optimizer": r.optimizer,
        "ops": {k: (s.nodes, s.cost, s.backward) for k, s in r.by_op_type.items()},
        "modules": [(m.module, m.forward, m.backward, m.params) for m in r.by_module(3)],
        "nodes": len(r.nodes), "bounds": dict(r.upper_bounds),
    }


def both(config, shape, **kwargs):
    extended = flopcount.from_hf(config, shape, cache_dir=False, **kwargs)
    exported = flopcount.from_hf(config, shape, cache_dir=False, repeated_layers="export", **kwargs)
    return extended, exported


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_llama_extended_equals_the_whole_export(mode):
    layers, b, s = 5, 2, 7
    extended, exported = both(llama(layers), (b, s), mode=mode, optimizer="adam" if mode == "train" else None)
    assert extended.layers.method == EXTENDED and extended.layers.path == "model.layers"
    assert exported.layers.method == EXPORTED and "--repeated-layers export" in exported.layers.reason
    assert figures(extended) == figures(exported)
    # dense products, closed form: per token and layer Q, K, V, O and gate/up/down; per layer the two attention
    # products over the full S×S scores; the head on every token
    dense = flopcount.from_hf(llama(layers), (b, s), cache_dir=False, convention="dense")
    per_layer = 2 * b * s * (2 * H * H + 2 * H * KV + 3 * H * FFN) + 2 * 2 * b * s * s * H
    assert dense.layers.method == EXTENDED
    assert dense.forward.flops == layers * per_layer + 2 * b * s * H * VOCAB
    built = transformers.AutoModelForCausalLM.from_config(llama(layers))
    assert extended.params == sum(p.numel() for p in built.parameters())


def test_the_copied_nodes_carry_their_layers():
    r = flopcount.from_hf(llama(4), (1, 6), cache_dir=False)
    rows = {m.module: m for m in r.by_module(2)}
    layers = [rows[f"model.layers.{k}"] for k in range(4)]
    assert all(m.forward == layers[1].forward and m.params == layers[1].params for m in layers[2:])
    copies = [n for n in r.nodes if n.name.endswith("@model.layers.3")]
    assert copies and sum(n.cost.flops for n in copies) == layers[3].forward.flops
    assert [n.index for n in r.nodes] == list(range(len(r.nodes)))


def test_moe_extended_equals_the_whole_export():
    config = transformers.Qwen3MoeConfig(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=24, num_hidden_layers=3, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, head_dim=H // HEADS, vocab_size=VOCAB, num_experts=6, num_experts_per_tok=2)
    extended, exported = both(config, (1, 5), convention="dense")
    assert extended.layers.method == EXTENDED
    assert figures(extended) == figures(exported)
    assert extended.moe == exported.moe and extended.moe.layers == 3
    assert extended.moe.routed_flops == 3 * 5 * 2 * 2 * 3 * H * 24  # 3 blocks, 5 tokens, k=2 experts of H×24


def test_executed_sliding_attention_is_extended():
    config = transformers.MistralConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=3,
                                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                        sliding_window=3, attn_implementation="eager")
    extended, exported = both(config, (1, 9), convention="dense", attention="executed")
    assert extended.layers.method == EXTENDED
    assert figures(extended) == figures(exported)
    pairs = sum(min(i + 1, 3) for i in range(9))  # query i attends to keys i-2 … i
    per_layer = 2 * 9 * (2 * H * H + 2 * H * KV + 3 * H * FFN) + 2 * 2 * pairs * H
    assert extended.forward.flops == 3 * per_layer + 2 * 9 * H * VOCAB


def test_layers_of_kinds_that_do_not_repeat_are_exported_whole():
    # Qwen2 with sliding windows on the layers from max_window_layers on: 2 full, 2 sliding (no block repeats thrice)
    config = transformers.Qwen2Config(hidden_size=H, intermediate_size=FFN, num_hidden_layers=4,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                      use_sliding_window=True, sliding_window=3, max_window_layers=2)
    r = flopcount.from_hf(config, (1, 5), cache_dir=False)
    assert r.layers.method == EXPORTED and "kinds by layer: 0 0 1 1" in r.layers.reason


def deepseek(layers: int):
    # DeepSeek-V3 with its first layer dense and the rest mixture-of-experts
    return transformers.DeepseekV3Config(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=24, num_hidden_layers=layers,
        first_k_dense_replace=1, num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=VOCAB,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=16,
        kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8)


@pytest.mark.slow  # 40-80 s each: in the pinned lane only (CI's newest lane runs the not-slow ones)
def test_a_dense_first_layer_then_identical_layers():
    """DeepSeek-V3's dense first layer, then 4 identical MoE layers: counted from 2 and 3 layers, and extended; with
    3 layers the MoE layer repeats only twice, and the model is exported whole."""
    extended, exported = both(deepseek(5), (1, 4), mode="train")
    assert extended.layers.method == EXTENDED
    assert extended.layers.reason.startswith("5 layers, the first 1, then identical layers repeated 4 times: "
                                             "counted from exports of 2 and 3 layers")
    assert figures(extended) == figures(exported) and extended.moe == exported.moe and extended.moe.layers == 4
    built = transformers.AutoModelForCausalLM.from_config(deepseek(5))
    assert extended.params == sum(p.numel() for p in built.parameters())
    r = flopcount.from_hf(deepseek(3), (1, 4), cache_dir=False)
    assert r.layers.method == EXPORTED and "kinds by layer: 0 1 1" in r.layers.reason


@pytest.mark.parametrize("name", ["gemma2", "qwen2"])
def test_periodic_and_prefixed_layer_kinds_are_extended(name):
    """Gemma-2's sliding and full layers alternate (a block of 2, three times); Qwen2's first max_window_layers
    layers attend fully and the rest in a window (2 first, then 4 identical): executed attention per layer kind."""
    if name == "gemma2":
        config = transformers.Gemma2Config(hidden_size=H, intermediate_size=FFN, num_hidden_layers=6,
                                           num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=8,
                                           vocab_size=VOCAB, sliding_window=4)
        sizes = "2 and 4"
    else:
        config = transformers.Qwen2Config(hidden_size=H, intermediate_size=FFN, num_hidden_layers=6,
                                          num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                          use_sliding_window=True, sliding_window=3, max_window_layers=2)
        sizes = "3 and 4"
    extended, exported = both(config, (1, 7), mode="train", attention="executed")
    assert extended.layers.method == EXTENDED and f"counted from exports of {sizes} layers" in extended.layers.reason
    assert figures(extended) == figures(exported)


def test_two_layers_are_exported_whole():
    r = flopcount.from_hf(llama(2), (1, 4), cache_dir=False)
    assert r.layers.method == EXPORTED and r.layers.layers == 2


def test_bad_repeated_layers_value():
    with pytest.raises(UsageError, match="repeated_layers"):
        flopcount.from_hf(llama(3), (1, 4), cache_dir=False, repeated_layers="some")


@pytest.mark.slow  # 40-80 s each: in the pinned lane only (CI's newest lane runs the not-slow ones)
def test_cli_reports_the_method_and_caches_the_small_exports(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(llama(6).to_json_string())
    cache = tmp_path / "cache"
    command = [sys.executable, "-m", "flopcount", "--hf", str(folder), "--input-shape", "input_ids=1x8"]
    env = {"FLOPCOUNT_CACHE": str(cache), "PATH": "/usr/bin:/bin"}
    table = subprocess.run(command, capture_output=True, text=True, env=env, check=True).stdout
    assert "Layers: 6 in model.layers, extended: 6 identical layers" in table
    assert len(list(cache.glob("*.onnx"))) == 2  # the 1- and 2-layer exports, not the 6-layer one
    doc = json.loads(subprocess.run([*command, "--format", "json", "--repeated-layers", "export"],
                                    capture_output=True, text=True, env=env, check=True).stdout)
    assert doc["layers"] == {"path": "model.layers", "layers": 6, "method": "exported",
                             "reason": "--repeated-layers export: the whole model exported"}


@pytest.mark.slow  # 40-80 s each: in the pinned lane only (CI's newest lane runs the not-slow ones)
def test_generation_is_extended_and_equals_a_real_generate():
    """``--generate`` of a 4-layer Llama from its 1- and 2-layer versions: equal to the whole model's count, and
    to torch's FlopCounterMode over a real CPU ``generate()`` (eager attention)."""
    from torch.utils.flop_counter import FlopCounterMode

    config = llama(4, attn_implementation="eager")
    p, n, b = 6, 5, 2
    extended, exported = both(config, None, generate=(p, n), batch=b, convention="dense")
    assert extended.layers.method == EXTENDED and "extended to 4" in extended.generation.method
    assert extended.generation.as_dict() | {"method": ""} == exported.generation.as_dict() | {"method": ""}
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.generate(torch.randint(0, VOCAB, (b, p)), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    assert extended.generation.total.flops == counter.get_total_flops()


@pytest.mark.slow  # 40-80 s each: in the pinned lane only (CI's newest lane runs the not-slow ones)
def test_cli_generate_takes_repeated_layers(tmp_path):
    folder = tmp_path / "llama"
    folder.mkdir()
    (folder / "config.json").write_text(llama(3).to_json_string())
    command = [sys.executable, "-m", "flopcount", "--hf", str(folder), "--generate", "4:2", "--format", "json"]
    env = {"FLOPCOUNT_CACHE": "0", "PATH": "/usr/bin:/bin"}
    docs = [json.loads(subprocess.run([*command, "--repeated-layers", how], capture_output=True, text=True, env=env,
                                      check=True).stdout) for how in ("extend", "export")]
    assert [d["layers"]["method"] for d in docs] == ["extended", "exported"]
    assert docs[0]["generation"]["total"] == docs[1]["generation"]["total"]


@pytest.mark.parametrize("name", ["gpt2", "bert"])
def test_other_stacks_are_extended(name):
    """GPT-2 (its layer count is n_layer, its stack transformer.h) and a BERT encoder (encoder.layer)."""
    config = (transformers.GPT2Config(n_layer=3, n_embd=H, n_head=HEADS, vocab_size=VOCAB) if name == "gpt2" else
              transformers.BertConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=3,
                                      num_attention_heads=HEADS, vocab_size=VOCAB))
    extended, exported = both(config, (1, 6), mode="train")
    assert extended.layers.method == EXTENDED
    assert extended.layers.path == {"gpt2": "transformer.h", "bert": "encoder.layer"}[name]  # BertModel
    assert figures(extended) == figures(exported)
