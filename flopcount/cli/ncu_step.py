"""The program that ``flopcount crosscheck --print-ncu-command`` (and ``--run``) puts under ncu.

It builds the ``--torch`` module on the GPU, runs ``--warmup`` steps unprofiled (cuDNN and cuBLAS autotuning
happen there), then brackets exactly one step with ``torch.cuda.profiler.start()``/``stop()``, so that ncu,
started with ``--profile-from-start off``, profiles that step's kernels only (those autograd launches from its own
thread included). Process-wide NVTX ranges (start/end, seen by every thread) name the phase of each kernel
(``flopcount/forward``, ``flopcount/loss``, ``flopcount/backward``, ``flopcount/optimizer``) and, through
``torch.autograd.profiler.emit_nvtx``, the launching thread's push/pop ranges name the aten operator;
``flopcount crosscheck --ncu-csv`` attributes kernels to families from them.

``--gemm M N K`` profiles one matrix product instead (the calibration: its counters must read 2·M·N·K).

Run it as ``python -m flopcount.measure.ncu_step --torch pkg.mod:factory --input-shape x=32x3x224x224 --mode train``.
Without CUDA it stops with one line (exit 11).
"""

from __future__ import annotations

import argparse
import sys

from flopcount.measure.ncu.step import PRECISIONS, run_gemm, run_model
from .arguments import Parser, add_options, positive
from .console import run_guarded

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m flopcount.measure.ncu_step",
               description="Run one profiled steady-state step of a PyTorch module on CUDA.")
    p.add_argument("--torch", metavar="MODULE:FACTORY", help="the module to train (as flopcount --torch)")
    add_options(p, ["input_shapes", "batch", "mode", "optimizer"], help={
        "input_shapes": "forward() inputs by parameter name (standard-normal float32 unless :DTYPE), e.g. "
        "x=32x3x224x224 or input_ids=32x128:int64",
        "batch": "set dim 0 of every input",
        "mode": "train (default here: the step profiled) or inference",
        "optimizer": "train mode: also run this optimizer's step (default: none, gradients only)"})
    p.set_defaults(input_dtypes={}, mode="train")  # the step crosscheck profiles is a training step
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32 (TF32 off), tf32 (TF32 on for cuBLAS and cuDNN), bf16 or fp16 (autocast)")
    p.add_argument("--warmup", type=positive, default=3, metavar="N", help="unprofiled steps first (default 3)")
    p.add_argument("--gemm", nargs=3, type=positive, metavar=("M", "N", "K"),
                   help="instead of a model: profile one M×K by K×N matrix product (calibration)")
    return p


def main(argv: list[str] | None = None) -> int:
    from flopcount.errors import DeviceError, FrontendError, UsageError, import_framework

    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if (args.gemm is None) == (args.torch is None):
        parser.print_usage(sys.stderr)
        print("ncu_step: give --torch MODULE:FACTORY with --input-shape, or --gemm M N K", file=sys.stderr)
        return 2

    def action() -> int:
        try:
            torch = import_framework("torch")
        except ModuleNotFoundError:
            raise FrontendError("ncu_step: PyTorch is not installed; install a CUDA build of torch") from None
        if not torch.cuda.is_available():
            raise DeviceError("ncu_step: no CUDA device visible to PyTorch (torch.cuda.is_available() is False); "
                              "run it on a machine with an NVIDIA GPU and a CUDA build of torch")
        if args.gemm:
            run_gemm(torch, *args.gemm, args.precision)
        else:
            if not args.input_shape:
                raise UsageError("ncu_step: --torch needs --input-shape NAME=DIMS for each forward() input")
            run_model(torch, args)
        return 0

    return run_guarded(action, 0)


if __name__ == "__main__":
    sys.exit(main())
