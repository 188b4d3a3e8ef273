"""The paths that make large graphs fast give the same answers as the plain ones: the DAG handed to
networkx in one step, shape inference in a forked child, formula results shared by equal nodes."""

from __future__ import annotations

import marshal
import os
import sys

import networkx as nx
import numpy as np
import pytest
from helpers import const, model, weight
from onnx import TensorProto, helper

import flopcount
from flopcount.errors import InvalidGraphError, ShapeError
from flopcount.pipeline import shapes
from flopcount.pipeline.graph import build_graph
from flopcount.pipeline.shapes import guarded, interpreter, tensors

N = helper.make_node
F = TensorProto.FLOAT


def mlp_chain(layers: int, width: int = 8, rows: int = 3):
    """``layers`` × (MatMul [rows, width] @ [width, width], Add bias, Relu)."""
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        inits += [weight(f"w{i}", (width, width)), weight(f"b{i}", (width,))]
        nodes += [
            N("MatMul", [x, f"w{i}"], [f"mm{i}"], name=f"mm{i}"),
            N("Add", [f"mm{i}", f"b{i}"], [f"add{i}"], name=f"add{i}"),
            N("Relu", [f"add{i}"], [f"relu{i}"], name=f"relu{i}"),
        ]
        x = f"relu{i}"
    return model(nodes, {"x": (rows, width)}, [x], inits)


def mlp_flops(layers: int, width: int = 8, rows: int = 3) -> int:
    # per layer: 2·rows·width·width (MatMul) + rows·width (Add) + rows·width (Relu)
    return layers * (2 * rows * width * width + 2 * rows * width)


# --- the DAG ------------------------------------------------------------------------------------


def test_dag_equals_one_built_edge_by_edge():
    # a diamond with a tensor read twice by one node and an omitted optional input
    m = model(
        [
            N("Relu", ["x"], ["a"], name="r"),
            N("Sigmoid", ["x"], ["b"], name="s"),
            N("Mul", ["a", "a"], ["c"], name="m"),
            N("Clip", ["c", "", "b"], ["d"], name="clip"),
        ],
        {"x": (2, 3)},
        ["d"],
    )
    dag = build_graph(m.graph, "m.onnx").dag
    reference = nx.DiGraph()
    reference.add_nodes_from((i, {"proto": n, "name": n.name}) for i, n in enumerate(m.graph.node))
    reference.add_edges_from([(0, 2, {"tensors": ["a", "a"]}), (2, 3, {"tensors": ["c"]}), (1, 3, {"tensors": ["b"]})])
    assert nx.utils.edges_equal(dag.edges(data=True), reference.edges(data=True))
    assert dict(dag.nodes(data="name")) == dict(reference.nodes(data="name"))
    assert dict(dag.in_degree) == {0: 0, 1: 0, 2: 1, 3: 2} and dict(dag.out_degree) == {0: 1, 1: 1, 2: 1, 3: 0}
    assert all(dag.succ[u][v] is dag.pred[v][u] for u, v in dag.edges)
    assert list(nx.topological_sort(dag)) in ([0, 1, 2, 3], [1, 0, 2, 3], [0, 2, 1, 3])
    dag.add_edge(0, 3, tensors=["extra"])  # networkx's own methods still work on it
    assert set(dag.predecessors(3)) == {0, 1, 2}


def test_writing_over_an_initializer_or_input_is_an_error():
    over_init = model([N("Relu", ["x"], ["w"], name="r")], {"x": (2,)}, ["w"], [weight("w", (2,))])
    with pytest.raises(InvalidGraphError, match=r"node 'r' \(Relu\) writes tensor 'w', which is already a initializer"):
        build_graph(over_init.graph, "m.onnx")
    over_input = model([N("Relu", ["x"], ["x2"]), N("Relu", ["x2"], ["x"], name="back")], {"x": (2,)}, ["x2"])
    with pytest.raises(InvalidGraphError, match=r"node 'back' \(Relu\) writes tensor 'x', which is already a graph input"):
        build_graph(over_input.graph, "m.onnx")


# --- inference in a child process ------------------------------------------------------------------

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child process is used on Linux only")


