"""Measured beside predicted (``Meter(machine=)``, ``flopcount bench --machine``): real training runs on this CPU,
their prediction checked against ``predict`` of the same count made here, their measurement against the harness's
own step time, and the relative error against the two; a stale profile (a peak below what the run reached) and a
profile from elsewhere named in one line; a damaged profile refused before training (exit 12)."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

import flopcount  # noqa: E402
from flopcount.errors import MeasurementError, UsageError  # noqa: E402
from flopcount.measure.machine.calibration import load_profile  # noqa: E402
from flopcount.measure.predict import predict  # noqa: E402

B, IN, HID, OUT = 32, 64, 256, 10


@pytest.fixture(scope="module")
def profile(tmp_path_factory):
    """This machine calibrated now on this process's threads (seconds), and the file it is written to."""
    from flopcount.measure.machine.calibrate import QUICK_SIZES, calibrate

    p = calibrate(1, QUICK_SIZES, threads=torch.get_num_threads())
    path = tmp_path_factory.mktemp("machine") / "p.json"
    path.write_text(json.dumps(p.as_dict()))
    return p, path


def _train(machine, steps: int = 10):
    """A real training run of a two-layer MLP under a meter given ``machine``; the meter and the model."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(IN, HID), torch.nn.ReLU(), torch.nn.Linear(HID, OUT))
    x = torch.randn(B, IN)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    meter = flopcount.Meter(model=model, example_inputs=(x,), machine=machine, warmup_steps=2, window_steps=4,
                            energy=False)
    with meter:
        for _ in range(steps):
            with meter.step(samples=B):
                opt.zero_grad()
                model(x).sum().backward()
                opt.step()
    return meter, model, x


def test_meter_prints_the_prediction_beside_the_measurement(profile):
    p, path = profile
    meter, model, x = _train(str(path))
    r = meter.result()
    pred = r.prediction
    expected = predict(flopcount.from_torch(model, (x,), mode="train"), p)  # the same count, predicted here
    assert pred["predicted_step_s"] == pytest.approx(expected.step_seconds, rel=1e-12)
    assert pred["prediction"]["ranks"][0]["compute_seconds"] == pytest.approx(expected.ranks[0]["compute_seconds"])
    assert pred["measured_step_s"] == r.step_time_s  # the harness's median step, one rank
    assert pred["relative_error"] == pytest.approx(expected.step_seconds / r.step_time_s - 1)
    assert "prediction" not in r.unavailable
    # the meter's count has no optimizer (model= counts forward and backward): the prediction says it leaves it out
    assert "the optimizer step is left out: no optimizer counted (count with --optimizer)" in \
        pred["prediction"]["notes"]
    # the profile is this machine's, taken now: no difference to name; stale only where the run's FLOPs over its
    # measured step beat the profile's peak (a quick calibration's small products can be slower than the run's)
    rate = flopcount.from_torch(model, (x,), mode="train").total.flops / r.step_time_s
    assert [n for n in pred["notes"] if "above the ceiling" in n] == (pred["notes"] if rate > p.peak_flops_per_s
                                                                      else [])
    assert len(pred["notes"]) == (rate > p.peak_flops_per_s)
    text = meter.summary()
    line = next(t for t in text.splitlines() if t.startswith("step predicted"))
    assert f"{expected.step_seconds * 1e3:.3f} ms" in line and f"measured {r.step_time_s * 1e3:.3f} ms" in line
    assert f"error {pred['relative_error']:+.1%}" in line


def test_a_profile_below_the_run_is_stale_and_one_from_elsewhere_is_named(profile, caplog):
    """A peak of 1 MFLOP/s, which the run's FLOPs over its measured step exceed; a profile of 3 ranks and another
    torch."""
    p, _ = profile
    low = dataclasses.replace(p, peak_flops_per_s=1e6, ranks=3, torch="0.0")
    meter, model, x = _train(low, steps=6)
    r = meter.result()
    work = flopcount.from_torch(model, (x,), mode="train").total.flops  # one rank's FLOPs a step
    assert work / r.step_time_s > 1e6  # the run was faster than the profile's ceiling
    notes = r.prediction["notes"]
    assert len(notes) == 2 and all("\n" not in n for n in notes)
    assert "torch 0.0 (here" in notes[0] and "3 ranks (this plan runs 1)" in notes[0]
    assert "rank 0 ran at" in notes[1] and "above the ceiling of 0.001 GFLOP/s" in notes[1] and "stale" in notes[1]
    assert "take it again (flopcount calibrate)" in notes[1]
    assert any("stale" in rec.getMessage() for rec in caplog.records)  # said as it happens too
    assert "prediction: rank 0 ran at" in meter.summary()


def test_bad_machine_arguments_are_refused_before_training(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text('{"format": "flopcount-machine-profile", "version": 1, "compute": NaN}')
    model = torch.nn.Linear(4, 4)
    with pytest.raises(MeasurementError) as e:
        flopcount.Meter(model=model, example_inputs=(torch.randn(2, 4),), machine=str(bad))
    assert e.value.exit_code == 12 and "'compute' is missing or not a Mapping" in str(e.value)
    with pytest.raises(UsageError, match="machine= needs a counted model"):
        flopcount.Meter(flops_per_sample=1e6, machine=str(bad))
    with pytest.raises(UsageError, match="expected the path of a machine profile"):
        flopcount.Meter(model=model, example_inputs=(torch.randn(2, 4),), machine=3)


def test_without_a_profile_the_prediction_is_null_with_its_reason():
    meter = flopcount.Meter(flops_per_sample=1e6, warmup_steps=0, window_steps=1, energy=False, peak_flops=1e9)
    with meter:
        with meter.step(samples=1):
            pass
    r = meter.result()
    assert r.prediction is None and "no machine profile given" in r.unavailable["prediction"]


def test_bench_prints_the_prediction_beside_the_measurement(profile, tmp_path, capsys):
    pytest.importorskip("sklearn")
    from flopcount.cli import main
    from flopcount.cli.bench import build_parser, config_from_args

    p, path = profile
    argv = ["digits", "--epochs", "1", "--target-quality", "0.1", "--warmup-steps", "2", "--window-steps", "5",
            "--seed", "3", "--no-progress", "--machine", str(path)]
    out = tmp_path / "b.json"
    assert main(["bench", *argv, "-o", str(out)]) == 0
    run = json.loads(out.read_text())["runs"][0]
    module, cfg = config_from_args(build_parser().parse_args(argv))
    expected = predict(module.count(cfg), load_profile(str(path)))  # the digits CNN's count, predicted here
    pred = run["prediction"]
    assert pred["predicted_step_s"] == pytest.approx(expected.step_seconds, rel=1e-12)
    assert pred["measured_step_s"] == run["step_time_s"]
    assert pred["relative_error"] == pytest.approx(expected.step_seconds / run["step_time_s"] - 1)
    assert "run 0: step predicted" in capsys.readouterr().out
    assert main(["bench", *argv[:-1], str(tmp_path / "absent.json")]) == 12  # read before training
    assert "cannot read it" in capsys.readouterr().err
