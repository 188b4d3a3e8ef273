"""The console entry ends the process without the interpreter's teardown (flopcount.cli.console.exit_process), and
loses nothing by it: the whole report reaches a pipe, exit codes are kept, atexit handlers run, and a process with
work still going (another thread) exits the normal way."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESNET = ROOT / "examples" / "resnet50-v1.5.onnx"


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def test_a_long_report_reaches_the_pipe_whole_and_the_code_is_kept():
    done = subprocess.run([sys.executable, "-m", "flopcount", str(RESNET), "--format", "json", "--per-node"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) > 1 << 17  # more than any pipe buffer: the last bytes were flushed before the exit
    report = json.loads(done.stdout)
    assert len(report["nodes"]) > 100
    missing = subprocess.run([sys.executable, "-m", "flopcount", "no-such-model.onnx"], capture_output=True, text=True,
                             timeout=60, cwd=ROOT)
    assert missing.returncode == 3
    assert missing.stderr.strip().startswith("flopcount: error: no-such-model.onnx")


def test_exit_handlers_run_and_the_teardown_is_skipped():
    done = _python("""
        import atexit, sys
        from flopcount.cli.console import exit_process

        class Held:
            def __del__(self):
                print("torn down", flush=True)

        held = Held()
        atexit.register(lambda: print("handler", flush=True))
        print("report", end="")
        exit_process(5)
    """)
    assert done.returncode == 5
    assert done.stdout == "reporthandler\n"  # flushed, the handler ran, and no object was torn down


def test_another_thread_still_working_gets_the_normal_exit():
    done = _python("""
        import threading, time
        from flopcount.cli.console import exit_process

        def late():
            time.sleep(0.3)
            print("late", flush=True)

        threading.Thread(target=late).start()
        exit_process(4)
    """)
    assert done.returncode == 4
    assert done.stdout == "late\n"  # sys.exit waited for the thread


@pytest.mark.parametrize("argv, code", [(["--version"], 0), (["--no-such-flag"], 2)])
def test_console_codes(argv, code):
    done = subprocess.run([sys.executable, "-m", "flopcount", *argv], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == code
