"""``--generate P:N``: generate() counted from the prefill graph and the decode step exported with its KV cache,
checked against torch's FlopCounterMode over a real CPU ``generate()`` and against closed forms."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import flopcount
from flopcount.errors import UsageError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, KV_HEADS, HEADS, FFN, LAYERS, VOCAB = 64, 2, 4, 176, 2, 97
KV = H // HEADS * KV_HEADS  # width of the keys (and values): 2 heads of 16


def llama_config(**extra):
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                    architectures=["LlamaForCausalLM"], **extra)


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    llama_config().save_pretrained(folder)
    return folder


def per_token_products() -> int:
    """Dense FLOPs of one token outside attention: Q, K, V, O projections and the gated MLP, per layer."""
    return LAYERS * (2 * (2 * H * H + 2 * H * KV) + 2 * 3 * H * FFN)


def prefill_dense(b: int, p: int) -> int:
    # every prompt token through the layers, QKᵀ and AV over the p×p score matrix, the head on the last token
    return b * (p * per_token_products() + LAYERS * 2 * 2 * p * p * H + 2 * H * VOCAB)


def step_dense(b: int, context: int) -> int:
    # one token through the layers, its query against `context` keys and values, the head
    return b * (per_token_products() + LAYERS * 2 * 2 * context * H + 2 * H * VOCAB)


@pytest.mark.parametrize("p, n, b", [
    pytest.param(7, 5, 2, id="P7-N5-B2"),
    pytest.param(3, 1, 1, id="P3-N1-prefill-only"),
    pytest.param(4, 3, 1, id="P4-N3-two-steps"),
])
def test_generate_equals_flop_counter_over_a_real_generate(p, n, b):
    from torch.utils.flop_counter import FlopCounterMode

    config = llama_config(attn_implementation="eager")
    r = flopcount.from_hf(config, generate=(p, n), batch=b, convention="dense", cache_dir=False)
    g = r.generation
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(1, VOCAB, (b, p))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0)
    assert out.shape == (b, p + n)
    assert g.total.flops == counter.get_total_flops()
    # and the closed forms, piece by piece
    assert g.prefill.flops == r.total.flops == prefill_dense(b, p)
    contexts = range(p + 1, p + n)  # step j attends to P + j positions
    assert g.decode.flops == sum(step_dense(b, c) for c in contexts)
    if n > 1:
        assert (g.first_step.flops, g.last_step.flops) == (step_dense(b, p + 1), step_dense(b, p + n - 1))
        (piece,) = g.pieces
        assert piece.per_position.flops == b * LAYERS * 2 * 2 * H
    assert g.flops_per_token == g.total.flops / n
    # keys and values of P + N − 1 positions, float32, per layer and sequence
    assert dict(g.kv_cache_bytes) == {"float32": LAYERS * 2 * b * KV * (p + n - 1) * 4}


def test_from_causal_lm_counts_any_module_with_past_key_values():
    """A causal LM given as a module (here one with real CPU weights) counts as its configuration does."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    r = flopcount.from_causal_lm(model, (5, 6), convention="dense", cache_dir=False)
    g = r.generation
    assert g.prefill.flops == prefill_dense(1, 5)
    assert g.decode.flops == sum(step_dense(1, c) for c in range(6, 11))
    assert "checked at" in g.method  # five steps: the line through the ends is checked at a third context


@pytest.mark.parametrize("generate, message", [
    pytest.param((0, 4), "prompt tokens P must be a positive integer", id="P0"),
    pytest.param((4, 0), "new tokens N must be a positive integer", id="N0"),
    pytest.param((4,), r"generate is \(P, N\)", id="one-number"),
])
def test_bad_generate_is_a_usage_error(llama_folder, generate, message):
    with pytest.raises(UsageError, match=message):
        flopcount.from_hf(llama_folder, generate=generate)


def test_generate_refuses_a_model_that_is_not_a_causal_lm(tmp_path):
    transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
                            vocab_size=50).save_pretrained(tmp_path)
    with pytest.raises(UsageError, match="--generate is for a causal language model; bert builds BertModel"):
        flopcount.from_hf(tmp_path, generate=(4, 2))
    with pytest.raises(UsageError, match="not a causal LM"):
        flopcount.from_causal_lm(torch.nn.Linear(3, 4), (4, 2))


