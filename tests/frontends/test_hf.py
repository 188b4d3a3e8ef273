"""``from_hf``: transformers models counted from a configuration alone (local folders only; nothing fetched)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import flopcount
from flopcount.errors import ConfigError, UsageError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, KV_HEADS, HEADS, FFN, LAYERS, VOCAB = 64, 2, 4, 176, 2, 97


@pytest.fixture()
def llama_folder(tmp_path):
    cfg = transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                   num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB)
    cfg.save_pretrained(tmp_path / "llama")
    return tmp_path / "llama"


def llama_dense_flops(s: int) -> int:
    kv = H // HEADS * KV_HEADS
    layer = 2 * s * (2 * H * H + 2 * H * kv) + 2 * s * 3 * H * FFN + 2 * 2 * s * s * H  # projections, MLP, attention
    return LAYERS * layer + 2 * s * H * VOCAB  # and the head


@pytest.mark.parametrize("given", ["folder", "file", "dict"])
def test_llama_from_its_configuration(llama_folder, given):
    source = {"folder": llama_folder, "file": llama_folder / "config.json",
              "dict": json.loads((llama_folder / "config.json").read_text())}[given]
    r = flopcount.from_hf(source, {"input_ids": (1, 11)}, convention="dense", cache_dir=False)
    assert r.total.flops == llama_dense_flops(11)
    built = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(llama_folder))
    assert r.params == sum(p.numel() for p in built.parameters())  # torch's own count


def test_a_bare_shape_is_input_ids(llama_folder):
    r = flopcount.from_hf(llama_folder, (1, 7), convention="dense", cache_dir=False)
    assert r.total.flops == llama_dense_flops(7)


def test_an_encoder_decoder_builds_the_whole_model_and_a_bare_shape_is_its_main_input():
    """A Whisper configuration without ``architectures`` builds WhisperModel (its causal-LM class is the decoder
    alone, which takes no ``input_features``), and a bare shape is its ``main_input_name``, ``input_features``: the
    forward's front end then meets it (transformers refuses the missing decoder input, one line)."""
    from flopcount.frontends.hf import build_model, is_causal_lm

    cfg = transformers.WhisperConfig(d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=48, decoder_ffn_dim=48, vocab_size=50,
                                     num_mel_bins=8, max_source_positions=4, pad_token_id=0, bos_token_id=1,
                                     eos_token_id=2, decoder_start_token_id=1)
    assert not is_causal_lm(cfg) and type(build_model(cfg)).__name__ == "WhisperModel"
    r = flopcount.from_hf(cfg, {"input_features": (1, 8, 8), "decoder_input_ids": (1, 3)}, cache_dir=False)
    assert r.params == sum(p.numel() for p in transformers.WhisperModel(cfg).parameters())
    with pytest.raises(UsageError) as e:
        flopcount.from_hf(cfg, (1, 8, 8), cache_dir=False)
    assert "passed input_features: float32[1, 8, 8]" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("architectures, cls", [
    pytest.param(None, "BertModel", id="no-architectures"),
    pytest.param(["BertForMaskedLM"], "BertForMaskedLM", id="masked-lm"),
])
def test_bert_builds_the_class_its_configuration_names(tmp_path, architectures, cls):
    cfg = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
                                  vocab_size=50, architectures=architectures)
    cfg.save_pretrained(tmp_path)
    r = flopcount.from_hf(tmp_path, {"input_ids": (1, 5)}, cache_dir=False)
    built = getattr(transformers, cls)(cfg)
    assert r.params == sum(p.numel() for p in built.parameters())  # tied weights once, as torch counts them
    if cls == "BertModel":
        # the encoder's products, dense: Q, K, V, O (4·h²) and the MLP (2·h·ffn) per token, the attention
        # (2·s·h per token), and the pooler (h² on the first token)
        dense = flopcount.from_hf(tmp_path, {"input_ids": (1, 5)}, convention="dense", cache_dir=False)
        assert dense.total.flops == 2 * 5 * (4 * 32 * 32 + 2 * 32 * 48) + 2 * 2 * 5 * 5 * 32 + 2 * 32 * 32


def test_unknown_model_type_is_a_config_error(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "lama", "hidden_size": 8}))
    with pytest.raises(ConfigError, match=r"model_type 'lama' is unknown.*did you mean .*'llama'") as e:
        flopcount.from_hf(tmp_path, (1, 4))
    assert e.value.exit_code == 13


@pytest.mark.parametrize("content, message", [
    pytest.param(None, "no such file", id="missing"),
    pytest.param("{not json", "not a readable JSON", id="broken"),
    pytest.param("[1, 2]", "a JSON object", id="not-an-object"),
    pytest.param("{}", "no model_type", id="no-model-type"),
])
def test_unreadable_configurations(tmp_path, content, message):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        flopcount.from_hf(path, (1, 4))


def test_input_shapes_are_required(llama_folder):
    with pytest.raises(UsageError, match="input_ids=1x2048"):
        flopcount.from_hf(llama_folder)


def _run(code: str, tmp_path, **env) -> subprocess.CompletedProcess:
    import os

    environment = {**os.environ, "HF_HOME": str(tmp_path / "hf-home"), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env=environment, cwd=tmp_path)


def test_hub_id_offline_says_to_pass_the_folder(tmp_path):
    p = _run("""
        import flopcount
        try:
            flopcount.from_hf("some-org/some-model", (1, 4))
        except flopcount.ConfigError as e:
            print("ERROR", e)
    """, tmp_path, HF_HUB_OFFLINE="1")
    assert "ERROR some-org/some-model: its config.json cannot be fetched" in p.stdout, p.stderr
    assert "offline" in p.stdout and "pass its folder" in p.stdout


REMOTE_CONFIG = """
from transformers import PretrainedConfig

class TinyConfig(PretrainedConfig):
    model_type = "tiny-remote"

    def __init__(self, width=8, **kwargs):
        self.width = width
        super().__init__(**kwargs)
"""
REMOTE_MODEL = """
import torch
from transformers import PreTrainedModel
from .configuration_tiny import TinyConfig

class TinyModel(PreTrainedModel):
    config_class = TinyConfig

    def __init__(self, config):
        super().__init__(config)
        self.proj = torch.nn.Linear(config.width, 3 * config.width, bias=False)
        self.post_init()

    def forward(self, inputs_embeds):
        return self.proj(inputs_embeds)
"""


@pytest.fixture()
def remote_folder(tmp_path):
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "configuration_tiny.py").write_text(REMOTE_CONFIG)
    (folder / "modeling_tiny.py").write_text(REMOTE_MODEL)
    (folder / "config.json").write_text(json.dumps({
        "model_type": "tiny-remote", "width": 8,
        "auto_map": {"AutoConfig": "configuration_tiny.TinyConfig", "AutoModel": "modeling_tiny.TinyModel"}}))
    return folder


def test_remote_code_is_refused_unless_trusted(remote_folder):
    with pytest.raises(ConfigError, match="trust-remote-code"):
        flopcount.from_hf(remote_folder, {"inputs_embeds": (1, 5, 8)})


def test_trusted_remote_code_counts(remote_folder, tmp_path):
    p = _run(f"""
        import flopcount
        r = flopcount.from_hf({str(remote_folder)!r}, {{"inputs_embeds": (1, 5, 8)}}, trust_remote_code=True,
                              cache_dir=False)
        print("FLOPS", r.total.flops, r.params)
    """, tmp_path)
    assert f"FLOPS {2 * 5 * 8 * 24} {8 * 24}" in p.stdout, p.stderr[-2000:]  # x[5, 8] @ W[8, 24]
