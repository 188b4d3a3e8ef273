"""How long ``flopcount --help`` takes to start (target: under 0.3 s), beside a bare ``python -c pass`` measured
alternately in the same run, and what ``import flopcount`` loads.

    python benchmarks/startup.py [--repeat 7]

Prints the median whole-process wall time of each, the difference (flopcount's own start-up), and the modules
``import flopcount`` leaves in ``sys.modules`` that are heavy (torch, onnx, numpy, networkx, the measuring half).
On a loaded machine both medians grow; the difference is the figure to compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "onnx", "numpy", "networkx", "tensorflow", "transformers", "flopcount.measure", "flopcount.counting")


def wall(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    commands = {"python -c pass": [sys.executable, "-c", "pass"],
                "flopcount --help": [sys.executable, "-m", "flopcount", "--help"]}
    times: dict[str, list[float]] = {name: [] for name in commands}
    wall(commands["flopcount --help"])  # warm the file cache
    for _ in range(args.repeat):
        for name, command in commands.items():  # alternately, so a change of load hits both
            times[name].append(wall(command))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    for name, median in medians.items():
        print(f"{name:18s} median {median:.3f} s over {args.repeat} runs (min {min(times[name]):.3f} s)")
    own = medians["flopcount --help"] - medians["python -c pass"]
    print(f"flopcount's own start-up: {own:.3f} s; whole process {medians['flopcount --help']:.3f} s (target 0.3 s)")
    probe = "import json, sys, flopcount; print(json.dumps(sorted(sys.modules)))"
    loaded = set(json.loads(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                                           text=True).stdout))
    print("import flopcount loads:", ", ".join(m for m in HEAVY if m in loaded) or "none of " + ", ".join(HEAVY))
    return 0


if __name__ == "__main__":
    sys.exit(main())
