"""``flopcount plan``: the plans enumerated (counts written out by hand), the ones the model cannot split and the
ones over the device's memory dropped and counted, the rest ranked by throughput, and each plan's figures those of
``flopcount MODEL --parallel PLAN --memory --predict`` for that plan alone."""

from __future__ import annotations

import json

import pytest

from flopcount.cli import main
from flopcount.measure.plan_space import FEWER, SpaceSettings, choices

from helpers import fresh_nodes, llama_config

_GiB = 2**30


def test_the_space_of_two_devices():
    # (tp, cp, pp, dp) of 2 devices: (1,1,1,2), (1,1,2,1), (1,2,1,1), (2,1,1,1); 3 recompute policies each.
    # dp=2: shardings none, fsdp, zero1, zero2 (4) x M in {1, 2} = 8; pp=2 (2 layers: no interleaving): 1f1b and
    # gpipe x M=2 (M=1 cannot fill 2 stages: 2 dropped) = 2; cp=2: none, zero1, zero2 (no fsdp without dp) x 2 M = 6;
    # tp=2: sp off and on x 2 M = 4
    found, dropped = choices(SpaceSettings(2, 2, False, (1,), (1, 2)))
    assert len(found) == 3 * (8 + 2 + 6 + 4)
    assert dropped == {FEWER: 3 * 2}
    # 4 layers on pp=2: interleaved:2 besides (layers / pp = 2, V = 2)
    found, _ = choices(SpaceSettings(2, 4, False, (1,), (2,)))
    assert sum(c.plan.schedule == "interleaved" for c in found) == 3
    assert {c.schedule for c in found if c.plan.pp == 2} == {"1f1b", "gpipe", "interleaved:2"}


def test_the_global_batch_sets_size_and_count():
    # B = 4 sequences: b·M·dp = 4. dp=2: b=1 -> M=2, b=2 -> M=1; dp=1: b=1 -> M=4, b=2 -> M=2
    found, dropped = choices(SpaceSettings(2, 2, False, (1, 2), (), global_batch=4))
    assert all(c.size * c.plan.microbatches * c.plan.dp == 4 for c in found)
    assert len(found) == 3 * (2 * 4 + 2 * 2 + 2 * 3 + 2 * 2)
    assert not dropped
    # B = 2 with b = 2: dp=2 needs b·dp = 4 to divide 2; each such (plan, policy) counted
    found, dropped = choices(SpaceSettings(2, 2, False, (2,), (), global_batch=2))
    assert all(c.plan.dp == 1 for c in found)
    # dp=2's four shardings; pp=2 gets M = 1 microbatch of 2, fewer than its stages (1f1b and gpipe)
    assert dropped == {"the global batch of 2 sequences is no multiple of b·dp": 3 * 4, FEWER: 3 * 2}
    # experts: ep over the divisors of dp·cp
    found, _ = choices(SpaceSettings(2, 2, True, (1,), (2,)))
    assert {c.plan.ep for c in found if c.plan.dp == 2} == {1, 2}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("llama")
    return ["--hf", llama_config(folder, 32, 4, 4, 2, 64, 128), "--input-shape", "input_ids=2x8:int64",
            "--optimizer", "adamw", "--device", "H100", "--format", "json"]


@pytest.fixture(scope="module")
def searched(llama):
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["plan", *llama, "--devices", "4", "--device-memory", "80GiB",
                     "--microbatch-counts", "2,4"]) == 0
    return json.loads(out.getvalue())


