"""``flopcount crosscheck``: the analytic count beside Nsight Compute's hardware counters (or PyTorch's counter).

Three ways in: ``--print-ncu-command`` prints the ncu command to run on a GPU machine; ``--ncu-csv FILE`` compares
an export on any machine; ``--run`` profiles on this machine (ncu and a GPU needed) after a GEMM calibration.
``--fallback torch`` compares with ``torch.utils.flop_counter`` instead (on its own, or when ``--run`` cannot).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

from flopcount.errors import DeviceError, MeasurementError, import_framework
from flopcount.measure.ncu.parse import HALF_PACKING, read_ncu_csv

from .arguments import (SOURCE_DEFAULTS, Parser, add_options, add_verbosity, check_model_source, count_source, positive,
                        torch_inputs)
from .console import write_output

log = logging.getLogger("flopcount.crosscheck")

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
FALLBACKS = {
    "torch": "torch.utils.flop_counter.FlopCounterMode (on the meta device, else on the CPU; convolutions and "
             "matrix products)",
    "torch-profiler": "torch.profiler.profile(with_flops=True) over one real step on the CPU",
}
PERMISSION_FIX = (
    "run as root, or allow all users to read the counters (options nvidia NVreg_RestrictProfilingToAdminUsers=0 "
    "in a file under /etc/modprobe.d, then reload the driver; see https://developer.nvidia.com/ERR_NVGPUCTRPERM)"
)


class _Parser(Parser):
    """Checks the model source the way the counting command does, inside ``parse_args`` (usage errors exit 2)."""

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        ns = super().parse_args(args, namespace)
        if ns.model is None and ns.torch is None:
            self.error("give --torch MODULE:FACTORY, or the path of the .onnx model that an --ncu-csv export profiled")
        check_model_source(self, ns)
        if not (ns.print_ncu_command or ns.ncu_csv or ns.run or ns.fallback):
            self.error("say what to compare: --print-ncu-command, --ncu-csv FILE, --run, or --fallback torch")
        if ns.torch is None and (ns.print_ncu_command or ns.fallback):
            what = "--print-ncu-command" if ns.print_ncu_command else f"--fallback {ns.fallback}"
            self.error(f"{what} runs the PyTorch module: give --torch MODULE:FACTORY (an .onnx file cannot be run "
                       "by it; profile it yourself and pass --ncu-csv FILE)")
        if ns.run and ns.torch is None:
            self.error("--run profiles a training step of the PyTorch module: give --torch MODULE:FACTORY")
        return ns


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="flopcount crosscheck",
        description="Put flopcount's analytic FLOPs beside Nsight Compute's hardware counters, per family "
        "(convolution, matrix product, element-wise, normalization, pooling, reduction, optimizer, other) and in "
        "total, with the likely reason for each gap. See docs/crosscheck.md.",
        epilog="Exit codes: 0 ok, 2 usage, 3 unreadable model file, 9 the --torch model cannot be built or run, "
        "11 ncu, a GPU or counter permission is missing, 12 the ncu export cannot be read or the calibration failed.",
    )
    p.add_argument("model", nargs="?", help="path of an .onnx model (for --ncu-csv; the others need --torch)")
    p.add_argument("--torch", metavar="MODULE:FACTORY",
                   help="the torch.nn.Module that FACTORY() returns; --input-shape gives forward()'s inputs by name")
    add_options(p, ["input_shapes", "batch", "convention", "mode", "optimizer", "strict"], help={
        "input_shapes": "dims of an input, e.g. x=32x3x224x224 (repeatable); with --torch, NAME is a parameter of "
        "forward() and a :DTYPE suffix gives its element type, e.g. input_ids=1x128:int64",
        "convention": "counting convention of the analytic side (default: 1 MAC = 2 FLOPs)",
        "mode": "train: forward, loss and backward of one step (profile a training step)",
        "optimizer": "with --mode train: count (and, in the profiled step, run) this optimizer's update"})
    what = p.add_argument_group("what to do (one of)")
    what.add_argument("--print-ncu-command", action="store_true",
                      help="print the ncu command line that profiles one steady-state step, and stop")
    what.add_argument("--ncu-csv", metavar="FILE",
                      help="compare with this ncu CSV export (--page raw or details; any machine)")
    what.add_argument("--run", action="store_true",
                      help="profile here with ncu (needs ncu, a CUDA GPU and counter permission), after a GEMM "
                      "calibration per precision whose counters must read 2·M·N·K within 1%%")
    what.add_argument("--fallback", choices=sorted(FALLBACKS),
                      help="compare with PyTorch's counter instead of ncu (on its own, or when --run cannot run): "
                      + "; ".join(f"{k}: {v}" for k, v in FALLBACKS.items()))
    ncu = p.add_argument_group("ncu")
    ncu.add_argument("--half-packing", choices=sorted(HALF_PACKING), default="pairs",
                     help="how half-precision CUDA-core instructions count: " +
                     "; ".join(f"{k}: {v}" for k, v in HALF_PACKING.items()) + " (default: pairs)")
    ncu.add_argument("--precision", choices=PRECISIONS, default="fp32",
                     help="precision of the profiled step: fp32 (TF32 off), tf32, bf16 or fp16 autocast (default fp32)")
    ncu.add_argument("--warmup", type=positive, default=3, metavar="N",
                     help="unprofiled steps before the profiled one (default 3; autotuning happens there)")
    ncu.add_argument("--ncu", default="ncu", metavar="PATH", help="the ncu executable (default: ncu on PATH)")
    ncu.add_argument("--csv-name", default="step.csv", metavar="FILE",
                     help="export file named in the printed command (default step.csv)")
    ncu.add_argument("--explicit-metrics", action="store_true",
                     help="print metric names (Hopper's, as documented) instead of regex: patterns")
    ncu.add_argument("--calibration-size", type=positive, default=4096, metavar="N",
                     help="--run: the calibration GEMM is N×N×N (default 4096)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="output format (default: table)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    add_verbosity(p)
    p.set_defaults(keras=None, **SOURCE_DEFAULTS)
    return p


# ---------------------------------------------------------------------------------------------------------------


def _driver(args, python: str = "python", gemm: tuple[int, int, int] | None = None,
            precision: str | None = None) -> list[str]:
    cmd = [python, "-m", "flopcount.measure.ncu_step", "--precision", precision or args.precision]
    if gemm:
        return cmd + ["--gemm", *map(str, gemm)]
    cmd += ["--torch", args.torch]
    for name, dims in args.input_shape:
        cmd += ["--input-shape", f"{name}={'x'.join(map(str, dims))}"]
    if args.batch:
        cmd += ["--batch", str(args.batch)]
    cmd += ["--mode", args.mode, "--warmup", str(args.warmup)]
    if args.optimizer:
        cmd += ["--optimizer", args.optimizer]
    return cmd


def _compare_args(args) -> list[str]:
    out = ["--torch", args.torch] if args.torch else [args.model]
    for name, dims in args.input_shape:
        out += ["--input-shape", f"{name}={'x'.join(map(str, dims))}"]
    if args.batch:
        out += ["--batch", str(args.batch)]
    out += ["--mode", args.mode]
    if args.optimizer:
        out += ["--optimizer", args.optimizer]
    return out


def print_command(args) -> str:
    from flopcount.measure.ncu.parse import ncu_command

    cmd = ncu_command(_driver(args), args.csv_name, args.explicit_metrics, args.ncu)
    then = ["flopcount", "crosscheck", "--ncu-csv", args.csv_name, *_compare_args(args)]
    return (shlex.join(cmd) + "\n"
            + f"# then, on any machine: {shlex.join(then)}\n")


def _analytic(args):
    from flopcount.measure.ncu.crosscheck import analytic_by_family

    report = count_source(args)
    return report, analytic_by_family(report)


def _torch_module_and_inputs(args):
    from flopcount.frontends.torch import forward_inputs, load_factory

    module = load_factory(args.torch)
    # by forward()'s parameter names, as the counting export binds them
    return module, forward_inputs(module, torch_inputs(args, args.batch))


def fallback(args, report, analytic):
    from flopcount.errors import FrontendError
    from flopcount.measure.ncu.crosscheck import compare, grouped_convolutions, measure_with_flop_counter, measure_with_profiler

    module, inputs = _torch_module_and_inputs(args)
    measure = measure_with_flop_counter if args.fallback == "torch" else measure_with_profiler
    try:
        measured = measure(module, inputs, args.mode)
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise FrontendError(f"--torch {args.torch}: running it under {FALLBACKS[args.fallback]} failed: {first}") \
            from None
    context = {"convention": args.convention, "grouped_convolutions": grouped_convolutions(report)}
    return compare(analytic, measured, "torch" if args.fallback == "torch" else "torch-profiler", context)


# ---------------------------------------------------------------------------------------------------------------
# --run


def _check_device(args) -> str:
    ncu = shutil.which(args.ncu)
    if ncu is None:
        raise DeviceError(
            f"{args.ncu}: Nsight Compute's command line (ncu) is not on PATH; install Nsight Compute (it comes with "
            "the CUDA toolkit, e.g. /usr/local/cuda/bin/ncu) and add it to PATH or pass --ncu PATH; "
            "without it, compare with --fallback torch"
        )
    try:
        torch = import_framework("torch")
    except ModuleNotFoundError:
        raise DeviceError("--run needs PyTorch with CUDA to run the step; install a CUDA build of torch, or compare "
                          "an export made elsewhere with --ncu-csv FILE") from None
    if not torch.cuda.is_available():
        raise DeviceError("no CUDA GPU visible to PyTorch (torch.cuda.is_available() is False); run on a machine with "
                          "an NVIDIA GPU and a CUDA build of torch, or compare on this one with --fallback torch")
    return ncu


def _last_line(text: str) -> str:
    """The last non-blank line of a tool's output (its error, as a rule)."""
    return next((line for line in reversed(text.strip().splitlines()) if line.strip()), "no output")


