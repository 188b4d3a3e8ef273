"""The records a profile hands on: one executed node, one op type, the whole run, and their JSON and text forms
(``flopcount profile --format json|table|csv``; JSON schema in docs/profile.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

__all__ = ["PROFILE_SCHEMA_VERSION", "NodeProfile", "OpTypeProfile", "Profile", "render", "to_dict"]

PROFILE_SCHEMA_VERSION = 1


class _Rates:
    """Achieved FLOP/s and arithmetic intensity of something with ``flops``, ``bytes`` and ``time_s``."""

    flops: int
    bytes: int | None
    time_s: float | None

    @property
    def flops_per_s(self) -> float | None:
        return self.flops / self.time_s if self.time_s else None

    @property
    def intensity(self) -> float | None:
        """FLOPs per byte read or written."""
        return self.flops / self.bytes if self.bytes else None


@dataclass(frozen=True)
class NodeProfile(_Rates):
    """One executed node: its measured median time and its counted work.

    ``covers`` are the graph nodes it runs (itself without optimisation; the fused nodes with it); ``flops`` their
    analytic FLOPs; ``bytes`` what it reads and writes (None when a shape is unknown); ``time_s`` the median kernel
    time over the timed runs (None when the profiler never reported it); ``bound`` ``"compute"`` or ``"memory"``
    against the ceilings (None when bytes or the ceilings are unknown)."""

    name: str
    op_type: str
    covers: tuple[str, ...]
    flops: int
    bytes: int | None
    time_s: float | None
    bound: str | None
    dtype: str = "fp32"
    provider: str = ""


@dataclass(frozen=True)
class OpTypeProfile(_Rates):
    op_type: str
    nodes: int
    flops: int
    bytes: int | None
    time_s: float
    bound: str | None


@dataclass(frozen=True)
class Profile:
    """The result of :func:`profile`. ``run_time_s`` is the median whole-run time without the profiler;
    ``profiled_time_s`` the median sum of the node times; ``unattributed_s`` the median time of kernels that map to
    no graph node (layout conversions an optimised graph adds)."""

    model: str | None
    provider: str
    optimize: str
    batch: int
    warmup: int
    runs: int
    run_time_s: float
    profiled_time_s: float
    flops: int
    nodes: tuple[NodeProfile, ...]
    by_op_type: Mapping[str, OpTypeProfile]
    ceilings: Any  # flopcount.measure.machine.ceilings.Ceilings
    weights: Mapping[str, int]  # {"from_model": k, "synthesized": m}
    unattributed_s: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)
    report: Any = field(default=None, compare=False, repr=False)  # the count it was profiled against (per module)

    @property
    def flops_per_s(self) -> float:
        """The whole run's FLOP/s: counted FLOPs over the median run time without the profiler."""
        return self.flops / self.run_time_s


def to_dict(p: Profile) -> dict[str, Any]:
    """The JSON document of ``flopcount profile --format json`` (schema in docs/profile.md)."""
    from flopcount.version import __version__

    def node(r: NodeProfile) -> dict[str, Any]:
        return {"name": r.name, "op_type": r.op_type, "covers": list(r.covers), "flops": r.flops, "bytes": r.bytes,
                "time_s": r.time_s, "flops_per_s": r.flops_per_s, "intensity": r.intensity, "bound": r.bound,
                "dtype": r.dtype, "provider": r.provider}

    total_time = sum(s.time_s for s in p.by_op_type.values())
    c = p.ceilings
    peak = c.compute("fp32")
    return {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "tool": {"name": "flopcount", "version": __version__},
        "model": p.model,
        "provider": p.provider,
        "optimize": p.optimize,
        "batch": p.batch,
        "warmup": p.warmup,
        "runs": p.runs,
        "run_time_s": p.run_time_s,
        "profiled_time_s": p.profiled_time_s,
        "unattributed_s": p.unattributed_s,
        "flops": p.flops,
        "flops_per_s": p.flops_per_s,
        "weights": dict(p.weights),
        "ceilings": {
            "compute_fp32_flops_per_s": None if peak is None else peak.value,
            "memory_bytes_per_s": None if c.memory_bandwidth is None else c.memory_bandwidth.value,
            "device": c.device.get("name"),
        },
        "nodes": [node(r) for r in p.nodes],
        "by_op_type": {
            k: {"op_type": s.op_type, "nodes": s.nodes, "flops": s.flops, "bytes": s.bytes, "time_s": s.time_s,
                "time_share": s.time_s / total_time if total_time else None,
                "flops_share": s.flops / p.flops if p.flops else None, "flops_per_s": s.flops_per_s,
                "intensity": s.intensity, "bound": s.bound}
            for k, s in p.by_op_type.items()
        },
        "notes": list(p.notes),
    }


