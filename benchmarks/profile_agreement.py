"""How the per-operator profile's time compares with a whole run without the profiler, on the bundled ResNet-50.

Run from the repository root::

    python benchmarks/profile_agreement.py              # 5 profiles of ResNet-50 v1.5, batch 1, one thread
    python benchmarks/profile_agreement.py --repeat 10 --threads 2

Each round runs ``flopcount profile`` (one warm-up run, five timed runs) and prints three times: the median whole run
without the profiler (``run_time_s``), the median of the profiled runs' sums of node times (``profiled_time_s``) and
the sum of the nodes' median times, with the two ratios and the 1-minute load average. On a quiet machine here the
profiled time is within 2 to 7% of the whole run; a machine shared with other jobs moves the two apart, because they
are measured a moment apart (CI once saw 0.038 s profiled against 0.064 s for the whole run). The last line gives the
median and the range of each ratio over the rounds. Nothing asserts: this prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="examples/resnet50-v1.5.onnx")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=5)
    a = parser.parse_args()
    from flopcount.cli import main as cli

    rows = []
    print(f"{'round':>5} {'run ms':>9} {'profiled ms':>12} {'nodes ms':>9} {'profiled/run':>13} {'nodes/profiled':>15} "
          f"{'load':>5}")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "p.json")
        for i in range(a.repeat):
            code = cli(["profile", a.model, "--batch", "1", "--warmup", "1", "--runs", str(a.runs),
                        "--threads", str(a.threads), "--format", "json", "-o", out])
            if code != 0:
                raise SystemExit(f"flopcount profile exited {code}")
            with open(out) as f:
                doc = json.load(f)
            run, profiled = doc["run_time_s"], doc["profiled_time_s"]
            nodes = sum(n["time_s"] for n in doc["nodes"])
            rows.append((profiled / run, nodes / profiled))
            print(f"{i:>5} {run * 1e3:>9.2f} {profiled * 1e3:>12.2f} {nodes * 1e3:>9.2f} {profiled / run:>13.3f} "
                  f"{nodes / profiled:>15.3f} {os.getloadavg()[0]:>5.2f}")
    for k, name in enumerate(("profiled/run", "nodes/profiled")):
        values = [r[k] for r in rows]
        print(f"{name}: median {statistics.median(values):.3f}, range {min(values):.3f} to {max(values):.3f}")


if __name__ == "__main__":
    main()
