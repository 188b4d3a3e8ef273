"""The per-rank walks' memos (:mod:`flopcount.memory.rank_memo`: a stage's tensors' shares and bytes, its graph's
parts that read no shares, the ZeRO shares of the stored tensors, :func:`~flopcount.memory.ranks.stage_states`'
answers) on models of other shapes than test_rank_memos' Llama: an MoE under expert parallelism, GPT-2 (biases, a
row-parallel product's bias whole, a tied LM head), each under recompute none and full, with pipeline stages of
unequal composition (the first holds the embedding, the last the head). Every rank's figures and every stage's
states of plans asked one after another, the memos warm, are those of each plan asked alone on a fresh copy of the
count (nothing kept is read), the walks replayed stretch by stretch."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import mixtral_config
from test_tape import stepwise_replayed

H, HEADS, KV, V = 32, 4, 2, 64

#: (plan, microbatches, schedule) per model, the plans of the same shares in turn as a plan search walks them, and
#: plans that differ in one thing a memo's key holds (the sharding, its D·C ranks, ep, M, pp) one after another
PLANS = {
    "moe": [("dp=4", 1, "1f1b"), ("dp=4,ep=2", 1, "1f1b"), ("dp=4,ep=2", 2, "1f1b"), ("dp=2,ep=2", 2, "1f1b"), ("dp=4,ep=2,zero1", 2, "1f1b"),
            ("dp=4,ep=2,zero2", 2, "1f1b"), ("dp=4,ep=2,fsdp", 2, "1f1b"), ("dp=4,ep=4,fsdp", 1, "1f1b"),
            ("tp=2,dp=2,ep=2", 1, "1f1b"), ("tp=2,sp,dp=2,ep=2,zero2", 2, "1f1b"), ("pp=2,dp=2,ep=2", 2, "1f1b"),
            ("pp=2,dp=2,ep=2,fsdp", 2, "gpipe"), ("cp=2,dp=2,ep=2", 2, "1f1b")],
    "gpt2": [("dp=4", 1, "1f1b"), ("dp=4", 2, "1f1b"), ("dp=4,zero1", 2, "1f1b"), ("dp=4,zero2", 2, "1f1b"), ("dp=4,fsdp", 2, "1f1b"),
             ("dp=2,fsdp", 2, "1f1b"), ("dp=2,zero2", 2, "1f1b"), ("tp=2,dp=2", 1, "1f1b"), ("tp=2,dp=2,fsdp", 2, "1f1b"), ("tp=2,sp,dp=2,zero2", 2, "1f1b"),
             ("pp=2,dp=2", 2, "1f1b"), ("pp=2,dp=2,zero1", 4, "gpipe"), ("pp=2,dp=2,fsdp", 2, "1f1b"),
             ("tp=2,pp=2,sp", 2, "1f1b"), ("pp=4", 4, "1f1b"), ("pp=2", 4, "interleaved:2")],
}


def _config(name: str):
    transformers = pytest.importorskip("transformers")
    if name == "moe":
        return mixtral_config(H, 40, 4, HEADS, KV, V, 4, 2)
    return transformers.GPT2Config(n_embd=H, n_layer=4, n_head=HEADS, vocab_size=V, n_positions=64,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)


@pytest.fixture(scope="module", params=[(m, r) for m in PLANS for r in ("none", "full")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def trained(request):
    pytest.importorskip("torch")
    import flopcount
    from flopcount.memory.ledger import MemorySettings

    model, recompute = request.param
    report = flopcount.from_hf(_config(model), (2, 8), cache_dir=False, mode="train", optimizer="adamw",
                               memory=MemorySettings(device="cpu", recompute=recompute))
    return model, report


def _fresh(report):
    """``report`` with a copy of its memory graph: a graph no memo has seen."""
    mem = dataclasses.replace(report.memory, graph=dataclasses.replace(report.memory.graph))
    return dataclasses.replace(report, memory=mem)


def _plans(model: str) -> list:
    from flopcount.parallel.plan import parse_parallel

    return [parse_parallel(text, microbatches=m, schedule=schedule) for text, m, schedule in PLANS[model]]


def test_ranks_walked_in_turn_are_each_walked_alone(trained, monkeypatch):
    from flopcount.memory.ranks import per_rank
    from flopcount.memory.tape import Tape

    model, report = trained
    plans = _plans(model)
    warm = [per_rank(report, plan).ranks for plan in plans]
    again = [per_rank(report, plan).ranks for plan in plans]  # every part found in the memos
    monkeypatch.setattr(Tape, "replayed", stepwise_replayed)
    for plan, fast, faster in zip(plans, warm, again):
        alone = per_rank(_fresh(report), plan).ranks
        assert [r.as_dict() for r in fast] == [r.as_dict() for r in alone], plan
        assert [r.as_dict() for r in faster] == [r.as_dict() for r in alone], plan
    peaks = {plan: tuple(r.peak_bytes for r in ranks) for plan, ranks in zip(plans, warm)}
    assert len(set(peaks.values())) > len(plans) // 2  # the memos are not read across what changes the figures


def test_stage_states_in_turn_are_each_found_alone(trained):
    """:func:`stage_states` of plans asked in turn (its answers kept by what they read) are those asked alone, and
    each stage's are its ranks' own figures in the per-rank ledger (parameters, optimizer states, the gradients
    accumulated under M > 1, zero2's bucket)."""
    from flopcount.memory.ranks import per_rank, stage_states

    model, report = trained
    plans = _plans(model)
    warm = [stage_states(report, plan) for plan in plans]
    again = [stage_states(report, plan) for plan in plans]
    for plan, fast, faster in zip(plans, warm, again):
        alone = stage_states(_fresh(report), plan)
        assert fast == faster == alone, plan
        for r in per_rank(_fresh(report), plan).ranks:
            s = alone[r.stage]
            assert (s.params, s.states, s.grads, s.bucket) == (
                r.params_bytes, r.optimizer_bytes, r.grads_bytes if plan.microbatches > 1 else 0,
                r.gradient_bucket_bytes), plan
