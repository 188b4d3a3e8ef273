"""Rooflines: the HPC-AI roofline of HPC AI500 V2.0 (section 6) and the classic per-operator one.

A roofline is compute ceilings (FLOP/s) and bandwidth ceilings (B/s); a workload at intensity ``I`` (FLOPs per
byte) can attain at most ``min(compute, bandwidth × I)``, and it is bandwidth-bound left of the ridge point
``compute / bandwidth``, compute-bound right of it.

* HPC-AI roofline: ``I`` is the communication operation intensity COI = FLOPs / bytes communicated (from the
  harness's measured gradient all-reduce), the y axis the run's FLOPS; the single-node model uses the intra-node
  link (all-reduce on one node) and memory bandwidth, the distributed model the inter-node network; compute
  ceilings are the measured GEMM and convolution throughput in single and mixed precision, scaled to the run
  (× ranks for GPUs; for CPUs by the threads the run's ranks used over those that measured them).
* Per-operator roofline: ``I`` is each node's arithmetic intensity (FLOPs / bytes read and written), the y axis its
  measured FLOP/s when profiled, against the machine's compute ceilings and memory bandwidth.

>>> r = Roofline("single node", (Ceiling("GEMM fp32", 115e12),), (Ceiling("NVLink", 300e9),), "COI")
>>> r.ridge(), r.attained(100) / 1e12, r.bound(100)
(383.3333333333333, 30.0, 'bandwidth')
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Sequence

from flopcount.errors import MeasurementError, UsageError

from flopcount.measure.machine.ceilings import threads_text


@dataclass(frozen=True)
class Ceiling:
    """A labelled ceiling: FLOP/s (compute) or B/s (bandwidth), with where it comes from."""

    label: str
    value: float
    source: str = ""


@dataclass(frozen=True)
class Point:
    """A workload on the roofline: ``flops_per_s`` measured, or None (placed on the roof, as attainable)."""

    label: str
    intensity: float
    flops_per_s: float | None
    compute: str | None = None  # the compute ceiling it is judged against (None: the highest)


@dataclass(frozen=True)
class Roofline:
    title: str
    compute: tuple[Ceiling, ...]
    bandwidth: tuple[Ceiling, ...]
    x_label: str
    bandwidth_word: str = "bandwidth"  # "communication" (HPC-AI) or "memory" (per operator) in bound decisions

    def __post_init__(self):
        if not self.compute or not self.bandwidth:
            raise UsageError(f"{self.title}: a roofline needs at least one compute and one bandwidth ceiling")

    def _pick(self, ceilings: tuple[Ceiling, ...], label: str | None) -> Ceiling:
        if label is None:  # the highest compute ceiling; the first bandwidth (the one the workload's bytes cross)
            return max(ceilings, key=lambda c: c.value) if ceilings is self.compute else ceilings[0]
        for c in ceilings:
            if c.label == label:
                return c
        raise UsageError(f"{self.title}: no ceiling {label!r}; it has {', '.join(c.label for c in ceilings)}")

    def ridge(self, compute: str | None = None, bandwidth: str | None = None) -> float:
        """Intensity (FLOPs per byte) where the bandwidth ceiling meets the compute ceiling."""
        return self._pick(self.compute, compute).value / self._pick(self.bandwidth, bandwidth).value

    def attained(self, intensity: float, compute: str | None = None, bandwidth: str | None = None) -> float:
        """min(compute ceiling, bandwidth ceiling × intensity): the most a workload at ``intensity`` can reach
        (unless named: the highest compute ceiling and the first bandwidth ceiling, which for the HPC-AI roofline
        is the link the all-reduce crosses)."""
        return min(self._pick(self.compute, compute).value, self._pick(self.bandwidth, bandwidth).value * intensity)

    def bound(self, intensity: float, compute: str | None = None, bandwidth: str | None = None) -> str:
        """``"compute"`` when the compute ceiling is the lower of the two at ``intensity``, else the bandwidth word
        (``"bandwidth"``, ``"communication"`` or ``"memory"``)."""
        c = self._pick(self.compute, compute).value
        b = self._pick(self.bandwidth, bandwidth).value
        return "compute" if c <= b * intensity else self.bandwidth_word


# ----------------------------------------------------------------------------------------------------------------
# building rooflines from measured ceilings

_MIXED = ("bf16", "fp16", "tf32")


def _precision(dtype: str) -> str:
    return f"mixed {dtype}" if dtype in _MIXED else dtype


def compute_ceilings(ceilings, ranks: int = 1, threads: int | None = None, nodes: int = 1) -> tuple[Ceiling, ...]:
    """GEMM and CONV ceilings per dtype, highest first, and the device's table peak of the dtypes measured when it
    has one, for a run over ``ranks`` ranks on ``nodes`` nodes (1: the device as measured).

    A GPU ceiling is one device's: × ranks. A CPU ceiling is that of the threads that measured it, so it scales
    with the threads the run used, ``ranks`` × ``threads`` (its torch threads per rank) over the measurement's
    threads, at most every core of the run's nodes; two ranks of one thread on a machine whose ceiling two threads
    measured get that ceiling once, not twice. A run that does not record its threads is scaled by its ranks, and
    the ceiling's source says what that assumes."""
    cpu = (ceilings.device or {}).get("kind") == "cpu"
    cores = ((ceilings.device or {}).get("details") or {}).get("cores")
    out = []
    for kind, group in (("GEMM", ceilings.gemm), ("CONV", ceilings.conv)):
        for dtype, f in group.items():
            factor, how = (_cpu_factor(f.details.get("threads"), ranks, threads, nodes, cores) if cpu
                           else (ranks, f" x {ranks} devices" if ranks > 1 else ""))
            out.append(Ceiling(f"{kind} {_precision(dtype)}", f.value * factor, f.source + how))
    peaks = (ceilings.device or {}).get("peaks") or {}
    best = max(((d, p.get("flops_per_s")) for d, p in peaks.items() if p.get("flops_per_s")), key=lambda t: t[1],
               default=None)
    if best is not None and not cpu:
        out.append(Ceiling(f"peak {_precision(best[0])}", best[1] * ranks, peaks[best[0]].get("source", "")))
    return tuple(sorted(out, key=lambda c: -c.value))


