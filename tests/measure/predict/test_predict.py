"""The predictor's arithmetic against closed forms on hand-made work and profiles: a GEMM's 2·m·k·n / R, the larger
of FLOPs and bytes, the per-operator overhead, exposed tensor-parallel time, DDP buckets overlapping the backward,
the 1F1B pipeline's (M + P − 1)·(f + b), MFU, and the interval widened outside the calibration; then the command
line on a one-node graph against the datasheet profile."""

from __future__ import annotations

import json
import math

import pytest
from helpers import single, weight

from flopcount.measure.machine.calibration import Collective, MachineProfile, Point, Segment
from flopcount.measure.predict import (Message, NodeWork, RankWork, Work, exposed_after, node_seconds,
                                       predict_work)

R = 50e9  # GEMM FLOP/s
W = 20e9  # elementwise bytes/s
LAT, BW = 30e-6, 1e9  # every collective: latency and bus bandwidth


def _flat(v: float, sizes=(1.0,)) -> tuple[Point, ...]:
    return tuple(Point(s, v, v, v) for s in sizes)


def profile(overhead: float = 0.0, gemm_sizes=(1.0,)) -> MachineProfile:
    seg = Segment(0, math.inf, {"median": LAT, "best": LAT}, {"median": BW, "best": BW})
    ov = Point(1, overhead, overhead, overhead)
    return MachineProfile(True, "cpu", 2, {"gemm": _flat(R, gemm_sizes), "elementwise": _flat(W)},
                          {"forward": ov, "backward": ov},
                          {k: Collective(0, (), (seg,)) for k in ("all_reduce", "send_recv")}, peak_flops_per_s=R)


def one_rank(nodes, messages=(), m: int = 1, pp: int = 1, stage: int = 0, rank: int = 0, chunk=None) -> RankWork:
    flops = sum(w.flops + w.backward_flops for w in nodes) * m
    return RankWork(rank, stage, 0, {stage if chunk is None else chunk: tuple(nodes)}, tuple(messages), flops, flops)


def plan(m=1, pp=1, schedule="1f1b") -> dict:
    return {"microbatches": m, "pp": pp, "virtual": 1, "schedule": schedule}


def test_one_gemm_is_2mkn_over_the_rate():
    m, k, n = 37, 91, 23
    w = NodeWork("gemm", 2 * m * k * n, 4 * (m * k + k * n + m * n), backward_flops=4 * m * k * n)
    fwd, bwd, _ = node_seconds(w, profile(), "median")
    assert fwd == pytest.approx(2 * m * k * n / R)  # 2mkn/R is above the bytes' 4(mk+kn+mn)/W here
    assert bwd == pytest.approx(4 * m * k * n / R)
    p = predict_work(Work((one_rank([w]),), plan(), tokens=m), profile())
    assert p.step_seconds == pytest.approx(6 * m * k * n / R)
    assert p.mfu == pytest.approx(1.0) and p.tokens_per_second == pytest.approx(m / p.step_seconds)


def test_the_larger_of_flops_and_bytes_and_the_overhead():
    nbytes = 8 << 20
    w = NodeWork("elementwise", 1000, nbytes, backward_flops=1000)
    fwd, bwd, _ = node_seconds(w, profile(overhead=5e-6), "median")
    assert fwd == pytest.approx(nbytes / W + 5e-6)  # bytes dominate; the overhead once forward
    assert bwd == pytest.approx(2 * nbytes / W + 5e-6)  # the backward moves twice the forward's bytes
    g = NodeWork("gemm", 2 * 64 ** 3, 1 << 30)  # a product starved by its bytes
    assert node_seconds(g, profile(), "median")[0] == pytest.approx((1 << 30) / W)


def test_effective_size_of_a_batched_product_and_extrapolation():
    # gemm rates at n = 64 and 256: a batch of 4 products of 128³ runs at the interpolated rate (log2 halfway)
    p = MachineProfile(True, "cpu", 1, {"gemm": (Point(64, 10e9, 10e9, 10e9), Point(256, 30e9, 30e9, 30e9)),
                                        "elementwise": _flat(1e15)},
                       {"forward": Point(1, 0, 0, 0), "backward": Point(1, 0, 0, 0)}, {}, 30e9)
    w = NodeWork("gemm", 4 * 2 * 128 ** 3, 0, matrices=4)
    assert node_seconds(w, p, "median")[0] == pytest.approx(4 * 2 * 128 ** 3 / 20e9)
    big = NodeWork("gemm", 2 * 1024 ** 3, 0)
    t, _, out = node_seconds(big, p, "median")
    assert t == pytest.approx(2 * 1024 ** 3 / 30e9) and out and "gemm at size 1024" in out[0]
    pred = predict_work(Work((one_rank([big]),), plan(), None, "no tokens"), p)
    assert pred.interval == (None, None)  # outside the calibration: no guessed margin, and it says so
    assert pred.extrapolated and "outside the calibration" in pred.interval_note and "gemm at size 1024" in \
        pred.interval_note
    assert pred.tokens_per_second is None


