"""Issue #38's bad input: each is one line on stderr naming the flag, exit 2, in seconds (no traceback, no minutes,
no MemoryError): digits that are not ASCII, huge degrees and microbatch counts, token counts that are not finite,
flags that would do nothing, and argparse's own errors, in every command."""

from __future__ import annotations

import time

import pytest
from helpers import model
from onnx import TensorProto, helper

from flopcount.cli import main


def check_one_line(capsys, argv, *fragments, code=2):
    start = time.monotonic()
    got = main(list(argv))
    elapsed = time.monotonic() - start
    out, err = capsys.readouterr()
    assert got == code, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("flopcount: error: ") and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    assert elapsed < 30, f"{argv}: {elapsed:.1f} s"
    return err


@pytest.fixture
def relu(tmp_path):
    path = tmp_path / "relu.onnx"
    path.write_bytes(model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 3)}, ["y"]).SerializeToString())
    return str(path)


@pytest.mark.parametrize("flags, fragments", [
    pytest.param(["--parallel", "tp=²"], ["--parallel: tp=² must be a positive integer (digits 0-9)"],
                 id="superscript-degree"),
    pytest.param(["--parallel", "dp=٢"], ["--parallel: dp=٢ must be a positive integer"], id="arabic-indic-degree"),
    pytest.param(["--parallel", "pp=2", "--microbatches", "2", "--schedule", "interleaved:²"],
                 ["--schedule: 'interleaved:²'"], id="superscript-virtual-stages"),
    pytest.param(["--parallel", "pp=2", "--microbatches", "٤"], ["--microbatches", "positive integer"],
                 id="arabic-indic-microbatches"),
    pytest.param(["--parallel", f"dp={2**40}"], [f"{2**40:,} ranks", "2**16"], id="huge-degree"),
    pytest.param(["--parallel", "tp=512,dp=256"], ["131,072 ranks", "2**16"], id="huge-world"),
    pytest.param(["--parallel", "pp=2", "--microbatches", "1000000000"], ["1,000,000,000 microbatches", "2**18"],
                 id="huge-microbatches"),
    pytest.param(["--microbatches", "4"], ["--microbatches needs --parallel"], id="microbatches-alone"),
    pytest.param(["--schedule", "gpipe"], ["--schedule needs --parallel"], id="schedule-alone"),
    pytest.param(["--parallel", ""], ["--parallel: '' is no plan"], id="empty-plan"),
    pytest.param(["--parallel", " , "], ["is no plan"], id="blank-plan"),
    pytest.param(["--recompute", "full", "--mode", "train"], ["--recompute needs --memory"], id="recompute-alone"),
    pytest.param(["--device-memory", "80GiB"], ["--device-memory needs --memory"], id="device-memory-alone"),
    pytest.param(["--mode", "train", "--memory", "--device-memory", "A100"], ["'A100' is sold with more than one "
                                                                             "memory size"], id="device-two-sizes"),
    pytest.param(["--mode", "train", "--memory", "--device-memory", "lots"], ["--device-memory 'lots': give a "
                                                                             "size such as 80GiB"], id="no-size"),
    pytest.param(["--loop-trips", "decoder_loop=3"], ["--loop-trips decoder_loop=...", "no Loop or SequenceMap",
                                                      "has no Loop"], id="loop-trips-without-loop"),
])
def test_bad_plan_input_is_one_line(capsys, relu, flags, fragments):
    check_one_line(capsys, [relu, *flags], *fragments)


@pytest.mark.parametrize("load", ["[Infinity, 1]", "[1e308, 1e308]", "[NaN, 1]", "[[1, 2], [-Infinity, 1]]"],
                         ids=["infinity", "1e308", "nan", "negative-infinity-in-a-layer"])
def test_an_expert_load_that_is_not_finite_is_refused(capsys, relu, tmp_path, load):
    path = tmp_path / "load.json"
    path.write_text(load)
    check_one_line(capsys, [relu, "--parallel", "ep=2,dp=2", "--expert-load", str(path)],
                   f"--expert-load {path}: not a list of non-negative token counts per expert (finite, at most 2**48")


def test_loop_trips_name_a_loop_of_the_graph(capsys, tmp_path):
    """A trip count for a node that is no Loop is refused, naming the graph's loops; the loop's own name is taken."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Relu", ["h_in"], ["h_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                 helper.make_tensor_value_info("h_in", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", TensorProto.FLOAT, [2, 3])])
    loop = helper.make_node("Loop", ["n", "", "x"], ["y"], name="steps", body=body)
    graph = helper.make_graph([loop], "g", [helper.make_tensor_value_info("n", TensorProto.INT64, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "loop.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    check_one_line(capsys, [str(path), "--loop-trips", "stepz=5"], "no Loop or SequenceMap node of the graph is named "
                   "'stepz'", "its Loop and SequenceMap nodes: steps")
    assert main([str(path), "--loop-trips", "steps=5", "--format", "json"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("argv, fragments", [
    pytest.param(["m.onnx", "--batch", "x"], ["argument --batch: must be a positive integer (digits 0-9), got 'x'",
                                             "(see flopcount --help)"], id="count-bad-value"),
    pytest.param(["m.onnx", "--mode", "training"], ["argument --mode: invalid choice: 'training'"], id="count-choice"),
    pytest.param(["m.onnx", "--no-such-flag"], ["unrecognized arguments: --no-such-flag"], id="count-unknown-flag"),
    pytest.param(["profile", "m.onnx", "--runs", "0"], ["argument --runs", "(see flopcount profile --help)"],
                 id="profile"),
    pytest.param(["roofline", "--batch", "²"], ["argument --batch"], id="roofline"),
    pytest.param(["crosscheck", "--torch", "m:f", "--input-shape", "x=2", "--optimizer", "lamb"],
                 ["argument --optimizer: invalid choice: 'lamb'"], id="crosscheck"),
])
def test_an_argparse_error_is_one_line(capsys, argv, fragments):
    check_one_line(capsys, argv, *fragments)
