"""``from_torch``'s parameters are torch's ``sum(p.numel() for p in module.parameters())``: a tied weight is found
under any of its names, a parameter the traced forward never reads is counted (and named in the notes) without a
gradient, and tensors that are no parameters (a rotary-like table) are neither counted nor trained."""

from __future__ import annotations

import pytest

import flopcount
from flopcount.output.render import to_dict

torch = pytest.importorskip("torch")

V, D, B, S = 37, 16, 2, 5


class TiedWithUnread(torch.nn.Module):
    """An embedding tied to the LM head, a fixed table that scales the embeddings (as rotary tables do), and a
    parameter that forward never reads (as DINOv2's ``mask_token`` without a mask)."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, D)
        self.head = torch.nn.Linear(D, V, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("table", torch.arange(S * D, dtype=torch.float32).reshape(S, D), persistent=False)
        self.mask_token = torch.nn.Parameter(torch.zeros(D))

    def forward(self, ids):
        return self.head(self.embed(ids) * self.table)


@pytest.fixture(scope="module")
def counted():
    with torch.device("meta"):
        module = TiedWithUnread()
    return module, flopcount.from_torch(module, {"ids": ((B, S), torch.int64)}, mode="train", cache_dir=False)


def test_tied_and_unread_parameters_are_torch_count(counted):
    module, r = counted
    assert r.params == sum(p.numel() for p in module.parameters()) == V * D + D
    assert r.trainable_params == V * D  # the shared weight once; the unread token has no gradient
    assert r.notes and "mask_token (16)" in r.notes[0]
    assert to_dict(r)["notes"] == list(r.notes)


def test_a_fixed_table_gets_no_gradient(counted):
    _, r = counted
    # forward: the head's product 2·B·S·D·V; the Mul by the table is no product
    # backward: the head's weight gradient and the gradient into the embeddings (2·B·S·D·V each), and the
    # gradient through the Mul into the embedding rows (B·S·D); the table, not trained, gets none
    products = 2 * B * S * D * V
    mul = next(n for n in r.nodes if n.op_type == "Mul")
    assert mul.backward.flops == B * S * D
    assert r.forward.flops >= products and r.backward.flops >= 2 * products


class FrozenPositions(torch.nn.Module):
    """A fixed position table held as a parameter without ``requires_grad`` (as Whisper's sinusoidal positions)
    added to a trained projection's output."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)
        self.positions = torch.nn.Embedding(S, D)
        self.positions.requires_grad_(False)

    def forward(self, x):
        return self.proj(x) + self.positions.weight


def test_a_frozen_parameter_is_a_parameter_without_gradient():
    """torch's ``parameters()`` lists the frozen table, its backward gives it no gradient, and MemTracker files it
    under "Parameter": the count's parameters and memory hold it so, not as a buffer, and name it."""
    from flopcount.memory.ledger import MemorySettings

    with torch.device("meta"):
        module = FrozenPositions()
    r = flopcount.from_torch(module, {"x": (B, S, D)}, mode="train", optimizer="sgd", cache_dir=False,
                             memory=MemorySettings(device="cpu"))
    assert r.params == sum(p.numel() for p in module.parameters()) == D * D + D + S * D
    assert r.trainable_params == D * D + D and r.buffers == 0
    assert any("positions.weight (80)" in note and "frozen" in note for note in r.notes)
    (rank,) = r.memory.ranks
    assert rank.params_bytes == 4 * (D * D + D + S * D) and rank.buffers_bytes == 0
    assert rank.grads_bytes == 4 * (D * D + D)


class FrozenWindow(torch.nn.Module):
    """A fixed window over (position, feature) held as a frozen parameter that scales a trained projection's output:
    a factor varying along two axes, which the graph's rule calls a constant (as a rotary table)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(D, D)
        self.window = torch.nn.Parameter(torch.ones(S, D), requires_grad=False)

    def forward(self, x):
        return self.proj(x) * self.window


def test_a_frozen_parameter_the_rule_calls_a_constant_is_a_parameter_too():
    with torch.device("meta"):
        module = FrozenWindow()
    r = flopcount.from_torch(module, {"x": (B, S, D)}, mode="train", cache_dir=False)
    assert r.params == sum(p.numel() for p in module.parameters()) == D * D + D + S * D
    assert r.trainable_params == D * D + D and r.buffers == 0