def test_exposed_after_ddp_buckets():
    # three buckets of 1, 1 and 2 bytes over a backward of 1 s: ready at 0.25, 0.5 and 1.0
    assert exposed_after(1.0, [(1, 0.1), (1, 0.1), (2, 0.3)]) == pytest.approx(0.3)
    # long reductions queue up: 0.25 + 0.5 = 0.75, + 0.5 = 1.25, + 0.5 = 1.75
    assert exposed_after(1.0, [(1, 0.5), (1, 0.5), (2, 0.5)]) == pytest.approx(0.75)


def test_data_parallel_all_reduce_overlaps_the_backward():
    n, b = 2, 4 << 20
    w = NodeWork("gemm", R * 0.01, 0, backward_flops=R * 0.02)  # 10 ms forward, 20 ms backward
    ar = LAT + 2 * (n - 1) / n * b / BW  # one bucket: ready at the backward's end, all exposed
    msgs = [Message("all_reduce", "dp", b, 1, n, "dp")]
    ranks = tuple(one_rank([w], msgs, rank=i) for i in range(n))
    p = predict_work(Work(ranks, plan(), None), profile())
    assert p.step_seconds == pytest.approx(0.03 + ar)
    two = [Message("all_reduce", "dp", b / 2, 2, n, "dp")]  # two buckets: the first runs during the backward
    p2 = predict_work(Work((one_rank([w], two),), plan(), None), profile())
    half = LAT + 2 * (n - 1) / n * (b / 2) / BW
    exposed = max(0.01 + half, 0.02) + half - 0.02
    assert p2.step_seconds == pytest.approx(0.03 + exposed)
    comm = p2.ranks[0]["communication_seconds"]["all_reduce"]
    assert comm["exposed"] == pytest.approx(exposed) and comm["overlapped"] == pytest.approx(2 * half - exposed)


def test_tensor_parallel_collectives_are_exposed():
    t, a, m = 2, 1 << 20, 3
    w = NodeWork("gemm", R * 0.01, 0, backward_flops=R * 0.02)
    calls = 4  # a step's all_reduces of A, half in the forward, half in the backward
    msgs = [Message("all_reduce", "tp", a, calls / 2, t, "forward"), Message("all_reduce", "tp", a, calls / 2, t,
                                                                               "backward")]
    p = predict_work(Work((one_rank([w], msgs, m=m),), plan(m), None), profile())
    assert p.step_seconds == pytest.approx(m * 0.03 + calls * (LAT + 2 * (t - 1) / t * a / BW))
    assert p.interval == (pytest.approx(p.step_seconds), pytest.approx(p.step_seconds)) and p.interval_note is None


def test_a_datasheet_profile_assumes_no_collective_latency():
    """The H100's datasheet profile: the same work's collectives last their bus term alone (latency null, not an
    assumed figure); the interval has no high end, and the prediction says why and how many collectives."""
    from flopcount.measure.machine.calibration import DEVICE_BANDWIDTHS, device_profile
    from flopcount.measure.machine.devices import gpu_entry

    t, a, m = 2, 1 << 20, 3
    peak, bus = gpu_entry("H100").peaks["bf16"], DEVICE_BANDWIDTHS["H100 SXM"]["nvlink"] / 2
    w = NodeWork("gemm", peak * 0.01, 0, backward_flops=peak * 0.02)
    msgs = [Message("all_reduce", "tp", a, 2, t, "forward"), Message("all_reduce", "tp", a, 2, t, "backward")]
    p = predict_work(Work((one_rank([w], msgs, m=m),), plan(m), None), device_profile("H100", t))
    assert p.step_seconds == pytest.approx(m * 0.03 + 4 * 2 * (t - 1) / t * a / bus)
    assert p.interval == (pytest.approx(p.step_seconds), None)
    assert "collective latency not known" in p.interval_note and "up to 4 collectives" in p.interval_note
    assert "datasheet profile's rates are the best case" in p.interval_note
    assert any("interval: " in line and "latency not known" in line for line in p.lines())
    assert p.as_dict()["interval"][1] is None


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pipeline_of_equal_stages(schedule):
    pp, m, f, b = 4, 8, 0.01, 0.02
    w = NodeWork("gemm", R * f, 0, backward_flops=R * b)
    ranks = tuple(one_rank([w], m=m, pp=pp, stage=s, rank=s) for s in range(pp))
    p = predict_work(Work(ranks, plan(m, pp, schedule), None), profile())
    assert p.step_seconds == pytest.approx((m + pp - 1) * (f + b))  # (M + P − 1)·(f + b)
    assert [r["bubble_seconds"] for r in p.ranks] == pytest.approx([(pp - 1) * (f + b)] * pp)
    assert p.mfu == pytest.approx(m / (m + pp - 1))


