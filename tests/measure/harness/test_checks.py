"""The meter refuses nonsense: every argument of Meter, step, quality and the callbacks is checked at the call, a
UsageError naming the argument and its range; a run report read back is checked the same way."""

from __future__ import annotations

import json

import pytest

import flopcount
from flopcount.errors import MeasurementError, UsageError
from flopcount.measure.harness.result import check_run_record

NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("kwargs, message", [
    pytest.param({"peak_flops": -1}, r"peak_flops must be a finite number > 0, got -1", id="peak-negative"),
    pytest.param({"peak_flops": 0}, r"peak_flops must be a finite number > 0", id="peak-zero"),
    pytest.param({"peak_flops": INF}, r"peak_flops must be a finite number > 0", id="peak-inf"),
    pytest.param({"target_quality": 0.9, "quality_exponent": -2}, r"quality_exponent must be a finite number >= 1",
                 id="exponent-negative"),
    pytest.param({"target_quality": 0.9, "quality_exponent": 0.5}, r"quality_exponent .* >= 1", id="exponent-half"),
    pytest.param({"target_quality": NAN, "quality_exponent": 5}, r"target_quality must be a finite number",
                 id="target-nan"),
    pytest.param({"target_quality": 0.0, "quality_exponent": 5}, r"target_quality must be > 0", id="target-zero"),
    pytest.param({"flops_per_sample": INF}, r"flops_per_sample must be a finite number > 0", id="c-inf"),
    pytest.param({"flops_per_sample": True}, r"flops_per_sample must be a finite number > 0", id="c-bool"),
    pytest.param({"warmup_steps": 1.5}, r"warmup_steps must be an integer >= 0", id="warmup-float"),
    pytest.param({"warmup_steps": -1}, r"warmup_steps must be an integer >= 0", id="warmup-negative"),
    pytest.param({"window_steps": 0}, r"window_steps must be a positive integer", id="window-zero"),
    pytest.param({"precision": "int4"}, r"precision must be one of fp64, fp32", id="precision"),
    pytest.param({"recompute": -5}, r"recompute must be 'none', 'full' or a finite number", id="recompute-negative"),
    pytest.param({"higher_is_better": "no"}, r"higher_is_better must be True or False", id="higher"),
    pytest.param({"energy": 1}, r"energy must be True or False", id="energy"),
    pytest.param({"clock": 3.0}, r"clock must be a zero-argument callable", id="clock"),
])
def test_meter_arguments_are_checked(kwargs, message):
    kwargs = {"flops_per_sample": 1000, **kwargs}
    with pytest.raises(UsageError, match=message):
        flopcount.Meter(**kwargs)


@pytest.mark.parametrize("samples", [-4, 0, 2.5, True, "3", None])
def test_step_refuses_samples_that_are_not_a_positive_int(samples):
    m = flopcount.Meter(flops_per_sample=1000, energy=False)
    with pytest.raises(UsageError, match=r"Meter.step: samples must be a positive integer \(>= 1\)"):
        m.step(samples=samples)
    assert m.samples == 0 and m.steps == 0  # nothing was counted


def test_step_takes_integer_scalars_of_numpy_and_torch():
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    m = flopcount.Meter(flops_per_sample=1000, warmup_steps=0, window_steps=1, energy=False)
    for n in (np.int64(3), torch.tensor(4), 5):
        with m.step(samples=n):
            pass
    assert m.samples == 3 + 4 + 5


@pytest.mark.parametrize("value", [NAN, INF, -INF, "0.5", None])
def test_quality_refuses_a_value_that_is_not_finite(value):
    m = flopcount.Meter(flops_per_sample=1000, energy=False)
    with pytest.raises(UsageError, match="Meter.quality: value must be a finite number"):
        m.quality(value)


def test_quality_takes_a_tensor_and_refuses_a_negative_epoch():
    torch = pytest.importorskip("torch")
    m = flopcount.Meter(flops_per_sample=1000, energy=False)
    m.quality(torch.tensor(0.75))
    with pytest.raises(UsageError, match="epoch must be an integer >= 0"):
        m.quality(0.8, epoch=-1)


