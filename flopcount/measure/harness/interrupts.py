"""SIGINT and SIGTERM turned into :class:`flopcount.errors.Interrupted`, so that a cancelled run ends cleanly.

SLURM's ``scancel``, torchrun and a batch system's time limit send SIGTERM, whose default action ends the process at
once: no MLPerf ``run_stop``, no report. While :func:`on_signals` is active, both signals raise
:class:`~flopcount.errors.Interrupted` in the main thread instead; the run's ``with meter:`` block closes the
meter (``run_stop`` with ``status: aborted``) and the caller writes what was measured. The first signal puts the
earlier handlers back, so a second one acts as it would have without flopcount (Ctrl-C twice ends at once).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from flopcount.errors import Interrupted

__all__ = ["SIGNALS", "on_signals"]

#: The signals that end a run cleanly.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def on_signals() -> Iterator[None]:
    """While the block runs, :data:`SIGNALS` raise :class:`~flopcount.errors.Interrupted` (only the main thread
    can take signals; elsewhere, and where a handler cannot be set, this does nothing). The earlier handlers are
    put back when the block ends, and at the first signal. Inside an active block (a meter's within a bench run)
    it does nothing: the outer block's handlers stay, and one signal raises once."""
    if threading.current_thread() is not threading.main_thread() or getattr(
            signal.getsignal(signal.SIGTERM), "flopcount_interrupt", False):
        yield
        return
    earlier = {s: signal.getsignal(s) for s in SIGNALS}

    def restore() -> None:
        for s, handler in earlier.items():
            with contextlib.suppress(ValueError, TypeError, OSError):
                signal.signal(s, handler if handler is not None else signal.SIG_DFL)

    def interrupt(signum, frame) -> None:
        restore()
        raise Interrupted(signum)

    interrupt.flopcount_interrupt = True  # type: ignore[attr-defined]

    try:
        for s in SIGNALS:
            signal.signal(s, interrupt)
    except (ValueError, OSError):  # not settable here (an embedded interpreter)
        restore()
        yield
        return
    try:
        yield
    finally:
        restore()
