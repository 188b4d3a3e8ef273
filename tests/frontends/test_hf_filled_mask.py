"""A model whose traced forward needs the ``attention_mask`` its eager forward makes itself (SwitchTransformers'
encoder indexes the mask it skips making while traced): counted without one given, the export is given a mask of
``input_ids``' shape, the program the eager forward runs (a mask of ones), so its products equal the eager step's."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, FF, E, B, SE, SD = 16, 24, 2, 2, 6, 4


def config():
    c = transformers.SwitchTransformersConfig(
        d_model=H, d_kv=4, d_ff=FF, num_layers=2, num_decoder_layers=2, num_heads=4, vocab_size=32,
        num_experts=E, expert_capacity=SE * B, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
        router_jitter_noise=0.0, dropout_rate=0.0, decoder_start_token_id=0)
    c._attn_implementation = "eager"
    return c


def test_a_switch_model_counts_without_an_attention_mask_given():
    import flopcount
    from torch.utils.flop_counter import FlopCounterMode

    report = flopcount.from_hf(config(), {"input_ids": (B, SE), "decoder_input_ids": (B, SD)}, cache_dir=False,
                               mode="train")
    assert [x.name for x in report.model.inputs] == ["input_ids", "attention_mask", "decoder_input_ids"]
    assert report.model.inputs[1].shape == (B, SE)
    torch.manual_seed(0)
    eager = transformers.SwitchTransformersModel(config()).train()
    with FlopCounterMode(display=False) as counter:
        out = eager(input_ids=torch.randint(0, 32, (B, SE)), decoder_input_ids=torch.randint(0, 32, (B, SD)))
        (out.last_hidden_state.sum() + out.encoder_last_hidden_state.sum()).backward()
    products = sum(n.cost.flops + n.backward.flops for n in report.nodes if n.family in ("matmul", "gemm"))
    assert products == counter.get_total_flops()
