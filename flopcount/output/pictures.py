"""A plan's ledgers on the HTML page (:mod:`flopcount.output.html`): the plan's summary, its tables per rank, and
three pictures drawn as inline SVG (nothing fetched, no script):

* **FLOPs per rank**: a bar per set of ranks with the same work (stage and FLOPs), model, redundant and recomputed
  FLOPs a step stacked;
* **memory per rank**: a bar per class of ranks that hold the same bytes (:func:`flopcount.memory.summary.plan_summary`),
  parameters, gradients, optimizer states and the activations of every microbatch in flight stacked, the peak as a
  tick, and the device's memory as a line when one is given;
* **the pipeline schedule**: each pipeline rank's forwards and backwards as the simulation of the FLOPs ledger ran
  them (:attr:`flopcount.parallel.ranks.ParallelLedger.schedule`), one rectangle per action;

and, with a prediction (:class:`flopcount.measure.predict.Prediction`, read by its fields), two more:

* **each rank's predicted step**: a bar per set of ranks with the same figures, compute, each collective's exposed
  seconds, the bubble, the optimizer step and any wait for the slowest rank of the stage stacked on a time axis in
  seconds, the critical rank in bold with the interval's known ends (an end not known is not drawn; the caption
  says why);
* **the predicted pipeline schedule**: each action at its predicted start, split into compute, exposed collectives
  and the send to the next stage, the rest of each pipeline rank's row idle.

Every element a reader counts carries a class (``flops-bar``, ``memory-bar``, ``action``) so that a test can count
them against the ledger (``rank-time``, ``predicted-action`` against the prediction).
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


def _listed(ranks: list[int]) -> str:
    """Ranks, short enough for a chart's margin: the first few of many."""
    listed = _span(ranks)
    return f"{len(ranks)}: {ranks[0]}, {ranks[1]}, …" if len(listed) > 10 else listed


def _ranks_label(stage: int, ranks: list[int]) -> str:
    """A bar's label, short enough for the chart's margin: the stage and its ranks, the first few of many."""
    return f"stage {stage} · ranks {_listed(ranks)}"


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
        from ..memory.summary import RANK_HEADERS as MEMORY_HEADERS, rank_rows as memory_rows
        from ..memory.summary import plan_summary

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


# ---- the predicted step (flopcount.measure.predict.Prediction, read by its fields: the output room does not
# import the measuring half)

_TIME_COLOURS = {"compute": "#4f7cac", "bubble": "#d8dee4", "optimizer": "#7a9e5a", "wait": "#9aa4ae",
                 "collectives": "#c0392b", "send": "#16a085", "all_reduce": "#c0392b", "all_gather": "#e67e22",
                 "reduce_scatter": "#d35400", "all_to_all": "#8e44ad", "send_recv": "#16a085"}
_OTHER_COLLECTIVE = "#7f6a5a"
#: Of a rank's step, seconds left after its parts below this share are a rounding error's, not a wait.
_ROUNDING = 1e-9


def seconds_text(s: float) -> str:
    """Seconds with three significant digits in the unit that reads best.

    >>> seconds_text(0.01234), seconds_text(2.5), seconds_text(3e-7), seconds_text(0)
    ('12.3 ms', '2.5 s', '300 ns', '0 s')
    """
    if s == 0:
        return "0 s"
    for factor, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if abs(s) >= factor or unit == "ns":
            return f"{s / factor:.3g} {unit}"
    raise AssertionError("unreachable")


def _ticks(span: float) -> list[float]:
    """Round seconds from 0 to ``span``: a step of 1, 2 or 5 times a power of ten, four to ten ticks."""
    import math

    if span <= 0:
        return [0.0]
    base = 10 ** math.floor(math.log10(span / 5))
    step = next(k * base for k in (1, 2, 5, 10) if span / (k * base) <= 10)
    return [i * step for i in range(int(span / step + 1e-9) + 1)]


def _axis(y: int, span: float) -> str:
    """A time axis in seconds under the rows, from 0 to ``span`` over the chart's width."""
    parts = [f'<line x1="{_LABEL}" x2="{_LABEL + _WIDTH}" y1="{y}" y2="{y}" stroke="#57606a"/>']
    for t in _ticks(span):
        x = _LABEL + _WIDTH * t / span
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 4}" stroke="#57606a"/>'
                     f'<text x="{x:.1f}" y="{y + 16}" text-anchor="middle">{seconds_text(t) if t else "0"}</text>')
    return f'<g class="time-axis">{"".join(parts)}</g>'


def _time_legend(keys: list[tuple[str, str]]) -> str:
    return " ".join(f'<span style="display:inline-block;width:10px;height:10px;background:'
                    f'{_TIME_COLOURS.get(k, _OTHER_COLLECTIVE)}"></span> {escape(label)}' for k, label in keys)


