"""``flopcount.measure.lightning.MeterCallback``, the path the README shows: :mod:`flopcount.measure.harness.callbacks.lightning`."""

from .harness.callbacks.lightning import MeterCallback

__all__ = ["MeterCallback"]
