"""A plan's ledgers on the HTML page (:mod:`flopcount.output.html`): the plan's summary, its tables per rank, and
three pictures drawn as inline SVG (nothing fetched, no script):

* **FLOPs per rank**: a bar per set of ranks with the same work (stage and FLOPs), model, redundant and recomputed
  FLOPs a step stacked;
* **memory per rank**: a bar per class of ranks that hold the same bytes (:func:`flopcount.memory.ranks.plan_summary`),
  parameters, gradients, optimizer states and the activations of every microbatch in flight stacked, the peak as a
  tick, and the device's memory as a line when one is given;
* **the pipeline schedule**: each pipeline rank's forwards and backwards as the simulation of the FLOPs ledger ran
  them (:attr:`flopcount.parallel.ranks.ParallelLedger.schedule`), one rectangle per action.

Every element a reader counts carries a class (``flops-bar``, ``memory-bar``, ``action``) so that a test can count
them against the ledger.
"""

from __future__ import annotations

from html import escape
from typing import Any

__all__ = ["plan_sections"]

_LABEL, _WIDTH, _ROW = 190, 640, 22
_OPEN_ROWS = 16  # a longer table is folded (a <details> element: no script), its picture above it
_COLOURS = {"model": "#4f7cac", "redundant": "#c9a13b", "recompute": "#a35d9c", "params": "#4f7cac",
            "grads": "#d08c4f", "optimizer": "#7a9e5a", "activations": "#a35d9c", "F": "#4f7cac", "B": "#d08c4f"}


def _span(values) -> str:
    from .ranks import rank_span

    return rank_span(tuple(values))


def _legend(keys: list[tuple[str, str]]) -> str:
    return " ".join(f'<span style="display:inline-block;width:10px;height:10px;background:{_COLOURS[k]}"></span> '
                    f"{escape(label)}" for k, label in keys)


def _svg(title: str, height: int, body: list[str]) -> str:
    return (f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{_LABEL + _WIDTH + 110}" height="{height}" '
            f'aria-label="{escape(title)}"><title>{escape(title)}</title>{"".join(body)}</svg>')


def _flops_groups(parallel: Any) -> list[list[Any]]:
    """The ledger's ranks with the same bar (stage and model, redundant and recomputed FLOPs), by first rank."""
    groups: dict[tuple, list[Any]] = {}
    for r in parallel.ranks:
        groups.setdefault((r.stage, r.model_flops, r.redundant_flops, r.recompute_flops), []).append(r)
    return sorted(groups.values(), key=lambda rs: rs[0].rank)


def _ranks_label(stage: int, ranks: list[int]) -> str:
    """A bar's label, short enough for the chart's margin: the stage and its ranks, the first few of many."""
    listed = _span(ranks)
    if len(listed) > 10:
        listed = f"{len(ranks)}: {ranks[0]}, {ranks[1]}, …"
    return f"stage {stage} · ranks {listed}"


def flops_chart(parallel: Any) -> str:
    """FLOPs a step per set of ranks with the same work: model, redundant and recomputed, stacked."""
    from .render import si

    groups = _flops_groups(parallel)
    biggest = max((r.hardware_flops for r in parallel.ranks), default=0) or 1
    body = []
    for i, rs in enumerate(groups):
        r, y = rs[0], 4 + i * _ROW
        label = _ranks_label(r.stage, [x.rank for x in rs])
        x = _LABEL
        rects = []
        for key, value in (("model", r.model_flops), ("redundant", r.redundant_flops),
                           ("recompute", r.recompute_flops)):
            w = _WIDTH * value / biggest
            rects.append(f'<rect class="{key}" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="15" '
                         f'fill="{_COLOURS[key]}"><title>{key} {value:,} FLOPs</title></rect>')
            x += w
        body.append(f'<g class="flops-bar" data-ranks="{",".join(str(x.rank) for x in rs)}">'
                    f'<text x="{_LABEL - 6}" y="{y + 15}" text-anchor="end">{escape(label)}</text>'
                    + "".join(rects) + f'<text x="{x + 6:.1f}" y="{y + 15}">{si(r.hardware_flops, "FLOPs")}</text></g>')
    legend = _legend([("model", "model"), ("redundant", "redundant"), ("recompute", "recomputed")])
    return (f'<figure id="flops-chart"><figcaption class="note">Hardware FLOPs a step per rank: {legend}'
            f'</figcaption>{_svg("FLOPs per rank", _ROW * len(groups) + 8, body)}</figure>')