def _cpu_factor(measured: int | None, ranks: int, threads: int | None, nodes: int,
                cores: int | None) -> tuple[float, str]:
    """How much of a CPU ceiling measured on ``measured`` threads a run of ``ranks`` × ``threads`` can use."""
    if threads is None or not measured:
        if ranks == 1:
            return 1, ""
        missing = f"the {'run' if threads is None else 'ceiling'} does not record its threads"
        each = threads_text(measured) if measured else "same number of threads"
        return ranks, f" x {ranks} ranks, assuming each rank ran the {each} of this measurement ({missing})"
    used = ranks * threads
    capped = cores is not None and used > nodes * cores
    if capped:
        used = nodes * cores
    if used == measured:
        return 1, ""
    return used / measured, (f" x {used}/{measured} threads (the run's {ranks} rank{'s' if ranks > 1 else ''} x "
                             f"{threads_text(threads)}{f', capped at the {nodes * cores} cores' if capped else ''})")


def hpcai_roofline(ceilings, ranks: int = 1, nodes: int = 1, threads: int | None = None) -> Roofline:
    """The HPC-AI roofline of a run over ``ranks`` devices on ``nodes`` nodes (``threads``: its torch threads per
    rank, for a CPU run): compute ceilings scaled to the run (:func:`compute_ceilings`); bandwidth
    the inter-node network (all-reduce measured over several nodes) for a distributed run, else the intra-node
    link (all-reduce measured on one node) and the memory bandwidth."""
    bandwidth = []
    ar = ceilings.allreduce_bandwidth
    if nodes > 1:
        if ar is not None and ceilings.nodes > 1:
            bandwidth.append(Ceiling("network (all-reduce)", ar.value, ar.source))
        elif ar is not None:
            bandwidth.append(Ceiling("intra-node link (all-reduce)", ar.value, ar.source))
    else:
        if ar is not None:
            bandwidth.append(Ceiling("intra-node link (all-reduce)", ar.value, ar.source))
        if ceilings.memory_bandwidth is not None:
            bandwidth.append(Ceiling("memory", ceilings.memory_bandwidth.value, ceilings.memory_bandwidth.source))
    if not bandwidth:
        raise MeasurementError("the ceilings file has no bandwidth for this run: measure the all-reduce bandwidth "
                               "with torchrun --nproc_per_node=R -m flopcount ceilings -o FILE")
    model = "distributed" if nodes > 1 else "single-node"
    return Roofline(f"HPC-AI roofline, {model} model ({ranks} ranks, {nodes} node{'s' if nodes > 1 else ''})",
                    compute_ceilings(ceilings, ranks, threads, nodes), tuple(bandwidth),
                    "communication operation intensity (FLOPs / byte communicated)", "communication")


