"""Mixture-of-experts models from their configurations: router, k routed experts per token and shared experts,
against closed forms, against torch's FlopCounterMode over a real CPU forward, and against torch's parameters."""

from __future__ import annotations

import subprocess
import sys

import pytest

import flopcount
from flopcount.errors import UsageError
from flopcount.reporting.moe import MixtureOfExperts

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, HEADS, KV_HEADS, VOCAB, S = 32, 4, 2, 50, 5
KV = H // HEADS * KV_HEADS
E, K, I_MOE = 6, 2, 24  # routed experts, experts per token, an expert's intermediate size


def attention_and_head(s: int) -> int:
    """Dense FLOPs of one layer's Q, K, V, O and attention products, and of the LM head on every token."""
    return 2 * s * (2 * H * H + 2 * H * KV) + 2 * 2 * s * s * H + 2 * s * H * VOCAB


def routed(s: int, intermediate: int = I_MOE, k: int = K) -> int:
    return s * k * 2 * 3 * H * intermediate  # k experts per token: gate, up and down, H × I each


CONFIGS = {
    "mixtral": lambda: transformers.MixtralConfig(
        hidden_size=H, intermediate_size=48, num_hidden_layers=1, num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS, vocab_size=VOCAB, num_local_experts=4, num_experts_per_tok=K),
    "qwen2_moe": lambda: transformers.Qwen2MoeConfig(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=I_MOE, shared_expert_intermediate_size=56,
        num_hidden_layers=1, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
        num_experts=E, num_experts_per_tok=K, decoder_sparse_step=1),
    "qwen3_moe": lambda: transformers.Qwen3MoeConfig(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=I_MOE, num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=H // HEADS, vocab_size=VOCAB,
        num_experts=E, num_experts_per_tok=K),
    "deepseek_v3": lambda: transformers.DeepseekV3Config(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=I_MOE, num_hidden_layers=2, first_k_dense_replace=1,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=VOCAB, n_routed_experts=8,
        num_experts_per_tok=K, n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=16, kv_lora_rank=8,
        qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8),
}

