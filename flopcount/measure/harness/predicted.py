"""The prediction of a metered run beside its measurement (``Meter(machine=PROFILE)``, ``flopcount bench
--machine PROFILE``): the step time :func:`flopcount.measure.predict.predict` gives for the meter's count (under its
plan, as the per-rank ledger splits it) on the machine profile, the measured step (the slowest rank's median: the
ranks of a synchronous step end together) and the relative error predicted / measured − 1. The rules are
docs/predict.md's ("Measured beside predicted").

Two checks meet the measurement and the profile here: a profile taken on another device, CPU, core count, torch,
thread count or rank count gives one warning line naming the difference
(:func:`flopcount.measure.machine.calibration.differences`), and a rank that ran its FLOPs faster than the
profile's peak shows a stale profile (:func:`flopcount.measure.machine.calibration.above_ceiling`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from flopcount.errors import UsageError

__all__ = ["predicted_beside"]

log = logging.getLogger(__name__)


def _threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return torch.get_num_threads()


def _planned(report: Any, plan: Any, recompute: Any) -> Any:
    """``report`` with its per-rank ledger under ``plan`` (None: one rank, the count as it is)."""
    if plan is None:
        return report
    from flopcount.plans import parallel_ledger

    return dataclasses.replace(report, parallel=parallel_ledger(report, plan, recompute))


def predicted_beside(report: Any, plan: Any, recompute: Any, profile: Any, per_rank: Sequence[Mapping[str, Any]],
                     device: str = "cpu") -> dict[str, Any]:
    """The run's ``prediction`` figures: the predicted and measured step, their relative error, the prediction
    itself, and the notes (a profile from elsewhere, a stale profile); ``predicted_step_s`` None with ``why`` when
    the count cannot be predicted (a plan the per-rank ledger does not split, a count of no training step).
    ``device``: where the run ran (compared with the profile's, with this machine and torch's threads)."""
    from ..machine.calibration import above_ceiling, differences, this_machine
    from ..predict import predict_work, work_of

    here = this_machine(_threads(), device)

    times = {r["rank"]: r.get("step_time_s") for r in per_rank}
    measured = max((t for t in times.values() if t is not None), default=None)
    out: dict[str, Any] = {"measured_step_s": measured, "predicted_step_s": None, "relative_error": None,
                           "notes": []}
    try:
        work = work_of(_planned(report, plan, recompute))
    except UsageError as e:
        out["why"] = f"not predicted: {e}"
        return out
    pred = predict_work(work, profile)
    out.update(predicted_step_s=pred.step_seconds, interval=list(pred.interval), prediction=pred.as_dict())
    if measured:
        out["relative_error"] = pred.step_seconds / measured - 1
    else:
        out["why"] = "no timed step: the measurement to compare with is missing"
    diff = differences(profile, here, len(work.ranks))
    for r in work.ranks:
        t = times.get(r.rank)
        stale = above_ceiling(r.hardware_flops / t, profile.peak_flops_per_s, f"rank {r.rank} ran") if t else None
        if stale:
            out["notes"].append(stale)
            break
    for line in filter(None, (diff, *out["notes"])):
        log.warning("%s", line)
    if diff:
        out["notes"].insert(0, diff)
    return out
