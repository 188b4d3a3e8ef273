"""Phases of long work (an export, shape inference, the count), reported while they run.

Library modules report through the ``flopcount.pipeline.progress`` logger and never print: :func:`phase` around a step logs
what it starts and, when it ends, how long it took; :func:`done` logs a step that was timed already. The command
line shows these records on stderr when stderr is a terminal (:func:`flopcount.cli.console.command_logging`) and
nothing when it is not (a pipe, a file, a test), unless ``-v`` asks for INFO records.

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

__all__ = ["LOGGER", "done", "phase"]

#: The logger every phase is reported on, at INFO.
LOGGER = logging.getLogger("flopcount.progress")


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
    LOGGER.info("%s: %.1f s", what, seconds)