# closed forms, dense, for S tokens: attention and head, the router (H → E logits), k experts per token, shared
CLOSED = {
    "mixtral": attention_and_head(S) + 2 * S * H * 4 + routed(S, 48),
    # the shared expert (gate, up, down of 56) and its gate (H → 1) on every token; Q, K, V biases not products
    "qwen2_moe": attention_and_head(S) + 2 * S * H * E + routed(S) + 2 * S * 3 * H * 56 + 2 * S * H,
    "qwen3_moe": attention_and_head(S) + 2 * S * H * E + routed(S),
}
# per block: (routed experts, params of one expert, shared experts' params, MoE blocks)
STRUCTURE = {
    "mixtral": (4, 3 * H * 48, 0, 1),
    "qwen2_moe": (E, 3 * H * I_MOE, 3 * H * 56 + H, 1),
    "qwen3_moe": (E, 3 * H * I_MOE, 0, 1),
    "deepseek_v3": (8, 3 * H * I_MOE, 3 * H * I_MOE, 1),  # one shared expert of I_MOE; layer 0 is dense
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def counted(request):
    name = request.param
    return name, flopcount.from_hf(CONFIGS[name](), (1, S), convention="dense", cache_dir=False)


def test_moe_counts_k_experts_per_token(counted):
    name, r = counted
    if name in CLOSED:
        assert r.total.flops == CLOSED[name]
    experts, per_expert, shared, blocks = STRUCTURE[name]
    m = r.moe
    assert (m.layers, m.experts, m.top_k, m.expert_params, m.shared_params) == (blocks, experts, K, per_expert, shared)
    assert m.routed_flops == blocks * routed(S, per_expert // (3 * H))
    built = transformers.AutoModelForCausalLM.from_config(CONFIGS[name]())
    torch_params = sum(p.numel() for p in built.parameters())
    assert m.params == r.params == torch_params
    assert m.active_params == torch_params - blocks * (experts - K) * per_expert


@pytest.mark.parametrize("name", ["mixtral", "deepseek_v3"])
def test_moe_equals_flop_counter_over_a_real_forward(name):
    """torch's counter over a CPU forward with the same experts implementation (each token's k experts as one
    batched product): the products are the same."""
    from torch.utils.flop_counter import FlopCounterMode

    config = CONFIGS[name]()
    config._attn_implementation = "eager"
    r = flopcount.from_hf(config, (2, S), convention="dense", cache_dir=False)
    config._experts_implementation = "batched_mm"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=torch.randint(0, VOCAB, (2, S)), use_cache=False)
    assert r.total.flops == counter.get_total_flops()
    assert r.moe.tokens == 2 * S


def test_capacity_factor_bounds_the_routed_work():
    r = flopcount.from_hf(CONFIGS["qwen3_moe"](), (1, 12), convention="dense", cache_dir=False, capacity_factor=0.5)
    m = r.moe
    # T·k = 24 pairs over 6 experts; each takes at most ⌊0.5·24/6⌋ = 2: 12 pairs of 24 run at most
    assert (m.pairs, m.capacity_pairs) == (24, 12)
    assert m.routed_flops_at_capacity == routed(12) // 2
    assert r.total.flops == attention_and_head(12) + 2 * 12 * H * E + routed(12)  # the totals count no drop
    roomy = MixtureOfExperts(1, 6, 2, 1, 0, 10, 12, 240, capacity_factor=100.0)
    assert roomy.capacity_pairs == 24 and roomy.routed_flops_at_capacity == 240  # no expert over-full


def test_capacity_factor_needs_experts(tmp_path):
    config = transformers.LlamaConfig(hidden_size=H, intermediate_size=40, num_hidden_layers=1,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB)
    with pytest.raises(UsageError, match="no routed experts"):
        flopcount.from_hf(config, (1, 4), capacity_factor=1.25, cache_dir=False)
    with pytest.raises(UsageError, match="positive number"):
        flopcount.from_hf(config, (1, 4), capacity_factor=0)


def test_cli_moe_lines_and_json(tmp_path):
    import json

    CONFIGS["mixtral"]().save_pretrained(tmp_path)
    base = [sys.executable, "-m", "flopcount", "--hf", str(tmp_path), "--input-shape", f"input_ids=1x{S}",
            "--convention", "dense", "--capacity-factor", "1.0"]
    p = subprocess.run(base, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"Total FLOPs: {CLOSED['mixtral']:,}" in p.stdout
    assert "1 block of 4 routed experts, 2 per token" in p.stdout and "Capacity factor 1:" in p.stdout
    doc = json.loads(subprocess.run(base + ["--format", "json"], capture_output=True, text=True, timeout=300,
                                    cwd=tmp_path).stdout)
    built = transformers.MixtralForCausalLM(CONFIGS["mixtral"]())
    assert doc["moe"]["params"] == sum(p.numel() for p in built.parameters())
    assert doc["moe"]["active_params"] == doc["moe"]["params"] - (4 - 2) * 3 * H * 48
    bad = subprocess.run([sys.executable, "-m", "flopcount", "model.onnx", "--capacity-factor", "1"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert bad.returncode == 2 and "--capacity-factor is for a mixture-of-experts model" in bad.stderr


def test_encoder_decoder_blocks_route_their_own_tokens(tmp_path):
    """An encoder-decoder (SwitchTransformers, top-1 over 4 experts, one MoE block in each stack): the encoder's
    block routes B·S_enc tokens, the decoder's B·S_dec; the pairs (T·k) and the capacity bound (min(T·k,
    E·min(⌊C·T·k/E⌋, T))) are each block's own, in the record, the text and the JSON."""
    import json

    b, s_enc, s_dec, experts, k, c = 2, 8, 6, 4, 1, 0.5
    transformers.SwitchTransformersConfig(
        vocab_size=64, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=4,
        num_experts=experts, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, expert_capacity=8,
        router_jitter_noise=0.0).save_pretrained(tmp_path)
    enc, dec = b * s_enc, b * s_dec  # 16 and 12 tokens
    cap = [min(t * k, experts * min(int(c * t * k / experts), t)) for t in (enc, dec)]  # 4·2 = 8 and 4·1 = 4
    args = [sys.executable, "-m", "flopcount", "--hf", str(tmp_path), "--input-shape", f"input_ids={b}x{s_enc}",
            "--input-shape", f"decoder_input_ids={b}x{s_dec}", "--mode", "train", "--capacity-factor", str(c),
            "--format", "json"]
    p = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    moe = json.loads(p.stdout)["moe"]
    assert (moe["layers"], moe["experts"], moe["top_k"]) == (2, experts, k)
    assert moe["blocks"] == [{"tokens": enc, "pairs": enc * k, "capacity_pairs": cap[0]},
                             {"tokens": dec, "pairs": dec * k, "capacity_pairs": cap[1]}]
    assert moe["tokens"] is moe["pairs_per_layer"] is moe["capacity_pairs_per_layer"] is None  # they differ
    # every pair costs the same: the bound keeps (8 + 4) of the 28 pairs' work
    assert moe["routed_expert_flops_at_capacity"] == moe["routed_expert_flops"] * sum(cap) // ((enc + dec) * k)
    p = subprocess.run(args[:-2], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    text = " ".join(p.stdout.split())
    assert f"1 block of {enc} tokens: {enc * k} (token, expert) pairs each; 1 block of {dec} tokens: {dec * k}" in text
    assert f"at most {cap[0]} of {enc * k} pairs in a block of {enc} tokens, {cap[1]} of {dec * k} pairs" in text

def test_encoder_decoder_blocks_under_generate_route_the_prefills_tokens():
    """``--generate P:N`` of an encoder-decoder (SwitchTransformers, one MoE block in each stack, top-1 over 4
    experts): the summary is the prefill's, whose encoder block routes the B·P prompt tokens and whose decoder block
    the B start tokens, each block's pairs its own (T·k); the experts' products in the prefill's graph are
    2·2·h·d_ff a pair (wi and wo of the expert each pair visits)."""
    b, p, h, ff, k = 2, 6, 32, 48, 1
    config = transformers.SwitchTransformersConfig(
        vocab_size=64, d_model=h, d_kv=8, d_ff=ff, num_layers=1, num_decoder_layers=1, num_heads=4, num_experts=4,
        num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, expert_capacity=64, router_jitter_noise=0.0,
        decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    report = flopcount.from_hf(config, generate=(p, 2), batch=b, cache_dir=False)
    moe = report.moe.as_dict()
    assert (moe["layers"], moe["experts"], moe["top_k"]) == (2, 4, k)
    assert moe["blocks"] == [{"tokens": b * p, "pairs": b * p * k, "capacity_pairs": None},
                             {"tokens": b, "pairs": b * k, "capacity_pairs": None}]
    assert moe["tokens"] is moe["pairs_per_layer"] is None  # the blocks route different tokens
    scopes = report.modules.nodes
    products = sum(n.cost.flops for j, n in enumerate(report.nodes)
                   if n.family in ("matmul", "gemm") and any(".mlp.experts" in x for x in scopes[j]))
    assert products == 2 * 2 * h * ff * (b * p + b) * k
    assert report.generation.encoder_decoder and report.generation.prefill.flops == report.forward.flops


def test_decoder_only_blocks_keep_one_token_count():
    m = MixtureOfExperts(3, 6, 2, 1, 0, 10, 12, 300, capacity_factor=0.5)
    assert m.block_tokens == (12, 12, 12) and m.pairs == 24 and m.capacity_pairs == 12  # ⌊0.5·24/6⌋ = 2 each
    assert m.as_dict()["tokens"] == 12 and m.as_dict()["blocks"][1] == {"tokens": 12, "pairs": 24, "capacity_pairs": 12}
    with pytest.raises(ValueError, match="one count per block"):
        MixtureOfExperts(3, 6, 2, 1, 0, 10, (12, 6), 300)
