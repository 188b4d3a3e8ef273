"""MLPerf logs: ``:::MLLOG {json}`` lines that MLPerf's compliance checker (``mlperf-logging``, ``python -m
mlperf_logging.compliance_checker --usage training --ruleset 4.0.0 LOG``) accepts.

Each line is ``:::MLLOG {"namespace": "", "time_ms": ..., "event_type": "INTERVAL_START" | "INTERVAL_END" |
"POINT_IN_TIME", "key": ..., "value": ..., "metadata": {"file": ..., "lineno": ...}}``, ``file`` and ``lineno``
naming the call site (the first frame outside the harness: the training loop that stepped, evaluated or started).
One file holds one run, in the order the training ruleset checks:

* the init block (``init_start`` .. ``init_stop``): the submission fields (:class:`Submission`: org, platform,
  division, status, benchmark), ``cache_clear``, the hyperparameters and ``train_samples``/``eval_samples`` (the
  sizes of the training and evaluation sets);
* ``run_start``; per epoch ``block_start`` (``first_epoch_num``, ``epoch_count`` 1), ``epoch_start``/
  ``epoch_stop``, ``eval_start``/``eval_accuracy``/``eval_stop`` and ``block_stop``; ``run_stop`` with ``status``
  success or aborted.

:data:`RULESET` is the ruleset the logs are written for; ``flopcount bench`` records it in the report's config.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from flopcount.errors import OutputError, UsageError
from flopcount.output import files

#: The MLPerf training ruleset whose compliance checker the logs are written for.
RULESET = "4.0.0"
#: The values the ruleset allows.
DIVISIONS = ("closed", "open")
STATUSES = ("cloud", "onprem", "preview", "research")

_INTERVALS = {"run_start": "INTERVAL_START", "run_stop": "INTERVAL_END", "epoch_start": "INTERVAL_START",
              "epoch_stop": "INTERVAL_END", "eval_start": "INTERVAL_START", "eval_stop": "INTERVAL_END",
              "eval_accuracy": "POINT_IN_TIME"}
_HERE = os.path.dirname(os.path.abspath(__file__))
_SKIPPED = (_HERE + os.sep, os.path.abspath(contextlib.__file__))


@dataclass(frozen=True)
class Submission:
    """The submission fields MLPerf's checker requires, each logged once in the init block."""

    org: str
    platform: str
    division: str = "open"
    status: str = "research"
    benchmark: str = "resnet"

    def __post_init__(self):
        for name in ("org", "platform", "benchmark"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name).strip():
                raise UsageError(f"MLPerf log: submission {name} must be a non-empty string, got "
                                 f"{getattr(self, name)!r}")
        if self.division not in DIVISIONS:
            raise UsageError(f"MLPerf log: submission division must be one of {', '.join(DIVISIONS)}, got "
                             f"{self.division!r}")
        if self.status not in STATUSES:
            raise UsageError(f"MLPerf log: submission status must be one of {', '.join(STATUSES)}, got "
                             f"{self.status!r}")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def call_site() -> tuple[str, int]:
    """(file name, line number) of the first frame outside this harness and contextlib: where the training loop
    called the meter (or the writer)."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_SKIPPED):
        frame = frame.f_back
    if frame is None:
        return "?", 0
    return os.path.basename(frame.f_code.co_filename), frame.f_lineno


def check_writable(path: str) -> None:
    """Refuse, before any training, an MLPerf log path whose folder is missing, that is a folder, or where no file
    can be created (an OutputError naming the path; :func:`flopcount.output.files.check_writable`)."""
    files.check_writable(path, "MLPerf log", "--mllog")


class MLLogWriter:
    """Writes one run's MLPerf log to ``path``; subscribe :meth:`on_event` to a :class:`flopcount.Meter`.

    The log is a stream (:class:`flopcount.output.files.LineStream`): each line is flushed as it is written, to a file
    beside ``path`` that :meth:`close` renames over it, so an earlier log at ``path`` stays whole until the run's
    log is. A write that fails (a full disk) ends the log but not the run: :attr:`failed` holds the
    :class:`OutputError`, and :meth:`close` raises it."""

    def __init__(self, path: str, clock=time.time) -> None:
        self.path = path
        self._clock = clock
        self._block: int | None = None  # the first epoch of the open block
        self._stream = files.LineStream(path, "MLPerf log (--mllog)")

    @property
    def failed(self) -> OutputError | None:
        """The error of the write that failed, or None."""
        return self._stream.failed

    def log(self, key: str, value: Any = None, event_type: str = "POINT_IN_TIME",
            metadata: Mapping[str, Any] | None = None) -> None:
        filename, lineno = call_site()
        meta = {"file": filename, "lineno": lineno}
        meta.update(metadata or {})
        record = {"namespace": "", "time_ms": int(self._clock() * 1000), "event_type": event_type, "key": key,
                  "value": value, "metadata": meta}
        self._stream.write(":::MLLOG " + json.dumps(record) + "\n")

    def init(self, submission: Submission, fields: Mapping[str, Any]) -> None:
        """The init block: ``init_start``, the submission fields, ``cache_clear`` (False: flopcount clears no
        cache), ``fields`` (hyperparameters, ``train_samples``, ``eval_samples``) and ``init_stop``."""
        self.log("init_start", None, "INTERVAL_START")
        for name, value in submission.as_dict().items():
            self.log(f"submission_{name}", value)
        self.log("cache_clear", False)
        for key, value in fields.items():
            self.log(key, value)
        self.log("init_stop", None, "INTERVAL_END")

    def on_event(self, event: str, fields: Mapping[str, Any]) -> None:
        """One meter event as MLPerf lines: an epoch opens a block of one epoch, closed after that epoch's
        evaluation (or at the next epoch, or at run_stop)."""
        fields = dict(fields)
        if event == "epoch_start":
            self._close_block()
            self._block = fields.get("epoch_num", 0)
            self.log("block_start", None, "INTERVAL_START", {"first_epoch_num": self._block, "epoch_count": 1})
        if event == "run_stop":
            self._close_block()
        value = fields.pop("value", None)
        self.log(event, value, _INTERVALS[event], fields)
        if event == "eval_stop":
            self._close_block()

    def _close_block(self) -> None:
        if self._block is not None:
            self.log("block_stop", None, "INTERVAL_END", {"first_epoch_num": self._block})
            self._block = None

    def close(self) -> None:
        """Put the log in place, or raise the :class:`OutputError` of the write that failed."""
        self._stream.close()