def test_pipeline_sends_lengthen_the_actions():
    pp, m, f, b, a = 2, 4, 0.01, 0.02, 1 << 20
    w = NodeWork("gemm", R * f, 0, backward_flops=R * b)
    send = LAT + a / BW  # send_recv: bus factor 1
    first = one_rank([w], [Message("send_recv", "pp", a, m, 2, "send_forward")], m=m, stage=0, rank=0)
    last = one_rank([w], [Message("send_recv", "pp", a, m, 2, "send_backward")], m=m, stage=1, rank=1)
    p = predict_work(Work((first, last), plan(m, pp), None), profile())
    # stage 0's forwards last f + send, stage 1's backwards b + send: 1F1B's makespan on two stages
    from flopcount.parallel.schedules import simulate_schedule

    assert p.step_seconds == pytest.approx(simulate_schedule("1f1b", 2, m, [f + send, f], [b, b + send])[0])


def test_the_timeline_holds_each_action_in_seconds():
    """The pipeline's actions at their predicted start and end: 1F1B on two stages, stage 0's forwards f + send,
    stage 1's backwards b + send; each action's parts (compute, collectives, send) add up to its length."""
    pp, m, f, b, a = 2, 4, 0.01, 0.02, 1 << 20
    w = NodeWork("gemm", R * f, 0, backward_flops=R * b)
    send = LAT + a / BW
    first = one_rank([w], [Message("send_recv", "pp", a, m, 2, "send_forward")], m=m, stage=0, rank=0)
    last = one_rank([w], [Message("send_recv", "pp", a, m, 2, "send_backward")], m=m, stage=1, rank=1)
    t = predict_work(Work((first, last), plan(m, pp), None), profile()).timeline
    flat = [x for stage in t.parts for action in stage for x in action]
    assert flat == pytest.approx([f, 0, send, b, 0, 0, f, 0, 0, b, 0, send])
    fs, bs = [f + send, f], [b, b + send]
    # 1F1B, two stages: stage 0 runs F0 F1 B0 F2 B1 F3 B2 B3, stage 1 runs F0 B0 F1 B1 ...; stage 1's F_j starts
    # when stage 0's F_j ends, stage 0's B_j when stage 1's B_j ends
    ends = {}
    for x in sorted(t.actions, key=lambda x: x.start):
        assert x.end - x.start == pytest.approx((fs if x.kind == "F" else bs)[x.rank])
        ends[(x.kind, x.rank, x.microbatch)] = x.end
    assert len(t.actions) == 2 * pp * m
    for j in range(m):
        one = next(x for x in t.actions if (x.kind, x.rank, x.microbatch) == ("F", 1, j))
        zero = next(x for x in t.actions if (x.kind, x.rank, x.microbatch) == ("B", 0, j))
        assert one.start >= ends[("F", 0, j)] - 1e-12 and zero.start >= ends[("B", 1, j)] - 1e-12
    assert ends[("F", 1, 0)] == pytest.approx(f + send + f)  # the first forward on each stage, back to back
    assert t.makespan == pytest.approx(max(ends.values()))
    doc = predict_work(Work((first, last), plan(m, pp), None), profile()).as_dict()["schedule"]
    assert len(doc["actions"]) == 16 and doc["parts"][0]["forward"]["send_seconds"] == pytest.approx(send)
    assert predict_work(Work((one_rank([w], m=m),), plan(m), None), profile()).as_dict()["schedule"] is None