def operator_roofline(ceilings) -> Roofline:
    """The classic roofline of one device: compute ceilings and its memory bandwidth."""
    if ceilings.memory_bandwidth is None:
        raise MeasurementError("the ceilings have no memory bandwidth; measure it with flopcount ceilings -o FILE")
    m = ceilings.memory_bandwidth
    return Roofline(f"per-operator roofline ({(ceilings.device or {}).get('name', 'this machine')})",
                    compute_ceilings(ceilings), (Ceiling("memory", m.value, m.source),),
                    "arithmetic intensity (FLOPs / byte read or written)", "memory")


# ----------------------------------------------------------------------------------------------------------------
# reading runs and profiles


@dataclass(frozen=True)
class RunPoint:
    label: str
    flops: float
    coi: float
    ranks: int
    nodes: int
    threads: int | None = None  # torch threads per rank (system.cpu.torch_threads), None when not recorded
    precision: str | None = None  # the run's precision: "fp32", "bf16", "conv tf32, matmul fp32" ...


def run_dtypes(precision: str | None) -> tuple[str, ...]:
    """The dtypes of a run's precision: ``"bf16"`` → (bf16,); ``"conv tf32, matmul fp32"`` → (tf32, fp32)."""
    if not precision:
        return ()
    return tuple(part.split()[-1] for part in precision.split(", "))


def ceiling_for(roofline: Roofline, precision: str | None) -> str | None:
    """The label of the compute ceiling a run of ``precision`` is placed under: the highest ceiling (GEMM, CONV or
    the table peak) of the dtypes it ran in, so an fp32 run is never judged against a bf16 ceiling. None when the
    run does not record its precision or no ceiling of its dtypes was measured (then the highest of all)."""
    labels = {_precision(d) for d in run_dtypes(precision)}
    own = [c for c in roofline.compute if c.label.split(" ", 1)[1] in labels]
    return max(own, key=lambda c: c.value).label if own else None


def run_points(doc: Any, where: str = "run") -> list[RunPoint]:
    """The runs of a harness report (``{"system", "runs": [...]}``) or a single run object that have both FLOPS and
    a measured COI (``communication.coi``). No such run is a MeasurementError that says why (the runs' own
    ``unavailable.communication`` reason when they give one)."""
    if not isinstance(doc, dict):
        raise MeasurementError(f"{where}: not a flopcount bench report or run object")
    system = doc.get("system") or {}
    runs = doc["runs"] if isinstance(doc.get("runs"), list) else [doc] if "flops" in doc else None
    if runs is None:
        raise MeasurementError(f"{where}: no 'runs' list and no 'flops': write it with flopcount bench -o FILE or "
                               "meter.to_json(FILE)")
    points, reasons = [], []
    for k, run in enumerate(runs):
        if not isinstance(run, dict):
            continue
        comm = run.get("communication") or {}
        coi, flops = comm.get("coi"), run.get("flops")
        why = (run.get("unavailable") or {}).get("communication")
        if not isinstance(flops, (int, float)) or flops <= 0:
            reasons.append(f"run {k}: no measured FLOPS" + (f" ({(run.get('unavailable') or {}).get('flops')})"
                                                          if (run.get("unavailable") or {}).get("flops") else ""))
            continue
        if not isinstance(coi, (int, float)) or coi <= 0:
            reasons.append(f"run {k}: no communication measured" + (f" ({why})" if why else ""))
            continue
        ranks = int(run.get("ranks") or system.get("ranks") or 1)
        nodes = int(system.get("nodes") or 1)
        threads = (system.get("cpu") or {}).get("torch_threads")
        threads = threads if isinstance(threads, int) and not isinstance(threads, bool) and threads > 0 else None
        precision = run.get("precision") if isinstance(run.get("precision"), str) else None
        points.append(RunPoint(str(run.get("name") or f"run {k}"), float(flops), float(coi), ranks, nodes, threads,
                               precision))
    if not points:
        raise MeasurementError(
            f"{where}: no run has both FLOPS and a communication operation intensity (communication.coi), which the "
            "HPC-AI roofline places a run by: " + "; ".join(reasons[:3])
            + ". COI is measured in data-parallel training on 2 or more ranks, e.g. "
            "torchrun --nproc_per_node=2 -m flopcount bench digits -o run.json")
    return points


