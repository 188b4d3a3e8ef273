"""FSDP2's collectives as the predictor sends them: every microbatch, one all_gather per layer before its forward
and again before its backward and the root's once, one reduce_scatter per layer and the root's; the calls carry
the ledger's bytes between them, and each is priced with its latency."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import collectives_profile

LAT, BW = 40e-6, 2e9


def _profile():
    return collectives_profile(("all_gather", "reduce_scatter", "all_reduce"), LAT, BW)


def test_fsdp_is_a_call_per_layer_and_the_roots():
    pytest.importorskip("transformers")
    import transformers

    import flopcount

    layers = 3
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=128)
    counted = flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train")
    for m in (1, 3):
        _check(counted, layers, m)


def _check(counted, layers: int, m: int) -> None:
    from flopcount.measure.predict import predict, work_of
    from flopcount.parallel.plan import parse_parallel
    from flopcount.plans import parallel_ledger

    ledger = parallel_ledger(counted, parse_parallel("dp=2,fsdp", m, "1f1b"))
    report = dataclasses.replace(counted, parallel=ledger)
    rank = work_of(report).ranks[0]
    led = {c.kind: c.bytes for c in ledger.ranks[0].communication if c.group == "dp"}
    calls = {"all_gather": m * (2 * layers + 1), "reduce_scatter": m * (layers + 1)}
    for kind, n in calls.items():
        (msg,) = [x for x in rank.messages if x.kind == kind]
        assert (msg.count, msg.ranks, msg.phase) == (n, 2, "step")
        assert msg.bytes * msg.count == pytest.approx(led[kind])
    # exposed once a step: each call its latency and its bus bytes, (n − 1)/n of the payload over 2 ranks
    pred = predict(report, _profile())
    comm = pred.ranks[0]["communication_seconds"]
    for kind, n in calls.items():
        assert comm[kind]["exposed"] == pytest.approx(n * LAT + 0.5 * led[kind] / BW)
