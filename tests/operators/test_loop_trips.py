"""``--loop-trips NAME=N`` on a Loop whose trip count has a known maximum M: the Loop is counted N times, its stacked
(scan) outputs are N long for everything downstream (a MatMul over the stack, a second Loop running once per row
of it), and the Loop is no longer an upper bound. The model is the shape tf2onnx writes for stacked recurrent
layers; it runs in onnxruntime, whose real output shapes the resolved ones are checked against."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.errors import UsageError

N = helper.make_node
F = TensorProto.FLOAT
I64 = TensorProto.INT64
M = 5  # the first Loop's maximum trip count
ROWS, D, OUT = 3, 6, 4  # the carried state is [ROWS, D]; the head maps D to OUT


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def stacked_model():
    """x[3, 6] -> Loop "loop" (M = 5, its condition i < limit may end it earlier; body h @ W[6, 6], Relu stacked)
    -> "head": MatMul(stack, V[6, 4]); -> Loop "second" (trip count Shape(stack)[0], no condition; body
    g + stack[j], Relu stacked). ``limit`` is a graph input: its value, so the real trip count, is unknown to the
    count."""
    body1 = helper.make_graph(
        [N("MatMul", ["h_in", "W"], ["h_out"]), N("Relu", ["h_out"], ["s"]), N("Less", ["i", "limit"], ["c_out"])],
        "body1",
        [_vi("i", I64, []), _vi("c_in", TensorProto.BOOL, []), _vi("h_in", F, ["unk__1", D])],
        [_vi("c_out", TensorProto.BOOL, []), _vi("h_out", F, ["unk__2", D]), _vi("s", F, ["unk__3", D])],
    )
    body2 = helper.make_graph(
        [N("Gather", ["stack", "j"], ["row"], axis=0), N("Add", ["g_in", "row"], ["g_out"]),
         N("Relu", ["g_out"], ["r"]), N("Identity", ["c2_in"], ["c2_out"])],
        "body2",
        [_vi("j", I64, []), _vi("c2_in", TensorProto.BOOL, []), _vi("g_in", F, ["unk__4", D])],
        [_vi("c2_out", TensorProto.BOOL, []), _vi("g_out", F, ["unk__5", D]), _vi("r", F, ["unk__6", D])],
    )
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(np.array(M, dtype=np.int64), "M"),
        numpy_helper.from_array(np.array(True), "cond0"),
        numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
        numpy_helper.from_array(rng.standard_normal((D, D)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal((D, OUT)).astype(np.float32), "V"),
    ]
    nodes = [
        N("Loop", ["M", "cond0", "x"], ["h", "stack"], body=body1, name="loop"),
        N("MatMul", ["stack", "V"], ["head_out"], name="head"),
        N("Shape", ["stack"], ["shape"]), N("Gather", ["shape", "zero"], ["M2"], axis=0),
        N("Loop", ["M2", "", "x"], ["g", "stack2"], body=body2, name="second"),
    ]
    graph = helper.make_graph(nodes, "stacked", [_vi("x", F, [ROWS, D]), _vi("limit", I64, [])],
                              [_vi(o, F, None) for o in ("h", "head_out", "g", "stack2")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)


def per_iteration_first():
    # h @ W: 2·3·6·6 = 216; Relu: 3·6 = 18; Less compares, a comparison is 0 FLOPs
    return 2 * ROWS * D * D + ROWS * D


def per_iteration_second():
    # Add g + row: 3·6; Relu: 3·6; Gather and Identity are free
    return ROWS * D + ROWS * D


def test_without_loop_trips_the_stack_is_m_long_and_the_loop_an_upper_bound():
    r = flopcount.count(stacked_model())
    by = {n.name: n for n in r.nodes}
    assert by["loop"].cost.flops == M * per_iteration_first()
    assert by["head"].outputs[0].shape == (M, ROWS, OUT)
    assert by["head"].cost.flops == 2 * M * ROWS * D * OUT
    assert by["second"].cost.flops == M * per_iteration_second()
    assert "loop" in {n.name for n in r.nodes if n.bound}
    assert "Loop" in r.upper_bounds


@pytest.mark.parametrize("trips", [pytest.param(3, id="N=3"), pytest.param(1, id="N=1"), pytest.param(M, id="N=M")])
def test_loop_trips_sets_the_stacked_length_downstream_and_removes_the_bound(trips):
    r = flopcount.count(stacked_model(), loop_trips={"loop": trips})
    by = {n.name: n for n in r.nodes}
    assert by["loop"].cost.flops == trips * per_iteration_first()
    assert by["head"].outputs[0].shape == (trips, ROWS, OUT)
    assert by["head"].cost.flops == 2 * trips * ROWS * D * OUT  # 2·N·3·6·4
    assert by["second"].cost.flops == trips * per_iteration_second()  # once per row of the N-long stack
    assert by["loop"].bound == "" and by["second"].bound == ""
    assert "Loop" not in r.upper_bounds
    assert r.forward.flops == (trips * per_iteration_first() + 2 * trips * ROWS * D * OUT
                               + trips * per_iteration_second())


def test_the_resolved_shapes_are_onnxruntime_s_real_ones():
    ort = pytest.importorskip("onnxruntime")
    m = stacked_model()
    # limit = 2: iterations i = 0, 1, 2 run (the condition i < limit, false after i = 2, ends the loop): 3 trips
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.ones((ROWS, D), dtype=np.float32)
    real = dict(zip(("h", "head_out", "g", "stack2"),
                    session.run(None, {"x": x, "limit": np.array(2, dtype=np.int64)})))
    assert real["head_out"].shape == (3, ROWS, OUT)
    by = {n.name: n for n in flopcount.count(m, loop_trips={"loop": 3}).nodes}
    assert by["head"].outputs[0].shape == real["head_out"].shape
    assert by["second"].outputs[1].shape == real["stack2"].shape
    assert by["loop"].outputs[0].shape == real["h"].shape


def test_loop_trips_above_the_maximum_is_refused_naming_the_loop():
    with pytest.raises(UsageError) as caught:
        flopcount.count(stacked_model(), loop_trips={"loop": M + 1})
    message = str(caught.value)
    assert "\n" not in message and "'loop'" in message and f"loop={M + 1}" in message and f"at most {M}" in message


def test_the_cli_flag_gives_the_same_count(tmp_path, capsys):
    import json

    from flopcount.cli import main

    path = tmp_path / "stacked.onnx"
    path.write_bytes(stacked_model().SerializeToString())
    assert main([str(path), "--loop-trips", "loop=3", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["upper_bounds"] == {} or "Loop" not in report["upper_bounds"]
    assert report["total"]["flops"] == 3 * per_iteration_first() + 2 * 3 * ROWS * D * OUT + 3 * per_iteration_second()
