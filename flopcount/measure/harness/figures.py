"""A run's figures as a pure function of plain numbers: :func:`run_figures` of a frozen :class:`RunSnapshot`.

The :class:`~flopcount.measure.harness.meter.Meter` does what needs the framework and the machine (timing the steps,
counting the model, looking up or calibrating the peak, gathering the ranks, asking attached scale-out objects for
their figures) and hands the outcome over as a snapshot; everything after that is arithmetic here, testable
without a training loop, a device or torch:

* ``samples_per_s`` per rank: the median over timed windows of samples / window span; total: the sum over ranks;
  end_to_end: every rank's samples / wall time. ``samples`` is the total over ranks (each rank's under per_rank)
* ``tokens_per_s`` and ``flops_per_token`` = C × samples / tokens when the steps gave ``tokens=``
* ``notes``: stalls the median hides (window rates apart by more than 2×, end to end below half the median) and a
  run measured under more load than its CPU ceiling
* ``flops`` = Σ_r N_r × C (HPC AI500's N × R × C); ``mfu`` = flops / (R × peak); ``hfu`` = mfu × (C + recomputed) / C
* ``vflops`` = flops × (achieved / target)^n; ``time_to_quality_s`` the first quality at or past the target
* ``energy_j`` and ``power_w`` over the windows long enough for the counter; FLOPS per watt
* ``flops_epoch_form`` (HPC AI500 V3.0) = mean over timed epochs of samples × C / seconds, times the ranks

Every figure that cannot be formed is None, with its reason under ``unavailable``; ``how`` says how each was formed.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from .result import RunResult

__all__ = ["RunSnapshot", "Window", "local_figures", "run_figures"]


@dataclass(frozen=True, slots=True)
class Window:
    """One timed window of steps: its steps and samples, its span (first step start to last step end, seconds),
    each step's duration, and the energy read over it (joules over ``energy_s`` seconds; None without a counter)."""

    steps: int
    samples: int
    span: float
    durations: tuple[float, ...]
    energy_j: float | None = None
    energy_s: float | None = None
    tokens: int | None = None  # tokens in the window's steps when ``step(tokens=)`` was given


@dataclass(frozen=True)
class RunSnapshot:
    """Everything a run's figures are formed from, as plain numbers (seconds, samples, FLOPs, joules).

    ``windows`` are this rank's timed windows; ``per_rank`` every rank's :func:`local_figures` (one entry without
    torch.distributed); ``epochs`` (iterations, samples, seconds) of every timed epoch; ``qualities`` every
    ``quality()`` point (``t_s``, ``value``, ``epoch``, ``samples``). ``flops_per_sample`` is C, the training FLOPs
    per sample; ``forward_flops_per_sample`` the forward pass alone (None without a counting report). ``peak_flops``
    is one device's peak for the run's precision (None, with ``peak_source`` saying why, when unknown).
    ``communication`` and ``ensemble`` are the figures of the attached scale-out objects (None when none is), and
    ``communication_attached`` whether a communication counter was attached at all."""

    samples: int
    steps: int
    warmup_steps: int
    timer_kind: str
    start_how: str
    wall_s: float | None
    windows: tuple[Window, ...]
    per_rank: tuple[Mapping[str, Any], ...]
    epochs: tuple[tuple[int, int, float], ...]
    qualities: tuple[Mapping[str, Any], ...]
    time_to_quality_s: float | None
    target_quality: float | None
    quality_exponent: float | None
    higher_is_better: bool
    flops_per_sample: float | None
    flops_per_sample_how: str
    forward_flops_per_sample: float | None
    optimizer_flops_per_step: float | None
    precision: str | None
    precision_how: str
    peak_flops: float | None
    peak_source: str | None
    recompute: str | float | None
    energy_kind: str
    energy_reason: str
    energy_min_window_s: float
    communication: Mapping[str, Any] | None = None
    communication_attached: bool = False
    ensemble: Mapping[str, Any] | None = None
    load_per_core: float | None = None  # the machine's 1-minute load per core when the run ended (None: unknown)
    peak_load_per_core: float | None = None  # the same when the measured peak (a CPU ceiling) was measured
    recompute_flops_per_sample: float | None = None  # recompute="full" as the ledger reruns it (None: not known)
    ended_by: str | None = None  # None: training ran to its end; else what ended it early ("SIGTERM" ...)
    parallel: Mapping[str, Any] | None = None  # MFU per rank under a plan (.rank_mfu.rank_figures)
    parallel_given: bool = False  # whether the meter was given a plan
    prediction: Mapping[str, Any] | None = None  # the step predicted on machine= beside the measured one
    machine_given: bool = False  # whether the meter was given a machine profile


