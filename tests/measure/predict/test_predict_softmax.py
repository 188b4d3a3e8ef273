"""A softmax priced at the profile's softmax rates: its FLOPs (R·(5n − 2) forward, R·(4n − 1) backward for R rows
of n, written out here) over the calibrated FLOP/s, or its bytes where they take longer; without the rates, its
bytes at the elementwise rate and a note saying so."""

from __future__ import annotations

import math
from dataclasses import replace

from helpers import model, weight
from onnx import helper

from flopcount.measure.machine.calibration import Collective, MachineProfile, Point, Segment
from flopcount.measure.predict import node_seconds, predict_work, work_of
from flopcount.measure.predict_report import node_works

OV_F, OV_B = 3e-6, 5e-6
W = 20e9  # elementwise bytes/s
S, SB = 2e9, 3e9  # softmax FLOP/s, forward and backward
R, N = 8, 64  # rows, row length


def _profile(softmax: bool = True) -> MachineProfile:
    seg = Segment(0, math.inf, {"median": 0.0, "best": 0.0}, {"median": 1e9, "best": 1e9})
    flat = lambda v: (Point(1, v, v, v),)  # noqa: E731
    compute = {"gemm": flat(50e9), "elementwise": flat(W)}
    if softmax:
        compute |= {"softmax": flat(S), "softmax_backward": flat(SB)}
    return MachineProfile(True, "cpu", 1, compute, {"forward": Point(1, OV_F, OV_F, OV_F),
                                                   "backward": Point(1, OV_B, OV_B, OV_B)},
                          {"all_reduce": Collective(0, (), (seg,))}, 50e9)


def _report():
    import flopcount

    nodes = [helper.make_node("Mul", ["x", "w"], ["h"]), helper.make_node("Softmax", ["h"], ["y"], axis=-1)]
    return flopcount.count(model(nodes, {"x": (R, N)}, ["y"], [weight("w", (N,))]), mode="train")


def test_a_softmax_runs_its_flops_at_the_softmax_rates():
    work = next(w for n, w in node_works(_report()) if n.op_type == "Softmax")
    assert work.kind == "softmax"
    f, b, _ = node_seconds(work, _profile())
    assert math.isclose(f, R * (5 * N - 2) / S + OV_F) and math.isclose(b, R * (4 * N - 1) / SB + OV_B)
    # bytes that take longer decide: R·N float32 read and written, twice in the backward
    slow = replace(_profile(), compute={**_profile().compute, "elementwise": (Point(1, 1e6, 1e6, 1e6),)})
    f, b, _ = node_seconds(work, slow)
    assert math.isclose(f, 8 * R * N / 1e6 + OV_F) and math.isclose(b, 16 * R * N / 1e6 + OV_B)


def test_without_the_rates_a_softmax_is_its_bytes_and_said():
    work = next(w for n, w in node_works(_report()) if n.op_type == "Softmax")
    f, b, _ = node_seconds(work, _profile(False))
    assert math.isclose(f, 8 * R * N / W + OV_F) and math.isclose(b, 16 * R * N / W + OV_B)
    notes = predict_work(work_of(_report()), _profile(False)).notes
    assert any("no timing of a softmax" in n for n in notes)
    assert not any("no timing of a softmax" in n for n in predict_work(work_of(_report()), _profile()).notes)


CE, CEB = 1.5e9, 0.8e9  # cross-entropy FLOP/s, forward and backward


def _loss_report():
    """A mean SoftmaxCrossEntropyLoss of R rows of N scores against a class per row."""
    import flopcount
    from onnx import TensorProto

    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["h"]),
         helper.make_node("SoftmaxCrossEntropyLoss", ["h", "labels"], ["y"], reduction="mean")], "loss",
        [info("x", TensorProto.FLOAT, [R, N]), info("labels", TensorProto.INT64, [R])],
        [info("y", TensorProto.FLOAT, [])], [weight("w", (N,))])
    return flopcount.count(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), mode="train")


def test_a_cross_entropy_loss_runs_its_flops_at_the_cross_entropy_rates():
    """The loss's FLOPs, T·(5C − 1) for the log-softmax, then T negations, T − 1 additions and a division for the
    mean: R·(5N + 1) forward; R·(2N + 1) + 1 backward (exps, the multiply by the gradient and the label's
    subtraction per row, one division), over the calibrated cross-entropy rates."""
    work = next(w for n, w in node_works(_loss_report()) if n.op_type == "SoftmaxCrossEntropyLoss")
    assert work.kind == "cross_entropy"
    timed = _profile()
    timed = replace(timed, compute={**timed.compute, "cross_entropy": (Point(1, CE, CE, CE),),
                                    "cross_entropy_backward": (Point(1, CEB, CEB, CEB),)})
    f, b, _ = node_seconds(work, timed)
    assert math.isclose(f, R * (5 * N + 1) / CE + OV_F) and math.isclose(b, (R * (2 * N + 1) + 1) / CEB + OV_B)
    assert not any("cross-entropy" in n for n in predict_work(work_of(_loss_report()), timed).notes)


def test_a_profile_without_cross_entropy_rates_prices_the_loss_as_a_softmax_and_says_so():
    work = next(w for n, w in node_works(_loss_report()) if n.op_type == "SoftmaxCrossEntropyLoss")
    f, b, _ = node_seconds(work, _profile())
    assert math.isclose(f, R * (5 * N + 1) / S + OV_F) and math.isclose(b, (R * (2 * N + 1) + 1) / SB + OV_B)
    notes = predict_work(work_of(_loss_report()), _profile()).notes
    assert any("no timing of a cross-entropy loss" in n for n in notes)
