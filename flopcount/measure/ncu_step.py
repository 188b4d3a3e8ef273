"""``python -m flopcount.measure.ncu_step``: the program ``flopcount crosscheck`` prints and runs under ncu (the
command line docs/crosscheck.md shows). Kept at this path for that command; the program is
:mod:`flopcount.cli.ncu_step`, the profiled step :mod:`flopcount.measure.ncu.step`."""

import sys

from flopcount.cli.ncu_step import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