def test_cli_one_matmul_against_the_h100_datasheet(save, capsys):
    from flopcount.cli import main
    from flopcount.measure.machine.calibration import DEVICE_BANDWIDTHS
    from flopcount.measure.machine.devices import gpu_entry

    m, k, n = 64, 4096, 4096
    path = save(single("MatMul", {"x": (m, k)}, [weight("W", (k, n))]))
    assert main([path, "--predict", "--device", "H100", "--format", "json"]) == 0
    pred = json.loads(capsys.readouterr().out)["prediction"]
    peak, hbm = gpu_entry("H100").peaks["bf16"], DEVICE_BANDWIDTHS["H100 SXM"]["memory"]
    expected = max(2 * m * k * n / peak, 4 * (m * k + k * n + m * n) / hbm)
    assert pred["step_seconds"] == pytest.approx(expected)
    assert pred["mfu"] == pytest.approx(2 * m * k * n / (expected * peak))
    assert not pred["profile"]["calibrated"] and pred["critical_rank"] == 0
    assert pred["interval"] == [pytest.approx(expected), None] and "best case" in pred["interval_note"]
    assert "latency" not in pred["interval_note"]  # one rank: no collective
    assert main([path, "--predict", "--device", "H100"]) == 0
    assert "Prediction (H100 SXM profile, from datasheets, 1 rank)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["--predict"], "give one of --machine"),
    (["--machine", "p.json"], "give them with --predict"),
    (["--predict", "--device", "T4"], "no published bandwidths"),
    (["--predict", "--device", "H100", "--format", "csv"], "give --format table, markdown, json or html"),
])
def test_cli_refuses_bad_prediction_flags(save, capsys, argv, words):
    from flopcount.cli import main

    path = save(single("Relu", {"x": (4, 4)}))
    assert main([path, *argv]) == 2
    assert words in capsys.readouterr().err


def test_cli_damaged_profile_exit_12(save, capsys, tmp_path):
    from flopcount.cli import main

    bad = tmp_path / "p.json"
    bad.write_text("[]")
    assert main([save(single("Relu", {"x": (4, 4)})), "--predict", "--machine", str(bad)]) == 12
    err = capsys.readouterr().err
    assert "not a flopcount machine profile" in err and len(err.strip().splitlines()) == 1


def test_a_llama_ledger_products_at_the_gemm_rate():
    """With bandwidth without limit and no overhead, each rank's compute is its products' FLOPs (forward, backward
    and recompute, from the ledger's node shares) over the GEMM rate; the ranks are the ledger's."""
    pytest.importorskip("transformers")
    import dataclasses

    from helpers import tiny_llama

    from flopcount.measure.predict import GEMM_FAMILIES, predict
    from flopcount.parallel.plan import parse_parallel, parse_recompute
    from flopcount.parallel.ranks import ledger, node_shares

    report = tiny_llama(32, 2, 2, 2, 64, 128, (2, 8))
    pl, rc = parse_parallel("dp=2,pp=2", 4, "1f1b"), parse_recompute("full")
    report = dataclasses.replace(report, parallel=ledger(report, pl, rc))
    fast = dataclasses.replace(profile(), compute={"gemm": _flat(R), "elementwise": _flat(1e30)})
    pred = predict(report, fast)
    products = {}
    for x in node_shares(report, pl, rc):
        if report.nodes[x.index].family in GEMM_FAMILIES:
            products[x.stage] = products.get(x.stage, 0) + x.forward + x.backward + x.recompute
    assert [r["rank"] for r in pred.ranks] == [r.rank for r in report.parallel.ranks]
    for row, r in zip(pred.ranks, report.parallel.ranks):
        assert row["compute_seconds"] == pytest.approx(4 * products[r.stage] / R)
    assert set(pred.ranks[0]["communication_seconds"]) == {"send_recv", "all_reduce"}


def test_a_plan_with_collectives_needs_a_profile_with_them():
    from flopcount.errors import UsageError
    from flopcount.measure.machine.calibration import device_profile, profile_from_dict

    doc = device_profile("H100", 2).as_dict()
    doc["collectives"] = {}
    bare = profile_from_dict(doc)
    rank = RankWork(0, 0, 0, {0: (NodeWork("gemm", 1e9, 0),)}, (Message("all_reduce", "dp", 1e6, 1, 2, "dp"),),
                    1e9, 1e9)
    with pytest.raises(UsageError, match="no collectives"):
        predict_work(Work((rank,), {"microbatches": 1, "pp": 1, "virtual": 1, "schedule": "1f1b"}, None), bare)