def _rank_parts(row: Any) -> list[tuple[str, str, float]]:
    """A rank's step in parts (class, label, seconds): compute, each collective's exposed time, the bubble, the
    optimizer step, and what is left of the step: the wait for the slowest rank of its stage."""
    parts = [("compute", "compute", row["compute_seconds"])]
    parts += [(f"exposed {kind}", f"{kind} exposed", v["exposed"])
              for kind, v in sorted(row["communication_seconds"].items())]
    parts += [("bubble", "bubble", row["bubble_seconds"]), ("optimizer", "optimizer step", row["optimizer_seconds"])]
    left = row["step_seconds"] - sum(p[2] for p in parts)
    if left > _ROUNDING * row["step_seconds"]:
        parts.append(("wait", "waiting for the slowest rank of its stage", left))
    return parts


def _interval_marks(prediction: Any, y: int, span: float) -> str:
    """The interval's known ends as ticks on the critical rank's bar, joined when both are known; an end that is
    not known is not drawn."""
    low, high = prediction.interval
    out = []
    for name, v in (("low", low), ("high", high)):
        if v is not None:
            x = _LABEL + _WIDTH * v / span
            out.append(f'<line class="interval-{name}" x1="{x:.1f}" x2="{x:.1f}" y1="{y}" y2="{y + 21}" '
                       f'stroke="#1d232a" stroke-width="2"><title>interval {name} end {seconds_text(v)}</title></line>')
    if low is not None and high is not None:
        a, b = (_LABEL + _WIDTH * v / span for v in (low, high))
        out.append(f'<line class="interval" x1="{a:.1f}" x2="{b:.1f}" y1="{y + 10.5}" y2="{y + 10.5}" '
                   f'stroke="#1d232a" stroke-width="1.5"/>')
    return "".join(out)


def _interval_text(prediction: Any) -> str:
    """The interval in words, an end not known said so and why (the prediction's note)."""
    ends = ", ".join("not known" if v is None else seconds_text(v) for v in prediction.interval)
    why = " (why: the interval's note above)" if None in prediction.interval else ""
    return f"interval [{ends}]{why}"


def prediction_chart(prediction: Any) -> str:
    """Each rank's predicted step as a bar (ranks with the same figures share one): compute, each collective's
    exposed seconds, the bubble, the optimizer step; the critical rank marked, the interval's known ends on it."""
    groups: dict[tuple, list[Any]] = {}
    for row in prediction.ranks:
        groups.setdefault((*_rank_parts(row), row["step_seconds"]), []).append(row)
    rows = sorted(groups.values(), key=lambda g: g[0]["rank"])
    known = [v for v in prediction.interval if v is not None]
    span = max([prediction.step_seconds, *known]) or 1.0
    body, seen = [], {}
    for i, g in enumerate(rows):
        y, x = 4 + i * _ROW, _LABEL
        ranks = [r["rank"] for r in g]
        critical = prediction.critical_rank in ranks
        rects = []
        for cls, label, v in _rank_parts(g[0]):
            key = cls.split()[-1]
            w = _WIDTH * v / span
            if v > 0:
                seen.setdefault(key, label)
            rects.append(f'<rect class="{cls}" data-seconds="{v!r}" x="{x:.1f}" y="{y + 3}" width="{w:.1f}" '
                         f'height="15" fill="{_TIME_COLOURS.get(key, _OTHER_COLLECTIVE)}">'
                         f'<title>{escape(label)} {seconds_text(v)}</title></rect>')
            x += w
        mark, after = "", x
        if critical:
            mark = _interval_marks(prediction, y, span)
            after = max([x, *(_LABEL + _WIDTH * v / span for v in known)])
        weight = ' font-weight="bold"' if critical else ""
        body.append(f'<g class="rank-time{" critical" if critical else ""}" data-ranks="{",".join(map(str, ranks))}" '
                    f'data-step="{g[0]["step_seconds"]!r}"><text x="{_LABEL - 6}" y="{y + 15}" text-anchor="end"'
                    f'{weight}>{"ranks" if len(ranks) > 1 else "rank"} {escape(_listed(ranks))}</text>'
                    + "".join(rects) + mark
                    + f'<text x="{after + 6:.1f}" y="{y + 15}"{weight}>{seconds_text(g[0]["step_seconds"])}'
                    f'{" critical" if critical else ""}</text></g>')
    height = 4 + _ROW * len(rows)
    body.append(_axis(height + 2, span))
    legend = _time_legend(list(seen.items()))
    return (f'<figure id="prediction-chart"><figcaption class="note">Each rank\'s predicted step '
            f'({seconds_text(prediction.step_seconds)}; the critical rank {prediction.critical_rank} in bold; '
            f'{escape(_interval_text(prediction))}; black ticks: its known ends): {legend}</figcaption>'
            f'{_svg("Predicted step per rank", height + 26, body)}</figure>')


