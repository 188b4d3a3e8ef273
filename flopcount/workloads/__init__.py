"""Training loops of the benchmark workloads (`flopcount bench NAME`), apart from the model definitions in
:mod:`flopcount.models`. They drive a :class:`flopcount.Meter` (:mod:`flopcount.measure.harness`), so they stand
above the harness, never inside it.

* :mod:`.common` the configuration record and the timed training loop every workload shares
* :mod:`.digits` a small CNN on scikit-learn's bundled digits, trained to a target accuracy (real data)
* :mod:`.imagefolder` ResNet-50 on the user's ImageFolder (``--data DIR``), to a target accuracy on its evaluation split
* :mod:`.synthetic` ResNet-50 and the extreme-weather detector on synthetic data of their real shapes
"""

__all__: list[str] = []
