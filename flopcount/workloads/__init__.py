"""Training loops of the benchmark workloads (`flopcount bench NAME`), apart from the model definitions in
:mod:`flopcount.models`."""
