"""Runs that end cleanly however they end: a full disk under --mllog, SIGINT and SIGTERM during a real bench run,
a meter in the user's loop closed early, SIGTERM to torchrun, and a gloo rank that hangs or dies under a short
--timeout."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

from flopcount.errors import Interrupted  # noqa: E402
from flopcount.measure.harness.meter import Meter  # noqa: E402

OLD = b'{"earlier": "report"}\n'
# digits at its defaults: 1,437 training images at batch 32, 45 steps an epoch; an unreachable target keeps it going
ENDLESS = ["bench", "digits", "--epochs", "500", "--target-quality", "0.99999", "--peak-flops", "1e9", "--no-progress"]


def ticking():
    ticks = iter(range(10**6))
    return lambda: float(next(ticks))


def events():
    seen = []
    return seen, lambda event, fields: seen.append((event, dict(fields)))


# -- the meter in the user's loop ------------------------------------------------------------------------------


def test_a_signal_in_a_metered_loop_closes_the_run_as_aborted():
    seen, listener = events()
    meter = Meter(flops_per_sample=1e6, peak_flops=1e9, warmup_steps=0, window_steps=3, energy=False,
                  clock=ticking())
    meter.subscribe(listener)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Interrupted) as e:
        with meter:
            for i in range(100):
                with meter.step(samples=4):
                    if i == 7:  # SIGTERM arrives in the 8th step: 7 steps are done, 2 windows of 3 closed
                        os.kill(os.getpid(), signal.SIGTERM)
                        time.sleep(1)  # (the handler runs at the next bytecode)
    assert e.value.meter is meter and e.value.exit_code == 143 and e.value.signal == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back
    assert seen[-1] == ("run_stop", {"status": "aborted"})
    r = meter.result()
    assert (r.complete, r.ended_by, r.steps, r.samples) == (False, "SIGTERM", 7, 28)
    assert r.samples_per_s["windows"] == 3  # windows of 3, 3 and the 1 step done before the cut
    assert any("ended early (SIGTERM) after 7 steps" in n for n in r.notes)


def test_keyboard_interrupt_and_close_end_the_run_early():
    seen, listener = events()
    meter = Meter(flops_per_sample=1e6, warmup_steps=0, window_steps=2, energy=False, clock=ticking(),
                  peak_flops=1e9)
    meter.subscribe(listener)
    with pytest.raises(KeyboardInterrupt):
        with meter:
            for i in range(5):
                with meter.step(samples=2):
                    if i == 4:
                        raise KeyboardInterrupt
    r = meter.result()
    assert (r.complete, r.ended_by, r.steps) == (False, "SIGINT", 4)
    assert [e for e, _ in seen].count("run_stop") == 1

    closed = Meter(flops_per_sample=1e6, warmup_steps=0, window_steps=2, energy=False, clock=ticking(),
                   peak_flops=1e9)
    for _ in range(3):
        with closed.step(samples=2):
            pass
    closed.close()
    closed.close()
    r = closed.result()
    assert (r.complete, r.ended_by, r.steps) == (False, "Meter.close() before the end of training", 3)

    done = Meter(flops_per_sample=1e6, warmup_steps=0, window_steps=2, energy=False, clock=ticking(),
                 peak_flops=1e9)
    with done:
        for _ in range(2):
            with done.step(samples=2):
                pass
    done.close()  # after the end of training: nothing changes
    assert done.result().complete and done.result().ended_by == "the end of training"


# -- a real bench run ------------------------------------------------------------------------------------------


def _part(folder, name: str) -> str:
    """The text of the MLPerf log being written beside ``name`` (empty before it exists)."""
    parts = glob.glob(os.path.join(folder, f".{name}.*"))
    return open(parts[0], encoding="utf-8").read() if parts else ""


def _bench(folder, *argv):
    return subprocess.Popen([sys.executable, "-m", "flopcount", *ENDLESS, *argv], cwd=folder,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.slow
def test_sigint_and_sigterm_during_bench_close_the_log_and_write_the_runs_so_far(tmp_path):
    """Two real runs side by side, one cancelled with SIGTERM (as SLURM and torchrun do) and one with SIGINT, each
    once its first evaluation is logged."""
    procs = {}
    for name in ("SIGTERM", "SIGINT"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "r.json").write_bytes(OLD)
        (folder / "run.log").write_bytes(b"an earlier log\n")
        procs[name] = folder, _bench(folder, "--mllog", "run.log", "-o", "r.json", "--submission-benchmark", "resnet")
    waiting = dict(procs)
    deadline = time.monotonic() + 240
    while waiting and time.monotonic() < deadline:
        for name, (folder, proc) in list(waiting.items()):
            assert proc.poll() is None, proc.stderr.read()
            if "eval_accuracy" in _part(folder, "run.log"):
                assert (folder / "run.log").read_text() == "an earlier log\n"  # still whole while the run goes on
                proc.send_signal(getattr(signal, name))
                del waiting[name]
        time.sleep(0.1)
    assert not waiting, "no evaluation logged within 240 s"
    for name, (folder, proc) in procs.items():
        err = proc.communicate(timeout=120)[1].strip().splitlines()
        assert proc.returncode == 128 + getattr(signal, name), err
        assert len(err) == 1 and err[0].startswith(f"flopcount: error: interrupted by {name} during run 0 after ")
        assert err[0].endswith('; the runs so far are in r.json ("complete": false)')
        doc = json.loads((folder / "r.json").read_text())
        run = doc["runs"][0]
        assert doc["complete"] is False and run["complete"] is False and run["ended_by"] == name
        assert doc["interrupted"] == {"signal": name, "run": 0, "steps": run["steps"],
                                      "windows": run["samples_per_s"]["windows"]}
        assert run["steps"] >= 45 and run["samples"] == 1437 * (run["steps"] // 45) + 32 * (run["steps"] % 45)
        records = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (folder / "run.log").read_text().splitlines()]
        assert records[-1]["key"] == "run_stop" and records[-1]["metadata"]["status"] == "aborted"
        assert sorted(os.listdir(folder)) == ["r.json", "run.log"]  # no temporary file left
    pytest.importorskip("mlperf_logging")
    folder = procs["SIGTERM"][0]
    out = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                          "--ruleset", "4.0.0", "run.log"], cwd=folder, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "SUCCESS" in out.stdout + out.stderr, out.stdout + out.stderr


@pytest.mark.slow
def test_a_full_disk_under_mllog_is_exit_8_and_the_report_is_still_written(tmp_path, small_disk, capsys):
    from flopcount.cli import main

    disk = small_disk(8, files={"run.log": b"an earlier log\n"})
    (tmp_path / "r.json").write_bytes(OLD)
    # one epoch of digits logs ~5 KB of init block and epoch lines, the 8 KiB disk holds the earlier log and less
    rc = main(["bench", "digits", "--epochs", "2", "--peak-flops", "1e9", "--no-progress", "--mllog",
               str(disk / "run.log"), "-o", str(tmp_path / "r.json"), "--submission-org", "x" * 4000])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 8 and len(err) == 1, err
    assert err[0].startswith(f"flopcount: error: {disk / 'run.log'}: cannot write the MLPerf log (--mllog) (No space")
    assert (disk / "run.log").read_bytes() == b"an earlier log\n" and os.listdir(disk) == ["run.log"]
    doc = json.loads((tmp_path / "r.json").read_text())  # the run's report is written all the same
    assert doc["complete"] is True and doc["runs"][0]["steps"] == 45 * doc["runs"][0]["epochs"]


@pytest.mark.slow
def test_sigterm_to_torchrun_closes_the_log_and_writes_the_runs_so_far(tmp_path):
    """What SLURM does to a cancelled job: SIGTERM to the torchrun launcher, which passes it to its two gloo ranks.
    Rank 0's report and MLPerf log are still written, as an aborted run; the earlier report is replaced whole."""
    (tmp_path / "r.json").write_bytes(OLD)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                                 "-m", "flopcount", *ENDLESS, "--mllog", "run.log", "-o", "r.json"], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while "eval_accuracy" not in _part(tmp_path, "run.log") and time.monotonic() < deadline:
            assert launcher.poll() is None, launcher.stderr.read()[-3000:]
            time.sleep(0.1)
        assert time.monotonic() < deadline, "no evaluation logged within 240 s"
        launcher.send_signal(signal.SIGTERM)
        err = launcher.communicate(timeout=120)[1]
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 0  # torchrun reports the signal it was stopped by
    ours = [line for line in err.splitlines() if line.startswith("flopcount:")]
    assert ours and all(line.startswith("flopcount: error: interrupted by SIGTERM during run 0 after ") for line in ours)
    assert not any("internal error" in line for line in err.splitlines())
    doc = json.loads((tmp_path / "r.json").read_text())
    run = doc["runs"][0]
    assert doc["complete"] is False and run["complete"] is False and run["ended_by"] == "SIGTERM"
    assert doc["interrupted"]["signal"] == "SIGTERM" and doc["interrupted"]["steps"] == run["steps"] >= 1
    assert doc["config"]["scale_out"]["launcher"] == "torchrun" and doc["config"]["scale_out"]["ranks"] == 2
    records = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (tmp_path / "run.log").read_text().splitlines()]
    assert records[-1]["key"] == "run_stop" and records[-1]["metadata"]["status"] == "aborted"
    assert sorted(os.listdir(tmp_path)) == ["r.json", "run.log"]  # no temporary file left by either rank


