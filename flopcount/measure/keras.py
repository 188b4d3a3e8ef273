"""``flopcount.measure.keras.MeterCallback``, the path the README shows: :mod:`flopcount.measure.harness.callbacks.keras`."""

from .harness.callbacks.keras import MeterCallback

__all__ = ["MeterCallback"]
