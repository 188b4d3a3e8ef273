"""``flopcount bench``: real training runs on this machine, checked against the digits CNN's closed-form FLOPs."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

import flopcount  # noqa: E402
from flopcount.cli import main  # noqa: E402
from flopcount.errors import EXIT_QUALITY_NOT_REACHED  # noqa: E402

# The digits CNN per sample (models/digits.py), flopcount's default convention, 1 MAC = 2 FLOPs.
# Forward:
CONV1 = 2 * 16 * 8 * 8 * 9 * 1 + 16 * 8 * 8  # 3x3 conv 1->16 on 8x8, + bias
CONV2 = 2 * 32 * 8 * 8 * 9 * 16 + 32 * 8 * 8  # 3x3 conv 16->32, + bias
RELUS = 16 * 64 + 32 * 64 + 64
POOL = 4 * 32 * 4 * 4  # 2x2 max pool: one per element each window reads
FC1 = 2 * 512 * 64 + 64
FC2 = 2 * 64 * 10 + 10
FORWARD = CONV1 + CONV2 + RELUS + POOL + FC1 + FC2
# Backward: the first conv, fed by data, has no input gradient (dW + dB only); every other product has dX and
# dW (twice its forward products) and its bias gradient; ReLU one per element; max pool one per output.
BACKWARD = ((2 * 16 * 64 * 9 + 16 * 64) + 2 * (2 * 32 * 64 * 9 * 16) + 32 * 64 + RELUS + 32 * 4 * 4
            + 2 * (2 * 512 * 64) + 64 + 2 * (2 * 64 * 10) + 10)
TRAIN_FLOPS_PER_SAMPLE = FORWARD + BACKWARD


def test_closed_form():
    assert FORWARD == 683_402 and BACKWARD == 1_338_506  # the sums written out above


@pytest.fixture(scope="module")
def digits_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    report, log = out / "r.json", out / "run.log"
    code = main(["bench", "digits", "--runs", "1", "--no-progress", "-o", str(report), "--mllog", str(log)])
    return code, json.loads(report.read_text()), log.read_text().splitlines()


def test_digits_trains_to_its_target(digits_run):
    code, doc, _ = digits_run
    assert code == 0
    run = doc["runs"][0]
    assert run["quality"] >= 0.95 and run["target_quality"] == 0.95 and run["quality_exponent"] == 5
    assert 0 < run["time_to_quality_s"] <= run["wall_s"]
    assert run["qualities"][-1]["value"] == run["quality"] and run["epochs"] == len(run["qualities"])


def test_digits_flops_are_measured_rate_times_the_closed_form(digits_run):
    _, doc, _ = digits_run
    run = doc["runs"][0]
    assert run["flops_per_sample"] == TRAIN_FLOPS_PER_SAMPLE
    assert run["samples_per_s"]["total"] > 0 and run["ranks"] == 1
    assert run["flops"] == pytest.approx(run["samples_per_s"]["total"] * TRAIN_FLOPS_PER_SAMPLE, rel=1e-12)
    assert run["vflops"] == pytest.approx(run["flops"] * (run["quality"] / 0.95) ** 5, rel=1e-12)
    assert run["mfu"] == pytest.approx(run["flops"] / run["peak_flops"], rel=1e-12)
    assert run["peak_source"].startswith("fp32 peak: measured GEMM ceiling of this cpu")
    # 1437 training images per epoch at batch 32: 45 steps
    assert run["samples"] == 1437 * run["epochs"] and run["steps"] == 45 * run["epochs"]
    assert run["flops_epoch_form"] > 0


def test_digits_report_document(digits_run):
    _, doc, _ = digits_run
    assert doc["schema_version"] == 1 and doc["kind"] == "flopcount.bench" and doc["tool"]["name"] == "flopcount"
    system = doc["system"]
    assert system["ranks"] == 1 and system["nodes"] == 1 and system["cpu"]["cores"] >= 1
    assert system["software"]["torch"] == torch.__version__.split("+")[0] or system["software"]["torch"]
    assert doc["config"]["batch_size"] == 32 and doc["config"]["optimizer"] == "adam"
    assert doc["config"]["counting"]["flops_per_sample"] == TRAIN_FLOPS_PER_SAMPLE
    assert doc["summary"]["runs"] == 1 and doc["summary"]["kept_runs"] == 1
    run = doc["runs"][0]
    for key, value in run.items():  # every null figure says why
        if value is None:
            assert run["unavailable"].get(key), key
    if run["energy_j"] is None:
        assert "energy" in run["unavailable"]["energy_j"] or "RAPL" in run["unavailable"]["energy_j"]


def test_mllog_lines(digits_run):
    _, doc, lines = digits_run
    records = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in lines]
    keys = [r["key"] for r in records]
    for key in ("init_start", "init_stop", "run_start", "run_stop"):
        assert keys.count(key) == 1, key
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("run_stop")
    evals = [r for r in records if r["key"] == "eval_accuracy"]
    assert [e["metadata"]["epoch_num"] for e in evals] == list(range(1, doc["runs"][0]["epochs"] + 1))
    assert evals[-1]["value"] == doc["runs"][0]["quality"]
    assert records[keys.index("run_stop")]["metadata"]["status"] == "success"
    assert all(r["event_type"] in ("INTERVAL_START", "INTERVAL_END", "POINT_IN_TIME") for r in records)


def test_missing_the_target_exits_10(tmp_path, capsys):
    code = main(["bench", "digits", "--epochs", "1", "--target-quality", "0.9999", "--no-progress",
                 "-o", str(tmp_path / "r.json")])
    assert code == EXIT_QUALITY_NOT_REACHED == 10
    assert "did not reach the target quality 0.9999 within 1 epochs" in capsys.readouterr().err
    run = json.loads((tmp_path / "r.json").read_text())["runs"][0]
    assert run["time_to_quality_s"] is None and "not reached" in run["unavailable"]["time_to_quality_s"]


@pytest.mark.parametrize("argv, message", [
    pytest.param(["bench", "digits", "--steps", "3"], "--steps and --image-size apply", id="steps-for-digits"),
    pytest.param(["bench", "image_classification", "--epochs", "3"], "--epochs and --target-quality", id="epochs"),
    pytest.param(["bench", "digits", "--device", "cuda"] if not torch.cuda.is_available() else ["bench", "x"],
                 "CUDA" if not torch.cuda.is_available() else "invalid choice", id="no-cuda"),
])
def test_bench_usage(argv, message, capsys):
    code = main(argv)
    assert code in (2, 11)
    assert message in capsys.readouterr().err


def test_meter_counts_a_module_on_first_use():
    from flopcount.models.digits import digits_cnn

    clock = iter(range(1000)).__next__
    meter = flopcount.Meter(model=digits_cnn(), example_inputs=(4, 1, 8, 8), warmup_steps=0, energy=False,
                            clock=lambda: float(clock()))
    for _ in range(3):
        with meter.step(samples=4):
            pass
    r = meter.result()
    assert r.flops_per_sample == TRAIN_FLOPS_PER_SAMPLE
    # each step spans 1 tick of the injected clock and the next starts 1 tick later: 12 samples over 5 ticks
    assert r.samples_per_s["per_rank"] == pytest.approx(12 / 5)


@pytest.mark.slow
def test_image_classification_on_synthetic_data_has_no_quality(tmp_path):
    out = tmp_path / "r.json"
    code = main(["bench", "image_classification", "--steps", "3", "--batch-size", "2", "--image-size", "32x32",
                 "--warmup-steps", "1", "--window-steps", "1", "--no-progress", "-o", str(out)])
    assert code == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["quality"] is None and "never called" in run["unavailable"]["quality"]
    assert run["vflops"] is None and run["flops"] > 0 and run["samples"] == 6


@pytest.mark.gpu
def test_cuda_events_time_steps_with_one_sync_per_window():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from flopcount.measure.harness.clocks import CudaEventTimer

    timer = CudaEventTimer()
    a = torch.randn(2048, 2048, device="cuda")
    for _ in range(3):
        timer.start()
        a @ a
        timer.stop()
    stamps = timer.collect()
    assert len(stamps) == 3 and all(e > s for s, e in stamps)


@pytest.mark.gpu
def test_nvml_energy_and_a_metered_cuda_run():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from flopcount.measure.harness import energy

    src = energy.nvml(0)
    if src.kind == "unavailable":
        pytest.skip(src.reason)
    meter = flopcount.Meter(flops_per_sample=2 * 4096**3, device="cuda", warmup_steps=2, window_steps=10)
    a = torch.randn(4096, 4096, device="cuda")
    for _ in range(52):
        with meter.step(samples=1):
            a @ a
    r = meter.result()
    assert r.samples_per_s["windows"] == 5 and r.peak_flops is not None or "unknown device" in r.unavailable["mfu"]
    assert r.energy_j is None or r.energy_j > 0
