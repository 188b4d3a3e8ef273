"""``flopcount.Meter``: the HPC AI500 metrics of a real training run, measured from inside the user's own loop.

>>> import flopcount  # doctest: +SKIP
>>> report = flopcount.from_torch(model, (64, 3, 224, 224), mode="train")          # counted once
>>> meter = flopcount.Meter(report, target_quality=0.763, quality_exponent=5)
>>> for epoch in range(epochs):
...     for x, y in meter.loader(train_loader):      # the first batch read starts the clock
...         with meter.step(samples=len(x)):
...             loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
...     meter.quality(evaluate(model))               # time-to-quality is taken here
>>> print(meter.summary()); meter.to_json("run.json")

**What the meter does per step**: two stamps (``time.perf_counter`` on a CPU; two CUDA events on the current
stream on a GPU) and a few integer updates; no synchronisation, no FLOP counting. Once per window of
``window_steps`` steps, and at every :meth:`Meter.quality`, :meth:`Meter.epoch_end` and :meth:`Meter.stop`, it
collects the window's stamps (on a GPU this is the window's single synchronisation) and reads the energy counter.
The first ``warmup_steps`` steps form a window of their own that is discarded.

**Figures** (:class:`RunResult`): samples/s per rank is the median over windows of samples / window span (a span
runs from the first step's start to the last step's end, so input-pipeline stalls between steps count, while
evaluation between windows does not); step time is the median step duration; FLOPS = Σ_ranks N_r × C
(= N × R × C); MFU = FLOPS / (R × peak of the dtype doing the work, :mod:`.mfu`); VFLOPS = FLOPS ×
(achieved / target)^n; time-to-quality from the clock start to the first :meth:`quality` at or past the target;
energy over the timed windows. Every figure that cannot be formed is ``None`` with its reason in ``unavailable``.

**Distributed**: under torch.distributed the per-rank figures are gathered **once**, when the result is formed.
"""

from __future__ import annotations

import logging
import math
import statistics
import sys
import time
from dataclasses import replace
from typing import Any, Callable, Iterable, Iterator, Mapping

from flopcount.errors import UsageError

from . import energy as energy_mod
from .clocks import make_timer
from .ranks import gather_ranks, is_writer, running_dist
from .result import RunResult, bench_report, dumps

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"torch.float32": "fp32", "torch.float64": "fp64", "torch.bfloat16": "bf16",
                 "torch.float16": "fp16", "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8"}


class _Window:
    __slots__ = ("steps", "samples", "span", "durations", "energy_j", "energy_s")

    def __init__(self, steps, samples, span, durations, energy_j, energy_s):
        self.steps, self.samples, self.span, self.durations = steps, samples, span, durations
        self.energy_j, self.energy_s = energy_j, energy_s


class _Step:
    """The context manager :meth:`Meter.step` returns (one object, reused: the per-step cost is two stamps)."""

    __slots__ = ("_meter", "samples")

    def __init__(self, meter: "Meter") -> None:
        self._meter = meter
        self.samples = 0

    def __enter__(self) -> "_Step":
        m = self._meter
        if not m._window_open:
            m._open_window()
        m._timer.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        m = self._meter
        m._timer.stop()
        m._pending_samples += self.samples
        m._pending_steps += 1
        if m._pending_steps >= m._window_target:
            m._close_window()
        return False


