"""``flopcount ceilings``: measure this machine's ceilings and write them as JSON (or a table)."""

from __future__ import annotations

import argparse

from .arguments import Parser, add_verbosity
from .console import write_output


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="flopcount ceilings",
        description="Measure this machine's ceilings through torch: GEMM and 3x3 convolution FLOP/s per dtype, "
        "memory bandwidth (a large copy) and, under torchrun with several ranks, all-reduce bus bandwidth. "
        "flopcount profile and flopcount roofline read the JSON (--ceilings FILE).",
    )
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--dtype", action="append", choices=("fp32", "tf32", "bf16", "fp16", "fp64"),
                   help="a dtype to measure (repeatable; default: fp32 and what the device runs: bf16 on a CPU, "
                   "tf32/bf16/fp16 on CUDA)")
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats: seconds (tests, a first look)")
    p.add_argument("--format", choices=("json", "table"), default="json", help="output format (default: json)")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE instead of stdout (rank 0 only)")
    add_verbosity(p)
    return p


def render_table(c) -> str:
    from tabulate import tabulate

    from flopcount.output.render import si

    rows = [[f"GEMM {k}", si(f.value, "FLOP/s"), f.source] for k, f in c.gemm.items()]
    rows += [[f"CONV {k}", si(f.value, "FLOP/s"), f.source] for k, f in c.conv.items()]
    for name, f in (("memory bandwidth", c.memory_bandwidth), ("all-reduce bandwidth", c.allreduce_bandwidth)):
        if f is not None:
            rows.append([name, si(f.value, "B/s"), f.source])
    lines = [f"Device: {c.device.get('name', '?')} ({c.device.get('kind', '?')}); nodes {c.nodes}, ranks {c.ranks}",
             tabulate(rows, ["ceiling", "value", "how"], tablefmt="simple", disable_numparse=True)]
    lines += [f"Not measured: {k}: {why}" for k, why in c.unavailable.items()]
    return "\n".join(lines) + "\n"


def _init_distributed(device: str) -> bool:
    """Join the process group a launcher (torchrun, srun) describes; False when this is a single process."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1") or 1) <= 1:
        return False
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            import torch

            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend)
    return True


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from flopcount.errors import DeviceError
    from flopcount.measure.machine.ceilings import measure_ceilings

    if importlib.util.find_spec("torch") is None:
        raise DeviceError("flopcount ceilings measures this machine through torch, which is not installed; install "
                          "it (pip install torch), or measure on a machine that has it and give its file to "
                          "--ceilings FILE")

    distributed = _init_distributed(args.device)
    try:
        c = measure_ceilings(args.device, tuple(args.dtype) if args.dtype else None, quick=args.quick)
    finally:
        if distributed:
            import torch.distributed as dist

            rank = dist.get_rank()
            dist.destroy_process_group()
    if distributed and rank != 0:
        return 0
    write_output(c.to_json() if args.format == "json" else render_table(c), args.output)
    return 0
