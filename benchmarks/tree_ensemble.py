"""Time and peak memory of counting a large tree ensemble, against a bare ``onnx.load`` of the same file.

Run from the repository root::

    python benchmarks/tree_ensemble.py                      # 9,988 trees, about 194 MB (a LightGBM export's size)
    python benchmarks/tree_ensemble.py --trees 1000         # a quicker look
    python benchmarks/tree_ensemble.py --repeat 3

The model is an ``ai.onnx.ml`` TreeEnsembleClassifier written with onnx.helper and numpy (no LightGBM needed):
``--trees`` trees of ``--leaves`` leaves each, laid out as complete binary trees (node i branches to 2i + 1 and
2i + 2), over ``--classes`` classes, as a multi-class gradient-boosting export writes it (one tree per class per
round, one class weight per leaf). Every node carries the attributes such exports carry (tree and node ids, mode,
feature, threshold, both children, hit rate, missing-value tracking), so the file has the size and shape of a real
one.

Each measurement runs in a fresh interpreter: (a) ``onnx.load`` of the file, (b) ``flopcount.count`` of it. Its wall
time is the whole process's, imports included, and its peak memory the process's peak RSS (``os.wait4``). The
figures are medians of ``--repeat`` runs; the ratios are (b) over (a). The target is at most 2 for both. This is a
benchmark that prints figures, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

MB = 1024 * 1024
TARGET_RATIO = 2.0

LOAD = "import sys, onnx; onnx.load(sys.argv[1])"
COUNT = "import sys, flopcount; flopcount.count(sys.argv[1])"


def make_ensemble(trees: int, leaves: int, classes: int, features: int, seed: int = 0) -> onnx.ModelProto:
    """A TreeEnsembleClassifier of ``trees`` complete binary trees of ``leaves`` leaves each (``2 * leaves - 1``
    nodes: node i branches to 2i + 1 and 2i + 2 while i < leaves - 1), tree t scoring class t mod ``classes``, on
    inputs [N, ``features``]."""
    rng = np.random.default_rng(seed)
    nodes = 2 * leaves - 1
    ids = np.arange(nodes, dtype=np.int64)
    branch = ids < leaves - 1
    total = trees * nodes
    tree_ids = np.repeat(np.arange(trees, dtype=np.int64), nodes)
    node_ids = np.tile(ids, trees)
    true_ids = np.tile(np.where(branch, 2 * ids + 1, 0), trees)
    false_ids = np.tile(np.where(branch, 2 * ids + 2, 0), trees)
    modes = [b"BRANCH_LEQ" if b else b"LEAF" for b in branch] * trees
    leaf_ids = ids[~branch]
    attrs = dict(
        nodes_treeids=tree_ids.tolist(),
        nodes_nodeids=node_ids.tolist(),
        nodes_modes=modes,
        nodes_featureids=np.where(np.tile(branch, trees), rng.integers(0, features, total), 0).tolist(),
        nodes_values=rng.standard_normal(total).astype(np.float32).tolist(),
        nodes_hitrates=np.ones(total, dtype=np.float32).tolist(),
        nodes_missing_value_tracks_true=rng.integers(0, 2, total).tolist(),
        nodes_truenodeids=true_ids.tolist(),
        nodes_falsenodeids=false_ids.tolist(),
        class_treeids=np.repeat(np.arange(trees, dtype=np.int64), leaves).tolist(),
        class_nodeids=np.tile(leaf_ids, trees).tolist(),
        class_ids=np.repeat(np.arange(trees, dtype=np.int64) % classes, leaves).tolist(),
        class_weights=rng.standard_normal(trees * leaves).astype(np.float32).tolist(),
        classlabels_int64s=list(range(classes)),
        post_transform="SOFTMAX",
    )
    node = helper.make_node("TreeEnsembleClassifier", ["X"], ["label", "probabilities"], domain="ai.onnx.ml",
                            name="ensemble", **attrs)
    graph = helper.make_graph(
        [node], "trees", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, features])],
        [helper.make_tensor_value_info("label", TensorProto.INT64, [1]),
         helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, classes])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.ml", 3)],
                             producer_name="flopcount-benchmark")


def measure(code: str, path: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of a fresh interpreter running ``code`` on ``path``."""
    start = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-c", code, path])
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if process.returncode:
        raise SystemExit(f"{code!r} exited with {process.returncode}")
    return seconds, usage.ru_maxrss / 1024  # KiB on Linux


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", type=int, default=9988)
    parser.add_argument("--leaves", type=int, default=255)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--write", metavar="PATH", help=argparse.SUPPRESS)  # the writing child (see below)
    args = parser.parse_args(argv)
    if args.write:
        onnx.save_model(make_ensemble(args.trees, args.leaves, args.classes, args.features), args.write)
        return
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "ensemble.onnx")
        # written by a child, so that this process stays small: a measured child starts as a copy of it
        sizes = [f"--{k}={getattr(args, k)}" for k in ("trees", "leaves", "classes", "features")]
        subprocess.run([sys.executable, __file__, *sizes, "--write", path], check=True)
        size = os.path.getsize(path) / MB
        print(f"TreeEnsembleClassifier: {args.trees:,} trees x {2 * args.leaves - 1} nodes, {size:.0f} MB")
        measure(LOAD, path)  # warm-up: the file in the page cache
        runs = {"onnx.load": [], "flopcount.count": []}
        for _ in range(args.repeat):
            for name, code in (("onnx.load", LOAD), ("flopcount.count", COUNT)):
                runs[name].append(measure(code, path))
        figures = {name: (statistics.median(s for s, _ in r), statistics.median(m for _, m in r))
                   for name, r in runs.items()}
        for name, (seconds, peak) in figures.items():
            print(f"{name:16s} {seconds:7.2f} s  {peak:8.0f} MB peak RSS")
        (load_s, load_mb), (count_s, count_mb) = figures["onnx.load"], figures["flopcount.count"]
        print(f"{'ratio':16s} {count_s / load_s:7.2f} x  {count_mb / load_mb:8.2f} x      (target: at most "
              f"{TARGET_RATIO:g}x each)")


if __name__ == "__main__":
    main()
