"""One exception hierarchy; each class carries the CLI exit code it maps to.

Every message names the file, node or tensor concerned and says what to do.
"""

from __future__ import annotations

import re


class FlopcountError(Exception):
    """Base class of every error flopcount raises on purpose."""

    exit_code = 1


class UsageError(FlopcountError):
    """A command-line value or API argument is malformed (``--input-shape x=8y3``)."""

    exit_code = 2


class ModelFileError(FlopcountError):
    """The file cannot be read as an ONNX model (missing, a directory, empty, not protobuf, truncated)."""

    exit_code = 3


class InvalidGraphError(FlopcountError):
    """The model parses but its graph is malformed (cycle, dangling input, duplicate output, bad attribute)."""

    exit_code = 4


class ShapeError(FlopcountError):
    """A dimension a formula needs is still unknown or invalid after shape resolution."""

    exit_code = 5


class UnsupportedOperatorError(FlopcountError):
    """``strict`` counting met operators that have no formula."""

    exit_code = 6


class OpsetError(FlopcountError):
    """The model needs an opset newer than the installed ``onnx`` package knows."""

    exit_code = 7


class OutputError(FlopcountError):
    """The report cannot be written to ``-o FILE``."""

    exit_code = 8


class RegistryError(FlopcountError):
    """A formula was registered twice, or registration is otherwise inconsistent (a programming error)."""

    exit_code = 70


class FrontendError(FlopcountError):
    """A framework model cannot be exported to ONNX (``--torch``): the framework is missing or its exporter failed."""

    exit_code = 9


class DeviceError(FlopcountError):
    """A device, runtime or measuring tool the command needs is absent or refused: CUDA, onnxruntime-gpu, ``ncu``,
    GPU counter permission. The message says what is missing and how to get it."""

    exit_code = 11


class MeasurementError(FlopcountError):
    """A measurement cannot be made or read: a run file or ncu export that does not parse, a run too short to
    time, a training loop that diverged. The message names the file, run or figure."""

    exit_code = 12


class ConfigError(FlopcountError):
    """A model configuration cannot be read or built here (``--hf``): no such file, no or an unknown
    ``model_type``, code in the model's repository that was not trusted, a Hub id while offline. The message
    names the configuration and what to do."""

    exit_code = 13


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived during a run (what Ctrl-C, SLURM's ``scancel`` and torchrun send to cancel a job),
    raised by the handler a ``flopcount bench`` run and a :class:`flopcount.Meter` used as a context manager
    install. Like ``KeyboardInterrupt`` it is not an ``Exception``, so a loop's ``except Exception`` lets it
    through. :attr:`meter` is the meter of the run it ended (set where the run's ``with meter:`` block saw it);
    the exit code is the shell's for a signal: 128 + its number (130 SIGINT, 143 SIGTERM)."""

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = int(signum)
        try:
            self.signal = signal.Signals(self.signum).name
        except ValueError:
            self.signal = f"signal {self.signum}"
        self.meter = None
        super().__init__(f"interrupted by {self.signal}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


#: Exit code of ``flopcount bench`` when every run completed but some run did not reach its target quality.
EXIT_QUALITY_NOT_REACHED = 10


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def first_line(e: BaseException, limit: int = 300) -> str:
    """The first non-blank line of the message of ``e`` (its type name when it has none), without terminal colour
    codes, its white space folded, cut to ``limit`` characters: the part of an exception a one-line error quotes.

    >>> first_line(ValueError("\\n  bad shape  [2,\\n3]\\ntraceback..."))
    'bad shape [2,'
    >>> first_line(KeyError())
    'KeyError'
    """
    lines = [line.strip() for line in _ANSI.sub("", str(e)).splitlines() if line.strip()]
    text = " ".join(lines[0].split()) if lines else type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def framework_failure(error: BaseException) -> DeviceError | None:
    """The :class:`DeviceError` (exit 11) for ``error`` where it was raised while an installed package other than
    flopcount imported: an ``ImportError`` or ``OSError`` from its native libraries (a CUDA build of torch on a
    machine without the CUDA libraries), a module it needs missing, or any other error of its import. The message
    names the package (the innermost one whose import was under way) and its error; None where ``error`` arose
    anywhere else, or is the package itself not being installed (a ``ModuleNotFoundError`` for its own name).

    Every command's errors pass through it (:func:`flopcount.cli.console.run_guarded`), and so does each place that
    imports a framework and words its absence (:func:`import_framework`)."""
    import sys

    package, tb = None, error.__traceback__
    while tb is not None:  # a module's top-level code runs only while it is imported
        frame = tb.tb_frame
        top = str(frame.f_globals.get("__name__", "")).split(".")[0]
        if frame.f_code.co_name == "<module>" and top not in ("", "__main__", "flopcount") \
                and top not in sys.stdlib_module_names:
            package = top
        tb = tb.tb_next
    if package is None:
        return None
    return DeviceError(f"{package} is installed but cannot be imported: {type(error).__name__}: {first_line(error)}; "
                       f"reinstall it, in a build that suits this machine (on a machine without a GPU, a CPU build)")


def import_framework(name: str):
    """``importlib.import_module(name)`` for a framework flopcount uses (``torch``, ``tensorflow``, ``transformers``
    ...): a ``ModuleNotFoundError`` where it is not installed, for the caller to word (which extra to install); a
    :class:`DeviceError` naming it and its error where it is installed but fails to import
    (:func:`framework_failure`).

    >>> import_framework("no_such_framework")
    Traceback (most recent call last):
    ...
    ModuleNotFoundError: No module named 'no_such_framework'
    """
    import importlib

    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - an import may fail in any way; each is told apart below
        missing = isinstance(e, ModuleNotFoundError) and e.name is not None \
            and (name == e.name or name.startswith(e.name + "."))
        failure = None if missing else framework_failure(e)
        if failure is not None:
            raise failure from None
        raise
