"""Where the CPU time of a tensor-parallel rank goes: rank 0 of ``step_time.py``'s ``tp2`` run (the Llama of
``step_time.py`` at batch 4, ``step_time_tp.TensorParallelLM`` over 2 gloo processes, AdamW, one thread), measured
by parts beside the prediction's parts from a profile calibrated beforehand:

* the step's CPU seconds (user and system, every thread of the process), and the CPU seconds inside its all_reduce
  calls by phase (forward, backward) and size, each against the profile's seconds for that message; the calls'
  median, mean and 90th percentile (all phases and sizes together) beside the profile's in a step;
* the same rank's step alone in one process with every all_reduce doing nothing (its compute), and the CPU seconds
  of its matrix products in that step by shape, against the profile's GEMM rate at each product's size.

    PYTHONPATH=$PWD python3 -m flopcount calibrate --ranks 2 --threads 1 -o /tmp/profile-2.json
    PYTHONPATH=$PWD python3 benchmarks/step_time_tp_parts.py --profile /tmp/profile-2.json

The CPU's cores are shared with whatever else runs: the 1-minute load average is printed.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import step_time
import step_time_tp

TP, BATCH = 2, 4


class _Collectives:
    """Stands for ``torch.distributed`` in ``step_time_tp``: each all_reduce's CPU seconds (the process's, and the
    calling thread's: gloo reduces and moves the bytes on threads of its own) summed by (phase, bytes); ``real``
    False: the all_reduce does nothing (the rank's compute alone)."""

    def __init__(self, real: bool):
        import torch.distributed as dist

        self.dist, self.real, self.ReduceOp = dist, real, dist.ReduceOp
        self.phase, self.calls = "forward", collections.Counter()
        self.cpu, self.caller = collections.Counter(), collections.Counter()
        self.each: list[float] = []  # every call's CPU seconds

    def all_reduce(self, t, *args, **kwargs):
        c, own = time.process_time(), time.thread_time()
        if self.real:
            self.dist.all_reduce(t, *args, **kwargs)
        key = (self.phase, t.numel() * t.element_size())
        spent = time.process_time() - c
        self.cpu[key] += spent
        self.each.append(spent)
        self.caller[key] += time.thread_time() - own
        self.calls[key] += 1


def _rank(rank: int, real: bool, steps: int) -> dict:
    """Rank ``rank``'s step: median CPU seconds, CPU inside its all_reduces and in its matrix products per step."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.set_num_threads(1)
    coll = step_time_tp.dist = _Collectives(real)
    group = coll.dist.new_group(list(range(TP))) if real else None
    net = step_time_tp.TensorParallelLM(step_time._build("llama"), rank, TP, group)
    opt = torch.optim.AdamW(list(net.parameters()), lr=1e-4)
    ids = torch.randint(0, step_time.LLAMA["vocab_size"], (BATCH, step_time.SEQ),
                        generator=torch.Generator().manual_seed(1))

    def step():
        coll.phase = "forward"
        loss = net(ids)
        coll.phase = "backward"
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    class Products(TorchDispatchMode):
        cpu: collections.Counter = collections.Counter()
        calls: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            c = time.process_time()
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket is torch.ops.aten.mm:
                key = (*args[0].shape, args[1].shape[1])
                self.cpu[key] += time.process_time() - c
                self.calls[key] += 1
            return out

    for _ in range(3):
        if real:
            coll.dist.barrier()
        step()
    coll.cpu.clear(), coll.caller.clear(), coll.calls.clear(), coll.each.clear()
    cpus = []
    for _ in range(steps):
        if real:
            coll.dist.barrier()
        c = time.process_time()
        step()
        cpus.append(time.process_time() - c)
    found = {"step": statistics.median(cpus), "collectives": [
        [*k, coll.calls[k] / steps, v / steps, coll.caller[k] / steps] for k, v in sorted(coll.cpu.items())],
        "each": coll.each}
    if not real:  # a separate pass: the dispatch mode's own cost stays out of the step's seconds
        with Products():
            for _ in range(steps):
                step()
        found["products"] = [[*k, Products.calls[k] / steps, v / steps] for k, v in sorted(Products.cpu.items())]
    return found


def _worker(rank: int, port: int, out: str, steps: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=TP,
                            timeout=datetime.timedelta(seconds=120))
    found = _rank(rank, True, steps)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(found, f)


def _real(steps: int) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rank0.json")
        mp.start_processes(_worker, args=(step_time._free_port(), out, steps), nprocs=TP, start_method="spawn")
        with open(out, encoding="utf-8") as f:
            return json.load(f)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="a profile calibrated with --ranks 2 --threads 1")
    ap.add_argument("--steps", type=int, default=10)
    args = ap.parse_args(argv)
    from flopcount.measure.machine.calibration import collective_seconds, load_profile, rate_at

    profile = load_profile(args.profile)
    folder = tempfile.mkdtemp(prefix="flopcount-tp-parts-")
    with open(os.path.join(folder, "llama.json"), "w", encoding="utf-8") as f:
        json.dump(step_time.LLAMA, f)
    run = next(r for r in step_time.RUNS if r.name == "tp2")
    pred = step_time.predict(run, folder, args.profile)["ranks"][0]
    load0 = os.getloadavg()[0]
    real, alone = _real(args.steps), _rank(0, False, args.steps)
    comm = sum(v["exposed"] + v["overlapped"] for v in pred["communication_seconds"].values())
    print(f"load {load0:.1f}-{os.getloadavg()[0]:.1f}")
    busy = pred["compute_seconds"] + pred["optimizer_seconds"] + comm
    print(f"step CPU {real['step']:.4f} s; predicted busy {busy:.4f} s")
    print(f"compute alone (all_reduce doing nothing) {alone['step']:.4f} s; predicted compute + optimizer "
          f"{pred['compute_seconds'] + pred['optimizer_seconds']:.4f} s")
    print(f"collectives: step CPU - compute alone {real['step'] - alone['step']:.4f} s; inside the all_reduce calls "
          f"{sum(c[3] for c in real['collectives']):.4f} s; predicted {comm:.4f} s")
    if real["each"]:
        from flopcount.measure.machine.calibrate import tail_stats

        mean, p90 = tail_stats(real["each"])
        print(f"  each all_reduce call's CPU ({len(real['each'])} calls): median "
              f"{statistics.median(real['each']) * 1e3:.3f} ms, mean {mean * 1e3:.3f} ms, p90 {p90 * 1e3:.3f} ms")
    ar = profile.collectives["all_reduce"]
    in_step = (profile.collectives_in_step or {}).get("all_reduce")
    for phase, nbytes, calls, cpu, caller in real["collectives"]:
        best = collective_seconds(ar, "all_reduce", nbytes, TP, "best")[0]
        step_best = "not measured" if in_step is None else ", ".join(
            f"{w} {collective_seconds(in_step, 'all_reduce', nbytes, TP, w)[0] * 1e3:.3f}"
            for w in ("best", "median", "mean", "p90") if w in in_step.segments[0].latency_s) + " ms"
        print(f"  {phase:8s} {calls:3.0f} x {nbytes:7d} B: CPU {cpu / calls * 1e3:.3f} ms a call (the calling "
              f"thread's {caller / calls * 1e3:.3f}); the profile's all_reduce {best * 1e3:.3f} ms in a tight loop, "
              f"{step_best} in a step")
    got = want = 0.0
    for m, k, n, calls, cpu in alone["products"]:
        rate = rate_at(profile.compute["gemm"], (m * k * n) ** (1 / 3), "best")[0]
        got, want = got + cpu, want + calls * 2 * m * k * n / rate
    print(f"matrix products in the step alone: CPU {got:.4f} s; at the profile's GEMM rate (best) {want:.4f} s")
    print(f"the rest of the step alone (norms, elementwise, attention, loss, optimizer, framework): CPU "
          f"{alone['step'] - got:.4f} s; predicted compute + optimizer less those products "
          f"{pred['compute_seconds'] + pred['optimizer_seconds'] - want:.4f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
