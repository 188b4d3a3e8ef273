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