def _window_rates(windows: tuple[Window, ...] | list[Window]) -> list[float]:
    return [w.samples / w.span for w in windows if w.span > 0]


def _token_rates(windows) -> list[float]:
    return [w.tokens / w.span for w in windows if w.span > 0 and w.tokens is not None]


#: Window rates varying more than this (max / min) are reported as stalls.
STALL_SPREAD = 2.0
#: End-to-end throughput below this share of the median over windows is reported as time lost between windows.
END_TO_END_SHARE = 0.5


def local_figures(windows, samples: int, steps: int) -> dict[str, Any]:
    """What one rank shares with the others: its median samples/s (and tokens/s) over windows, its median step
    time, and its counts: samples and steps stepped, samples in timed windows."""
    rates = _window_rates(windows)
    durations = [d for w in windows for d in w.durations]
    tokens = _token_rates(windows)
    out = {"samples_per_s": statistics.median(rates) if rates else None,
           "step_time_s": statistics.median(durations) if durations else None,
           "samples": samples, "steps": steps, "timed_samples": sum(w.samples for w in windows)}
    if tokens:
        out["tokens_per_s"] = statistics.median(tokens)
    return out


def _total(per_rank, key: str) -> Any:
    """The sum over ranks of ``key`` (None when a rank lacks it)."""
    values = [r.get(key) for r in per_rank]
    return sum(values) if values and all(v is not None for v in values) else None


def _throughput(s: RunSnapshot, unavailable: dict, how: dict) -> tuple[dict[str, Any], float | None]:
    """``samples_per_s`` (this rank, all ranks, spread over windows) and FLOPS = Σ_r N_r × C."""
    rates = _window_rates(s.windows)
    local = local_figures(s.windows, s.samples, s.steps)
    if not rates:
        why = (f"no timed window: {s.steps} steps ran, all within the {s.warmup_steps} warm-up steps; "
               "run more steps or lower warmup_steps")
        unavailable["samples_per_s"] = unavailable["step_time_s"] = why
    rank_rates = [r["samples_per_s"] for r in s.per_rank]
    total_rate = sum(rank_rates) if all(r is not None for r in rank_rates) else None
    samples_per_s = {
        "per_rank": local["samples_per_s"], "total": total_rate, "windows": len(rates),
        "min": min(rates) if rates else None, "max": max(rates) if rates else None,
        "variation": (statistics.pstdev(rates) / statistics.fmean(rates)) if len(rates) >= 2 else None,
    }
    total_samples = _total(s.per_rank, "samples")
    end_to_end = total_samples / s.wall_s if total_samples is not None and s.wall_s else None
    samples_per_s["end_to_end"] = end_to_end
    how["samples_per_s"] = ("per rank: median over windows of samples / window span (first step start to last "
                            "step end); total: sum over ranks; end_to_end: every rank's samples (warm-up and "
                            "evaluation included) / wall time")
    if len(s.per_rank) > 1:
        slow = min((r for r in rank_rates if r is not None), default=None)
        samples_per_s["slowest_rank"] = slow
        samples_per_s["imbalance"] = (max(rank_rates) / slow - 1) if slow else None
    C = s.flops_per_sample
    flops = total_rate * C if total_rate is not None and C is not None else None
    if flops is None:
        unavailable["flops"] = unavailable.get("samples_per_s", "no FLOPs per sample")
    how["flops"] = "FLOPS = sum over ranks of N_r x C (N x R x C), C the training FLOPs per sample"
    return samples_per_s, flops


