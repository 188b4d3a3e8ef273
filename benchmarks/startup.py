"""How long ``flopcount --help`` takes to start (target: under 0.3 s), beside a bare ``python -c pass`` measured
alternately in the same run, and what ``import flopcount`` loads.

    python benchmarks/startup.py [--repeat 7]

Prints the median whole-process wall and CPU time of each, the difference (flopcount's own start-up), and the modules
``import flopcount`` leaves in ``sys.modules`` that are heavy (torch, onnx, numpy, networkx, the measuring half).
On a loaded machine both medians grow; the difference is the figure to compare.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "onnx", "numpy", "networkx", "tensorflow", "transformers", "flopcount.measure", "flopcount.counting")


def wall(command: list[str]) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of one run of ``command``; CPU time moves less with the machine's load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return elapsed, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    commands = {"python -c pass": [sys.executable, "-c", "pass"],
                "flopcount --help": [sys.executable, "-m", "flopcount", "--help"]}
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
    wall(commands["flopcount --help"])  # warm the file cache
    for _ in range(args.repeat):
        for name, command in commands.items():  # alternately, so a change of load hits both
            times[name].append(wall(command))
    medians = {name: (statistics.median(w for w, _ in ts), statistics.median(c for _, c in ts))
               for name, ts in times.items()}
    for name, (w, c) in medians.items():
        print(f"{name:18s} median wall {w:.3f} s, CPU {c:.3f} s over {args.repeat} runs")
    (w, c), (w0, c0) = medians["flopcount --help"], medians["python -c pass"]
    print(f"flopcount --help: whole process {w:.3f} s wall, {c:.3f} s CPU (target 0.3 s); "
          f"flopcount's own start-up {w - w0:.3f} s wall, {c - c0:.3f} s CPU")
    probe = "import json, sys, flopcount; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                           text=True).stdout))
    print("import flopcount loads:", ", ".join(m for m in HEAVY if m in loaded) or "none of " + ", ".join(HEAVY))
    return 0


if __name__ == "__main__":
    sys.exit(main())
