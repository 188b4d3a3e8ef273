"""``flopcount calibrate`` writes a profile ``--predict --machine`` reads; the prediction of one MatMul on it is
the node rule written out; a profile from another machine gives one warning line."""

from __future__ import annotations

import json

import pytest
from helpers import single, weight

from flopcount.cli import main


def test_calibrate_then_predict_one_matmul(save, capsys, tmp_path):
    pytest.importorskip("torch")
    from flopcount.measure.machine.calibration import load_profile, rate_at

    out = tmp_path / "cpu.json"
    assert main(["calibrate", "--quick", "--threads", "1", "-o", str(out)]) == 0
    p = load_profile(str(out))
    assert p.calibrated and p.ranks == 1 and not p.collectives and p.machine["threads_per_rank"] == 1
    m, k, n = 48, 64, 80
    path = save(single("MatMul", {"x": (m, k)}, [weight("W", (k, n))]))
    assert main([path, "--predict", "--machine", str(out), "--format", "json"]) == 0
    pred = json.loads(capsys.readouterr().out)["prediction"]
    flops, nbytes = 2 * m * k * n, 4 * (m * k + k * n + m * n)
    expected = max(flops / rate_at(p.compute["gemm"], (m * k * n) ** (1 / 3), "best")[0],
                   nbytes / rate_at(p.compute["elementwise"], nbytes, "best")[0]) + p.overhead["forward"].best
    assert pred["step_seconds"] == pytest.approx(expected)
    assert pred["mfu"] == pytest.approx(flops / (expected * p.peak_flops_per_s))

    doc = json.loads(out.read_text())
    doc["machine"]["cpu"] = "another CPU"
    other = tmp_path / "other.json"
    other.write_text(json.dumps(doc))
    assert main([path, "--predict", "--machine", str(other)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cpu 'another CPU'" in err[0]

