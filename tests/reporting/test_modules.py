"""FLOPs per module (:mod:`flopcount.reporting.modules`): scopes read from what exporters write, rows that partition the
count exactly, and FlopCounterMode's own per-module counts as the reference."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.errors import UsageError
from flopcount.reporting.modules import OUTSIDE, OWN

F = TensorProto.FLOAT

# x[2,3] -> enc.layers.0.fc (MatMul 3x5) -> enc.layers.0.act (Relu) -> enc.layers.1.fc (MatMul 5x7)
#        -> enc's own Add of enc.bias[7] -> head (MatMul 7x7), called twice -> Relu in the root's own code
NODES = [  # (TorchScript-style name, metadata name scopes, op, inputs, output)
    ("/enc/layers.0/fc/MatMul", ["", "enc", "enc.layers.0", "enc.layers.0.fc", "matmul"], "MatMul",
     ["x", "enc.layers.0.fc.weight"], "a"),
    ("/enc/layers.0/act/Relu", ["", "enc", "enc.layers.0", "enc.layers.0.act", "relu"], "Relu", ["a"], "b"),
    ("/enc/layers.1/fc/MatMul", ["", "enc", "enc.layers.1", "enc.layers.1.fc", "matmul_1"], "MatMul",
     ["b", "enc.layers.1.fc.weight"], "c"),
    ("/enc/Add", ["", "enc", "add"], "Add", ["c", "enc.bias"], "d"),
    ("/head/MatMul", ["", "head", "matmul_2"], "MatMul", ["d", "head.weight"], "e"),
    ("/head_1/MatMul", ["", "head", "matmul_3"], "MatMul", ["e", "head.weight"], "f"),
    ("/Relu", ["", "relu_1"], "Relu", ["f"], "y"),
]
WEIGHTS = {"enc.layers.0.fc.weight": (3, 5), "enc.layers.1.fc.weight": (5, 7), "enc.bias": (7,), "head.weight": (7, 7)}

L0_FC, L0_ACT, L1_FC = 2 * (2 * 3 * 5), 2 * 5, 2 * (2 * 5 * 7)  # FLOPs: 60, 10, 140
ENC_OWN, HEAD, ROOT_RELU = 2 * 7, 2 * 2 * (2 * 7 * 7), 2 * 7  # 14, 392 (two calls), 14
TOTAL = L0_FC + L0_ACT + L1_FC + ENC_OWN + HEAD + ROOT_RELU


def graph(style: str) -> onnx.ModelProto:
    nodes = []
    for i, (name, scopes, op, ins, out) in enumerate(NODES):
        if style == "names":
            node = helper.make_node(op, ins, [out], name=name)
        elif style == "tf2onnx":  # names under a prefix every node shares (the model's own name)
            node = helper.make_node(op, ins, [out], name="model" + name.replace("/head_1/", "/head/"))
        else:
            node = helper.make_node(op, ins, [out], name=f"node_{i}")
            if style == "metadata":
                node.metadata_props.add(key="pkg.torch.onnx.name_scopes", value=repr(scopes))
        nodes.append(node)
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in WEIGHTS.items()]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 3])],
                          [helper.make_tensor_value_info("y", F, [2, 7])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def rows(report, depth):
    return {r.module: (r.depth, r.parent, r.flops, r.params) for r in report.by_module(depth)}


@pytest.mark.parametrize("style", ["names", "metadata", "tf2onnx"])
def test_rows_from_each_kind_of_scope(style):
    r = flopcount.count(graph(style))
    assert r.total.flops == TOTAL
    assert r.modules.source == ("metadata" if style == "metadata" else "names")
    enc_params, head_params = 3 * 5 + 5 * 7 + 7, 7 * 7  # head.weight counted once for two calls
    assert rows(r, 1) == {
        "enc": (1, "", L0_FC + L0_ACT + L1_FC + ENC_OWN, enc_params),
        "head": (1, "", HEAD, head_params),
        OUTSIDE: (1, "", ROOT_RELU, 0),
    }
    assert rows(r, 2) == {
        "enc": (1, "", L0_FC + L0_ACT + L1_FC + ENC_OWN, enc_params),
        "enc.layers.0": (2, "enc", L0_FC + L0_ACT, 3 * 5),
        "enc.layers.1": (2, "enc", L1_FC, 5 * 7),
        "enc" + OWN: (2, "enc", ENC_OWN, 7),
        "head": (1, "", HEAD, head_params),
        OUTSIDE: (1, "", ROOT_RELU, 0),
    }
    assert rows(r, 3)["enc.layers.0.act"] == (3, "enc.layers.0", L0_ACT, 0)
    assert [x.module for x in r.by_module(3)][:4] == ["enc", "enc.layers.0", "enc.layers.0.fc", "enc.layers.0.act"]


@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_rows_partition_the_count_at_every_depth(depth):
    r = flopcount.count(graph("names"), mode="train")
    out = r.by_module(depth)
    top = [x for x in out if x.depth == 1]
    assert sum((x.total for x in top), flopcount.Cost()) == r.total
    assert sum(x.params for x in top) == r.params
    for parent in out:
        children = [x for x in out if x.parent == parent.module and x.depth == parent.depth + 1]
        if children:
            assert sum((c.total for c in children), flopcount.Cost()) == parent.total
            assert sum(c.params for c in children) == parent.params


def test_backward_belongs_to_the_module_of_its_forward_node():
    r = flopcount.count(graph("names"), mode="train")
    head = next(x for x in r.by_module(1) if x.module == "head")
    # each of head's two calls: dW = dᵀ·dY and dX = dY·Wᵀ, one 2x7x7 product each (its input needs a gradient)
    assert head.backward.macs == 2 * 2 * (2 * 7 * 7)
    assert head.forward.flops == HEAD


def test_a_graph_without_scopes_has_one_row_and_says_why():
    r = flopcount.count(graph("none"))
    assert [(x.module, x.flops, x.params) for x in r.by_module(2)] == [(OUTSIDE, TOTAL, r.params)]
    assert "no module scopes" in r.modules.missing


def test_a_module_really_named_with_a_number_suffix_keeps_its_name():
    m = graph("names")
    # rename head's second call to a module of its own that owns a weight of its own: head_1
    m.graph.node[5].input[1] = "head_1.weight"
    m.graph.initializer.append(numpy_helper.from_array(np.zeros((7, 7), np.float32), "head_1.weight"))
    got = rows(flopcount.count(m), 1)
    assert got["head"][2] == got["head_1"][2] == HEAD // 2


@pytest.mark.parametrize("depth", [0, -1])
def test_depth_below_one_is_a_usage_error(depth):
    with pytest.raises(UsageError, match="depth"):
        flopcount.count(graph("names")).by_module(depth)


@pytest.fixture(scope="module")
def resnet_reference():
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    from flopcount.models.resnet import resnet50

    model = resnet50().eval()
    x = torch.randn(1, 3, 64, 64)
    with FlopCounterMode(display=False) as counter:
        model(x)
    per_module = {k: sum(v.values()) for k, v in counter.get_flop_counts().items()}
    return model, x, per_module


@pytest.mark.slow
@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
def test_resnet50_modules_equal_flop_counter_mode(tmp_path, resnet_reference, exporter):
    """Per module, the dense convention counts what FlopCounterMode counts (products: 2 FLOPs per MAC)."""
    import torch

    model, x, reference = resnet_reference
    path = tmp_path / "resnet50.onnx"
    if exporter == "torchscript":
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17)
    else:  # the exporter's optimiser would fuse each BatchNormalization into its Conv under the BN's scope
        from flopcount.frontends.export import no_tqdm_monitor

        with no_tqdm_monitor():  # its progress bars would leave tqdm's monitor thread running in this process
            torch.onnx.export(model, (x,), path, dynamo=True, opset_version=18, optimize=False)
    r = flopcount.count(str(path), convention="dense")
    assert r.total.flops == reference["Global"]
    for depth in (1, 2):
        out = r.by_module(depth)
        modules = {x.module: x.flops for x in out if not x.module.endswith(OWN) and x.module != OUTSIDE}
        # FlopCounterMode's modules down to this depth that do products (its keys are "ResNet.<path>"; a
        # ResNet's paths have depth - 1 dots: layer1, layer1.0)
        expected = {k[len("ResNet."):]: v for k, v in reference.items()
                    if k.startswith("ResNet.") and k.count(".") <= depth and v}
        assert {k: v for k, v in modules.items() if v} == expected
        assert len(expected) == {1: 6, 2: 6 + (3 + 4 + 6 + 3)}[depth]  # conv1, 4 stages, fc; and 16 blocks
        assert all(x.flops == 0 for x in out if x.module.endswith(OWN) or x.module == OUTSIDE)


def test_json_rows_and_node_modules():
    import json

    from flopcount.output.render import render

    r = flopcount.count(graph("names"), mode="train")
    doc = json.loads(render(r, "json", per_node=True, by_module=2))
    assert doc["schema_version"] == 9
    assert doc["module_scopes"] == {"depth": 2, "source": "names", "missing": None}
    enc = doc["modules"][0]
    assert (enc["module"], enc["depth"], enc["parent"]) == ("enc", 1, None)
    assert enc["forward"]["flops"] == L0_FC + L0_ACT + L1_FC + ENC_OWN
    assert enc["flops"] == enc["forward"]["flops"] + enc["backward"]["flops"]
    assert [m["module"] for m in doc["modules"] if m["parent"] == "enc"] == ["enc.layers.0", "enc.layers.1", "enc" + OWN]
    assert [n["module"] for n in doc["nodes"]] == [
        "enc.layers.0.fc", "enc.layers.0.act", "enc.layers.1.fc", "enc", "head", "head", None]


@pytest.mark.parametrize("fmt", ["table", "markdown", "csv"])
def test_text_formats_show_the_tree(fmt):
    from flopcount.output.render import render

    text = render(flopcount.count(graph("names")), fmt, by_module=2)
    if fmt == "csv":
        lines = text.splitlines()
        assert lines[0].startswith("module,depth,parent,flops")
        assert f"enc.layers.1,2,enc,{L1_FC}," in text and f"{OUTSIDE},1,,{ROOT_RELU}," in text
    else:
        assert "· enc.layers.0" in text and "· · " not in text and "Modules: scopes from the node names" in text


def test_text_says_why_there_is_one_row():
    from flopcount.output.render import render

    assert "Modules: one row: the graph has no module scopes" in render(flopcount.count(graph("none")), by_module=1)


def test_modules_are_listed_where_their_work_runs():
    """A converter may place a late module's weight layout (a free Transpose) before everything else: the module
    is still listed where its work runs."""
    m = graph("names")
    layout = helper.make_node("Transpose", ["head.weight"], ["head.weight.t"], name="/head/Transpose", perm=[1, 0])
    m.graph.node.insert(0, layout)
    for node in m.graph.node:
        if node.op_type == "MatMul" and "head.weight" in node.input:
            node.input[1] = "head.weight.t"
    assert [r.module for r in flopcount.count(m).by_module(1)] == ["enc", "head", OUTSIDE]
