"""wav2vec2-family models (Hubert, Wav2Vec2, Data2VecAudio) with their default SpecAugment (``mask_time_prob`` 0.05) and layer drop
(``layerdrop`` 0.1) count in inference and in training (:mod:`flopcount.frontends.train_export`): their products
and convolutions equal torch's FlopCounterMode over the eager model's forward, their parameters the eager
model's, and a training count says that layer drop p runs (1 - p) of the stack's work in the expected step and that
SpecAugment's mask is left out (its positions, drawn in numpy at the traced batch, would fix the graph's batch).
NLLB-MoE's default encoder and decoder layer drop (0.05) counts in training too."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SAMPLES = 1600  # audio samples: 319 frames after the first convolution (kernel 10, stride 5), 159 after the second
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, conv_dim=(16, 16),
             conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)
FAMILIES = {"HubertConfig": transformers.HubertConfig, "Wav2Vec2Config": transformers.Wav2Vec2Config,
            "Data2VecAudioConfig": transformers.Data2VecAudioConfig}  # its 16 positional convolutions: affine-free norms


def config(name: str):
    c = FAMILIES[name](**SMALL)
    c._attn_implementation = "eager"
    return c


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def saved(request, tmp_path_factory):
    where = tmp_path_factory.mktemp(request.param)
    c = config(request.param)
    assert (c.layerdrop, c.mask_time_prob) == (0.1, 0.05)  # the defaults this file is about
    c.save_pretrained(where)
    return request.param, where


def count(where, mode: str):
    import flopcount

    return flopcount.from_hf(where, {"input_values": (1, SAMPLES)}, cache_dir=False, mode=mode)


def forward_products(report) -> int:
    """The forward FLOPs of the report's MatMul, Gemm and Conv nodes (what FlopCounterMode counts, but for the
    convolutions' bias adds)."""
    return sum(n.cost.flops for n in report.nodes if n.family in ("matmul", "gemm", "conv"))


def eager_forward(model) -> int:
    """FlopCounterMode's FLOPs of ``model``'s forward plus the bias adds of its convolutions (an add an output
    element where the convolution has a bias), which FlopCounterMode leaves out and the count's Conv holds."""
    from torch.utils.flop_counter import FlopCounterMode

    adds = []
    for m in model.modules():
        if isinstance(m, torch.nn.Conv1d) and m.bias is not None:
            m.register_forward_hook(lambda _m, _args, out: adds.append(out.numel()))
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.randn(1, SAMPLES))
    assert adds  # the positional convolution has a bias
    return counter.get_total_flops() + sum(adds)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_counts_with_default_spec_augment_and_layer_drop(saved, mode):
    name, where = saved
    report = count(where, mode)
    torch.manual_seed(0)
    eager = transformers.AutoModel.from_config(config(name)).eval()
    assert report.params == sum(p.numel() for p in eager.parameters())
    assert forward_products(report) == eager_forward(eager)
    assert report.batch == 1  # SpecAugment's mask, drawn at the traced batch, does not fix the graph's batch
    notes = [n for n in report.notes if n.startswith(("layer drop", "SpecAugment"))]
    if mode == "train":
        assert len(notes) == 2 and "encoder" in notes[0] and "p = 0.1" in notes[0] and "(1 - p)" in notes[0]
        assert f"the model ({name.replace('Config', 'Model')}) mask_time_prob = 0.05" in notes[1]
    else:
        assert notes == []


def test_layer_drop_is_restored_after_the_count(saved):
    """The configuration's layer drop and SpecAugment probability are 0 only while the model is exported."""
    from flopcount.frontends import hf, train_export

    name, where = saved
    model = hf.build_model(hf.load_config(where))
    with train_export.every_layer(model, True) as drops:
        assert (model.config.layerdrop, model.config.mask_time_prob) == (0.0, 0.0)
    assert (model.config.layerdrop, model.config.mask_time_prob) == (0.1, 0.05)
    assert [(d.path, d.attribute, d.p) for d in drops] == [("", "mask_time_prob", 0.05), ("encoder", "layerdrop", 0.1)]
    assert all(p.is_meta for p in model.parameters())  # masked_spec_embed too, made with torch.Tensor(n)


def test_nllb_moe_counts_in_training_with_its_default_layer_drop(tmp_path):
    import flopcount

    c = transformers.NllbMoeConfig(
        vocab_size=64, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, num_experts=4, encoder_sparse_step=2,
        decoder_sparse_step=2, expert_capacity=16, max_position_embeddings=32)
    assert (c.encoder_layerdrop, c.decoder_layerdrop) == (0.05, 0.05)
    c.save_pretrained(tmp_path)
    report = flopcount.from_hf(tmp_path, {"input_ids": (2, 8), "decoder_input_ids": (2, 6)}, cache_dir=False,
                               mode="train")
    torch.manual_seed(0)
    assert report.params == sum(p.numel() for p in transformers.NllbMoeModel(c).parameters())
    notes = [n for n in report.notes if n.startswith("layer drop")]
    assert len(notes) == 1 and "encoder" in notes[0] and "decoder" in notes[0] and "p = 0.05" in notes[0]


def test_a_stack_counted_from_its_small_exports_drops_no_layer():
    """OPT's decoder reads its own ``self.layerdrop`` (set from the configuration when built): the 1- and 2-layer
    models the count is extended from are exported with every layer too."""
    import flopcount
    from flopcount.reporting.layers import EXTENDED

    c = transformers.OPTConfig(vocab_size=64, hidden_size=32, num_hidden_layers=4, ffn_dim=64, num_attention_heads=4,
                               max_position_embeddings=32, word_embed_proj_dim=32, layerdrop=0.1)
    report = flopcount.from_hf(c, {"input_ids": (1, 8)}, cache_dir=False, mode="train")
    assert report.layers.method == EXTENDED and report.layers.layers == 4
    assert report.params == sum(p.numel() for p in transformers.AutoModelForCausalLM.from_config(c).parameters())
    assert [n for n in report.notes if n.startswith("layer drop")] == [
        "layer drop: in training, model.decoder (OPTDecoder) p = 0.1 skip(s) each of its layers with probability p; "
        "the count is of the step that runs every layer, and the expected step runs (1 - p) of those layers' work"]