def memory_chart(summary: Any) -> str:
    """Bytes per class of ranks: parameters, gradients, optimizer states and activations stacked, the peak a
    tick, the device's memory a line."""
    from ..memory.sizes import size_text, unit_of

    classes, device = summary.classes, summary.device_memory_bytes
    stacks = [c.params_bytes + c.grads_bytes + c.optimizer_bytes + c.activations_bytes for c in classes]
    biggest = max([*stacks, *(c.held_bytes for c in classes), device or 0]) or 1
    unit = unit_of(max(c.held_bytes for c in classes))
    top = 18
    body = []
    for i, c in enumerate(classes):
        y = top + i * _ROW
        x = _LABEL
        rects = []
        for key, value in (("params", c.params_bytes), ("grads", c.grads_bytes), ("optimizer", c.optimizer_bytes),
                           ("activations", c.activations_bytes)):
            w = _WIDTH * value / biggest
            rects.append(f'<rect class="{key}" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="15" '
                         f'fill="{_COLOURS[key]}"><title>{key} {value:,} B</title></rect>')
            x += w
        peak = _LABEL + _WIDTH * c.held_bytes / biggest
        body.append(f'<g class="memory-bar" data-ranks="{",".join(map(str, c.ranks))}">'
                    f'<text x="{_LABEL - 6}" y="{y + 15}" text-anchor="end">stage {c.stage} · TP {_span(c.tp)} '
                    f'({len(c.ranks)})</text>' + "".join(rects)
                    + f'<line class="peak" x1="{peak:.1f}" x2="{peak:.1f}" y1="{y}" y2="{y + 21}" stroke="#1d232a" '
                    f'stroke-width="2"><title>peak {c.held_bytes:,} B</title></line>'
                    f'<text x="{max(x, peak) + 6:.1f}" y="{y + 15}">{size_text(c.held_bytes, unit)}</text></g>')
    if device is not None:
        x = _LABEL + _WIDTH * device / biggest
        body.append(f'<line class="device-memory" x1="{x:.1f}" x2="{x:.1f}" y1="12" y2="{top + _ROW * len(classes)}" '
                    f'stroke="#c0392b" stroke-dasharray="4 3" stroke-width="2"/>'
                    f'<text x="{x:.1f}" y="10" text-anchor="middle" fill="#c0392b">device {size_text(device)}</text>')
    legend = _legend([("params", "parameters"), ("grads", "gradients"), ("optimizer", "optimizer states"),
                      ("activations", "activations (all microbatches in flight)")])
    line = "; the peak a black tick, the device's memory a dashed red line" if device is not None else \
        "; the peak a black tick"
    return (f'<figure id="memory-chart"><figcaption class="note">Bytes per class of ranks holding the same bytes: '
            f'{legend}{line}</figcaption>{_svg("Memory per rank", top + _ROW * len(classes) + 8, body)}</figure>')


def schedule_chart(parallel: Any) -> str:
    """The pipeline's schedule: a row per pipeline rank, a rectangle per action as simulated."""
    sched = parallel.schedule
    span = sched.makespan or 1
    pp = len(sched.busy)
    body = []
    for p in range(pp):
        y = 4 + p * _ROW
        body.append(f'<text x="{_LABEL - 6}" y="{y + 15}" text-anchor="end">pipeline rank {p}</text>')
    for a in sched.actions:
        x, w = _LABEL + _WIDTH * a.start / span, _WIDTH * (a.end - a.start) / span
        y = 4 + a.rank * _ROW
        fill = _COLOURS[a.kind]
        chunk = f", chunk {a.chunk // pp}" if a.chunk >= pp or parallel.plan.schedule == "interleaved" else ""
        text = f'<text x="{x + w / 2:.1f}" y="{y + 15}" text-anchor="middle" fill="#fff">{a.microbatch}</text>' \
            if w >= 14 else ""
        opacity = 0.65 if a.chunk >= pp else 1
        body.append(f'<g class="action" data-kind="{a.kind}" data-rank="{a.rank}"><rect x="{x:.1f}" y="{y + 2}" '
                    f'width="{max(w - 0.5, 0.5):.1f}" height="17" fill="{fill}" opacity="{opacity}">'
                    f'<title>pipeline rank {a.rank}: {"forward" if a.kind == "F" else "backward"} of microbatch '
                    f'{a.microbatch}{chunk}, {a.start:,.0f} to {a.end:,.0f}</title></rect>{text}</g>')
    legend = _legend([("F", "forward"), ("B", "backward (with its recompute)")]) + (
        "; lighter: the rank's later chunks of layers" if any(a.chunk >= pp for a in sched.actions) else "")
    return (f'<figure id="schedule-chart"><figcaption class="note">The pipeline schedule as simulated '
            f'({escape(parallel.plan.schedule)}, '
            f'{parallel.plan.microbatches} microbatches; numbers: the microbatch; bubble '
            f'{100 * parallel.bubble_fraction:.1f}%): {legend}</figcaption>'
            f'{_svg("Pipeline schedule", _ROW * pp + 8, body)}</figure>')


