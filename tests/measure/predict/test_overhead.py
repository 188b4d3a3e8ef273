"""The framework's part of a predicted step against closed forms: the kernels of a small hand-written graph (its
forward nodes with work, its backward products from the backward rule), the optimizer step from the profile's
per-tensor and per-element timing or, in a profile taken before it was measured, its bytes with a note, and the
attention products timed at the fused attention's rates."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from helpers import model, weight
from onnx import helper

from flopcount.measure.machine.calibration import Collective, MachineProfile, OptimizerCost, Point, Segment
from flopcount.measure.predict import (NodeWork, RankWork, Work, backward_kernels, node_seconds, predict,
                                       predict_work, work_of)

OV_F, OV_B = 3e-6, 5e-6  # per operator, forward and backward
PER_TENSOR, PER_ELEMENT = 20e-6, 2e-9
W = 20e9  # elementwise bytes/s
R = 50e9  # GEMM FLOP/s


def _flat(v: float) -> tuple[Point, ...]:
    return (Point(1, v, v, v),)


def profile(optimizers: bool = True, attention: float | None = None) -> MachineProfile:
    seg = Segment(0, math.inf, {"median": 0.0, "best": 0.0}, {"median": 1e9, "best": 1e9})
    compute = {"gemm": _flat(R), "elementwise": _flat(W)}
    if attention:
        compute.update({"attention": _flat(attention), "attention_backward": _flat(attention / 2)})
    opt = {"adamw": OptimizerCost(Point(1, PER_TENSOR, PER_TENSOR, PER_TENSOR), _flat(PER_ELEMENT), False)}
    return MachineProfile(True, "cpu", 1, compute,
                          {"forward": Point(1, OV_F, OV_F, OV_F), "backward": Point(1, OV_B, OV_B, OV_B)},
                          {"all_reduce": Collective(0, (), (seg,))}, R, optimizers=opt if optimizers else None)


def _mlp():
    """x[4, 8] (data) · W1[8, 16] → Relu → · W2[16, 4] → + b[4]: 4 nodes with work; backward kernels: dW1 only
    (x needs no gradient) 1, Relu 1, dr and dW2 2, Add 1: 5; parameter tensors 3 of 8·16 + 16·4 + 4 elements."""
    import flopcount

    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "W2"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])]
    m = model(nodes, {"x": (4, 8)}, ["z"], [weight("W1", (8, 16)), weight("W2", (16, 4)), weight("b", (4,))])
    return flopcount.count(m, mode="train", optimizer="adamw")


def test_backward_kernels_from_the_backward_rule():
    assert backward_kernels(100, 200, 400) == 2  # a product with both operands needing a gradient
    assert backward_kernels(100, 100, 200) == 1  # only the weight's
    assert backward_kernels(0, 0, 12) == 1 and backward_kernels(0, 0, 0) == 0
    rank = work_of(_mlp()).ranks[0]
    assert [w.backward_kernels for w in rank.chunks[0]] == [1, 1, 2, 1]


def test_the_overhead_of_a_hand_written_graph_and_its_optimizer():
    report = _mlp()
    p = predict(report, profile())
    row = p.ranks[0]
    elements = 8 * 16 + 16 * 4 + 4
    assert row["overhead_seconds"] == pytest.approx(4 * OV_F + 5 * OV_B + 3 * PER_TENSOR)
    assert row["optimizer_seconds"] == pytest.approx(3 * PER_TENSOR + elements * PER_ELEMENT)
    nodes = work_of(report).ranks[0].chunks[0]
    compute = sum(sum(node_seconds(w, profile())[:2]) for w in nodes)
    assert row["compute_seconds"] == pytest.approx(compute)
    assert p.step_seconds == pytest.approx(compute + 3 * PER_TENSOR + elements * PER_ELEMENT)
    assert not any("no timing of the adamw step" in n for n in p.notes)
    assert "framework overhead" in "\n".join(p.lines())


def test_a_profile_without_the_optimizer_timing_leaves_its_per_tensor_cost_out_and_says_so():
    p = predict(_mlp(), profile(optimizers=False))
    row = p.ranks[0]
    elements = 8 * 16 + 16 * 4 + 4
    assert row["optimizer_seconds"] == pytest.approx(elements * 4 * 7 / W)  # adamw: 7 bytes a byte, fp32
    assert row["overhead_seconds"] == pytest.approx(4 * OV_F + 5 * OV_B)
    assert any("no timing of the adamw step" in n and "left out" in n for n in p.notes)


def test_per_element_cost_at_the_tensors_size():
    """Two modules of one tensor each, of 10 and 1000 elements, timed at 1 ns and 3 ns an element at those
    sizes: 10·1 + 1000·3 ns, plus two tensors' cost."""
    pts = (Point(10, 1e-9, 1e-9, 1e-9), Point(1000, 3e-9, 3e-9, 3e-9))
    prof = replace(profile(), optimizers={"adamw": OptimizerCost(Point(1, PER_TENSOR, PER_TENSOR, PER_TENSOR), pts,
                                                                 False)})
    rank = RankWork(0, 0, 0, {0: ()}, (), 0.0, 0.0, 0.0, "adamw", ((1, 10.0), (1, 1000.0)))
    p = predict_work(Work((rank,), {"microbatches": 1, "pp": 1, "virtual": 1, "schedule": "1f1b"}, None), prof)
    assert p.ranks[0]["optimizer_seconds"] == pytest.approx(2 * PER_TENSOR + 10e-9 + 3000e-9)


