"""The argument types and the model source every command shares (flopcount.cli.arguments)."""

from __future__ import annotations

import argparse
import re

import pytest

from flopcount.cli import arguments as a


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("x=8x3x224x224", ("x", (8, 3, 224, 224), None), id="dims"),
    pytest.param("input_ids=1x128:int64", ("input_ids", (1, 128), "int64"), id="dims-and-dtype"),
    pytest.param("a=b=2x3", ("a=b", (2, 3), None), id="name-with-equals"),
])
def test_input_shape(text, expected):
    assert a.input_shape(text) == expected


@pytest.mark.parametrize(("convert", "text", "message"), [
    pytest.param(a.input_shape, "8x3", "expected NAME=DIMS", id="shape-without-name"),
    pytest.param(a.input_shape, "x=2:complex32", "unknown element type", id="shape-bad-dtype"),
    pytest.param(a.input_value, "axes=1,x", "integers joined by ','", id="value-not-int"),
    pytest.param(a.input_value, f"axes={2**63}", "64-bit", id="value-too-large"),
    pytest.param(a.loop_trips, "loop=0", "positive integer", id="trips-zero"),
    pytest.param(a.positive, "0", "positive integer", id="positive-zero"),
    pytest.param(a.positive, str(2**48 + 1), "at most 2**48", id="positive-too-large"),
    pytest.param(a.positive_int, str(10**9 + 1), "at most 1e9", id="count-too-large"),
    pytest.param(a.nonneg_int, "-1", ">= 0", id="nonneg-negative"),
    pytest.param(a.positive_float, "inf", "positive number", id="float-infinite"),
    pytest.param(a.size_hw, "224", "HxW", id="size-one-dim"),
    pytest.param(a.size_hw, "0x7", "positive HxW", id="size-zero"),
    # digits that int() reads but that are not ASCII (Arabic-Indic, superscripts) are no integers here
    pytest.param(a.positive, "١٢", "digits 0-9", id="positive-arabic-indic"),
    pytest.param(a.positive, "²", "digits 0-9", id="positive-superscript"),
    pytest.param(a.positive_int, "٣", "positive integer", id="count-arabic-indic"),
    pytest.param(a.nonneg_int, "٣", ">= 0", id="nonneg-arabic-indic"),
    pytest.param(a.input_value, "axes=١", "digits 0-9", id="value-arabic-indic"),
    pytest.param(a.size_hw, "٢x3", "HxW", id="size-arabic-indic"),
])
def test_a_bad_word_is_one_argparse_error(convert, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(message)):
        convert(text)


def test_good_words():
    assert a.input_value("axes=1,-2") == ("axes", [1, -2])
    assert a.loop_trips("decoder_loop=32") == ("decoder_loop", 32)
    assert a.positive(str(2**48)) == 2**48 and a.positive_int("7") == 7 and a.nonneg_int("0") == 0
    assert a.positive_float("0.5") == 0.5 and a.size_hw("224X160") == (224, 160)


def _source(argv):
    p = argparse.ArgumentParser()
    a.add_model_source(p, "model")
    return p.parse_args(argv)


def test_torch_inputs_carry_dtypes_and_batch():
    args = _source(["--torch", "m:f", "--input-shape", "x=2x3", "--input-shape", "ids=2x5:int64"])
    assert a.torch_inputs(args) == {"x": (2, 3), "ids": ((2, 5), "int64")}
    assert a.torch_inputs(args, batch=7) == {"x": (7, 3), "ids": ((7, 5), "int64")}


@pytest.mark.parametrize(("argv", "problem"), [
    pytest.param([], "give the path of an .onnx model", id="nothing"),
    pytest.param(["m.onnx", "--torch", "p:f"], "not both", id="path-and-torch"),
    pytest.param(["--torch", "p:f"], "--torch needs the shape", id="torch-without-shapes"),
    pytest.param(["m.onnx", "--input-shape", "x=1:int64"], "a :DTYPE suffix is for --torch", id="dtype-on-onnx"),
    pytest.param(["--keras", "p:f", "--input-shape", "x=1", "--input-shape", "x=2"], "names one model input",
                 id="keras-repeated-input"),
])
def test_model_source_problems(argv, problem):
    assert problem in a.model_source_problem(_source(argv))


def test_a_path_is_its_own_source():
    assert a.model_source(_source(["m.onnx", "--input-shape", "x=4x10"])) == ("m.onnx", {"x": (4, 10)})



def test_help_groups_the_counting_options():
    import re

    from flopcount.cli import build_parser

    text = build_parser().format_help()
    OPTION = r"^  (?:-\w(?: \S+)?, )?(--[\w-]+)"  # '  --format', '  -o FILE, --output'
    titles = ["input", "shapes", "counting", "LLM", "parallel and memory", "output"]
    starts = [text.index(f"\n{t}:\n") for t in titles]
    assert starts == sorted(starts), "the groups in this order"
    sections = dict(zip(titles, (text[a:b] for a, b in zip(starts, [*starts[1:], text.index("Exit codes:")]))))
    expected = {
        "input": ["--torch", "--keras", "--hf", "--trust-remote-code"],
        "shapes": ["--input-shape", "--batch", "--input-value", "--loop-trips"],
        "counting": ["--mode", "--optimizer", "--convention", "--attention", "--strict", "--free-op", "--symbolic"],
        "LLM": ["--generate", "--capacity-factor", "--repeated-layers"],
        "parallel and memory": ["--memory", "--parallel", "--microbatches", "--schedule", "--recompute",
                                "--expert-load", "--optimizer-impl", "--memory-device", "--master-weights"],
        "output": ["--format", "--output", "--per-node", "--by-module", "--depth", "--plot", "--verbose"],
    }
    for title, options in expected.items():
        listed = set(re.findall(OPTION, sections[title], re.MULTILINE))
        assert set(options) <= listed, (title, listed)
    every = set(re.findall(OPTION, text, re.MULTILINE)) - {"--help"}
    grouped = set().union(*(re.findall(OPTION, sections[t], re.MULTILINE) for t in titles))
    assert every == grouped, f"options outside the six groups: {every - grouped}"
    assert len(re.findall(r"^  --mode\b", text, re.MULTILINE)) == 1  # each flag declared once