def test_negative_samples_no_longer_make_negative_flops():
    # the case: step(samples=-4) gave -34,089 samples/s; a positive count gives N x C exactly
    clock = iter(float(t) for t in range(1000)).__next__
    m = flopcount.Meter(flops_per_sample=1000, warmup_steps=0, window_steps=2, clock=clock, energy=False,
                        peak_flops=1e6)
    with pytest.raises(UsageError):
        m.step(samples=-4)
    for _ in range(4):
        with m.step(samples=8):
            pass
    assert m.result().flops > 0


def test_lightning_callback_checks_its_arguments_when_made():
    pytest.importorskip("lightning.pytorch")
    from flopcount.measure.harness.callbacks.lightning import MeterCallback

    with pytest.raises(UsageError, match="lightning MeterCallback: peak_flops must be a finite number > 0"):
        MeterCallback(flops_per_sample=10, peak_flops=-1)
    with pytest.raises(UsageError, match="lightning MeterCallback: quality_exponent"):
        MeterCallback(flops_per_sample=10, target_quality=0.9, quality_exponent=-2)
    with pytest.raises(UsageError, match="flops_per_sample must be a finite number > 0"):
        MeterCallback(flops_per_sample=NAN)
    with pytest.raises(UsageError, match="unknown Meter argument.*bogus"):
        MeterCallback(flops_per_sample=10, bogus=1)
    with pytest.raises(UsageError, match="batch_size must be a callable"):
        MeterCallback(flops_per_sample=10, batch_size=32)


def test_keras_callback_checks_its_arguments_when_made():
    pytest.importorskip("keras")
    from flopcount.measure.harness.callbacks.keras import MeterCallback

    with pytest.raises(UsageError, match="keras MeterCallback: batch_size must be a positive integer"):
        MeterCallback(batch_size=0)
    with pytest.raises(UsageError, match="samples_per_epoch must be a positive integer"):
        MeterCallback(batch_size=8, samples_per_epoch=-1)
    with pytest.raises(UsageError, match="keras MeterCallback: peak_flops"):
        MeterCallback(batch_size=8, peak_flops=-1)


@pytest.mark.parametrize("field, value, message", [
    ("samples", -4, "'samples' must be an integer >= 0"),
    ("flops", -1.0, "'flops' must be a finite number > 0"),
    ("peak_flops", -1, "'peak_flops' must be a finite number > 0"),
    ("quality_exponent", -2, "'quality_exponent' must be a finite number >= 1"),
    ("ranks", 0, "'ranks' must be an integer >= 1"),
    ("mfu", 3.4e10 * -1, "'mfu' must be a finite number >= 0"),
    ("precision", "fp7", "'precision' must be one of"),
])
def test_run_record_read_back_is_checked(field, value, message):
    run = {"samples": 10, "flops": 1e9, "ranks": 1, "precision": "fp32", field: value}
    with pytest.raises(MeasurementError, match=message):
        check_run_record(run, "run.json: run 0")
    check_run_record({**run, field: None}, "run.json: run 0")  # a figure not measured is null, not an error


def test_roofline_run_with_a_nonsense_figure_exits_12(tmp_path, capsys):
    from flopcount.cli import main
    from flopcount.measure.machine.ceilings import Ceilings, Figure

    c = Ceilings({"kind": "cpu", "name": "test"}, {"fp32": Figure(1e11, "gemm")}, {}, Figure(1e10, "copy"),
                 Figure(1e9, "all-reduce"), 1, 2)
    (tmp_path / "c.json").write_text(c.to_json())
    run = {"flops": 1e9, "samples": -4, "ranks": 2, "communication": {"coi": 100.0}}
    (tmp_path / "run.json").write_text(json.dumps({"system": {"ranks": 2}, "runs": [run]}))
    rc = main(["roofline", "--ceilings", str(tmp_path / "c.json"), "--run", str(tmp_path / "run.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 12 and len(err) == 1 and "run.json: run 0: 'samples' must be an integer >= 0" in err[0]