def read_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise MeasurementError(f"{path}: cannot read the {what} ({e.strerror})") from None
    except ValueError as e:
        raise MeasurementError(f"{path}: the {what} is not JSON ({e})") from None


def profile_points(doc: Any, where: str = "profile") -> list[Point]:
    """Nodes of a ``flopcount profile --format json`` document with a known intensity, at their FLOP/s."""
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise MeasurementError(f"{where}: not a flopcount profile JSON (no 'nodes'); write one with "
                               "flopcount profile MODEL --format json -o FILE")
    return [Point(f"{n.get('name')} ({n.get('op_type')})", float(n["intensity"]), n.get("flops_per_s"))
            for n in doc["nodes"] if isinstance(n, dict) and n.get("intensity")]


def report_points(report) -> list[Point]:
    """Nodes of a count with FLOPs and known bytes, at their arithmetic intensity (not measured)."""
    from flopcount.reporting.report import node_bytes

    out = []
    for n in report.nodes:
        b = node_bytes(n)
        if b is not None and b.total and n.cost.flops:
            out.append(Point(f"{n.name} ({n.op_type})", n.cost.flops / b.total, None))
    return out


# ----------------------------------------------------------------------------------------------------------------
# text


def stale_ceiling(roofline: Roofline, points: Sequence[Point]) -> str | None:
    """One line when a measured point lies above the compute ceiling it is judged against (the point furthest
    above it): the ceiling is stale (:func:`flopcount.measure.machine.calibration.above_ceiling`); None otherwise."""
    from flopcount.measure.machine.calibration import above_ceiling

    over = [(p.flops_per_s / roofline.attained(math.inf, p.compute), p) for p in points if p.flops_per_s]
    ratio, p = max(over, key=lambda x: x[0], default=(0.0, None))
    if p is None or ratio <= 1:
        return None
    return above_ceiling(p.flops_per_s, roofline.attained(math.inf, p.compute), f"{p.label} ran",
                         "flopcount ceilings -o FILE, then --ceilings FILE")


