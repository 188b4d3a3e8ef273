"""MFU per rank under a parallel plan (Meter(plan=)): two real gloo ranks, forked as torchrun would start them,
time a tiny Llama's training steps with an injected clock (rank r's steps last STEP·(r+1) s), and rank 0's report
is checked against closed forms written here: each rank's FLOPs from the whole count, its MFU = FLOPs / time /
peak, the slowest rank, the imbalance, the conventions of Megatron, torchtitan and MaxText, and no collective
during the steps (one gather when the result is formed)."""

from __future__ import annotations

import json
import os
import socket
import sys
import traceback

import pytest

import flopcount
from flopcount.errors import UsageError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H, L, HEADS, KV_HEADS, FFN, V = 32, 2, 4, 2, 48, 64
B, S = 2, 8
PEAK = 1e9
STEP = 0.25  # rank r's step lasts STEP * (r + 1) seconds on its injected clock
WARMUP, WINDOW, STEPS = 1, 2, 5


@pytest.fixture(scope="module")
def llama():
    config = transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V)
    report = flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")
    torch.manual_seed(0)
    return report, transformers.LlamaForCausalLM(config)


def _meter_hfu(**kwargs):
    """HFU and how of a 3-step run on a hand-advanced clock (1 s a step of B samples, peak PEAK)."""
    from flopcount.measure.machine.devices import Device, Peak

    t = [100.0]
    m = flopcount.Meter(warmup_steps=0, window_steps=3, clock=lambda: t[0], energy=False, recompute="full",
                        peak_flops=PEAK, **kwargs)
    for _ in range(3):
        with m.step(samples=B):
            t[0] += 1.0
    r = m.result(device=Device("cpu", "test CPU", peaks={"fp32": Peak(PEAK, "test")}))
    return r.mfu, r.hfu, r.how.get("hfu") or r.unavailable["hfu"]


def test_full_recompute_hfu_with_a_report_is_the_ledgers_rerun(llama):
    """recompute="full" with a counted decoder: HFU adds what the ledger reruns (checked against torch's
    reentrant checkpoint in tests/parallel/test_recompute_policies.py), not a whole forward: each layer's forward
    runs again; the embedding, final norm, head and loss are outside the checkpointed layers and do not run again."""
    report = llama[0]
    from flopcount.parallel.plan import ParallelPlan, parse_recompute
    from flopcount.parallel.ranks import ledger

    layer_forward = sum(n.cost.flops for n, sc in zip(report.nodes, report.modules.nodes)
                        if any(".layers." in x for x in sc)) / B
    rerun = layer_forward
    assert ledger(report, ParallelPlan(), parse_recompute("full")).ranks[0].recompute_flops / B == rerun
    C, forward = report.per_sample.flops, report.forward.flops / B
    mfu, hfu, how = _meter_hfu(report=report)
    assert hfu == pytest.approx(mfu * (C + rerun) / C) and "reentrant checkpoint" in how
    assert rerun < forward  # PaLM's +1 forward overstates
    mfu, hfu, how = _meter_hfu(flops_per_sample=C)  # only a number: no forward, no rerun known
    assert hfu is None and "needs a counting report" in how


