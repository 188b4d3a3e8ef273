"""If, Loop, Scan, SequenceMap: bodies counted recursively with the same formulas."""

import json

import pytest
from helpers import const, model, weight
from onnx import TensorProto, helper

import flopcount

N = helper.make_node
F = TensorProto.FLOAT


def body_graph(nodes, inputs, outputs, inits=()):
    return helper.make_graph(
        nodes, "body",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        list(inits),
    )


def if_model(cond_input: bool):
    # then: MatMul x[3, 5] @ W[5, 7] → 2·3·5·7 = 210 FLOPs; else: Relu on x → 15 FLOPs
    then_g = body_graph([N("MatMul", ["x", "W"], ["t"])], [], [("t", F, None)])
    else_g = body_graph([N("Relu", ["x"], ["e"])], [], [("e", F, None)])
    nodes = [N("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")]
    inits = [weight("W", (5, 7))]
    if cond_input:
        m = model(nodes, {"x": (3, 5)}, ["y"], inits)
        m.graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
        return m
    return model(nodes, {"x": (3, 5)}, ["y"], inits + [const("cond", False, dtype=bool)])


def test_if_unknown_condition_takes_larger_branch_and_reports_both():
    r = flopcount.count(if_model(cond_input=True))
    assert r.total.flops == 2 * 3 * 5 * 7
    node = r.nodes[0]
    assert dict(node.parts)["then_branch"].flops == 210 and dict(node.parts)["else_branch"].flops == 15


def test_if_constant_condition_counts_the_branch_taken():
    assert flopcount.count(if_model(cond_input=False)).total.flops == 3 * 5


def loop_model(trip_count):
    # body: h = h @ W[4, 4] + per-iteration Add: 2·2·4·4 + 2·4 = 72 FLOPs per iteration
    body = body_graph(
        [N("MatMul", ["h_in", "W"], ["mm"]), N("Add", ["mm", "h_in"], ["h_out"]), N("Identity", ["c_in"], ["c_out"])],
        [("i", TensorProto.INT64, []), ("c_in", TensorProto.BOOL, []), ("h_in", F, [2, 4])],
        [("c_out", TensorProto.BOOL, []), ("h_out", F, [2, 4])],
    )
    inputs = ["M", "", "h0"] if trip_count is not None else ["", "cond", "h0"]
    nodes = [N("Loop", inputs, ["h"], body=body, name="steps")]
    inits = [weight("W", (4, 4))] + ([const("M", trip_count)] if trip_count is not None else [const("cond", True, dtype=bool)])
    return model(nodes, {"h0": (2, 4)}, ["h"], inits)


def test_loop_constant_trip_count():
    r = flopcount.count(loop_model(9))
    assert r.total.flops == 9 * (2 * 2 * 4 * 4 + 2 * 4)
    assert dict(r.nodes[0].parts)["body per iteration"].flops == 2 * 2 * 4 * 4 + 2 * 4


