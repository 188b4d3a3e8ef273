"""Rendering a :class:`~flopcount.reporting.report.Report`: JSON (the stable schema), table, markdown, CSV.

Rendering returns strings; only the CLI prints.
"""

from __future__ import annotations

import textwrap

import csv
import io
import json
from typing import TYPE_CHECKING, Any

from ..reporting.report import Report, node_bytes
from ..reporting.tiled import check_listable

if TYPE_CHECKING:  # annotations only (context imports numpy and onnx; onnx is imported where a dtype is named)
    from ..context import TensorInfo

SCHEMA_VERSION = 9  # 2: mode, forward, backward, training; total = forward + backward. 3: total.buffers; params
# without buffers and folded constants. 4: modules and module_scopes (by module), nodes[].module. 5: generation
# and moe. 6: layers (--hf: a stack of identical layers extended from 1 and 2, or exported whole). 7: memory (with
# --memory), notes, and the CSV's upper_bound column. 8: parallel (with --parallel: FLOPs per rank). 9: summary,
# parallel.schedule, memory.device_memory_bytes and ranks[].headroom_bytes, the CSV's per-rank table
FORMATS = ("table", "json", "csv", "markdown", "html")


def _dtype(t: TensorInfo) -> str:
    import onnx

    return onnx.TensorProto.DataType.Name(t.elem_type).lower() if t.elem_type else "unknown"


def _tensor(t: TensorInfo | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {"name": t.name, "dtype": _dtype(t), "shape": None if t.shape is None else list(t.shape)}


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def to_dict(report: Report, per_node: bool = False, by_module: int | None = None) -> dict[str, Any]:
    """The JSON document (see docs/json.md); ``by_module``: the depth of the module rows, if any.

    Each section is made by a function of its own (``_json_<section>``); the optional ones are added in the order
    the schema lists them, each where its part of the report exists."""
    from ..version import __version__

    doc: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "flopcount", "version": __version__},
        "model": _json_model(report),
        "convention": {"name": report.convention.name, "summary": report.convention.summary},
        "batch": report.batch,
        "mode": report.mode,
        "total": _json_total(report),
        "per_sample": None if report.per_sample is None else report.per_sample.as_dict(),
        "forward": report.forward.as_dict(),
        "backward": report.backward.as_dict(),
        "by_op_type": _json_by_op_type(report),
        "attention": report.attention,
        "unsupported": dict(report.unsupported),
        "upper_bounds": {key: {"nodes": k, "why": why} for key, (k, why) in report.upper_bounds.items()},
    }
    if report.mode == "train":
        doc["training"] = _json_training(report)
    if report.generation is not None:
        doc["generation"] = report.generation.as_dict()
    if report.moe is not None:
        doc["moe"] = report.moe.as_dict()
    if report.layers is not None:
        doc["layers"] = report.layers.as_dict()
    if report.memory is not None:
        doc["memory"] = _json_memory(report, by_module)
    if report.parallel is not None:
        doc["parallel"] = report.parallel.as_dict()
    from .ranks import summary

    plan = summary(report)
    if plan is not None:
        doc["summary"] = plan.as_dict()
    if report.notes:
        doc["notes"] = list(report.notes)
    if by_module is not None:
        doc["module_scopes"] = _json_module_scopes(report, by_module)
        doc["modules"] = _json_modules(report, by_module)
    if per_node:
        doc["nodes"] = _json_nodes(report)
    return doc


def _json_model(report: Report) -> dict[str, Any]:
    """The ``model`` section: the file, its graph, opsets, producer, inputs and outputs."""
    return {
        "path": report.model.path,
        "graph_name": report.model.graph_name,
        "ir_version": report.model.ir_version,
        "opsets": {(d or "ai.onnx"): v for d, v in report.model.opsets.items()},
        "producer": report.model.producer,
        "inputs": [_tensor(t) for t in report.model.inputs],
        "outputs": [_tensor(t) for t in report.model.outputs],
    }


def _json_total(report: Report) -> dict[str, Any]:
    """The ``total`` section: the FLOPs and MACs of forward + backward, the parameters and the buffers."""
    total = report.total.as_dict()
    return {"flops": total["flops"], "macs": total["macs"], "params": report.params, "buffers": report.buffers,
            "transcendentals": total["transcendentals"], "int_ops": total["int_ops"]}


