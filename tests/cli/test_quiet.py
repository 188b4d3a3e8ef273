"""``-q``/``--quiet`` in every command: declared once (:func:`flopcount.cli.arguments.add_verbosity`), it leaves
stderr without progress lines, bars and warnings, on a terminal too, where each command otherwise shows its steps."""

from __future__ import annotations

import importlib
import io
import pathlib
import sys

import pytest
from onnx import helper

from flopcount.cli import SUBCOMMANDS, build_parser, main

from helpers import model

NCU_RAW = pathlib.Path(__file__).resolve().parents[1] / "measure" / "ncu" / "data" / "ncu" / "raw_page.csv"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _parsers():
    yield pytest.param(build_parser, id="count")
    for name, module in SUBCOMMANDS.items():
        yield pytest.param(importlib.import_module(module).build_parser, id=name)


@pytest.mark.parametrize("make", list(_parsers()))
def test_every_command_takes_quiet_beside_verbose_one_or_the_other(make):
    parser = make()
    (quiet,) = [a for a in parser._actions if "--quiet" in a.option_strings]
    (verbose,) = [a for a in parser._actions if "--verbose" in a.option_strings]
    assert quiet.option_strings == ["-q", "--quiet"] and verbose.option_strings == ["-v", "--verbose"]
    together = [g for g in parser._mutually_exclusive_groups if quiet in g._group_actions]
    assert len(together) == 1 and verbose in together[0]._group_actions


def _stderr_of(monkeypatch, argv: list[str]) -> str:
    """What the command writes on a stderr that is a terminal (every step shown there without -q)."""
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(argv) == 0
    return terminal.getvalue()


@pytest.fixture
def matmul(save):
    # the MatMul the ncu fixture measured: [96, 64] x [64, 160]
    return save(model([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": [96, 64], "b": [64, 160]}, ["y"]))


def _commands(path: str) -> dict[str, list[str]]:
    return {
        "roofline": ["roofline", path],
        "profile": ["profile", path, "--warmup", "0", "--runs", "1"],
        "crosscheck": ["crosscheck", "--ncu-csv", str(NCU_RAW), path],
    }


@pytest.mark.parametrize("command", ["roofline", "profile", "crosscheck"])
def test_a_counting_subcommand_shows_its_steps_unless_quiet(command, matmul, monkeypatch, capsys):
    if command == "profile":
        pytest.importorskip("onnxruntime")
    if command == "roofline":  # its ceilings are measured through torch (flopcount ceilings)
        pytest.importorskip("torch")
    argv = _commands(matmul)[command]
    shown = _stderr_of(monkeypatch, argv)
    assert "flopcount: counting the nodes: " in shown, shown  # the count's steps, each with its time
    assert _stderr_of(monkeypatch, [*argv, "--quiet"]) == ""
    assert capsys.readouterr().out  # the report itself still goes to stdout


@pytest.mark.slow  # a digits count and two short runs: about 14 s
def test_bench_shows_no_bar_and_no_run_line_when_quiet(monkeypatch, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    # two runs of one epoch in 2 steps of 1,024 samples: a line per run (and a bar with tqdm) without -q
    argv = ["bench", "digits", "--runs", "2", "--epochs", "1", "--target-quality", "0.01", "--batch-size", "1024",
            "--warmup-steps", "0", "--window-steps", "1"]
    shown = _stderr_of(monkeypatch, argv)
    assert "flopcount: run 1/2: " in shown and "flopcount: run 2/2: " in shown, shown
    assert _stderr_of(monkeypatch, [*argv, "-q"]) == ""


@pytest.mark.parametrize("argv", [pytest.param(["ceilings", "--quick"], id="ceilings"),
                                  pytest.param(["calibrate", "--quick", "--threads", "1"], id="calibrate")])
def test_a_measuring_subcommand_is_silent_when_quiet(argv, monkeypatch):
    pytest.importorskip("torch")
    assert _stderr_of(monkeypatch, [*argv, "-q"]) == ""
