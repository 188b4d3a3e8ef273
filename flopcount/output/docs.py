"""Generates docs/operators.md from the registry: ``python -m flopcount.output.docs -o docs/operators.md``.

For every operator: its family, its group (formula or zero-cost), the equation from its formula's
docstring, and its cost under each convention on a worked instance (the first of onnx's own
single-node test cases for that operator, where one exists).
"""

from __future__ import annotations

import argparse
import sys
import warnings

from ..conventions import CONVENTIONS
from ..pipeline.onnx_cases import run_time_facts
from ..registry import BACKWARD, RULES


def _instances() -> dict[tuple[str, str], object]:
    """The first onnx test case of each (domain, op_type) whose model has that single op."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases()
    first: dict[tuple[str, str], object] = {}
    for case in sorted(cases, key=lambda c: c.name):
        nodes = case.model.graph.node
        if len(nodes) == 1 and not case.name.endswith("_expanded"):
            key = ("" if nodes[0].domain in ("", "ai.onnx") else nodes[0].domain, nodes[0].op_type)
            first.setdefault(key, case)
    return first


def _cell(text: str) -> str:
    """``text`` inside a table cell: ``|`` escaped, and ``[`` too, so that ``[a] [b]`` is not read as a link."""
    return text.replace("|", "\\|").replace("[", "\\[")


def operators_markdown() -> str:
    import flopcount
    import flopcount.operators  # noqa: F401

    instances = _instances()
    names = list(CONVENTIONS)
    lines = [
        "# Operators",
        "",
        "Generated from the registry by `python -m flopcount.output.docs -o docs/operators.md`; a test fails when",
        "this file is stale. Every operator is a formula or an explicit zero cost. |X| is the number of",
        "elements of X, Y the output; 1 MAC = 2 FLOPs. The example columns count the first of onnx's own",
        "single-node test cases for the operator under each convention.",
        "",
        "| operator | family | group | cost | backward (training) | example | " + " | ".join(f"{n} FLOPs" for n in names) + " |",
        "| --- | --- | --- | --- | --- | --- | " + " | ".join("---:" for _ in names) + " |",
    ]
    for (domain, op_type), rule in sorted(RULES.items(), key=lambda kv: (kv[0][0], kv[0][1].lower())):
        case = instances.get((domain, op_type))
        example, figures = "", ["" for _ in names]
        if case is not None:
            values, shapes, trips = run_time_facts(case)
            try:
                figures = [
                    f"{flopcount.count(case.model, input_values=values, input_shapes=shapes, loop_trips=trips, convention=n).total.flops:,}"
                    for n in names
                ]
                example = f"`{case.name}`"
            except flopcount.FlopcountError:
                figures = ["" for _ in names]
        label = f"{domain}:{op_type}" if domain else op_type
        group = "zero-cost" if rule.zero_cost else "formula"
        back = BACKWARD.get((domain, op_type))
        if back is not None:
            back_text = " ".join((back.__doc__ or "").strip().split("\n\n", 1)[0].split())
        else:
            back_text = "free (gradients are moved, not computed)" if rule.zero_cost else "none: reported as missing"
        lines.append(
            f"| {label} | {rule.family} | {group} | {_cell(rule.equation)} | {_cell(back_text)} | {example} | "
            + " | ".join(figures) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flopcount.output.docs", description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", help="write here instead of stdout")
    args = p.parse_args(argv)
    text = operators_markdown()
    if args.output:
        from flopcount.output.files import write_atomic

        write_atomic(args.output, text, "operator table")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