def _json_by_op_type(report: Report) -> dict[str, Any]:
    """The ``by_op_type`` section: per op type, its nodes, cost, backward and share of the total FLOPs."""
    return {
        key: {
            "op_type": s.op_type,
            "domain": s.domain or "ai.onnx",
            "family": s.family,
            "status": s.status,
            "nodes": s.nodes,
            **s.cost.as_dict(),
            "backward": s.backward.as_dict(),
            "share": _share(s.cost.flops + s.backward.flops, report.total.flops),
        }
        for key, s in report.by_op_type.items()
    }


def _json_training(report: Report) -> dict[str, Any]:
    """The ``training`` section (``--mode train``): per sample, the 3× forward rule, trainables, the optimizer."""
    return {
        "per_sample_forward": report.forward.per(report.batch).as_dict() if report.batch else None,
        "per_sample_backward": report.backward.per(report.batch).as_dict() if report.batch else None,
        "three_times_forward_flops": 3 * report.forward.flops,
        "trainable_params": report.trainable_params,
        "backward_unsupported": dict(report.backward_unsupported),
        "optimizer": None if report.optimizer is None else {
            "name": report.optimizer[0], **report.optimizer[1].as_dict()},
    }


def _json_memory(report: Report, by_module: int | None) -> dict[str, Any]:
    """The ``memory`` section (``--memory``), with the activations per module at depth ``by_module``, if any."""
    memory = report.memory.as_dict()
    if by_module is not None:
        from ..memory.ledger import module_activations

        memory["by_module"] = [
            {"module": m, "activations_bytes": b}
            for m, b in module_activations(report.memory, report.nodes, report.modules.nodes, by_module)]
    return memory


def _json_module_scopes(report: Report, by_module: int) -> dict[str, Any]:
    """The ``module_scopes`` section (by module): the depth, and where the scopes come from."""
    return {"depth": by_module, "source": report.modules.source or None, "missing": report.modules.missing or None}


def _json_modules(report: Report, by_module: int) -> list[dict[str, Any]]:
    """The ``modules`` section (by module): a row per module down to depth ``by_module``."""
    return [
        {"module": r.module, "depth": r.depth, "parent": r.parent or None, "flops": r.flops, "macs": r.macs,
         "params": r.params, "share": _share(r.flops, report.total.flops), "forward": r.forward.as_dict(),
         "backward": r.backward.as_dict()}
        for r in report.by_module(by_module)
    ]


def _json_nodes(report: Report) -> list[dict[str, Any]]:
    """The ``nodes`` section (``--per-node``): a row per node; refused where the report cannot list its nodes."""
    check_listable(report.nodes, "--per-node")
    scopes = report.modules.nodes
    return [
        {
            "index": n.index,
            "name": n.name,
            "module": scopes[k][-1] if k < len(scopes) and scopes[k] else None,
            "op_type": n.op_type,
            "domain": n.domain or "ai.onnx",
            "family": n.family,
            "status": n.status,
            "inputs": [_tensor(t) for t in n.inputs],
            "outputs": [_tensor(t) for t in n.outputs],
            **n.cost.as_dict(),
            **_bytes_fields(n),
            "backward": n.backward.as_dict(),
            **({"parts": {label: c.as_dict() for label, c in n.parts}} if n.parts else {}),
            **({"upper_bound": n.bound} if n.bound else {}),
        }
        for k, n in enumerate(report.nodes)
    ]


def _bytes_fields(n) -> dict[str, int | None]:
    """``bytes`` (read + written), ``bytes_read`` and ``bytes_written`` of a node; null when a shape is unknown."""
    b = node_bytes(n)
    return {"bytes": None if b is None else b.total, "bytes_read": None if b is None else b.read,
            "bytes_written": None if b is None else b.written}


def si(value: float, unit: str = "") -> str:
    """A value with an SI prefix.

    >>> si(8_211_910_656, "FLOPs"), si(999)
    ('8.21 GFLOPs', '999')
    """
    for factor, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.2f} {prefix}{unit}"
    return f"{value:g} {unit}".rstrip()


