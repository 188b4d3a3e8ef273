"""``flopcount roofline``: the HPC-AI roofline of a harness run, or the per-operator roofline of a model."""

from __future__ import annotations

import argparse
import json

from flopcount.errors import UsageError

from .arguments import Parser, add_model_source, add_options, add_verbosity, given_model, options_from_args
from .console import write_output


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="flopcount roofline",
        description="HPC-AI roofline (HPC AI500 V2.0): flopcount roofline --ceilings c.json --run run.json places "
        "each run at its communication operation intensity (FLOPs / byte communicated) and FLOPS. Per-operator "
        "roofline: flopcount roofline model.onnx (or --profile p.json) places each node at its arithmetic "
        "intensity and, when profiled, its measured FLOP/s.",
    )
    add_model_source(p, "an .onnx model (or --torch/--keras): per-operator roofline from its count (not measured)")
    p.add_argument("--ceilings", metavar="FILE", help="ceilings JSON from flopcount ceilings (per-operator roofline "
                   "default: this CPU's cached GEMM and copy ceilings)")
    p.add_argument("--run", metavar="FILE", help="a flopcount bench report (or meter.to_json run): HPC-AI roofline")
    p.add_argument("--profile", metavar="FILE", help="a flopcount profile --format json report: per-operator "
                   "roofline at measured FLOP/s")
    add_options(p, ["batch"], help={"batch": "with a model: dim 0 of every input"})
    p.add_argument("--plot", metavar="FILE", help="draw the roofline to FILE (.png, .svg or .pdf; needs matplotlib)")
    p.add_argument("--format", choices=("table", "json"), default="table", help="text output format")
    p.add_argument("-o", "--output", metavar="FILE", help="write the text output to FILE instead of stdout")
    add_verbosity(p)
    return p


def check_runs(doc, path: str) -> None:
    """Every run of a report read back, range-checked as the meter checks its arguments (a MeasurementError)."""
    from flopcount.measure.harness.result import check_run_record

    runs = doc.get("runs") if isinstance(doc, dict) else None
    runs = runs if isinstance(runs, list) else [doc] if isinstance(doc, dict) else []
    for k, one in enumerate(runs):
        if isinstance(one, dict):
            check_run_record(one, f"{path}: run {k}")


def run(args: argparse.Namespace) -> int:
    from flopcount.measure.profile import roofline as rl
    from flopcount.measure.machine.ceilings import default_ceilings, load_ceilings

    sources = [s for s in (args.run and "--run", args.profile and "--profile", given_model(args) and "a model") if s]
    if len(sources) != 1:
        raise UsageError("give one of --run FILE (HPC-AI roofline), --profile FILE or a model path (per-operator "
                         f"roofline){'; got ' + ' and '.join(sources) if sources else ''}")
    if args.run:
        if not args.ceilings:
            raise UsageError("--run needs --ceilings FILE (write it with flopcount ceilings -o FILE, under torchrun "
                             "for the all-reduce bandwidth)")
        ceilings = load_ceilings(args.ceilings)
        doc = rl.read_json(args.run, "run report")
        check_runs(doc, args.run)
        runs = rl.run_points(doc, args.run)
        first = runs[0]
        roof = rl.hpcai_roofline(ceilings, first.ranks, first.nodes, first.threads)
        points = [rl.Point(r.label, r.coi, r.flops, rl.ceiling_for(roof, r.precision)) for r in runs]
    else:
        ceilings = load_ceilings(args.ceilings) if args.ceilings else default_ceilings()
        roof = rl.operator_roofline(ceilings)
        if args.profile:
            points = rl.profile_points(rl.read_json(args.profile, "profile"), args.profile)
        else:
            from flopcount.counting import count_options

            source, options = options_from_args(args)
            points = rl.report_points(count_options(source.to_onnx(options.batch), options))
    if args.plot:
        rl.plot_roofline(roof, points, args.plot)
    if args.format == "json":
        text = json.dumps(rl.to_dict(roof, points), indent=2) + "\n"
    else:
        text = rl.describe(roof, points)
        if not args.run:
            memory = sorted({p.label.rsplit(" (", 1)[-1].rstrip(")") for p in points
                             if roof.bound(p.intensity) == "memory"})
            text += "Memory-bound operator types: " + (", ".join(memory) or "none") + "\n"
        if args.plot:
            text += f"Plot: {args.plot}\n"
    write_output(text, args.output)
    return 0
