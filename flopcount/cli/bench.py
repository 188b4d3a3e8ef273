"""``flopcount bench NAME``: train a workload under :class:`flopcount.Meter`, ``--runs K`` times, and report the
HPC AI500 metrics of every run and their repeat-run statistics (JSON schema: :mod:`flopcount.measure.harness.result`)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from typing import Any

from flopcount.errors import EXIT_QUALITY_NOT_REACHED, UsageError

from flopcount.measure.harness.mllog import DIVISIONS, RULESET, STATUSES

from .arguments import Parser, add_options, add_verbosity, nonneg_int, positive_float, positive_int, size_hw
from .console import write_output

log = logging.getLogger(__name__)

WORKLOADS = ("digits", "image_classification", "extreme_weather")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="flopcount bench",
        description="Train a benchmark workload under flopcount's meter and report the HPC AI500 metrics: FLOPS = "
        "N x R x C, MFU, VFLOPS, time-to-quality, energy, repeat-run statistics.",
        epilog="Exit codes: 0 every run completed (and reached its target quality, if any), 10 a run did not reach "
        "its target quality, 2 usage, 8 cannot write -o or --mllog, 11 a device or package is missing, 12 a rank "
        "stopped answering (--timeout), 130 SIGINT and 143 SIGTERM (the report holds the runs so far, "
        "\"complete\": false).")
    p.add_argument("workload", choices=WORKLOADS, help="digits: a small CNN on scikit-learn's bundled digits, trained "
                   "to a target accuracy (real data, real quality); image_classification: ResNet-50 v1.5 on synthetic "
                   "ImageNet-shaped data, or on --data DIR; extreme_weather: the Faster R-CNN detector on synthetic "
                   "16-channel fields")
    p.add_argument("--data", metavar="DIR", help="image_classification: train on an ImageFolder (one subfolder per "
                   "class of JPEG/PNG images, or train/ and val/ of them; read with Pillow) to --target-quality "
                   "(default 0.763) top-1 accuracy on its evaluation split")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--runs", type=positive_int, default=1,
                   help="repeat the run K times (HPC AI500: at least 10 for image classification, 5 for weather)")
    p.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32",
                   help="fp32, or autocast to bf16/fp16 (default: fp32)")
    p.add_argument("--batch-size", type=positive_int, help="samples per step (per rank)")
    p.add_argument("--epochs", type=positive_int, help="digits: the most epochs to train before giving up")
    p.add_argument("--steps", type=positive_int, help="synthetic workloads: steps per run")
    p.add_argument("--target-quality", type=positive_float, help="digits: the target test accuracy (default 0.95)")
    p.add_argument("--image-size", type=size_hw, metavar="HxW", help="synthetic workloads: input height and width")
    p.add_argument("--lr", type=positive_float, help="learning rate")
    p.add_argument("--seed", type=nonneg_int, help="seed of the first run (run i uses seed + i)")
    p.add_argument("--warmup-steps", type=nonneg_int, help="steps excluded from timing at the start of each run")
    p.add_argument("--window-steps", type=positive_int, help="steps per timing window")
    p.add_argument("--peak-flops", type=positive_float, help="peak FLOP/s of one device for MFU (overrides the "
                   "device table, or the measured CPU GEMM ceiling)")
    p.add_argument("--machine", metavar="PROFILE.json", help="a machine profile (flopcount calibrate -o FILE): "
                   "print the step predicted for the run beside its measurement, with the relative error "
                   "(docs/predict.md)")
    p.add_argument("--channels-last", action="store_true", help="channels-last memory format")
    p.add_argument("--mllog", metavar="FILE", help="also write MLPerf-style :::MLLOG lines (one file per run: "
                   "FILE, or FILE with .runN before its suffix when --runs > 1)")
    g = p.add_argument_group("MLPerf log (--mllog)", f"the submission fields MLPerf's compliance checker requires "
                             f"(training ruleset {RULESET})")
    g.add_argument("--submission-org", default="flopcount", help="submitting organisation (default: flopcount)")
    g.add_argument("--submission-platform", help="the system's name (default: the device's name, e.g. the CPU model)")
    g.add_argument("--submission-division", choices=DIVISIONS, default="open", help="default: open (flopcount's "
                   "workloads are not MLPerf's closed reference implementations)")
    g.add_argument("--submission-status", choices=STATUSES, default="research", help="default: research")
    g.add_argument("--submission-benchmark", help="MLPerf benchmark name (default: resnet for image_classification, "
                   "else the workload's name, which MLPerf's checker does not know)")
    p.add_argument("--ensemble", type=positive_int, default=1, metavar="M",
                   help="digits under torchrun/srun: train M base models (HPC AI500 V3.0 bagging), each on its own "
                   "bootstrap sample and its own P = ranks / M ranks; the report scores their averaged prediction")
    add_options(p, ["recompute", "parallel", "microbatches", "schedule"], help={
        "parallel": "the run's parallel plan, tp=T,pp=P,cp=C,ep=E,dp=D[,sp][,fsdp|zero1|zero2] (degrees left out are "
        "1; their product is the world size): the report gives each rank's MFU and HFU from its own FLOPs, the "
        "slowest rank, and the Megatron, torchtitan and MaxText conventions (docs/parallel.md, MFU per rank); the "
        "workloads train data parallel: dp=RANKS",
        "recompute": "with --parallel: what the run's backward recomputes, for each rank's HFU: none (default), full "
        "(every numbered layer's whole forward), non-reentrant (up to each layer's last saved tensor), selective "
        "(the attention core), or operator types (OP,OP)",
        "microbatches": "with --parallel: microbatches per optimizer step (the workloads step one: 1)"})
    p.add_argument("--format", choices=("table", "json"), default="table",
                   help="stdout format (default: table); -o always writes JSON")
    p.add_argument("-o", "--output", metavar="FILE", help="write the JSON report to FILE")
    p.add_argument("--timeout", type=positive_float, default=600.0, metavar="SECONDS",
                   help="under torchrun/srun: how long a collective waits for the other ranks before every rank ends "
                   "with a line naming the rank that stopped answering (default 600)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (they are off when stderr is not "
                   "a terminal)")
    add_verbosity(p)
    return p


def workload_module(name: str, data: str | None = None):
    if name == "digits":
        from flopcount.workloads import digits

        return digits, digits.DEFAULTS
    if data is not None:
        from flopcount.workloads import imagefolder

        return imagefolder, imagefolder.DEFAULTS.replace(data=data)
    from flopcount.workloads import synthetic

    return synthetic, synthetic.IMAGE_CLASSIFICATION if name == "image_classification" else synthetic.EXTREME_WEATHER


def config_from_args(args: argparse.Namespace):
    if args.data is not None and args.workload != "image_classification":
        raise UsageError(f"--data applies to image_classification (an ImageFolder of images); {args.workload} has "
                         "its own data")
    if args.data is not None and args.steps:
        raise UsageError("--steps applies to synthetic data; with --data the run trains whole epochs (--epochs) "
                         "until --target-quality")
    module, defaults = workload_module(args.workload, args.data)
    if args.workload != "digits" and args.data is None and (args.epochs or args.target_quality):
        raise UsageError(f"--epochs and --target-quality apply to real data (digits, or --data DIR); "
                         f"{args.workload} trains --steps steps on synthetic data, whose quality is not measured")
    if args.workload == "digits" and (args.steps or args.image_size):
        raise UsageError("--steps and --image-size apply to the synthetic workloads; digits trains whole epochs "
                         "(--epochs) until --target-quality")
    plan = None
    if args.parallel is not None:
        from flopcount.parallel.plan import parse_parallel, parse_recompute

        if args.ensemble > 1:
            raise UsageError("--parallel: the ranks of --ensemble train separate base models, not one model under a "
                             "plan; give one or the other")
        if args.microbatches not in (None, 1):
            raise UsageError(f"--microbatches {args.microbatches}: the bench workloads step one batch per optimizer "
                             "step (no gradient accumulation); give --microbatches 1")
        plan = parse_parallel(args.parallel, 1, args.schedule or "1f1b").as_dict()
        parse_recompute(args.recompute)
    elif args.recompute is not None or args.microbatches is not None or args.schedule is not None:
        raise UsageError("--recompute, --microbatches and --schedule describe a parallel plan: give --parallel too")
    cfg = defaults.replace(device=args.device, parallel=plan, recompute=args.recompute, precision=args.precision, batch_size=args.batch_size,
                           max_epochs=args.epochs, steps=args.steps, target_quality=args.target_quality,
                           image_size=args.image_size, lr=args.lr, seed=args.seed, warmup_steps=args.warmup_steps,
                           window_steps=args.window_steps, peak_flops=args.peak_flops,
                           channels_last=args.channels_last or None, machine=args.machine)
    return module, cfg


def mllog_path(path: str, run: int, runs: int) -> str:
    if runs == 1:
        return path
    stem, ext = os.path.splitext(path)
    return f"{stem}.run{run}{ext}"


def submission_of(args: argparse.Namespace, cfg):
    """The MLPerf submission fields from the flags and their documented defaults."""
    from flopcount.measure.harness.mllog import Submission

    platform = args.submission_platform
    if platform is None:
        from flopcount.measure.machine.devices import cpu_name

        if cfg.device == "cpu":
            platform = cpu_name()
        else:
            import torch

            platform = (torch.cuda.get_device_name(torch.device(cfg.device)) if torch.cuda.is_available()
                        else cfg.device)
    benchmark = args.submission_benchmark or ("resnet" if cfg.workload == "image_classification" else cfg.workload)
    return Submission(args.submission_org, platform or "unknown", args.submission_division, args.submission_status,
                      benchmark)


def run(args: argparse.Namespace) -> int:
    module, cfg = config_from_args(args)
    torch = module.torch_or_error()
    # scale-out: under torchrun or srun, join the process group; each rank takes its node's GPU LOCAL_RANK
    from flopcount.measure.harness import distributed
    from flopcount.measure.harness import ensemble
    from flopcount.measure.harness.interrupts import on_signals

    with on_signals():  # SIGINT/SIGTERM: the run's MLPerf log gets run_stop aborted, -o the runs done so far
        ranks = distributed.init(cfg.device, timeout_s=args.timeout)
        try:
            parallel = ensemble.for_bench(cfg.workload, args.ensemble, ranks.world_size)
            if parallel is not None:
                cfg = cfg.replace(device=ranks.device)
            if cfg.parallel is None and args.ensemble == 1 and ranks.world_size > 1:
                # no --parallel under torchrun/srun: the ranks of the process group train one model data parallel
                from flopcount.parallel.plan import parse_parallel

                cfg = cfg.replace(parallel=parse_parallel(f"dp={ranks.world_size}", 1, "1f1b").as_dict())
            return _run(args, module, cfg, torch, parallel, ranks)
        except RuntimeError as e:  # a collective failed: a peer that hung or died is named, anything else is ours
            failure = distributed.peer_failure(e, ranks, args.timeout)
            if failure is None:
                raise
            raise failure from None
        finally:
            distributed.finish(ranks)


class _Runs:
    """The runs of one bench command as they happen: their results, the MLPerf logs that could not be written, and
    the signal that ended the command early."""

    def __init__(self) -> None:
        self.results: list = []
        self.log_errors: list = []
        self.interrupted = None  # {"signal", "run", "steps", "windows"} once a signal ended the command
        self.signal = None
        self.device = None


@dataclasses.dataclass(frozen=True)
class _Bench:
    """What every run of one bench command shares: its flags, the workload's module and configuration, the count
    of its training step, the data-parallel layout (None: one process) and the ranks, whether progress shows, and
    the MLPerf submission and sample fields of its logs (``--mllog``)."""

    args: argparse.Namespace
    module: Any
    cfg: Any
    report: Any
    parallel: Any
    ranks: Any
    show: bool
    mllog: tuple


def _one_run(bench: _Bench, i: int, runs: _Runs) -> None:
    """Train run ``i`` and record its result in ``runs``; a signal during it records the run so far, and the
    signal, in ``runs`` (the caller stops there)."""
    from flopcount.errors import Interrupted, OutputError
    from flopcount.measure.harness.ranks import is_writer
    from flopcount.workloads.common import Run

    args, cfg = bench.args, bench.cfg
    writer = None
    if args.mllog and is_writer():
        from flopcount.measure.harness.mllog import MLLogWriter

        submission, samples = bench.mllog
        writer = MLLogWriter(mllog_path(args.mllog, i, args.runs))
        writer.init(submission, {"global_batch_size": cfg.batch_size * bench.ranks.world_size, "seed": cfg.seed + i,
                                 "opt_name": cfg.optimizer, "opt_base_learning_rate": cfg.lr, **samples})
    try:
        try:
            meter = bench.module.train(cfg, bench.report, Run(i, (writer.on_event,) if writer else (), bench.show,
                                                             bench.parallel))
        except Interrupted as e:
            meter = e.meter
            runs.signal = e
            runs.interrupted = {"signal": e.signal, "run": i, "steps": meter.steps if meter else 0,
                                "windows": len(meter.timed_windows) if meter else 0}
            if meter is None:  # cut before its meter existed (building the model, reading the data)
                return
        if runs.device is None:
            runs.device = meter.device()
        runs.results.append(meter.result(device=runs.device))
    finally:
        if writer is not None:
            try:
                writer.close()
            except OutputError as e:
                runs.log_errors.append(e)


def _run(args: argparse.Namespace, module, cfg, torch, parallel, ranks) -> int:
    from flopcount.measure.harness.result import bench_report, dumps
    from flopcount.measure.harness.run_table import report_table
    from flopcount.measure.machine.system import describe_system

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    log.info("counting the %s model's training FLOPs", cfg.workload)
    report = module.count(cfg)
    from flopcount.measure.harness.ranks import is_writer

    show = not args.no_progress and not args.quiet and is_writer()
    submission = submission_of(args, cfg) if args.mllog else None
    samples = module.mllog_fields(cfg) if args.mllog else {}
    runs = _Runs()
    bench = _Bench(args, module, cfg, report, parallel, ranks, show, (submission, samples))
    for i in range(args.runs):
        _one_run(bench, i, runs)
        if runs.interrupted is not None:
            break
        result = runs.results[-1]
        if show and args.runs > 1:
            print(f"flopcount: run {i + 1}/{args.runs}: {result.samples_per_s['total'] or 0:.1f} samples/s, "
                  f"quality {result.quality}", file=sys.stderr)
    meters = runs.results
    config = cfg.as_dict()
    config["counting"] = {"convention": report.convention.name, "batch": report.batch,
                          "flops_per_sample": report.per_sample.flops,
                          "forward_flops_per_sample": report.forward.flops / report.batch,
                          "trainable_params": report.trainable_params,
                          "optimizer": report.optimizer[0] if report.optimizer else None,
                          "loss": "not counted (outside the model graph)"}
    config["runs"] = args.runs
    config["timeout_s"] = args.timeout
    if submission is not None:
        config["mllog"] = {"ruleset": f"training {RULESET}", "submission": submission.as_dict(), **samples}
    config["scale_out"] = {"launcher": ranks.launcher, "backend": ranks.backend, "ranks": ranks.world_size,
                           "models": args.ensemble, "ranks_per_model": ranks.world_size // args.ensemble,
                           "batch_size": "per rank"}
    doc = bench_report(meters, describe_system(runs.device), config, runs.interrupted)
    if is_writer():
        if args.output:
            write_output(dumps(doc), args.output)
        write_output(dumps(doc) if args.format == "json" and not args.output else report_table(doc), None)
    return _outcome(args, cfg, runs)


def _outcome(args, cfg, runs: _Runs) -> int:
    """The exit code once the reports are written: a signal's, an MLPerf log's error, or the quality's."""
    if runs.signal is not None:
        cut = runs.interrupted
        saved = f"; the runs so far are in {args.output} (\"complete\": false)" if args.output else ""
        print(f"flopcount: error: interrupted by {cut['signal']} during run {cut['run']} after {cut['steps']} steps"
              f"{saved}", file=sys.stderr)
        return runs.signal.exit_code
    if runs.log_errors:
        raise runs.log_errors[0]
    meters = runs.results
    if cfg.target_quality is not None and not all(r.time_to_quality_s is not None for r in meters):
        missed = [i for i, r in enumerate(meters) if r.time_to_quality_s is None]
        print(f"flopcount: run(s) {', '.join(map(str, missed))} did not reach the target quality "
              f"{cfg.target_quality:g} within {cfg.max_epochs} epochs (raise --epochs or lower --target-quality)",
              file=sys.stderr)
        return EXIT_QUALITY_NOT_REACHED
    return 0