def describe(roofline: Roofline, points: Sequence[Point]) -> str:
    """Ceilings, ridge points and every point with its attainable FLOP/s and its bound, as text."""
    from tabulate import tabulate

    from flopcount.output.render import si

    unit = "B/s"
    lines = [roofline.title, ""]
    rows = [[c.label, si(c.value, "FLOP/s")] for c in roofline.compute]
    rows += [[c.label, si(c.value, unit)] for c in roofline.bandwidth]
    lines.append(tabulate(rows, ["ceiling", "value"], tablefmt="simple", disable_numparse=True))
    top = max(roofline.compute, key=lambda c: c.value)
    lines.append("")
    for b in roofline.bandwidth:
        lines.append(f"Ridge point ({top.label} / {b.label}): {roofline.ridge(top.label, b.label):,.1f} FLOPs per byte")
    lines.append(f"Attainable and bound below: against {roofline.bandwidth[0].label} and the compute ceiling of "
                 f"each point's precision (else {top.label})")
    if points:
        rows = []
        for p in points:
            att = roofline.attained(p.intensity, p.compute)
            rows.append([p.label, f"{p.intensity:,.2f}", "-" if p.flops_per_s is None else si(p.flops_per_s, "FLOP/s"),
                         p.compute or top.label, si(att, "FLOP/s"),
                         "-" if p.flops_per_s is None else f"{100 * p.flops_per_s / att:.1f}%",
                         roofline.bound(p.intensity, p.compute)])
        lines += ["", tabulate(rows, ["point", "intensity", "measured", "ceiling", "attainable", "of attainable",
                                      "bound"], tablefmt="simple", disable_numparse=True)]
        by_bound: dict[str, int] = {}
        for p in points:
            bound = roofline.bound(p.intensity, p.compute)
            by_bound[bound] = by_bound.get(bound, 0) + 1
        lines.append("")
        lines.append("Bound: " + ", ".join(f"{k} {v}" for k, v in sorted(by_bound.items())))
        stale = stale_ceiling(roofline, points)
        lines += [f"Note: {stale}"] if stale else []
    return "\n".join(lines) + "\n"


def to_dict(roofline: Roofline, points: Sequence[Point]) -> dict[str, Any]:
    return {
        "title": roofline.title,
        "x": roofline.x_label,
        "compute": [{"label": c.label, "flops_per_s": c.value, "source": c.source} for c in roofline.compute],
        "bandwidth": [{"label": c.label, "bytes_per_s": c.value, "source": c.source} for c in roofline.bandwidth],
        "points": [{"label": p.label, "intensity": p.intensity, "flops_per_s": p.flops_per_s,
                    "compute_ceiling": p.compute or max(roofline.compute, key=lambda c: c.value).label,
                    "attainable_flops_per_s": roofline.attained(p.intensity, p.compute),
                    "bound": roofline.bound(p.intensity, p.compute)}
                   for p in points],
        "notes": [n for n in (stale_ceiling(roofline, points),) if n],
    }


# ----------------------------------------------------------------------------------------------------------------
# plots (matplotlib, imported when a plot is drawn)

PLOT_SUFFIXES = (".png", ".svg", ".pdf")


def pyplot():
    """matplotlib's pyplot on the non-interactive Agg backend; a DeviceError naming the package when absent."""
    from flopcount.errors import DeviceError

    try:
        import matplotlib
    except ImportError:
        raise DeviceError("plots need matplotlib: pip install matplotlib (or pip install \"flopcount[plot]\")") \
            from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _check_suffix(path: str) -> None:
    import os

    if os.path.splitext(path)[1].lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {path}: give a file name ending in {', '.join(PLOT_SUFFIXES)}")


def _save(fig, path: str) -> None:
    import os

    from flopcount.output.files import atomic_path

    with atomic_path(path, "plot") as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format=os.path.splitext(path)[1][1:].lower())


