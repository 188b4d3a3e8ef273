"""Every count that is an upper bound is listed with its reason, in every output format: a Loop counted at its
maximum trip count M while a run-time condition may end it earlier, and a tree ensemble counted along each tree's
deepest path, in one model."""

import csv
import io
import json

import pytest
from helpers import const, model, weight
from onnx import TensorProto, helper

import flopcount
from flopcount.output.render import render

ML = "ai.onnx.ml"
F = TensorProto.FLOAT
B, D, M = 2, 4, 6  # rows, features, the Loop's maximum trip count


def bounded_model():
    """Loop(M = 6, a condition from the graph input ``go``): h = h @ W[4, 4] per trip (2·B·D·D FLOPs), its body's
    condition passed on; then a TreeEnsembleRegressor of one tree of depth 2 on h."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h_in", "W"], ["h_out"]), helper.make_node("Identity", ["c_in"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F, [B, D])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_out", F, [B, D])],
    )  # fmt: skip
    loop = helper.make_node("Loop", ["M", "go", "h0"], ["h"], body=body, name="steps")
    # one tree: 0 → (1, 2), 1 → (3, 4); leaves 2, 3, 4, one weight each
    tree = helper.make_node(
        "TreeEnsembleRegressor", ["h"], ["y"], domain=ML, name="trees", n_targets=1,
        nodes_treeids=[0] * 5, nodes_nodeids=[0, 1, 2, 3, 4], nodes_featureids=[0, 1, 0, 0, 0],
        nodes_values=[0.5, 0.2, 0.0, 0.0, 0.0], nodes_modes=["BRANCH_LEQ", "BRANCH_LT", "LEAF", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 3, 0, 0, 0], nodes_falsenodeids=[2, 4, 0, 0, 0],
        target_treeids=[0, 0, 0], target_nodeids=[2, 3, 4], target_ids=[0, 0, 0], target_weights=[1.0] * 3)  # fmt: skip
    m = model([loop, tree], {"h0": (B, D)}, ["y"], [weight("W", (D, D)), const("M", M)], extra_opsets={ML: 3})
    m.graph.input.append(helper.make_tensor_value_info("go", TensorProto.BOOL, []))
    return m


@pytest.fixture(scope="module")
def report():
    return flopcount.count(bounded_model())


def test_both_bounds_are_counted_at_their_maximum(report):
    loop, trees = report.nodes
    assert loop.cost.flops == M * 2 * B * D * D
    assert trees.cost.flops == B * (2 + 1)  # the deepest path's 2 comparisons, one leaf weight added
    assert {k: n for k, (n, _) in report.upper_bounds.items()} == {"Loop": 1, f"{ML}:TreeEnsembleRegressor": 1}
    assert "condition" in report.upper_bounds["Loop"][1]
    assert "deepest path" in report.upper_bounds[f"{ML}:TreeEnsembleRegressor"][1]


def test_json_lists_them_by_operator_and_per_node(report):
    doc = json.loads(render(report, "json", per_node=True))
    assert doc["upper_bounds"] == {k: {"nodes": n, "why": why} for k, (n, why) in report.upper_bounds.items()}
    assert [n.get("upper_bound") for n in doc["nodes"]] == [n.bound for n in report.nodes]


def test_csv_gives_each_its_reason(report):
    rows = {r["op_type"]: r["upper_bound"] for r in csv.DictReader(io.StringIO(render(report, "csv")))}
    assert rows == {"Loop": report.upper_bounds["Loop"][1],
                    "TreeEnsembleRegressor": report.upper_bounds[f"{ML}:TreeEnsembleRegressor"][1]}
    nodes = {r["name"]: r["upper_bound"] for r in csv.DictReader(io.StringIO(render(report, "csv", per_node=True)))}
    assert nodes == {n.name: n.bound for n in report.nodes}


@pytest.mark.parametrize("fmt", ["table", "markdown", "html"])
def test_text_formats_state_every_reason(report, fmt):
    from html import escape

    text = render(report, fmt)
    for key, (_, why) in report.upper_bounds.items():
        assert key in text and (escape(why) if fmt == "html" else why) in text
