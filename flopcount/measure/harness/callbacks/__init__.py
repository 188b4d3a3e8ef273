"""The meter inside training frameworks (each module imports its framework; this package imports none).

* :mod:`.lightning` ``MeterCallback`` for Lightning's ``Trainer`` (public path ``flopcount.measure.lightning``)
* :mod:`.keras` ``MeterCallback`` for Keras's ``fit`` (public path ``flopcount.measure.keras``)
"""

__all__: list[str] = []