def _table(table_id: str, headers, rows, wrapped: int | None = None) -> str:
    """A table whose first column (and column ``wrapped``, a long list) is text, left-aligned and wrapped."""
    text = {0, wrapped}
    head = "".join(f'<th class="name">{escape(h)}</th>' if i in text else f"<th>{escape(h)}</th>"
                   for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class="name">{escape(str(v))}</td>' if i in text else
                                    f"<td>{escape(str(v))}</td>" for i, v in enumerate(row)) + "</tr>" for row in rows)
    table = f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    if len(rows) <= _OPEN_ROWS:
        return table
    return f"<details><summary>{len(rows)} rows</summary>{table}</details>"


def _summary(s: Any) -> str:
    from ..memory.sizes import size_text

    items = []
    if s.plan:
        items.append(("Plan", f"{s.plan} ({s.world} ranks)"))
    if s.verdict is not None:
        items.append(("Memory", s.verdict))
    if s.slowest_rank is not None:
        items.append(("Slowest rank", f"{s.slowest_rank}: {s.slowest_hardware_flops:,} hardware FLOPs a step"))
    if s.mfu_ceiling is not None:
        items.append(("MFU ceiling", f"{100 * s.mfu_ceiling:.1f}% (model FLOPs {s.model_flops:,} / ({s.world} ranks "
                      f"× a step of {s.step_flops:,.0f} FLOPs); redundant {100 * s.redundant_share:.1f}%, recompute "
                      f"{100 * s.recompute_share:.1f}% of the hardware FLOPs; bubble {100 * s.bubble_fraction:.1f}%)"))
    dl = '<dl class="totals" id="plan-summary">' + "".join(
        f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in items) + "</dl>"
    headers = ["stage", "TP ranks", "EP ranks", "ranks", "params", "grads", "optimizer", "activations", "peak",
               "free", "FLOPs a step"]
    rows = [[c.stage, _span(c.tp), _span(c.ep), ", ".join(map(str, c.ranks)), size_text(c.params_bytes),
             size_text(c.grads_bytes), size_text(c.optimizer_bytes), size_text(c.activations_bytes),
             size_text(c.held_bytes), "-" if c.headroom_bytes is None else size_text(c.headroom_bytes),
             "-" if c.hardware_flops is None else f"{c.hardware_flops:,}"] for c in s.classes]
    return dl + (_table("class-table", headers, rows, 3) if rows else "")


def plan_sections(report: Any) -> list[str]:
    """The HTML of the report's plan (summary, tables and pictures) and of its memory ledger; none without
    either."""
    from .ranks import summary

    s = summary(report)
    parallel, memory = report.parallel, report.memory
    out = []
    if s is not None:
        out += ["<h2>Plan summary</h2>", _summary(s)]
    if parallel is not None:
        from ..parallel.ranks import RANK_HEADERS, rank_rows

        rows = [[*row[:-1], row[-1].replace(", ", "; ")] for row in rank_rows(parallel)]
        out += ["<h2>FLOPs and communication per rank</h2>", flops_chart(parallel),
                '<p class="note">A row per set of ranks with the same figures (FLOPs a step; bytes handed to each '
                "collective a step, by kind and group).</p>",
                _table("rank-table", RANK_HEADERS, rows, len(RANK_HEADERS) - 1)]
        if parallel.schedule is not None and parallel.schedule.actions:
            out += ["<h2>Pipeline schedule</h2>", schedule_chart(parallel)]
    if memory is not None:
        from ..memory.ranks import RANK_HEADERS as MEMORY_HEADERS, plan_summary, rank_rows as memory_rows

        out += ["<h2>Memory per rank</h2>",
                memory_chart(s if s is not None and s.classes else plan_summary(None, memory))]
        rows, headers = memory_rows(memory), list(MEMORY_HEADERS)
        if rows and any(r.kv_cache_bytes is not None for r in memory.ranks):  # --generate: the cache at the end
            rows, headers = [[*row, f"{r.kv_cache_bytes:,}"] for row, r in zip(rows, memory.ranks)], \
                [*headers, "KV cache B"]
        if rows:
            out.append(_table("memory-table", headers, rows))
        else:  # one rank
            r = memory.ranks[0]
            out.append(_table("memory-table", ["rank", "params B", "grads B", "optimizer B", "activations B", "peak B",
                                               "peak phase"],
                              [[0, f"{r.params_bytes:,}", f"{r.grads_bytes:,}", f"{r.optimizer_bytes:,}",
                                f"{r.activations_bytes:,}", f"{r.peak_bytes:,}", r.peak_phase]]))
    return out
