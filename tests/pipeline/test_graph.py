"""flopcount.pipeline.graph: the walks over a model's graphs and tensors."""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from flopcount.errors import InvalidGraphError
from flopcount.pipeline.graph import build_graph, model_tensors, walk_graphs


def _nested_model() -> onnx.ModelProto:
    """An If whose branches hold an initializer and a Constant, a top-level Constant, and a local function with a
    Constant inside a Loop body: each place a tensor can hide."""
    then_graph = helper.make_graph(
        [helper.make_node("Identity", ["t_init"], ["t_out"])], "then", [],
        [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.ones(1, np.float32), "t_init")],
    )
    else_graph = helper.make_graph(
        [helper.make_node("Constant", [], ["e_out"], value=numpy_helper.from_array(np.zeros(1, np.float32)))],
        "else", [], [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, [1])],
    )
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["b_c"], value=numpy_helper.from_array(np.full(1, 2, np.float32)))],
        "body", [], [helper.make_tensor_value_info("b_c", TensorProto.FLOAT, [1])],
    )
    function = helper.make_function(
        "local", "F", ["x"], ["y"],
        [helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.full(1, 3, np.float32))),
         helper.make_node("Loop", ["", ""], ["y"], body=body)],
        [helper.make_opsetid("", 18)],
    )
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.full(1, 4, np.float32))),
         helper.make_node("If", ["cond"], ["z"], then_branch=then_graph, else_branch=else_graph)],
        "main", [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.full(1, 5, np.float32), "w")],
    )
    return helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 18),
                                                                         helper.make_opsetid("local", 1)])


def test_walk_graphs_visits_the_graph_then_each_branch():
    names = [g.name for g in walk_graphs(_nested_model().graph)]
    assert names[0] == "main" and sorted(names[1:]) == ["else", "then"]  # the function's Loop body is not a subgraph


def test_model_tensors_finds_each_tensor_once():
    values = sorted(float(numpy_helper.to_array(t)[0]) for t in model_tensors(_nested_model()))
    # w=5 and t_init=1 (initializers), k=4 and else's 0 (Constant attributes), 3 and 2 in the function and its Loop
    assert values == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_model_tensors_matches_onnx_external_data_walk():
    m = _nested_model()
    ours = sorted(t.SerializeToString() for t in model_tensors(m))
    theirs = sorted(t.SerializeToString() for t in external_data_helper._get_all_tensors(m))
    assert ours == theirs


def test_build_graph_indexes_each_node_once():
    from helpers import model
    from flopcount.pipeline.graph import GraphIndex, build_graph

    m = model([helper.make_node("Relu", ["x"], ["a"], name="r"), helper.make_node("Add", ["a", "x"], ["b"]),
               helper.make_node("Neg", ["b"], ["c"], domain="")], {"x": (2,)}, ["c"])
    index = build_graph(m.graph, "m.onnx")
    assert isinstance(index, GraphIndex)
    assert list(index.names) == ["r", "Add_1", "Neg_2"]
    assert list(index.node_ops) == [("", "Relu"), ("", "Add"), ("", "Neg")]
    assert list(index.node_inputs) == [("x",), ("a", "x"), ("b",)]
    assert dict(index.producer) == {"a": 0, "b": 1, "c": 2}
    assert index.inputs == ("x",) and index.outputs == ("c",) and list(index.order) == [0, 1, 2]
    assert list(index.bodies) == [] and dict(index.captured) == {}
    assert sorted(index.dag.edges) == [(0, 1), (1, 2)]
    with pytest.raises(dataclasses.FrozenInstanceError):
        index.order = []


def _relus(*pairs: tuple[str, str]) -> onnx.GraphProto:
    """Relu nodes named by their output, each reading ``input -> output``; graph input x, output z."""
    return helper.make_graph([helper.make_node("Relu", [i], [o], name=o) for i, o in pairs], "g",
                             [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                             [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)])


def test_build_graph_orders_nodes_written_out_of_order():
    from flopcount.pipeline.graph import build_graph

    index = build_graph(_relus(("y", "z"), ("x", "y")), "m.onnx")
    assert index.order == [1, 0]
    assert sorted(index.dag.edges(data="tensors")) == [(1, 0, ["y"])]


def test_build_graph_finds_a_missing_input_after_nodes_out_of_order():
    # the order check meets node 'z' (reading 'y', written after it) first; node 'w' still reads a tensor no one writes
    from flopcount.errors import InvalidGraphError
    from flopcount.pipeline.graph import build_graph

    with pytest.raises(InvalidGraphError, match="node 'w' \\(Relu\\) reads tensor 'nowhere'"):
        build_graph(_relus(("y", "z"), ("x", "y"), ("nowhere", "w")), "m.onnx")


def _chain(nodes: list[onnx.NodeProto]) -> onnx.GraphProto:
    return helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                             [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])


def test_nodes_listed_out_of_order_are_walked_in_topological_order():
    # z = Relu(y) listed before y = Neg(x): node 1 runs first
    index = build_graph(_chain([helper.make_node("Relu", ["y"], ["z"]), helper.make_node("Neg", ["x"], ["y"])]), "m")
    assert list(index.order) == [1, 0]


def test_a_missing_input_is_found_after_nodes_out_of_order():
    # the first read out of order (node 0 reads y, written by node 1) comes before the read of a tensor nothing writes
    nodes = [helper.make_node("Relu", ["y"], ["z"]), helper.make_node("Neg", ["x"], ["y"]),
             helper.make_node("Add", ["y", "ghost"], ["w"], name="adder")]
    with pytest.raises(InvalidGraphError, match=r"^m: node 'adder' \(Add\) reads tensor 'ghost', which no node produces"):
        build_graph(_chain(nodes), "m")


def test_a_cycle_is_named():
    nodes = [helper.make_node("Relu", ["y"], ["z"], name="a"), helper.make_node("Neg", ["z"], ["y"], name="b")]
    with pytest.raises(InvalidGraphError, match=r"^m: the graph has a cycle \('a' -> 'b' -> 'a'\)"):
        build_graph(_chain(nodes), "m")