def _read_export(args):
    """The export of ``--ncu-csv``: a CSV as it is, or a report file (``.ncu-rep``) turned into the raw-page CSV by
    ``ncu --import`` (ncu needed; no GPU)."""
    path = args.ncu_csv
    if not path.endswith(".ncu-rep"):
        return read_ncu_csv(path, args.half_packing)
    if not os.path.exists(path):
        raise MeasurementError(f"{path}: no such file")
    ncu = shutil.which(args.ncu)
    if ncu is None:
        raise DeviceError(
            f"{path}: a report file needs ncu to read it (ncu is not on PATH; no GPU is needed): run "
            f"ncu --import {shlex.quote(path)} --csv --page raw --print-units base > step.csv where ncu is, and pass "
            "--ncu-csv step.csv"
        )
    cmd = [ncu, "--import", path, "--csv", "--page", "raw", "--print-units", "base"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.SubprocessError) as e:
        raise MeasurementError(f"{ncu}: could not read {path} ({e})") from None
    if done.returncode != 0:
        raise MeasurementError(f"{shlex.join(cmd)} exited with status {done.returncode}: "
                               f"{_last_line(done.stdout + done.stderr)}")
    from flopcount.measure.ncu.parse import parse_ncu_csv

    return parse_ncu_csv(done.stdout, path, args.half_packing)


