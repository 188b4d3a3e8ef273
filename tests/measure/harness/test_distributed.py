"""Scale-out: data parallelism under torch.distributed (gloo ranks on this CPU) with measured gradient
communication, and HPC AI500 V3.0 bagging ensembles; the layout, bootstrap and communication arithmetic."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import traceback

import numpy as np
import pytest

from flopcount.errors import UsageError
from flopcount.measure.harness import distributed, ensemble

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

# The digits CNN's parameters (models/digits.py), every one trained:
PARAMS = ((1 * 16 * 9 + 16)          # conv1: 1->16, 3x3, bias
          + (16 * 32 * 9 + 32)       # conv2: 16->32, 3x3, bias
          + (512 * 64 + 64)          # fc1: 32*4*4 -> 64, bias
          + (64 * 10 + 10))          # fc2: 64 -> 10, bias
GRADIENT_BYTES = 4 * PARAMS  # fp32 gradients: 153,128 bytes
# Dense training FLOPs per sample of its convolutions and linear layers: forward 2 x MACs, backward twice that,
# less conv1's input gradient (the images need none): 2 x (8*8*16*9 + 8*8*32*16*9 + 512*64 + 64*10) x 3 - 2 x 8*8*16*9
DENSE_C = 2 * (8 * 8 * 16 * 9 + 8 * 8 * 32 * 16 * 9 + 512 * 64 + 64 * 10) * 3 - 2 * (8 * 8 * 16 * 9)
SEED = 0


def test_layout_is_contiguous_blocks_of_p_ranks():
    assert ensemble.layout(8, 4) == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert ensemble.layout(4, 1) == [(0, 1, 2, 3)]
    assert ensemble.layout(3, 3) == [(0,), (1,), (2,)]
    with pytest.raises(UsageError, match="--ensemble 3: 4 rank"):
        ensemble.layout(4, 3)


@pytest.mark.parametrize("n, size", [pytest.param(1437, 2, id="digits-2"), pytest.param(1437, 4, id="digits-4"),
                                     pytest.param(3, 4, id="fewer-than-ranks")])
def test_shards_cover_the_epoch_with_equal_step_counts(n, size):
    order = np.random.default_rng(5).permutation(n)
    parts = [distributed.shard(order, r, size) for r in range(size)]
    assert {len(p) for p in parts} == {math.ceil(n / size)}
    assert set(np.concatenate(parts)) == set(range(n))
    assert sum(len(p) for p in parts) - n == math.ceil(n / size) * size - n  # the padding, at most size - 1


def test_bootstrap_is_seeded_with_replacement_and_about_63_percent_unique():
    n = 100_000
    draws = ensemble.bootstrap(n, SEED, 1)
    again = np.random.default_rng([SEED, 1]).integers(0, n, size=n)  # the documented generator, independently
    assert np.array_equal(draws, again)
    expected = 1 - (1 - 1 / n) ** n  # P(a sample is drawn at least once) -> 1 - 1/e = 0.632...
    assert abs(np.unique(draws).size / n - expected) < 0.005  # std of the fraction ~ 0.001 at this n
    assert not np.array_equal(draws, ensemble.bootstrap(n, SEED, 0))  # each base model its own sample


def test_ring_closed_form_and_coi_arithmetic():
    assert distributed.ring_bytes(GRADIENT_BYTES, 4) == GRADIENT_BYTES * 2 * 3 / 4
    c = distributed.CommCounter(ranks=4, gradient_bytes=1000)
    c.bytes, c.buckets, c.steps = 3 * 1000, 6, 3  # 3 steps of 2 buckets, 1000 bytes a step
    f = c.figures(flops_per_sample=50.0, samples=3 * 8, steps=3)
    assert f["bytes_per_step"] == 1000 and f["buckets_per_step"] == 2
    assert f["bytes_per_step_ring"] == 1500  # 2 x 3/4 x 1000
    assert f["flops_per_step"] == 400  # 50 x 8 samples
    assert f["coi"] == 0.4 and math.isclose(f["coi_ring"], 400 / 1500)
    assert f["bytes_per_sample"] == 125
    alone = distributed.CommCounter(ranks=1, gradient_bytes=1000).figures(50.0, 8, 1)
    assert alone["bytes_per_step"] == 0 and alone["coi"] is None and "one rank per model" in alone["unavailable"]["coi"]


def test_one_process_needs_no_torch_distributed():
    ranks = distributed.init("cpu")
    assert (ranks.rank, ranks.world_size, ranks.backend) == (0, 1, None)
    assert not torch.distributed.is_initialized()
    assert ensemble.for_bench("digits", 1, 1) is None
    with pytest.raises(UsageError, match="--ensemble 2 trains each base model on its own ranks"):
        ensemble.for_bench("digits", 2, 1)
    with pytest.raises(UsageError, match="--ensemble applies to digits"):
        ensemble.for_bench("image_classification", 2, 4)


def test_srun_without_master_addr_is_one_clear_line(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    with pytest.raises(UsageError, match="MASTER_ADDR is not set.*scontrol show hostnames"):
        distributed.init("cpu")


def test_slurm_tasks_per_node_is_read_for_this_node(monkeypatch):
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "4(x2),3")
    monkeypatch.setenv("SLURM_NODEID", "2")
    assert distributed._slurm_tasks_on_node() == 3
    monkeypatch.setenv("SLURM_NODEID", "1")
    assert distributed._slurm_tasks_on_node() == 4


# -- real ranks ------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(rank: int, world: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def _bench_rank(rank: int, argv: list[str]) -> int:
    """One rank of ``flopcount bench``, forked from the test (torch already imported), env:// as torchrun sets it."""
    from flopcount.cli import main

    return main(argv)


