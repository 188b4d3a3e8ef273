"""A report written out. It imports every room below it.

* :mod:`.render` the report's text forms (table, JSON, CSV; the memory and per-rank tables)
* :mod:`.html` the report as one self-contained HTML page
* :mod:`.files` the one writer of every file flopcount writes (temporary file, fsync, rename)
* :mod:`.docs` generates docs/operators.md
"""

__all__: list[str] = []