def cli(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopcount", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_cli_generate_json_and_table(llama_folder, tmp_path):
    p = cli("--hf", str(llama_folder), "--generate", "6:4", "--batch", "3", "--convention", "dense",
            "--format", "json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema_version"] == 9
    g = doc["generation"]
    assert (g["batch"], g["prompt_tokens"], g["new_tokens"], g["decode_steps"]) == (3, 6, 4, 3)
    assert g["prefill_flops"] == doc["total"]["flops"] == prefill_dense(3, 6)
    steps = g["decode_flops_per_step"]
    assert (steps["first"], steps["first_context"]) == (step_dense(3, 7), 7)
    assert (steps["last"], steps["last_context"]) == (step_dense(3, 9), 9)
    assert g["decode_flops"] == step_dense(3, 7) + step_dense(3, 8) + step_dense(3, 9)
    assert g["total_flops"] == g["prefill_flops"] + g["decode_flops"]
    assert g["kv_cache_bytes"] == {"float32": LAYERS * 2 * 3 * KV * 9 * 4}


def test_cli_generate_with_torch_factory(tmp_path):
    (tmp_path / "tiny_lm.py").write_text(textwrap.dedent(f"""
        import torch, transformers

        def make():
            config = transformers.LlamaConfig(hidden_size={H}, intermediate_size={FFN}, num_hidden_layers={LAYERS},
                                              num_attention_heads={HEADS}, num_key_value_heads={KV_HEADS},
                                              vocab_size={VOCAB})
            with torch.device("meta"):
                return transformers.LlamaForCausalLM(config)
    """))
    p = cli("--torch", "tiny_lm:make", "--generate", "5:2", "--convention", "dense", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert f"Decode FLOPs (1 step): {step_dense(1, 6):,}" in p.stdout
    assert f"Prefill FLOPs (logits of the last position only): {prefill_dense(1, 5):,}" in p.stdout


@pytest.mark.parametrize("args, message", [
    pytest.param(["--generate", "0:4"], "prompt tokens P must be a positive integer", id="P0"),
    pytest.param(["--generate", "4:0"], "new tokens N must be a positive integer", id="N0"),
    pytest.param(["--generate", "4"], "expected P:N", id="no-colon"),
    pytest.param(["--generate", "4:2", "--input-shape", "attention_mask=1x4"], "feeds input_ids only", id="other-input"),
    pytest.param(["--generate", "4:2", "--mode", "train"], "counts inference", id="train"),
])
def test_cli_bad_generate_is_one_line_exit_2(llama_folder, tmp_path, args, message):
    p = cli("--hf", str(llama_folder), *args, cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert message in p.stderr and "Traceback" not in p.stderr


def test_cli_generate_needs_a_causal_lm(tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"")
    p = cli("model.onnx", "--generate", "4:2", cwd=tmp_path)
    assert p.returncode == 2 and "--generate is for a causal LM given with --hf" in p.stderr
    bert = tmp_path / "bert"
    transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
                            vocab_size=50).save_pretrained(bert)
    p = cli("--hf", str(bert), "--generate", "4:2", cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert "not generate" in p.stderr and "Traceback" not in p.stderr and p.stderr.strip().count("\n") == 0


@pytest.mark.parametrize("name, p, n", [
    pytest.param("mistral-window", 3, 5, id="mistral-sliding-window"),
    pytest.param("qwen3-moe", 4, 3, id="qwen3-moe"),
    pytest.param("qwen2-sliding-layer", 2, 9, id="qwen2-sliding-layer-cropped-cache"),
])
def test_generate_of_other_decoders_equals_flop_counter(name, p, n):
    from torch.utils.flop_counter import FlopCounterMode

    if name == "mistral-window":
        config = transformers.MistralConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                            num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                            sliding_window=4, attn_implementation="eager")
    elif name == "qwen2-sliding-layer":  # its second layer's cache keeps the last 4 positions: pieces
        config = transformers.Qwen2Config(hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=50,
                                          use_sliding_window=True, sliding_window=4, max_window_layers=1,
                                          attn_implementation="eager")
    else:
        config = transformers.Qwen3MoeConfig(hidden_size=32, intermediate_size=40, moe_intermediate_size=24,
                                             num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                             head_dim=8, vocab_size=50, num_experts=6, num_experts_per_tok=2,
                                             attn_implementation="eager")
    g = flopcount.from_hf(config, generate=(p, n), convention="dense", cache_dir=False).generation
    config._experts_implementation = "batched_mm"  # each token's k experts as one batched product, as counted
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    ids = torch.randint(1, 50, (1, p))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                       do_sample=False, pad_token_id=0)
    assert g.total.flops == counter.get_total_flops()


def test_generate_with_executed_attention():
    """The prefill's attention runs P(P+1)/2 pairs per head; a decode step's one query sees its whole context."""
    p, n, b = 6, 3, 1
    config = llama_config()
    full = flopcount.from_hf(config, generate=(p, n), convention="dense", cache_dir=False).generation
    executed = flopcount.from_hf(config, generate=(p, n), convention="dense", cache_dir=False,
                                 attention="executed").generation
    assert full.prefill.flops - executed.prefill.flops == LAYERS * 2 * 2 * (p * p - p * (p + 1) // 2) * H
    assert executed.decode == full.decode


class TupleCacheLM(torch.nn.Module):
    """A one-layer causal LM of its own (not transformers) with a legacy cache: ((key, value),) per layer."""

    def __init__(self, vocab=23, width=12):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, input_ids, past_key_values=None, use_cache=True):
        x = self.embed(input_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if past_key_values is not None:
            k = torch.cat([past_key_values[0][0], k], dim=1)
            v = torch.cat([past_key_values[0][1], v], dim=1)
        scores = q @ k.transpose(1, 2)
        s, t = scores.shape[-2:]
        causal = torch.ones(s, t, dtype=torch.bool, device=x.device).tril(t - s)
        y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
        return self.head(y), ((k, v),)


def test_from_causal_lm_with_a_tuple_cache():
    p, n, vocab, width = 5, 4, 23, 12
    g = flopcount.from_causal_lm(TupleCacheLM(vocab, width), (p, n), convention="dense", cache_dir=False).generation

    def forward(s, t):  # s new tokens over t positions: QKV, QKᵀ and AV, the head on every new token
        return 2 * s * width * 3 * width + 2 * 2 * s * t * width + 2 * s * width * vocab

    assert g.prefill.flops == forward(p, p)  # no logits_to_keep: the head runs on every prompt token
    assert g.decode.flops == sum(forward(1, c) for c in range(p + 1, p + n))
    assert dict(g.kv_cache_bytes) == {"float32": 2 * (p + n - 1) * width * 4}


def test_cache_argument_is_the_one_generate_passes():
    """The cache argument is found from the model and the installed transformers (``past_key_values`` up to 5.23,
    ``cache`` from 5.24): it is the keyword under which transformers' own ``generate()`` hands the model its cache."""
    from flopcount.frontends.generate import cache_argument

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(llama_config()).eval()
    passed = []

    def record(module, args, kwargs):
        passed.append({k for k, v in kwargs.items() if isinstance(v, transformers.Cache)})

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        ids = torch.randint(1, VOCAB, (1, 3))
        with torch.no_grad():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2,
                           do_sample=False, pad_token_id=0)
    finally:
        handle.remove()
    (name,) = set.union(*passed)  # one keyword, the same at every step
    assert cache_argument(model) == name


class MemoCacheLM(torch.nn.Module):
    """A one-layer causal LM of its own whose cache argument has a name of its own, annotated as transformers'
    ``Cache``: a ``DynamicCache`` it fills and returns beside the logits."""

    def __init__(self, vocab=23, width=12):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.qkv = torch.nn.Linear(width, 3 * width, bias=False)
        self.head = torch.nn.Linear(width, vocab, bias=False)

    def forward(self, input_ids, memo: transformers.Cache | None = None):
        x = self.embed(input_ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        memo = transformers.DynamicCache() if memo is None else memo
        k, v = memo.update(k.unsqueeze(1), v.unsqueeze(1), 0)  # [B, 1 head, positions, width]
        scores = q @ k.squeeze(1).transpose(1, 2)
        s, t = scores.shape[-2:]
        causal = torch.ones(s, t, dtype=torch.bool, device=x.device).tril(t - s)
        y = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v.squeeze(1)
        return self.head(y), memo


def test_from_causal_lm_finds_a_cache_argument_by_its_annotation():
    p, n, vocab, width = 4, 3, 23, 12
    g = flopcount.from_causal_lm(MemoCacheLM(vocab, width), (p, n), convention="dense", cache_dir=False).generation

    def forward(s, t):  # s new tokens over t positions: QKV, QKᵀ and AV, the head on every new token
        return 2 * s * width * 3 * width + 2 * 2 * s * t * width + 2 * s * width * vocab

    assert g.prefill.flops == forward(p, p)
    assert g.decode.flops == sum(forward(1, c) for c in range(p + 1, p + n))
    assert dict(g.kv_cache_bytes) == {"float32": 2 * (p + n - 1) * width * 4}
