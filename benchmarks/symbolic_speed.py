"""How long ``flopcount MODEL --symbolic`` takes on a transformer of about 1,000 nodes (target: under 2 s), whole
process, median of several runs, and the formula it finds checked against a direct count at a size it never saw.

    python benchmarks/symbolic_speed.py [--nodes 1000] [--repeat 3]

The model is the GPT-2 of ``models/`` (hidden 64, 4 heads), exported by the TorchScript exporter with the batch
and the sequence length as dynamic dims (``B``, ``S``), with as many layers as reach the node count.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def export(path: Path, nodes: int) -> int:
    import onnx
    import torch

    from flopcount.models.transformer import gpt2

    layers = 1
    while True:
        model = gpt2(layers=layers, hidden=64, heads=4, vocab=100, context=1024).eval()
        torch.onnx.export(model, (torch.zeros(2, 8, dtype=torch.int64),), str(path), dynamo=False, opset_version=17,
                          input_names=["input_ids"], dynamic_axes={"input_ids": {0: "B", 1: "S"}})
        count = len(onnx.load(str(path), load_external_data=False).graph.node)
        if count >= nodes:
            return count
        layers = max(layers + 1, int(layers * nodes / count))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args(argv)
    import flopcount

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gpt2.onnx"
        nodes = export(path, args.nodes)
        times, doc = [], None
        for _ in range(args.repeat):
            start = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "flopcount", str(path), "--symbolic", "--format", "json"],
                                 capture_output=True, text=True, check=True)
            times.append(time.perf_counter() - start)
            doc = json.loads(out.stdout)
        direct = flopcount.count(str(path), input_shapes={"input_ids": (3, 101)}).total.flops
        terms = doc["formula"]["terms"]
        value = sum(int(t["coefficient"]) * 3 ** t["powers"][0] * 101 ** t["powers"][1] for t in terms)
    print(f"model: GPT-2 of models/, {nodes} nodes, dims B and S")
    print(f"formula: {len(terms)} terms from {doc['counted']} counts; at B=3, S=101 it gives {value:,}, a direct "
          f"count {direct:,} ({'equal' if value == direct else 'DIFFERENT'})")
    print(f"whole process: median {statistics.median(times):.2f} s (min {min(times):.2f}, max {max(times):.2f}; "
          f"target 2 s)")
    return 0 if value == direct else 1


if __name__ == "__main__":
    sys.exit(main())