def plot_roofline(roofline: Roofline, points: Sequence[Point], path: str):
    """Draw ``roofline`` log-log with every ceiling labelled by its value, and ``points`` (filled: measured;
    hollow: placed at their attainable FLOP/s). Each ceiling is one Line2D whose gid is ``ceiling:<label>``.
    Returns the figure (closed after saving)."""
    from flopcount.output.render import si

    _check_suffix(path)
    plt = pyplot()
    intensities = [p.intensity for p in points]
    ridges = [roofline.ridge(c.label, b.label) for c in roofline.compute for b in roofline.bandwidth]
    lo = min([*intensities, *ridges]) / 10
    hi = max([*intensities, *ridges]) * 10
    top = max(c.value for c in roofline.compute)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.set_xscale("log")
    ax.set_yscale("log")
    for b in roofline.bandwidth:
        x_end = top / b.value
        ax.plot([lo, x_end], [b.value * lo, top], linestyle="--", color="tab:blue", gid=f"ceiling:{b.label}")
        ax.annotate(f"{b.label} {si(b.value, 'B/s')}", (lo * 1.5, b.value * lo * 1.5), fontsize=8, color="tab:blue",
                    rotation=25)
    for c in roofline.compute:
        x_start = c.value / max(b.value for b in roofline.bandwidth)
        ax.plot([x_start, hi], [c.value, c.value], color="tab:red", gid=f"ceiling:{c.label}")
        ax.annotate(f"{c.label} {si(c.value, 'FLOP/s')}", (hi / 1.5, c.value * 1.05), fontsize=8, color="tab:red",
                    ha="right", va="bottom")
    measured = [p for p in points if p.flops_per_s]
    placed = [p for p in points if not p.flops_per_s]
    if measured:
        ax.scatter([p.intensity for p in measured], [p.flops_per_s for p in measured], color="black", s=18, zorder=3,
                   gid="points:measured", label="measured")
    if placed:
        ax.scatter([p.intensity for p in placed], [roofline.attained(p.intensity, p.compute) for p in placed], s=18, zorder=3,
                   facecolors="none", edgecolors="black", gid="points:attainable", label="attainable (not measured)")
    if len(points) <= 12:
        for p in points:
            ax.annotate(p.label, (p.intensity, p.flops_per_s or roofline.attained(p.intensity, p.compute)), fontsize=7,
                        xytext=(4, -10), textcoords="offset points")
    low = min([b.value * lo for b in roofline.bandwidth] + [p.flops_per_s for p in measured])
    ax.set_xlim(lo, hi)
    ax.set_ylim(low / 2, top * 3)
    ax.set_xlabel(roofline.x_label)
    ax.set_ylabel("FLOP/s")
    ax.set_title(roofline.title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if points:
        ax.legend(loc="lower right", fontsize=8)
    _save(fig, path)
    plt.close(fig)
    return fig


def plot_op_types(report, path: str):
    """A horizontal bar chart of FLOPs by op type (log scale, largest on top), each bar labelled with its share."""
    from flopcount.output.render import si

    _check_suffix(path)
    plt = pyplot()
    items = [(k, s.cost.flops + s.backward.flops) for k, s in report.by_op_type.items()
             if s.cost.flops + s.backward.flops > 0]
    total = report.total.flops or 1
    fig, ax = plt.subplots(figsize=(7, 0.35 * max(3, len(items)) + 1.2))
    labels = [k for k, _ in items][::-1]
    values = [v for _, v in items][::-1]
    bars = ax.barh(labels, values, color="tab:blue", gid="bars")
    ax.set_xscale("log")
    for bar, v in zip(bars, values):
        ax.annotate(f"{si(v, 'FLOPs')} ({100 * v / total:.1f}%)", (v, bar.get_y() + bar.get_height() / 2),
                    xytext=(3, 0), textcoords="offset points", va="center", fontsize=8)
    if values:
        ax.set_xlim(min(values) / 2, max(values) * 20)
    ax.set_xlabel(f"FLOPs ({report.mode}, batch {report.batch}; total {si(report.total.flops, 'FLOPs')})")
    ax.set_title(f"FLOPs by operator type: {report.model.path or report.model.graph_name}", fontsize=10)
    _save(fig, path)
    plt.close(fig)
    return fig


def plot_sweep(variable: str, rows, fixed, path: str):
    """FLOPs against one dim (``rows``: (size, total, macs, forward, backward) per size), forward and backward
    beside the total when the count trains; ``fixed`` names the dims held constant."""
    _check_suffix(path)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sizes = [r[0] for r in rows]
    ax.plot(sizes, [r[1] for r in rows], marker="o", label="total", gid="total")
    if any(r[4] for r in rows):
        ax.plot(sizes, [r[3] for r in rows], marker=".", label="forward", gid="forward")
        ax.plot(sizes, [r[4] for r in rows], marker=".", label="backward", gid="backward")
        ax.legend()
    ax.set_xlabel(variable)
    ax.set_ylabel("FLOPs")
    held = ", ".join(f"{k}={v}" for k, v in fixed.items())
    ax.set_title(f"FLOPs by {variable}" + (f" ({held})" if held else ""), fontsize=10)
    ax.grid(True, alpha=0.3)
    _save(fig, path)
    plt.close(fig)
    return fig