def _tokens(s: RunSnapshot, unavailable: dict, how: dict) -> tuple[dict[str, Any] | None, float | None]:
    """tokens/s (this rank's median over windows, the sum over ranks) and FLOPs per token = C × samples / tokens
    over the timed windows, as torchtitan and Megatron report them."""
    windows = [w for w in s.windows if w.tokens is not None]
    if not windows:
        unavailable["tokens_per_s"] = unavailable["flops_per_token"] = (
            "no tokens given: pass step(samples=..., tokens=...) for a language model")
        return None, None
    rates = [r.get("tokens_per_s") for r in s.per_rank]
    tokens_per_s = {"per_rank": statistics.median(_token_rates(windows)),
                    "total": sum(rates) if all(r is not None for r in rates) else None}
    how["tokens_per_s"] = "per rank: median over windows of tokens / window span; total: sum over ranks"
    n_samples, n_tokens = sum(w.samples for w in windows), sum(w.tokens for w in windows)
    if s.flops_per_sample is None or not n_tokens:
        unavailable["flops_per_token"] = "no FLOPs per sample" if s.flops_per_sample is None else "no tokens stepped"
        return tokens_per_s, None
    how["flops_per_token"] = "C x samples / tokens over the timed windows (C the training FLOPs per sample)"
    return tokens_per_s, s.flops_per_sample * n_samples / n_tokens


def _notes(s: RunSnapshot, samples_per_s: Mapping[str, Any]) -> tuple[str, ...]:
    """What the median hides: stalls (window rates apart by more than :data:`STALL_SPREAD`, or end-to-end
    throughput below :data:`END_TO_END_SHARE` of the median), a run measured under more load than its peak, and a
    rank faster than its measured peak (a stale ceiling: :func:`~flopcount.measure.machine.calibration.above_ceiling`)."""
    notes = []
    lo, hi, median = samples_per_s.get("min"), samples_per_s.get("max"), samples_per_s.get("per_rank")
    if lo and hi and hi / lo > STALL_SPREAD:
        notes.append(f"stalls: window rates range {lo:.4g}..{hi:.4g} samples/s ({hi / lo:.1f}x, more than "
                     f"{STALL_SPREAD:g}x); the median {median:.4g} hides the slow windows")
    total, e2e = samples_per_s.get("total"), samples_per_s.get("end_to_end")
    if total and e2e is not None and e2e < END_TO_END_SHARE * total:
        notes.append(f"stalls: end to end {e2e:.4g} samples/s is below {END_TO_END_SHARE:.0%} of the median over "
                     f"windows ({total:.4g}): time outside the timed windows (warm-up, evaluation, input waits "
                     "between windows) dominates the run")
    if (s.load_per_core is not None and s.peak_load_per_core is not None
            and s.load_per_core > s.peak_load_per_core + 0.25):
        notes.append(f"load: the run's rate was measured at a load of {s.load_per_core:.2f} per core, its peak (the "
                     f"measured ceiling) at {s.peak_load_per_core:.2f}: other work shared the machine during the "
                     "run, so MFU understates what the run would reach alone")
    rate = median * s.flops_per_sample if median and s.flops_per_sample else None
    if rate and s.peak_flops and s.peak_load_per_core is not None:  # a measured ceiling, not a datasheet's
        from ..machine.calibration import above_ceiling

        notes += [n for n in (above_ceiling(rate, s.peak_flops, "a rank ran", "FLOPCOUNT_CACHE=0 measures a fresh "
                                            "one, the cached one stays until beaten; or give peak_flops="),) if n]
    return tuple(notes)


def _utilisation(s: RunSnapshot, flops: float | None, unavailable: dict, how: dict) -> tuple[float | None, ...]:
    """MFU = FLOPS / (R × peak of one device); HFU = MFU × (C + recomputed FLOPs per sample) / C."""
    ranks, C = len(s.per_rank), s.flops_per_sample
    how["precision"] = s.precision_how
    mfu = flops / (ranks * s.peak_flops) if flops is not None and s.peak_flops else None
    if s.peak_flops is None:
        unavailable["peak_flops"] = unavailable["mfu"] = s.peak_source
    elif mfu is None:
        unavailable["mfu"] = unavailable["flops"]
    how["mfu"] = f"FLOPS / (R x peak of one device); peak: {s.peak_source}"
    hfu = None
    if s.recompute is None:
        unavailable["hfu"] = "what the run recomputes is not known: give recompute='none', 'full' or FLOPs per sample"
    elif mfu is not None and C:
        exact = s.recompute == "full" and s.recompute_flops_per_sample is not None
        extra = (0 if s.recompute == "none" else s.recompute_flops_per_sample if exact
                 else s.forward_flops_per_sample if s.recompute == "full" else float(s.recompute))
        if extra is None:
            unavailable["hfu"] = "recompute='full' needs a counting report (the forward FLOPs)"
        else:
            hfu = mfu * (C + extra) / C
            how["hfu"] = f"MFU x (C + recomputed FLOPs per sample) / C, recompute={s.recompute!r}" + (
                ": the ledger's rerun of each layer's whole forward (Megatron's full recompute, torch's reentrant "
                "checkpoint)"
                if exact else ": one extra forward per sample (PaLM's convention, Chowdhery et al. 2022, appendix B)"
                if s.recompute == "full" else "")
    else:
        unavailable["hfu"] = unavailable.get("mfu", "no MFU")
    return mfu, hfu


