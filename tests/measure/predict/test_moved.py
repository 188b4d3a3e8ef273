"""Work without FLOPs priced against closed forms of the bytes a small hand-written graph moves: a concatenation
writes its output and reads as many bytes, a slice is a view whose backward writes its input's gradient whole
(zeros, then the slice's part), reshapes and transposes move nothing, and a tensor read by k nodes that need its
gradient has k - 1 gradient additions of its bytes (two reads and a write) in the backward."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from helpers import const, model, weight
from onnx import helper

from flopcount.measure.machine.calibration import Collective, MachineProfile, Point, Segment
from flopcount.measure.predict import node_seconds, predict_work, work_of
from flopcount.measure.predict_report import node_works

OV_F, OV_B = 3e-6, 5e-6  # per operator, forward and backward
W = 20e9  # elementwise bytes/s
R = 50e9  # GEMM FLOP/s
F32 = 4


def _profile() -> MachineProfile:
    seg = Segment(0, math.inf, {"median": 0.0, "best": 0.0}, {"median": 1e9, "best": 1e9})
    flat = lambda v: (Point(1, v, v, v),)  # noqa: E731
    return MachineProfile(True, "cpu", 1, {"gemm": flat(R), "elementwise": flat(W)},
                          {"forward": Point(1, OV_F, OV_F, OV_F), "backward": Point(1, OV_B, OV_B, OV_B)},
                          {"all_reduce": Collective(0, (), (seg,))}, R)


def _graph(mode: str):
    """x[4, 8] (data) · W[8, 16] → h[4, 16]; h's halves a = h[:, :8], b = h[:, 8:] (two Slices) concatenated
    swapped → c[4, 16]; z = c · h (Mul); its transpose and a reshape of it the outputs. h is read by the two
    slices and the Mul: three readers that need its gradient."""
    import flopcount

    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Slice", ["h", "s0", "s8", "ax"], ["a"]),
             helper.make_node("Slice", ["h", "s8", "s16", "ax"], ["b"]),
             helper.make_node("Concat", ["b", "a"], ["c"], axis=1),
             helper.make_node("Mul", ["c", "h"], ["z"]),
             helper.make_node("Transpose", ["z"], ["t"], perm=[1, 0]),
             helper.make_node("Reshape", ["t", "flat"], ["r"])]
    inits = [weight("W", (8, 16)), const("s0", [0]), const("s8", [8]), const("s16", [16]), const("ax", [1]),
             const("flat", [64])]
    m = model(nodes, {"x": (4, 8)}, ["r"], inits)
    return flopcount.count(m, mode=mode, optimizer="adamw" if mode == "train" else None)


H = 4 * 16 * F32  # bytes of h, c and z
HALF = 4 * 8 * F32  # bytes of a slice


def test_the_moved_bytes_of_each_node_in_training():
    works = {n.op_type + (n.outputs[0].name if n.op_type == "Slice" else ""): w
             for n, w in node_works(_graph("train"))}
    assert set(works) == {"MatMul", "Slicea", "Sliceb", "Concat", "Mul"}  # no transpose or reshape
    assert works["Concat"].bytes == 2 * H and not works["Concat"].moved_bytes  # its gradients: views of dc
    for s in ("Slicea", "Sliceb"):  # a view forward; backward zeros of h, then the half read and written
        assert works[s].bytes == 0 and works[s].moved_bytes == H + 2 * HALF
    assert works["MatMul"].sums == 2 and works["MatMul"].sum_bytes == 3 * H  # h's three readers
    assert works["Mul"].sums == 0  # z read once


@pytest.mark.parametrize("copy", [None, 7e9], ids=["elementwise-rate", "copy-rate"])
def test_the_moved_seconds_of_a_training_step(copy):
    """The concatenation and the slices' backward at the profile's copy rate C (a strided copy), at the elementwise
    rate where it has none; the gradient sums, additions, at the elementwise rate either way."""
    p = _profile() if copy is None else replace(_profile(), compute={**_profile().compute,
                                                                      "copy": (Point(1, copy, copy, copy),)})
    c = copy or W
    works = dict((n.op_type + n.outputs[0].name, w) for n, w in node_works(_graph("train")))
    f, b, _ = node_seconds(works["Concatc"], p)
    assert math.isclose(f, 2 * H / c + OV_F) and b == 0
    f, b, _ = node_seconds(works["Slicea"], p)
    assert f == 0 and math.isclose(b, (H + 2 * HALF) / c + OV_B)
    f0, b0, _ = node_seconds(replace(works["MatMulh"], sums=0.0), p)
    f, b, _ = node_seconds(works["MatMulh"], p)
    assert f == f0 and math.isclose(b - b0, 2 * (3 * H / W + OV_B))


def test_a_profile_without_a_copy_rate_says_so():
    c = 7e9
    p = replace(_profile(), compute={**_profile().compute, "copy": (Point(1, c, c, c),)})
    work = work_of(_graph("train"))
    assert not any("no timing of a copy" in n for n in predict_work(work, p).notes)
    assert any("no timing of a copy" in n for n in predict_work(work, _profile()).notes)


def test_shape_arithmetic_moves_nothing():
    """A concatenation of int64 shape pieces (the exporter's arithmetic for a Reshape's target) is no copy of the
    model's data: no work; the float concatenation beside it is."""
    import flopcount

    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]),
             helper.make_node("Concat", ["d0", "d1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["h", "shape"], ["r"]),
             helper.make_node("Concat", ["r", "r"], ["c"], axis=1)]
    m = model(nodes, {"x": (4, 8)}, ["c"], [weight("W", (8, 16)), const("d0", [8]), const("d1", [8])])
    works = {n.outputs[0].name: w for n, w in node_works(flopcount.count(m, mode="inference"))}
    assert set(works) == {"h", "c"} and works["c"].bytes == 2 * 2 * H


def test_inference_has_no_gradient_work():
    works = {n.op_type: w for n, w in node_works(_graph("inference"))}
    assert set(works) == {"MatMul", "Concat", "Mul"}  # slices are views, no backward
    assert works["Concat"].bytes == 2 * H and works["MatMul"].sums == 0


def test_the_step_holds_the_moved_work():
    """The one-rank step less the same step without the work of nodes without FLOPs and the gradient sums."""
    p = _profile()
    work = work_of(_graph("train"))
    rank = work.ranks[0]
    bare = tuple(replace(w, sums=0.0) for w in rank.chunks[0] if w.flops or w.backward_flops)
    without = replace(work, ranks=(replace(rank, chunks={0: bare}),))
    moved = 2 * H / W + OV_F + 2 * ((H + 2 * HALF) / W + OV_B) + 2 * (3 * H / W + OV_B)
    step = predict_work(work, p).ranks[0]["step_seconds"]
    assert math.isclose(step - predict_work(without, p).ranks[0]["step_seconds"], moved)


@pytest.mark.slow
def test_each_layer_of_a_repeated_stack_has_the_same_sums_and_moved_bytes():
    """A Llama of 2, 3 and 4 layers (3 and 4 copies of the exported second layer, their tensors under its names):
    each layer added adds the same gradient sums and the same bytes moved without FLOPs."""
    pytest.importorskip("transformers")
    from helpers import tiny_llama

    found = []
    for layers in (2, 3, 4):
        works = [w for _, w in node_works(tiny_llama(64, layers, 4, 2, 128, 256, (2, 16), optimizer="adamw"))]
        found.append((sum(w.sums for w in works), sum(w.sums * w.sum_bytes for w in works),
                      sum(w.moved_bytes for w in works), sum(w.bytes for w in works if not w.flops)))
    step = [b - a for a, b in zip(found[1], found[2])]
    assert all(s > 0 for s in step) and step == [b - a for a, b in zip(found[0], found[1])]


def _extra(works) -> tuple[float, float, float]:
    """(bytes copied forward by nodes without FLOPs, bytes moved in their backward, bytes of the gradient sums) of
    ``works``."""
    works = list(works)
    return (sum(w.bytes for w in works if not w.flops and not w.backward_flops),
            sum(w.moved_bytes for w in works), sum(w.sums * w.sum_bytes for w in works))


def _planned(report, text: str, microbatches: int = 2):
    import dataclasses

    from flopcount.parallel.plan import parse_parallel
    from flopcount.plans import parallel_ledger

    plan = parse_parallel(text, microbatches, "1f1b")
    return work_of(dataclasses.replace(report, parallel=parallel_ledger(report, plan)))


@pytest.fixture(scope="module")
def llama4():
    pytest.importorskip("transformers")
    from helpers import tiny_llama

    return tiny_llama(64, 4, 4, 2, 128, 256, (2, 16), optimizer="adamw")


def test_a_plan_of_one_rank_is_the_one_rank_prediction(llama4):
    """dp=1 through the per-rank ledger predicts the step of the count on one rank: the same works without FLOPs."""
    alone = predict_work(work_of(llama4), _profile()).ranks[0]["step_seconds"]
    planned = _planned(llama4, "dp=1", 1)
    assert predict_work(planned, _profile()).ranks[0]["step_seconds"] == pytest.approx(alone, rel=1e-12)


def test_the_stages_hold_the_work_without_flops_once(llama4):
    """Over pp=2 each stage holds its nodes' work without FLOPs: the two stages' backward moves and gradient sums
    are the one rank's; their forward copies at least the one rank's (the rotary tables are made again on each
    stage)."""
    one = _extra(w for _, w in node_works(llama4))
    stages = _planned(llama4, "pp=2").ranks
    assert {r.stage for r in stages} == {0, 1}
    each = [_extra(w for ws in r.chunks.values() for w in ws) for r in stages]
    assert all(e[0] > 0 and e[1] > 0 and e[2] > 0 for e in each)
    assert [a + b for a, b in zip(*each)][1:] == pytest.approx(list(one)[1:], rel=1e-12)
    assert one[0] <= each[0][0] + each[1][0] < 2 * one[0]


def test_tensor_parallel_ranks_share_the_work_without_flops(llama4):
    """Over tp=2 a node split over TP moves half its bytes on each rank and a replicated one all of them: each rank
    less than one rank's, the two together at least one rank's; with sp the sequence's nodes split too (less)."""
    one = _extra(w for _, w in node_works(llama4))
    for text in ("tp=2", "tp=2,sp"):
        ranks = _planned(llama4, text).ranks
        each = [_extra(w for ws in r.chunks.values() for w in ws) for r in ranks]
        assert len(each) == 2 and each[0] == each[1]
        assert all(0 < e < o for e, o in zip(each[0], one)) and all(2 * e >= o for e, o in zip(each[0], one))
        if text == "tp=2":
            plain = each[0]
    # under sp the norms' and residuals' backward moves and sums split too
    assert each[0][0] <= plain[0] and each[0][1] < plain[1] and each[0][2] < plain[2]
