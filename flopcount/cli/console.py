"""What every command shares around its work: logging to stderr, errors turned into one line and an exit code,
and writing the report to ``-o FILE`` or stdout."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import threading
import warnings
from typing import Iterator, NoReturn

from flopcount.errors import FlopcountError, Interrupted, framework_failure
from flopcount.pipeline.progress import slow_step
from flopcount.output.files import check_writable, write_atomic

__all__ = [
    "EXIT_INTERNAL", "OUTPUT_OPTIONS", "check_outputs", "command_logging", "exit_process", "run_guarded",
    "write_output",
]

EXIT_INTERNAL = 1

#: Every option that names a file a command writes: argparse dest -> (what the file holds, the option).
OUTPUT_OPTIONS = {"output": ("report", "-o"), "plot": ("plot", "--plot"), "mllog": ("MLPerf log", "--mllog")}


def check_outputs(args) -> None:
    """Refuse, before any work starts, every output path of ``args`` that cannot be written
    (:func:`flopcount.output.files.check_writable`: an :class:`OutputError`, exit 8, naming the path and the option)."""
    given = vars(args)  # the command's flags by name: each command declares some of these
    for dest, (what, option) in OUTPUT_OPTIONS.items():
        path = given.get(dest)
        if path:
            check_writable(path, what, option)


@contextlib.contextmanager
def command_logging(verbose: int, quiet: bool = False) -> Iterator[None]:
    """While a command runs, flopcount's own loggers (the ``flopcount`` hierarchy) write ``flopcount: LEVEL:
    message`` lines to stderr, at WARNING, INFO (``-v``) or DEBUG (``-vv``), and do not propagate. The root logger is
    left alone: other libraries' records (transformers', torchao's, TensorFlow's) are theirs, never labelled as
    flopcount's, and ``-vv`` does not turn on their debug output. Where nobody configured a handler for them, their
    warnings (torchao's "Failed to load ..." when transformers imports it) would reach Python's last-resort handler
    and stand beside a command's one-line error: they are shown with ``-v``, named by their logger, and held back
    otherwise. The phases of long work (:mod:`flopcount.pipeline.progress`: exports, shape inference, the count) are
    shown as ``flopcount: message`` lines with their times: every one when stderr is a terminal, and where it is not
    (a pipe, a file), each step that took two seconds or more, as it ends. ``quiet`` (``-q``) leaves errors only: no
    phase and no warning, flopcount's or another library's (``warnings.warn`` included), while the one line of a failed
    command (:func:`run_guarded`) is printed as always. Everything is put back
    afterwards, so that :func:`flopcount.cli.main` called from Python leaves the process's logging as it found it."""
    logger = logging.getLogger("flopcount")
    progress = logging.getLogger("flopcount.progress")  # flopcount.pipeline.progress: phases and their times
    shown = _is_terminal(sys.stderr)
    progress_handler = logging.StreamHandler(sys.stderr)
    progress_handler.setFormatter(logging.Formatter("flopcount: %(message)s"))
    handler = logging.StreamHandler(sys.stderr)  # the stderr of this call (a test's capture included)
    handler.setFormatter(logging.Formatter("flopcount: %(levelname)s: %(message)s"))
    others = logging.StreamHandler(sys.stderr)
    others.setFormatter(logging.Formatter("%(name)s: %(levelname)s: %(message)s"))
    others.setLevel(logging.WARNING if verbose else logging.CRITICAL + 1)
    saved = logger.level, logger.propagate, logging.lastResort
    logger.setLevel(logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)])
    logger.propagate = False
    logger.addHandler(handler)
    saved_progress = progress.level, progress.propagate
    if not quiet and (shown or not verbose):  # (-v on a pipe: every phase, as the INFO records of the flopcount logger)
        if not shown:  # a pipe or a file: only the steps that took long (a fast count stays silent)
            progress_handler.addFilter(slow_step)
        progress.setLevel(logging.INFO)
        progress.propagate = False
        progress.addHandler(progress_handler)
    logging.lastResort = others
    try:
        with warnings.catch_warnings() if quiet else contextlib.nullcontext():
            if quiet:
                warnings.simplefilter("ignore")
            yield
    finally:
        progress.removeHandler(progress_handler)
        progress.setLevel(saved_progress[0])
        progress.propagate = saved_progress[1]
        logger.removeHandler(handler)
        logger.setLevel(saved[0])  # (setLevel, not assignment: it clears the loggers' cached levels)
        logger.propagate = saved[1]
        logging.lastResort = saved[2]


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or closed
        return False


def run_guarded(action, verbose: int) -> int:
    """Run ``action() -> int`` turning flopcount's errors into one line on stderr and their exit codes, an error
    raised while an installed framework imports into one line naming it (exit 11,
    :func:`flopcount.errors.framework_failure`), and any other exception into one "internal error" line (the
    traceback with ``-vv``). Shared by every subcommand."""
    try:
        return action()
    except FlopcountError as e:
        print(f"flopcount: error: {e}", file=sys.stderr)
        return e.exit_code
    except Interrupted as e:  # SIGINT/SIGTERM where a run installed flopcount's handler (its files are closed)
        print(f"flopcount: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("flopcount: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: one line, not a traceback
        failure = framework_failure(e)  # or a framework that is installed but fails to import: exit 11
        if failure is not None:
            print(f"flopcount: error: {failure}", file=sys.stderr)
            return failure.exit_code
        if verbose >= 2:
            raise
        print(
            f"flopcount: internal error: {type(e).__name__}: {e}. Please report it with the model "
            "(rerun with -vv for the traceback).",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def write_output(text: str, path: str | None, what: str = "report") -> None:
    """Write ``text`` to ``path`` whole (:func:`flopcount.output.files.write_atomic`), or to stdout when None; an
    unwritable path is an :class:`OutputError` that leaves the earlier file there as it was."""
    if not path:
        sys.stdout.write(text)
        return
    write_atomic(path, text, what)


def exit_process(code: int) -> NoReturn:
    """End the ``flopcount`` process with ``code``, without tearing the interpreter down object by object.

    After an ``--hf`` count, the torch and transformers modules, the exporter's graphs and sympy's caches hold
    millions of objects; Python's own exit frees each of them, and that took 3 to 6 s of a 20 s Llama-3-70B ledger
    on 2 cores (and 0.1 to 0.3 s of a 100k-node count). Nothing of the work is lost by skipping it: the report is
    already written (stdout is flushed here; ``-o`` files are closed and renamed into place by the time a command
    returns), the exit handlers registered with :mod:`atexit` run first (logging's shutdown, temporary folders'
    finalizers, multiprocessing's children), and then the process ends with ``os._exit``. Where anything else may
    still need the interpreter's normal exit -- another non-daemon thread alive, a torch.distributed process group
    (under torchrun), or a stdout that cannot be flushed (a closed pipe) -- this is ``sys.exit(code)`` as before.
    Only the console entry point calls this: :func:`flopcount.cli.main` from Python returns its code."""
    if not _may_end_now():
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: Python's own exit reports it, as it always did
            sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _may_end_now() -> bool:
    """True where nothing but the interpreter's teardown is left: this is the main thread, no other non-daemon
    thread is alive (the normal exit would wait for it), and no torch.distributed process group is open."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if any(t.is_alive() and not t.daemon and t is not threading.main_thread() for t in threading.enumerate()):
        return False
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return False
    except Exception:  # noqa: BLE001 - a half-imported torch: leave the exit to Python
        return False
    return True