def last_quality(qualities) -> float | None:
    """The last quality recorded, None before any."""
    return qualities[-1]["value"] if qualities else None


def _quality(s: RunSnapshot, flops: float | None, unavailable: dict, how: dict) -> tuple[float | None, ...]:
    """The last quality, VFLOPS = FLOPS × (achieved / target)^n, and the time-to-quality's reason when absent."""
    q = last_quality(s.qualities)
    if q is None:
        unavailable["quality"] = "meter.quality() was never called (no evaluation, or synthetic data)"
    vflops = None
    if flops is not None and q is not None and s.target_quality:
        ratio = q / s.target_quality if s.higher_is_better else s.target_quality / q if q else None
        if ratio is not None:
            vflops = flops * ratio ** s.quality_exponent
            how["vflops"] = f"FLOPS x (achieved / target)^{s.quality_exponent:g}, achieved = the last quality"
    if vflops is None:
        unavailable["vflops"] = ("no target quality" if not s.target_quality else
                                 unavailable.get("quality") or unavailable.get("flops", "no FLOPS"))
    if s.time_to_quality_s is None:
        unavailable["time_to_quality_s"] = ("no target quality" if s.target_quality is None else
                                            f"the target {s.target_quality:g} was not reached"
                                            if s.qualities else unavailable["quality"])
    else:
        how["time_to_quality_s"] = "host clock from the clock start to the first quality at or past the target"
    return q, vflops


def _energy(s: RunSnapshot, unavailable: dict, how: dict) -> tuple[float | None, float | None]:
    """Joules and watts over the timed windows long enough for the energy counter to resolve."""
    if s.energy_kind == "unavailable":
        for k in ("energy_j", "power_w"):
            unavailable[k] = s.energy_reason
        return None, None
    usable = [w for w in s.windows
              if w.energy_j is not None and w.energy_s and w.energy_s >= s.energy_min_window_s]
    if not usable:
        why = (f"no timed window lasted {s.energy_min_window_s:g} s, the shortest the {s.energy_kind} counter "
               "resolves (it updates about every 100 ms); raise window_steps")
        unavailable["energy_j"] = unavailable["power_w"] = why
        return None, None
    joules = sum(w.energy_j for w in usable)
    seconds = sum(w.energy_s for w in usable)
    how["energy_j"] = (f"measured: {s.energy_kind} energy counter read before and after {len(usable)} of "
                       f"{len(s.windows)} timed windows ({seconds:.1f} s); this rank's device")
    how["power_w"] = "measured: energy / duration of those windows"
    return joules, joules / seconds


def _epoch_form(s: RunSnapshot, unavailable: dict, how: dict) -> float | None:
    """HPC AI500 V3.0: (iterations per epoch × APC) / T_epoch, APC = batch × C, mean over timed epochs, × ranks."""
    full = [e for e in s.epochs if e[2] > 0 and e[0] > 0]
    if full and s.flops_per_sample is not None:
        how["flops_epoch_form"] = ("HPC AI500 V3.0: (iterations per epoch x APC) / T_epoch, APC = batch x C, "
                                   f"mean over {len(full)} timed epochs (host clock, each ended by a sync), "
                                   "times the ranks")
        return statistics.fmean(n * s.flops_per_sample / seconds for _, n, seconds in full) * len(s.per_rank)
    unavailable["flops_epoch_form"] = ("no whole epoch was timed (iterate with meter.loader() or call "
                                       "meter.epoch_end())" if not full else "no FLOPs per sample")
    return None


