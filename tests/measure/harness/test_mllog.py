"""MLPerf logs that MLPerf's own compliance checker accepts, from a real bench run on an ImageFolder made here."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from flopcount.cli import main
from helpers import make_folder
from flopcount.errors import UsageError

torch = pytest.importorskip("torch")


def records(path):
    return [json.loads(line.split(":::MLLOG ", 1)[1]) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mllog")
    data = make_folder(tmp / "data")
    log, report = tmp / "run.log", tmp / "r.json"
    code = main(["bench", "image_classification", "--data", str(data), "--image-size", "32x32", "--batch-size", "4",
                 "--epochs", "2", "--warmup-steps", "1", "--window-steps", "2", "--no-progress", "--mllog", str(log),
                 "-o", str(report)])
    return tmp, code, log, json.loads(report.read_text())


@pytest.mark.slow
def test_mlperf_compliance_checker_accepts_the_log(folder_run):
    pytest.importorskip("mlperf_logging")
    tmp, code, log, _ = folder_run
    assert code in (0, 10)  # 10: the target 0.763 was not reached on noise, which the log records as aborted
    out = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                          "--ruleset", "4.0.0", str(log)], cwd=tmp, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout + out.stderr and "open_resnet.yaml" in out.stdout + out.stderr


@pytest.mark.slow
def test_log_order_sizes_and_call_sites(folder_run):
    _, _, log, doc = folder_run
    recs = records(log)
    keys = [r["key"] for r in recs]
    value = {r["key"]: r["value"] for r in recs}
    # 3 classes of 6 images, round(0.2 x 6) = 1 of each held out: 15 training and 3 evaluation images
    assert value["train_samples"] == 15 and value["eval_samples"] == 3
    assert keys.index("train_samples") < keys.index("init_stop") < keys.index("run_start") < keys.index("run_stop")
    assert value["submission_division"] == "open" and value["submission_benchmark"] == "resnet"
    assert value["submission_status"] == "research" and value["submission_org"] == "flopcount"
    assert keys.count("block_start") == keys.count("block_stop") == keys.count("eval_start") == doc["runs"][0]["epochs"]
    # every line names its call site: the training loop's line (the benchmarks' shared epoch loop), never the log
    # writer or the meter
    from flopcount.workloads import common

    source = open(common.__file__, encoding="utf-8").read().splitlines()
    for r in recs:
        assert r["metadata"]["file"] not in ("mllog.py", "meter.py", "contextlib.py"), r
    evals = [r for r in recs if r["key"] == "eval_accuracy"]
    assert all(r["metadata"]["file"] == "common.py" for r in evals)
    assert all("meter.quality(" in source[r["metadata"]["lineno"] - 1] for r in evals)
    steps = [r for r in recs if r["key"] == "eval_start"]
    assert all("meter.evaluating(" in source[r["metadata"]["lineno"] - 1] for r in steps)
    assert doc["config"]["mllog"]["ruleset"] == "training 4.0.0"
    assert doc["config"]["data"].endswith("data") and doc["runs"][0]["flops_per_sample"] > 0


def test_imagefolder_split_and_errors(tmp_path):
    from flopcount.workloads.imagefolder import scan

    folder = scan(str(make_folder(tmp_path / "d", per_class=5)))
    assert folder.classes == ("cat", "dog", "fox")
    assert len(folder.eval) == 3 and len(folder.train) == 12  # round(0.2 x 5) = 1 of 5 per class
    assert {label for _, label in folder.eval} == {0, 1, 2}
    with pytest.raises(UsageError, match="no such folder"):
        scan(str(tmp_path / "missing"))
    make_folder(tmp_path / "one", classes=("only",))
    with pytest.raises(UsageError, match="at least two"):
        scan(str(tmp_path / "one"))


def test_unreadable_image_is_a_usage_error(tmp_path):
    from flopcount.workloads.imagefolder import load, scan

    root = make_folder(tmp_path / "d", per_class=2)
    (root / "cat" / "9.jpg").write_bytes(b"not a jpeg")
    folder = scan(str(root))
    with pytest.raises(UsageError, match=r"9\.jpg: cannot be read as an image"):
        load(folder.train + folder.eval, (8, 8))


def test_data_only_with_image_classification(capsys):
    assert main(["bench", "digits", "--data", "x"]) == 2
    assert "--data applies to image_classification" in capsys.readouterr().err


def test_submission_fields_are_checked():
    from flopcount.measure.harness.mllog import Submission

    with pytest.raises(UsageError, match="division must be one of closed, open"):
        Submission("org", "box", division="mine")
    with pytest.raises(UsageError, match="org must be a non-empty string"):
        Submission("", "box")
