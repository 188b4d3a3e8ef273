"""The message sizes a calibration times: from an MoE router's counts gathered before each dispatch (64 bytes for 4
experts over 2 ranks) to DDP's 25 MiB gradient buckets, each rounded to float32 elements that split over the ranks;
and a calibration of two gloo processes at the two ends, whose fits price both messages inside the calibration."""

from __future__ import annotations

import dataclasses

import pytest

from flopcount.measure.machine.calibrate import DEFAULT_SIZES, QUICK_SIZES, message_sizes


def test_sizes_are_float32_elements_split_over_the_ranks():
    assert message_sizes((64, 1000, 2**20), 2) == (64, 1000, 2**20)  # multiples of 8 bytes
    assert message_sizes((64, 1000), 3) == (60, 996)  # 15 and 249 elements: multiples of 3·4 bytes
    assert message_sizes((64, 1024), 17) == (1020,)  # 64 bytes hold fewer than one element a rank: left out


def test_the_default_sizes_reach_ddps_buckets_and_the_routers_counts():
    pytest.importorskip("torch")
    from torch.nn.parallel import distributed

    from flopcount.parallel.experts import counts_gathered
    from flopcount.parallel.plan import ParallelPlan

    bucket = distributed._DEFAULT_BUCKET_CAP_MB * 2**20  # torch's default bucket_cap_mb (25), in bytes
    counts = 2 * 4 * 8  # ep=2 ranks' int64 counts of 4 experts
    assert counts_gathered(ParallelPlan(dp=2, ep=2), 4) == counts
    for n in (2, 4, 8):
        sizes = message_sizes(DEFAULT_SIZES.messages, n)
        assert min(sizes) <= counts and max(sizes) >= bucket, n


@pytest.mark.slow  # 32 MiB collectives timed over gloo: 10 to 20 s on 2 cores
def test_a_calibration_prices_a_ddp_bucket_and_the_routers_counts_inside_it():
    """Two gloo processes timing 64 bytes and 32 MiB: a 25 MiB all_reduce (a DDP bucket) and a 64-byte all_gather
    (the router's counts) lie inside the calibrated sizes, in a tight loop and in a step."""
    pytest.importorskip("torch")
    from flopcount.measure.machine.calibrate import calibrate
    from flopcount.measure.machine.calibration import collective_seconds

    p = calibrate(2, dataclasses.replace(QUICK_SIZES, messages=(64, 32 * 2**20)), threads=1)
    for timed in (p.collectives, p.collectives_in_step):
        assert [pt.size for pt in timed["all_reduce"].points] == [64, 32 * 2**20]
        t, outside = collective_seconds(timed["all_reduce"], "all_reduce", 25 * 2**20, 2)
        assert t > 0 and not outside
        t, outside = collective_seconds(timed["all_gather"], "all_gather", 64, 2)
        assert t > 0 and not outside
