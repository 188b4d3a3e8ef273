"""Every real model graph shipped in the onnx wheel counts without error; unsupported ops are listed."""

import glob
import os

import onnx
import pytest

import flopcount

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
MODELS = sorted(
    glob.glob(os.path.join(DATA, "pytorch-converted", "*", "model.onnx"))
    + glob.glob(os.path.join(DATA, "pytorch-operator", "*", "model.onnx"))
)


def test_models_are_shipped():
    assert len(MODELS) > 100


@pytest.mark.parametrize("path", MODELS, ids=[os.path.basename(os.path.dirname(p)) for p in MODELS])
def test_counts_without_error(path):
    r = flopcount.count(path)
    counted = sum(s.nodes for s in r.by_op_type.values())
    assert counted == len(r.nodes) == len(onnx.load(path, load_external_data=False).graph.node)
    for key, n in r.unsupported.items():
        assert r.by_op_type[key].status == "unsupported" and r.by_op_type[key].nodes == n
    # every node with a formula produced a non-negative count; the total is their sum
    assert all(n.cost.flops >= 0 for n in r.nodes)
    assert r.total.flops == sum(n.cost.flops for n in r.nodes)
