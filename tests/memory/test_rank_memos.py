"""What the per-rank walks share between plans (:mod:`flopcount.memory.ranks`: a stage's graph at a rank's shares,
its ZeRO shards and units, and its forward and backward replayed from no bytes alive, kept for the next plan of
the same shares): every rank's figures of plans walked one after another on one count, the memos warm, are those
of each plan walked alone on a fresh copy of the count, replayed stretch by stretch (nothing kept is read)."""

from __future__ import annotations

import dataclasses

import pytest

from test_tape import stepwise_replayed

# (plan, microbatches, schedule): the plans of the same shares in turn (sharding, M), as a plan search walks them
PLANS = [
    ("dp=4", 1, "1f1b"), ("dp=4", 2, "1f1b"), ("dp=4,zero1", 2, "1f1b"), ("dp=4,zero2", 1, "1f1b"),
    ("dp=4,zero2", 2, "1f1b"), ("dp=4,fsdp", 1, "1f1b"), ("dp=4,fsdp", 2, "1f1b"), ("dp=2,fsdp", 2, "1f1b"),
    ("tp=2,dp=2", 1, "1f1b"), ("tp=2,dp=2,zero2", 2, "1f1b"), ("tp=2,sp,dp=2,fsdp", 2, "1f1b"),
    ("tp=2,sp,dp=2", 1, "1f1b"), ("tp=2,sp=megatron,dp=2,zero1", 2, "1f1b"),
    ("pp=2,dp=2", 2, "1f1b"), ("pp=2,dp=2", 4, "gpipe"), ("pp=2,dp=2,fsdp", 2, "1f1b"), ("pp=2,dp=2,zero2", 2, "1f1b"),
    ("pp=2", 4, "interleaved:2"), ("tp=2,pp=2,sp", 2, "1f1b"),
    ("cp=2,dp=2,zero1", 1, "1f1b"), ("cp=2,dp=2,fsdp", 2, "1f1b"), ("cp=2,dp=2", 2, "1f1b"),
]


@pytest.fixture(scope="module", params=["none", "full", "selective"])
def trained(request):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import flopcount
    from flopcount.memory.ledger import MemorySettings

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    return flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train", optimizer="adamw",
                             memory=MemorySettings(device="cpu", recompute=request.param))


def test_plans_walked_in_turn_are_each_walked_alone(trained, monkeypatch):
    from flopcount.memory.ranks import per_rank
    from flopcount.memory.tape import Tape
    from flopcount.parallel.plan import parse_parallel

    plans = [parse_parallel(text, microbatches=m, schedule=schedule) for text, m, schedule in PLANS]
    warm = [per_rank(trained, plan).ranks for plan in plans]
    again = [per_rank(trained, plan).ranks for plan in plans]  # every part found in the memos
    monkeypatch.setattr(Tape, "replayed", stepwise_replayed)
    for plan, fast, faster in zip(plans, warm, again):
        mem = dataclasses.replace(trained.memory, graph=dataclasses.replace(trained.memory.graph))
        alone = per_rank(dataclasses.replace(trained, memory=mem), plan).ranks
        assert [r.as_dict() for r in fast] == [r.as_dict() for r in alone], plan
        assert [r.as_dict() for r in faster] == [r.as_dict() for r in alone], plan
    # the plans differ: the memos are not read across what changes a rank's figures
    peaks = {plan: tuple(r.peak_bytes for r in ranks) for plan, ranks in zip(plans, warm)}
    assert len(set(peaks.values())) > len(plans) // 2
