"""``flopcount plan MODEL --devices N (--machine PROFILE | --device NAME)``: every plan of a decoder on N devices,
ranked by predicted throughput (:mod:`flopcount.measure.plan_search`). It takes the counting command's flags (the
model source, shapes, ``--optimizer`` ...) and counts the model once, for training."""

from __future__ import annotations

import argparse
import json

from .arguments import positive_int
from .console import write_output

__all__ = ["build_parser", "run"]


def _counts(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give microbatch counts as integers, e.g. 1,2,4,8") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: microbatch counts must be >= 1")
    return values


def build_parser() -> argparse.ArgumentParser:
    from .count import build_parser as count_parser

    parser = count_parser()
    parser.prog = "flopcount plan"
    parser.description = ("Every plan (tp, pp, dp, schedule, microbatches, recompute) of a decoder on --devices N "
                          "ranked by the throughput --predict gives on a machine profile (docs/predict.md).")
    p = parser.add_argument_group("plan")
    p.add_argument("--devices", type=positive_int, required=True, metavar="N", help="ranks to fill")
    p.add_argument("--microbatch-counts", type=_counts, default=[1, 2, 4, 8], metavar="M1,M2,...",
                   help="microbatch counts to try (default 1,2,4,8; those below pp are left out)")
    p.add_argument("--top", type=positive_int, default=10, metavar="K", help="plans shown (default 10)")
    return parser


def run(args: argparse.Namespace) -> int:
    from flopcount.errors import UsageError
    from flopcount.measure.machine.calibration import device_profile, load_profile
    from flopcount.measure.plan_search import search

    from .arguments import check_model_source, count_source

    check_model_source(build_parser(), args)
    if bool(args.machine) == bool(args.predict_device):
        raise UsageError("plan: give one of --machine PROFILE.json (flopcount calibrate -o PROFILE.json) or "
                         "--device NAME")
    if args.parallel:
        raise UsageError("plan: searches the plans itself; leave out --parallel")
    args.mode = "train"
    report = count_source(args)
    profile = load_profile(args.machine) if args.machine else device_profile(args.predict_device, args.devices)
    if args.machine:
        from flopcount.measure.machine.calibration import differences

        from .predict import log, this_machine

        diff = differences(profile, this_machine(), args.devices)
        if diff:
            log.warning("%s", diff)
    found, dropped = search(report, profile, args.devices, args.microbatch_counts)
    if not found:
        raise UsageError(f"plan: no plan of {args.devices} devices fits this model: "
                         + "; ".join(f"{n} x {why}" for why, n in dropped.most_common(3)))
    note = ("memory per rank not checked yet: a plan shown may not fit the devices' memory (flopcount MODEL "
            "--parallel PLAN --memory gives its peak per rank)")
    if args.format == "json":
        text = json.dumps({"devices": args.devices, "plans": [c.as_dict() for c in found],
                           "dropped": dict(dropped), "notes": [note]}, indent=1) + "\n"
    else:
        from tabulate import tabulate

        rows = [[c.parallel, c.microbatches, c.schedule, c.recompute, f"{c.step_seconds:.4g}",
                 "-" if c.tokens_per_second is None else f"{c.tokens_per_second:,.0f}", f"{c.mfu:.3f}"]
                for c in found[:args.top]]
        text = tabulate(rows, ["plan", "microbatches", "schedule", "recompute", "step s", "tokens/s", "MFU"],
                        disable_numparse=True) + "\n" + f"{len(found)} plans predicted" + (
            "; dropped: " + "; ".join(f"{n} x {why}" for why, n in dropped.most_common()) if dropped else "") + "\n" \
            + f"Note: {note}\n"
    write_output(text, args.output)
    return 0