def _n(v: float) -> str:
    return f"{v:,}" if isinstance(v, int) else f"{v:,.2f}"


def _shapes(ts) -> str:
    return ", ".join(t.shape_text() if t is not None else "-" for t in ts)


def _op_rows(report: Report) -> list[list[Any]]:
    train = report.mode == "train"
    return [
        [key, s.nodes, _n(s.cost.flops), *([_n(s.backward.flops)] if train else []), _n(s.cost.macs),
         f"{100 * _share(s.cost.flops + s.backward.flops, report.total.flops):.2f}%", s.status]
        for key, s in report.by_op_type.items()
    ]


def _op_headers(report: Report) -> list[str]:
    if report.mode == "train":
        return ["op type", "nodes", "forward FLOPs", "backward FLOPs", "forward MACs", "share", "status"]
    return ["op type", "nodes", "FLOPs", "MACs", "share", "status"]


def _node_rows(report: Report) -> list[list[Any]]:
    return [
        [n.name, n.op_type, _shapes(n.inputs), _shapes(n.outputs), _n(n.cost.flops), _n(n.cost.macs),
         "?" if (b := node_bytes(n)) is None else _n(b.total)]
        for n in report.nodes
    ]


def _summary_lines(report: Report) -> list[str]:
    m = report.model
    ps = report.per_sample
    none = "none (the batch is 0: no sample to count per)"
    opset = m.opsets.get("", "?")
    # a generation's table and totals are its prefill's (the whole generation's total is among its lines below)
    total, sample = ("Prefill total", "Per-sample prefill") if report.generation is not None else ("Total", "Per-sample")
    lines = [
        f"Model: {m.path or '<in memory>'} (graph {m.graph_name!r}, opset {opset}"
        + (f", producer {m.producer}" if m.producer else "")
        + ")",
        "Inputs: " + ("; ".join(f"{t.name} {_dtype(t)} {t.shape_text()}" for t in m.inputs) or "(none)"),
        f"Convention: {report.convention.name} ({report.convention.summary})",
        f"Batch: {report.batch}",
        f"{total} FLOPs: {_n(report.total.flops)} ({si(report.total.flops, 'FLOPs')})",
        f"{total} MACs: {_n(report.total.macs)} ({si(report.total.macs, 'MACs')})",
        f"{sample} FLOPs: {_n(ps.flops)} ({si(ps.flops, 'FLOPs')})" if ps else f"{sample} FLOPs: {none}",
        f"{sample} MACs: {_n(ps.macs)} ({si(ps.macs, 'MACs')})" if ps else f"{sample} MACs: {none}",
        f"Transcendentals: {_n(report.total.transcendentals)}; integer ops (not FLOPs): {_n(report.total.int_ops)}",
        f"Parameters: {_n(report.params)} ({si(report.params)})"
        + (f"; buffers (not trained): {_n(report.buffers)}" if report.buffers else ""),
    ]
    if report.mode == "train" and ps is None:
        lines[4:4] = ["Mode: train (forward + backward)", f"Per-sample training FLOPs: {none}"]
    elif report.mode == "train":
        fwd, bwd = report.forward.per(report.batch), report.backward.per(report.batch)
        three = 3 * fwd.flops
        lines[4:4] = [
            "Mode: train (forward + backward)",
            f"Per-sample forward FLOPs: {_n(fwd.flops)} ({si(fwd.flops, 'FLOPs')})",
            f"Per-sample backward FLOPs: {_n(bwd.flops)} ({si(bwd.flops, 'FLOPs')})",
            f"Per-sample training FLOPs: {_n(ps.flops)} ({si(ps.flops, 'FLOPs')}); "
            f"the common 3x-forward approximation gives {_n(three)} ({100 * (three / ps.flops - 1) if ps.flops else 0:+.1f}%)",
        ]
    if report.mode == "train":
        lines.append(f"Trainable parameters: {_n(report.trainable_params)}")
        if report.optimizer is not None:
            name, cost = report.optimizer
            lines.append(f"Optimizer step ({name}), not in the totals: {_n(cost.flops)} FLOPs")
        if report.backward_unsupported:
            lines.append(
                "Operators without a backward formula (backward NOT counted): "
                + ", ".join(f"{k} ({v})" for k, v in report.backward_unsupported.items())
            )
    if report.attention != "full":
        lines.append(f"Attention: {report.attention}")
    if report.layers is not None:
        lines.append(f"Layers: {report.layers.layers} in {report.layers.path or 'the model'}, "
                     f"{report.layers.method}: {report.layers.reason}")
    if report.moe is not None:
        lines += _moe_lines(report.moe)
    if report.generation is not None:
        lines += _generation_lines(report.generation)
    if report.memory is not None:
        lines += _memory_lines(report.memory)
    for key, (k, why) in report.upper_bounds.items():
        lines.append(f"Upper bound for {key} ({k} node{'s' if k > 1 else ''}): {why}")
    lines += [f"Note: {note}" for note in report.notes]
    if report.unsupported:
        lines.append(
            "Unsupported operators (no formula, NOT counted): "
            + ", ".join(f"{k} ({v})" for k, v in report.unsupported.items())
        )
    else:
        lines.append("Unsupported operators: none")
    return lines


