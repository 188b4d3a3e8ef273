"""``flopcount.measure.ensemble``, the path the README and docs/cluster.md show: :mod:`flopcount.measure.harness.ensemble`."""

from .harness.ensemble import Ensemble, bootstrap, for_bench, layout

__all__ = ["Ensemble", "bootstrap", "for_bench", "layout"]
