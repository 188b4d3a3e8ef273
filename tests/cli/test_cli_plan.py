"""``flopcount plan``'s bad input: each refused in one line naming the flag, exit 2, no traceback."""

from __future__ import annotations

import json

import pytest

from flopcount.cli import main

from helpers import llama_config


def _one_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("flopcount: the ")
           and not line.startswith("flopcount: exporting")]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


@pytest.mark.parametrize(("extra", "words"), [
    ([], "--device-memory"),
    (["--device-memory", "80GiB", "--parallel", "tp=2"], "leave out --parallel"),
    (["--device-memory", "80GiB", "--recompute", "full"], "leave out --parallel, --microbatches"),
    (["--device-memory", "80GiB", "--global-batch", "1", "--microbatch-sizes", "2,4"], "--global-batch 1"),
])
def test_refused_before_counting(extra, words, capsys):
    assert main(["plan", "examples/resnet50-v1.5.onnx", "--devices", "2", "--device", "H100", *extra]) == 2
    assert words in _one_line(capsys)


@pytest.mark.parametrize("flag", ["--microbatch-sizes", "--microbatch-counts"])
def test_sizes_must_be_positive(flag, capsys):
    assert main(["plan", "examples/resnet50-v1.5.onnx", "--devices", "2", "--device", "H100",
                 "--device-memory", "80GiB", flag, "0,2"]) == 2
    assert flag in _one_line(capsys)


def test_plan_needs_a_profile(capsys):
    assert main(["plan", "examples/resnet50-v1.5.onnx", "--devices", "2", "--device-memory", "80GiB"]) == 2
    assert "give one of --machine" in _one_line(capsys)


def test_devices_no_plan_fills(tmp_path, capsys):
    """A global batch of 2 sequences on 3 devices: every plan has dp in {1, 3} and pp in {1} (2 layers), tp and cp
    in {1} (3 divides neither the 2 heads nor 2·cp the 8 tokens): dp=3 needs b·3 to divide 2, dp=1 needs tp·cp·pp = 3
    which nothing splits."""
    pytest.importorskip("transformers")
    config = llama_config(tmp_path, 32, 2, 2, 2, 64, 128)
    assert main(["plan", "--hf", config, "--input-shape", "input_ids=2x8:int64", "--device", "H100", "--devices",
                 "3", "--device-memory", "80GiB", "--global-batch", "2", "--microbatch-sizes", "1"]) == 2
    line = _one_line(capsys)
    assert "no plan of this model fills 3 devices" in line and "b·dp" in line


def test_small_sizes_in_their_own_unit(tmp_path, capsys):
    """A tiny Llama's peak is a few hundred KiB: the table shows it in KiB (not "0.00 GiB"), the headroom of
    80 GiB in GiB, each as the plan's bytes in JSON divided by 2**10 or 2**30."""
    pytest.importorskip("transformers")
    args = ["plan", "--hf", llama_config(tmp_path, 32, 2, 2, 2, 64, 128), "--input-shape", "input_ids=2x8:int64",
            "--device", "H100", "--devices", "1", "--device-memory", "80GiB", "--microbatch-counts", "1"]
    assert main([*args, "--format", "json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert main(args) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith(plans[0]["parallel"])]
    assert len(rows) == len(plans) == 3 and all(2**10 <= p["peak_bytes"] < 2**20 for p in plans)
    for row, p in zip(rows, plans):
        assert row[-4:] == [f"{p['peak_bytes'] / 2**10:,.1f}", "KiB", f"{p['headroom_bytes'] / 2**30:,.1f}", "GiB"]
