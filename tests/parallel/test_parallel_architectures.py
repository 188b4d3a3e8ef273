"""Per-rank FLOPs, communication and memory of models other than Llama (flopcount.parallel.layout finds their parts by
their role in the graph): a tiny GPT-2 (Conv1D fused QKV, GELU MLP, biases, tied LM head), BERT and ViT encoders
and a DeepSeek-V3-shaped MLA model, each counted once; their per-rank figures checked against closed forms written
here and against the parameters torch itself lists, the reconcile identities under tp, tp+sp, pp, dp, fsdp and zero,
and ResNet-50 (a CNN: no layers to split) under data-parallel plans."""

from __future__ import annotations

import json
import math

import pytest
from helpers import RESNET50_ONNX

from flopcount.errors import UsageError
from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel, parse_recompute
from flopcount.parallel.ranks import ledger, node_shares

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, L, HEADS, FFN, V, P = 32, 2, 4, 64, 64, 64  # hidden, layers, heads, MLP width (BERT, ViT), vocabulary, positions
D = H // HEADS
B, S = 2, 8
M = B * S  # tokens of a microbatch
IMAGE, PATCH = 32, 8  # ViT: 16 patches and the class token
N = (IMAGE // PATCH) ** 2 + 1


def count(config, shapes, optimizer="sgd"):
    import flopcount

    return flopcount.from_hf(config, shapes, cache_dir=False, mode="train", optimizer=optimizer,
                             memory=MemorySettings(device="cpu"))


def gpt2_config(vocab: int = V):
    return transformers.GPT2Config(n_embd=H, n_layer=L, n_head=HEADS, vocab_size=vocab, n_positions=P)


CONFIGS = {
    "gpt2": (gpt2_config, (B, S)),
    "bert": (lambda: transformers.BertConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS,
                                             intermediate_size=FFN, vocab_size=V, max_position_embeddings=P),
             (B, S)),
    "vit": (lambda: transformers.ViTConfig(hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS,
                                           intermediate_size=FFN, image_size=IMAGE, patch_size=PATCH),
            {"pixel_values": (B, 3, IMAGE, IMAGE)}),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    config, shapes = CONFIGS[request.param]
    return request.param, count(config(), shapes)


@pytest.fixture(scope="module")
def gpt2():
    return count(gpt2_config(), (B, S))


def plan(text: str, m: int = 1):
    return parse_parallel(text, microbatches=m)


def projection(k: int, n: int, t: int, row: bool) -> tuple[int, int]:
    """(forward, backward) FLOPs on one of t TP ranks of a Gemm of M tokens, K inputs and N outputs with its bias:
    2·M·K·N a multiply-add, the backward's two products twice that; the bias add M·N and its gradient's sum M·N,
    split with a column-parallel projection, whole on every rank of a row-parallel one (added after the
    reduction)."""
    product = 2 * M * k * n // t
    bias = M * n if row else M * n // t
    return product + bias, 2 * product + bias


@pytest.mark.parametrize("t", [1, 2, 4])
def test_gpt2_projections_split_by_their_role(gpt2, t):
    # per layer: the fused c_attn H→3H and c_fc H→4H column-parallel, the two c_proj (H→H, 4H→H) row-parallel
    parts = [projection(H, 3 * H, t, False), projection(H, H, t, True), projection(H, 4 * H, t, False),
             projection(4 * H, H, t, True)]
    want = (L * sum(f for f, _ in parts), L * sum(b for _, b in parts))
    for i in range(t):
        gemms = [x for x in node_shares(gpt2, plan(f"tp={t}")) if x.tp == i and gpt2.nodes[x.index].op_type == "Gemm"]
        assert (sum(x.forward for x in gemms), sum(x.backward for x in gemms)) == want
        # the heads (Q·Kᵀ and ·V, 2·B·HEADS·S·S·D each) and the vocab-parallel LM head (2·M·H·V) split 1/t
        matmuls = sum(x.forward for x in node_shares(gpt2, plan(f"tp={t}"))
                      if x.tp == i and gpt2.nodes[x.index].op_type == "MatMul")
        assert matmuls == (L * 2 * 2 * B * HEADS * S * S * D + 2 * M * H * V) // t


def gpt2_elements(t: int, vocab: int = V) -> int:
    """GPT-2's parameter elements on a TP rank of t: the tied embedding/LM head V×H/t (vocab-parallel), the
    position table P×H whole; per layer two LayerNorms (2H each) whole, c_attn (H·3H + 3H)/t and c_fc (H·4H + 4H)/t
    column-parallel with their biases, the two c_proj H·H/t and 4H·H/t with their biases H whole; ln_f 2H."""
    layer = 2 * 2 * H + (3 * H * H + 3 * H) // t + H * H // t + H + (4 * H * H + 4 * H) // t + 4 * H * H // t + H
    return vocab * H // t + P * H + L * layer + 2 * H


def encoder_elements(name: str, t: int) -> int:
    """BERT's and ViT's parameter elements on a TP rank of t: per layer Q, K, V (H·H + H)/t and the MLP's first
    projection (H·FFN + FFN)/t column-parallel, the attention output H·H/t and the MLP's second FFN·H/t row-parallel
    with their biases H whole, two LayerNorms 2H whole; outside the layers everything whole but BERT's word
    embedding (vocab-parallel V·H/t): BERT's position (P·H) and token-type (2·H) tables and embedding LayerNorm,
    ViT's patch convolution (3·PATCH²·H + H), class token (H), position table (N·H) and final LayerNorm; the pooler
    H·H + H."""
    layer = 3 * (H * H + H) // t + H * H // t + H + (H * FFN + FFN) // t + FFN * H // t + H + 2 * 2 * H
    outside = V * H // t + P * H + 2 * H + 2 * H if name == "bert" else 3 * PATCH * PATCH * H + H + H + N * H + 2 * H
    return outside + L * layer + H * H + H


def elements(name: str, t: int) -> int:
    return gpt2_elements(t) if name == "gpt2" else encoder_elements(name, t)


@pytest.mark.parametrize("t", [2, 4])
def test_parameters_per_tp_rank_closed_form_in_both_ledgers(model, t):
    name, report = model
    assert report.params == elements(name, 1)  # the closed form is the model's own count at t = 1
    mem = per_rank(report, plan(f"tp={t}"))
    led = ledger(report, plan(f"tp={t}"))
    for i in range(t):
        assert mem.ranks[i].params_bytes == 4 * elements(name, t)  # float32
        assert led.ranks[i].optimizer_flops == 2 * elements(name, t)  # SGD: 2 FLOPs an element


#: The plans (and microbatches) :func:`test_reconcile_over_ranks` checks on every model of :data:`CONFIGS`
#: (docs/architectures.md lists them per family).
PLANS = [
    pytest.param("tp=2", 1, id="tp2"),
    pytest.param("tp=2,sp", 2, id="tp2-sp"),
    pytest.param("pp=2", 2, id="pp2"),
    pytest.param("dp=2,fsdp", 2, id="dp2-fsdp"),
    pytest.param("tp=2,pp=2,dp=2,zero1", 2, id="tp2-pp2-dp2-zero1"),
    pytest.param("tp=4,dp=2,zero2", 1, id="tp4-dp2-zero2"),
]

#: model → plan → the one line it is refused with: ViT's 17 tokens, which sp cannot split over 2 ranks.
REFUSED = {"vit": {"tp=2,sp": "tp must divide the sequence length 17"}}


@pytest.mark.parametrize("text,m", PLANS)
def test_reconcile_over_ranks(model, text, m):
    name, report = model
    p = plan(text, m)
    if text in REFUSED.get(name, {}):
        with pytest.raises(UsageError, match=REFUSED[name][text]):
            ledger(report, p)
        return
    led = ledger(report, p)
    whole = report.forward.flops + report.backward.flops
    assert sum(r.model_flops for r in led.ranks) == whole * m * p.dp
    assert all(r.hardware_flops == r.model_flops + r.redundant_flops + r.recompute_flops for r in led.ranks)
    assert sum(r.optimizer_flops - r.optimizer_redundant_flops for r in led.ranks) == 2 * report.params
    mem = per_rank(report, p)
    assert {x for r in mem.ranks for x in r.replicas} == set(range(p.world_size))
    if not p.zero_stage:  # unsharded: the memory ledger holds the elements the optimizer ledger updates
        steps = {r.rank: r.optimizer_flops for r in led.ranks}
        assert all(r.params_bytes == 4 * steps[x] // 2 for r in mem.ranks for x in r.replicas)


def test_gpt2_tp_communication_closed_form(gpt2):
    a = M * H * 4  # one float32 activation of the microbatch
    for text, m in (("tp=2", 1), ("tp=2", 3)):
        for r in ledger(gpt2, plan(text, m)).ranks:
            # two blocks a layer, all-reduced in the forward and the backward; the embedding's output (forward)
            # and the LM head's input gradient (backward); no loss in the graph
            assert [(c.kind, c.group, c.bytes) for c in r.communication] == [
                ("all_reduce", "tp", m * (2 * L * a * 2 + a + a))]


def test_fsdp2_pads_dim_0(tmp_path):
    # an odd vocabulary: FSDP2 shards each parameter on dim 0, padded to ⌈d0/n⌉ rows on every rank
    report = count(gpt2_config(vocab=65), (B, S))
    model = transformers.AutoModelForCausalLM.from_config(gpt2_config(vocab=65))
    padded = sum(math.ceil(p.shape[0] / 2) * (p.numel() // p.shape[0]) for p in model.parameters())
    assert padded > math.ceil(sum(p.numel() for p in model.parameters()) / 2)
    for r in per_rank(report, plan("dp=2,fsdp")).ranks:
        assert r.params_bytes == 4 * padded
    # the collectives are handed the padded parameters (and no buffer or constant of the graph, which FSDP2 does
    # not shard): 2 shards of each; the root's (the embeddings, the final norm) gathered once a microbatch, a
    # layer's twice
    root = sum(math.ceil(p.shape[0] / 2) * (p.numel() // p.shape[0])
               for n, p in model.named_parameters() if ".h." not in n)
    for r in ledger(report, plan("dp=2,fsdp", 3)).ranks:
        assert {(c.kind, c.group): c.bytes for c in r.communication} == {
            ("all_gather", "dp"): 3 * 2 * 4 * (2 * padded - root), ("reduce_scatter", "dp"): 3 * 2 * 4 * padded}


@pytest.mark.slow  # one more export (DeepSeek-V3's MLA and 8 experts): about 10 s
def test_mla_memory_and_flops_split_the_same_parameters():
    # multi-head latent attention at tp=2: the up-projections q_b_proj and kv_b_proj column-parallel, the latent
    # down-projections and their norms whole, in the memory ledger as in the FLOPs (optimizer) ledger
    config = transformers.DeepseekV3Config(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=16, num_hidden_layers=2, first_k_dense_replace=1,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=V, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=8, v_head_dim=8)
    report = count(config, (B, S))
    split = ("q_b_proj", "kv_b_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "embed_tokens", "lm_head",
             "experts")
    model = transformers.AutoModelForCausalLM.from_config(config)
    want = sum(p.numel() // 2 if any(f"{s}." in n for s in split) and ".gate." not in n else p.numel()
               for n, p in model.named_parameters())
    mem = per_rank(report, plan(MLA_PLAN)).ranks
    led = ledger(report, plan(MLA_PLAN)).ranks
    for i in range(2):
        assert mem[i].params_bytes // 4 == led[i].optimizer_flops // 2 == want


#: The plan the MLA model is checked under: its parameters per rank in both ledgers.
MLA_PLAN = "tp=2"


def test_a_cnn_takes_data_parallel_plans():
    import flopcount

    report = flopcount.count(str(RESNET50_ONNX), mode="train")
    whole = report.forward.flops + report.backward.flops
    for text in ("dp=4", "dp=4,fsdp", "dp=4,zero1"):
        led = ledger(report, plan(text, 2))
        assert [r.model_flops for r in led.ranks] == [2 * whole] * 4
        g = 4 * report.params  # float32 gradients
        comm = {(c.kind, c.group): c.bytes for c in led.ranks[0].communication}
        assert comm == ({("all_reduce", "dp"): g} if text == "dp=4" else
                        # no repeated layers: all of it the root's, kept gathered from the forward to the backward;
                        # every first dimension divides by 4, so FSDP2 pads nothing
                        {("all_gather", "dp"): 2 * g, ("reduce_scatter", "dp"): 2 * g} if text == "dp=4,fsdp" else
                        {("all_reduce", "dp"): g, ("all_gather", "dp"): g})
    for text in ("tp=2", "pp=2"):
        with pytest.raises(UsageError, match="a plan of dp .* applies to any model"):
            ledger(report, plan(text, 2))
    # no layers to checkpoint: refused, never a silent zero
    with pytest.raises(UsageError, match="--recompute full: .* no repeated attention layers to checkpoint"):
        ledger(report, plan("dp=4"), parse_recompute("full"))


def test_cli_plans_gpt2(tmp_path, capsys):
    from flopcount.cli import main

    cfg = tmp_path / "config.json"
    gpt2_config().to_json_file(cfg)
    assert main(["--hf", str(cfg), "--input-shape", f"input_ids={B}x64", "--mode", "train", "--parallel", "tp=2",
                 "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ranks = out["parallel"]["ranks"]
    assert sum(r["model_flops"] for r in ranks) == out["total"]["flops"]
    assert out["parallel"]["dims"]["heads"] == HEADS and out["parallel"]["dims"]["vocab"] == V


def test_layout_docstring_examples():
    import doctest

    import flopcount.parallel.layout

    result = doctest.testmod(flopcount.parallel.layout, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("t", [1, 2])
def test_tied_embedding_gradients_meet_across_the_pipeline(gpt2, t):
    # GPT-2's LM head reads the embedding's weight: under pp the first and the last stage each hold a copy (V×H/t
    # on a TP rank) and all-reduce its gradient once a step, as Megatron's embedding group does
    led = ledger(gpt2, plan(f"tp={t},pp=2" if t > 1 else "pp=2", 2))
    for r in led.ranks:
        comm = {(c.kind, c.group): c.bytes for c in r.communication}
        assert comm[("all_reduce", "embedding")] == V * H // t * 4
    flat = ledger(gpt2, plan(f"tp={t}" if t > 1 else "dp=1"))
    assert all(c.group != "embedding" for r in flat.ranks for c in r.communication)
    # the first stage's copy: in its memory and in its optimizer step (a redundant update of the head's weights)
    mem = {r.rank: r.params_bytes for r in per_rank(gpt2, plan(f"tp={t},pp=2" if t > 1 else "pp=2", 2)).ranks}
    for r in led.ranks:
        assert mem[r.rank] == 4 * r.optimizer_flops // 2
        if r.stage == 0:
            assert r.optimizer_redundant_flops // 2 >= V * H // t
    assert sum(r.optimizer_flops - r.optimizer_redundant_flops for r in led.ranks) == 2 * gpt2.params
