"""Weights held in ``Constant`` nodes: counted like initializers, never refused.

A weight-sized tensor in a node attribute loses its data at load, as every weight does. ONNX's checker
sees the tensor as written before that (its value field, type and length), and the schema check
afterwards is told the tensor had a value, so no check depends on whether data was dropped.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.errors import InvalidGraphError

N = helper.make_node
F = TensorProto.FLOAT

# Conv of a 1x8x32x32 input with a 16x8x3x3 weight (1,152 elements: over the loader's 1,024 limit).
CONV_MACS = 16 * 8 * 3 * 3 * 30 * 30  # C_out · C_in · K · K · H_out · W_out = 1,036,800
CONV_PARAMS = 16 * 8 * 3 * 3


def _weight(name="w", dims=(16, 8, 3, 3)) -> TensorProto:
    return numpy_helper.from_array(np.random.default_rng(0).standard_normal(dims).astype(np.float32), name)


def _model(nodes, inputs, outputs, opset=13, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs], list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def conv_from_constant(tensor: TensorProto | None = None) -> onnx.ModelProto:
    """The issue's reproduction: a Conv whose weight comes from a Constant node."""
    return _model([N("Constant", [], ["w"], value=tensor if tensor is not None else _weight()),
                   N("Conv", ["x", "w"], ["y"])],
                  [("x", F, [1, 8, 32, 32])], [("y", F, [1, 16, 30, 30])])


def test_reproduction_is_valid_and_counts():
    m = conv_from_constant()
    onnx.checker.check_model(m, full_check=True)
    r = flopcount.count(m)
    assert r.total.macs == CONV_MACS
    assert r.total.flops == 2 * CONV_MACS
    assert r.params == CONV_PARAMS


def test_constant_weight_counts_as_the_same_weight_in_an_initializer():
    as_init = _model([N("Conv", ["x", "w"], ["y"])], [("x", F, [1, 8, 32, 32])], [("y", F, [1, 16, 30, 30])],
                     inits=[_weight()])
    a, b = flopcount.count(conv_from_constant(), mode="train"), flopcount.count(as_init, mode="train")
    assert a.total == b.total
    assert a.params == b.params == CONV_PARAMS
    # backward: the weight gradient only (x is data): one more product of the forward's size
    assert a.backward.macs == CONV_MACS


@pytest.mark.parametrize("source", ["path", "bytes", "proto"])
def test_every_source_counts(tmp_path, source):
    m = conv_from_constant()
    if source == "path":
        onnx.save(m, tmp_path / "m.onnx")
        given = str(tmp_path / "m.onnx")
    else:
        given = m.SerializeToString() if source == "bytes" else m
    assert flopcount.count(given).total.macs == CONV_MACS
    if source == "proto":
        assert len(m.graph.node[0].attribute[0].t.raw_data) == 4 * CONV_PARAMS  # never modified


def test_gpt2_style_causal_mask_constant():
    # TorchScript's GPT-2 export keeps its 1x1x1024x1024 causal mask (bool) in a Constant node.
    mask = numpy_helper.from_array(np.tril(np.ones((1, 1, 1024, 1024), dtype=bool)), "mask")
    s = 16
    nodes = [N("Constant", [], ["mask"], value=mask),
             N("Slice", ["mask", "zero", "s", "two"], ["m"]),  # mask[:, :, :s] along axis 2
             N("Slice", ["m", "zero", "s", "three"], ["mm"]),
             N("Constant", [], ["neg"], value=numpy_helper.from_array(np.array(-1e4, np.float32), "neg")),
             N("Where", ["mm", "scores", "neg"], ["masked"]),
             N("Softmax", ["masked"], ["y"], axis=-1)]
    inits = [numpy_helper.from_array(np.array([v], np.int64), n)
             for n, v in (("zero", 0), ("s", s), ("two", 2), ("three", 3))]
    m = _model(nodes, [("scores", F, [1, 12, s, s])], [("y", F, [1, 12, s, s])], inits=inits)
    onnx.checker.check_model(m, full_check=True)
    r = flopcount.count(m)
    assert r.by_op_type["Where"].cost.flops == 0  # a select: no arithmetic
    rows = 1 * 12 * s
    # Softmax per row of s: the max (s - 1), s subtractions, s exps, the sum (s - 1), s divisions
    assert r.total.flops == rows * ((s - 1) + s + s + (s - 1) + s)


def _conv_body(name: str, out: str) -> onnx.GraphProto:
    return helper.make_graph([N("Constant", [], [f"w_{name}"], value=_weight(f"w_{name}")),
                              N("Conv", ["x", f"w_{name}"], [out])], name, [],
                             [helper.make_tensor_value_info(out, F, [1, 16, 30, 30])])


