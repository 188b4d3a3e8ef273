"""What ``--memory`` adds to a training count's time, on transformer-like graphs of about N nodes, against the same
count without it in the same run (the baseline), and the ledger's figures.

Run from the repository root::

    python benchmarks/memory_ledger.py                  # 1k, 10k, 50k nodes
    python benchmarks/memory_ledger.py --sizes 1000,5000 --repeat 5

The graphs are ``benchmarks/count_speed.py``'s (stacked pre-norm blocks with external weights never written). Each
time is the median of ``--repeat`` runs after one warm-up, the count with and without the ledger in alternation.
This prints figures; nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

import onnx  # noqa: E402

import flopcount  # noqa: E402
from count_speed import transformer_graph  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1000,10000,50000")
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    print(f"{'nodes':>8} {'count (s)':>10} {'+memory (s)':>12} {'ratio':>6}  peak (phase)  activations kept")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            path = os.path.join(tmp, f"t{n}.onnx")
            onnx.save(transformer_graph(n), path)
            settings = MemorySettings(implementation="foreach")
            plain, ledger = [], []
            report = None
            for k in range(args.repeat + 1):
                t0 = time.perf_counter()
                flopcount.count(path, mode="train", optimizer="adamw")
                t1 = time.perf_counter()
                report = flopcount.count(path, mode="train", optimizer="adamw", memory=settings)
                t2 = time.perf_counter()
                if k:  # the first pair warms up
                    plain.append(t1 - t0)
                    ledger.append(t2 - t1)
            a, b = statistics.median(plain), statistics.median(ledger)
            (r,) = report.memory.ranks
            print(f"{len(report.nodes):>8} {a:>10.2f} {b:>12.2f} {b / a:>6.2f}  {r.peak_bytes / 2**20:,.1f} MiB "
                  f"({r.peak_phase})  {r.activations_bytes / 2**20:,.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
