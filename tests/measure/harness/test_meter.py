"""flopcount.Meter: the arithmetic of every score (injected clock and energy counter), and real runs."""

from __future__ import annotations

import json
import math

import pytest

import flopcount
from flopcount.errors import UsageError
from flopcount.measure.harness import energy, result
from flopcount.measure.machine.devices import Device, Peak

from helpers import single


class Clock:
    """A clock the test advances by hand."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Counter:
    """An energy counter that grows at ``watts`` with the clock."""

    kind = "fake"
    min_window_s = 0.0

    def __init__(self, clock: Clock, watts: float) -> None:
        self.clock, self.watts = clock, watts

    def read_j(self) -> float:
        return self.clock.t * self.watts


CPU = Device("cpu", "test CPU", peaks={"fp32": Peak(1e6, "test peak")})


def loop(meter: flopcount.Meter, clock: Clock, steps: int, samples: int, step_s: float, gap_s: float) -> None:
    for _ in range(steps):
        clock.t += gap_s  # reading the batch
        with meter.step(samples=samples):
            clock.t += step_s


def test_scores_from_an_injected_clock():
    clock = Clock()
    m = flopcount.Meter(flops_per_sample=1000, warmup_steps=2, window_steps=3, clock=clock, target_quality=0.9,
                        quality_exponent=5, peak_flops=1e6, recompute=500, energy_source=Counter(clock, 50.0))
    m.start()
    loop(m, clock, 11, samples=10, step_s=1.0, gap_s=0.5)  # 2 warm-up steps, then 3 windows of 3
    clock.t += 2.0  # evaluation
    m.quality(0.81)
    r = m.result(device=CPU)
    # a window spans 3 steps of 1 s and the 2 gaps between them: 4 s for 30 samples
    assert r.samples_per_s["per_rank"] == pytest.approx(30 / 4.0)
    assert r.samples_per_s["windows"] == 3 and r.samples_per_s["variation"] == 0
    assert r.step_time_s == pytest.approx(1.0)
    assert (r.samples, r.steps, r.timed_samples, r.timed_steps) == (110, 11, 90, 9)
    assert r.flops == pytest.approx(7.5 * 1000)  # N x R x C with R = 1
    assert r.mfu == pytest.approx(7.5 * 1000 / 1e6)
    assert r.hfu == pytest.approx(7.5 * 1500 / 1e6)  # C + 500 recomputed FLOPs per sample
    assert r.vflops == pytest.approx(7500 * (0.81 / 0.9) ** 5)
    assert r.time_to_quality_s is None and "not reached" in r.unavailable["time_to_quality_s"]
    # 11 steps of 1.5 s and the 2 s evaluation, from start()
    assert r.wall_s == pytest.approx(11 * 1.5 + 2.0)
    # energy over the timed windows: each from its first step's start to its collection, 50 W
    assert r.power_w == pytest.approx(50.0)
    assert r.energy_j == pytest.approx(50.0 * 3 * 4.0)
    assert r.flops_per_watt == pytest.approx(7500 / 50.0)
    assert r.vflops_per_watt == pytest.approx(r.vflops / 50.0)
    assert r.peak_source == "given (peak_flops=)"


def test_time_to_quality_and_the_epoch_form():
    clock = Clock()
    m = flopcount.Meter(flops_per_sample=200, warmup_steps=0, window_steps=4, clock=clock, target_quality=0.95,
                        quality_exponent=5, energy=False)
    for epoch, acc in ((1, 0.9), (2, 0.96), (3, 0.97)):
        batches = [None] * 4
        for _ in m.loader(batches):
            with m.step(samples=8):
                clock.t += 0.25
        clock.t += 1.0
        m.quality(acc)
    r = m.result(device=CPU)
    # the clock starts at the first batch read; quality 0.96 is reached after two epochs of 1 s and evaluations
    assert r.time_to_quality_s == pytest.approx(2 * 1.0 + 2 * 1.0)
    assert r.epochs == 3
    # (iterations x batch x C) / T_epoch with T_epoch = 4 steps of 0.25 s
    assert r.flops_epoch_form == pytest.approx(4 * 8 * 200 / 1.0)
    assert r.vflops == pytest.approx(r.flops * (0.97 / 0.95) ** 5)
    assert r.energy_j is None and r.unavailable["energy_j"] == "energy measurement turned off (energy=False)"
    assert [q["value"] for q in r.qualities] == [0.9, 0.96, 0.97]


def test_warmup_only_run_has_no_rates_and_says_why():
    clock = Clock()
    m = flopcount.Meter(flops_per_sample=10, warmup_steps=5, clock=clock, energy=False)
    loop(m, clock, 3, samples=1, step_s=0.1, gap_s=0.0)
    r = m.result(device=CPU)
    assert r.flops is None and r.samples_per_s["per_rank"] is None
    assert "warm-up" in r.unavailable["samples_per_s"] and r.unavailable["flops"] == r.unavailable["samples_per_s"]


def test_an_unknown_gpu_gets_no_peak():
    clock = Clock()
    m = flopcount.Meter(flops_per_sample=10, warmup_steps=0, clock=clock, energy=False)
    loop(m, clock, 3, samples=1, step_s=0.1, gap_s=0.0)
    r = m.result(device=Device("cuda", "NVIDIA Future GPU", 0))
    assert r.mfu is None and r.peak_flops is None
    assert "unknown device 'NVIDIA Future GPU'" in r.unavailable["mfu"] and "peak_flops=" in r.unavailable["mfu"]


@pytest.mark.parametrize("kwargs, message", [
    pytest.param({}, "exactly one of report=", id="nothing"),
    pytest.param({"flops_per_sample": 1, "model": object(), "example_inputs": 1}, "exactly one", id="two"),
    pytest.param({"flops_per_sample": -3}, "finite number > 0", id="negative"),
    pytest.param({"flops_per_sample": float("nan")}, "finite number > 0", id="nan"),
    pytest.param({"model": object()}, "example_inputs", id="model-without-inputs"),
    pytest.param({"flops_per_sample": 1, "target_quality": 0.9}, "quality_exponent", id="no-exponent"),
    pytest.param({"flops_per_sample": 1, "window_steps": 0}, "window_steps", id="window"),
    pytest.param({"flops_per_sample": 1, "recompute": "some"}, "recompute", id="recompute"),
    pytest.param({"flops_per_sample": 1, "device": "tpu"}, "device=", id="device"),
])
def test_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        flopcount.Meter(**kwargs)


def test_an_inference_report_is_refused():
    report = flopcount.count(single("Relu", {"x": [2, 3]}))
    with pytest.raises(UsageError, match='mode="train"'):
        flopcount.Meter(report)


# ---------------------------------------------------------------------------------------------------------------
# energy counters


def _zone(root, name, uj, max_uj):
    z = root / name
    z.mkdir()
    (z / "energy_uj").write_text(f"{uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def test_rapl_sums_packages_skips_subzones_and_unwraps(tmp_path):
    p0 = _zone(tmp_path, "intel-rapl:0", 1_000_000, 10_000_000)
    p1 = _zone(tmp_path, "intel-rapl:1", 500_000, 10_000_000)
    _zone(tmp_path, "intel-rapl:0:0", 7, 10_000_000)  # the cores of package 0: part of it, never added
    src = energy.rapl(str(tmp_path))
    assert src.kind == "rapl"
    start = src.read_j()
    (p0 / "energy_uj").write_text("9_500_000".replace("_", ""))  # +8.5 J
    (p1 / "energy_uj").write_text("200000")  # wrapped: +(10_000_000 - 500_000 + 200_000) uJ = 9.7 J
    assert src.read_j() - start == pytest.approx(8.5 + 9.7)


def test_no_rapl_is_null_with_its_reason(tmp_path):
    src = energy.rapl(str(tmp_path / "absent"))
    assert src.kind == "unavailable" and "no RAPL energy counter" in src.reason
    clock = Clock()
    m = flopcount.Meter(flops_per_sample=10, warmup_steps=0, clock=clock, energy_source=src)
    loop(m, clock, 3, samples=1, step_s=0.1, gap_s=0.0)
    r = m.result(device=CPU)
    for key in ("energy_j", "power_w", "flops_per_watt", "vflops_per_watt"):
        assert getattr(r, key) is None
    assert r.unavailable["energy_j"] == src.reason and r.unavailable["flops_per_watt"] == src.reason


def test_short_windows_are_not_reported_as_nvml_energy():
    clock = Clock()
    counter = Counter(clock, 300.0)
    counter.kind, counter.min_window_s = "nvml", energy.NVML_MIN_WINDOW_S
    m = flopcount.Meter(flops_per_sample=10, warmup_steps=0, window_steps=2, clock=clock, energy_source=counter)
    loop(m, clock, 4, samples=1, step_s=0.2, gap_s=0.0)  # windows of 0.4 s
    r = m.result(device=CPU)
    assert r.energy_j is None and "shortest the nvml counter resolves" in r.unavailable["energy_j"]


# ---------------------------------------------------------------------------------------------------------------
# repeat runs and the report document


def test_olympic_statistics():
    stats = result.olympic([12.0, 10.0, 14.0, 11.0, 30.0])
    # drop 10 and 30; mean of 11, 12, 14 = 37/3; sample std = sqrt(((11-37/3)^2 + (12-37/3)^2 + (14-37/3)^2) / 2)
    mean = 37 / 3
    std = math.sqrt(((11 - mean) ** 2 + (12 - mean) ** 2 + (14 - mean) ** 2) / 2)
    assert stats["mean"] == pytest.approx(mean) and stats["variation"] == pytest.approx(std / mean)
    assert stats["dropped"] == [10.0, 30.0] and stats["kept"] == 3
    two = result.olympic([1.0, 3.0])  # fewer than three runs: nothing dropped
    assert two["kept"] == 2 and two["mean"] == 2.0


def _run(rate: float, quality: float | None = 0.9) -> flopcount.RunResult:
    clock = Clock()
    m = flopcount.Meter(flops_per_sample=100, warmup_steps=0, window_steps=5, clock=clock, energy=False,
                        target_quality=0.8, quality_exponent=5)
    loop(m, clock, 5, samples=int(rate) // 5, step_s=1.0 / 5, gap_s=0.0)  # rate samples per second
    if quality is not None:
        m.quality(quality)
    return m.result(device=CPU)


def test_report_round_trip_and_summary(tmp_path):
    runs = [_run(r) for r in (10, 20, 30, 40)]
    doc = result.bench_report(runs, {"nodes": 1, "ranks": 1}, {"workload": "test"})
    path = tmp_path / "r.json"
    path.write_text(result.dumps(doc))
    back = result.load(str(path))
    assert [flopcount.RunResult.from_dict(r) for r in back["runs"]] == runs
    assert back["schema_version"] == result.SCHEMA_VERSION and back["kind"] == "flopcount.bench"
    s = back["summary"]
    assert s["runs"] == 4 and s["kept_runs"] == 2
    assert s["mean"]["samples_per_s"] == pytest.approx((20 + 30) / 2)  # 10 and 40 dropped
    assert s["mean"]["flops"] == pytest.approx(25 * 100)


def test_summary_of_a_score_null_in_some_run_is_null_with_the_reason():
    runs = [_run(10), _run(20, quality=None), _run(30)]
    s = result.summarize([r.as_dict() for r in runs])
    assert s["mean"]["quality"] is None and "run(s) 1" in s["unavailable"]["quality"]
    assert "meter.quality() was never called" in s["unavailable"]["quality"]


@pytest.mark.parametrize("text, message", [
    pytest.param("{", "not a JSON run report", id="not-json"),
    pytest.param('{"kind": "other"}', "not a flopcount bench report", id="other-kind"),
    pytest.param('{"kind": "flopcount.bench", "schema_version": 99}', "schema version 99", id="version"),
])
def test_loading_a_bad_report(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(flopcount.errors.MeasurementError, match=message):
        result.load(str(path))


# ---------------------------------------------------------------------------------------------------------------
# the CUDA event timer's bookkeeping, on fake events (the real ones need a GPU: see test_bench's gpu test)


class FakeEvent:
    """Stands for torch.cuda.Event: ``record`` stamps the fake device clock; ``synchronize`` is counted."""

    clock = 0.0
    syncs = 0
    made = 0

    def __init__(self, enable_timing=False):
        assert enable_timing
        FakeEvent.made += 1
        self.t = None

    def record(self):
        self.t = FakeEvent.clock

    def synchronize(self):
        FakeEvent.syncs += 1

    def elapsed_time(self, other):  # milliseconds, as CUDA events give them
        return (other.t - self.t) * 1e3


def test_cuda_event_timer_syncs_once_per_window_and_reuses_events(monkeypatch):
    torch = pytest.importorskip("torch")
    from flopcount.measure.harness.clocks import CudaEventTimer

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    FakeEvent.clock, FakeEvent.syncs, FakeEvent.made = 5.0, 0, 0
    meter = flopcount.Meter(flops_per_sample=100, warmup_steps=0, window_steps=4, energy=False)
    meter._timer = CudaEventTimer()  # the timer a CUDA device gets
    for _ in range(12):
        with meter.step(samples=2):
            FakeEvent.clock += 0.5
        FakeEvent.clock += 0.25
    assert FakeEvent.syncs == 3  # three windows of four steps: one synchronisation each, none per step
    assert FakeEvent.made <= 2 * 4 + 1  # events come back to the pool after each window
    r = meter.result(device=CPU)
    assert r.step_time_s == pytest.approx(0.5)
    # a window: 4 steps of 0.5 s and 3 gaps of 0.25 s = 2.75 s for 8 samples
    assert r.samples_per_s["per_rank"] == pytest.approx(8 / 2.75)


def test_tokens_on_a_real_language_model_run():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    B, T, V, D = 4, 12, 50, 16
    model = torch.nn.Sequential(torch.nn.Embedding(V, D), torch.nn.Linear(D, V))
    x = torch.randint(0, V, (B, T))

    def train_step():
        loss = model(x).logsumexp(-1).mean()
        loss.backward()

    with FlopCounterMode(display=False) as counter:  # torch's own count of one step, forward and backward
        train_step()
    C = counter.get_total_flops() / B
    m = flopcount.Meter(flops_per_sample=C, warmup_steps=2, window_steps=3, energy=False, peak_flops=1e12)
    for _ in range(11):
        with m.step(samples=B, tokens=x.numel()):
            train_step()
    r = m.result()
    assert r.flops_per_token == pytest.approx(C / T)  # each sample holds T tokens
    assert r.tokens_per_s["total"] == pytest.approx(r.samples_per_s["total"] * T)
    assert r.samples_per_s["end_to_end"] == pytest.approx(11 * B / r.wall_s)
    with pytest.raises(UsageError, match="tokens= was given on earlier steps but not this one"):
        m2 = flopcount.Meter(flops_per_sample=C, energy=False)
        with m2.step(samples=B, tokens=B * T):
            pass
        m2.step(samples=B)