def _action_parts(a: Any, parts: Any, x: float, scale: float, y: int) -> str:
    """An action's rectangles from its start: compute (its kind's colour), exposed collectives, the send."""
    out = []
    for cls, v in zip(("compute", "collectives", "send"), parts[0 if a.kind == "F" else 1]):
        if v <= 0:
            continue
        w = scale * v
        fill = _COLOURS[a.kind] if cls == "compute" else _TIME_COLOURS[cls]
        out.append(f'<rect class="{cls}" data-seconds="{v!r}" x="{x:.1f}" y="{y + 2}" width="{max(w - 0.5, 0.5):.1f}" '
                   f'height="17" fill="{fill}"/>')
        x += w
    return "".join(out)


def timeline_chart(prediction: Any, plan: Any = None) -> str:
    """The pipeline's predicted schedule (:attr:`flopcount.measure.predict.Prediction.timeline`): a row per
    pipeline rank over the makespan in seconds, each action at its start, split into compute, exposed collectives
    and the send, the rest of the row idle."""
    t = prediction.timeline
    span = t.makespan or 1.0
    pp = 1 + max(a.rank for a in t.actions)
    body = []
    for p in range(pp):
        y = 4 + p * _ROW
        busy = sum(a.end - a.start for a in t.actions if a.rank == p)
        body.append(f'<text x="{_LABEL - 6}" y="{y + 15}" text-anchor="end">pipeline rank {p}</text>'
                    f'<rect class="idle" data-seconds="{t.makespan - busy!r}" x="{_LABEL}" y="{y + 2}" '
                    f'width="{_WIDTH}" height="17" fill="{_TIME_COLOURS["bubble"]}"><title>pipeline rank {p}: idle '
                    f'{seconds_text(t.makespan - busy)} of {seconds_text(t.makespan)}</title></rect>')
    for a in t.actions:
        y, x = 4 + a.rank * _ROW, _LABEL + _WIDTH * a.start / span
        f = t.parts[a.chunk][0 if a.kind == "F" else 1]
        chunk = f", chunk {a.chunk // pp}" if a.chunk >= pp else ""
        w = _WIDTH * (a.end - a.start) / span
        number = f'<text x="{x + w / 2:.1f}" y="{y + 15}" text-anchor="middle" fill="#fff">{a.microbatch}</text>' \
            if w >= 14 else ""
        body.append(f'<g class="predicted-action" data-kind="{a.kind}" data-rank="{a.rank}" data-start="{a.start!r}" '
                    f'data-end="{a.end!r}" opacity="{0.65 if a.chunk >= pp else 1}"><title>pipeline rank {a.rank}: '
                    f'{"forward" if a.kind == "F" else "backward"} of microbatch {a.microbatch}{chunk}, '
                    f'{seconds_text(a.start)} to {seconds_text(a.end)}: compute {seconds_text(f[0])}, collectives '
                    f'{seconds_text(f[1])}, send {seconds_text(f[2])}</title>'
                    + _action_parts(a, t.parts[a.chunk], x, _WIDTH / span, y) + number + "</g>")
    height = 4 + _ROW * pp
    body.append(_axis(height + 2, span))
    shape = f"{escape(plan.schedule)}, {plan.microbatches} microbatches; " if plan is not None else ""
    after = prediction.step_seconds - t.makespan
    drawn = [k for i, k in enumerate(("collectives", "send"), 1) if any(x[i] > 0 for pair in t.parts for x in pair)]
    legend = _legend([("F", "forward"), ("B", "backward (with its recompute)")]) + " " + _time_legend(
        [(k, label) for k, label in (("collectives", "exposed collectives"), ("send", "send to the next stage"))
         if k in drawn] + [("bubble", "idle")])
    if any(a.chunk >= pp for a in t.actions):
        legend += "; lighter: the rank's later chunks of layers"
    return (f'<figure id="timeline-chart"><figcaption class="note">The pipeline schedule as predicted ({shape}'
            f'numbers: the microbatch; makespan {seconds_text(t.makespan)}; the critical rank\'s step goes on '
            f'{seconds_text(after)} after it: '
            f'the data-parallel reduction\'s exposed time, the collectives once a step and the optimizer step): '
            f'{legend}</figcaption>{_svg("Predicted pipeline schedule", height + 26, body)}</figure>')


def prediction_sections(prediction: Any, plan: Any = None) -> list[str]:
    """The HTML of a prediction: its lines, each rank's step and, with a pipeline, its schedule in seconds;
    ``plan``: the plan's :class:`~flopcount.parallel.plan.ParallelPlan` (None: one rank)."""
    out = ["<h2>Predicted step</h2>",
           '<ul class="plain" id="prediction">' + "".join(f"<li>{escape(x)}</li>" for x in prediction.lines())
           + "</ul>", prediction_chart(prediction)]
    if prediction.timeline is not None and prediction.timeline.actions:
        out.append(timeline_chart(prediction, plan))
    return out