@pytest.fixture
def forks(monkeypatch):
    """Every graph counts with a child inference; returns the list of child pids."""
    monkeypatch.setattr(guarded, "PARALLEL_MIN_NODES", 1)
    monkeypatch.delenv("FLOPCOUNT_PARALLEL", raising=False)
    pids: list[int] = []
    real_fork = os.fork

    def fork():
        pid = real_fork()
        if pid:
            pids.append(pid)
        return pid

    monkeypatch.setattr(os, "fork", fork)
    return pids


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


@linux_only
def test_child_inference_gives_the_closed_form(forks, monkeypatch):
    r = flopcount.count(mlp_chain(40))
    assert forks and all(map(_reaped, forks))
    assert r.total.flops == mlp_flops(40)
    assert all(n.outputs[0].shape == (3, 8) for n in r.nodes)
    monkeypatch.setenv("FLOPCOUNT_PARALLEL", "0")
    forks.clear()
    assert flopcount.count(mlp_chain(40)).total.flops == mlp_flops(40) and not forks


@linux_only
def test_child_inference_error_reads_as_in_process(forks, monkeypatch):
    # MatMul [3, 8] @ [5, 8]: inner dims differ; ONNX's inference leaves the output unknown
    bad = model([N("MatMul", ["x", "w"], ["y"], name="mm")], {"x": (3, 8)}, ["y"], [weight("w", (5, 8))])
    with pytest.raises(ShapeError) as child:
        flopcount.count(bad)
    assert forks and all(map(_reaped, forks))
    monkeypatch.setenv("FLOPCOUNT_PARALLEL", "0")
    with pytest.raises(ShapeError) as in_process:
        flopcount.count(bad)
    assert str(child.value) == str(in_process.value) and "Incompatible dimensions" in str(child.value)


@linux_only
def test_child_is_reaped_when_the_graph_is_broken(forks):
    broken = model([N("Relu", ["nowhere"], ["y"], name="r")], {"x": (2,)}, ["y"])
    with pytest.raises(InvalidGraphError, match="'nowhere'"):
        flopcount.count(broken)
    assert forks and all(map(_reaped, forks))


@linux_only
def test_no_child_beside_other_threads(forks):
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert flopcount.count(mlp_chain(3)).total.flops == mlp_flops(3)
    finally:
        stop.set()
        other.join()
    assert not forks


def _answered(words: bytes) -> shapes.Inference:
    """An Inference whose child (not started) answered ``words``."""
    inference = shapes.Inference.__new__(shapes.Inference)
    inference.model, inference.where, inference._pid = mlp_chain(2), "m.onnx", None
    read, write = os.pipe()
    os.write(write, words)
    os.close(write)
    inference._fd = read
    return inference


def test_child_that_dies_silently_leaves_inference_to_the_caller():
    assert _answered(b"").collected({}) is None


@linux_only
def test_child_that_exits_badly_is_not_trusted():
    # a child that exited 1 after writing what parses as a report (one without the inferred types, as a report
    # cut short could): its words are dropped, the caller infers in-process
    read, write = os.pipe()
    uninferred = guarded._rows(tensors.collect(mlp_chain(2)))
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, b"C" + marshal.dumps(uninferred))
        os._exit(1)
    os.close(write)
    inference = shapes.Inference.__new__(shapes.Inference)
    inference.model, inference.where, inference._pid, inference._fd = mlp_chain(2), "m.onnx", pid, read
    assert inference.collected({}) is None
    assert _reaped(pid)


def test_child_report_that_does_not_parse_leaves_inference_to_the_caller():
    assert _answered(b"C\xff\xff\xff").collected({}) is None


def test_child_that_reports_an_error_raises_it():
    with pytest.raises(ShapeError, match=r"^m\.onnx: ONNX shape inference failed: bad news; check the input shapes"):
        _answered(b"Ebad news").collected({})


def test_child_report_holds_what_the_inferred_model_holds():
    # a symbolic batch, an unknown-rank tensor (a Reshape to a shape computed at run time), a zero dim (an odd one)
    nodes = [N("MatMul", ["x", "w"], ["mm"]), N("Reshape", ["mm", "s"], ["r"]), N("Slice", ["e", "st", "en"], ["z"])]
    m = model(nodes, {"x": ("N", 8), "s": (2,), "e": (4, 5)}, ["r", "z"],
              [weight("w", (8, 6)), const("st", [0]), const("en", [0])])
    words = guarded._report(m, "m.onnx")
    assert words[:1] == b"T"  # no bodies: a table of the distinct types
    # the child leaves the initializers out: the parent has them, as its DAG read them
    got = child_report(words, m)
    expected = tensors.collect(guarded.infer(m, "m.onnx"))
    assert got == expected and list(got) == list(expected) and got.odd == expected.odd == ["z"]
    assert got["mm"].shape == ("N", 6) and not got["mm"].is_static and got["w"].shape == (8, 6)
    assert got["z"].shape == (0, 5) and type(got["mm"]) is type(expected["mm"])


