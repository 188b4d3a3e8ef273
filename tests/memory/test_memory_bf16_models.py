"""Whole transformers models in bfloat16, exported by ``from_torch`` (the TorchScript exporter where it can, the
torch.export one for Llama's grouped-query sdpa), against the storages torch's autograd saves in a real CPU step:
the math path's float32 (BERT's and GPT-2's sdpa with dropout), the TorchScript exporter's promoted sdpa (a masked
or causal attention: Mistral's window, GPT-2) read at torch's types, and the CPU layer norm's 16-bit statistics
(BERT, GPT-2, ViT)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import flopcount  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from helpers import saved_storages  # noqa: E402

B, S, H, I, LAYERS, VOCAB = 2, 9, 24, 40, 2, 61


class Loss(torch.nn.Module):
    """The model's last hidden state (and pooler output), summed: a scalar loss whose backward keeps nothing."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        out = self.model(**{"pixel_values" if isinstance(self.model, transformers.ViTModel) else "input_ids": x})
        pooled = getattr(out, "pooler_output", None)
        return out.last_hidden_state.sum() + (pooled.sum() if pooled is not None else 0)


def built(name: str, attn: str):
    torch.manual_seed(0)
    decoder = dict(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=I, max_position_embeddings=32, attn_implementation=attn)
    if name == "bert":
        config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=H, num_hidden_layers=LAYERS,
                                         num_attention_heads=3, intermediate_size=I, max_position_embeddings=32,
                                         attn_implementation=attn)
        model = transformers.BertModel(config)
    elif name == "gpt2":
        model = transformers.GPT2Model(transformers.GPT2Config(vocab_size=VOCAB, n_embd=H, n_layer=LAYERS, n_head=3,
                                                               n_positions=32, attn_implementation=attn))
    elif name == "llama":
        model = transformers.LlamaModel(transformers.LlamaConfig(**decoder))
    elif name == "mistral":  # a sliding window of 4 over 9 tokens: a mask sdpa is handed
        model = transformers.MistralModel(transformers.MistralConfig(**decoder, sliding_window=4))
    else:
        model = transformers.ViTModel(transformers.ViTConfig(image_size=16, patch_size=4, hidden_size=H,
                                                             num_hidden_layers=LAYERS, num_attention_heads=3,
                                                             intermediate_size=I, attn_implementation=attn))
        return Loss(model.to(torch.bfloat16)), torch.randn(B, 3, 16, 16, dtype=torch.bfloat16)
    return Loss(model.to(torch.bfloat16)), torch.randint(0, VOCAB, (B, S))


@pytest.mark.slow
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "mistral", "vit"])
def test_bf16_models_equal_the_saved_storages(name, attn):
    module, x = built(name, attn)
    report = flopcount.from_torch(module.train(), (x,), training=True, optimizer="sgd", cache_dir=False,
                                  memory=MemorySettings(device="cpu"))
    assert not report.memory.missing and not report.memory.unsized
    assert report.memory.ranks[0].activations_bytes == saved_storages(module, (x,))
