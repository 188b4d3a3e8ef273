"""A report as one self-contained HTML page: inline CSS, inline SVG charts, a little inline JavaScript, nothing
fetched. Tables come first and carry every figure, so the page reads the same with JavaScript off; the script only
adds what a reader can do with them (collapse a module's children, sort a table by a column).

Sections: the totals; the module tree (FLOPs, MACs, share with a bar, parameters, and in train mode forward and
backward) when the graph has module scopes; charts of FLOPs by module and by operator type; the operator-type
table; unsupported operators and upper bounds; every node with ``per_node``; with a prediction, each rank's
predicted step and the pipeline's schedule in seconds. ``extra_columns`` lets a caller that
measured something per module (``flopcount profile``) add its columns to the module table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from html import escape
from typing import Any

from ..errors import UsageError
from ..reporting.modules import OUTSIDE, OWN, ModuleRow
from ..reporting.report import Report, node_bytes
from ..reporting.tiled import check_listable, distinct

__all__ = ["to_html", "DEFAULT_MAX_ROWS"]

#: The module tree's depth when none is asked for: the deepest (at most 8) that lists at most this many rows, so
#: that the page of a very large graph stays small (a 10k-node graph well under 2 MB).
DEFAULT_MAX_ROWS = 2000
_MAX_DEPTH = 8
_CHART_ITEMS = 16

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1180px;color:#1d232a;
padding:0 16px}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 8px;border-bottom:1px solid #d8dee4;padding-bottom:4px}
.sub{color:#57606a;margin:0 0 12px}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:3px 8px;border-bottom:1px solid #eaeef2;text-align:right;white-space:nowrap}
th{background:#f6f8fa;position:sticky;top:0;cursor:default}th.sortable{cursor:pointer}
td.name,th.name{text-align:left;white-space:normal}
tr.own td.name,tr.outside td.name{color:#57606a;font-style:italic}
.bar{display:inline-block;height:10px;background:#4f7cac;vertical-align:middle;margin-right:6px}
.bar.bwd{background:#d08c4f}.share{min-width:150px;text-align:left}
dl.totals{display:grid;grid-template-columns:max-content auto;gap:2px 18px;margin:0}
dl.totals dt{color:#57606a}dl.totals dd{margin:0;font-variant-numeric:tabular-nums}
.toggle{display:inline-block;width:1.1em;cursor:pointer;color:#57606a;user-select:none}
tr.hidden{display:none}
svg text{font:12px system-ui,sans-serif;fill:#1d232a}
.note{color:#57606a}
ul.plain{margin:4px 0;padding-left:20px}
"""

# Collapse and expand a module's descendants; sort a table by a header. Rows carry data-depth; numbers data-v.
_JS = """
(function(){
var rows=[].slice.call(document.querySelectorAll('#module-table tbody tr'));
rows.forEach(function(tr,i){
  var d=+tr.dataset.depth,next=rows[i+1];
  if(next&&+next.dataset.depth>d){
    var t=document.createElement('span');t.className='toggle';t.textContent='\\u25be';t.title='collapse';
    t.onclick=function(){var open=t.textContent==='\\u25be';t.textContent=open?'\\u25b8':'\\u25be';
      for(var j=i+1;j<rows.length&&+rows[j].dataset.depth>d;j++){
        if(open){rows[j].classList.add('hidden');}
        else{rows[j].classList.remove('hidden');var s=rows[j].querySelector('.toggle');if(s)s.textContent='\\u25be';}
      }};
    tr.querySelector('td.name').prepend(t);
    if(d>=2){t.onclick();}
  }
});
[].forEach.call(document.querySelectorAll('table.sortable'),function(table){
  [].forEach.call(table.tHead.rows[0].cells,function(th,col){
    th.classList.add('sortable');th.title='sort';
    th.onclick=function(){var body=table.tBodies[0],desc=th.dataset.desc!=='1';th.dataset.desc=desc?'1':'0';
      var rs=[].slice.call(body.rows);rs.sort(function(a,b){
        var x=a.cells[col].dataset.v,y=b.cells[col].dataset.v;
        if(x!==undefined&&y!==undefined){return desc?y-x:x-y;}
        x=a.cells[col].textContent;y=b.cells[col].textContent;return desc?y.localeCompare(x):x.localeCompare(y);});
      rs.forEach(function(r){body.appendChild(r);});};
  });
});
})();
"""