def test_plans_of_a_small_llama_on_four_devices(searched):
    doc = searched
    assert "notes" not in doc  # memory is checked now
    assert len(doc["plans"]) + sum(doc["dropped"].values()) == doc["tried"]
    # tp=4 divides the 4 heads and is a multiple of the 2 K/V heads; cp=4 needs 2·4 to divide the 8 tokens: it does
    # 8 % 8 == 0; sp with cp=2, tp=2: 4 tokens a CP rank, divisible. Nothing over 80 GiB for this model.
    assert "over memory" not in " ".join(doc["dropped"])
    rates = [p["tokens_per_second"] for p in doc["plans"]]
    assert rates == sorted(rates, reverse=True)
    for p in doc["plans"]:
        assert p["headroom_bytes"] == 80 * _GiB - p["peak_bytes"]
    seen = {(p["parallel"], p["schedule"], p["recompute"]) for p in doc["plans"]}
    assert any("interleaved:2" == s for _, s, _ in seen) and any("sp" in x for x, _, _ in seen)
    assert any("cp=2" in x for x, _, _ in seen) and {r for _, _, r in seen} == {"none", "selective", "full"}


def _alone(llama, plan, capsys) -> dict:
    args = ["--mode", "train", *llama, "--parallel", plan["parallel"], "--microbatches", str(plan["microbatches"]),
            "--recompute", plan["recompute"], "--memory", "--predict"]
    if plan["schedule"] != "-":
        args += ["--schedule", plan["schedule"]]
    capsys.readouterr()
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def test_each_plan_is_its_own_count(searched, llama, capsys):
    """The search shares one memory walk between plans and reads one data-parallel replica a stage: a sample of
    plans of every kind gives the peak, FLOPs and prediction of the plan counted alone."""
    plans = searched["plans"]
    picks = {}
    for p in plans:
        kind = (p["schedule"].split(":")[0], "fsdp" in p["parallel"] or "zero" in p["parallel"], "cp=" in p["parallel"],
                "sp" in p["parallel"].split(","), p["recompute"])
        picks.setdefault(kind, p)
    sample = list(picks.values())[::max(1, len(picks) // 8)]
    assert len(sample) >= 6
    for p in sample:
        alone = _alone(llama, p, capsys)
        assert max(r["peak_bytes"] for r in alone["memory"]["ranks"]) == p["peak_bytes"], p
        assert sum(r["model_flops"] for r in alone["parallel"]["ranks"]) == p["model_flops"], p
        assert max(r["hardware_flops"] for r in alone["parallel"]["ranks"]) == p["hardware_flops"], p
        assert alone["prediction"]["step_seconds"] == pytest.approx(p["step_seconds"], rel=1e-9), p
        assert alone["prediction"]["mfu"] == pytest.approx(p["mfu"], rel=1e-9), p


def test_memory_drops_plans(searched, llama, capsys):
    peaks = sorted(p["peak_bytes"] for p in searched["plans"])
    limit = peaks[len(peaks) // 2]
    capsys.readouterr()
    assert main(["plan", *llama, "--devices", "4", "--device-memory", str(limit), "--microbatch-counts", "2,4"]) == 0
    doc = json.loads(capsys.readouterr().out)
    over = sum(p > limit for p in peaks)
    assert doc["dropped"]["over memory (the largest per-rank peak exceeds --device-memory)"] == over
    assert len(doc["plans"]) == len(peaks) - over
    assert all(p["peak_bytes"] <= limit for p in doc["plans"])


@pytest.mark.parametrize("limit", ["median", "1KiB"])
def test_worker_processes_give_the_same_answer(searched, llama, capsys, limit):
    # the plans that fit, their order (ties included), the dropped counts and the least peak over memory: the same
    # searched in this process as by three workers, with plans over memory dropped on their floors in each
    peaks = sorted(p["peak_bytes"] for p in searched["plans"])
    memory = str(peaks[len(peaks) // 2]) if limit == "median" else limit
    answers = []
    for jobs in ("1", "3"):
        capsys.readouterr()
        code = main(["plan", *llama, "--devices", "4", "--device-memory", memory, "--microbatch-counts", "2,4",
                     "--jobs", jobs])
        out = capsys.readouterr()
        answers.append((code, out.out, out.err))
    assert answers[0] == answers[1]
    assert answers[0][0] == (0 if limit == "median" else 2)


def test_no_plan_fits(searched, llama, capsys):
    least = min(searched["plans"], key=lambda p: p["peak_bytes"])
    capsys.readouterr()
    assert main(["plan", *llama, "--devices", "4", "--device-memory", "1KiB", "--microbatch-counts", "2,4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no plan of 4 devices fits" in err[0]
    assert f"({least['peak_bytes']:,} bytes)" in err[0]


def test_each_peak_and_floor_is_the_walks(llama):
    """On every plan of 4 devices (M = 1 and 2): the peak the search gives, which shares walks between plans and
    takes a ZeRO plan's from the walk without ZeRO, is the largest of per_rank's; and the states the search's floor
    is made of (stage_states: parameters, optimizer states, with M > 1 accumulated gradients, and zero2's bucket)
    are per_rank's own figures, so the floor is at most the peak, also with the kept activations of any plan that
    keeps the same; a plan the model cannot split refused by both."""
    from flopcount.cli.plan import build_parser, reports
    from flopcount.errors import FlopcountError
    from flopcount.measure.machine.calibration import device_profile
    from flopcount.measure.plan_search import search
    from flopcount.memory.ranks import per_rank, stage_states
    from flopcount.parallel.layout import in_flight

    kept = {}
    # 64 tokens: the activations, not the optimizer step's temporaries, make most peaks (a ZeRO plan's is then found
    # from the walk without ZeRO)
    args = build_parser().parse_args(["--hf", llama[1], "--input-shape", "input_ids=2x64:int64", *llama[4:],
                                      "--devices", "4", "--device-memory", "80GiB"])
    args.mode, args.memory = "train", True
    report_of = reports(args)
    space = SpaceSettings(4, 2, False, (2,), (1, 2))
    peaks = {}
    for c in choices(space)[0]:
        report = report_of(c.size, c.recompute)
        try:
            ranks = per_rank(report, c.plan).ranks
        except FlopcountError as e:
            with pytest.raises(FlopcountError, match=str(e).split(": ")[-1][:40]):
                stage_states(report, c.plan)
            continue
        states = stage_states(report, c.plan)
        for r in ranks:
            s = states[r.stage]
            assert (s.params, s.states, s.grads, s.bucket) == (
                r.params_bytes, r.optimizer_bytes, r.grads_bytes if c.plan.microbatches > 1 else 0,
                r.gradient_bucket_bytes), c.text
        assert max(s.params + s.states + s.grads for s in states) <= max(r.peak_bytes for r in ranks)
        # with the kept activations, the other microbatches' in flight besides: still at most each rank's peak,
        # and the kept activations the same for every plan that differs only in dp, ZeRO or M
        for r in ranks:
            s = states[r.stage]
            act = r.activations_bytes
            assert s.params + s.states + s.grads + act + int(act * (in_flight(c.plan, r.stage) - 1)) <= r.peak_bytes
        p = c.plan  # all the kept activations read (docs/predict.md): not dp without FSDP, ZeRO or M
        same = (c.size, c.recompute, p.tp, p.sp, p.cp, p.ep, p.pp, p.virtual_stages if p.schedule == "interleaved"
                else 1, p.dp * p.cp if p.fsdp else 0)
        kept.setdefault(same, []).append((c.text, [(r.stage, r.activations_bytes) for r in ranks]))
        peaks[(c.text, c.schedule, c.plan.microbatches, c.recompute)] = max(r.peak_bytes for r in ranks)
    assert max(len(v) for v in kept.values()) > 4
    for same in kept.values():
        assert all(acts == same[0][1] for _, acts in same), same
    found = search(report_of, device_profile("H100", 4), space, None)
    assert len(peaks) > 100 and len(found.plans) == len(peaks)
    assert sum("zero" in p.parallel for p in found.plans) > 30
    for p in found.plans:
        assert p.peak_bytes == peaks[(p.parallel, p.schedule, p.microbatches, p.recompute)], p


def _alone_figures(report, c, profile):
    """A plan's figures from the per-rank ledgers run on their own, on a copy of the count whose node and scope
    lists and graph (its nodes, tensors ...) are new objects (nothing found for the count's before, layouts, shares,
    walks, is read): (largest peak, model FLOPs, busiest rank's hardware FLOPs, step seconds, tokens per second,
    MFU); the refusal's message where the ledgers refuse it."""
    import dataclasses

    from flopcount.errors import FlopcountError
    from flopcount.measure.predict import predict_work, work_of
    from flopcount.memory.ranks import per_rank
    from flopcount.parallel.plan import parse_recompute
    from flopcount.parallel.ranks import ledger

    modules = dataclasses.replace(report.modules, nodes=tuple(list(report.modules.nodes)))
    g = report.memory.graph  # its node list, tensors, saved records and gradients' flags new (no memo shared)
    graph = dataclasses.replace(g, nodes=list(g.nodes), tensors=dict(g.tensors), saved=dict(g.saved),
                                grads=dict(g.grads))
    fresh = dataclasses.replace(report, nodes=fresh_nodes(report.nodes), modules=modules, memory=dataclasses.replace(
        report.memory, graph=graph))
    try:
        peak = max(r.peak_bytes for r in per_rank(fresh, c.plan).ranks)
        led = ledger(fresh, c.plan, parse_recompute(c.recompute))
    except FlopcountError as e:
        return str(e)
    point = predict_work(work_of(dataclasses.replace(fresh, parallel=led)), profile)
    return (peak, sum(r.model_flops for r in led.ranks), max(r.hardware_flops for r in led.ranks),
            point.step_seconds, point.tokens_per_second, point.mfu)


def test_every_plan_of_eight_devices_is_its_ledgers(llama):
    """On every plan of a 4-layer Llama on 8 devices (M = 2 and 4, 16 tokens: cp up to 8, tp refused at 8 by the
    heads, interleaved:2 on pp=2), the figures the search gives, which it shares between plans (walks, sizes, stages, replicas), are the
    per-rank ledgers' of the plan run alone: the peak and the FLOPs exactly, the predicted point to rounding; the
    plans the ledgers refuse are those the search drops; with the device memory at the median peak, the plans over
    it are dropped (the floor's plans among them) and the least peak over it is kept."""
    from flopcount.cli.plan import build_parser, reports
    from flopcount.measure.machine.calibration import device_profile
    from flopcount.measure.plan_search import OVER_MEMORY, search

    args = build_parser().parse_args(["--hf", llama[1], "--input-shape", "input_ids=2x16:int64", *llama[4:],
                                      "--devices", "8", "--device-memory", "80GiB"])
    args.mode, args.memory = "train", True
    report_of, profile = reports(args), device_profile("H100", 8)
    space = SpaceSettings(8, 4, False, (2,), (2, 4))
    tried, dropped = choices(space)
    alone = {(c.text, c.schedule, c.plan.microbatches, c.recompute): _alone_figures(report_of(2, c.recompute), c,
                                                                                     profile) for c in tried}
    fit = {k: f for k, f in alone.items() if not isinstance(f, str)}
    found = search(report_of, profile, space, None)
    assert len(fit) > 300 and found.tried == len(tried) + sum(dropped.values())
    assert sorted((p.parallel, p.schedule, p.microbatches, p.recompute) for p in found.plans) == sorted(fit)
    for p in found.plans:
        peak, model, hardware, step, rate, mfu = fit[(p.parallel, p.schedule, p.microbatches, p.recompute)]
        assert (p.peak_bytes, p.model_flops, p.hardware_flops) == (peak, model, hardware), p
        assert p.step_seconds == pytest.approx(step, rel=1e-9) and p.mfu == pytest.approx(mfu, rel=1e-9), p
        assert p.tokens_per_second == pytest.approx(rate, rel=1e-9), p
    limit = sorted(f[0] for f in fit.values())[len(fit) // 2]
    found = search(report_of, profile, space, limit)
    assert sorted((p.parallel, p.schedule, p.microbatches, p.recompute) for p in found.plans) == \
        sorted(k for k, f in fit.items() if f[0] <= limit)
    assert found.dropped[OVER_MEMORY] == sum(f[0] > limit for f in fit.values())
    assert found.smallest.peak_bytes == min(f[0] for f in fit.values() if f[0] > limit)
