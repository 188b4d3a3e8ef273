"""A run's figures as a pure function of a frozen snapshot: no loop, no device, no torch."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest

from flopcount.measure.harness.figures import RunSnapshot, Window, run_figures
from flopcount.measure.harness.meter import Meter


def snapshot(**changes) -> RunSnapshot:
    """Two timed windows of 4 steps and 32 samples each, over 2 s and 4 s (16 and 8 samples/s; median 12), one
    rank, C = 1000 FLOPs per sample of which 400 forward, a peak of 48 000 FLOP/s."""
    windows = (Window(4, 32, 2.0, (0.5,) * 4, energy_j=100.0, energy_s=2.0),
               Window(4, 32, 4.0, (1.0,) * 4, energy_j=300.0, energy_s=4.0))
    base = RunSnapshot(
        samples=80, steps=10, warmup_steps=2, timer_kind="host", start_how="from the first step", wall_s=7.0,
        windows=windows, per_rank=({"samples_per_s": 12.0, "step_time_s": 0.75, "samples": 80, "steps": 10},),
        epochs=((10, 80, 4.0), (10, 80, 2.0)),
        qualities=({"t_s": 3.0, "value": 0.3, "epoch": 1, "samples": 40},
                   {"t_s": 6.0, "value": 0.45, "epoch": 2, "samples": 80}),
        time_to_quality_s=None, target_quality=0.9, quality_exponent=5.0, higher_is_better=True,
        flops_per_sample=1000.0, flops_per_sample_how="given", forward_flops_per_sample=400.0,
        optimizer_flops_per_step=None, precision="fp32", precision_how="given", peak_flops=48000.0,
        peak_source="given", recompute="full", energy_kind="rapl", energy_reason="", energy_min_window_s=1.0)
    return dataclasses.replace(base, **changes)


def test_figures_of_one_rank_are_closed_forms():
    r = run_figures(snapshot())
    assert r.samples_per_s["per_rank"] == r.samples_per_s["total"] == 12.0  # median(32/2, 32/4)
    assert r.samples_per_s["min"] == 8.0 and r.samples_per_s["max"] == 16.0
    assert r.samples_per_s["variation"] == pytest.approx(4 / 12)  # pstdev(16, 8) / mean
    assert r.step_time_s == 0.75  # median of four 0.5 s and four 1.0 s steps
    assert r.timed_steps == 8 and r.timed_samples == 64
    assert r.flops == 12.0 * 1000  # N x R x C
    assert r.mfu == pytest.approx(12000 / 48000)
    assert r.hfu == pytest.approx(0.25 * (1000 + 400) / 1000)  # full recomputation adds a forward pass
    assert r.quality == 0.45
    assert r.vflops == pytest.approx(12000 * (0.45 / 0.9) ** 5)
    assert r.energy_j == 400.0 and r.power_w == pytest.approx(400 / 6)
    assert r.flops_per_watt == pytest.approx(12000 / (400 / 6))
    assert r.flops_epoch_form == pytest.approx(statistics.fmean([80 * 1000 / 4.0, 80 * 1000 / 2.0]))
    assert r.time_to_quality_s is None and r.unavailable["time_to_quality_s"] == "the target 0.9 was not reached"
    assert r.unavailable["communication"] == "one rank: nothing is communicated"
    assert r.per_rank == ()  # one rank: not repeated


def test_figures_of_two_ranks_sum_their_rates():
    per_rank = ({"samples_per_s": 12.0}, {"samples_per_s": 6.0})
    r = run_figures(snapshot(per_rank=per_rank))
    assert r.ranks == 2 and r.samples_per_s["total"] == 18.0 and r.flops == 18.0 * 1000
    assert r.samples_per_s["slowest_rank"] == 6.0 and r.samples_per_s["imbalance"] == pytest.approx(12 / 6 - 1)
    assert r.mfu == pytest.approx(18000 / (2 * 48000))
    assert r.flops_epoch_form == pytest.approx(statistics.fmean([20000, 40000]) * 2)
    assert r.unavailable["communication"].startswith("not measured")


@pytest.mark.parametrize(("changes", "figure", "reason"), [
    pytest.param({"windows": (), "per_rank": ({"samples_per_s": None},)}, "samples_per_s", "warm-up",
                 id="no-timed-window"),
    pytest.param({"peak_flops": None, "peak_source": "no fp32 peak"}, "mfu", "no fp32 peak", id="no-peak"),
    pytest.param({"recompute": None}, "hfu", "recompute=", id="recompute-unknown"),
    pytest.param({"energy_kind": "unavailable", "energy_reason": "no counter"}, "energy_j", "no counter",
                 id="no-energy-counter"),
    pytest.param({"energy_min_window_s": 5.0}, "power_w", "lasted 5 s", id="windows-too-short-for-energy"),
    pytest.param({"qualities": ()}, "vflops", "never called", id="no-quality"),
    pytest.param({"epochs": ()}, "flops_epoch_form", "no whole epoch", id="no-epoch"),
])
def test_a_figure_that_cannot_be_formed_is_none_with_its_reason(changes, figure, reason):
    r = run_figures(snapshot(**changes))
    value = r.samples_per_s["total"] if figure == "samples_per_s" else getattr(r, figure)
    assert value is None and reason in r.unavailable[figure]


def test_the_meter_forms_its_result_from_its_snapshot():
    """The meter's result is the pure function of the snapshot it hands over (a fake clock: 1 s per step)."""
    ticks = iter(range(1000))
    meter = Meter(flops_per_sample=1000.0, device="cpu", peak_flops=4000.0, warmup_steps=1, window_steps=2,
                  energy=False, clock=lambda: float(next(ticks)))
    for _ in range(5):
        with meter.step(8):
            pass
    result = meter.result()
    assert run_figures(meter.snapshot()) == result
    assert math.isclose(result.flops, result.samples_per_s["total"] * 1000.0)