def _watched(target, rank: int, world: int, port: int, *args) -> None:
    """Run one rank, forked from the test process: env:// as torchrun sets it, one thread, and the exit code
    ``target`` returns (0 for None, 1 for an exception, whose traceback goes to stderr).

    What the rank inherits is frozen out of its garbage collector: earlier tests leave garbage cycles of TensorFlow
    objects (the Keras callback test) whose finalizers take a lock that a TensorFlow thread of the parent held at
    the fork, so collecting them here hung the rank for good. A rank still running after 240 s prints every
    thread's stack to stderr and exits, so that a hang shows where it is (the test waits 300 s)."""
    import faulthandler
    import gc

    gc.freeze()
    faulthandler.dump_traceback_later(240, exit=True)
    code = 1
    try:
        os.environ.update(_env(rank, world, port))
        torch.set_num_threads(1)
        code = target(rank, *args) or 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _launch(target, world: int, args: tuple) -> None:
    import multiprocessing

    import torch._dynamo  # noqa: F401  (DDP's constructor imports it: once here, before the ranks fork)

    ctx = multiprocessing.get_context("fork")
    port = _free_port()
    procs = [ctx.Process(target=_watched, args=(target, r, world, port) + args) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    codes = [p.exitcode for p in procs]
    for p in procs:
        if p.is_alive():
            p.kill()
    assert codes == [0] * world, f"rank exit codes {codes}"


BENCH = ["bench", "digits", "--epochs", "12", "--target-quality", "0.9", "--peak-flops", "1e9", "--warmup-steps",
         "2", "--window-steps", "5", "--seed", str(SEED), "--no-progress"]


def _check_data_parallel_run(doc: dict, R: int, P: int, i: int = 0) -> dict:
    run = doc["runs"][i]
    assert doc["system"]["ranks"] == R and doc["system"]["nodes"] == 1 and doc["system"]["ranks_per_node"] == R
    assert doc["system"]["interconnect"]["backend"] == "gloo"
    assert [r["rank"] for r in run["per_rank"]] == list(range(R))
    rates = [r["samples_per_s"] for r in run["per_rank"]]
    assert math.isclose(run["samples_per_s"]["total"], sum(rates))  # total = sum of the ranks' figures
    C = run["flops_per_sample"]
    assert DENSE_C <= C <= 1.01 * DENSE_C  # the dense part, plus bias, ReLU and pooling
    assert math.isclose(run["flops"], sum(rates) * C)  # FLOPS = sum over ranks of N_r x C = N x R x C
    # every rank a shard of every epoch: ceil(1,437 / P) samples of the model's epoch per rank
    assert all(r["samples"] == run["epochs"] * math.ceil(1437 / P) for r in run["per_rank"])
    assert run["samples"] == sum(r["samples"] for r in run["per_rank"])  # run-level samples: the total over ranks
    assert run["timed_samples"] == sum(r["timed_samples"] for r in run["per_rank"])
    comm = run["communication"]
    assert comm["ranks"] == P and comm["backend"] == "gloo"
    if P > 1:
        assert comm["bytes_per_step"] == GRADIENT_BYTES  # measured: the gradient buckets DDP all-reduces
        assert comm["bytes_per_step_ring"] == GRADIENT_BYTES * 2 * (P - 1) / P  # closed form of a ring
        assert comm["hooked_steps"] == run["steps"]
        rank0 = run["per_rank"][0]["samples"]  # one rank's FLOPs per byte it all-reduces
        assert math.isclose(comm["coi"], C * rank0 / (run["steps"] * GRADIENT_BYTES))
    assert run["quality"] >= 0.9 and run["time_to_quality_s"] is not None  # the target was reached
    return run


@pytest.mark.slow
@pytest.mark.parametrize("R", [2, 4])
def test_data_parallel_digits_on_gloo_ranks(tmp_path, R):
    out = tmp_path / "r.json"
    _launch(_bench_rank, R, (BENCH + ["-o", str(out)],))
    doc = json.loads(out.read_text())
    run = _check_data_parallel_run(doc, R, R)
    assert run["ensemble"] is None and doc["config"]["scale_out"]["ranks_per_model"] == R
    assert doc["system"]["cpu"]["torch_threads"] == 1  # each rank ran one thread
    if R == 2:
        _check_hpcai_roofline(tmp_path, out)


def _check_hpcai_roofline(tmp_path, run_file) -> None:
    """The HPC-AI roofline of the real 2-rank run against ceilings measured now, in this process, on its threads:
    the run's ranks used 2 x 1 threads, so its compute ceilings are the measured ones x 2 / (this process's)."""
    from flopcount.cli import main
    from flopcount.measure.machine.ceilings import measure_ceilings

    from flopcount.measure.machine.devices import cpu_cores

    threads, used = torch.get_num_threads(), min(2, cpu_cores())  # the run's 2 x 1 threads, at most every core
    ceilings = measure_ceilings("cpu", dtypes=("fp32",), quick=True)
    (tmp_path / "c.json").write_text(ceilings.to_json())
    assert main(["roofline", "--ceilings", str(tmp_path / "c.json"), "--run", str(run_file), "--format", "json",
                 "-o", str(tmp_path / "roof.json")]) == 0
    compute = {c["label"]: c["flops_per_s"] for c in json.loads((tmp_path / "roof.json").read_text())["compute"]}
    assert compute["GEMM fp32"] == pytest.approx(ceilings.gemm["fp32"].value * used / threads)
    assert compute["CONV fp32"] == pytest.approx(ceilings.conv["fp32"].value * used / threads)


@pytest.mark.slow
@pytest.mark.parametrize("M, P, runs", [(2, 1, 2), (2, 2, 1)])
def test_bagging_ensemble_on_gloo_ranks(tmp_path, M, P, runs):
    out = tmp_path / "e.json"
    _launch(_bench_rank, M * P, (BENCH + ["--ensemble", str(M), "--runs", str(runs), "-o", str(out)],))
    doc = json.loads(out.read_text())
    assert len(doc["runs"]) == runs
    for i in range(runs):
        _check_ensemble_run(doc, i, M, P)


def _check_ensemble_run(doc: dict, i: int, M: int, P: int) -> None:
    run = _check_data_parallel_run(doc, M * P, P, i)
    ens = run["ensemble"]
    assert ens["models"] == M and ens["ranks_per_model"] == P
    assert ens["layout"] == [list(range(m * P, (m + 1) * P)) for m in range(M)]
    rates = {r["rank"]: r["samples_per_s"] for r in run["per_rank"]}
    C = run["flops_per_sample"]
    for m, base in enumerate(ens["base_models"]):
        assert base["ranks"] == ens["layout"][m]
        assert math.isclose(base["flops"], sum(rates[r] for r in base["ranks"]) * C)
        # the bootstrap of model m, recomputed from the documented generator: n draws with replacement
        n = 1437
        unique = np.unique(np.random.default_rng([SEED + i, m]).integers(0, n, size=n)).size  # run i: seed + i
        assert base["bootstrap"] == [{"samples": n, "unique": unique, "unique_fraction": unique / n}]
        assert 0.58 < unique / n < 0.68  # about 1 - 1/e
        assert len(base["qualities"]) == run["epochs"]
    assert math.isclose(ens["flops"], sum(b["flops"] for b in ens["base_models"]))  # FLOPS: sum over base models
    assert math.isclose(run["flops"], ens["flops"])
    assert ens["apc"] == M * P * 32 * C  # M x P x batch per rank x C
    assert ens["quality"] == run["quality"]
    assert math.isclose(run["vflops"], run["flops"] * (run["quality"] / 0.9) ** 5)  # VFLOPS on the ensemble's


def _predict_rank(rank: int, M: int, out: str) -> None:
    """The Python API for a user's own model: M base models of P ranks, each rank evaluating its model's
    predictions; the helper averages the models' predictions across the process groups."""
    ranks = distributed.init("cpu")
    ens = ensemble.Ensemble(models=M)
    torch.manual_seed(ens.seed(SEED))  # base models differ, replicas of one model agree
    net = torch.nn.Linear(6, 5)
    model = ens.wrap(net)
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))
    y = torch.arange(40) % 5
    # one training step on this rank's shard of its model's bootstrap sample, through DDP when P > 1
    idx = ens.sampler(40, SEED)(1)[:8]
    torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
    with torch.no_grad():
        net.weight -= 0.5 * net.weight.grad
    probs = net(x).softmax(1).detach()
    base, together = ens.evaluate(probs, y)
    torch.save({"rank": rank, "model": ens.model_index, "group": list(ens.model_ranks), "probs": probs,
                "base": base, "together": together}, f"{out}/{rank}.pt")
    distributed.finish(ranks)


