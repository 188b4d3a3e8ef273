"""Counting a hybrid model's export: the time of ``flopcount.count`` on a Qwen3-Next graph (gated-delta-rule linear
attention beside full attention, a mixture of experts), once exported, against the same count with the slice guard
inferring depth by depth as it did before (the baseline, in the same run).

Run from the repository root (needs ``transformers`` with ``Qwen3NextConfig``; nothing is downloaded: a tiny
configuration is built, exported once through :func:`flopcount.from_hf` into a temporary cache, and its ``.onnx``
counted)::

    python benchmarks/hybrid_count.py                 # 4 layers (3 linear-attention, 1 full), 3 repeats
    python benchmarks/hybrid_count.py --layers 8 --repeats 5

It prints the graph's node and Slice counts, and the median of ``--repeats`` counts after one warm-up, for the guard as it is (one inference in a
child process per round) and for the baseline (``FLOPCOUNT_PARALLEL=0``: no child, so depth by depth). The target
the issue set: a 5k-node hybrid model counts in under 3 s after its export, on a 2-core machine. Nothing asserts:
this prints figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path


def export(layers: int, cache: Path) -> Path:
    """The whole-model export of a tiny Qwen3-Next (every ``full_attention_interval``-th layer full attention)."""
    os.environ["FLOPCOUNT_CACHE"] = str(cache)
    from transformers import Qwen3NextConfig

    from flopcount.frontends.hf import from_hf

    types = ["full_attention" if (k + 1) % 4 == 0 else "linear_attention" for k in range(layers)]
    config = Qwen3NextConfig(
        num_hidden_layers=layers, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, vocab_size=128, layer_types=types,
    )
    from_hf(config, {"input_ids": (1, 16)}, repeated_layers="export")
    (path,) = sorted(cache.glob("*.onnx"), key=lambda p: p.stat().st_size)[-1:]
    return path


def timed(path: Path, repeats: int, parallel: str) -> list[float]:
    import flopcount

    os.environ["FLOPCOUNT_PARALLEL"] = parallel
    times = []
    for k in range(repeats + 1):
        t0 = time.perf_counter()
        flopcount.count(str(path))
        if k:  # the first is a warm-up
            times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    import onnx

    with tempfile.TemporaryDirectory() as folder:
        path = export(args.layers, Path(folder))
        graph = onnx.load(str(path), load_external_data=False).graph
        slices = sum(n.op_type == "Slice" for n in graph.node)
        print(f"Qwen3-Next, {args.layers} layers: {len(graph.node)} nodes, {slices} Slices")
        now = timed(path, args.repeats, "1")
        before = timed(path, args.repeats, "0")
    print(f"count after export, guard inferring once (median of {args.repeats}): {statistics.median(now):.2f} s")
    print(f"count after export, depth by depth (baseline, FLOPCOUNT_PARALLEL=0): {statistics.median(before):.2f} s")
    print(f"speed-up: {statistics.median(before) / statistics.median(now):.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
