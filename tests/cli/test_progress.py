"""Long work says what it is doing, phase by phase with its time, on stderr: every phase when stderr is a
terminal; where it is not (a pipe, a file, this test's capture), each step that took two seconds or more."""

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


def test_a_pipe_sees_only_the_steps_over_two_seconds(capsys):
    assert main([EXAMPLE]) == 0
    for line in capsys.readouterr().err.splitlines():  # a quiet machine: none (each step of this count is fast)
        m = re.fullmatch(r"flopcount: (.+): (\d+\.\d) s", line)
        assert m and m.group(1) in PHASES and float(m.group(2)) >= 2.0, line


def test_a_pipe_sees_each_slow_step_as_it_ends(monkeypatch, capsys):
    # every step of this count made to take 2.5 s by the count's clock: a pipe sees each, named, with its time
    import itertools
    import types

    import flopcount.counting

    ticks = itertools.count()  # the count's own clock only (the time module itself is left alone)
    monkeypatch.setattr(flopcount.counting, "time", types.SimpleNamespace(perf_counter=lambda: 2.5 * next(ticks)))
    assert main([EXAMPLE]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"flopcount: {p}: 2.5 s" for p in PHASES], lines


def test_fast_steps_and_starts_stay_off_a_pipe(capsys):
    from flopcount.cli.console import command_logging
    from flopcount.pipeline import progress

    with command_logging(0):
        with progress.phase("a fast step"):
            pass
        progress.done("an export", 3.21)
        progress.done("shape inference", 1.99)
    assert capsys.readouterr().err == "flopcount: an export: 3.2 s\n"


def test_verbose_on_a_pipe_shows_every_phase_as_info(capsys):
    assert main([EXAMPLE, "-v"]) == 0
    err = capsys.readouterr().err
    for p in PHASES:
        assert re.search(rf"^flopcount: INFO: {p}: \d+\.\d s$", err, re.MULTILINE), err


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


def test_quiet_shows_no_step_even_slow_ones_on_a_terminal(monkeypatch, capsys):
    # every step made to take 2.5 s by the count's clock, on a terminal: without -q each would be shown
    import itertools
    import types

    import flopcount.counting

    ticks = itertools.count()
    monkeypatch.setattr(flopcount.counting, "time", types.SimpleNamespace(perf_counter=lambda: 2.5 * next(ticks)))
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main([EXAMPLE, "--quiet"]) == 0
    assert terminal.getvalue() == ""
    assert "Total FLOPs" in capsys.readouterr().out  # the report itself is not silenced


def test_quiet_holds_back_warnings_but_not_errors(capsys):
    import warnings

    from flopcount.cli.console import command_logging

    filters = list(warnings.filters)
    with command_logging(0, quiet=True):
        logging.getLogger("flopcount.pipeline").warning("a warning of ours")
        warnings.warn("a warning of a library", UserWarning)
        logging.getLogger("flopcount.pipeline").error("an error of ours")
    assert capsys.readouterr().err == "flopcount: ERROR: an error of ours\n"
    assert warnings.filters == filters  # Python's warning filters are put back
    with command_logging(0):
        logging.getLogger("flopcount.pipeline").warning("a warning of ours")
    assert capsys.readouterr().err == "flopcount: WARNING: a warning of ours\n"


def test_quiet_still_says_why_a_command_failed(tmp_path, capsys):
    missing = tmp_path / "missing.onnx"
    assert main([str(missing), "-q"]) == 3  # an unreadable model file
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("flopcount: error: ") and str(missing) in err[0], err


def test_quiet_and_verbose_together_are_a_usage_error(capsys):
    assert main([EXAMPLE, "-q", "-v"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err