class Meter:
    """Measure a training run from inside its loop. See the module docstring for the figures.

    Parameters
    ----------
    report : flopcount.Report, optional
        The counting report of one training step (``mode="train"``); C is its training FLOPs per sample (forward +
        backward; the optimizer step is reported apart).
    flops_per_sample : number, optional
        C given directly, for models the counter cannot export; the harness never depends on the export.
    model, example_inputs : optional
        Count the PyTorch module with :func:`flopcount.from_torch` in training mode the first time C is needed
        (when the result is formed, after training), instead of passing a report.
    target_quality, quality_exponent : optional
        The target of :meth:`quality` and the exponent n of VFLOPS (HPC AI500: 5 for image classification, 10 for
        extreme weather analytics). ``higher_is_better=False`` for a quality such as a loss.
    device : "cpu", "cuda", "cuda:N" or a torch.device, optional
        Where the steps run: CUDA events time a CUDA device, the host clock a CPU. Default: the model's device when
        ``model`` is given, else the current CUDA device when CUDA is initialised, else the CPU.
    precision : "fp32", "tf32", "bf16", "fp16", "fp8" or "fp64", optional
        The dtype of the products; by default read from the run (autocast seen in the warm-up steps, parameter
        dtype, the TF32 flags), see :mod:`flopcount.measure.harness.mfu`.
    peak_flops : number, optional
        Peak FLOP/s of one device for MFU, overriding the device table (or the measured CPU ceiling).
    recompute : "none", "full" or a number, optional
        What the run recomputes, for HFU: "full" activation checkpointing adds a forward pass per sample; a number
        adds that many FLOPs per sample (e.g. fused attention's Q·Kᵀ recomputation). Without it HFU is None.
    warmup_steps, window_steps : int
        Steps excluded at the start, and steps per timing window.
    energy : bool
        Read the device's energy counter (NVML or RAPL) when there is one.
    clock : callable, optional
        A zero-argument clock in seconds replacing the real timer (tests of the arithmetic).
    """

    def __init__(self, report=None, *, flops_per_sample: float | None = None, model=None, example_inputs=None,
                 target_quality: float | None = None, quality_exponent: float | None = None,
                 higher_is_better: bool = True, device=None, precision: str | None = None,
                 peak_flops: float | None = None, recompute: str | float | None = None, warmup_steps: int = 5,
                 window_steps: int = 20, energy: bool = True, clock: Callable[[], float] | None = None,
                 energy_source=None) -> None:
        sources = [name for name, v in (("report", report), ("flops_per_sample", flops_per_sample),
                                        ("model", model)) if v is not None]
        if len(sources) != 1:
            raise UsageError("Meter needs exactly one of report=, flops_per_sample= or model= (with example_inputs=) "
                             f"to know the training FLOPs per sample; got {', '.join(sources) or 'none'}")
        if report is not None and getattr(report, "mode", "train") != "train":
            raise UsageError("Meter: the report counts inference only; count the model with mode=\"train\" (forward "
                             "and backward), e.g. flopcount.from_torch(model, inputs, mode=\"train\")")
        if flops_per_sample is not None and not (isinstance(flops_per_sample, (int, float))
                                                 and math.isfinite(flops_per_sample) and flops_per_sample > 0):
            raise UsageError(f"Meter: flops_per_sample must be a positive number, got {flops_per_sample!r}")
        if model is not None and example_inputs is None:
            raise UsageError("Meter(model=...) needs example_inputs= (a tensor, a shape or a tuple of them) to count it")
        if warmup_steps < 0 or window_steps < 1:
            raise UsageError(f"Meter: warmup_steps must be >= 0 and window_steps >= 1, got {warmup_steps} and "
                             f"{window_steps}")
        if target_quality is not None and quality_exponent is None:
            raise UsageError("Meter: target_quality needs quality_exponent (HPC AI500: 5 for image classification, "
                             "10 for extreme weather analytics)")
        if isinstance(recompute, str) and recompute not in ("none", "full"):
            raise UsageError(f"Meter: recompute={recompute!r}: expected 'none', 'full' or FLOPs per sample")
        self._report = report
        self._flops_per_sample = flops_per_sample
        self._model = model
        self._example_inputs = example_inputs
        self.target_quality = target_quality
        self.quality_exponent = quality_exponent
        self.higher_is_better = higher_is_better
        self._precision_given = precision
        self._peak_given = peak_flops
        self._device = None
        self._recompute = recompute
        self.warmup_steps = warmup_steps
        self.window_steps = window_steps
        self._device_kind, self._device_index, self._device_how = self._resolve_device(device, model)
        self._timer = make_timer(self._device_kind, device, clock)
        self._host = clock or time.perf_counter
        if energy_source is not None:
            self._energy = energy_source
        elif not energy:
            self._energy = energy_mod.NoEnergy("energy measurement turned off (energy=False)")
        else:
            self._energy = energy_mod.for_device(self._device_kind, self._device_index)
        self._step = _Step(self)
        self._window_open = False
        self._window_target = warmup_steps if warmup_steps > 0 else window_steps
        self._in_warmup = warmup_steps > 0
        self._pending_steps = 0
        self._pending_samples = 0
        self._window_energy0: float | None = None
        self._window_host0 = 0.0
        self._windows: list[_Window] = []
        self.samples = 0
        self.steps = 0
        self._t0: float | None = None
        self._start_how = ""
        self._t_end: float | None = None
        self._epochs: list[tuple[int, int, float]] = []  # (iterations, samples, seconds)
        self._epoch_start: tuple[float, int, int] | None = None
        self._qualities: list[dict[str, Any]] = []
        self._ttq: float | None = None
        self._autocast: str | None = None
        self._autocast_checks = 0
        self._result: RunResult | None = None
        self._listeners: list[Callable[[str, Mapping[str, Any]], None]] = []
        # Scale-out figures (flopcount.measure.harness.distributed / .ensemble): a mapping, or an object whose figures()
        # the result calls once (a CommCounter; an Ensemble, which gathers its base models' qualities).
        self.communication: Any = None
        self.ensemble: Any = None

    # -- the loop -------------------------------------------------------------------------------------------

    def step(self, samples: int) -> _Step:
        """Time one training step of ``samples`` samples: ``with meter.step(samples=len(x)): ...``."""
        self._step.samples = samples
        if self._autocast_checks < self.warmup_steps + 1:
            self._check_autocast()
        return self._step

    def start(self) -> None:
        """Start the clock now: call it right before the first training batch is read (HPC AI500's timing rule),
        or use :meth:`loader`, which does it. Without either, the clock starts at the first step."""
        if self._t0 is None:
            self._t0 = self._host()
            self._start_how = "from the first training batch read"
            self._emit("run_start", {})

    def loader(self, batches: Iterable) -> Iterator:
        """Iterate over one epoch of ``batches``: the first read starts the clock, and the end of the iterable is
        :meth:`epoch_end` (so whole epochs are timed for the HPC AI500 V3.0 form)."""
        self.epoch_start()
        yield from batches
        self.epoch_end()

    def epoch_start(self) -> None:
        """Mark the start of an epoch, right before its first batch is read (:meth:`loader` calls it; it starts
        the clock on the first epoch)."""
        self.start()
        self._flush()
        self._epoch_start = (self._host(), self.steps + self._pending_steps, self.samples + self._pending_samples)
        self._emit("epoch_start", {"epoch_num": len(self._epochs) + 1})

    def epoch_end(self) -> None:
        """Mark the end of an epoch (:meth:`loader` calls it)."""
        self._flush()
        if self._epoch_start is not None:
            t, steps, samples = self._epoch_start
            self._epochs.append((self.steps - steps, self.samples - samples, self._host() - t))
            self._epoch_start = None
            self._emit("epoch_stop", {"epoch_num": len(self._epochs)})

    def quality(self, value: float, epoch: int | None = None) -> None:
        """Record the model's quality (accuracy, mAP ...) where it was evaluated; the first value at or past the
        target gives the time-to-quality."""
        self._flush()
        now = self._host()
        t = now - self._t0 if self._t0 is not None else None
        epoch = len(self._epochs) if epoch is None else epoch
        self._qualities.append({"t_s": t, "value": float(value), "epoch": epoch, "samples": self.samples})
        if self._ttq is None and t is not None and self.reached(value):
            self._ttq = t
        self._emit("eval_accuracy", {"value": float(value), "epoch_num": epoch})

    def reached(self, value: float | None = None) -> bool:
        """Whether ``value`` (default: the last quality) meets the target."""
        if self.target_quality is None:
            return False
        if value is None:
            if not self._qualities:
                return False
            value = self._qualities[-1]["value"]
        return value >= self.target_quality if self.higher_is_better else value <= self.target_quality

    def stop(self) -> None:
        """End of training: collect what is pending and stop the wall clock (:meth:`result` calls it)."""
        if self._t_end is None:
            self._flush()
            self._t_end = self._host()
            self._emit("run_stop", {"status": "success" if self.reached() or self.target_quality is None
                                    else "aborted"})

    def subscribe(self, listener: Callable[[str, Mapping[str, Any]], None]) -> None:
        """Call ``listener(event, fields)`` at run_start, epoch_start/stop, eval_accuracy and run_stop (the MLPerf
        log writer of ``flopcount bench --mllog`` listens this way)."""
        self._listeners.append(listener)

    # -- windows --------------------------------------------------------------------------------------------

    def _open_window(self) -> None:
        if self._t0 is None:
            self._t0 = self._host()
            self._start_how = ("from the first step (meter.loader() or meter.start() would start it at the first "
                               "batch read)")
            self._emit("run_start", {})
        self._window_open = True
        self._window_host0 = self._host()
        if self._energy.kind != "unavailable":
            self._window_energy0 = self._energy.read_j()

    def _close_window(self) -> None:
        stamps = self._timer.collect()  # on a GPU: the window's one synchronisation
        energy_j = energy_s = None
        if self._window_energy0 is not None:
            energy_j = self._energy.read_j() - self._window_energy0
            energy_s = self._host() - self._window_host0
        steps, samples = self._pending_steps, self._pending_samples
        self.steps += steps
        self.samples += samples
        self._pending_steps = self._pending_samples = 0
        self._window_open = False
        if self._in_warmup:
            self._in_warmup = self.steps < self.warmup_steps
            self._window_target = self.warmup_steps - self.steps if self._in_warmup else self.window_steps
            return
        if stamps:
            span = stamps[-1][1] - stamps[0][0]
            self._windows.append(_Window(steps, samples, span, [e - s for s, e in stamps], energy_j, energy_s))

    def _flush(self) -> None:
        if self._pending_steps:
            self._close_window()

    def _check_autocast(self) -> None:
        self._autocast_checks += 1
        torch = sys.modules.get("torch")
        if torch is None or self._autocast is not None:
            return
        kind = "cuda" if self._device_kind == "cuda" else "cpu"
        try:
            if torch.is_autocast_enabled(kind):
                self._autocast = _TORCH_DTYPES.get(str(torch.get_autocast_dtype(kind)))
        except (AttributeError, TypeError, RuntimeError):  # an older torch without the device-type forms
            pass

    def _emit(self, event: str, fields: Mapping[str, Any]) -> None:
        for listener in self._listeners:
            listener(event, fields)

    # -- the result -----------------------------------------------------------------------------------------

    @staticmethod
    def _resolve_device(device, model) -> tuple[str, int | None, str]:
        torch = sys.modules.get("torch")
        if device is None and model is not None:
            try:
                device = next(model.parameters()).device
                how = "the model's parameters"
            except (StopIteration, AttributeError):
                how = "default"
        elif device is None:
            if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                device = f"cuda:{torch.cuda.current_device()}"
                how = "the current CUDA device (CUDA is initialised)"
            else:
                device = "cpu"
                how = "CPU (no CUDA device initialised)"
        else:
            how = "given"
        text = str(device)
        if text == "cpu":
            return "cpu", None, how
        if text == "cuda" or text.startswith("cuda:"):
            index = int(text.split(":", 1)[1]) if ":" in text else None
            return "cuda", index, how
        raise UsageError(f"Meter: device={device!r}: expected 'cpu', 'cuda' or 'cuda:N'")

    def _param_dtype(self) -> str | None:
        if self._model is None:
            return None
        try:
            return _TORCH_DTYPES.get(str(next(self._model.parameters()).dtype))
        except (StopIteration, AttributeError):
            return None

    def _flops_per_sample_known(self) -> bool:
        return self._report is not None or self._flops_per_sample is not None

    @property
    def timed_epochs(self) -> tuple[tuple[int, int, float], ...]:
        """(iterations, samples, seconds) of every epoch ended so far."""
        return tuple(self._epochs)

    def flops_per_sample(self) -> float | None:
        """C, the training FLOPs per sample (counting the model now when it was given as ``model=``)."""
        report = self.counted_report()
        return report.per_sample.flops if report is not None else self._flops_per_sample

    def counted_report(self):
        """The counting report (counting the model now when it was given as ``model=``)."""
        if self._report is None and self._model is not None:
            from flopcount.frontends.torch import from_torch

            self._report = from_torch(self._model, self._example_inputs, mode="train")
        return self._report

    def device(self):
        """The :class:`flopcount.measure.machine.devices.Device` of this run (the CPU's peak is measured on first call; under
        torch.distributed every rank calls this, or :meth:`result`, as for any collective)."""
        if self._device is None:
            self._device = self._describe_device()
        return self._device

    def _describe_device(self):
        from ..machine import ceilings, devices

        if self._device_kind == "cuda":
            return devices.cuda_device(self._device_index)
        dtypes = ("fp32", "bf16") if self._autocast == "bf16" or self._precision_given == "bf16" else ("fp32",)
        if self._peak_given is not None:
            return devices.cpu_device()
        dist = running_dist()
        if dist is None:
            return ceilings.measured_cpu_device(dtypes)
        # A CPU peak is a measurement (a GEMM calibration, or its cache), so ranks measuring each at its own moment
        # would divide by different peaks as the other ranks load the machine. Rank 0 measures (or reads the
        # cache) while the other ranks wait in the broadcast, then every rank takes its figures: one peak per run.
        box = [ceilings.measured_cpu_device(dtypes) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        cpu = box[0]
        peaks = {k: replace(v, source=f"{v.source}; measured on rank 0, every rank uses it")
                 for k, v in cpu.peaks.items()}
        return replace(cpu, peaks=peaks)

    def result(self, device=None) -> RunResult:
        """The run's figures as an immutable :class:`RunResult` (the meter stops; call once training is over)."""
        if self._result is not None:
            return self._result
        self.stop()
        from .mfu import detect_precision, effective_peak, split_work

        unavailable: dict[str, str] = {}
        how: dict[str, str] = {"wall_s": f"host clock {self._start_how or '(no step ran)'} to the end of training",
                               "step_time_s": f"median step duration, {self._timer.kind} timer, after "
                               f"{self.warmup_steps} warm-up steps"}
        report = self.counted_report()
        if report is not None:
            C: float | None = report.per_sample.flops
            parts = split_work(report)
            how["flops_per_sample"] = ("analytic training FLOPs per sample (forward + backward) of flopcount's "
                                       f"count, convention {report.convention.name}")
            opt = report.optimizer
            optimizer_flops = opt[1].flops if opt else None
        else:
            C, parts, optimizer_flops = self._flops_per_sample, None, None
            how["flops_per_sample"] = "given (flops_per_sample=)"
        if optimizer_flops is None:
            unavailable["optimizer_flops_per_step"] = "not counted (count with optimizer= to report it)"

        windows = self._windows
        durations = [d for w in windows for d in w.durations]
        timed_steps = sum(w.steps for w in windows)
        timed_samples = sum(w.samples for w in windows)
        rates = [w.samples / w.span for w in windows if w.span > 0]
        local = {
            "samples_per_s": statistics.median(rates) if rates else None,
            "step_time_s": statistics.median(durations) if durations else None,
            "samples": self.samples, "steps": self.steps,
        }
        if not rates:
            why = (f"no timed window: {self.steps} steps ran, all within the {self.warmup_steps} warm-up steps; "
                   "run more steps or lower warmup_steps")
            unavailable["samples_per_s"] = unavailable["step_time_s"] = why
        per_rank = gather_ranks(local)
        ranks = len(per_rank)
        rank_rates = [r["samples_per_s"] for r in per_rank]
        total_rate = sum(rank_rates) if all(r is not None for r in rank_rates) else None
        samples_per_s = {
            "per_rank": local["samples_per_s"], "total": total_rate, "windows": len(rates),
            "min": min(rates) if rates else None, "max": max(rates) if rates else None,
            "variation": (statistics.pstdev(rates) / statistics.fmean(rates)) if len(rates) >= 2 else None,
        }
        how["samples_per_s"] = ("per rank: median over windows of samples / window span (first step start to last "
                                "step end); total: sum over ranks")
        if ranks > 1:
            slow = min((r for r in rank_rates if r is not None), default=None)
            samples_per_s["slowest_rank"] = slow
            samples_per_s["imbalance"] = (max(rank_rates) / slow - 1) if slow else None

        flops = total_rate * C if total_rate is not None and C is not None else None
        if flops is None:
            unavailable["flops"] = unavailable.get("samples_per_s", "no FLOPs per sample")
        how["flops"] = "FLOPS = sum over ranks of N_r x C (N x R x C), C the training FLOPs per sample"

        precision = detect_precision(self._device_kind, self._precision_given, self._autocast, self._param_dtype())
        if device is not None and self._device is None:
            self._device = device  # to_json describes the same device, and calls no collective on rank 0 alone
        dev = device if device is not None else self.device()
        peak = effective_peak(dev, precision, parts, self._peak_given)
        how["precision"] = precision.how
        mfu = flops / (ranks * peak.flops_per_s) if flops is not None and peak.flops_per_s else None
        if peak.flops_per_s is None:
            unavailable["peak_flops"] = unavailable["mfu"] = peak.source
        elif mfu is None:
            unavailable["mfu"] = unavailable["flops"]
        how["mfu"] = f"FLOPS / (R x peak of one device); peak: {peak.source}"

        hfu = None
        if self._recompute is None:
            unavailable["hfu"] = "what the run recomputes is not known: give recompute='none', 'full' or FLOPs per sample"
        elif mfu is not None and C:
            extra = (0 if self._recompute == "none" else
                     (report.forward.flops / report.batch if report is not None else None)
                     if self._recompute == "full" else float(self._recompute))
            if extra is None:
                unavailable["hfu"] = "recompute='full' needs a counting report (the forward FLOPs)"
            else:
                hfu = mfu * (C + extra) / C
                how["hfu"] = f"MFU x (C + recomputed FLOPs per sample) / C, recompute={self._recompute!r}"
        else:
            unavailable["hfu"] = unavailable.get("mfu", "no MFU")

        q = self._qualities[-1]["value"] if self._qualities else None
        if q is None:
            unavailable["quality"] = "meter.quality() was never called (no evaluation, or synthetic data)"
        vflops = None
        if flops is not None and q is not None and self.target_quality:
            ratio = q / self.target_quality if self.higher_is_better else self.target_quality / q if q else None
            if ratio is not None:
                vflops = flops * ratio ** self.quality_exponent
                how["vflops"] = f"FLOPS x (achieved / target)^{self.quality_exponent:g}, achieved = the last quality"
        if vflops is None:
            unavailable["vflops"] = ("no target quality" if not self.target_quality else
                                     unavailable.get("quality") or unavailable.get("flops", "no FLOPS"))
        ttq = self._ttq
        if ttq is None:
            unavailable["time_to_quality_s"] = ("no target quality" if self.target_quality is None else
                                                f"the target {self.target_quality:g} was not reached"
                                                if self._qualities else unavailable["quality"])
        else:
            how["time_to_quality_s"] = "host clock from the clock start to the first quality at or past the target"

        energy_j, power_w = self._energy_figures(windows, unavailable, how)
        fpw = flops / power_w if flops is not None and power_w else None
        vfpw = vflops / power_w if vflops is not None and power_w else None
        if fpw is None:
            unavailable["flops_per_watt"] = unavailable.get("power_w", unavailable.get("flops", ""))
        if vfpw is None:
            unavailable["vflops_per_watt"] = unavailable.get("power_w") or unavailable.get("vflops", "")

        epoch_form = None
        full = [e for e in self._epochs if e[2] > 0 and e[0] > 0]
        if full and C is not None:
            epoch_form = statistics.fmean(samples * C / seconds for _, samples, seconds in full) * ranks
            how["flops_epoch_form"] = ("HPC AI500 V3.0: (iterations per epoch x APC) / T_epoch, APC = batch x C, "
                                       f"mean over {len(full)} timed epochs (host clock, each ended by a sync), "
                                       "times the ranks")
        else:
            unavailable["flops_epoch_form"] = ("no whole epoch was timed (iterate with meter.loader() or call "
                                               "meter.epoch_end())" if not full else "no FLOPs per sample")

        if self.communication is None:
            unavailable["communication"] = ("one rank: nothing is communicated" if ranks == 1 else
                                            "not measured: no communication hook was attached to this run's model")
        wall = (self._t_end - self._t0) if self._t0 is not None and self._t_end is not None else None
        if wall is None:
            unavailable["wall_s"] = "no step ran"
        communication, ensemble = self.communication, self.ensemble
        if hasattr(communication, "figures"):
            communication = communication.figures(C, self.samples, self.steps)
        if hasattr(ensemble, "figures"):
            batch = report.batch if report is not None else (self.samples / self.steps if self.steps else None)
            ensemble = ensemble.figures({"per_rank": per_rank, "flops_per_sample": C, "batch": batch, "quality": q})
        if ensemble is None:
            unavailable["ensemble"] = "one model trained (no bagging ensemble)"
        if communication is not None:
            unavailable.pop("communication", None)
        self._result = RunResult(
            samples=self.samples, steps=self.steps, timed_samples=timed_samples, timed_steps=timed_steps,
            wall_s=wall, step_time_s=local["step_time_s"], samples_per_s=samples_per_s, flops_per_sample=C,
            flops=flops, ranks=ranks, precision=precision.label, peak_flops=peak.flops_per_s,
            peak_source=peak.source, mfu=mfu, hfu=hfu, quality=q, target_quality=self.target_quality,
            quality_exponent=self.quality_exponent, vflops=vflops, time_to_quality_s=ttq, energy_j=energy_j,
            power_w=power_w, flops_per_watt=fpw, vflops_per_watt=vfpw, epochs=len(self._epochs),
            flops_epoch_form=epoch_form, optimizer_flops_per_step=optimizer_flops,
            per_rank=tuple(per_rank) if ranks > 1 else (), communication=communication, ensemble=ensemble,
            qualities=tuple(self._qualities), unavailable=dict(sorted(unavailable.items())), how=how)
        return self._result

    def _energy_figures(self, windows, unavailable: dict, how: dict) -> tuple[float | None, float | None]:
        src = self._energy
        if src.kind == "unavailable":
            for k in ("energy_j", "power_w"):
                unavailable[k] = src.reason
            return None, None
        usable = [w for w in windows if w.energy_j is not None and w.energy_s and w.energy_s >= src.min_window_s]
        if not usable:
            why = (f"no timed window lasted {src.min_window_s:g} s, the shortest the {src.kind} counter resolves "
                   "(it updates about every 100 ms); raise window_steps")
            unavailable["energy_j"] = unavailable["power_w"] = why
            return None, None
        joules = sum(w.energy_j for w in usable)
        seconds = sum(w.energy_s for w in usable)
        how["energy_j"] = (f"measured: {src.kind} energy counter read before and after {len(usable)} of "
                           f"{len(windows)} timed windows ({seconds:.1f} s); this rank's device")
        how["power_w"] = "measured: energy / duration of those windows"
        return joules, joules / seconds

    # -- output ---------------------------------------------------------------------------------------------

    def summary(self) -> str:
        """A table of the run's figures (forms the result)."""
        from .run_table import run_table

        return run_table(self.result())

    def to_json(self, path: str, config: Mapping[str, Any] | None = None) -> None:
        """Write a benchmark report holding this run (the same document ``flopcount bench -o`` writes)."""
        from flopcount.measure.machine.system import describe_system

        result = self.result()
        if not is_writer():
            return
        doc = bench_report([result], describe_system(self.device()), dict(config or {}))
        with open(path, "w", encoding="utf-8") as f:
            f.write(dumps(doc))
