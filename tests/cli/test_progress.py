"""Long work says what it is doing, phase by phase with its time, on stderr when stderr is a terminal; nothing
when it is not (a pipe, a file, this test's capture)."""

from __future__ import annotations

import io
import logging
import pathlib
import re
import sys

import pytest

from flopcount.cli import main

EXAMPLE = str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "resnet50-v1.5.onnx")
PHASES = ("reading the model", "building and checking the graph", "inferring shapes", "counting the nodes")


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_each_phase_of_a_count_with_its_time(monkeypatch, capsys):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main([EXAMPLE]) == 0
    lines = terminal.getvalue().splitlines()
    timed = [re.fullmatch(r"flopcount: (.+): (\d+\.\d) s", line) for line in lines]
    assert [m.group(1) for m in timed if m] == list(PHASES), lines
    assert "Total FLOPs" in capsys.readouterr().out  # the report itself still goes to stdout


def test_a_pipe_sees_nothing(capsys):
    assert main([EXAMPLE]) == 0
    assert capsys.readouterr().err == ""


def test_logging_is_put_back_after_a_command(monkeypatch):
    progress = logging.getLogger("flopcount.progress")
    before = progress.level, progress.propagate, list(progress.handlers)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert main([EXAMPLE]) == 0
    assert (progress.level, progress.propagate, list(progress.handlers)) == before


def test_an_export_is_a_phase_on_a_terminal(monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    monkeypatch.setenv("FLOPCOUNT_CACHE", "0")  # an export served from the cache is no export
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["--torch", "flopcount.models.digits:digits_cnn", "--input-shape", "input=2x1x8x8"]) == 0
    # what a terminal shows of each line: the text after its last carriage return (the export's spinner)
    shown = [line.rsplit("\r", 1)[-1].strip() for line in terminal.getvalue().split("\n")]
    timed = [m.group(1) for line in shown if (m := re.fullmatch(r"flopcount: (.+): \d+\.\d s", line))]
    assert timed == ["exporting Sequential with torch", *PHASES], shown
