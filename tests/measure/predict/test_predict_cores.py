"""Ranks sharing a CPU's cores: on a calibrated CPU profile the plan's ranks are processes of the profile's threads
on its machine's cores; where their threads outnumber the cores, the step lasts at least every rank's busy seconds
(compute, optimizer step, collectives) times min(threads, cores) over the cores. Closed forms on hand-made work."""

from __future__ import annotations

import dataclasses

import pytest
from test_predict import R, one_rank, plan, profile

from flopcount.measure.predict import Message, NodeWork, Work, predict_point, predict_work

M, K, N = 37, 91, 23
GEMM = NodeWork("gemm", 2 * M * K * N, 0, backward_flops=4 * M * K * N)
ALONE = 6 * M * K * N / R  # one rank's step: its forward and backward at the GEMM rate


def cpu(cores: int, threads: int, calibrated: bool = True):
    return dataclasses.replace(profile(), calibrated=calibrated, machine={"cores": cores, "threads_per_rank": threads})


def work(ranks: int, world: int | None = None, messages=()) -> Work:
    shape = plan() | ({} if world is None else {"world": world})
    return Work(tuple(one_rank([GEMM], messages, rank=r) for r in range(ranks)), shape, tokens=M)


@pytest.mark.parametrize(("ranks", "cores", "threads", "want"), [
    (4, 2, 1, 4 * ALONE / 2),  # four one-thread ranks on two cores: each core runs two ranks' work
    (3, 2, 1, 3 * ALONE / 2),
    (2, 2, 1, ALONE),  # as many threads as cores: each rank's own time
    (4, 8, 2, ALONE),
    (4, 4, 2, 4 * 2 * ALONE / 4),  # two threads a rank: eight threads on four cores
    (1, 2, 4, ALONE),  # one rank of more threads than cores: its rates were timed on the two cores already
    (2, 2, 4, 2 * 2 * ALONE / 2),
], ids=["4r-2c", "3r-2c", "2r-2c", "4r-8c-2t", "4r-4c-2t", "1r-2c-4t", "2r-2c-4t"])
def test_the_step_is_the_ranks_busy_seconds_over_the_cores(ranks, cores, threads, want):
    p = predict_work(work(ranks), cpu(cores, threads))
    assert p.step_seconds == pytest.approx(want)
    assert predict_point(work(ranks), cpu(cores, threads))[0] == pytest.approx(want)
    assert all(r["step_seconds"] == pytest.approx(ALONE) for r in p.ranks)  # each rank's own time is unchanged
    assert any("share the machine's" in n for n in p.notes) == (want > ALONE * (1 + 1e-9))
    assert p.interval[1] >= p.step_seconds


def test_the_listed_ranks_stand_for_the_plans_world():
    """A plan search lists data-parallel rank 0's ranks: 2 listed of a world of 8 on 2 cores, 8 ranks' work."""
    assert predict_work(work(2, world=8), cpu(2, 1)).step_seconds == pytest.approx(8 * ALONE / 2)


def test_collectives_are_busy_seconds_too():
    """A data-parallel all_reduce of B bytes over 2 ranks, exposed after the backward: latency + B / bandwidth (the
    profile's, bus factor 2·(n−1)/n = 1) on each rank, busy as its compute is."""
    from test_predict import BW, LAT

    nbytes = 10**6
    ar = (Message("all_reduce", "dp", nbytes, 1, 2, "dp"),)
    alone = predict_work(work(2, messages=ar), cpu(2, 1)).step_seconds
    assert alone == pytest.approx(ALONE + LAT + nbytes / BW)
    assert predict_work(work(4, messages=ar), cpu(2, 1)).step_seconds == pytest.approx(4 * alone / 2)


def test_no_floor_for_a_datasheet_profile_or_a_profile_without_its_cores():
    assert predict_work(work(4), cpu(2, 1, calibrated=False)).step_seconds == pytest.approx(ALONE)
    assert predict_work(work(4), profile()).step_seconds == pytest.approx(ALONE)  # no machine recorded
    gpu = dataclasses.replace(cpu(2, 1), device="cuda")
    assert predict_work(work(4), gpu).step_seconds == pytest.approx(ALONE)