def run_figures(s: RunSnapshot) -> RunResult:
    """The run's :class:`RunResult`, formed from ``s`` alone."""
    unavailable: dict[str, str] = {}
    how: dict[str, str] = {"wall_s": f"host clock {s.start_how or '(no step ran)'} to the end of training",
                           "step_time_s": f"median step duration, {s.timer_kind} timer, after "
                           f"{s.warmup_steps} warm-up steps",
                           "flops_per_sample": s.flops_per_sample_how}
    if s.optimizer_flops_per_step is None:
        unavailable["optimizer_flops_per_step"] = "not counted (count with optimizer= to report it)"
    ranks = len(s.per_rank)
    samples_per_s, flops = _throughput(s, unavailable, how)
    tokens_per_s, flops_per_token = _tokens(s, unavailable, how)
    total_samples = _total(s.per_rank, "samples")
    timed_total = _total(s.per_rank, "timed_samples")
    if ranks > 1:
        how["samples"] = "total over ranks (each rank's count under per_rank)"
    mfu, hfu = _utilisation(s, flops, unavailable, how)
    q, vflops = _quality(s, flops, unavailable, how)
    energy_j, power_w = _energy(s, unavailable, how)
    fpw = flops / power_w if flops is not None and power_w else None
    vfpw = vflops / power_w if vflops is not None and power_w else None
    if fpw is None:
        unavailable["flops_per_watt"] = unavailable.get("power_w", unavailable.get("flops", ""))
    if vfpw is None:
        unavailable["vflops_per_watt"] = unavailable.get("power_w") or unavailable.get("vflops", "")
    epoch_form = _epoch_form(s, unavailable, how)
    if not s.communication_attached:
        unavailable["communication"] = ("one rank: nothing is communicated" if ranks == 1 else
                                        "not measured: no communication hook was attached to this run's model")
    if s.wall_s is None:
        unavailable["wall_s"] = "no step ran"
    if s.ensemble is None:
        unavailable["ensemble"] = "one model trained (no bagging ensemble)"
    if s.communication is not None:
        unavailable.pop("communication", None)
    if s.parallel is None:
        unavailable["parallel"] = ("the run ended early: the ranks' step times were not gathered" if s.parallel_given
                                   else "no parallel plan given (Meter(plan=), flopcount bench --parallel)")
    if s.prediction is None:
        unavailable["prediction"] = ("the run ended early: the ranks' step times were not gathered" if s.machine_given
                                     else "no machine profile given (Meter(machine=), flopcount bench --machine)")
    elif s.prediction.get("why"):
        unavailable["prediction"] = s.prediction["why"]
    return RunResult(
        samples=total_samples if total_samples is not None else s.samples, steps=s.steps,
        timed_samples=timed_total if timed_total is not None else sum(w.samples for w in s.windows),
        timed_steps=sum(w.steps for w in s.windows), wall_s=s.wall_s,
        step_time_s=local_figures(s.windows, s.samples, s.steps)["step_time_s"], samples_per_s=samples_per_s,
        flops_per_sample=s.flops_per_sample, flops=flops, ranks=ranks, precision=s.precision,
        peak_flops=s.peak_flops, peak_source=s.peak_source, mfu=mfu, hfu=hfu, quality=q,
        target_quality=s.target_quality, quality_exponent=s.quality_exponent, vflops=vflops,
        time_to_quality_s=s.time_to_quality_s, energy_j=energy_j, power_w=power_w, flops_per_watt=fpw,
        vflops_per_watt=vfpw, epochs=len(s.epochs), flops_epoch_form=epoch_form,
        optimizer_flops_per_step=s.optimizer_flops_per_step, per_rank=tuple(s.per_rank) if ranks > 1 else (),
        communication=s.communication, ensemble=s.ensemble, qualities=tuple(s.qualities),
        unavailable=dict(sorted(unavailable.items())), how=how, tokens_per_s=tokens_per_s,
        flops_per_token=flops_per_token, notes=_notes(s, samples_per_s) + _ended_early(s),
        complete=s.ended_by is None, ended_by=s.ended_by or "the end of training", parallel=s.parallel,
        prediction=s.prediction)


def _ended_early(s: RunSnapshot) -> tuple[str, ...]:
    if s.ended_by is None:
        return ()
    return (f"the run ended early ({s.ended_by}) after {s.steps} steps and {len(s.windows)} timed windows: the "
            "figures are those of the steps done, of this rank alone (ranks are not gathered once a run is cut)",)