@pytest.mark.slow
@pytest.mark.parametrize("M, P", [(2, 1), (2, 2)])
def test_ensemble_accuracy_is_that_of_the_averaged_predictions(tmp_path, M, P):
    _launch(_predict_rank, M * P, (M, str(tmp_path)))
    got = [torch.load(tmp_path / f"{r}.pt") for r in range(M * P)]
    assert [g["group"] for g in got] == [list(range(g["model"] * P, (g["model"] + 1) * P)) for g in got]
    y = torch.arange(40) % 5
    leads = [got[m * P] for m in range(M)]
    for g in got:  # replicas of one model hold the same parameters after the DDP step
        assert torch.allclose(g["probs"], leads[g["model"]]["probs"], atol=1e-6)
    average = sum(lead["probs"] for lead in leads) / M  # soft voting, computed here
    expected = (average.argmax(1) == y).sum().item() / len(y)
    assert all(math.isclose(g["together"], expected) for g in got)
    assert all(g["base"] == (g["probs"].argmax(1) == y).sum().item() / len(y) for g in got)
    assert not torch.allclose(leads[0]["probs"], leads[1]["probs"])  # the base models differ,
    assert all(lead["base"] != expected for lead in leads)  # and so does their average from each of them


def _peak_rank(rank: int, out: str) -> None:
    """A meter's CPU device on one rank: the real device description and GEMM calibration (or its
    cache), with the calls that describe this CPU recorded."""
    from flopcount.measure.machine import devices
    from flopcount.measure.harness.meter import Meter

    calls = []
    real = devices.cpu_device
    devices.cpu_device = lambda *a, **kw: calls.append(rank) or real(*a, **kw)
    ranks = distributed.init("cpu")
    meter = Meter(flops_per_sample=1000.0, device="cpu", warmup_steps=0, window_steps=1)
    x = torch.randn(64, 64)
    for _ in range(3):
        with meter.step(8):
            x = torch.tanh(x @ x)
    result = meter.result()
    meter.to_json(f"{out}/run.json")  # rank 0 alone writes: it must not wait on a collective
    json.dump({"calls": calls, "peak": result.peak_flops, "source": result.peak_source,
               "mfu": result.mfu, "flops": result.flops}, open(f"{out}/{rank}.json", "w"))
    distributed.finish(ranks)


