"""Counting a configuration of 10**5 and 10**9 layers: whole-process times and peak memory, and the count against
its closed form from whole exports of 1 and 2 layers.

Run from the repository root (needs ``transformers``; the models are built on the meta device)::

    python benchmarks/many_layers.py                  # 10**5 and 10**9 layers, inference and training
    python benchmarks/many_layers.py --layers 100000 --runs 5

The model is a small ``LlamaForCausalLM`` (hidden 64, MLP 128, 4 heads, vocabulary 256) with ``num_hidden_layers``
set to L. Each figure is one whole ``flopcount --hf CONFIG --input-shape input_ids=1x8 --mode MODE --format json``
process (imports, the probe, the 1- and 2-layer exports and the extension to L), timed from outside with its peak
RSS from ``wait4``: first with the export cache off (``FLOPCOUNT_CACHE=0``), then ``--runs`` times with a warm
cache folder (the median is printed). A report of L layers holds its repeated layers once
(:class:`flopcount.reporting.tiled.Tiled`), so neither figure grows with L.

The closed form: ``C(L) = C(1) + (L − 1)·(C(2) − C(1))`` for the total FLOPs and the parameters, where C(1) and C(2)
are counts of the 1- and 2-layer configurations exported whole (``--repeated-layers export``). Nothing asserts:
this prints figures and whether each count equals its closed form.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def config(layers: int) -> dict:
    import transformers

    document = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                        num_key_value_heads=4, num_hidden_layers=layers, vocab_size=256,
                                        max_position_embeddings=64).to_dict()
    document["architectures"] = ["LlamaForCausalLM"]
    return document


def run(path: Path, mode: str, cache: str, *extra: str) -> tuple[dict, float, float]:
    """One whole ``flopcount --hf`` process: its JSON report, wall seconds and peak RSS in MB."""
    command = [sys.executable, "-m", "flopcount", "--hf", str(path), "--input-shape", "input_ids=1x8",
               "--mode", mode, "--format", "json", *extra]
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=dict(os.environ, FLOPCOUNT_CACHE=cache),
                                   text=True)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - t0
        if os.waitstatus_to_exitcode(status):
            err.seek(0)
            sys.exit(f"{' '.join(command)} failed: {err.read().strip()}")
        out.seek(0)
        return json.loads(out.read()), wall, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[10**5, 10**9])
    parser.add_argument("--modes", nargs="+", default=["inference", "train"])
    parser.add_argument("--runs", type=int, default=3, help="warm-cache runs per figure (median printed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder, cache = Path(tmp), str(Path(tmp) / "cache")
        paths = {}
        for n in {1, 2, *args.layers}:
            paths[n] = folder / f"llama-{n}.json"
            paths[n].write_text(json.dumps(config(n)))
        print(f"{'layers':>13} {'mode':>9} {'cold s':>7} {'MB':>6} {'warm s (median)':>16} {'MB':>6}  closed form")
        for mode in args.modes:
            one, two = (run(paths[n], mode, "0", "--repeated-layers", "export")[0] for n in (1, 2))
            for layers in args.layers:
                doc, cold, cold_mb = run(paths[layers], mode, "0")
                warm = [run(paths[layers], mode, cache) for _ in range(args.runs + 1)][1:]  # the first fills it
                ok = all(doc["total"][k] == one["total"][k] + (layers - 1) * (two["total"][k] - one["total"][k])
                         for k in ("flops", "params"))
                print(f"{layers:>13,} {mode:>9} {cold:>7.2f} {cold_mb:>6.0f} "
                      f"{statistics.median(w[1] for w in warm):>16.2f} {max(w[2] for w in warm):>6.0f}  "
                      f"{'equal' if ok else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
