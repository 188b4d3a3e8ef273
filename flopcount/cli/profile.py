"""``flopcount profile``: time every node of an ONNX model with onnxruntime beside its counted FLOPs and bytes."""

from __future__ import annotations

import argparse
import dataclasses

from .arguments import Parser, add_model_source, add_options, add_verbosity, options_from_args, positive
from .console import write_output


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="flopcount profile",
        description="Run an ONNX model with onnxruntime's profiler and report, per node and per op type, the median "
        "time, share of time beside share of FLOPs, achieved FLOP/s, bytes read and written, arithmetic intensity "
        "and whether it is compute- or memory-bound against the machine's measured ceilings. Missing weights are "
        "synthesised from the initializers' dims and dtypes (external data files are never opened).",
    )
    add_model_source(p, "path of an .onnx model (or give --torch or --keras)")
    add_options(p, ["input_values", "batch"])
    p.add_argument("--provider", choices=("cpu", "cuda"), default="cpu",
                   help="onnxruntime execution provider (cuda needs onnxruntime-gpu)")
    p.add_argument("--optimize", choices=("none", "basic", "extended", "all"), default="none",
                   help="onnxruntime graph optimisations (default none: every executed node is a graph node; "
                   "otherwise fused nodes are attributed the graph nodes they run)")
    p.add_argument("--warmup", type=int, default=2, metavar="K", help="untimed runs first (default 2)")
    p.add_argument("--runs", type=positive, default=5, metavar="R", help="timed runs; medians over them (default 5)")
    p.add_argument("--threads", type=positive, metavar="N", help="onnxruntime intra-op threads (default: its own)")
    p.add_argument("--ceilings", metavar="FILE",
                   help="ceilings JSON from flopcount ceilings (default: this CPU's cached GEMM and copy ceilings)")
    p.add_argument("--per-node", action="store_true", help="also list every executed node (table and CSV)")
    p.add_argument("--format", choices=("table", "json", "csv", "html"), default="table",
                   help="output format (html: the count's page with the measured time of every module)")
    p.add_argument("--depth", type=positive, metavar="N", help="depth of the html page's module tree (default: as deep "
                   "as fits)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    add_verbosity(p)
    return p


def run(args: argparse.Namespace) -> int:
    from flopcount.measure.machine.ceilings import load_ceilings
    from flopcount.measure.profile import ProfileSettings, profile, render

    ceilings = load_ceilings(args.ceilings) if args.ceilings else None
    source, options = options_from_args(args)
    model, shapes = source.to_onnx(options.batch), dict(options.input_shapes or {})
    settings = ProfileSettings(input_shapes=shapes, batch=options.batch, input_values=dict(options.input_values or {}),
                               provider=args.provider, optimize=args.optimize, warmup=args.warmup, runs=args.runs,
                               threads=args.threads)
    p = profile(model, settings, ceilings=ceilings)
    if args.torch or args.keras:  # an in-memory export: name it by what was given
        p = dataclasses.replace(p, model=f"--torch {args.torch}" if args.torch else f"--keras {args.keras}")
    if args.format == "html":
        from flopcount.measure.profile.modules import profile_html

        write_output(profile_html(p, args.depth), args.output)
    else:
        write_output(render(p, args.format, args.per_node), args.output)
    return 0