def _ncu_version(ncu: str) -> str | None:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"(\d{4}\.\d+(?:\.\d+)*)", out)
    return m.group(1) if m else None


def _profile(ncu: str, driver: list[str], csv_path: str, args) -> None:
    from flopcount.measure.ncu.parse import ncu_command

    cmd = ncu_command(driver, csv_path, args.explicit_metrics, ncu)
    log.info("running %s", shlex.join(cmd))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.SubprocessError) as e:
        raise MeasurementError(f"{ncu}: could not run the profile ({e})") from None
    text = done.stdout + done.stderr
    if os.path.exists(csv_path):
        with open(csv_path, encoding="utf-8", errors="replace") as f:
            text += f.read()
    if "ERR_NVGPUCTRPERM" in text:
        raise DeviceError(f"{ncu}: no permission to read the GPU performance counters (ERR_NVGPUCTRPERM); "
                          f"{PERMISSION_FIX}; or compare with --fallback torch")
    if done.returncode != 0 or not os.path.exists(csv_path):
        raise MeasurementError(f"{ncu} exited with status {done.returncode} profiling {shlex.join(driver)}: "
                               f"{_last_line(text)}")


def calibrate(ncu: str, precision: str, args, folder: str) -> dict:
    """Profile one N×N×N product in ``precision``; its counters must read 2·N³ FLOPs within 1%."""
    n = args.calibration_size
    path = os.path.join(folder, f"calibration-{precision}.csv")
    _profile(ncu, _driver(args, sys.executable, (n, n, n), precision), path, args)
    export = read_ncu_csv(path, args.half_packing)
    measured = sum(k.flops for k in export.kernels)
    expected = 2 * n * n * n
    factor = measured / expected
    result = {"m": n, "n": n, "k": n, "expected_flops": expected, "measured_flops": measured, "factor": factor,
              "within_1_percent": abs(factor - 1) <= 0.01,
              "kernels": [k.name for k in export.kernels]}
    if not result["within_1_percent"]:
        raise MeasurementError(
            f"calibration failed: a {n}×{n}×{n} {precision} GEMM read {measured:,} FLOPs on the counters where "
            f"2·M·N·K = {expected:,} (factor {factor:.4f}, beyond 1%); the counters of this ncu/GPU cannot be "
            "trusted as FLOPs with these metrics (try --explicit-metrics, or --half-packing single for half)"
        )
    return result