def _n(v: int) -> str:
    return f"{v:,}"


def _num(v: int) -> str:
    """A numeric cell: the figure shown with separators, its value kept for sorting."""
    return f'<td data-v="{v}">{_n(v)}</td>'


def _pct(part: int, whole: int) -> float:
    return 100 * part / whole if whole else 0.0


def _bar_cell(part: int, whole: int, backward: int | None = None) -> str:
    """Share of ``whole`` as a bar (two, forward and backward, when ``backward`` is given) and a percentage."""
    share = _pct(part, whole)
    if backward is None:
        bars = f'<span class="bar" style="width:{share:.2f}px"></span>'
    else:
        fwd = _pct(part - backward, whole)
        bars = (f'<span class="bar" style="width:{fwd:.2f}px"></span>'
                f'<span class="bar bwd" style="width:{share - fwd:.2f}px;margin-left:-6px"></span>')
    return f'<td class="share" data-v="{part}">{bars}{share:.2f}%</td>'


def default_depth(report: Report) -> int:
    """The deepest tree (at most 8 levels) with at most :data:`DEFAULT_MAX_ROWS` rows."""
    best = 1
    for depth in range(1, _MAX_DEPTH + 1):
        try:
            if len(report.by_module(depth)) > DEFAULT_MAX_ROWS:
                break
        except UsageError:  # a row for each of more layers than a listing reads (flopcount.reporting.tiled)
            break
        best = depth
        if not any(len(chain) > depth for chain in distinct(report.modules.nodes)):
            break
    return best


def _totals(report: Report) -> str:
    t = report.total
    g = report.generation  # a generation's totals here are its prefill's; the whole generation's beside them
    total = "Prefill total" if g is not None else "Total"
    items = [(f"{total} FLOPs", _n(t.flops)), (f"{total} MACs", _n(t.macs))]
    if g is not None:
        items.append(("Generation total FLOPs (prefill and decode)", _n(g.total.flops)))
    if report.mode == "train":
        items += [("Forward FLOPs", _n(report.forward.flops)), ("Backward FLOPs", _n(report.backward.flops))]
    ps = report.per_sample
    items += [(f"{'Per-sample prefill' if g is not None else 'Per-sample'} FLOPs", _n(ps.flops) if ps else "none (batch 0)"),
              ("Batch", _n(report.batch)),
              ("Parameters", _n(report.params))]
    if report.mode == "train":
        items.append(("Trainable parameters", _n(report.trainable_params)))
    if report.buffers:
        items.append(("Buffers (not trained)", _n(report.buffers)))
    items += [("Transcendentals", _n(t.transcendentals)), ("Integer ops (not FLOPs)", _n(t.int_ops)),
              ("Mode", report.mode), ("Convention", f"{report.convention.name}: {report.convention.summary}")]
    if report.mode == "train" and report.optimizer is not None:
        name, cost = report.optimizer
        items.append((f"Optimizer step ({name}), not in the totals", _n(cost.flops)))
    return '<dl class="totals" id="totals">' + "".join(
        f"<dt>{escape(k)}</dt><dd>{escape(v)}</dd>" for k, v in items) + "</dl>"


