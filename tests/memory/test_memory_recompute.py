"""The memory of each layer-checkpoint policy against torch's own run of it, on a tiny Hugging Face Llama and
GPT-2 (eager attention, no dropout), one real SGD step on the CPU, each layer under
``torch.utils.checkpoint``: reentrant (the ledger's ``full``, Megatron's full recompute) or non-reentrant (the
ledger's ``non-reentrant``).

* kept for the backward at the end of the forward: the unique storages ``saved_tensors_hooks`` catch (weights
  left out), and under a checkpoint also the tensors each layer is handed by keyword (the causal mask, the rotary
  tables, :data:`READ`): the checkpoint keeps them in the function it runs again, which no saved-tensor hook sees. Both
  checkpoints keep the same: each layer's inputs;
* the peak (MemTracker): a reentrant rerun runs the layer's whole forward, so while the layer's backward runs its
  output exists again (B·S·H elements) where the non-reentrant rerun stops before making it."""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("torch.distributed._tools.mem_tracker")

import flopcount  # noqa: E402
from helpers import hidden_state_loss, saved_storage_bytes, tracked_step  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402

F32 = 4
B, S, H, FFN, L, HEADS, KV_HEADS, V = 2, 9, 24, 40, 3, 4, 2, 61
#: torch's checkpoint around each layer for each policy: ``use_reentrant``
RUNS = {"none": None, "full": True, "non-reentrant": False}
#: the keyword arguments a layer computes with: the causal mask and Llama's rotary tables (cos, sin). The position
#: ids Llama hands each layer too are read by none of its ops (the tables are made from them before the layers),
#: so no graph shows them inside a layer, though the checkpoint's function keeps them alive: 8·S bytes the ledger
#: does not count (and is not compared here)
READ = ("attention_mask", "position_embeddings")


def _llama():
    return transformers.LlamaModel(transformers.LlamaConfig(
        vocab_size=V, hidden_size=H, num_hidden_layers=L, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
        intermediate_size=FFN, max_position_embeddings=32, attn_implementation="eager"))


def _gpt2():
    return transformers.GPT2Model(transformers.GPT2Config(
        vocab_size=V, n_embd=H, n_layer=L, n_head=HEADS, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, attn_implementation="eager"))


def _module(make, policy: str):
    torch.manual_seed(0)
    module = hidden_state_loss(make()).train()
    module.model.config.use_cache = False
    if RUNS[policy] is not None:
        module.model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": RUNS[policy]})
    return module


def _kept(module, ids) -> int:
    """Bytes torch keeps for the backward when the forward returns: the saved storages, and the tensors a
    checkpointed layer was handed by keyword (kept by the checkpoint's function, each storage once)."""
    handed: dict[int, int] = {}

    def hold(layer, args, kwargs):
        for name in READ:
            value = kwargs.get(name)
            for t in value if isinstance(value, tuple) else (value,):
                if isinstance(t, torch.Tensor):
                    handed[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()

    layers = [m for m in module.modules() if isinstance(m, transformers.modeling_layers.GradientCheckpointingLayer)]
    hooks = [m.register_forward_pre_hook(hold, with_kwargs=True) for m in layers if m.gradient_checkpointing]
    saved = saved_storage_bytes(module, (ids,))
    for h in hooks:
        h.remove()
    return sum({**handed, **saved}.values())


def _peak(module, ids) -> int:
    """MemTracker's peak of one SGD step, after a first."""
    return tracked_step(module, lambda: module(ids), functools.partial(torch.optim.SGD, lr=0.1)).peak


@pytest.mark.slow
@pytest.mark.parametrize("make", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_each_checkpoint_keeps_and_peaks_as_torch_runs_it(make):
    ids = torch.randint(0, V, (B, S))
    ours, kept, peaks = {}, {}, {}
    for policy in RUNS:
        report = flopcount.from_torch(_module(make, "none"), (ids,), training=True, optimizer="sgd", cache_dir=False,
                                      memory=MemorySettings(device="cpu", recompute=policy))
        (ours[policy],) = report.memory.ranks
        kept[policy], peaks[policy] = _kept(_module(make, policy), ids), _peak(_module(make, policy), ids)
        # MemTracker sees what is allocated while it tracks: the batch of ids was made before
        assert abs(ours[policy].peak_bytes - ours[policy].inputs_bytes - peaks[policy]) <= 0.05 * peaks[policy]
    # both checkpoints keep each layer's inputs, and what is outside the layers, the same
    assert kept["full"] == kept["non-reentrant"]
    assert ours["full"].activations_bytes == ours["non-reentrant"].activations_bytes
    # what checkpointing spares: the same in torch and in the ledger
    spared = kept["none"] - kept["full"]
    assert ours["none"].activations_bytes - ours["full"].activations_bytes == spared > 0
    # a reentrant rerun makes the layer's output again, B·S·H float32 elements alive through the layer's backward
    again = F32 * B * S * H
    assert peaks["full"] - peaks["non-reentrant"] == again == ours["full"].peak_bytes - ours["non-reentrant"].peak_bytes
