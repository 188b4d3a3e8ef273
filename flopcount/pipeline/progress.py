"""Phases of long work (an export, shape inference, the count), reported while they run.

Library modules report through the ``flopcount.pipeline.progress`` logger and never print: :func:`phase` around a step logs
what it starts and, when it ends, how long it took; :func:`done` logs a step that was timed already. The command
line shows these records on stderr (:func:`flopcount.cli.console.command_logging`): all of them when stderr is a
terminal; where it is not (a pipe, a file, a test), each step that took :data:`SLOW_STEP_S` or more, when it ends
(:func:`slow_step`), so that a long run piped into a file still says where its time goes.

>>> import logging
>>> with phase("shape inference"):
...     pass
>>> logging.getLogger("flopcount.progress").name
'flopcount.progress'
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Iterator

__all__ = ["LOGGER", "SLOW_STEP_S", "done", "phase", "slow_step"]

#: The logger every phase is reported on, at INFO.
LOGGER = logging.getLogger("flopcount.progress")
#: A step that takes this long (seconds) is reported wherever stderr goes, not only on a terminal.
SLOW_STEP_S = 2.0


@contextlib.contextmanager
def phase(what: str) -> Iterator[None]:
    """Report ``what`` as it starts (``what ...``) and, when it ends without an error, its time (``what: 1.2 s``)."""
    if not LOGGER.isEnabledFor(logging.INFO):
        yield
        return
    LOGGER.info("%s ...", what)
    start = time.perf_counter()
    yield
    done(what, time.perf_counter() - start)


def done(what: str, seconds: float) -> None:
    """Report that ``what`` took ``seconds``."""
    LOGGER.info("%s: %.1f s", what, seconds, extra={"seconds": seconds})


def slow_step(record: logging.LogRecord) -> bool:
    """Whether ``record`` is the end of a step that took :data:`SLOW_STEP_S` or more (a filter of the records shown
    where stderr is not a terminal).

    >>> record = lambda seconds: logging.makeLogRecord({"msg": "x", "seconds": seconds})
    >>> slow_step(record(2.5)), slow_step(record(0.3)), slow_step(logging.makeLogRecord({"msg": "x ..."}))
    (True, False, False)
    """
    seconds = getattr(record, "seconds", None)
    return seconds is not None and seconds >= SLOW_STEP_S