def test_loop_without_trip_count_asks_for_it(capsys, save):
    with pytest.raises(flopcount.ShapeError, match=r"--loop-trips steps=N"):
        flopcount.count(loop_model(None))
    assert flopcount.count(loop_model(None), loop_trips={"steps": 5}).total.flops == 5 * 72
    from flopcount.cli import main

    path = save(loop_model(None))
    assert main([path]) == 5
    assert "--loop-trips steps=N" in capsys.readouterr().err
    assert main([path, "--loop-trips", "steps=5", "--format", "json", "--per-node"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["total"]["flops"] == 5 * 72
    assert doc["nodes"][0]["parts"]["body per iteration"]["flops"] == 72


def test_scan_multiplies_body_by_scanned_length():
    # running sum over 6 steps of x[6, 3]: body Add(state[3], x_t[3]) = 3 FLOPs per step
    body = body_graph([N("Add", ["s_in", "x_t"], ["s_out"]), N("Identity", ["s_out"], ["y_t"])],
                      [("s_in", F, [3]), ("x_t", F, [3])], [("s_out", F, [3]), ("y_t", F, [3])])
    m = model([N("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1)], {"s0": (3,), "x": (6, 3)}, ["s", "ys"])
    assert flopcount.count(m).total.flops == 6 * 3


def test_unsupported_op_inside_a_body_is_reported():
    then_g = body_graph([N("Frobnicate", ["x"], ["t"], domain="example.custom")], [], [("t", F, None)])
    else_g = body_graph([N("Relu", ["x"], ["e"])], [], [("e", F, None)])
    m = model([N("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)], {"x": (3, 5)}, ["y"],
              [const("cond", True, dtype=bool)], extra_opsets={"example.custom": 1})
    r = flopcount.count(m)
    assert r.unsupported == {"example.custom:Frobnicate": 1}
    with pytest.raises(flopcount.UnsupportedOperatorError):
        flopcount.count(m, strict=True)


def test_if_constant_condition_reports_only_the_branch_taken():
    node = flopcount.count(if_model(cond_input=False)).nodes[0]
    assert [label for label, _ in node.parts] == ["else_branch"]


def test_upper_bounds_are_listed_in_the_report(capsys, save):
    from flopcount.cli import main

    r = flopcount.count(if_model(cond_input=True))
    assert r.nodes[0].bound and list(r.upper_bounds) == ["If"]
    assert flopcount.count(if_model(cond_input=False)).upper_bounds == {}  # the branch taken: exact
    path = save(if_model(cond_input=True))
    assert main([path, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["upper_bounds"]["If"]["nodes"] == 1 and "larger branch" in doc["upper_bounds"]["If"]["why"]
    assert main([path]) == 0
    assert "Upper bound for If (1 node)" in capsys.readouterr().out


def loop_then(body_nodes, body_outputs, outputs, downstream, cond=False):
    """Loop(M=4 or a run-time condition, h0 = x[3, 6]) with ``body_nodes`` over h_in (typed by the
    Loop), followed by ``downstream`` nodes."""
    body = body_graph(
        [*body_nodes, N("Identity", ["c_in"], ["c_out"])],
        [("i", TensorProto.INT64, []), ("c_in", TensorProto.BOOL, []), ("h_in", F, None)],
        [("c_out", TensorProto.BOOL, []), *[(n, F, None) for n in body_outputs]],
    )
    inputs = ["", "cond", "x"] if cond else ["M", "", "x"]
    nodes = [N("Loop", inputs, outputs, body=body, name="loop"), *downstream]
    inits = [weight("W", (6, 6))] + ([] if cond else [const("M", 4)])
    m = model(nodes, {"x": (3, 6)}, [n.output[0] for n in downstream], inits)
    if cond:
        m.graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    return m


def test_loop_outputs_get_shapes_for_what_follows():
    # carried h keeps x's [3, 6] (h @ W[6, 6]); the scan output stacks Relu(h) over M = 4 trips
    m = loop_then([N("MatMul", ["h_in", "W"], ["h_out"]), N("Relu", ["h_out"], ["s"])], ["h_out", "s"], ["h", "scan"],
                  [N("Relu", ["h"], ["y"], name="after_h"), N("Sigmoid", ["scan"], ["z"], name="after_scan")])
    by = {n.name: n for n in flopcount.count(m).nodes}
    assert by["loop"].cost.flops == 4 * (2 * 3 * 6 * 6 + 3 * 6)
    assert by["after_h"].outputs[0].shape == (3, 6) and by["after_h"].cost.flops == 3 * 6
    assert by["after_scan"].outputs[0].shape == (4, 3, 6) and by["after_scan"].cost.flops == 4 * 3 * 6


def test_loop_value_that_grows_stays_unknown():
    # h = Concat(h, h) doubles every iteration: no static shape, so what follows cannot be counted
    m = loop_then([N("Concat", ["h_in", "h_in"], ["h_out"], axis=0)], ["h_out"], ["h"], [N("Relu", ["h"], ["y"], name="after")])
    with pytest.raises(flopcount.ShapeError, match="'y'"):
        flopcount.count(m)


def test_loop_with_a_condition_has_scan_outputs_as_long_as_the_given_trips():
    # a while loop (no M): its scan output is unknown until --loop-trips gives N, then N long
    m = loop_then([N("MatMul", ["h_in", "W"], ["h_out"]), N("Relu", ["h_out"], ["s"])], ["h_out", "s"], ["h", "scan"],
                  [N("Relu", ["h"], ["y"], name="after_h"), N("Sigmoid", ["scan"], ["z"], name="after_scan")], cond=True)
    with pytest.raises(flopcount.ShapeError, match="--loop-trips loop=N"):
        flopcount.count(m)
    by = {n.name: n for n in flopcount.count(m, loop_trips={"loop": 4}).nodes}
    assert by["after_h"].cost.flops == 3 * 6
    assert by["after_scan"].outputs[0].shape == (4, 3, 6) and by["after_scan"].cost.flops == 4 * 3 * 6


# --- backward (mode="train") -----------------------------------------------------------------------


def captured_weight_loop(trips=4, carried_from_weight=False):
    """Loop(M) over h (starting from data x[3, 6], or from x @ V[6, 6]) with body h @ W[6, 6] + Relu,
    W read from the outer scope."""
    body = body_graph(
        [N("MatMul", ["h_in", "W"], ["mm"]), N("Relu", ["mm"], ["h_out"]), N("Identity", ["c_in"], ["c_out"])],
        [("i", TensorProto.INT64, []), ("c_in", TensorProto.BOOL, []), ("h_in", F, [3, 6])],
        [("c_out", TensorProto.BOOL, []), ("h_out", F, [3, 6])],
    )
    nodes = [N("Loop", ["M", "", "h0"], ["h"], body=body, name="loop")]
    inits = [weight("W", (6, 6)), const("M", trips)]
    if carried_from_weight:
        nodes.insert(0, N("MatMul", ["x", "V"], ["h0"], name="first"))
        inits.append(weight("V", (6, 6)))
    else:
        nodes.insert(0, N("Identity", ["x"], ["h0"], name="first"))
    return model(nodes, {"x": (3, 6)}, ["h"], inits)


MM = 3 * 6 * 6  # MACs of h @ W
RELU = 3 * 6


def test_loop_backward_through_time():
    # first iteration: h_in is data, so dW (2·MM) and Relu's mask (RELU); later iterations also dh_in (2·MM)
    r = flopcount.count(captured_weight_loop(), mode="train")
    loop = next(n for n in r.nodes if n.name == "loop")
    first, later = 2 * MM + RELU, 4 * MM + RELU
    assert loop.backward.flops == first + 3 * later
    assert not r.backward_unsupported and r.trainable_params == 36


def test_loop_backward_when_the_initial_value_needs_a_gradient():
    r = flopcount.count(captured_weight_loop(trips=5, carried_from_weight=True), mode="train")
    loop = next(n for n in r.nodes if n.name == "loop")
    assert loop.backward.flops == 5 * (4 * MM + RELU)
    assert r.trainable_params == 2 * 36


def test_if_backward_counts_the_larger_branch():
    # then: x @ W (dW: 2·3·5·7), else: Relu(x) with x data (nothing needs a gradient)
    m = if_model(cond_input=True)
    r = flopcount.count(m, mode="train")
    assert r.nodes[0].backward.flops == 2 * 3 * 5 * 7
    assert not r.backward_unsupported


def test_scan_backward_over_its_steps():
    # state s[4] += x_t @ W[5, 4] over 7 steps of x[7, 5] (data); W captured: per step dW (2·5·4) + the Add's
    # dB (free), and from step 2 on the state gradient flows through the Add (free) and nothing else
    body = body_graph(
        [N("MatMul", ["x_t", "W"], ["p"]), N("Add", ["s_in", "p"], ["s_out"]), N("Identity", ["s_out"], ["y_t"])],
        [("s_in", F, [4]), ("x_t", F, [5])],
        [("s_out", F, [4]), ("y_t", F, [4])],
    )
    nodes = [N("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1, name="scan")]
    m = model(nodes, {"s0": (4,), "xs": (7, 5)}, ["s", "ys"], [weight("W", (5, 4))])
    r = flopcount.count(m, mode="train")
    assert r.nodes[0].backward.flops == 7 * (2 * 5 * 4)
    assert not r.backward_unsupported


def test_negative_trip_counts_are_refused():
    with pytest.raises(flopcount.ShapeError, match="cannot be negative"):
        flopcount.count(loop_model(-3))
    with pytest.raises(flopcount.UsageError, match="non-negative integers"):
        flopcount.count(loop_model(None), loop_trips={"steps": -1})


# --- Loops as exporters write them (tf2onnx: every state declared ['unk__N', H], M and a condition) --------------


def declared_loop(body_nodes, body_outputs, outputs, downstream, state_dims=("unk__477", 6), cond=True):
    """Loop(M = 4, a condition computed at run time, h0 = x[3, 6]) whose body declares its carried state with
    ``state_dims`` (tf2onnx writes a symbolic first dim), followed by ``downstream``."""
    body = body_graph(
        [*body_nodes, N("Identity", ["c_in"], ["c_out"])],
        [("i", TensorProto.INT64, []), ("c_in", TensorProto.BOOL, []), ("h_in", F, list(state_dims))],
        [("c_out", TensorProto.BOOL, []), *[(n, F, ["unk__478", 6]) for n in body_outputs]],
    )
    nodes = [N("Loop", ["M", "cond" if cond else "", "x"], outputs, body=body, name="loop"), *downstream]
    m = model(nodes, {"x": (3, 6)}, [n.output[0] for n in downstream], [weight("W", (6, 6)), const("M", 4)])
    if cond:
        m.graph.input.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    return m


@pytest.mark.parametrize("state_dims", [pytest.param(("unk__477", 6), id="symbolic"),
                                        pytest.param((None, 6), id="empty"),
                                        pytest.param(("unk__477", "unk__479"), id="both-symbolic")])
def test_a_state_declared_with_open_dims_takes_the_outer_known_ones(state_dims):
    # h = h @ W[6, 6] over M = 4 iterations of x[3, 6]: the body's 'unk__477' is the outer 3
    m = declared_loop([N("MatMul", ["h_in", "W"], ["h_out"])], ["h_out"], ["h"], [N("Relu", ["h"], ["y"], name="after")],
                      state_dims=state_dims, cond=False)
    by = {n.name: n for n in flopcount.count(m).nodes}
    assert by["loop"].cost.flops == 4 * 2 * 3 * 6 * 6
    assert by["after"].outputs[0].shape == (3, 6) and by["after"].cost.flops == 3 * 6


def test_a_state_the_body_gives_back_with_another_shape_keeps_its_open_dim():
    # h = Concat(h, h) doubles each iteration: 3 rows only in the first one, so Relu(h) in the body has no one shape
    m = declared_loop([N("Concat", ["h_in", "h_in"], ["h_out"], axis=0), N("Relu", ["h_out"], ["r"], name="grow")],
                      ["h_out"], ["h"], [N("Identity", ["h"], ["y"])], cond=False)
    with pytest.raises(flopcount.ShapeError, match="'grow'"):
        flopcount.count(m)


def stacked_loops():
    """Two Loops as tf2onnx writes stacked recurrent layers: the first stacks Relu(h @ W) over its M = 4 trips (a
    condition may end it earlier), the second runs once per row of that stack (M = Shape(stack)[0])."""
    first = declared_loop([N("MatMul", ["h_in", "W"], ["h_out"]), N("Relu", ["h_out"], ["s"])], ["h_out", "s"],
                          ["h", "stack"], [])
    body2 = body_graph(
        [N("Gather", ["stack", "j"], ["row"], axis=0), N("Add", ["g_in", "row"], ["g_out"]),
         N("Identity", ["c_in"], ["c_out"])],
        [("j", TensorProto.INT64, []), ("c_in", TensorProto.BOOL, []), ("g_in", F, ["unk__480", 6])],
        [("c_out", TensorProto.BOOL, []), ("g_out", F, ["unk__481", 6])],
    )
    g = first.graph
    g.node.extend([
        N("Shape", ["stack"], ["shape"]), N("Gather", ["shape", "zero"], ["M2"], axis=0),
        N("Loop", ["M2", "cond", "x"], ["g"], body=body2, name="second"),
    ])
    g.initializer.append(const("zero", 0))
    g.output.append(helper.make_tensor_value_info("g", F, None))
    return first


def test_a_stacked_output_takes_the_maximum_trip_count_as_its_length_and_says_so():
    # the stack is M = 4 long at most; the second Loop's trip count follows from it without --loop-trips
    r = flopcount.count(stacked_loops())
    by = {n.name: n for n in r.nodes}
    assert by["loop"].cost.flops == 4 * (2 * 3 * 6 * 6 + 3 * 6)
    assert by["second"].cost.flops == 4 * 3 * 6
    assert r.upper_bounds["Loop"][0] == 2
    assert "its stacked output taken 4 long" in by["loop"].bound and "condition may end it earlier" in by["loop"].bound


def test_a_stacked_output_of_a_loop_without_a_trip_count_still_asks_for_it_by_name():
    m = stacked_loops()
    m.graph.node[0].input[0] = ""  # the first Loop: a while loop (no M)
    with pytest.raises(flopcount.ShapeError, match=r"--loop-trips loop=N"):
        flopcount.count(m)
