"""``--symbolic`` and ``--sweep`` of the counting command: formulas in named dims, and counts over a list of sizes."""

from __future__ import annotations

import argparse
import csv
import io
import json
from typing import Any

from flopcount.errors import UsageError

from .arguments import options_from_args
from .console import write_output

__all__ = ["run_sweep", "run_symbolic", "start_sizes", "sweep_values"]


def start_sizes(text: str) -> dict[str, int]:
    """``--symbolic [NAME=START,...]``: the size each named dim is first counted at."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"expected NAME=START with START a positive integer, got {item!r}")
        out[name] = int(value)
    return out


def sweep_values(text: str) -> tuple[str, tuple[int, ...]]:
    """``--sweep NAME=V1,V2,...``."""
    name, sep, values = text.partition("=")
    sizes = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not name or not sizes or not all(v.isdigit() and int(v) > 0 for v in sizes):
        raise argparse.ArgumentTypeError(f"expected NAME=V1,V2,... with positive integers, such as S=128,256, "
                                         f"got {text!r}")
    return name, tuple(int(v) for v in sizes)


def _counting(args: argparse.Namespace):
    """(model, count function or None, count keyword arguments, the settings) for the model ``args`` name."""
    import dataclasses

    _, options = options_from_args(args)
    what = "--sweep" if args.sweep else "--symbolic"
    for flag, given in (("--memory", options.memory), ("--parallel", options.parallel),
                        ("--generate", args.generate)):
        if given:
            raise UsageError(f"{what} with {flag}: a formula (or a sweep) is of the count's FLOPs; count one size "
                             f"with {flag}, or leave {flag} out")
    # every setting of the record but the shapes, which each size fills in
    kwargs = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
              if f.name != "input_shapes" and getattr(options, f.name) != f.default}
    if args.torch or args.hf:
        from flopcount.frontends.torch import from_torch, load_factory

        if args.torch:
            module = load_factory(args.torch)
            export = from_torch
        else:
            from flopcount.frontends.hf import from_hf, load_model

            module = load_model(args.hf, trust_remote_code=args.trust_remote_code)

            def export(_module, shapes, **kw):  # 1- and 2-layer exports where the layers repeat (--repeated-layers)
                return from_hf(module.config, shapes, trust_remote_code=args.trust_remote_code,
                               repeated_layers=args.repeated_layers, **kw)
        dtypes = args.input_dtypes

        def count(_model, input_shapes, **kw):  # one export per size (each kept in the export cache)
            shapes = {n: ((d, dtypes[n]) if n in dtypes else d) for n, d in input_shapes.items()}
            return export(module, shapes, training=args.mode == "train", **kw)

        return module, count, kwargs, options
    if args.keras:
        raise UsageError("--symbolic and --sweep take an ONNX model, --torch or --hf; for a Keras model, count "
                         "each size with --input-shape")
    return args.model, None, kwargs, options


def _shapes(args: argparse.Namespace) -> dict[str, tuple]:
    return {name: dims for name, dims in args.input_shape}


def run_symbolic(args: argparse.Namespace) -> int:
    """Print the formulas of the count in the named dims."""
    from flopcount.derived.symbolic import symbolic_count

    model, count, kwargs, options = _counting(args)
    formula = symbolic_count(model, _shapes(args), start=args.symbolic or None, count=count, **kwargs)
    write_output(_render(args, options, formula), args.output)
    return 0


def _render(args: argparse.Namespace, options, formula) -> str:
    from flopcount.output.render import SCHEMA_VERSION

    ops = {k: p for k, p in formula.by_op_type.items() if p.terms}
    if args.format == "json":
        doc: dict[str, Any] = {"schema_version": SCHEMA_VERSION, "kind": "flopcount.formula",
                               "model": args.model or args.torch or args.hf,
                               "convention": args.convention, "mode": options.mode, **formula.as_dict()}
        doc["by_op_type"] = {k: p.as_dict() for k, p in ops.items()}
        return json.dumps(doc, indent=2) + "\n"
    if args.format == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["figure", "formula"])
        for name, p in (("flops", formula.flops), ("macs", formula.macs), ("forward_flops", formula.forward_flops),
                        ("backward_flops", formula.backward_flops), *((f"op:{k}", p) for k, p in ops.items())):
            w.writerow([name, str(p)])
        return buf.getvalue()
    from tabulate import tabulate

    names = ", ".join(formula.variables)
    lines = [f"FLOPs in {names}: {formula.flops}", f"MACs: {formula.macs}"]
    if options.mode == "train":
        lines += [f"Forward FLOPs: {formula.forward_flops}", f"Backward FLOPs: {formula.backward_flops}"]
    lines.append(f"Degrees: {', '.join(f'{v} {d}' for v, d in formula.degrees.items())}; found from "
                 f"{len(formula.counted_at)} counts, exact at "
                 + "; ".join(", ".join(f"{v}={x}" for v, x in p.items()) for p in formula.checked_at))
    table = tabulate([[k, str(p)] for k, p in ops.items()], ["op type", "FLOPs"],
                     tablefmt="github" if args.format == "markdown" else "simple", disable_numparse=True)
    return table + "\n\n" + "\n".join(lines) + "\n"


def run_sweep(args: argparse.Namespace) -> int:
    """Count at each size of ``--sweep`` (other named dims at their --symbolic start, else 2)."""
    from flopcount.counting import count as count_onnx
    from flopcount.derived.symbolic import DEFAULT_START

    model, count, kwargs, _ = _counting(args)
    count = count or count_onnx
    name, sizes = args.sweep
    shapes = _shapes(args)
    named = {d for dims in shapes.values() for d in dims if isinstance(d, str)}
    if name not in named:
        raise UsageError(f"--sweep {name}=...: no --input-shape dim is named {name!r}; name it there "
                         f"(input_ids=1x{name})")
    fixed = {v: (args.symbolic or {}).get(v, DEFAULT_START) for v in named if v != name}
    rows = []
    for size in sizes:
        values = {**fixed, name: size}
        concrete = {n: tuple(values[d] if isinstance(d, str) else d for d in dims) for n, dims in shapes.items()}
        r = count(model, input_shapes=concrete, **kwargs)
        rows.append((size, r.total.flops, r.total.macs, r.forward.flops, r.backward.flops))
    if args.plot:
        from flopcount.measure.profile.roofline import plot_sweep

        plot_sweep(name, rows, fixed, args.plot)
    header = [name, "flops", "macs", "forward_flops", "backward_flops"]
    if args.format == "json":
        doc = {"kind": "flopcount.sweep", "variable": name, "fixed": fixed,
               "rows": [dict(zip(header, row)) for row in rows]}
        write_output(json.dumps(doc, indent=2) + "\n", args.output)
    elif args.format == "csv":
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([header, *rows])
        write_output(buf.getvalue(), args.output)
    else:
        from tabulate import tabulate

        text = tabulate([[f"{x:,}" for x in row] for row in rows], [name, "FLOPs", "MACs", "forward", "backward"],
                        tablefmt="github" if args.format == "markdown" else "simple", disable_numparse=True,
                        colalign=("right",) * 5)
        note = f"\n\n{', '.join(f'{k}={v}' for k, v in fixed.items())} held fixed" if fixed else ""
        write_output(text + note + "\n", args.output)
    return 0