def if_model(cond: bool | None) -> onnx.ModelProto:
    """If whose then-branch convolves with a Constant weight; else-branch a Relu of the input."""
    else_g = helper.make_graph([N("MaxPool", ["x"], ["e"], kernel_shape=[3, 3])], "else", [],
                               [helper.make_tensor_value_info("e", F, [1, 8, 30, 30])])
    nodes = [N("If", ["cond"], ["y"], then_branch=_conv_body("then", "t"), else_branch=else_g)]
    inputs = [("x", F, [1, 8, 32, 32])]
    if cond is None:
        inputs.append(("cond", TensorProto.BOOL, []))
    else:
        nodes.insert(0, N("Constant", [], ["cond"], value=helper.make_tensor("c", TensorProto.BOOL, [], [cond])))
    return _model(nodes, inputs, [("y", F, [1, None, 30, 30])])


def loop_model(trips: int) -> onnx.ModelProto:
    """Loop of ``trips`` iterations, each a Conv whose weight is a Constant of the body."""
    body = helper.make_graph(
        [N("Identity", ["cond_in"], ["cond_out"]), N("Constant", [], ["w_b"], value=_weight("w_b")),
         N("Conv", ["x", "w_b"], ["y_b"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_b", F, [1, 16, 30, 30])])
    trip = numpy_helper.from_array(np.array(trips, np.int64), "M")
    return _model([N("Loop", ["M", ""], ["ys"], body=body)], [("x", F, [1, 8, 32, 32])],
                  [("ys", F, [trips, 1, 16, 30, 30])], inits=[trip])


@pytest.mark.parametrize("cond, macs", [
    pytest.param(True, CONV_MACS, id="then-taken"),
    pytest.param(False, 0, id="else-taken"),  # a MaxPool: comparisons, no MACs
    pytest.param(None, CONV_MACS, id="unknown-larger-branch"),
])
def test_constant_weight_in_if_body(cond, macs):
    m = if_model(cond)
    onnx.checker.check_model(m, full_check=True)
    assert flopcount.count(m).total.macs == macs


def test_constant_weight_in_loop_body_forward_and_train():
    m = loop_model(3)
    onnx.checker.check_model(m, full_check=True)
    assert flopcount.count(m).total.macs == 3 * CONV_MACS
    # The body's Constant weight is a parameter, as a main-graph one is (the graph keeps no weight
    # initializers): per iteration the input's gradient (a transposed Conv) and the weight's (dY ⋆ X), each the
    # forward's MACs.
    r = flopcount.count(m, mode="train", trainable_inputs=["x"])
    assert r.params == CONV_PARAMS
    assert r.forward.macs == 3 * CONV_MACS
    assert r.backward.macs == 3 * (CONV_MACS + CONV_MACS)


def test_weightless_constant_counts_like_a_weightless_initializer():
    """A file whose Constant tensor has dims and type but no data (a weightless export) is read as dims and
    type only, like a weightless initializer."""
    t = TensorProto(name="w", data_type=F, dims=[16, 8, 3, 3])
    assert flopcount.count(conv_from_constant(t)).total.macs == CONV_MACS


def test_external_constant_counts_without_opening_the_file(tmp_path):
    t = TensorProto(name="w", data_type=F, dims=[16, 8, 3, 3])
    t.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "missing.bin"), ("length", str(4 * CONV_PARAMS))):
        t.external_data.add(key=key, value=value)
    assert flopcount.count(conv_from_constant(t)).total.macs == CONV_MACS


@pytest.mark.parametrize("damage, message", [
    pytest.param(lambda t: t.__setattr__("raw_data", t.raw_data[:8]), "too small", id="raw-data-too-short"),
    pytest.param(lambda t: t.float_data.extend([1.0]), "one and only one value field", id="two-value-fields"),
])
def test_malformed_inline_constant_is_refused_naming_node_and_tensor(damage, message):
    w = _weight()
    damage(w)
    with pytest.raises(InvalidGraphError) as e:
        flopcount.count(conv_from_constant(w))
    assert message in str(e.value) and "tensor 'w'" in str(e.value) and "node 'Constant_0'" in str(e.value)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopcount", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("flags", [(), ("--mode", "train"), ("--per-node",), ("--mode", "train", "--per-node")])
def test_cli_counts_constant_weights(tmp_path, flags):
    path = tmp_path / "loop.onnx"
    onnx.save(loop_model(2), path)
    p = _cli(str(path), "--format", "json", *flags, *(("--trainable-input", "x") if "train" in flags else ()))
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["forward"]["macs"] == 2 * CONV_MACS
    if "--per-node" in flags:
        assert [n["op_type"] for n in d["nodes"]] == ["Loop"]
        assert d["nodes"][0]["macs"] == 2 * CONV_MACS


def test_cli_refuses_a_malformed_constant_with_exit_4(tmp_path):
    w = _weight()
    w.raw_data = w.raw_data[:8]
    path = tmp_path / "bad.onnx"
    onnx.save(conv_from_constant(w), path)
    p = _cli(str(path))
    assert p.returncode == 4
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr and "bad.onnx" in p.stderr


def test_count_takes_a_model_read_with_its_weights_under_its_path(tmp_path):
    from flopcount.errors import ModelFileError
    from flopcount.pipeline.loading import LoadedModel, load_with_weights

    w = numpy_helper.from_array(np.ones((16, 8, 3, 3), np.float32), "w")  # 1,152 elements: a weight
    graph = helper.make_graph([N("Conv", ["x", "w"], ["y"])], "g", [helper.make_tensor_value_info("x", F, [1, 8, 32, 32])],
                              [helper.make_tensor_value_info("y", F, None)], [w])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    loaded = load_with_weights(path)
    assert isinstance(loaded, LoadedModel) and loaded.path == str(path)
    assert len(loaded.model.graph.initializer[0].raw_data) == 4 * CONV_PARAMS  # the weights are there to run
    report = flopcount.count(loaded)
    assert report.model.path == str(path)
    assert report.forward.macs == CONV_MACS and report.params == CONV_PARAMS
    assert len(loaded.model.graph.initializer[0].raw_data) == 4 * CONV_PARAMS  # counting did not strip them
    with pytest.raises(ModelFileError, match="no such file"):
        load_with_weights(tmp_path / "absent.onnx")


def test_int64_positions_keep_their_values_and_weights_do_not():
    """Positions and indices (int64, up to 2**20 elements) keep their values when a model is loaded, so masks built
    from them can be evaluated; floating-point weights of any size lose theirs."""
    from flopcount.pipeline.loading import has_data, load

    positions = numpy_helper.from_array(np.arange(5000, dtype=np.int64), "positions")
    huge = numpy_helper.from_array(np.zeros((1 << 20) + 1, np.int64), "huge")
    weight = numpy_helper.from_array(np.ones((2000,), np.float32), "weight")
    graph = helper.make_graph(
        [helper.make_node("Cast", ["positions"], ["p"], to=TensorProto.FLOAT),
         helper.make_node("Mul", ["p", "weight"], ["y0"]),
         helper.make_node("Size", ["huge"], ["n"])], "g", [],
        [helper.make_tensor_value_info("y0", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("n", TensorProto.INT64, None)],
        [positions, weight, huge])
    loaded = {t.name: t for t in load(helper.make_model(graph)).model.graph.initializer}
    assert has_data(loaded["positions"]) and numpy_helper.to_array(loaded["positions"])[-1] == 4999
    assert not has_data(loaded["weight"]) and not has_data(loaded["huge"])


# --- a ModelProto is checked exactly as the same bytes read from a file ---------------------------------------


def _non_utf8(field: bytes):
    """A Relu model whose ``field`` (a name or doc string written in it) is replaced by bytes that are not UTF-8,
    as serialized bytes and as the ModelProto parsed from them."""
    relu = onnx.helper.make_node("Relu", ["x"], ["y"], name="NODEXX")
    graph = onnx.helper.make_graph(
        [relu], "GRAPHX", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 5])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3, 5])], doc_string="GDOCXX")
    m = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], producer_name="PRODXX",
                               doc_string="MDOCXX")
    data = m.SerializeToString()
    assert data.count(field) == 1
    data = data.replace(field, b"\xff\xfe" + field[2:])
    proto = onnx.ModelProto()
    proto.ParseFromString(data)
    return data, proto


@pytest.mark.parametrize("field, error", [
    pytest.param(b"GRAPHX", "InvalidGraphError", id="graph-name"),
    pytest.param(b"PRODXX", "InvalidGraphError", id="producer-name"),
    pytest.param(b"NODEXX", "InvalidGraphError", id="node-name"),
    pytest.param(b"MDOCXX", None, id="model-doc-string"),
    pytest.param(b"GDOCXX", None, id="graph-doc-string"),
])
def test_a_model_proto_with_non_utf8_text_is_checked_as_its_file(tmp_path, field, error):
    from flopcount import count

    data, proto = _non_utf8(field)
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    outcomes = []
    for source in (str(path), proto, data):
        try:
            outcomes.append(("counted", count(source).forward.flops))
        except Exception as e:  # noqa: BLE001 - the class is what is compared
            outcomes.append((type(e).__name__, str(e).replace(str(path), "<model>").replace("<bytes>", "<model>")))
    assert outcomes[0] == outcomes[1] == outcomes[2]
    if error is None:
        assert outcomes[0] == ("counted", 3 * 5)  # one comparison per element
    else:
        assert outcomes[0][0] == error and "not valid UTF-8" in outcomes[0][1]
