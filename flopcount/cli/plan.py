"""``flopcount plan MODEL --devices N --device-memory SIZE (--machine PROFILE | --device NAME)``: every plan of a
decoder on N devices that fits their memory, ranked by predicted throughput (:mod:`flopcount.measure.plan_search`).
It takes the counting command's flags (the model source, shapes, ``--optimizer`` ...) and counts the model for
training, with its memory, once per microbatch size and recompute policy."""

from __future__ import annotations

import argparse
import json

from .arguments import positive_int
from .console import write_output

__all__ = ["build_parser", "reports", "run"]

_GiB = 2**30


def _counts(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 1,2,4,8") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 1,2,4,8")
    return sorted(set(values))


def build_parser() -> argparse.ArgumentParser:
    from .count import build_parser as count_parser

    parser = count_parser()
    parser.prog = "flopcount plan"
    parser.description = ("Every plan (tp, sp, pp with each schedule, cp, ep, dp, fsdp/zero1/zero2, microbatch size "
                          "and count, recompute) of a decoder on --devices N whose per-rank peak fits --device-memory, "
                          "ranked by the throughput --predict gives on a machine profile (docs/predict.md).")
    p = parser.add_argument_group("plan")
    p.add_argument("--devices", type=positive_int, required=True, metavar="N", help="ranks to fill")
    p.add_argument("--global-batch", type=positive_int, metavar="B",
                   help="sequences per optimizer step: each plan's microbatch size b and count M with b·M·dp = B "
                   "(default: each of --microbatch-counts)")
    p.add_argument("--microbatch-sizes", type=_counts, metavar="B1,B2,...",
                   help="sequences a microbatch, each counted once (default: the batch of --input-shape)")
    p.add_argument("--microbatch-counts", type=_counts, default=[1, 2, 4, 8], metavar="M1,M2,...",
                   help="microbatch counts to try without --global-batch (default 1,2,4,8; those below pp left out)")
    p.add_argument("--top", type=positive_int, default=10, metavar="K", help="plans shown (default 10)")
    p.add_argument("--jobs", type=positive_int, metavar="N",
                   help="worker processes the search runs on, forked where the platform forks (default: the CPUs "
                   "this process may use); the answer is the same whatever N")
    return parser


def _sized(args: argparse.Namespace, size: int) -> argparse.Namespace:
    """``args`` with every given input's first dim (the batch) set to ``size``."""
    out = argparse.Namespace(**vars(args))
    out.input_shape = [(name, (size, *shape[1:]) if shape else shape) for name, shape in args.input_shape]
    out.batch = size
    return out


def reports(args: argparse.Namespace):
    """``report_of(size, recompute)``: the training count of one microbatch of ``size`` sequences with its memory
    ledger under that recompute policy (the ledger's graph keeps what the policy recomputes), counted once, its
    node lists listed once."""
    import dataclasses
    from types import MappingProxyType

    from flopcount.measure.plan_search import check_report
    from flopcount.reporting.tiled import Tiled

    from .arguments import count_source

    counted: dict[tuple[int, str], object] = {}

    def report_of(size: int, recompute: str = "none"):
        if (size, recompute) not in counted:
            sized = _sized(args, size)
            sized.recompute = recompute
            report = count_source(sized)
            check_report(report)
            modules = dataclasses.replace(report.modules, nodes=tuple(report.modules.nodes),
                                          params=MappingProxyType(dict(report.modules.params)))
            # a repeated stack's nodes made once and kept a Tiled: its copies' tensors carry their original's names
            nodes = report.nodes.listed("plan") if isinstance(report.nodes, Tiled) else tuple(report.nodes)
            # the policies' counts differ in their memory ledgers alone: the same node and scope lists (compared,
            # then shared) let every ledger's memo of a list serve each policy's plans
            same = next((r for (z, _), r in counted.items() if z == size and r.nodes == nodes
                         and r.modules == modules), None)
            memory = report.memory
            if same is not None:
                nodes, modules = same.nodes, same.modules
                memory = _shared_graph(memory, same.memory)
            counted[(size, recompute)] = dataclasses.replace(report, nodes=nodes, modules=modules, memory=memory)
        return counted[(size, recompute)]

    return report_of


def _shared_graph(memory, other):
    """``memory`` whose graph holds ``other``'s node list, tensors, saved records and gradients' flags where they
    are equal (the recompute policies' counts differ in their recompute units): the per-rank walks' memos of what
    reads them alone then serve every policy's plans (:func:`flopcount.memory.rank_memo.memo_of`)."""
    import dataclasses

    g, h = (None, None) if memory is None or other is None else (memory.graph, other.graph)
    fields = ("nodes", "tensors", "saved", "grads")
    if g is None or h is None or any(getattr(g, f) != getattr(h, f) for f in fields):
        return memory
    return dataclasses.replace(memory, graph=dataclasses.replace(g, **{f: getattr(h, f) for f in fields}))


