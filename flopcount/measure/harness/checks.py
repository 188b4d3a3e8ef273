"""The harness's argument checks, applied where a value enters: :class:`~.meter.Meter`, ``step``, ``quality``, the
framework callbacks, and a run report read back (``flopcount roofline --run``).

Each check returns the value (as the type the meter keeps) or raises a :class:`~flopcount.errors.UsageError` that
names the argument, the allowed range and what was given. Booleans are refused where a number is meant (``True`` is
an ``int`` to Python, never a count of samples).

The quality exponent n of VFLOPS = FLOPS × (achieved / target)^n: HPC AI500 V2.0 (Jiang et al., "HPC AI500 V2.0:
The Methodology, Tools, and Metrics for Benchmarking HPC AI Systems", IEEE CLUSTER 2021, arXiv:2007.00279) defines n
as a positive integer that sets how strongly quality below the target is penalised (n = 5 for image
classification, n = 10 for extreme weather analytics): n < 1 would let a run far below its target score close to
its raw FLOPS, and a negative n would reward missing the target.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, replace
from typing import Any

from flopcount.errors import UsageError

from .mfu import PRECISIONS

__all__ = ["MeterArguments", "checked_clock", "finite", "is_number", "meter_arguments", "meter_machine", "meter_source",
           "nonneg_int", "positive_finite", "positive_int", "quality_exponent", "samples"]


def is_number(value: Any) -> bool:
    """A real number: an int or float, a numpy scalar or a one-element tensor (``float()`` reads it); never a bool
    or a string."""
    if isinstance(value, (bool, str, bytes)):
        return False
    try:
        float(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


def _integral(value: Any) -> bool:
    """An integer: an int, a numpy integer or an integer tensor of one element (``operator.index`` reads it)."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except (TypeError, ValueError, RuntimeError):
        return False
    return True


def positive_int(where: str, name: str, value: Any) -> int:
    """An integer >= 1."""
    if not _integral(value) or operator.index(value) < 1:
        raise UsageError(f"{where}: {name} must be a positive integer (>= 1), got {value!r}")
    return operator.index(value)


def nonneg_int(where: str, name: str, value: Any) -> int:
    """An integer >= 0."""
    if not _integral(value) or operator.index(value) < 0:
        raise UsageError(f"{where}: {name} must be an integer >= 0, got {value!r}")
    return operator.index(value)


def samples(where: str, value: Any, name: str = "samples") -> int:
    """Samples (or tokens) in one step: an integer >= 1 (a step that trains on nothing is not a step)."""
    if not _integral(value) or operator.index(value) < 1:
        raise UsageError(f"{where}: {name} must be a positive integer (>= 1), the {name} this step trains on "
                         f"(e.g. len(x)), got {value!r}")
    return operator.index(value)


def finite(where: str, name: str, value: Any) -> float:
    """A finite real number (no NaN, no infinity)."""
    if not is_number(value) or not math.isfinite(float(value)):
        raise UsageError(f"{where}: {name} must be a finite number, got {value!r}")
    return float(value)


def positive_finite(where: str, name: str, value: Any) -> float:
    """A finite number > 0."""
    if not is_number(value) or not math.isfinite(float(value)) or float(value) <= 0:
        raise UsageError(f"{where}: {name} must be a finite number > 0, got {value!r}")
    return float(value)


def quality_exponent(where: str, value: Any) -> float:
    """HPC AI500's n: a finite number >= 1 (the benchmark's own values are 5 and 10)."""
    if not is_number(value) or not math.isfinite(float(value)) or float(value) < 1:
        raise UsageError(f"{where}: quality_exponent must be a finite number >= 1 (HPC AI500 V2.0's n, a positive "
                         f"integer: 5 for image classification, 10 for extreme weather), got {value!r}")
    return float(value)


def checked_clock(where: str, clock: Any) -> Any:
    """``clock`` (a zero-argument callable in seconds) wrapped so that each reading is checked: a reading that is
    not a real number, not finite, or earlier than the one before is a :class:`UsageError` naming the clock and the
    readings, at the reading (a rate from it would be negative, NaN or meaningless)."""
    last: list[float] = []

    def read() -> float:
        value = clock()
        if not is_number(value):
            raise UsageError(f"{where}: clock() must return seconds as a real number, got {value!r} "
                             f"({type(value).__name__})")
        seconds = float(value)
        if not math.isfinite(seconds):
            raise UsageError(f"{where}: clock() returned {seconds}, not a finite number of seconds")
        if last and seconds < last[0]:
            raise UsageError(f"{where}: clock() went backwards, from {last[0]!r} to {seconds!r} s; give a monotonic "
                             "clock (time.perf_counter)")
        last[:] = [seconds]
        return seconds

    return read


