"""The memory ledger against torch's own accounting on real tiny models and one real training step, on this CPU.

* parameters, gradients and optimizer states equal ``MemTracker``'s categories byte for byte (the CPU allocator
  rounds nothing);
* the activations equal the unique storages ``saved_tensors_hooks`` catch during the forward (weights left out),
  the exported graph read as torch's kernels (:mod:`flopcount.memory.kernels`);
* the peak is within 5% of ``MemTracker``'s.
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed._tools.mem_tracker")

import flopcount  # noqa: E402
from helpers import hidden_state_loss, saved_storages, tracked_step  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402

F32 = 4
pytestmark = pytest.mark.slow


def ledger(module, inputs):
    module.train()
    report = flopcount.from_torch(module, inputs, training=True, optimizer="adam", cache_dir=False,
                                  memory=MemorySettings(device="cpu"))
    assert not report.memory.missing and not report.memory.unsized
    (rank,) = report.memory.ranks
    return rank


def check_model_states(rank, module, inputs, buffers_left_out: int = 0):
    # one Adam step under MemTracker (after a first one made the states): its category bytes at the peak and after
    tracked = tracked_step(module, lambda: module(*inputs), torch.optim.Adam)
    peak, after = tracked.at_peak, tracked.after
    assert rank.params_bytes == after["Parameter"]
    assert rank.grads_bytes == after["Gradient"]
    assert rank.optimizer_bytes == after["Optstate"]  # Adam's m, v and a float32 step per parameter tensor
    assert rank.buffers_bytes == after["Buffer"] - buffers_left_out
    # MemTracker sees what is allocated while it tracks: the input batch was made before
    assert abs(rank.peak_bytes - rank.inputs_bytes - peak["Total"]) <= 0.05 * peak["Total"]
    return peak, after


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(37, 91), torch.nn.Linear(91, 23)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x))).sum()


def test_mlp_exact_in_every_category_and_the_single_tensor_adam_step():
    torch.manual_seed(0)
    module, inputs = MLP(), (torch.randn(7, 37),)
    rank = ledger(module, inputs)
    assert rank.activations_bytes == saved_storages(module, inputs) == F32 * 7 * (37 + 91)
    peak, after = check_model_states(rank, module, inputs)
    assert rank.peak_phase == "optimizer step"
    assert rank.optimizer_temp_bytes == peak["Optstate"] - after["Optstate"]  # sqrt(v) and its quotient
    assert rank.peak_bytes - rank.inputs_bytes - F32 == peak["Total"]  # less the loss, freed before the step ends


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.pool, self.c2 = torch.nn.MaxPool2d(2), torch.nn.Conv2d(8, 16, 3, padding=1)
        self.gap, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Linear(16, 5)

    def forward(self, x):
        x = self.pool(torch.relu(self.bn(self.c1(x))))
        return self.fc(torch.flatten(self.gap(torch.relu(self.c2(x))), 1)).sum()


def test_cnn_conv_batch_norm_max_pool():
    torch.manual_seed(0)
    module, inputs = CNN(), (torch.randn(2, 3, 12, 12),)
    rank = ledger(module, inputs)
    # conv keeps x; batch norm its input and per-channel mean and invstd; relu its output (max pool's input); max
    # pool its int64 indices; conv2 its input; relu2's output (average pooling's input); fc its input
    assert rank.activations_bytes == saved_storages(module, inputs)
    # BatchNorm's num_batches_tracked (an int64 counter) is a buffer of torch that no graph shows
    check_model_states(rank, module, inputs, buffers_left_out=8)


B, S, H, I, L = 2, 9, 24, 40, 2  # batch, sequence, hidden, intermediate, layers


def test_bert_tiny():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    a = 3
    config = transformers.BertConfig(vocab_size=61, hidden_size=H, num_hidden_layers=L, num_attention_heads=a,
                                     intermediate_size=I, max_position_embeddings=32, attn_implementation="eager")
    module = hidden_state_loss(transformers.BertModel(config, add_pooling_layer=False))
    inputs = (torch.randint(0, 61, (B, S)),)
    rank = ledger(module, inputs)
    # the exporter's GELU (x·½·(1 + erf(x/√2))) read as torch's gelu, which keeps x; CPU dropout keeps its float
    # noise (flopcount.memory.kernels)
    assert rank.activations_bytes == saved_storages(module, inputs)
    # position and token-type ids are int64 buffers of torch that the exporter folds into constants
    check_model_states(rank, module, inputs, buffers_left_out=2 * 8 * 32)


def test_llama_tiny_gqa():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    heads, kv_heads = 4, 2
    d = H // heads
    config = transformers.LlamaConfig(vocab_size=61, hidden_size=H, num_hidden_layers=L, num_attention_heads=heads,
                                      num_key_value_heads=kv_heads, intermediate_size=I, max_position_embeddings=32,
                                      attn_implementation="eager")
    module, inputs = hidden_state_loss(transformers.LlamaModel(config)), (torch.randint(0, 61, (B, S)),)
    rank = ledger(module, inputs)
    # the exporter's rsqrt (Sqrt, then a division) and SiLU (x·sigmoid(x)) read as torch's kernels, which keep
    # their output and input; repeat_kv's reshape of the expanded K and V a copy, as torch's
    # (flopcount.memory.kernels)
    assert rank.activations_bytes == saved_storages(module, inputs)
    # the rotary inv_freq table and its original copy are float32 buffers of torch (d/2 each) that the exporter
    # folds into a constant
    check_model_states(rank, module, inputs, buffers_left_out=2 * F32 * d // 2)


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(24, 40), torch.nn.Linear(40, 24)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


class Stack(torch.nn.Module):
    """Three residual blocks in ``layers``, each run through ``torch.utils.checkpoint`` (non-reentrant) when
    ``checkpointed``; exported without (the module scopes ``layers.0`` ... name the units)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(3))
        self.checkpointed = False

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        for block in self.layers:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return x.sum()