def run(args: argparse.Namespace) -> int:
    from flopcount.errors import UsageError
    from flopcount.measure.machine.calibration import device_profile, load_profile
    from flopcount.measure.plan_search import search
    from flopcount.measure.plan_space import SpaceSettings, check_space
    from flopcount.parallel.layout import layout_of
    from flopcount.parallel.plan import ParallelPlan

    from .arguments import check_model_source

    check_model_source(build_parser(), args)
    if bool(args.machine) == bool(args.predict_device):
        raise UsageError("plan: give one of --machine PROFILE.json (flopcount calibrate -o PROFILE.json) or "
                         "--device NAME")
    if args.parallel or args.microbatches or args.schedule or args.recompute is not None:
        raise UsageError("plan: searches the plans itself (degrees, schedules, microbatches, recompute); leave out "
                         "--parallel, --microbatches, --schedule and --recompute")
    if args.device_memory is None:
        raise UsageError("plan: give --device-memory SIZE (80GiB) or a device (H100) to fit the plans to")
    args.mode, args.memory = "train", True
    given = {name: shape[0] for name, shape in args.input_shape if shape}
    sizes = tuple(args.microbatch_sizes or sorted(set(given.values())) or [args.batch or 1])
    check_space(sizes, args.global_batch)
    report_of = reports(args)
    first = report_of(sizes[0])
    dims = layout_of(first, ParallelPlan()).dims
    profile = load_profile(args.machine) if args.machine else device_profile(args.predict_device, args.devices)
    if args.machine:
        from flopcount.measure.machine.calibration import differences

        from .predict import log, this_machine

        diff = differences(profile, this_machine(), args.devices)
        if diff:
            log.warning("%s", diff)
    space = SpaceSettings(args.devices, dims.layers, first.moe is not None and first.moe.experts > 1, sizes,
                          tuple(args.microbatch_counts), args.global_batch)
    found = search(report_of, profile, space, args.device_memory, jobs=args.jobs or _usable_cpus())
    if not found.plans:
        raise UsageError(_none_fits(args, found))
    write_output(_json(args, found) if args.format == "json" else _table(args, found), args.output)
    return 0


def _usable_cpus() -> int:
    """The CPUs this process may run on."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on every platform
        return os.cpu_count() or 1


def _none_fits(args: argparse.Namespace, found) -> str:
    """The one line of a search that found no plan: the least memory that fits and with which plan, or why no plan
    fills the devices."""
    if found.smallest is not None:
        s = found.smallest
        return (f"plan: no plan of {args.devices} devices fits {args.device_memory / _GiB:.4g} GiB; the smallest "
                f"memory that fits is {s.peak_bytes / _GiB:.4g} GiB ({s.peak_bytes:,} bytes), with {s.command} "
                f"(microbatches of {s.microbatch_size} sequences)")
    why = "; ".join(f"{n} x {w}" for w, n in found.dropped.most_common(3))
    return f"plan: no plan of this model fills {args.devices} devices: {why}"


def _json(args: argparse.Namespace, found) -> str:
    return json.dumps({"devices": args.devices, "device_memory": args.device_memory,
                       "global_batch": args.global_batch, "tried": found.tried,
                       "plans": [c.as_dict() for c in found.plans], "dropped": dict(found.dropped),
                       "smallest_over_memory": None if found.smallest is None else found.smallest.as_dict()},
                      indent=1) + "\n"


def _table(args: argparse.Namespace, found) -> str:
    from tabulate import tabulate

    from flopcount.memory.sizes import size_text

    rows = [[c.parallel, c.schedule, f"{c.microbatch_size} x {c.microbatches}", c.recompute,
             f"{c.step_seconds:.4g}", "-" if c.tokens_per_second is None else f"{c.tokens_per_second:,.0f}",
             f"{c.mfu:.3f}", size_text(c.peak_bytes), size_text(c.headroom_bytes)]
            for c in found.plans[:args.top]]
    text = tabulate(rows, ["plan", "schedule", "microbatches (size x count)", "recompute", "step s", "tokens/s",
                           "MFU", "peak", "headroom"], disable_numparse=True,
                    colalign=("left",) * 4 + ("right",) * 5)
    dropped = "; ".join(f"{n} x {why}" for why, n in found.dropped.most_common())
    return (text + f"\n{len(found.plans)} of {found.tried} plans fit {args.device_memory / _GiB:.4g} GiB a device"
            + (f"; dropped: {dropped}" if dropped else "") + "\n")
