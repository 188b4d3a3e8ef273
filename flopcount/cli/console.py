"""What every command shares around its work: logging to stderr, errors turned into one line and an exit code,
and writing the report to ``-o FILE`` or stdout."""

from __future__ import annotations

import logging
import sys

from flopcount.errors import FlopcountError, OutputError

__all__ = ["EXIT_INTERNAL", "run_guarded", "setup_logging", "write_output"]

EXIT_INTERNAL = 1


def setup_logging(verbose: int) -> None:
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)],
        format="flopcount: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def run_guarded(action, verbose: int) -> int:
    """Run ``action() -> int`` turning flopcount's errors into one line on stderr and their exit codes, and any
    other exception into one "internal error" line (the traceback with ``-vv``). Shared by every subcommand."""
    try:
        return action()
    except FlopcountError as e:
        print(f"flopcount: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("flopcount: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: one line, not a traceback
        if verbose >= 2:
            raise
        print(
            f"flopcount: internal error: {type(e).__name__}: {e}. Please report it with the model "
            "(rerun with -vv for the traceback).",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def write_output(text: str, path: str | None) -> None:
    """Write ``text`` to ``path`` (stdout when None); an unwritable path is an :class:`OutputError`."""
    if not path:
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise OutputError(f"{path}: cannot write the report ({e.strerror})") from None