def after_forward_and_peak(module, inputs) -> tuple[int, int]:
    """MemTracker's activation bytes when the forward returns, and the peak, of one SGD step after a first."""
    tracked = tracked_step(module, lambda: module(*inputs), functools.partial(torch.optim.SGD, lr=0.1))
    return tracked.after_forward["Activation"], tracked.peak


def test_non_reentrant_recompute_against_torch_checkpoint():
    torch.manual_seed(0)
    module, inputs = Stack(), (torch.randn(5, 7, 24),)
    kept, peaks = {}, {}
    for policy in ("none", "non-reentrant"):
        report = flopcount.from_torch(module.train(), inputs, training=True, optimizer="sgd", cache_dir=False,
                                      memory=MemorySettings(device="cpu", recompute=policy))
        (rank,) = report.memory.ranks
        module.checkpointed = policy != "none"
        torch_kept, torch_peak = after_forward_and_peak(module, inputs)
        module.checkpointed = False
        kept[policy] = (rank.activations_bytes, torch_kept)
        assert abs(rank.peak_bytes - torch_peak) <= 0.05 * torch_peak
        peaks[policy] = rank.peak_bytes
    # what checkpointing each block spares: per block, the ReLU's output (kept by ReLU and by down); the blocks'
    # inputs stay kept (by up without recompute, by the checkpoint with it)
    spared = 3 * F32 * 5 * 7 * 40
    assert kept["none"][0] - kept["non-reentrant"][0] == spared == kept["none"][1] - kept["non-reentrant"][1]
    assert kept["non-reentrant"][0] == 3 * F32 * 5 * 7 * 24  # the three blocks' inputs
    assert peaks["non-reentrant"] < peaks["none"]


def test_activations_by_module_sum_to_the_total():
    """Per module (depth 2: each block of ``layers``), the ReLU's output and the block's output (the next block's
    input) kept; the graph's input in its own row."""
    from flopcount.memory.ledger import INPUTS, module_activations

    torch.manual_seed(0)
    report = flopcount.from_torch(Stack().train(), (torch.randn(5, 7, 24),), training=True, cache_dir=False,
                                  memory=True)
    rows = dict(module_activations(report.memory, report.nodes, report.modules.nodes, depth=2))
    relu, block = F32 * 5 * 7 * 40, F32 * 5 * 7 * 24
    assert rows == {INPUTS: block, "layers.0": relu + block, "layers.1": relu + block, "layers.2": relu}
    assert sum(rows.values()) == report.memory.ranks[0].activations_bytes


class Attention(torch.nn.Module):
    """Multi-head self-attention with dropout on the probabilities; with ``checkpointed`` its core (scores, softmax,
    dropout, the product with V) runs under ``torch.utils.checkpoint`` (non-reentrant): Megatron's selective
    recompute."""

    def __init__(self, h=24, heads=3):
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(h, 3 * h), torch.nn.Linear(h, h)
        self.drop, self.heads = torch.nn.Dropout(0.1), heads
        self.checkpointed = False

    def core(self, q, k, v):
        probs = self.drop(torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1))
        return probs @ v

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        b, s, h = x.shape
        q, k, v = (t.reshape(b, s, self.heads, h // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, -1))
        ctx = checkpoint(self.core, q, k, v, use_reentrant=False) if self.checkpointed else self.core(q, k, v)
        return self.out(ctx.transpose(1, 2).reshape(b, s, h)).sum()


def test_selective_recompute_against_checkpointing_the_attention_core():
    torch.manual_seed(0)
    b, s, a = 2, 11, 3
    module, inputs = Attention(heads=a), (torch.randn(b, s, 24),)
    kept = {}
    for policy in ("none", "selective"):
        report = flopcount.from_torch(module.train(), inputs, training=True, optimizer="sgd", cache_dir=False,
                                      memory=MemorySettings(device="cpu", recompute=policy))
        module.checkpointed = policy == "selective"
        kept[policy] = (report.memory.ranks[0].activations_bytes, after_forward_and_peak(module, inputs)[0])
        module.checkpointed = False
    ours = kept["none"][0] - kept["selective"][0]
    spared_by_torch = kept["none"][1] - kept["selective"][1]
    # spared: the softmax output, the dropped probabilities and the CPU dropout's float noise (float32, a·s²·b
    # each)
    assert ours == F32 * 3 * a * s * s * b == spared_by_torch
