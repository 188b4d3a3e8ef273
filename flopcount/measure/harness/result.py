"""The run record, the benchmark report that holds runs, and the repeat-run statistics.

A run is an immutable :class:`RunResult`: every figure of the HPC AI500 metrics, ``None`` where it could not be
measured, with the reason under ``unavailable`` and how each figure was obtained under ``how``. A benchmark report
(``flopcount bench -o``, ``Meter.to_json``) is a JSON document of :data:`SCHEMA_VERSION` holding the system under
test, the configuration, every run and the summary (HPC AI500 V2.0: drop the highest and the lowest run, then the
mean and the variation std/mean of the rest).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Sequence

from flopcount.errors import MeasurementError

SCHEMA_VERSION = 1
KIND = "flopcount.bench"

#: The scores the summary aggregates over runs, each read from a run's dict by a path.
SCORES = {
    "samples_per_s": ("samples_per_s", "total"),
    "flops": ("flops",),
    "tokens_per_s": ("tokens_per_s", "total"),
    "mfu": ("mfu",),
    "vflops": ("vflops",),
    "quality": ("quality",),
    "time_to_quality_s": ("time_to_quality_s",),
    "wall_s": ("wall_s",),
    "step_time_s": ("step_time_s",),
    "energy_j": ("energy_j",),
    "flops_per_watt": ("flops_per_watt",),
    "vflops_per_watt": ("vflops_per_watt",),
}


@dataclass(frozen=True)
class RunResult:
    """One measured run. Rates are per second; ``flops`` is the HPC AI500 "FLOPS" score, FLOP/s = N × R × C."""

    samples: int  # every sample stepped, warm-up included
    steps: int
    timed_samples: int  # samples in timed (post-warm-up) windows
    timed_steps: int
    wall_s: float | None  # clock start (first batch read) to the end of training
    step_time_s: float | None  # median over timed steps
    samples_per_s: Mapping[str, Any]  # per_rank (median over windows), total, windows, min, max, variation
    flops_per_sample: float | None  # C: training FLOPs per sample, forward + backward
    flops: float | None  # FLOP/s of all ranks: Σ_r N_r × C (= N × R × C)
    ranks: int
    precision: str | None
    peak_flops: float | None  # one device
    peak_source: str | None
    mfu: float | None
    hfu: float | None
    quality: float | None
    target_quality: float | None
    quality_exponent: float | None
    vflops: float | None
    time_to_quality_s: float | None
    energy_j: float | None
    power_w: float | None
    flops_per_watt: float | None
    vflops_per_watt: float | None
    epochs: int
    flops_epoch_form: float | None  # HPC AI500 V3.0: (iterations per epoch × APC) / T_epoch
    optimizer_flops_per_step: float | None
    per_rank: tuple[Mapping[str, Any], ...] = ()
    communication: Mapping[str, Any] | None = None  # gradient all-reduce: bytes per step (measured, ring), COI
    ensemble: Mapping[str, Any] | None = None  # bagging: base models, layout, bootstrap, APC, FLOPS sum
    qualities: tuple[Mapping[str, Any], ...] = ()  # every quality() call: {t_s, value, epoch, samples}
    unavailable: Mapping[str, str] = field(default_factory=dict)
    how: Mapping[str, str] = field(default_factory=dict)
    tokens_per_s: Mapping[str, Any] | None = None  # per_rank (median over windows), total; with step(tokens=)
    flops_per_token: float | None = None  # C × samples / tokens
    notes: tuple[str, ...] = ()  # what the median hides: stalls, a run under more load than its ceiling
    complete: bool = True  # False: the run ended before its end of training (a signal, Meter.close() early)
    ended_by: str = "the end of training"  # or what ended it early: "SIGTERM", "SIGINT", an exception, close()
    parallel: Mapping[str, Any] | None = None  # under a plan: every rank's MFU/HFU, slowest rank, conventions
    prediction: Mapping[str, Any] | None = None  # machine=: the step predicted beside the measured one, the error

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["samples_per_s"] = dict(self.samples_per_s)
        out["per_rank"] = [dict(r) for r in self.per_rank]
        out["qualities"] = [dict(q) for q in self.qualities]
        out["tokens_per_s"] = None if self.tokens_per_s is None else dict(self.tokens_per_s)
        out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "RunResult":
        d = dict(d)
        d["per_rank"] = tuple(d.get("per_rank") or ())
        d["qualities"] = tuple(d.get("qualities") or ())
        d["notes"] = tuple(d.get("notes") or ())
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def _score(run: Mapping[str, Any], path: Sequence[str]) -> float | None:
    v: Any = run
    for key in path:
        if not isinstance(v, Mapping):
            return None
        v = v.get(key)
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def olympic(values: Sequence[float]) -> dict[str, Any]:
    """HPC AI500 V2.0 repeat-run statistics: with three runs or more, drop the highest and the lowest; then the
    mean and the variation (sample standard deviation / mean) of the rest.

    >>> olympic([10.0, 1.0, 4.0, 6.0, 5.0])
    {'kept': 3, 'dropped': [1.0, 10.0], 'mean': 5.0, 'variation': 0.2}
    """
    ordered = sorted(values)
    kept = ordered[1:-1] if len(ordered) >= 3 else ordered
    dropped = [ordered[0], ordered[-1]] if len(ordered) >= 3 else []
    mean = statistics.fmean(kept)
    variation = statistics.stdev(kept) / mean if len(kept) >= 2 and mean else None
    return {"kept": len(kept), "dropped": dropped, "mean": mean, "variation": variation}


def summarize(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The ``summary`` of a report: per score, the olympic mean and variation, or None with the reason."""
    mean: dict[str, float | None] = {}
    variation: dict[str, float | None] = {}
    unavailable: dict[str, str] = {}
    for name, path in SCORES.items():
        values = [_score(r, path) for r in runs]
        missing = [i for i, v in enumerate(values) if v is None]
        if missing:
            mean[name] = variation[name] = None
            reasons = {r.get("unavailable", {}).get(path[0]) for r in runs if _score(r, path) is None}
            reasons.discard(None)
            unavailable[name] = (f"null in run(s) {', '.join(map(str, missing))}"
                                 + (f": {'; '.join(sorted(reasons))}" if reasons else ""))
            continue
        stats = olympic(values)
        mean[name] = stats["mean"]
        variation[name] = stats["variation"]
        if stats["variation"] is None:
            unavailable[f"variation.{name}"] = "fewer than two runs kept"
    kept = len(runs) - 2 if len(runs) >= 3 else len(runs)
    return {"runs": len(runs), "kept_runs": kept,
            "rule": "HPC AI500 V2.0: with 3 runs or more the highest and the lowest of each score are dropped; "
                    "mean and variation (sample std / mean) of the rest",
            "mean": mean, "variation": variation, "unavailable": unavailable}