def _memory_lines(m) -> list[str]:
    """The memory ledger (:mod:`flopcount.memory.ledger`) as lines of the table report: one line per rank."""
    def b(n: int | None) -> str:
        return "n/a" if n is None else f"{_n(n)} B ({si(n, 'B')})"

    how = [m.mode] + ([f"optimizer {m.optimizer} ({m.implementation})"] if m.optimizer else []) + (
        [f"recompute {m.recompute}"] if m.mode == "train" else []) + (["fp32 master weights"] if m.master_weights else [])
    lines = [f"Memory ({', '.join(how)}):"]
    if any(hasattr(r, "coords") for r in m.ranks):  # the classes of ranks are in the plan's summary, first
        lines.append("  per rank: in the plan's summary above, ranks that hold the same bytes together; every "
                     "rank's bytes in JSON and CSV")
    elif m.device_memory is not None:
        from ..memory.summary import plan_summary

        lines.append(f"  device memory: {plan_summary(None, m).verdict}")
    for k, r in enumerate(() if any(hasattr(r, "coords") for r in m.ranks) else m.ranks):
        parts = [f"params {b(r.params_bytes)}", f"grads {b(r.grads_bytes)}", f"optimizer {b(r.optimizer_bytes)}",
                 f"step temporaries {b(r.optimizer_temp_bytes)}", f"activations kept {b(r.activations_bytes)}",
                 f"peak {b(r.peak_bytes)} in the {r.peak_phase}" + (f" at node {r.peak_node!r}" if r.peak_node else "")]
        if r.buffers_bytes:
            parts.insert(1, f"buffers {b(r.buffers_bytes)}")
        if r.kv_cache_bytes is not None:
            parts.append(f"KV cache {b(r.kv_cache_bytes)}")
        lines.append(f"  rank {k}: " + "; ".join(parts))
    if m.missing:
        lines.append("  activations are a LOWER BOUND: no saved-for-backward rule for "
                     + ", ".join(f"{k} ({v})" for k, v in m.missing.items()))
    if m.unsized:
        lines.append(f"  sizes unknown (not counted): {', '.join(m.unsized[:5])}" + (" ..." if len(m.unsized) > 5 else ""))
    return lines