def child_report(words: bytes, m) -> tensors.Collected:
    """What the parent reads from a child's report ``words`` on ``m``, its initializers as its DAG read them."""
    declared = build_graph(m.graph, "m.onnx").initializer_types
    if words[:1] == b"T":
        return tensors.from_type_table(*marshal.loads(words[1:]), tensors.initializer_infos(None, declared))
    assert words[:1] == b"C"
    return guarded._from_rows(*marshal.loads(words[1:]), declared)


def test_child_report_of_a_graph_with_bodies_holds_what_the_inferred_model_holds():
    # an If whose branches make tensors of their own: the child sends every tensor of the top graph and the bodies
    then = helper.make_graph([N("Relu", ["mm"], ["t"])], "then", [], [helper.make_tensor_value_info("t", F, None)])
    other = helper.make_graph([N("Neg", ["mm"], ["o"])], "else", [], [helper.make_tensor_value_info("o", F, None)])
    nodes = [N("MatMul", ["x", "w"], ["mm"]), N("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    m = model(nodes, {"x": ("N", 8), "c": ()}, ["y"], [weight("w", (8, 6))])
    m.graph.input[1].type.tensor_type.elem_type = TensorProto.BOOL
    words = guarded._report(m, "m.onnx")
    assert words[:1] == b"C"
    got = child_report(words, m)
    expected = tensors.collect(guarded.infer(m, "m.onnx"))
    assert got == expected and got["t"].shape == ("N", 6) and got["o"].shape == ("N", 6)


# --- shared formula results ------------------------------------------------------------------------


def two_loops(m1: int, m2: int):
    """Two Loops with the same body and equal shapes, whose trip counts are different constants."""
    body = helper.make_graph(
        [N("MatMul", ["h_in", "W"], ["h_out"]), N("Identity", ["c_in"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F, [2, 4])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("h_out", F, [2, 4])],
    )
    nodes = [
        N("Loop", ["M1", "", "h0"], ["h1"], body=body, name="first"),
        N("Loop", ["M2", "", "h1"], ["h2"], body=body, name="second"),
    ]
    return model(nodes, {"h0": (2, 4)}, ["h2"], [weight("W", (4, 4)), const("M1", m1), const("M2", m2)])


def test_equal_nodes_whose_formula_reads_a_value_are_counted_apart():
    r = flopcount.count(two_loops(3, 11))
    per_iteration = 2 * 2 * 4 * 4
    assert [n.cost.flops for n in r.nodes] == [3 * per_iteration, 11 * per_iteration]


def test_equal_nodes_with_other_attributes_are_counted_apart():
    # the same input shapes; kernel 1 vs kernel 3 (pads keep the output size) → different costs
    nodes = [
        N("Conv", ["x", "w1"], ["a"], name="k1"),
        N("Conv", ["x", "w3"], ["b"], name="k3", pads=[1, 1, 1, 1]),
        N("Conv", ["x", "w3b"], ["c"], name="k3b", pads=[1, 1, 1, 1]),
    ]
    inits = [weight("w1", (4, 2, 1, 1)), weight("w3", (4, 2, 3, 3)), weight("w3b", (4, 2, 3, 3))]
    r = flopcount.count(model(nodes, {"x": (1, 2, 5, 5)}, ["a", "b", "c"], inits))
    out = 4 * 5 * 5
    assert [n.cost.macs for n in r.nodes] == [out * 2 * 1, out * 2 * 9, out * 2 * 9]


def test_loop_body_nodes_get_no_gradients_of_their_namesakes():
    # top-level node 0 (MatMul with a trainable weight) needs gradients; the Loop body's node 0 is
    # a different node, planned on its own
    body = helper.make_graph(
        [N("TopK", ["h_in", "k"], ["v", "idx"]), N("Identity", ["c_in"], ["c_out"]), N("Identity", ["h_in"], ["h_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("h_in", F, [2, 4])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_tensor_value_info("h_out", F, [2, 4])],
        [const("k", [2])],
    )
    nodes = [N("MatMul", ["x", "W"], ["h0"], name="mm"), N("Loop", ["M", "", "h0"], ["h"], body=body, name="loop")]
    m = model(nodes, {"x": (2, 4)}, ["h"], [weight("W", (4, 4)), const("M", 2)])
    r = flopcount.count(m, mode="train")
    assert not r.backward_unsupported
    # the body's own plan: TopK reads the carried h (from x @ W), so its backward is due (0 FLOPs)
    assert next(n for n in r.nodes if n.name == "loop").backward == flopcount.Cost()


def test_constants_read_one_by_one_are_those_read_all_at_once():
    # inline initializers (small and over the fold limit), an external one, a stripped one, an empty one, Constant
    # nodes (one of a tensor, one of ints, one of a float), and names that are neither
    big = np.zeros(shapes.FOLD_LIMIT + 1, dtype=np.int64)
    inits = [const("s", [2, 8]), const("f", [0.5, 2.0], np.float32), const("big", big), weight("ext", (4,)),
             TensorProto(name="stripped", dims=[3], data_type=TensorProto.INT64), const("empty", np.zeros((0,)))]
    nodes = [N("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.INT64, [2], [3, 4])),
             N("Constant", [], ["both"], value_ints=[7, 7]), N("Constant", [], ["k"], value_float=1.5),
             N("Reshape", ["x", "s"], ["y"])]
    m = model(nodes, {"x": (4, 4)}, ["y"], inits)
    everything = interpreter.small_constants(m)
    for index in (build_graph(m.graph, "m.onnx"), None):
        lazy = interpreter.LazyConstants(m, index)
        for name in ("s", "f", "big", "ext", "stripped", "empty", "both", "c", "k", "x", "nowhere", "s"):
            assert (name in lazy) == (name in everything), name
            if name in everything:
                np.testing.assert_array_equal(lazy[name], everything[name])
        assert lazy._values is None  # read one by one, never all at once
    assert sorted(everything) == ["both", "c", "empty", "f", "k", "s"]
    np.testing.assert_array_equal(everything["both"], [7, 7])
    assert dict(interpreter.LazyConstants(m).items()).keys() == everything.keys()  # iterating reads them all


def test_child_report_keeps_the_declared_type_of_an_initializer_listed_as_an_input():
    # an older export lists its weight w as a graph input too, there with a symbolic first dim: the initializer's
    # dims (8, 6) stand, in the child's report as in the in-process reading
    nodes = [N("MatMul", ["x", "w"], ["mm"])]
    m = model(nodes, {"x": ("N", 8), "w": ("K", 6)}, ["mm"], [weight("w", (8, 6))])
    words = guarded._report(m, "m.onnx")
    got = child_report(words, m)
    expected = tensors.collect(guarded.infer(m, "m.onnx"))
    assert got == expected and list(got) == list(expected) and got.odd == expected.odd == []
    assert got["w"].shape == (8, 6) and got["w"].is_static and got["mm"].shape == ("N", 6)


@linux_only
def test_a_progress_bars_monitor_thread_does_not_keep_the_count_from_forking(forks, monkeypatch):
    # a framework's progress bar (a download, a model's loading) starts tqdm's monitor thread, which outlives it
    import io
    import threading

    std = pytest.importorskip("tqdm.std")
    monkeypatch.setattr(std.tqdm, "monitor_interval", 10)  # the test processes run without it (conftest)
    bar = std.tqdm(total=2, file=io.StringIO())
    try:
        monitor = std.tqdm.monitor
        assert monitor is not None and monitor.is_alive() and threading.active_count() == 2
        r = flopcount.count(mlp_chain(40))
        assert forks and all(map(_reaped, forks))  # the child inference ran
        assert r.total.flops == mlp_flops(40)
        assert not monitor.is_alive() and threading.active_count() == 1
        bar.update(2)  # the bar still works without it
    finally:
        bar.close()


@linux_only
def test_another_thread_still_keeps_the_count_from_forking(forks):
    import threading

    release = threading.Event()
    other = threading.Thread(target=release.wait, daemon=True)
    other.start()
    try:
        assert flopcount.count(mlp_chain(40)).total.flops == mlp_flops(40)
        assert not forks and other.is_alive()  # inference ran in this process; the thread was left alone
    finally:
        release.set()
        other.join()