def bench_report(runs: Sequence[RunResult | Mapping[str, Any]], system: Mapping[str, Any],
                 config: Mapping[str, Any], interrupted: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The report document: ``schema_version``, ``kind``, ``tool``, ``system``, ``config``, ``runs``, ``summary``,
    ``complete`` (every run ran to its end and none is missing) and ``interrupted`` (None, or what ended the
    command early: the signal, the run it cut, the steps and windows it had done)."""
    from flopcount.version import __version__

    dicts = [r.as_dict() if isinstance(r, RunResult) else dict(r) for r in runs]
    complete = interrupted is None and all(d.get("complete", True) for d in dicts) and bool(dicts)
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "tool": {"name": "flopcount", "version": __version__},
            "complete": complete, "interrupted": dict(interrupted) if interrupted is not None else None,
            "system": dict(system), "config": dict(config), "runs": dicts,
            "summary": summarize(dicts) if dicts else None}


def _finite(obj: Any) -> Any:
    """JSON has no NaN or infinity: such a float becomes None (a figure that could not be formed)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def dumps(report: Mapping[str, Any]) -> str:
    return json.dumps(_finite(report), indent=2, default=str) + "\n"


def load(path: str) -> dict[str, Any]:
    """Read a benchmark report, checking its kind and schema version."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise MeasurementError(f"{path}: cannot read the run report ({e.strerror})") from None
    except ValueError as e:
        raise MeasurementError(f"{path}: not a JSON run report ({e})") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise MeasurementError(f"{path}: not a flopcount bench report (no \"kind\": \"{KIND}\"); write one with "
                               "flopcount bench -o FILE or Meter.to_json(FILE)")
    if doc.get("schema_version") != SCHEMA_VERSION:
        raise MeasurementError(f"{path}: bench report schema version {doc.get('schema_version')!r}; this flopcount "
                               f"reads version {SCHEMA_VERSION}")
    return doc


#: Range checks of a run's figures read back from a report: name → (test, the range in words). A figure may be
#: null (not measured, its reason under ``unavailable``), never outside its range.
_RANGES = {
    "samples": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "steps": (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    "ranks": (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    "flops": (lambda v: _is_real(v) and v > 0, "a finite number > 0"),
    "flops_per_sample": (lambda v: _is_real(v) and v > 0, "a finite number > 0"),
    "peak_flops": (lambda v: _is_real(v) and v > 0, "a finite number > 0"),
    "mfu": (lambda v: _is_real(v) and v >= 0, "a finite number >= 0"),
    "quality": (lambda v: _is_real(v), "a finite number"),
    "target_quality": (lambda v: _is_real(v), "a finite number"),
    "quality_exponent": (lambda v: _is_real(v) and v >= 1, "a finite number >= 1 (HPC AI500's n)"),
    "wall_s": (lambda v: _is_real(v) and v >= 0, "a finite number of seconds >= 0"),
}
_PRECISIONS = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_run_record(run: Mapping[str, Any], where: str) -> None:
    """Refuse a run read back from a report (``flopcount roofline --run``) whose figures are out of range, with the
    checks the meter applies to its arguments: a :class:`MeasurementError` naming the file, the run, the figure,
    its range and its value. ``precision`` is one dtype or ``conv X, matmul Y`` of those the meter knows."""
    for name, (ok, allowed) in _RANGES.items():
        value = run.get(name)
        if value is not None and not ok(value):
            raise MeasurementError(f"{where}: '{name}' must be {allowed} (or null when not measured), got "
                                   f"{value!r}; rewrite the report with flopcount bench -o FILE or meter.to_json")
    rate = (run.get("samples_per_s") or {}).get("total") if isinstance(run.get("samples_per_s"), dict) else None
    if rate is not None and not (_is_real(rate) and rate > 0):
        raise MeasurementError(f"{where}: 'samples_per_s.total' must be a finite number > 0 (or null), got {rate!r}")
    precision = run.get("precision")
    if precision is not None:
        dtypes = [p.split()[-1] for p in str(precision).split(", ")] if isinstance(precision, str) else [None]
        if not all(d in _PRECISIONS for d in dtypes):
            raise MeasurementError(f"{where}: 'precision' must be one of {', '.join(_PRECISIONS)} (or 'conv X, "
                                   f"matmul Y'), got {precision!r}")