def test_attention_products_at_the_fused_attentions_rates():
    import flopcount

    q, k = (2, 4, 8, 16), (2, 4, 16, 8)
    m = model([helper.make_node("MatMul", ["q", "k"], ["s"])], {"q": q, "k": k}, ["s"])
    w = work_of(flopcount.count(m)).ranks[0].chunks[0][0]
    assert w.kind == "attention" and w.matrices == 8
    flops = 2 * 2 * 4 * 8 * 16 * 8
    fwd, _, _ = node_seconds(NodeWork("attention", flops, 0.0), profile(attention=10e9))
    assert fwd == pytest.approx(flops / 10e9 + OV_F)
    _, bwd, _ = node_seconds(NodeWork("attention", flops, 0.0, 2 * flops, backward_kernels=2),
                             profile(attention=10e9))
    assert bwd == pytest.approx(2 * flops / 5e9 + 2 * OV_B)  # the backward's own rate
    _, bwd, _ = node_seconds(NodeWork("attention", flops, 0.0, 2 * flops, backward_kernels=2), profile())
    assert bwd == pytest.approx(2 * flops / R + 2 * OV_B)  # not calibrated: the GEMM rate
    plain = model([helper.make_node("MatMul", ["x", "W"], ["y"])], {"x": (2, 8, 16)}, ["y"], [weight("W", (16, 8))])
    assert work_of(flopcount.count(plain)).ranks[0].chunks[0][0].kind == "gemm"
    p = predict_work(Work((RankWork(0, 0, 0, {0: (w,)}, (), 0.0, 0.0),),
                          {"microbatches": 1, "pp": 1, "virtual": 1, "schedule": "1f1b"}, None), profile())
    assert any("no timing of fused attention" in n for n in p.notes)


def test_a_datasheet_profile_measures_no_overhead_so_it_is_null():
    from flopcount.measure.machine.calibration import device_profile

    p = predict(_mlp(), device_profile("H100", ranks=1, dtype="fp32"))
    assert all(row["overhead_seconds"] is None for row in p.ranks)  # not measured: null, never 0
    assert "framework overhead not known (datasheet profile)" in "\n".join(p.lines())
    # the same graph on a calibrated profile has its overhead: the null is the datasheet's, not the graph's
    assert predict(_mlp(), profile()).ranks[0]["overhead_seconds"] > 0


def test_a_weight_product_runs_as_one_product_of_its_rows():
    """A 3-D input times a 2-D weight is one product whose rows are the input's batch and tokens: torch's linear
    runs it as one aten mm of [b·s, k] × [k, n] (recorded under a dispatch mode), and the node's effective size is
    that product's ∛(b·s·k·n), not a batch of b products'."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode

    import flopcount

    b, s, k, n = 4, 16, 32, 24
    m = model([helper.make_node("MatMul", ["x", "w"], ["y"])], {"x": (b, s, k)}, ["y"], [weight("w", (k, n))])
    w = work_of(flopcount.count(m)).ranks[0].chunks[0][0]
    shapes = []

    class Products(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.bmm):
                shapes.append((*args[0].shape, args[1].shape[-1]))
            return func(*args, **(kwargs or {}))

    with Products():
        torch.nn.functional.linear(torch.randn(b, s, k), torch.randn(n, k))
    assert shapes == [(b * s, k, n)]
    assert w.kind == "gemm" and w.matrices == 1
    assert (w.flops / 2 / w.matrices) ** (1 / 3) == pytest.approx(math.prod(shapes[0]) ** (1 / 3))
