"""FSDP2's collectives as the predictor sends them: every microbatch, one all_gather per layer before its forward
and again before its backward and the root's once, one reduce_scatter per layer and the root's; the calls carry
the ledger's bytes between them, and each is priced with its latency, and with FSDP2's own work around it (the
profile's ``fsdp_copy`` rate of the payload, else the payload read and written at the ``copy`` rate)."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import collectives_profile

LAT, BW = 40e-6, 2e9
FSDP_RATE, COPY_RATE = 3e8, 5e8  # bytes of payload a second of FSDP2's own work; bytes moved a second of a copy


def _profile(**compute):
    from flopcount.measure.machine.calibration import Point

    p = collectives_profile(("all_gather", "reduce_scatter", "all_reduce"), LAT, BW)
    extra = {k: (Point(1, r, r, r),) for k, r in compute.items()}
    return dataclasses.replace(p, compute={**p.compute, **extra})


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
    # exposed once a step: each call its latency and its bus bytes, (n − 1)/n of the payload over 2 ranks, and
    # FSDP2's own work on each call's payload: at the fsdp_copy rate where timed, else read and written at the copy
    # rate, and the prediction says that it was not timed
    timed = predict(report, _profile(fsdp_copy=FSDP_RATE, copy=COPY_RATE))
    untimed = predict(report, _profile(copy=COPY_RATE))
    for kind, n in calls.items():
        collective = n * LAT + 0.5 * led[kind] / BW
        assert timed.ranks[0]["communication_seconds"][kind]["exposed"] == pytest.approx(
            collective + led[kind] / FSDP_RATE)
        assert untimed.ranks[0]["communication_seconds"][kind]["exposed"] == pytest.approx(
            collective + 2 * led[kind] / COPY_RATE)
    assert not any("FSDP2's own work" in n for n in timed.notes)
    assert any("FSDP2's own work" in n for n in untimed.notes)
    # DDP's all_reduce copies nothing besides its collective
    ddp = dataclasses.replace(counted, parallel=parallel_ledger(counted, parse_parallel("dp=2", m, "1f1b")))
    assert all(x.framework_bytes == 0 for x in work_of(ddp).ranks[0].messages)


def test_a_datasheet_profile_prices_fsdp2s_own_work_as_its_payload_read_and_written_at_memory_bandwidth():
    """No datasheet times FSDP2's copies: an H100's (HBM3, 3.35 TB/s on its datasheet) moves a call's payload once
    in and once out at that bandwidth."""
    from flopcount.measure.machine.calibration import device_profile
    from flopcount.measure.predict import framework_seconds

    assert framework_seconds(1e9, device_profile("H100")) == pytest.approx(2e9 / 3.35e12)
    assert framework_seconds(0.0, device_profile("H100")) == 0.0