@pytest.mark.slow
def test_every_rank_divides_by_the_peak_rank_0_measured(tmp_path):
    """A CPU peak is measured, not read from a table: rank 0 measures it once and every rank's MFU uses that figure
    (ranks measuring each at its own moment would disagree as the others load the machine)."""
    _launch(_peak_rank, 3, (str(tmp_path),))
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(3)]
    assert [g["calls"] for g in got] == [[0], [], []]  # described once, on rank 0, though every rank ran result()
    peak = got[0]["peak"]
    assert peak > 0 and all(g["peak"] == peak for g in got)
    assert all(g["source"].endswith("measured on rank 0, every rank uses it") for g in got)
    # MFU = FLOPS / (R x peak of one device), the same FLOPS (gathered from every rank) on every rank
    assert all(math.isclose(g["mfu"], got[0]["flops"] / (3 * peak)) for g in got)
    assert json.loads((tmp_path / "run.json").read_text())["runs"][0]["peak_flops"] == peak


@pytest.mark.slow
def test_data_parallel_imagefolder_on_gloo_ranks(tmp_path):
    """``bench image_classification --data DIR`` on 2 gloo ranks: each rank a shard of every epoch of the folder's
    training split, DDP all-reducing ResNet-50's gradients."""
    from helpers import make_folder

    from flopcount.models.resnet import resnet50

    data = make_folder(tmp_path / "data")  # 3 classes of 6: 1 of each held out, 15 to train
    out = tmp_path / "r.json"
    _launch(_bench_rank_on_noise, 2, (["bench", "image_classification", "--data", str(data), "--image-size", "32x32",
                              "--batch-size", "4", "--epochs", "2", "--warmup-steps", "1", "--window-steps", "1",
                              "--peak-flops", "1e9", "--no-progress", "-o", str(out)],))
    doc = json.loads(out.read_text())
    run = doc["runs"][0]
    assert doc["system"]["ranks"] == 2 and doc["system"]["interconnect"]["backend"] == "gloo"
    assert [r["samples"] for r in run["per_rank"]] == [run["epochs"] * math.ceil(15 / 2)] * 2
    assert run["samples"] == 2 * run["epochs"] * math.ceil(15 / 2)
    comm = run["communication"]
    params = sum(p.numel() for p in resnet50(num_classes=3).parameters())
    assert comm["ranks"] == 2 and comm["bytes_per_step"] == 4 * params  # fp32 gradients, all-reduced every step
    assert comm["hooked_steps"] == run["steps"]
    assert run["epochs"] == 2 and run["time_to_quality_s"] is None  # noise: the target is not reached


