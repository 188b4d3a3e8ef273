"""``flopcount plan``: every plan of a small Llama on 4 devices, the ones the ledger refuses counted apart, ranked
by throughput, the best one's figures those of ``--parallel ... --predict`` for that plan."""

from __future__ import annotations

import json

import pytest

from flopcount.cli import main


def test_plans_of_a_small_llama_on_four_devices(tmp_path, capsys):
    pytest.importorskip("transformers")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                                  "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                                  "vocab_size": 128}))
    common = ["--hf", str(config), "--input-shape", "input_ids=2x8:int64", "--device", "H100", "--format", "json"]
    assert main(["plan", *common, "--devices", "4", "--microbatch-counts", "1,2,4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    # tp must divide the 2 heads, pp the 2 layers; M >= pp; schedules 1f1b and gpipe where pp > 1; 2 recomputes:
    # tp=1,pp=1,dp=4: 3 M x 2 = 6; tp=1,pp=2,dp=2: 2 schedules x 2 M x 2 = 8; tp=2,pp=1,dp=2: 6; tp=2,pp=2,dp=1: 8
    assert len(doc["plans"]) == 6 + 8 + 6 + 8
    # refused: tp=1,pp=4 (2 schedules x M=4 x 2 = 4) and tp=4,pp=1 (3 M x 2 = 6)
    assert sum(doc["dropped"].values()) == 4 + 6
    assert "memory per rank not checked" in doc["notes"][0]
    rates = [p["tokens_per_second"] for p in doc["plans"]]
    assert rates == sorted(rates, reverse=True)
    best = doc["plans"][0]
    assert main(["--mode", "train", *common, "--parallel", best["parallel"], "--microbatches",
                 str(best["microbatches"]), "--schedule", best["schedule"], "--recompute", best["recompute"],
                 "--predict"]) == 0
    pred = json.loads(capsys.readouterr().out)["prediction"]
    assert pred["tokens_per_second"] == pytest.approx(best["tokens_per_second"])
    assert pred["step_seconds"] == pytest.approx(best["step_seconds"])


def test_plan_needs_a_profile(capsys):
    assert main(["plan", "examples/resnet50-v1.5.onnx", "--devices", "2"]) == 2
    assert "give one of --machine" in capsys.readouterr().err
