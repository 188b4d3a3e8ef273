"""The records a count hands back. It imports only the formula contract (cost, conventions, context, errors).

* :mod:`.report` the immutable :class:`~flopcount.reporting.report.Report` and its node and per-op records
* :mod:`.modules` the module scopes an exporter wrote, and the per-module rows of a report
* :mod:`.generation` what ``generate()`` costs (prefill, decode steps)
* :mod:`.moe` mixture-of-experts layers (params, active params, capacity)
* :mod:`.layers` how a stack of identical layers was counted (extended from 1 and 2 layers, or whole)
* :mod:`.tiled` a sequence of repeated items held once, its copies made when read (the nodes of L repeated layers)
"""

__all__: list[str] = []
