"""Measured time per module: the page of :mod:`flopcount.output.html` with a profile's times beside each module's count.

An executed node's median time belongs to the smallest module that holds every graph node it runs (itself, or
what onnxruntime fused into it): a kernel that runs nodes of two sibling modules counts in their parent's row and
in neither child's, never split between them by a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from flopcount.reporting.modules import OUTSIDE, OWN, ModuleRow

from .records import Profile

__all__ = ["module_times", "profile_html"]

Scope = tuple[str, ...]


def _common(chains: list[Scope]) -> Scope:
    first = chains[0]
    n = 0
    while n < len(first) and all(len(c) > n and c[n] == first[n] for c in chains):
        n += 1
    return first[:n]


def module_times(p: Profile) -> dict[Scope, float]:
    """Median seconds per module scope (the smallest module holding all an executed node runs)."""
    report = p.report
    scope_of: dict[str, Scope] = {}
    for node, chain in zip(report.nodes, report.modules.nodes):
        scope_of.setdefault(node.name, chain)
    out: dict[Scope, float] = {}
    for row in p.nodes:
        if not row.time_s:
            continue
        chains = [scope_of.get(name, ()) for name in row.covers] or [()]
        key = _common(chains)
        out[key] = out.get(key, 0.0) + row.time_s
    return out


def _columns(p: Profile) -> Mapping[str, Callable[[ModuleRow], str]]:
    times = module_times(p)
    chain_of: dict[str, Scope] = {}
    for chain in set(p.report.modules.nodes):
        for k in range(1, len(chain) + 1):
            chain_of.setdefault(chain[k - 1], chain[:k])
    total = sum(times.values())

    def seconds(row: ModuleRow) -> float:
        if row.module == OUTSIDE:
            return times.get((), 0.0)
        if row.module.endswith(OWN):  # the module's own nodes only
            return times.get(chain_of.get(row.parent, ()), 0.0)
        chain = chain_of.get(row.module, ())
        return sum(t for c, t in times.items() if c[:len(chain)] == chain)

    def ms(row: ModuleRow) -> str:
        return f'<span data-v="{seconds(row)}">{seconds(row) * 1e3:,.3f}</span>'

    def share(row: ModuleRow) -> str:
        return f"{100 * seconds(row) / total:.2f}%" if total else "-"

    def rate(row: ModuleRow) -> str:
        t = seconds(row)
        return f"{row.forward.flops / t / 1e9:,.2f}" if t else "-"

    return {"time (ms)": ms, "share of time": share, "GFLOP/s": rate}


def profile_html(p: Profile, depth: int | None = None) -> str:
    """The count's page (:func:`flopcount.output.html.to_html`) with the median time, share of time and achieved FLOP/s of
    each module, and how the times were measured."""
    from flopcount.output.html import to_html

    notes = [f"Measured with onnxruntime ({p.provider}, optimisations {p.optimize}): {p.runs} timed runs after "
             f"{p.warmup} warm-up runs; median run {p.run_time_s * 1e3:,.3f} ms without the profiler, "
             f"{p.profiled_time_s * 1e3:,.3f} ms of node time with it. A module's time is the median node time of "
             "what it runs; a fused kernel's time goes to the smallest module holding all it runs (so a parent's time "
             "can exceed its children's).", *p.notes]
    return to_html(p.report, depth, title=f"flopcount profile: {p.model or 'model'}", extra_columns=_columns(p),
                   notes=notes)
