"""The meter inside training frameworks (each module imports its framework; this package imports none).

* :mod:`.lightning` ``MeterCallback`` for Lightning's ``Trainer``
* :mod:`.keras` ``MeterCallback`` for Keras's ``fit``
"""

__all__: list[str] = []