def meter_source(report: Any, flops_per_sample: Any, model: Any, example_inputs: Any) -> None:
    """Where :class:`~.meter.Meter` learns C: exactly one of ``report`` (a :class:`~flopcount.reporting.report.Report`
    of a training step), ``flops_per_sample``, or ``model`` with ``example_inputs``; a :class:`UsageError` otherwise."""
    sources = [name for name, v in (("report", report), ("flops_per_sample", flops_per_sample),
                                    ("model", model)) if v is not None]
    if len(sources) != 1:
        raise UsageError("Meter needs exactly one of report=, flops_per_sample= or model= (with example_inputs=) "
                         f"to know the training FLOPs per sample; got {', '.join(sources) or 'none'}")
    from flopcount.reporting.report import Report

    if report is not None and not isinstance(report, Report):
        raise UsageError(f"Meter: report must be a flopcount.Report (from flopcount.count or from_torch with "
                         f"mode=\"train\"), got {type(report).__name__} {report!r:.60}")
    if report is not None and getattr(report, "mode", "train") != "train":
        raise UsageError("Meter: the report counts inference only; count the model with mode=\"train\" (forward "
                         "and backward), e.g. flopcount.from_torch(model, inputs, mode=\"train\")")
    if model is not None and example_inputs is None:
        raise UsageError("Meter(model=...) needs example_inputs= (a tensor, a shape or a tuple of them) to count it")


def meter_machine(machine: Any, report: Any, model: Any):
    """``machine=`` of the meter: None, a :class:`~flopcount.measure.machine.calibration.MachineProfile`, or the path
    of one, read now (a damaged or foreign file: a MeasurementError, exit 12, before any training); it needs a
    counted model (``report=`` or ``model=``) to predict."""
    import os

    from ..machine.calibration import MachineProfile, load_profile

    if machine is None:
        return None
    if report is None and model is None:
        raise UsageError("Meter: machine= needs a counted model (report= or model=) to predict its step")
    if isinstance(machine, MachineProfile):
        return machine
    if isinstance(machine, (str, os.PathLike)):
        return load_profile(os.fspath(machine))
    raise UsageError(f"Meter: machine={machine!r}: expected the path of a machine profile (flopcount calibrate -o "
                     "FILE) or a MachineProfile")


@dataclass(frozen=True)
class MeterArguments:
    """The :class:`Meter` arguments :func:`check_arguments` checks, as they were given (of any type: refusing the
    wrong ones is :func:`meter_arguments`' job), with the meter's defaults."""

    flops_per_sample: Any = None
    target_quality: Any = None
    quality_exponent: Any = None
    higher_is_better: Any = True
    precision: Any = None
    peak_flops: Any = None
    recompute: Any = None
    warmup_steps: Any = 5
    window_steps: Any = 20
    energy: Any = True
    clock: Any = None


def meter_arguments(where: str, given: MeterArguments) -> MeterArguments:
    """The meter's arguments checked (a :class:`UsageError` naming the argument and its allowed range) and
    normalised; ``where`` names the caller (``Meter``, a framework callback) in the message."""
    flops_per_sample, target_quality, exponent = given.flops_per_sample, given.target_quality, given.quality_exponent
    higher_is_better, peak_flops = given.higher_is_better, given.peak_flops
    if flops_per_sample is not None:
        flops_per_sample = positive_finite(where, "flops_per_sample", flops_per_sample)
    warmup_steps = nonneg_int(where, "warmup_steps", given.warmup_steps)
    window_steps = positive_int(where, "window_steps", given.window_steps)
    if target_quality is not None and exponent is None:
        raise UsageError(f"{where}: target_quality needs quality_exponent (HPC AI500: 5 for image classification, "
                         "10 for extreme weather analytics)")
    if target_quality is not None:
        target_quality = finite(where, "target_quality", target_quality)
        if higher_is_better and target_quality <= 0:
            raise UsageError(f"{where}: target_quality must be > 0 for a quality where higher is better (VFLOPS "
                             f"divides by it), got {target_quality!r}")
    if exponent is not None:
        exponent = quality_exponent(where, exponent)
    if not isinstance(higher_is_better, bool):
        raise UsageError(f"{where}: higher_is_better must be True or False, got {higher_is_better!r}")
    if peak_flops is not None:
        peak_flops = positive_finite(where, "peak_flops", peak_flops)
    if given.precision is not None and given.precision not in PRECISIONS:
        raise UsageError(f"{where}: precision must be one of {', '.join(PRECISIONS)}, got {given.precision!r}")
    recompute = _checked_recompute(where, given.recompute)
    if not isinstance(given.energy, bool):
        raise UsageError(f"{where}: energy must be True or False, got {given.energy!r}")
    if given.clock is not None and not callable(given.clock):
        raise UsageError(f"{where}: clock must be a zero-argument callable returning seconds, got {given.clock!r}")
    return replace(given, flops_per_sample=flops_per_sample, target_quality=target_quality,
                   quality_exponent=exponent, peak_flops=peak_flops, recompute=recompute,
                   warmup_steps=warmup_steps, window_steps=window_steps)


def _checked_recompute(where: str, recompute: Any) -> Any:
    """``recompute`` as the meter takes it: None, "none", "full" or FLOPs per sample (a float)."""
    if isinstance(recompute, str):
        if recompute not in ("none", "full"):
            raise UsageError(f"{where}: recompute={recompute!r}: expected 'none', 'full' or FLOPs per sample")
    elif recompute is not None:
        if not is_number(recompute) or not math.isfinite(float(recompute)) or float(recompute) < 0:
            raise UsageError(f"{where}: recompute must be 'none', 'full' or a finite number of FLOPs per sample "
                             f">= 0, got {recompute!r}")
        recompute = float(recompute)
    return recompute
