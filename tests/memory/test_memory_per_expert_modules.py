"""Experts kept as one module each (transformers' tiny SwitchTransformers: top-1 over 4 experts, one MoE block in
the encoder and one in the decoder), counted through ``from_hf`` as the batched product of
:mod:`flopcount.frontends.hf_experts` (the experts' weights stacked, then gathered per token), against the storages
``torch.autograd.graph.saved_tensors_hooks`` catch in a real CPU training step:

* of the eager model (transformers' loop over the experts, each ``nn.Linear`` on its own weight): it keeps no copy
  of any weight; beyond the ledger, what its loop keeps per expert and two known differences of the export, each in
  closed form below;
* of the same model with its experts rewritten as the count runs them (:func:`hf_experts.batch_experts`): torch's
  advanced indexing copies each token's slices of the stacked weights, which its ``bmm`` keeps; the ledger keeps
  none (:mod:`flopcount.memory.experts`), as the eager model, which never makes them.

The router's jitter and every dropout are 0 and the capacity holds every token, so that every token runs its expert
in the eager loop too."""

from __future__ import annotations

import pytest
from helpers import saving

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

B, S_ENC, S_DEC = 2, 8, 6
D, FF, E, V = 32, 48, 4, 64  # model width, expert width, experts, vocabulary
F32, I64 = 4, 8
TOKENS = (B * S_ENC, B * S_DEC)  # the tokens routed by the encoder's MoE block and by the decoder's


def config():
    c = transformers.SwitchTransformersConfig(
        vocab_size=V, d_model=D, d_kv=8, d_ff=FF, num_layers=2, num_decoder_layers=2, num_heads=4, num_experts=E,
        num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, expert_capacity=64, router_jitter_noise=0.0,
        dropout_rate=0.0)
    c._attn_implementation = "eager"
    return c


@pytest.fixture(scope="module")
def ledger_activations():
    import flopcount
    from flopcount.memory.ledger import MemorySettings

    report = flopcount.from_hf(config(), {"input_ids": (B, S_ENC), "decoder_input_ids": (B, S_DEC)},
                               cache_dir=False, mode="train", optimizer="adamw", memory=MemorySettings(device="cpu"))
    assert not report.memory.missing and not report.memory.unsized
    return report.memory.ranks[0].activations_bytes


def saved_bytes(batched: bool) -> int:
    """The unique storages torch's autograd keeps in one training step of the tiny model (weights left out)."""
    from flopcount.frontends import hf_experts

    torch.manual_seed(0)
    model = transformers.SwitchTransformersModel(config()).train()
    if batched:
        hf_experts.batch_experts(model)
    ids, dec = torch.randint(3, V, (B, S_ENC)), torch.randint(3, V, (B, S_DEC))
    with saving(model) as seen:
        out = model(input_ids=ids, decoder_input_ids=dec)
    (out.last_hidden_state.sum() + out.encoder_last_hidden_state.sum()).backward()
    return sum(seen.values())


def export_differences() -> int:
    """What torch keeps beyond the ledger in every run of this model, whichever way its experts run:

    * T5's relative position buckets, made in the forward ([S, S] in the encoder, [S_dec, S_dec] in the decoder,
      int64), which the bucket embedding's backward keeps; the export folds them into constants;
    * the router's ``torch.max(probs, dim=-1).values``: ``max.dim`` keeps int64 indices [T], the exported ReduceMax
      its output [T] (float32): 4 bytes a token more in torch."""
    return I64 * (S_ENC ** 2 + S_DEC ** 2) + sum((I64 - F32) * t for t in TOKENS)


def test_activations_are_the_eager_steps_less_its_loops_copies(ledger_activations):
    """transformers' loop over the experts keeps, per expert, its tokens' hidden states copied out
    (``hidden_states[None, top_x]``, kept by ``wi``'s product), the weighted output that ``index_add_``'s backward
    keeps, and the routing weights indexed per expert (``routing_weights[top_x, idx]``); the batched product keeps
    none of these (it reads the hidden states the router keeps, and the router's weights): 4·T·D twice and 4·T
    bytes a block, all T tokens of a block being routed (the capacity holds them). Its weights are views of the
    parameters (``nn.Linear`` on each expert's own): no weight bytes, which the ledger has too."""
    loop = sum(2 * F32 * t * D + F32 * t for t in TOKENS)
    assert saved_bytes(batched=False) - ledger_activations == export_differences() + loop


def test_activations_are_the_rewritten_steps_less_its_weight_copies(ledger_activations):
    """The model run as the count runs it keeps, per block, each token's slices of the stacked ``wi`` and ``wo``
    (``torch.stack(...)[index]`` copies them: T·FF·D floats each), which its ``bmm`` keeps for the hidden states'
    gradient; nothing else beyond the ledger."""
    copies = sum(2 * F32 * t * FF * D for t in TOKENS)
    assert saved_bytes(batched=True) - ledger_activations == export_differences() + copies