def test_a_profile_taken_on_a_busy_machine_is_noted():
    import dataclasses

    w = NodeWork("gemm", R * 0.01, 0)
    busy = dataclasses.replace(profile(), load_per_core=3.5)
    notes = predict_work(Work((one_rank([w]),), plan(), None), busy).notes
    assert any("busy machine (load 3.50 per core)" in n for n in notes)
    assert not predict_work(Work((one_rank([w]),), plan(), None), profile()).notes


def test_a_tied_embedding_across_the_pipeline_is_one_all_reduce_a_step():
    """A Llama whose embedding and LM head are one tensor, on two pipeline stages: the two copies' gradients (V·H
    elements of 4 bytes) are summed once a step between the first and the last stage, exposed: latency + bus
    factor 2(2−1)/2 = 1 × the bytes / the bus bandwidth."""
    pytest.importorskip("transformers")
    import dataclasses

    import transformers

    import flopcount
    from flopcount.measure.predict import predict, work_of
    from flopcount.parallel.plan import parse_parallel
    from flopcount.plans import parallel_ledger

    h, v = 32, 128
    config = transformers.LlamaConfig(hidden_size=h, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=v, tie_word_embeddings=True)
    report = flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train")
    report = dataclasses.replace(report, parallel=parallel_ledger(report, parse_parallel("pp=2", 2, "1f1b")))
    tied = [m for r in work_of(report).ranks for m in r.messages if m.group == "embedding"]
    assert [(m.kind, m.bytes, m.count, m.ranks, m.phase) for m in tied] == [("all_reduce", v * h * 4, 1, 2, "step")] * 2
    fast = dataclasses.replace(profile(), compute={"gemm": _flat(1e30), "elementwise": _flat(1e30)})
    pred = predict(report, fast)
    for r in pred.ranks:
        assert r["communication_seconds"]["all_reduce"]["exposed"] == pytest.approx(LAT + v * h * 4 / BW)


def test_the_routers_counts_are_messages_over_tp_times_ep():
    """A Mixtral-like model under ``dp=2,ep=2``: the router's token counts, gathered before each dispatch over the
    T·E ranks of group ``tp_ep`` (R int64 numbers per rank and MoE layer, L layers, M microbatches), become a
    message a layer and microbatch among 2 ranks, and the prediction prices them."""
    pytest.importorskip("transformers")
    import dataclasses

    import transformers

    import flopcount
    from flopcount.measure.predict import predict, work_of
    from flopcount.parallel.plan import parse_parallel
    from flopcount.plans import parallel_ledger

    layers, experts, m = 2, 4, 2
    config = transformers.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                        num_attention_heads=2, num_key_value_heads=2, vocab_size=128,
                                        num_local_experts=experts, num_experts_per_tok=2)
    report = flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train")
    plan = parse_parallel("dp=2,ep=2", m, "1f1b")
    report = dataclasses.replace(report, parallel=parallel_ledger(report, plan))
    for r in work_of(report).ranks:
        gathers = [x for x in r.messages if x.group == "tp_ep"]
        assert [(x.kind, x.bytes * x.count, x.count, x.ranks) for x in gathers] == [
            ("all_gather", m * 2 * layers * experts * 8, m * layers, 2)]
    fast = dataclasses.replace(profile(), compute={"gemm": _flat(1e30), "elementwise": _flat(1e30)})
    assert all(r["communication_seconds"]["all_gather"]["exposed"] > 0 for r in predict(report, fast).ranks)