# ---------------------------------------------------------------------------------------------------------------
# totals over ranks, tokens, stalls, load


def test_run_level_samples_are_the_total_over_ranks():
    # the case: rank 0 stepped 5,033 samples of the run's 10,066
    per_rank = ({"samples_per_s": 12.0, "samples": 5033, "timed_samples": 4000, "steps": 10},
                {"samples_per_s": 6.0, "samples": 5033, "timed_samples": 4000, "steps": 10})
    r = run_figures(snapshot(per_rank=per_rank, samples=5033))
    assert r.samples == 5033 + 5033 and r.timed_samples == 4000 + 4000
    assert [p["samples"] for p in r.per_rank] == [5033, 5033]  # each rank's own count, named per rank
    assert r.samples_per_s["end_to_end"] == pytest.approx(10066 / 7.0)  # every rank's samples / wall time


def test_tokens_per_second_and_flops_per_token():
    # windows of 32 samples of 128 tokens (4096 tokens) over 2 s and 4 s: 2048 and 1024 tokens/s, median 1536
    windows = (Window(4, 32, 2.0, (0.5,) * 4, tokens=4096), Window(4, 32, 4.0, (1.0,) * 4, tokens=4096))
    per_rank = ({"samples_per_s": 12.0, "tokens_per_s": 1536.0, "samples": 80, "timed_samples": 64, "steps": 10},)
    r = run_figures(snapshot(windows=windows, per_rank=per_rank))
    assert r.tokens_per_s == {"per_rank": 1536.0, "total": 1536.0}
    assert r.flops_per_token == pytest.approx(1000 * 64 / 8192)  # C x samples / tokens = 1000 / 128
    assert r.flops / r.tokens_per_s["total"] == pytest.approx(r.flops_per_token)  # FLOPS / tokens/s, all the same
    plain = run_figures(snapshot())
    assert plain.tokens_per_s is None and "tokens=" in plain.unavailable["tokens_per_s"]


def test_stalls_hidden_by_the_median_are_named():
    # the case: windows from 618 to 18,943 samples/s, median 9.45k, end to end 1.1k
    windows = (Window(1, 618, 1.0, (1.0,)), Window(1, 9450, 1.0, (1.0,)), Window(1, 18943, 1.0, (1.0,)))
    per_rank = ({"samples_per_s": 9450.0, "samples": 11000, "timed_samples": 29011, "steps": 3},)
    r = run_figures(snapshot(windows=windows, per_rank=per_rank, wall_s=10.0))
    assert r.samples_per_s["end_to_end"] == pytest.approx(1100.0)
    spread, lost = r.notes
    assert spread.startswith("stalls: window rates range 618..1.894e+04") and "30.7x" in spread  # 18943 / 618
    assert lost.startswith("stalls: end to end 1100 samples/s is below 50% of the median")
    # steady windows (16 and 8 samples/s: 2x, not more) and 80 samples in 7 s (11.4/s, above half of 12): no note
    assert run_figures(snapshot()).notes == ()


def test_a_run_under_more_load_than_its_ceiling_says_so():
    r = run_figures(snapshot(load_per_core=1.4, peak_load_per_core=0.1))
    assert any(n.startswith("load: the run's rate was measured at a load of 1.40 per core, its peak") for n in r.notes)
    assert run_figures(snapshot(load_per_core=0.3, peak_load_per_core=0.1)).notes == ()


def test_a_rank_faster_than_its_measured_peak_shows_the_ceiling_stale():
    """12 samples/s x C = 1000 is 12,000 FLOP/s a rank: above a measured peak of 6,000 (MFU 2), one line saying the
    ceiling is stale; a given peak (no load recorded: not a measurement) or a peak above the rate, none."""
    r = run_figures(snapshot(peak_flops=6000.0, peak_load_per_core=0.1))
    assert r.mfu == pytest.approx(2.0)
    (stale,) = [n for n in r.notes if "stale" in n]
    assert stale.startswith("a rank ran at 1.2e-05 GFLOP/s, above the ceiling of 6e-06 GFLOP/s") and "\n" not in stale
    assert "FLOPCOUNT_CACHE=0" in stale
    assert not [n for n in run_figures(snapshot(peak_flops=6000.0)).notes if "stale" in n]
    assert not [n for n in run_figures(snapshot(peak_load_per_core=0.1)).notes if "stale" in n]


def test_full_recompute_hfu_takes_the_ledgers_rerun_when_known():
    # C = 1000, forward 400; the ledger reruns 300 FLOPs a sample (each layer's whole forward, not the head)
    exact = run_figures(snapshot(recompute_flops_per_sample=300.0))
    assert exact.hfu == pytest.approx(0.25 * (1000 + 300) / 1000)
    assert "reentrant checkpoint" in exact.how["hfu"]
    palm = run_figures(snapshot())  # nothing but the forward known: PaLM's one extra forward a sample
    assert palm.hfu == pytest.approx(0.25 * (1000 + 400) / 1000) and "PaLM" in palm.how["hfu"]