def test_full_recompute_hfu_of_a_model_the_ledger_cannot_split_is_palms_extra_forward():
    net = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))
    report = flopcount.from_torch(net, torch.zeros(B, 12), mode="train")
    # forward per sample: 2·12·20 + 20 (bias) + 20 (ReLU) + 2·20·3 + 3 (bias)
    forward = 2 * 12 * 20 + 20 + 20 + 2 * 20 * 3 + 3
    assert report.forward.flops / B == forward
    mfu, hfu, how = _meter_hfu(report=report)
    C = report.per_sample.flops
    assert hfu == pytest.approx(mfu * (C + forward) / C) and "PaLM" in how


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _rank_run(rank: int, report, model, plan: str, out: str) -> None:
    """One rank: a real step of the tiny model per meter step, and the collectives counted around the steps."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        try:
            flopcount.Meter(report, plan="dp=4")
        except UsageError as e:
            mismatch = str(e)
        calls = {"n": 0}
        for name in ("all_gather_object", "all_reduce", "broadcast", "broadcast_object_list", "barrier",
                     "all_gather", "gather_object"):
            real = getattr(dist, name)

            def counted(*a, _real=real, **k):
                calls["n"] += 1
                return _real(*a, **k)

            setattr(dist, name, counted)
        refusals = {}
        if plan.startswith("mesh:"):  # the plan read from the device mesh the run is laid out on
            from torch.distributed.device_mesh import init_device_mesh

            from flopcount.measure.harness.rank_mfu import plan_from_mesh

            for case, shape, names in (("ep", (2,), ("ep",)), ("order", (2, 1), ("tp", "dp")),
                                       ("unnamed", (2,), None)):
                try:
                    plan_from_mesh(init_device_mesh("cpu", shape, mesh_dim_names=names))
                except UsageError as e:
                    refusals[case] = str(e)
            hsdp = plan_from_mesh(init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp_replicate", "dp_shard")))
            refusals["hsdp"] = str(hsdp)
            plan = init_device_mesh("cpu", (2,), mesh_dim_names=(plan.removeprefix("mesh:"),))
        clock = _Clock()
        meter = flopcount.Meter(report, plan=plan, recompute="none", clock=clock, peak_flops=PEAK, energy=False,
                                warmup_steps=WARMUP, window_steps=WINDOW)
        ids = torch.randint(0, V, (B, S))
        for _ in range(STEPS):
            with meter.step(samples=B):
                model(input_ids=ids, labels=ids).loss.backward()
                clock.t += STEP * (rank + 1)
        during_steps = calls["n"]
        meter.to_json(out)
        if rank == 0:
            with open(out + ".calls", "w") as f:
                json.dump({"during_steps": during_steps, "at_result": calls["n"] - during_steps,
                           "mismatch": mismatch, "refusals": refusals}, f)
    finally:
        dist.destroy_process_group()


def _watched(rank: int, port: int, target, *args) -> None:
    code = 1
    try:
        os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
        torch.set_num_threads(1)
        code = target(rank, *args) or 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _launch(target, *args) -> list[int]:
    """Two ranks forked from the test (torch already imported), env:// as torchrun sets it; their exit codes."""
    import multiprocessing

    import torch._dynamo  # noqa: F401  (DDP's constructor imports it: once here, before the ranks fork)

    ctx = multiprocessing.get_context("fork")
    port = _free_port()
    procs = [ctx.Process(target=_watched, args=(r, port, target) + args) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    return codes


def _two_ranks(llama, plan: str, tmp_path) -> tuple[dict, dict]:
    report, model = llama
    out = str(tmp_path / "run.json")
    codes = _launch(_rank_run, report, model, plan, out)
    assert codes == [0, 0], f"rank exit codes {codes}"
    with open(out) as f, open(out + ".calls") as g:
        return json.load(f)["runs"][0], json.load(g)


@pytest.mark.parametrize("given", ["dp=2", "tp=2", "mesh:dp", "mesh:tp"])
def test_two_ranks_report_each_ranks_mfu(llama, given, tmp_path):
    """The plan given as a string, or read from a real 1-D device mesh whose one dimension is named dp or tp."""
    report = llama[0]
    run, calls = _two_ranks(llama, given, tmp_path)
    plan = {"mesh:dp": "dp=2", "mesh:tp": "tp=2"}.get(given, given)
    if given.startswith("mesh:"):
        refusals = calls["refusals"]
        assert "'ep' is not one flopcount reads" in refusals["ep"] and "plan='dp=D,ep=E'" in refusals["ep"]
        assert "('tp', 'dp') are not in the plan's rank order" in refusals["order"]
        assert "without dimension names" in refusals["unnamed"]
        # HSDP's two data-parallel dims multiply into dp; a shard dim above 1 means sharded parameters
        assert refusals["hsdp"].startswith("tp=1,pp=1,cp=1,ep=1,dp=2") and "fsdp" in refusals["hsdp"]
    whole = report.per_sample.flops * B  # one microbatch of B samples, forward + backward, before any split
    par = run["parallel"]
    assert [r["rank"] for r in par["ranks"]] == [0, 1]
    times = [STEP, 2 * STEP]
    for r, t in zip(par["ranks"], times):
        assert r["step_time_s"] == pytest.approx(t)
        assert r["coords"] == ({"tp": 0, "pp": 0, "cp": 0, "ep": 0, "dp": r["rank"]} if plan == "dp=2" else
                               {"tp": r["rank"], "pp": 0, "cp": 0, "ep": 0, "dp": 0})
        if plan == "dp=2":  # each data-parallel rank runs the whole model on its own batch
            assert r["model_flops"] == r["hardware_flops"] == whole
        assert r["mfu"] == pytest.approx(r["model_flops"] / t / PEAK)
        assert r["hfu"] == pytest.approx(r["hardware_flops"] / t / PEAK)
    if plan == "tp=2":
        # the two TP ranks share the model: their model FLOPs add up to the whole count; the replicated work
        # (norms, residual adds, the embedding's lookup) runs on both, so each rank runs more than half
        assert sum(r["model_flops"] for r in par["ranks"]) == whole
        assert all(whole / 2 < r["hardware_flops"] < whole for r in par["ranks"])
        # column/row-parallel projections (Q, O: H x H; K, V: H x KV_HEADS*D; gate, up, down: H x FFN) and the
        # vocab-parallel head (H x V), 2 FLOPs a multiply-add, forward + backward (twice the forward): half each
        d = H // HEADS
        split = 3 * 2 * B * S * (L * (2 * H * H + 2 * H * KV_HEADS * d + 3 * H * FFN) + H * V)
        for r in par["ranks"]:
            assert whole - r["hardware_flops"] >= split // 2
            assert r["model_flops"] <= whole - split // 2
    assert par["slowest_rank"] == 1
    assert par["imbalance"] == pytest.approx(2 * STEP / (1.5 * STEP))
    t = 2 * STEP  # the slowest rank's step ends the synchronous step
    conv = par["conventions"]
    dp = 2 if plan == "dp=2" else 1
    assert conv["megatron"]["flops_per_s_per_device"] == pytest.approx(whole * dp / (2 * t))
    assert conv["megatron"]["mfu"] == pytest.approx(whole * dp / (2 * t) / PEAK)
    assert conv["torchtitan"]["flops_per_s_per_device"] == pytest.approx(whole / ((2 // dp) * t))
    assert conv["maxtext"]["per_device_batch"] == pytest.approx(B * dp / 2)
    assert conv["maxtext"]["flops_per_token"] == pytest.approx(whole / (B * S))
    assert conv["maxtext"]["flops_per_s_per_device"] == pytest.approx(B * dp / 2 * whole / B / t)
    # no collective during the steps; forming the result gathers every rank's figures once
    assert calls["during_steps"] == 0 and calls["at_result"] == 1
    assert "4 ranks" in calls["mismatch"] and "process group has 2" in calls["mismatch"]


def _this_cpu_profile():
    """A profile of this machine's description (no difference to warn of) with round rates: GEMM 2 GFLOP/s,
    1 GB/s elementwise, collectives 100 µs + bus bytes / 0.5 GB/s."""
    from flopcount.measure.machine.calibration import COLLECTIVES, Collective, MachineProfile, Point, Segment
    from flopcount.measure.machine.devices import cpu_cores, cpu_name

    def flat(v):
        return (Point(1, v, v, v), Point(1e9, v, v, v))

    seg = Segment(0, 1e12, {w: 1e-4 for w in ("median", "best", "slowest")},
                  {w: 5e8 for w in ("median", "best", "slowest")})
    zero = Point(1, 0.0, 0.0, 0.0)
    return MachineProfile(True, "cpu", 2, {"gemm": flat(2e9), "elementwise": flat(1e9)},
                          {"forward": zero, "backward": zero}, {k: Collective(2, (), (seg,)) for k in COLLECTIVES},
                          2e9, torch=torch.__version__, machine={"cpu": cpu_name(), "cores": cpu_cores(),
                                                                 "threads_per_rank": 1})


def _predicted_run(rank: int, report, model, profile, out: str) -> None:
    """One rank of a real data-parallel run (DDP over gloo, the host clock) under a meter given ``profile``."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        meter = flopcount.Meter(report, plan="dp=2", recompute="none", machine=profile, peak_flops=PEAK,
                                energy=False, warmup_steps=WARMUP, window_steps=WINDOW)
        ids = torch.randint(0, V, (B, S))
        with meter:
            for _ in range(STEPS):
                with meter.step(samples=B):
                    opt.zero_grad()
                    ddp(input_ids=ids, labels=ids).loss.backward()
                    opt.step()
        meter.to_json(out)
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_print_the_prediction_beside_the_measurement(llama, tmp_path):
    """Two real DDP ranks: the prediction is ``predict`` of the same count under dp=2 (its DDP all_reduce of the
    gradients included), made here; the measurement the slowest rank's median step the harness gathered."""
    from dataclasses import replace

    from flopcount.measure.predict import predict
    from flopcount.plans import parallel_ledger

    report, model = llama
    profile = _this_cpu_profile()
    out = str(tmp_path / "run.json")
    assert _launch(_predicted_run, report, model, profile, out) == [0, 0]
    with open(out) as f:
        run = json.load(f)["runs"][0]
    expected = predict(replace(report, parallel=parallel_ledger(report, "dp=2")), profile)
    pred = run["prediction"]
    assert pred["predicted_step_s"] == pytest.approx(expected.step_seconds, rel=1e-12)
    for got, want in zip(pred["prediction"]["ranks"], expected.ranks):
        assert got["communication_seconds"]["all_reduce"] == pytest.approx(want["communication_seconds"]["all_reduce"])
    assert "all_reduce" in expected.ranks[0]["communication_seconds"]  # the gradients' buckets
    measured = max(r["step_time_s"] for r in run["per_rank"])
    assert pred["measured_step_s"] == measured
    assert pred["relative_error"] == pytest.approx(expected.step_seconds / measured - 1)
    assert not any("taken with" in n for n in pred["notes"])  # this machine's description: nothing to warn of


def test_plan_without_a_counted_model_is_refused():
    with pytest.raises(UsageError, match="plan= needs a counted model"):
        flopcount.Meter(flops_per_sample=1e6, plan="dp=2")


def test_plan_larger_than_one_process_is_refused_when_the_result_is_formed(llama):
    meter = flopcount.Meter(llama[0], plan="dp=2", clock=_Clock(), peak_flops=PEAK, energy=False)
    with pytest.raises(UsageError, match="has 2 ranks .* process group has 1"):
        meter.result()


def test_plan_on_a_model_the_rules_cannot_split_is_refused():
    report = flopcount.from_torch(torch.nn.Linear(3, 5), (7, 3), mode="train")
    with pytest.raises(UsageError, match="--parallel: .*no module scopes"):
        flopcount.Meter(report, plan="tp=2")


BENCH = ["bench", "digits", "--epochs", "1", "--target-quality", "0.1", "--peak-flops", "1e9", "--warmup-steps", "2",
         "--window-steps", "5", "--seed", "3", "--no-progress"]


def _bench_rank(rank: int, argv: list[str], stdout: str) -> int:
    """One rank of ``flopcount bench``; rank 0's stdout (the table) to a file."""
    from flopcount.cli import main

    if rank == 0:
        sys.stdout = open(stdout, "w")  # noqa: SIM115  (the rank ends with os._exit after flushing it)
    return main(argv)


def test_torchrun_bench_reports_each_ranks_mfu(tmp_path):
    out, table = str(tmp_path / "b.json"), str(tmp_path / "table.txt")
    assert _launch(_bench_rank, [*BENCH, "--parallel", "dp=2", "-o", out], table) == [0, 0]
    with open(out) as f:
        doc = json.load(f)
    run, counting = doc["runs"][0], doc["config"]["counting"]
    whole = counting["flops_per_sample"] * counting["batch"]  # one step of the counted batch, forward + backward
    par = run["parallel"]
    times = {r["rank"]: r["step_time_s"] for r in run["per_rank"]}  # every rank's median step, gathered
    assert [r["rank"] for r in par["ranks"]] == [0, 1]
    for r in par["ranks"]:
        assert r["coords"]["dp"] == r["rank"]
        assert r["model_flops"] == r["hardware_flops"] == pytest.approx(whole)  # each DP rank: the whole model
        assert r["mfu"] == pytest.approx(whole / times[r["rank"]] / 1e9)
        assert r["hfu"] == pytest.approx(r["mfu"])  # recompute none
    slow = max(times, key=times.get)
    assert par["slowest_rank"] == slow
    assert par["imbalance"] == pytest.approx(times[slow] / ((times[0] + times[1]) / 2))
    assert par["conventions"]["megatron"]["mfu"] == pytest.approx(2 * whole / (2 * times[slow]) / 1e9)
    assert par["conventions"]["maxtext"]["mfu"] is None and par["conventions"]["maxtext"]["unavailable"]
    with open(table) as f:
        assert "MFU per rank" in f.read()


def test_torchrun_bench_without_a_plan_reads_dp_from_the_process_group(tmp_path):
    """No --parallel: the 2 ranks train data parallel, so the report carries the per-rank MFU of dp=2."""
    out, table = str(tmp_path / "b.json"), str(tmp_path / "table.txt")
    assert _launch(_bench_rank, [*BENCH, "-o", out], table) == [0, 0]
    with open(out) as f:
        doc = json.load(f)
    run, counting = doc["runs"][0], doc["config"]["counting"]
    whole = counting["flops_per_sample"] * counting["batch"]
    par = run["parallel"]
    assert (par["plan"]["dp"], par["plan"]["tp"], par["plan"]["pp"]) == (2, 1, 1)
    times = {r["rank"]: r["step_time_s"] for r in run["per_rank"]}
    for r in par["ranks"]:
        assert r["coords"]["dp"] == r["rank"] and r["model_flops"] == pytest.approx(whole)
        assert r["mfu"] == pytest.approx(whole / times[r["rank"]] / 1e9) and r["hfu"] == pytest.approx(r["mfu"])
    slow = max(times.values())
    assert par["conventions"]["megatron"]["mfu"] == pytest.approx(2 * whole / (2 * slow) / 1e9)
    assert par["conventions"]["torchtitan"]["mfu"] == pytest.approx(whole / slow / 1e9)  # W·M / (tp·pp·cp·t)
    with open(table) as f:
        text = f.read()
    assert "MFU per rank" in text and "HFU" in text and "megatron" in text.lower() and "torchtitan" in text.lower()


@pytest.mark.slow  # the Meter's own refusal under two ranks is in test_two_ranks_report_each_ranks_mfu
def test_torchrun_bench_refuses_a_plan_of_another_world_size(tmp_path, capfd):
    codes = _launch(_bench_rank, [*BENCH, "--parallel", "dp=4"], str(tmp_path / "t.txt"))
    assert codes == [2, 2]
    assert "has 4 ranks" in capfd.readouterr().err


@pytest.mark.parametrize("flags,message", [
    pytest.param(["--recompute", "full"], "give --parallel too", id="recompute-without-plan"),
    pytest.param(["--parallel", "dp=1", "--microbatches", "2"], "give --microbatches 1", id="microbatches"),
    pytest.param(["--parallel", "dp=2", "--ensemble", "2"], "give one or the other", id="ensemble"),
])
def test_bench_plan_flags_are_checked_before_training(flags, message, capsys):
    from flopcount.cli import main

    assert main([*BENCH, *flags]) == 2
    assert message in capsys.readouterr().err