def _f(v: float | None, unit: str = "") -> str:
    from flopcount.output.render import si

    return "-" if v is None else si(v, unit)


def render(p: Profile, fmt: str = "table", per_node: bool = False) -> str:
    import csv
    import io

    from tabulate import tabulate

    if fmt == "json":
        return json.dumps(to_dict(p), indent=2) + "\n"
    total_time = sum(s.time_s for s in p.by_op_type.values()) or 1.0
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        if per_node:
            w.writerow(["name", "op_type", "covers", "flops", "bytes", "time_s", "flops_per_s", "intensity", "bound"])
            for r in p.nodes:
                w.writerow([r.name, r.op_type, " ".join(r.covers), r.flops, _blank(r.bytes), _blank(r.time_s),
                            _blank(r.flops_per_s), _blank(r.intensity), r.bound or ""])
        else:
            w.writerow(["op_type", "nodes", "flops", "bytes", "time_s", "time_share", "flops_share", "flops_per_s",
                        "intensity", "bound"])
            for s in p.by_op_type.values():
                w.writerow([s.op_type, s.nodes, s.flops, _blank(s.bytes), s.time_s, f"{s.time_s / total_time:.6f}",
                            f"{s.flops / p.flops:.6f}" if p.flops else "", _blank(s.flops_per_s),
                            _blank(s.intensity), s.bound or ""])
        return buf.getvalue()
    parts = []
    if per_node:
        parts.append(tabulate(
            [[r.name, r.op_type, _ms(r.time_s), _f(r.flops, "FLOPs"), _f(r.flops_per_s, "FLOP/s"), _f(r.bytes, "B"),
              _i(r.intensity), r.bound or "-"] for r in p.nodes],
            ["node", "op type", "time ms", "FLOPs", "FLOP/s", "bytes", "FLOP/B", "bound"],
            tablefmt="simple", disable_numparse=True))
    parts.append(tabulate(
        [[s.op_type, s.nodes, f"{s.time_s * 1e3:.3f}", f"{100 * s.time_s / total_time:.1f}%",
          f"{100 * s.flops / p.flops:.1f}%" if p.flops else "-", _f(s.flops_per_s, "FLOP/s"), _f(s.bytes, "B"),
          _i(s.intensity), s.bound or "-"] for s in p.by_op_type.values()],
        ["op type", "nodes", "time ms", "time share", "FLOPs share", "FLOP/s", "bytes", "FLOP/B", "bound"],
        tablefmt="simple", disable_numparse=True, colalign=("left",) + ("right",) * 8))
    c = p.ceilings
    peak = c.compute("fp32")
    lines = [
        f"Model: {p.model or '<in memory>'}; batch {p.batch}; onnxruntime {p.provider}, graph optimisation "
        f"{p.optimize}; {p.warmup} warm-up + {p.runs} timed runs (medians)",
        f"Whole run (no profiler): {p.run_time_s * 1e3:.3f} ms, {_f(p.flops, 'FLOPs')} -> {_f(p.flops_per_s, 'FLOP/s')}",
        f"Sum of node times (profiler): {p.profiled_time_s * 1e3:.3f} ms "
        f"({100 * p.profiled_time_s / p.run_time_s:.1f}% of the whole run)",
        f"Ceilings: compute fp32 {_f(None if peak is None else peak.value, 'FLOP/s')}, memory "
        f"{_f(None if c.memory_bandwidth is None else c.memory_bandwidth.value, 'B/s')}"
        + (f", ridge point {peak.value / c.memory_bandwidth.value:.1f} FLOP/B" if peak and c.memory_bandwidth else "")
        + f" ({c.device.get('name', '?')})",
        f"Weights: {p.weights['from_model']} initializers from the model, {p.weights['synthesized']} synthesised",
        *[f"Note: {n}" for n in p.notes],
    ]
    return "\n\n".join(parts + ["\n".join(lines)]) + "\n"


def _blank(v) -> str:
    return "" if v is None else repr(v)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.3f}"


def _i(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"
