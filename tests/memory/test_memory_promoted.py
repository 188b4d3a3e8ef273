"""A bfloat16 sdpa exported by the TorchScript exporter, which writes the mask in float32 and so promotes the
attention and what follows it to float32 (:mod:`flopcount.memory.promoted`): read at the types torch runs, checked
against the storages torch's autograd saves in a real CPU step."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

import flopcount  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from helpers import saved_storages  # noqa: E402

B, S, H, HEAD = 3, 8, 16, 8  # batch, sequence, hidden, head size
BF16, F32 = 2, 4


class Attend(torch.nn.Module):
    """x → Q, K, V (2 heads of 8) → sdpa (``is_causal``, or handed a boolean window of 2 keys made of positions)
    → the output projection → sum."""

    def __init__(self, causal: bool):
        super().__init__()
        self.causal = causal
        self.q, self.k, self.v, self.o = (torch.nn.Linear(H, H, bias=False) for _ in range(4))

    def forward(self, x):
        def heads(t):
            return t.unflatten(-1, (H // HEAD, HEAD)).transpose(1, 2)

        q, k, v = heads(self.q(x)), heads(self.k(x)), heads(self.v(x))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        if self.causal:
            y = sdpa(q, k, v, is_causal=True)
        else:
            i = torch.arange(x.shape[1])
            y = sdpa(q, k, v, attn_mask=(i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 2))
        return self.o(y.transpose(1, 2).flatten(2)).sum()


def torchscript(module, x):
    buffer = io.BytesIO()
    torch.onnx.export(module, (x,), buffer, dynamo=False, input_names=["x"], do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING)
    return onnx.load_from_string(buffer.getvalue())


@pytest.mark.parametrize("causal", [True, False])
def test_a_promoted_bf16_sdpa_keeps_what_torch_keeps(causal):
    """The graph casts the bf16 score product and V up to float32, and the output projection's weight too (the
    exporter's promotion). torch keeps x (B·S·H, bf16), Q, K, V and the output (B·S·H each, bf16: the output
    projection reads a view of the kernel's output), a float32 log-sum-exp per query row and head (B·2·S) and, for
    the window, the mask converted to bf16 (S·S); the output projection's weight is a parameter."""
    torch.manual_seed(0)
    module, x = Attend(causal).to(torch.bfloat16).train(), torch.randn(B, S, H, dtype=torch.bfloat16)
    m = torchscript(module, x)
    casts = [n for n in m.graph.node if n.op_type == "Cast" and n.attribute[0].i == onnx.TensorProto.FLOAT]
    assert len(casts) >= 3  # the scores, V and the weight cast up: the promotion this reads
    heads = H // HEAD
    want = BF16 * (B * S * H + 4 * B * S * H + (0 if causal else S * S)) + F32 * B * heads * S
    report = flopcount.count(m, mode="train", memory=MemorySettings(device="cpu"))
    assert report.memory.ranks[0].activations_bytes == saved_storages(module, (x,)) == want


@pytest.mark.slow
def test_mistral_bf16_sdpa_by_the_torchscript_exporter():
    """A tiny bf16 Mistral with a sliding window of 4 over 9 tokens (a mask sdpa is handed), exported by the
    TorchScript exporter (``from_torch`` in training): its residual stream is float32 in the graph after the first
    attention, bf16 in torch; the ledger's activations equal the saved storages of the real step."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.MistralConfig(vocab_size=61, hidden_size=24, num_hidden_layers=2, num_attention_heads=4,
                                        num_key_value_heads=2, intermediate_size=40, max_position_embeddings=32,
                                        sliding_window=4, attn_implementation="sdpa")
    model = transformers.MistralModel(config).to(torch.bfloat16).train()

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids=input_ids).last_hidden_state.sum()

    module, ids = Loss(), torch.randint(0, 61, (2, 9))
    report = flopcount.from_torch(module, (ids,), training=True, optimizer="sgd", cache_dir=False,
                                  memory=MemorySettings(device="cpu"))
    assert report.memory.ranks[0].activations_bytes == saved_storages(module, (ids,))