def _moe_lines(m) -> list[str]:
    groups = {t: m.block_tokens.count(t) for t in m.block_tokens}  # blocks by their tokens (encoder, decoder)
    each = f"{m.block_tokens[0] if m.block_tokens else 0} tokens: {m.pairs} (token, expert) pairs per block" \
        if m.uniform else "; ".join(f"{k} block{'s' if k > 1 else ''} of {t} tokens: {t * m.top_k} (token, expert) "
                                    "pairs each" for t, k in groups.items())
    lines = [
        f"Mixture of experts: {m.layers} block{'s' if m.layers > 1 else ''} of {m.experts} routed experts, "
        f"{m.top_k} per token ({each}); routed experts' FLOPs {_n(m.routed_flops)}",
        f"Active parameters per token: {_n(m.active_params)} of {_n(m.params)} ({si(m.active_params)}; shared "
        f"experts {_n(m.shared_params)})",
    ]
    if m.capacity_factor is not None:
        caps = dict(zip(m.block_tokens, m.block_capacity_pairs))
        runs = f"{m.capacity_pairs} of {m.pairs} pairs per block" if m.uniform else ", ".join(
            f"{caps[t]} of {t * m.top_k} pairs in a block of {t} tokens" for t in groups)
        lines.append(f"Capacity factor {m.capacity_factor:g}: at most {runs} run, routed experts' FLOPs at most "
                     f"{_n(m.routed_flops_at_capacity)} (drops depend on the routing; the totals count no drop)")
    return lines


def _generation_lines(g) -> list[str]:
    def figure(flops) -> str:
        return f"{_n(flops)} ({si(flops, 'FLOPs')})"

    prefill = ("the encoder, and the decoder over its start token" if g.encoder_decoder else
               "logits of the last position only")
    lines = [
        f"Generation: batch {g.batch}, {g.prompt_tokens} prompt tokens, {g.new_tokens} new tokens "
        "(the table and totals above are the prefill's)",
        f"Prefill FLOPs ({prefill}): {figure(g.prefill.flops)}",
    ]
    if g.steps:
        lines += [
            f"Decode step FLOPs: first (context {g.first_context}) {figure(g.first_step.flops)}, last (context "
            f"{g.first_context + g.steps - 1}) {figure(g.last_step.flops)}; at context c: {g.formula()}",
            f"Decode FLOPs ({g.steps} step{'s' if g.steps > 1 else ''}): {figure(g.decode.flops)}",
        ]
    per_token = g.flops_per_token
    lines += [
        f"Generation total FLOPs: {figure(g.total.flops)}; per generated token: {si(per_token, 'FLOPs')}",
        f"KV cache at the end ({g.cache_positions} positions"
        + (f", and {g.prompt_tokens} cross-attention positions" if g.encoder_decoder else "") + "): "
        + (", ".join(f"{_n(b)} bytes {dtype}" for dtype, b in g.kv_cache_bytes.items()) or "none"),
        f"Decode counted from: {g.method}",
    ]
    return lines


def _module_rows(report: Report, depth: int, indent: str) -> list[list[Any]]:
    train = report.mode == "train"
    return [
        [indent * (r.depth - 1) + r.module, *([_n(r.forward.flops), _n(r.backward.flops)] if train else []),
         _n(r.flops), _n(r.macs), f"{100 * _share(r.flops, report.total.flops):.2f}%", _n(r.params)]
        for r in report.by_module(depth)
    ]


def _module_headers(report: Report) -> list[str]:
    train = ["forward FLOPs", "backward FLOPs"] if report.mode == "train" else []
    return ["module", *train, "FLOPs", "MACs", "share", "params"]


def _modules_line(report: Report) -> str:
    if report.modules.missing:
        return f"Modules: one row: {report.modules.missing}"
    source = {"metadata": "the exporter's pkg.torch.onnx.name_scopes metadata", "names": "the node names"}
    return f"Modules: scopes from {source.get(report.modules.source, report.modules.source)}"


