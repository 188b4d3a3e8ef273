"""A shape constant asking for more than 2**48 elements (a Reshape to 2**63 - 1, found by fuzzing a real graph) is
refused before ONNX's inference sees it: exit 5 naming the node and the constant, quickly and in little memory.

Before, ONNX's data propagation held the values of such a tensor (a shape vector reshaped to 2**63 - 1 elements,
a ConstantOfShape cast) and grew to gigabytes before the clean exit. Each hostile graph is counted in a child
process whose address space is bounded to 1.5 GB.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ROOT = pathlib.Path(__file__).resolve().parents[2]
HUGE = 2**63 - 1
F = TensorProto.FLOAT


def _ints(name, values):
    return numpy_helper.from_array(np.array(values, dtype=np.int64), name)


def _model(nodes, inputs, initializers=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
                              [helper.make_tensor_value_info(nodes[-1].output[0], F, None)], list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def shape_vector_reshaped():
    # Shape(x) -> Reshape to [2**63 - 1] -> Cast: data propagation would hold the reshaped vector's values
    nodes = [helper.make_node("Shape", ["x"], ["sx"]), helper.make_node("Reshape", ["sx", "s"], ["r"], name="grow"),
             helper.make_node("Cast", ["r"], ["y"], to=F)]
    return _model(nodes, {"x": [2, 6]}, [_ints("s", [HUGE])])


def constant_of_shape_cast():
    fill = helper.make_tensor("v", TensorProto.INT64, [1], [1])
    nodes = [helper.make_node("ConstantOfShape", ["s"], ["z"], name="fill", value=fill),
             helper.make_node("Cast", ["z"], ["y"], to=F)]
    return _model(nodes, {}, [_ints("s", [HUGE])])


def one_op(op, target, constant_node=False):
    inputs = [] if op == "ConstantOfShape" else ["x"]
    nodes = [helper.make_node(op, [*inputs, "s"], ["y"], name="big")]
    if constant_node:  # the shape made by a Constant node, not an initializer
        nodes.insert(0, helper.make_node("Constant", [], ["s"], value=_ints("v", target)))
    initializers = [] if constant_node else [_ints("s", target)]
    return _model(nodes, {} if op == "ConstantOfShape" else {"x": [2, 6]}, initializers)


def in_a_body():
    # the Reshape inside an If's branch, its target an initializer of the branch
    then = helper.make_graph([helper.make_node("Reshape", ["x", "s"], ["t"], name="inner")], "then", [],
                             [helper.make_tensor_value_info("t", F, None)], [_ints("s", [2**30, 2**30])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, None)])
    node = helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then, else_branch=other)
    c = numpy_helper.from_array(np.array(True), "c")
    return _model([node], {"x": [2, 6]}, [c])


HOSTILE = [
    pytest.param(shape_vector_reshaped(), ["node 'grow' (Reshape)", "its shape 's' is [9223372036854775807]"],
                 id="shape-vector-reshaped-to-2**63-1"),
    pytest.param(constant_of_shape_cast(), ["node 'fill' (ConstantOfShape)", "[9223372036854775807]"],
                 id="constant-of-shape-2**63-1-cast"),
    pytest.param(one_op("Reshape", [HUGE]), ["node 'big' (Reshape)"], id="reshape"),
    pytest.param(one_op("Reshape", [4, -1, 2**47]), ["node 'big' (Reshape)", "[4, -1, 140737488355328]"],
                 id="reshape-product-above-the-limit"),  # 4 * 2**47 = 2**49 without the -1's dim
    pytest.param(one_op("Expand", [HUGE, 6]), ["node 'big' (Expand)"], id="expand"),
    pytest.param(one_op("ConstantOfShape", [2**25, 2**24]), ["node 'big' (ConstantOfShape)"],  # 2**49 elements
                 id="constant-of-shape-product"),
    pytest.param(one_op("Tile", [HUGE, 1]), ["node 'big' (Tile)", "its repeats 's'"], id="tile"),
    pytest.param(one_op("Reshape", [HUGE], constant_node=True), ["node 'big' (Reshape)"], id="constant-node"),
    pytest.param(in_a_body(), ["node 'inner' (Reshape)", "[1073741824, 1073741824]"], id="in-an-if-branch"),
]


def _count_bounded(path: pathlib.Path) -> tuple[subprocess.CompletedProcess, float]:
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (3 << 29, 3 << 29))  # 1.5 GB\n"
            "from flopcount.cli import main\n"
            f"sys.exit(main([{str(path)!r}, '--format', 'json']))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    return out, time.perf_counter() - start


@pytest.mark.parametrize("model, expected", HOSTILE)
def test_a_huge_shape_constant_is_refused_before_inference(model, expected, tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    out, seconds = _count_bounded(path)
    assert out.returncode == 5, out.stderr[-2000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "more than 2**48 elements" in lines[0], out.stderr[-2000:]
    for text in expected:
        assert text in lines[0]
    assert seconds < 60


def test_the_check_itself_names_the_node_without_inferring():
    from flopcount.errors import ShapeError
    from flopcount.pipeline.shapes.shape_constants import check_shape_constants

    with pytest.raises(ShapeError, match=r"^m\.onnx: node 'fill' \(ConstantOfShape\) makes tensor 'z' of more than"):
        check_shape_constants(constant_of_shape_cast(), "m.onnx")


@pytest.mark.parametrize("target", [[3, -1], [0, 3, -1], [2**24, 2**24], [2**48, 1]],
                         ids=["minus-one", "zero-copies", "2**48-exactly", "one-dim-at-the-limit"])
def test_targets_within_the_limit_pass_the_check(target):
    from flopcount.pipeline.shapes.shape_constants import check_shape_constants

    check_shape_constants(one_op("Reshape", target), "m.onnx")  # 2**24 * 2**24 = 2**48: at the limit, not above
