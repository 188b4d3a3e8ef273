"""A plan's ledgers in the text formats: its summary first (:func:`summary_lines`, from
:func:`flopcount.memory.summary.plan_summary`), the FLOPs and the communication of each class of ranks
(:func:`rank_tables`, in units a reader compares at a glance: every figure exact in JSON and CSV), and one row per
rank for CSV (:func:`rank_csv`), FLOPs, communication and memory side by side.

Rendering returns strings; only the CLI prints. No line of the summary is wider than :data:`WIDTH` characters.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WIDTH", "rank_csv_rows", "rank_span", "rank_tables", "summary", "summary_lines"]

#: The widest line of the summary.
WIDTH = 120


def summary(report: Any):
    """The report's :class:`~flopcount.memory.summary.PlanSummary`, or None where it has neither a plan nor a
    device memory to compare its peak with."""
    memory = report.memory
    if report.parallel is None and (memory is None or memory.device_memory is None):
        return None  # and the memory ledger's modules stay unloaded
    from ..memory.summary import plan_summary

    return plan_summary(report.parallel, memory)


def _flops(n: float) -> str:
    from .render import si

    return si(n, "FLOPs")


def summary_lines(s: Any, markdown: bool = False) -> list[str]:
    """The summary ``s`` (a :class:`~flopcount.memory.summary.PlanSummary`) as lines: the plan, the memory's
    verdict, the slowest rank, the MFU ceiling, then the table of rank classes (a GitHub table with ``markdown``)."""
    from tabulate import tabulate

    from ..memory.sizes import unit_of

    head = f"Plan {s.plan} ({s.world} rank{'s' if s.world != 1 else ''})" if s.plan else "One device"
    lines = [head + ":"]
    if s.verdict is not None:
        lines.append(f"  Memory: {s.verdict}")
    elif s.slowest_rank is not None:
        lines.append("  Memory: not counted (add --memory, and --device-memory to compare with a device)")
    per = "in the generation" if s.mode == "generate" else "a step"
    if s.slowest_rank is not None:
        lines.append(f"  Slowest rank: {s.slowest_rank}, {s.slowest_hardware_flops:,} hardware FLOPs {per} "
                     f"({_flops(s.slowest_hardware_flops)})")
    if s.mfu_ceiling is not None:
        lines += [f"  MFU ceiling: {100 * s.mfu_ceiling:.1f}% = model FLOPs {_flops(s.model_flops)} / ({s.world} ranks "
                  f"x {'the generation' if s.mode == 'generate' else 'a step'} of {_flops(s.step_flops)})",
                  f"{_MORE}at equal throughput; of the hardware FLOPs, redundant {100 * s.redundant_share:.1f}%, "
                  f"recompute {100 * s.recompute_share:.1f}%; pipeline bubble {100 * s.bubble_fraction:.1f}%"]
    if s.classes:
        name, factor = unit_of(max(c.held_bytes for c in s.classes))

        def b(n: int | None) -> str:
            return "-" if n is None else f"{n / factor:,.1f}" if factor > 1 else f"{n:,}"

        device = s.device_memory_bytes is not None
        flops = any(c.hardware_flops is not None for c in s.classes)
        ep = any(c.ep != (0,) for c in s.classes)
        headers = ["stage", "TP", *(["EP"] if ep else []), "ranks", "params", "grads", "optimizer", "activations",
                   "peak", *(["free"] if device else []), *([f"FLOPs {per}"] if flops else [])]
        rows = [[str(c.stage), rank_span(c.tp), *([rank_span(c.ep)] if ep else []), str(len(c.ranks)),
                 b(c.params_bytes),
                 b(c.grads_bytes), b(c.optimizer_bytes), b(c.activations_bytes), b(c.held_bytes),
                 *([b(c.headroom_bytes)] if device else []),
                 *([_flops(c.hardware_flops) if c.hardware_flops is not None else "-"] if flops else [])]
                for c in s.classes]
        lines.append(f"  Ranks holding the same bytes, in {name} (activations: all microbatches in flight; peak: "
                     "the most held at once):")
        table = tabulate(rows, headers, tablefmt="github" if markdown else "simple", disable_numparse=True,
                         colalign=("left", "left", *(["left"] if ep else []), *("right",) * (len(headers) - 2 - ep)))
        table_lines = table.splitlines()
    else:
        table_lines = []
    if markdown:  # an item per line, a continued line joined to its item, the table after a blank line
        items: list[str] = []
        for line in lines:
            if line.startswith(_MORE):
                items[-1] += " " + line.strip()
            else:
                items.append(f"- {line.strip()}" if line.startswith("  ") else line)
        return items + ([""] + table_lines if table_lines else [])
    return lines + ["  " + x for x in table_lines]


def rank_tables(led: Any, markdown: bool = False) -> list[str]:
    """Two tables of the ledger ``led`` per optimizer step, a row per class of ranks with the same figures
    (:func:`flopcount.parallel.ranks.rank_classes`): their FLOPs (SI prefixes), and the bytes each hands to each
    collective (one column per collective and group, in one binary unit): no line wider than :data:`WIDTH` for a
    plan of up to 10,000 ranks a class."""
    from tabulate import tabulate

    from ..memory.sizes import unit_of
    from ..parallel.ranks import dp_span, rank_classes
    from .render import si

    classes = rank_classes(led)
    fmt = "github" if markdown else "simple"

    def who(rs) -> list[str]:
        return [rank_span(tuple(x.rank for x in rs)), str(rs[0].coords["tp"]), str(rs[0].stage), dp_span(rs)]

    def opt(r) -> str:
        return "-" if r.optimizer_flops is None else si(r.optimizer_flops) + (
            f" ({si(r.optimizer_redundant_flops)} again)" if r.optimizer_redundant_flops else "")

    flops = tabulate([[*who(rs), si(rs[0].model_flops), si(rs[0].hardware_flops), si(rs[0].redundant_flops),
                       si(rs[0].recompute_flops), opt(rs[0])] for rs in classes],
                     ["ranks", "TP", "stage", "DP", "model", "hardware", "redundant", "recompute", "optimizer"],
                     tablefmt=fmt, disable_numparse=True, colalign=("left",) * 4 + ("right",) * 5)
    per = "in the generation" if led.generation is not None else "a step"
    out = [f"FLOPs per rank {per} (ranks with the same figures together; exact figures in JSON and CSV):", flops]
    columns = list(dict.fromkeys((c.kind, c.group) for rs in classes for c in rs[0].communication))
    if columns:
        name, factor = unit_of(max(c.bytes for rs in classes for c in rs[0].communication))
        rows = []
        for rs in classes:
            got = {(c.kind, c.group): c.bytes for c in rs[0].communication}
            rows.append([*who(rs), *("-" if k not in got else f"{got[k] / factor:,.1f}" if factor > 1 else
                                     f"{got[k]:,}" for k in columns)])
        out += [f"Bytes each rank hands to each collective {per}, in {name}:",
                tabulate(rows, ["ranks", "TP", "stage", "DP", *(f"{k}({g})" for k, g in columns)], tablefmt=fmt,
                         disable_numparse=True, colalign=("left",) * 4 + ("right",) * len(columns))]
    return out


_MORE = "    "  # a line that continues the one before it


def rank_span(values: tuple[int, ...]) -> str:
    """``0-7`` for a run of consecutive numbers, else the numbers listed.

    >>> rank_span((0, 1, 2, 3)), rank_span((0, 2)), rank_span((5,))
    ('0-3', '0,2', '5')
    """
    if len(values) > 2 and list(values) == list(range(values[0], values[-1] + 1)):
        return f"{values[0]}-{values[-1]}"
    return ",".join(map(str, values))


#: The memory columns of :func:`rank_csv_rows`, fields of :class:`~flopcount.memory.ranks.PlanRankMemory`.
_MEMORY = ("params_bytes", "buffers_bytes", "grads_bytes", "optimizer_bytes", "optimizer_temp_bytes",
           "activations_bytes", "microbatches_in_flight", "allgather_bytes", "gradient_bucket_bytes", "cp_kv_bytes",
           "alltoall_bytes", "peak_bytes", "peak_phase", "kv_cache_bytes")
_COORDS = ("tp", "pp", "cp", "ep", "dp")


def rank_csv_rows(report: Any) -> list[list[Any]]:
    """One row per rank of the report's plan (its header first): its coordinates, its FLOPs per step, the bytes it
    hands to each collective (a column per kind and group, 0 where it hands none) and the memory it holds with the
    device's headroom; without a plan, the one rank of the memory ledger. Empty without either ledger."""
    parallel, memory = report.parallel, report.memory
    if parallel is None and memory is None:
        return []
    by_rank = {}
    for r in memory.ranks if memory is not None else ():
        for x in getattr(r, "replicas", ()) or (0,):
            by_rank[x] = r
    comm = sorted({(c.kind, c.group) for r in parallel.ranks for c in r.communication}) if parallel else []
    header = ["rank", *_COORDS]
    if parallel is not None:
        header += ["model_flops", "hardware_flops", "redundant_flops", "recompute_flops", "optimizer_flops",
                   "optimizer_redundant_flops", *(f"{kind}_{group}_bytes" for kind, group in comm)]
    if memory is not None:
        header += [*_MEMORY, "headroom_bytes"]
    rows = [header]
    ranks = parallel.ranks if parallel is not None else [None]
    for f in ranks:
        rank = f.rank if f is not None else 0
        coords = f.coords if f is not None else getattr(by_rank.get(0), "coords", {})
        row = [rank, *(coords.get(k, 0) for k in _COORDS)]
        if f is not None:
            sent = {(c.kind, c.group): c.bytes for c in f.communication}
            row += [f.model_flops, f.hardware_flops, f.redundant_flops, f.recompute_flops,
                    "" if f.optimizer_flops is None else f.optimizer_flops,
                    "" if f.optimizer_redundant_flops is None else f.optimizer_redundant_flops,
                    *(sent.get(k, 0) for k in comm)]
        if memory is not None:
            m = by_rank.get(rank)
            row += [("" if m is None or getattr(m, k, None) is None else getattr(m, k)) for k in _MEMORY]
            headroom = memory.headroom(m) if m is not None else None
            row.append("" if headroom is None else headroom)
        rows.append(row)
    return rows