def render(report: Report, fmt: str = "table", per_node: bool = False, by_module: int | None = None,
           prediction: Any = None) -> str:
    """``report`` as text in ``fmt`` (:data:`FORMATS`); ``per_node`` adds every node, ``by_module`` the rows of
    each module down to that depth (:meth:`~flopcount.reporting.report.Report.by_module`); ``prediction`` (a
    :class:`flopcount.measure.predict.Prediction`) its ``prediction`` object in JSON, its block in a table, its
    pictures in HTML."""
    if per_node:
        check_listable(report.nodes, "--per-node")
    if fmt == "json":
        doc = to_dict(report, per_node, by_module)
        if prediction is not None:
            doc["prediction"] = prediction.as_dict()
        return json.dumps(doc, indent=2) + "\n"
    if fmt == "html":
        from .html import to_html

        return to_html(report, by_module, per_node, prediction=prediction)
    if fmt == "csv":
        return _csv(report, per_node, by_module)
    from tabulate import tabulate  # here, not at import: `flopcount --help` reads FORMATS only, JSON needs none

    tablefmt = "github" if fmt == "markdown" else "simple"
    parts = []
    if report.parallel is not None:  # the plan's summary first: what a planner wants to know
        from .ranks import summary, summary_lines

        parts.append("\n".join(summary_lines(summary(report), fmt == "markdown")))
    if by_module is not None:
        headers = _module_headers(report)
        # tabulate strips leading whitespace (and markdown collapses it): a dot marks each level below the top
        parts.append(tabulate(_module_rows(report, by_module, "· "), headers, tablefmt=tablefmt,
                              disable_numparse=True, colalign=("left", *("right",) * (len(headers) - 1))))
    if per_node:
        parts.append(tabulate(_node_rows(report), ["node", "op type", "inputs", "outputs", "FLOPs", "MACs", "bytes"],
                              tablefmt=tablefmt, disable_numparse=True))
    headers = _op_headers(report)
    parts.append(tabulate(_op_rows(report), headers, tablefmt=tablefmt, disable_numparse=True,
                          colalign=("left", *("right",) * (len(headers) - 2), "left")))
    if report.parallel is not None:
        from ..parallel.ranks import summary_line
        from .ranks import rank_tables

        parts.append("\n".join(rank_tables(report.parallel, fmt == "markdown")))
    summary = _summary_lines(report)
    if report.parallel is not None:  # a long line, wrapped at its clauses' spaces (one item in Markdown)
        summary.append(textwrap.fill(summary_line(report.parallel), 120, subsequent_indent="  ",
                                     break_long_words=False, break_on_hyphens=False))
    if by_module is not None:
        summary.append(_modules_line(report))
    if by_module is not None and report.memory is not None:
        from ..memory.ledger import module_activations

        summary.append("Activations kept by module: " + "; ".join(
            f"{m} {_n(b)} B" for m, b in module_activations(report.memory, report.nodes, report.modules.nodes,
                                                            by_module)))
    if prediction is not None:
        summary += prediction.lines()
    if fmt == "markdown":
        summary = [f"- {line}" for line in summary]
    return "\n\n".join(parts + ["\n".join(summary)]) + "\n"


def _csv(report: Report, per_node: bool, by_module: int | None = None) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if by_module is not None:
        w.writerow(["module", "depth", "parent", "flops", "macs", "params", "forward_flops", "backward_flops",
                    "share"])
        for r in report.by_module(by_module):
            w.writerow([r.module, r.depth, r.parent, r.flops, r.macs, r.params, r.forward.flops, r.backward.flops,
                        f"{_share(r.flops, report.total.flops):.6f}"])
    elif per_node:
        w.writerow(["index", "name", "op_type", "domain", "status", "inputs", "outputs", "flops", "macs", "transcendentals", "int_ops", "bytes_read", "bytes_written", "upper_bound"])
        for n in report.nodes:
            c = n.cost
            b = node_bytes(n)
            w.writerow([n.index, n.name, n.op_type, n.domain, n.status, _shapes(n.inputs), _shapes(n.outputs), c.flops, c.macs, c.transcendentals, c.int_ops,
                        "" if b is None else b.read, "" if b is None else b.written, n.bound])
    else:
        w.writerow(["op_type", "domain", "family", "status", "nodes", "flops", "macs", "transcendentals", "int_ops", "share", "upper_bound"])
        bounds = report.upper_bounds  # why an operator's count is an upper bound; empty when exact
        for key, s in report.by_op_type.items():
            c = s.cost
            w.writerow([s.op_type, s.domain, s.family, s.status, s.nodes, c.flops, c.macs, c.transcendentals, c.int_ops,
                        f"{_share(c.flops, report.total.flops):.6f}", bounds[key][1] if key in bounds else ""])
    from .ranks import rank_csv_rows

    ranks = rank_csv_rows(report)
    if ranks:  # the per-rank table after a blank line: FLOPs, communication and memory of each rank
        w.writerow([])
        w.writerows(ranks)
    return buf.getvalue()
