"""A report written out. It imports every room below it.

* :mod:`.render` the report's text forms (table, JSON, CSV; the memory and per-rank tables)
* :mod:`.ranks` a plan's summary first (the most a rank holds against the device, the slowest rank, the MFU
  ceiling, the classes of ranks), and its table per rank in CSV
* :mod:`.html` the report as one self-contained HTML page
* :mod:`.pictures` a plan's sections of the page: its tables and pictures (FLOPs and memory per rank, the pipeline
  schedule) in inline SVG
* :mod:`.files` the one writer of every file flopcount writes (temporary file, fsync, rename)
* :mod:`.docs` generates docs/operators.md
"""

__all__: list[str] = []