def run_ncu(args):
    from flopcount.measure.ncu.crosscheck import from_ncu

    ncu = _check_device(args)
    with tempfile.TemporaryDirectory(prefix="flopcount-crosscheck-") as folder:
        # every precision the step uses: the one asked for, and fp32 (optimizer, loss, and autocast's fp32 ops)
        calibration = {p: calibrate(ncu, p, args, folder) for p in dict.fromkeys((args.precision, "fp32"))}
        path = os.path.join(folder, "step.csv")
        _profile(ncu, _driver(args, sys.executable), path, args)
        export = read_ncu_csv(path, args.half_packing)
    if export.version is None:
        export = dataclasses.replace(export, version=_ncu_version(ncu))
    measured = from_ncu(export)
    source = dict(measured.source, file=None, calibration=calibration, precision=args.precision)
    return dataclasses.replace(measured, source=source)


# ---------------------------------------------------------------------------------------------------------------


def run(args) -> int:
    from flopcount.measure.ncu.crosscheck import compare, from_ncu, render_json, render_table

    if args.print_ncu_command:
        write_output(print_command(args), args.output)
        return 0
    if args.ncu_csv:
        measured = from_ncu(_read_export(args))
        report, analytic = _analytic(args)
        result = compare(analytic, measured, "ncu")
    elif args.run:
        try:
            measured = run_ncu(args)
        except DeviceError as e:
            if not args.fallback:
                raise
            log.warning("%s", e)
            log.warning("comparing with %s instead (--fallback %s)", FALLBACKS[args.fallback], args.fallback)
            report, analytic = _analytic(args)
            result = fallback(args, report, analytic)
        else:
            report, analytic = _analytic(args)
            result = compare(analytic, measured, "ncu")
    else:
        report, analytic = _analytic(args)
        result = fallback(args, report, analytic)
    text = render_json(result) if args.format == "json" else render_table(result)
    write_output(text, args.output)
    return 0