def _module_table(report: Report, rows: Sequence[ModuleRow],
                  extra: Mapping[str, Callable[[ModuleRow], str]]) -> str:
    train = report.mode == "train"
    total = report.total.flops
    head = ['<th class="name">module</th>', *(["<th>forward FLOPs</th>", "<th>backward FLOPs</th>"] if train else []),
            "<th>FLOPs</th>", "<th>MACs</th>", '<th class="share">share</th>', "<th>params</th>",
            *(f"<th>{escape(label)}</th>" for label in extra)]
    body = []
    for r in rows:
        kind = ' class="outside"' if r.module == OUTSIDE else ' class="own"' if r.module.endswith(OWN) else ""
        indent = f' style="padding-left:{8 + 18 * (r.depth - 1)}px"'
        cells = [f'<td class="name"{indent} >{escape(r.module)}</td>',
                 *([_num(r.forward.flops), _num(r.backward.flops)] if train else []),
                 _num(r.flops), _num(r.macs), _bar_cell(r.flops, total, r.backward.flops if train else None),
                 _num(r.params), *(f"<td>{fn(r)}</td>" for fn in extra.values())]
        body.append(f'<tr data-depth="{r.depth}"{kind}>' + "".join(cells) + "</tr>")
    return ('<table id="module-table"><thead><tr>' + "".join(head) + "</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


def _op_table(report: Report) -> str:
    train = report.mode == "train"
    total = report.total.flops
    head = ['<th class="name">op type</th>', "<th>nodes</th>",
            *(["<th>forward FLOPs</th>", "<th>backward FLOPs</th>"] if train else ["<th>FLOPs</th>"]),
            "<th>MACs</th>", '<th class="share">share</th>', '<th class="name">status</th>']
    body = []
    for key, s in report.by_op_type.items():
        both = s.cost.flops + s.backward.flops
        cells = [f'<td class="name">{escape(key)}</td>', _num(s.nodes), _num(s.cost.flops),
                 *([_num(s.backward.flops)] if train else []), _num(s.cost.macs + s.backward.macs),
                 _bar_cell(both, total, s.backward.flops if train else None), f'<td class="name">{escape(s.status)}</td>']
        body.append("<tr>" + "".join(cells) + "</tr>")
    return ('<table id="op-table" class="sortable"><thead><tr>' + "".join(head) + "</tr></thead><tbody>"
            + "".join(body) + "</tbody></table>")


def _chart(title: str, items: Sequence[tuple[str, int, int]], total: int) -> str:
    """A horizontal bar chart (inline SVG) of (label, forward, backward) items, largest first, the rest summed."""
    items = sorted(items, key=lambda x: -(x[1] + x[2]))
    if len(items) > _CHART_ITEMS:
        rest = items[_CHART_ITEMS - 1:]
        items = [*items[:_CHART_ITEMS - 1], (f"{len(rest)} others", sum(x[1] for x in rest), sum(x[2] for x in rest))]
    label_w, bar_w, row_h = 230, 600, 20
    biggest = max((f + b for _, f, b in items), default=0) or 1
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" role="img" width="{label_w + bar_w + 90}" '
             f'height="{row_h * len(items) + 8}" aria-label="{escape(title)}"><title>{escape(title)}</title>']
    for i, (label, fwd, bwd) in enumerate(items):
        y = 4 + i * row_h
        short = label if len(label) <= 34 else "…" + label[-33:]
        wf, wb = bar_w * fwd / biggest, bar_w * bwd / biggest
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{escape(short)}</text>'
                     f'<rect x="{label_w}" y="{y + 3}" width="{wf:.1f}" height="13" fill="#4f7cac"/>')
        if bwd:
            parts.append(f'<rect x="{label_w + wf:.1f}" y="{y + 3}" width="{wb:.1f}" height="13" fill="#d08c4f"/>')
        parts.append(f'<text x="{label_w + wf + wb + 6:.1f}" y="{y + 14}">{_pct(fwd + bwd, total):.1f}%</text>')
    parts.append("</svg>")
    legend = "; forward in blue, backward in orange" if any(b for _, _, b in items) else ""
    return f'<figure><figcaption class="note">{escape(title + legend)}</figcaption>{"".join(parts)}</figure>'


def _node_table(report: Report) -> str:
    check_listable(report.nodes, "--per-node")
    head = ["node", "op type", "inputs", "outputs", "FLOPs", "MACs", "bytes"]
    body = []
    for n in report.nodes:
        b = node_bytes(n)
        shapes = [", ".join(t.shape_text() if t is not None else "-" for t in ts) for ts in (n.inputs, n.outputs)]
        body.append(f'<tr><td class="name">{escape(n.name)}</td><td class="name">{escape(n.op_type)}</td>'
                    f'<td class="name">{escape(shapes[0])}</td><td class="name">{escape(shapes[1])}</td>'
                    f'{_num(n.cost.flops)}{_num(n.cost.macs)}{_num(b.total) if b else "<td>?</td>"}</tr>')
    return ('<table id="node-table" class="sortable"><thead><tr>'
            + "".join(f'<th class="name">{h}</th>' if i < 4 else f"<th>{h}</th>" for i, h in enumerate(head))
            + "</tr></thead><tbody>" + "".join(body) + "</tbody></table>")