# -- a gloo rank that hangs or dies ----------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, port: int, fault: str, argv: list[str]) -> None:
    """One forked rank of ``flopcount bench`` (env:// as torchrun sets it); rank 1 hangs (SIGSTOP) or dies at the
    start of its second epoch. Exits with the command's code."""
    import gc

    gc.freeze()
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    torch.set_num_threads(1)
    code = 1
    try:
        if rank == 1:
            real = Meter.epoch_start

            def faulty(self):
                if len(self.timed_epochs) == 1:
                    if fault == "stop":
                        os.kill(os.getpid(), signal.SIGSTOP)
                    os._exit(9)
                real(self)

            Meter.epoch_start = faulty
        from flopcount.cli import main

        code = main(argv)
    finally:
        sys.stderr.flush()
        os._exit(code)


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["stop", "kill"])
def test_a_hung_or_dead_gloo_rank_ends_rank_0_within_the_timeout(tmp_path, capfd, fault):
    import multiprocessing

    import torch._dynamo  # noqa: F401  (DDP's constructor imports it: once here, before the ranks fork)

    timeout = 8.0
    argv = [*ENDLESS, "--timeout", str(timeout), "-o", str(tmp_path / "r.json")]
    ctx = multiprocessing.get_context("fork")
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, port, fault, argv)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and procs[1].exitcode is None and not _stopped(procs[1].pid):
            time.sleep(0.05)
        faulted = time.monotonic()
        procs[0].join(timeout=120)
        took = time.monotonic() - faulted
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("flopcount:")]
    assert procs[0].exitcode == 12, err
    assert err == [f"flopcount: error: rank 0: rank 1 stopped answering (hung or dead) within --timeout {timeout:g} s; "
                   f"this rank ends too (gloo: {err[0].split('(gloo: ', 1)[1]}"], err
    assert took < timeout + 10  # the collective's share, the roll call, and leaving the process group
    assert not (tmp_path / "r.json").exists()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _loop_rank(rank: int, port: int, queue) -> None:
    """A user's loop of all-reduces under ``with Meter(timeout=6)``; rank 1 dies at its 5th step."""
    import datetime

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=4))  # 2/3 of the meter's timeout=6
    try:
        with Meter(flops_per_sample=1e6, peak_flops=1e9, warmup_steps=0, energy=False, timeout=6) as meter:
            for step in range(10**6):
                if rank == 1 and step == 4:
                    os._exit(9)
                with meter.step(samples=1):
                    dist.all_reduce(torch.ones(4))
    except BaseException as e:  # noqa: BLE001 - what the loop sees is the test's result
        queue.put((type(e).__name__, str(e), meter.complete))
    queue.close()
    queue.join_thread()  # (the feeder thread hands the result over before the process ends)
    os._exit(0)


@pytest.mark.slow
def test_a_dead_rank_in_a_metered_user_loop_is_named(tmp_path):
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_loop_rank, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    try:
        kind, message, complete = queue.get(timeout=120)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert kind == "MeasurementError" and complete is False
    assert message.startswith("rank 0: rank 1 stopped answering (hung or dead) within timeout= 6 s; this rank ends "
                              "too (gloo: ")


def test_a_rank_whose_peers_never_join_ends_within_the_timeout(monkeypatch, capsys):
    from flopcount.cli import main

    port = _free_port()
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    rc = main(["bench", "digits", "--timeout", "3", "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 12 and len(err) == 1, err
    assert err[0].startswith("flopcount: error: rank 0: the gloo process group of 2 ranks did not form (")
    assert err[0].endswith("check that every rank was started and can reach MASTER_ADDR:MASTER_PORT")
    assert not torch.distributed.is_initialized()
