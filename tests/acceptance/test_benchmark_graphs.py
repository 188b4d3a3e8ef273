"""The speed benchmark's graph kinds (benchmarks/count_speed.py ``--floor --kinds``) count whole
(weights absent, as the benchmark writes them): every node shaped and costed (strict), and the CNN's convolutions and the ViT's products
equal to their closed forms (so a benchmark never times a graph the counter refuses or half-counts)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import flopcount

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
count_speed = pytest.importorskip("count_speed")


@pytest.mark.parametrize("kind", sorted(count_speed.GRAPH_KINDS))
def test_each_kind_counts_whole(kind, tmp_path):
    model = count_speed.GRAPH_KINDS[kind](300)
    path = tmp_path / f"{kind}.onnx"
    path.write_bytes(model.SerializeToString())
    report = flopcount.count(str(path), strict=True)
    assert len(report.nodes) == len(model.graph.node) and report.forward.flops > 0


def test_the_cnn_and_vit_products_in_closed_form(tmp_path):
    cs = count_speed
    cnn = cs.cnn_graph(300)
    blocks = (len(cnn.graph.node) - 3) // cs.CNN_NODES_PER_BLOCK
    c, side = cs.CNN_CHANNELS, cs.CNN_SIDE
    per_conv = 2 * c * 9 * side * side  # per input channel
    path = tmp_path / "cnn.onnx"
    path.write_bytes(cnn.SerializeToString())
    convs = sum(n.cost.flops for n in flopcount.count(str(path)).nodes if n.op_type == "Conv")
    assert convs == per_conv * (3 + 2 * blocks * c)  # the stem's 3 input channels, then 2 convolutions a block

    vit = cs.vit_graph(300)
    blocks = (len(vit.graph.node) - 6) // cs.VIT_NODES_PER_BLOCK  # patches, class token, positions; final norm
    tokens, h, f = (cs.IMAGE // cs.PATCH) ** 2 + 1, cs.HIDDEN, cs.FFN
    path = tmp_path / "vit.onnx"
    path.write_bytes(vit.SerializeToString())
    products = sum(n.cost.flops for n in flopcount.count(str(path)).nodes if n.op_type == "MatMul")
    per_block = 2 * tokens * (4 * h * h + 2 * h * f) + 2 * 2 * tokens * tokens * h  # projections, MLP, QK^T and PV
    assert products == blocks * per_block