def test_collectives_are_priced_as_timed_in_a_step_where_the_profile_has_them():
    """A profile with collectives timed in a step (latency and bandwidth of their own) prices the same exposed
    all_reduces at those: latency + 2(n-1)/n·A / bandwidth of the in-step fit; one taken before they were measured
    prices them at the tight loop's and says what that leaves out."""
    import dataclasses

    t, a, calls = 2, 1 << 20, 4
    lat_s, bw_s = 3 * LAT, BW / 2  # in a step: slower than the tight loop's LAT, BW
    seg = Segment(0, math.inf, {"median": lat_s, "best": lat_s}, {"median": bw_s, "best": bw_s})
    in_step = dataclasses.replace(profile(), collectives_in_step={"all_reduce": Collective(2, (), (seg,))})
    w = NodeWork("gemm", R * 0.01, 0, backward_flops=R * 0.02)
    msgs = [Message("all_reduce", "tp", a, calls / 2, t, phase) for phase in ("forward", "backward")]
    work = Work((one_rank([w], msgs),), plan(), None)
    p = predict_work(work, in_step)
    assert p.step_seconds == pytest.approx(0.03 + calls * (lat_s + 2 * (t - 1) / t * a / bw_s))
    # timed in a step without the mean of its calls (before calibrate recorded it): said once
    assert [n for n in p.notes if "in a step" in n] == [n for n in p.notes if "no mean or 90th percentile" in n] \
        and len([n for n in p.notes if "in a step" in n]) == 1
    old = predict_work(work, profile())
    assert old.step_seconds == pytest.approx(0.03 + calls * (LAT + 2 * (t - 1) / t * a / BW))
    assert any("no timing of collectives in a step" in n for n in old.notes)
    alone = predict_work(Work((one_rank([w]),), plan(), None), profile())  # no collective: nothing left out
    assert not any("in a step" in n for n in alone.notes)


def test_a_training_dropout_runs_at_the_dropout_rate_where_calibrated():
    """A Dropout of E elements (its FLOPs, one per element) and B bytes: its forward max(E / D, B / W) at the
    profile's dropout rate D, its backward its 2·B bytes at W; a profile without the rate times the forward by its
    bytes and says what that leaves out."""
    import dataclasses

    e, d = 1 << 20, 2e8  # elements; dropout elements/s
    b = 9 * e  # read 4, written 4, the mask 1 a element
    w = NodeWork("dropout", e, b, backward_flops=e)
    with_rate = dataclasses.replace(profile(), compute={**profile().compute, "dropout": _flat(d)})
    fwd, bwd, _ = node_seconds(w, with_rate)
    assert fwd == pytest.approx(max(e / d, b / W)) and bwd == pytest.approx(2 * b / W)
    p = predict_work(Work((one_rank([w]),), plan(), None), with_rate)
    assert p.step_seconds == pytest.approx(e / d + 2 * b / W) and not p.notes
    fwd0, _, _ = node_seconds(w, profile())
    assert fwd0 == pytest.approx(b / W)
    assert any("no timing of dropout" in n for n in predict_work(Work((one_rank([w]),), plan(), None),
                                                                  profile()).notes)


def test_an_elementwise_node_at_or_above_fresh_from_runs_at_the_fresh_rate():
    """Reused rate W at every size; the fresh rate F = W/4 from S = 2^20 bytes (W below it, so fresh_from is S):
    an elementwise node of B ≥ S bytes runs B / F forward and 2·B / F backward, one of B < S bytes (and its
    backward of 2·B ≥ S) B / W and 2·B / F; a reduction likewise; a profile without the fresh rate times them at W
    and says what that leaves out."""
    import dataclasses

    s, f = float(1 << 20), W / 4
    fresh = (Point(1.0, W, W, W), Point(s / 2, W, W, W), Point(s, f, f, f), Point(64 * s, f, f, f))
    p = dataclasses.replace(profile(), compute={**profile().compute, "elementwise": _flat(W, (1.0, s / 2, s, 64 * s)),
                                                "elementwise_fresh": fresh})
    big, small = 3 * s, 0.6 * s
    for kind in ("elementwise", "reduction"):
        fwd, bwd, _ = node_seconds(NodeWork(kind, big / 12, big, backward_flops=big / 12), p)
        assert fwd == pytest.approx(big / f) and bwd == pytest.approx(2 * big / f)
        fwd, bwd, _ = node_seconds(NodeWork(kind, small / 12, small, backward_flops=small / 12), p)
        assert fwd == pytest.approx(small / W) and bwd == pytest.approx(2 * small / f)
    w = NodeWork("elementwise", big / 12, big)
    assert predict_work(Work((one_rank([w]),), plan(), None), p).step_seconds == pytest.approx(big / f)
    old = predict_work(Work((one_rank([w]),), plan(), None), profile())
    assert old.step_seconds == pytest.approx(big / W)
    assert any("no timing of elementwise work into fresh memory" in n for n in old.notes)
    assert not any("fresh memory" in n for n in predict_work(Work((one_rank([w]),), plan(), None), p).notes)
