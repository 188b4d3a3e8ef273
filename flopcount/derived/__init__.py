"""Counts made from other counts. They sit above :func:`flopcount.count`, the report records and the memory ledger;
only frontends and the CLI import them.

* :mod:`.extension` a count of L identical layers from counts of 1 and 2 (``--hf``)
* :mod:`.symbolic` the count as exact formulas in dims given as names (``--symbolic``)
"""

__all__: list[str] = []