def _bench_rank_on_noise(rank: int, argv: list[str]) -> int:
    """A rank of a bench on noise images: exit 10 (the target not reached) is the expected end."""
    code = _bench_rank(rank, argv)
    return 0 if code == 10 else code or 99


@pytest.mark.slow
def test_torchrun_launches_the_bench(tmp_path):
    """The launcher itself: ``torchrun --nproc_per_node=2 -m flopcount bench digits --ensemble 2`` (M=2, P=1)."""
    out = tmp_path / "t.json"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "flopcount", *BENCH, "--epochs", "1", "--target-quality", "0.5", "--ensemble", "2",
                           "-o", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["system"]["ranks"] == 2 and doc["config"]["scale_out"]["launcher"] == "torchrun"
    assert len(doc["runs"][0]["per_rank"]) == 2 and doc["runs"][0]["ensemble"]["models"] == 2
    assert proc.stdout.count("summary over 1 runs") == 1  # only rank 0 prints


@pytest.mark.gpu
def test_nccl_data_parallel_on_gpus(tmp_path):
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    out = tmp_path / "g.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           "-m", "flopcount", *BENCH, "--device", "cuda", "-o", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(out.read_text())["runs"][0]
    assert run["communication"]["backend"] == "nccl" and run["communication"]["bytes_per_step"] == GRADIENT_BYTES


@pytest.mark.parametrize("module", [distributed, ensemble], ids=lambda m: m.__name__)
def test_docstring_examples(module):
    import doctest

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
