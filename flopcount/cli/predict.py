"""``--predict`` of the counting command (its flags and the prediction of a count) and ``flopcount calibrate``
(measure this machine into a profile). The rules are :mod:`flopcount.measure.predict`'s; docs/predict.md."""

from __future__ import annotations

import argparse
import logging

from .arguments import add_verbosity, positive_int
from .console import write_output

__all__ = ["add_predict_arguments", "build_parser", "prediction_of", "run", "this_machine"]

log = logging.getLogger(__name__)


def add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    """The counting command's ``--predict``, ``--machine`` and ``--device`` (a group of their own)."""
    p = parser.add_argument_group("prediction", "step time, tokens/s and MFU per rank (docs/predict.md)")
    p.add_argument("--predict", action="store_true",
                   help="predict the step's time per rank from the count (with --parallel: its per-rank ledger; "
                   "without: one rank) and a machine profile (--machine or --device)")
    p.add_argument("--machine", metavar="PROFILE.json",
                   help="with --predict: the profile flopcount calibrate wrote for this machine")
    p.add_argument("--device", dest="predict_device", metavar="NAME",
                   help="with --predict: a device that cannot be calibrated here (H100, H200, A100, B200), its "
                   "profile from the datasheets (calibrated: false)")


def _check(args: argparse.Namespace):
    from flopcount.errors import UsageError

    machine, device = args.machine, args.predict_device
    if not args.predict:
        if machine or device:
            raise UsageError("--machine/--device: give them with --predict")
        return None
    if bool(machine) == bool(device):
        raise UsageError("--predict: give one of --machine PROFILE.json (flopcount calibrate -o PROFILE.json) or "
                         "--device NAME")
    if args.sweep or args.symbolic is not None:
        raise UsageError("--predict: predicts one count; leave out --symbolic and --sweep")
    if args.format == "csv":
        raise UsageError("--predict: the prediction is written in the table, markdown, JSON and HTML reports, not "
                         "in --format csv; give --format table, markdown, json or html")
    return machine, device


def prediction_of(report, args: argparse.Namespace):
    """The :class:`~flopcount.measure.predict.Prediction` of ``report`` when ``--predict`` is given, else None;
    one warning line when the profile was taken on another machine, torch or rank count."""
    given = _check(args)
    if given is None:
        return None
    from flopcount.measure.machine.calibration import device_profile, differences, load_profile
    from flopcount.measure.predict import predict_work, work_of

    machine, device = given
    work = work_of(report)
    ranks = len(work.ranks) if report.parallel is None else len(report.parallel.ranks)
    profile = load_profile(machine) if machine else device_profile(device, ranks)
    diff = differences(profile, this_machine(), ranks) if machine else None
    if diff:
        log.warning("%s", diff)
    return predict_work(work, profile)


def this_machine() -> dict:
    """What a calibrated profile is compared with (:func:`flopcount.measure.machine.calibration.this_machine`)."""
    from flopcount.measure.machine.calibration import this_machine as here

    return here()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="flopcount calibrate",
        description="Measure this machine once into a profile for --predict: GEMM FLOP/s by size, elementwise and "
        "reduction bytes/s by size, the per-operator overhead, and (with --ranks N > 1) each collective over N gloo "
        "processes on this host, fitted as latency + bytes/bandwidth per size range. About a minute.")
    p.add_argument("--ranks", type=positive_int, default=1, metavar="N",
                   help="processes that measure together, as many as the runs to predict (default 1)")
    p.add_argument("--threads", type=positive_int, metavar="T",
                   help="torch threads of each process (default: the cores shared out among the ranks, at least 1); "
                   "the runs to predict should use as many")
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats: seconds (tests, a first look)")
    p.add_argument("-o", "--output", metavar="PROFILE.json", help="write the profile to FILE instead of stdout")
    add_verbosity(p)
    return p


def run(args: argparse.Namespace) -> int:
    import json

    from flopcount.measure.machine.calibrate import DEFAULT_SIZES, QUICK_SIZES, calibrate

    profile = calibrate(args.ranks, QUICK_SIZES if args.quick else DEFAULT_SIZES, threads=args.threads)
    from flopcount.measure.predict import BUSY_LOAD

    if profile.load_per_core is not None and profile.load_per_core > BUSY_LOAD:
        log.warning("the machine was busy while it was calibrated (load %.2f per core): the profile's rates are what "
                    "the work got then, not what the machine sustains; calibrate again when it is quiet",
                    profile.load_per_core)
    write_output(json.dumps(profile.as_dict(), indent=1) + "\n", args.output, "machine profile")
    return 0
