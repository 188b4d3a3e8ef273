"""``--generate P:N`` of an encoder-decoder (T5, BART): the encoder once over the prompt and the decoder's first
step over its start token (the prefill), then N − 1 decode steps over the decoder's own KV cache and the
cross-attention keys and values cached at the first step, checked against torch's FlopCounterMode over a real CPU
``model.generate()`` of the same tiny model: the whole run, the encoder and each decoder call apart, and the bytes
of the ``EncoderDecoderCache`` that ``generate()`` returns."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import flopcount
from flopcount.errors import UsageError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, FFN, LAYERS, HEADS, VOCAB = 64, 96, 2, 4, 64


def t5_config(**extra):
    return transformers.T5Config(d_model=H, d_kv=16, d_ff=FFN, num_layers=LAYERS, num_heads=HEADS, vocab_size=VOCAB,
                                 decoder_start_token_id=0, pad_token_id=0, eos_token_id=1, **extra)


def bart_config(**extra):
    return transformers.BartConfig(d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                   encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                                   decoder_ffn_dim=FFN, vocab_size=VOCAB, max_position_embeddings=32, pad_token_id=0,
                                   bos_token_id=1, eos_token_id=2, **extra)


BINS, POSITIONS = 16, 8  # Whisper's mel bins, and the positions its encoder gives (of 2·8 frames)


def whisper_config(**extra):
    return transformers.WhisperConfig(d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                      encoder_attention_heads=HEADS, decoder_attention_heads=HEADS,
                                      encoder_ffn_dim=FFN, decoder_ffn_dim=FFN, vocab_size=VOCAB, num_mel_bins=BINS,
                                      max_source_positions=POSITIONS, max_target_positions=32,
                                      decoder_start_token_id=1, pad_token_id=0, bos_token_id=1, eos_token_id=2, **extra)


CONFIGS = {"t5": t5_config, "bart": bart_config, "whisper": whisper_config}


def eager(name: str):
    config = CONFIGS[name]()
    config._attn_implementation = "eager"
    return config


def real_generate(name: str, p: int, n: int, b: int, config=None):
    """FlopCounterMode over a real greedy ``generate()`` of exactly N new tokens: ``(total, encoder, [decoder call
    FLOPs in order], cache bytes)``, each decoder call (the model's forward) and the encoder counted apart; a
    ``config`` given is run with caches whose layers are made as they are filled (transformers sizes the caches it
    makes by the encoder's layers)."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    build = transformers.WhisperForConditionalGeneration if name == "whisper" else (
        transformers.AutoModelForSeq2SeqLM.from_config)
    model = build(config or eager(name)).eval()
    past = {} if config is None else {"past_key_values": transformers.EncoderDecoderCache(
        transformers.DynamicCache(), transformers.DynamicCache())}
    encoder, forward, calls = model.get_encoder(), model.forward, []

    def counted(function, into):
        def run(*args, **kwargs):
            with FlopCounterMode(display=False) as inner:
                out = function(*args, **kwargs)
            into.append(inner.get_total_flops())
            return out
        return run

    encoded: list[int] = []
    model.forward = counted(forward, calls)
    encoder.forward = counted(encoder.forward, encoded)
    if name == "whisper":  # audio: P positions of the encoder's output from 2·P frames of mel features
        source = {"input_features": torch.randn(b, BINS, 2 * p)}
    else:
        ids = torch.randint(3, VOCAB, (b, p))
        source = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with FlopCounterMode(display=False) as whole, torch.no_grad():
        out = model.generate(**source, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             return_dict_in_generate=True, **past)
    assert out.sequences.shape == (b, n + 1)  # the start token and N new ones
    cache = out.past_key_values
    held = sum(t.numel() * t.element_size() for part in (cache.self_attention_cache, cache.cross_attention_cache)
               for layer in part.layers for t in (layer.keys, layer.values))
    return whole.get_total_flops(), sum(encoded), calls, held


@pytest.mark.parametrize("name", ["t5", "bart"])
@pytest.mark.parametrize("p, n, b", [pytest.param(4, 3, 1, id="P4-N3"),
                                     pytest.param(5, 4, 2, id="P5-N4-B2", marks=pytest.mark.slow),
                                     pytest.param(3, 1, 1, id="P3-N1-prefill-only", marks=pytest.mark.slow)])
def test_generate_equals_flop_counter_over_a_real_generate(name, p, n, b):
    g = flopcount.from_hf(eager(name), generate=(p, n), batch=b, convention="dense", cache_dir=False).generation
    total, encoder, calls, held = real_generate(name, p, n, b)
    assert len(calls) == n  # the decoder's N calls; the encoder ran once, apart
    assert g.encoder_decoder and (g.steps, g.first_context) == (n - 1, 2)
    assert g.prefill.flops == encoder + calls[0]
    assert [g.step(c).flops for c in range(2, n + 1)] == calls[1:]
    assert g.total.flops == total
    assert g.kv_cache_bytes == {"float32": held}


def test_t5_with_more_decoder_layers_than_encoder_layers():
    """T5 of 2 encoder and 3 decoder layers: the decode step's cache is rebuilt with a layer each (sized by the
    config, it would have the encoder's 2, and the third layer's update fails, as in transformers' own generate()):
    the count equals a real generate() over caches made as they are filled."""
    config = t5_config(num_decoder_layers=LAYERS + 1)
    config._attn_implementation = "eager"
    p, n, b = 4, 3, 1
    g = flopcount.from_hf(config, generate=(p, n), batch=b, convention="dense", cache_dir=False).generation
    total, encoder, calls, held = real_generate("t5", p, n, b, config)
    assert g.prefill.flops == encoder + calls[0]
    assert [g.step(c).flops for c in range(2, n + 1)] == calls[1:]
    assert g.total.flops == total and g.kv_cache_bytes == {"float32": held}


def test_whisper_generate_of_audio_equals_flop_counter_and_per_rank():
    """Whisper's ``generate()``: the encoder over the audio features (its convolutions, then its layers over P
    positions), the decoder over its start token, then N − 1 decode steps over both caches, equal FlopCounterMode
    over a real ``generate()`` of the same tiny model; under ``tp=2,dp=2`` each rank's share: the model work sums to
    the two replicas' total, the TP group all-reduces 2 blocks a layer of the encoder over the P positions (its
    convolutional front end runs whole on every rank: no lookup to reduce) and the decoder's lookup and 3 blocks a
    layer over one token in each phase, and each rank holds the K and V of its heads of both caches."""
    p, n, b = POSITIONS, 3, 2
    report = flopcount.from_hf(eager("whisper"), generate=(p, n), batch=b, convention="dense", cache_dir=False,
                               parallel="tp=2,dp=2", memory=True)
    g = report.generation
    total, encoder, calls, held = real_generate("whisper", p, n, b)
    assert g.encoder_decoder and len(calls) == n
    assert g.prefill.flops == encoder + calls[0]
    assert [g.step(c).flops for c in range(2, n + 1)] == calls[1:]
    assert g.total.flops == total and g.kv_cache_bytes == {"float32": held}
    ranks, a = report.parallel.ranks, b * H * 4  # one token's activation over the batch, fp32
    assert len(ranks) == 4 and sum(r.model_flops for r in ranks) == 2 * total
    tokens = 2 * LAYERS * p + n * (1 + 3 * LAYERS)
    for r in ranks:
        assert {(c.kind, c.group): c.bytes for c in r.communication} == {
            ("all_reduce", "tp"): a * tokens, ("all_gather", "tp"): n * b * VOCAB * 4}
    assert {m.kv_cache_bytes for m in report.memory.ranks} == {held // 2} == {
        2 * LAYERS * b * (HEADS // 2) * (H // HEADS) * (n + p) * 4}


def test_the_cross_attention_keys_and_values_are_computed_once():
    """The first decoder call projects the encoder's P positions to keys and values in every layer's
    cross-attention, 2 · (2·B·P·H·H) FLOPs a layer, and the later calls read them from the cache: the first call
    less a later one at the same self-attention context is those projections (BART: a call at context c adds
    2·2·B·c·H of attention over its own keys and values)."""
    p, b = 6, 1
    _, encoder, calls, _ = real_generate("bart", p, 2, b)
    g = flopcount.from_hf(eager("bart"), generate=(p, 2), batch=b, convention="dense", cache_dir=False).generation
    projections, one_key = LAYERS * 2 * (2 * b * p * H * H), LAYERS * 2 * 2 * b * H
    assert calls[0] - calls[1] == projections - one_key  # the second call attends to one more key of its own
    assert g.prefill.flops - g.step(2).flops == encoder + projections - one_key


def test_an_encoder_decoder_under_cp_or_audio_of_another_length_is_refused_with_one_line(tmp_path):
    with pytest.raises(UsageError, match="cp=2,.* with --generate of an encoder-decoder: cp is not modelled .* one "
                       "token a sequence .* zigzag split .*; give cp=1$"):
        flopcount.from_hf(eager("t5"), generate=(4, 2), parallel="tp=2,cp=2", cache_dir=False)
    whisper = transformers.WhisperConfig(d_model=H, encoder_layers=1, decoder_layers=1, encoder_attention_heads=HEADS,
                                         decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                                         vocab_size=VOCAB, num_mel_bins=16, max_source_positions=8,
                                         max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
                                         bos_token_id=1, eos_token_id=2)
    with pytest.raises(UsageError, match=r"--generate 4:N: .* gives 8 positions, .*; give P = 8$"):
        flopcount.from_hf(whisper, generate=(4, 2), cache_dir=False)
    headless = t5_config(architectures=["T5Model"])
    with pytest.raises(UsageError, match="T5Model, which does not generate"):
        flopcount.from_hf(headless, generate=(4, 2), cache_dir=False)


def test_cli_generate_of_t5_json_and_table(tmp_path):
    folder = tmp_path / "t5"
    folder.mkdir()
    (folder / "config.json").write_text(t5_config().to_json_string())
    run = [sys.executable, "-m", "flopcount", "--hf", str(folder), "--generate", "4:3", "--convention", "dense"]
    p = subprocess.run([*run, "--format", "json"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    g = json.loads(p.stdout)["generation"]
    total, _, calls, held = real_generate("t5", 4, 3, 1)
    assert g["method"].startswith("an encoder-decoder: ")
    assert g["total_flops"] == total and g["kv_cache_bytes"] == {"float32": held}
    steps = g["decode_flops_per_step"]
    assert (steps["first_context"], steps["first"], steps["last_context"], steps["last"]) == (2, calls[1], 3, calls[2])
    text = subprocess.run(run, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "Prefill FLOPs (the encoder, and the decoder over its start token)" in text.stdout
    assert "KV cache at the end (3 positions, and 4 cross-attention positions)" in text.stdout
    # tp=2,pp=2: the encoder's 2 layers on stage 0, the decoder's on stage 1; stage 0 sends the encoder's output
    # and the decoder's looked-up start token in the prefill, the looked-up token in each decode step; stage 1
    # sends each token id back but the last (M = 2 microbatches of batch B = 1, fp32)
    piped = subprocess.run([*run, "--parallel", "tp=2,pp=2", "--microbatches", "2", "--format", "json"],
                           capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert piped.returncode == 0, piped.stderr
    doc, a, m, p, n = json.loads(piped.stdout), H * 4, 2, 4, 3
    ranks = doc["parallel"]["ranks"]
    assert sum(r["model_flops"] for r in ranks) == m * total
    for r in ranks:
        got = {(c["kind"], c["group"]): c["bytes"] for c in r["communication"]}
        assert got == ({("send_recv", "pp"): m * a * (p + n), ("all_reduce", "tp"): m * a * ((1 + 2 * LAYERS) * p + n)}
                       if r["coords"]["pp"] == 0 else
                       {("send_recv", "pp"): m * (n - 1) * 8, ("all_reduce", "tp"): m * a * 3 * LAYERS * n,
                        ("all_gather", "tp"): m * n * VOCAB * 4}), r["coords"]


def test_cli_generate_of_bart_under_tp_and_dp_per_rank(tmp_path):
    """``--generate --parallel tp=2,dp=2 --memory`` of BART: each rank's FLOPs are half the whole generation's (its
    DP replica generating its own batch), the TP group all-reduces the encoder's lookup and 2 blocks a layer over the
    P prompt tokens, the decoder's lookup and 3 blocks a layer (self-attention, cross-attention, MLP) over one token
    in the prefill and in each decode step, and each rank holds the K and V of its heads: N positions of its own and
    the P cross-attended ones in each decoder layer."""
    folder = tmp_path / "bart"
    folder.mkdir()
    (folder / "config.json").write_text(bart_config().to_json_string())
    p, n, b = 4, 3, 2
    run = subprocess.run([sys.executable, "-m", "flopcount", "--hf", str(folder), "--generate", f"{p}:{n}",
                          "--batch", str(b), "--parallel", "tp=2,dp=2", "--memory", "--format", "json"],
                         capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    total = doc["generation"]["total_flops"]
    ranks = doc["parallel"]["ranks"]
    assert len(ranks) == 4 and sum(r["model_flops"] for r in ranks) == 2 * total
    a = b * H * 4  # one token's activation over the batch, fp32
    tokens = (1 + 2 * LAYERS) * p + (1 + 3 * LAYERS) + (n - 1) * (1 + 3 * LAYERS)
    for r in ranks:
        assert {(c["kind"], c["group"]): c["bytes"] for c in r["communication"]} == {
            ("all_reduce", "tp"): a * tokens, ("all_gather", "tp"): n * b * VOCAB * 4}
    head = H // HEADS
    assert {m["kv_cache_bytes"] for m in doc["memory"]["ranks"]} == {2 * LAYERS * b * (HEADS // 2) * head * (n + p) * 4}


@pytest.mark.slow
def test_from_causal_lm_takes_an_encoder_decoder_module():
    """``from_causal_lm`` (``--torch``) of a T5 module built on the meta device counts the same generation."""
    with torch.device("meta"):
        model = transformers.T5ForConditionalGeneration(eager("t5"))
    g = flopcount.from_causal_lm(model, (4, 3), convention="dense", cache_dir=False).generation
    total, encoder, calls, held = real_generate("t5", 4, 3, 1)
    assert (g.total.flops, g.prefill.flops, g.step(3).flops) == (total, encoder + calls[0], calls[2])