def to_html(report: Report, depth: int | None = None, per_node: bool = False, title: str | None = None,
            extra_columns: Mapping[str, Callable[[ModuleRow], str]] | None = None, notes: Sequence[str] = (),
            prediction: Any = None) -> str:
    """``report`` as a self-contained HTML page (see the module docstring); ``depth``: the module tree's depth
    (None: :func:`default_depth`); ``extra_columns``: header → function giving a module row's cell (HTML);
    ``notes``: lines shown under the title; ``prediction``: a :class:`flopcount.measure.predict.Prediction` of the
    count, drawn after the plan (:func:`flopcount.output.pictures.prediction_sections`)."""
    m = report.model
    name = m.path or m.graph_name or "model"
    depth = default_depth(report) if depth is None else depth
    rows = report.by_module(depth)
    train = report.mode == "train"
    sub = [f"graph {m.graph_name!r}", f"opset {m.opsets.get('', '?')}", *([f"producer {m.producer}"] if m.producer else []),
           "inputs " + ("; ".join(f"{t.name} {t.shape_text()}" for t in m.inputs) or "(none)")]
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width,initial-scale=1">',
           f"<title>{escape(title or f'flopcount: {name}')}</title><style>{_CSS}</style></head><body>",
           f"<h1>{escape(title or f'flopcount: {name}')}</h1>", f'<p class="sub">{escape(" · ".join(sub))}</p>',
           *(f'<p class="note">{escape(line)}</p>' for line in notes),
           "<h2>Totals</h2>", _totals(report)]
    from .pictures import plan_sections, prediction_sections

    out += plan_sections(report)  # a plan's summary, its tables per rank and their pictures; the memory ledger
    if prediction is not None:  # each rank's predicted step and the pipeline's schedule in seconds
        out += prediction_sections(prediction, None if report.parallel is None else report.parallel.plan)
    out.append(f"<h2>By module (depth {depth})</h2>")
    if report.modules.missing:
        out.append(f'<p class="note" id="modules-missing">{escape(report.modules.missing)}.</p>')
    else:
        source = "the exporter's module-scope metadata" if report.modules.source == "metadata" else "the node names"
        out.append(f'<p class="note">Module scopes from {source}. Each module includes its children; '
                   f'"(own)" rows hold a module\'s work beside its children.'
                   + (" Bars: forward (blue) and backward (orange)." if train else "") + "</p>")
    out.append(_module_table(report, rows, extra_columns or {}))
    out.append("<h2>Charts</h2>")
    if not report.modules.missing:
        top = [(r.module, r.forward.flops, r.backward.flops) for r in rows if r.depth == 1]
        out.append(_chart("FLOPs by module (depth 1)", top, report.total.flops))
    out.append(_chart("FLOPs by operator type",
                      [(k, s.cost.flops, s.backward.flops) for k, s in report.by_op_type.items()],
                      report.total.flops))
    out += ["<h2>By operator type</h2>", _op_table(report)]
    out.append("<h2>Not counted exactly</h2>")
    lists = []
    if report.unsupported:
        lists.append("<p>Unsupported operators (no formula, <strong>not counted</strong>):</p><ul class=\"plain\" "
                     'id="unsupported">' + "".join(f"<li>{escape(k)} ({v})</li>" for k, v in report.unsupported.items())
                     + "</ul>")
    if report.backward_unsupported:
        lists.append("<p>Operators without a backward formula (backward not counted):</p><ul class=\"plain\">"
                     + "".join(f"<li>{escape(k)} ({v})</li>" for k, v in report.backward_unsupported.items()) + "</ul>")
    if report.upper_bounds:
        lists.append('<p>Upper bounds (data-dependent work):</p><ul class="plain" id="upper-bounds">'
                     + "".join(f"<li>{escape(k)} ({n}): {escape(why)}</li>" for k, (n, why) in report.upper_bounds.items())
                     + "</ul>")
    out.append("".join(lists) or '<p class="note">Every operator has a formula, and no count is an upper bound.</p>')
    if per_node:
        out += ["<h2>Nodes</h2>", _node_table(report)]
    out.append(f"<script>{_JS}</script></body></html>")
    return "\n".join(out) + "\n"
