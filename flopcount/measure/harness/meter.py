"""``flopcount.Meter``: the HPC AI500 metrics of a real training run, measured from inside the user's own loop.

Sketch (the loop is the user's; docs/measuring.md runs the same loop on a small model)::

    import flopcount
    report = flopcount.from_torch(model, (64, 3, 224, 224), mode="train")          # counted once
    meter = flopcount.Meter(report, target_quality=0.763, quality_exponent=5)
    for epoch in range(epochs):
        for x, y in meter.loader(train_loader):      # the first batch read starts the clock
            with meter.step(samples=len(x)):
                loss = loss_fn(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
        meter.quality(evaluate(model))               # time-to-quality is taken here
    print(meter.summary()); meter.to_json("run.json")

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
The arithmetic is :func:`.figures.run_figures` of the meter's frozen :meth:`Meter.snapshot`.

**Distributed**: under torch.distributed the per-rank figures are gathered **once**, when the result is formed.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Mapping

from flopcount.errors import Interrupted, UsageError
from flopcount.output.files import write_atomic

from . import checks
from . import energy as energy_mod
from .clocks import make_timer
from .figures import RunSnapshot, Window, last_quality, local_figures, run_figures
from .predicted import predicted_beside
from .rank_mfu import check_plan_world, checked_plan, full_recompute_flops
from .ranks import gather_ranks, is_writer, running_dist
from .result import RunResult, bench_report, dumps

log = logging.getLogger(__name__)

_TORCH_DTYPES = {"torch.float32": "fp32", "torch.float64": "fp64", "torch.bfloat16": "bf16",
                 "torch.float16": "fp16", "torch.float8_e4m3fn": "fp8", "torch.float8_e5m2": "fp8"}


def _rank() -> int:
    dist = running_dist()
    return dist.get_rank() if dist is not None else 0


@dataclass(frozen=True)
class _Work:
    """What the count says about one sample's work: C, how C is known, the forward pass alone, the optimizer's
    FLOPs per step, the work by family (for the peak) and the counted batch (None where unknown)."""

    flops_per_sample: float | None
    how: str
    parts: Mapping[str, float] | None = None
    forward_flops_per_sample: float | None = None
    optimizer_flops: float | None = None
    batch: int | None = None
    recompute_flops_per_sample: float | None = None  # recompute="full" as the ledger reruns it (None: not known)


class _Step:
    """The context manager :meth:`Meter.step` returns (one object, reused: the per-step cost is two stamps)."""

    __slots__ = ("_meter", "samples", "tokens")

    def __init__(self, meter: "Meter") -> None:
        self._meter = meter
        self.samples = 0
        self.tokens: int | None = None

    def __enter__(self) -> "_Step":
        m = self._meter
        if not m._window_open:
            m._open_window()
        m._timer.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        m = self._meter
        m._timer.stop()
        if exc_type is not None and issubclass(exc_type, (KeyboardInterrupt, Interrupted)):
            m._cut_step = True  # a step cut by a signal is not a step done: its stamps are dropped
            return False
        m._pending_samples += self.samples
        if self.tokens is not None:
            m._pending_tokens += self.tokens
        m._pending_steps += 1
        if m._pending_steps >= m._window_target:
            m._close_window()
        return False


def check_meter_kwargs(where: str, kwargs: Mapping[str, Any]) -> None:
    """The :class:`Meter` keyword arguments a framework callback passes on, checked when the callback is made (an
    unknown name, or a value :func:`.checks.meter_arguments` refuses, is a :class:`UsageError`)."""
    import dataclasses
    import inspect

    known = set(inspect.signature(Meter).parameters) - {"report", "model", "example_inputs", "flops_per_sample"}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise UsageError(f"{where}: unknown Meter argument(s) {', '.join(unknown)}; expected some of "
                         f"{', '.join(sorted(known))}")
    checkable = {f.name for f in dataclasses.fields(checks.MeterArguments)}
    checks.meter_arguments(where, checks.MeterArguments(**{k: v for k, v in kwargs.items() if k in checkable}))


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
        What the run recomputes, for HFU: a number adds that many FLOPs per sample (e.g. fused attention's Q·Kᵀ
        recomputation). "full" activation checkpointing: with a counted model (``report=`` or ``model=``) of a
        decoder the per-rank ledger recognises, the FLOPs it really reruns (each layer's whole forward, as
        Megatron's full recompute and torch's reentrant checkpoint run it; not the embedding, head or loss);
        otherwise one extra forward pass per sample, the published convention (Chowdhery et al. 2022, PaLM,
        appendix B), which overstates. The result's ``how["hfu"]`` says which. Without it HFU is None.
    warmup_steps, window_steps : int
        Steps excluded at the start, and steps per timing window.
    energy : bool
        Read the device's energy counter (NVML or RAPL) when there is one.
    clock : callable, optional
        A zero-argument clock in seconds replacing the real timer (tests of the arithmetic).
    plan : flopcount.parallel.plan.ParallelPlan, str or DeviceMesh, optional
        The run's parallel plan (``"tp=2,dp=2"``, a ``ParallelPlan`` with its microbatches and schedule, or the
        ``torch.distributed`` device mesh the run is laid out on, read by :func:`.rank_mfu.plan_from_mesh`): each
        rank's FLOPs per optimizer step come from the per-rank ledger (:func:`flopcount.parallel.ranks.ledger`) of the
        counted model, and the result's ``parallel`` holds every rank's MFU and HFU, the slowest rank, the
        imbalance and the conventions of Megatron, torchtitan and MaxText (:mod:`.rank_mfu`). One :meth:`step`
        is one optimizer step. Needs ``report=`` or ``model=``; under torch.distributed its world size must be the
        process group's. ``recompute`` is then also read as the ledger's policy (none, full, non-reentrant,
        selective, or operator types).
    timeout : number, optional
        Under torch.distributed: the seconds given to ``distributed.init(timeout_s=)``. A collective that fails in
        the ``with meter:`` block or when the result is gathered then holds a roll call of the ranks for the rest
        of it and ends in one :class:`~flopcount.errors.MeasurementError` naming the rank that stopped answering.
    machine : path or MachineProfile, optional
        A machine profile (``flopcount calibrate -o FILE``): the result's ``prediction``, the step predicted for the
        counted model (under ``plan``) beside the measured one and their relative error (:mod:`.predicted`).
    """

    def __init__(self, report=None, *, flops_per_sample: float | None = None, model=None, example_inputs=None,
                 target_quality: float | None = None, quality_exponent: float | None = None,
                 higher_is_better: bool = True, device=None, precision: str | None = None,
                 peak_flops: float | None = None, recompute: str | float | None = None, warmup_steps: int = 5,
                 window_steps: int = 20, energy: bool = True, clock: Callable[[], float] | None = None,
                 energy_source=None, timeout: float | None = None, plan=None, machine=None) -> None:
        checks.meter_source(report, flops_per_sample, model, example_inputs)
        self._machine = checks.meter_machine(machine, report, model)
        self._plan, self._plan_recompute = checked_plan(plan, recompute, flops_per_sample)
        if self._plan is not None and isinstance(recompute, str) and recompute.lower() not in ("none", "full"):
            recompute = None  # the ledger's policy (selective, operator types); the whole-run HFU does not take it
        checked = checks.meter_arguments("Meter", checks.MeterArguments(
            flops_per_sample, target_quality, quality_exponent, higher_is_better, precision, peak_flops, recompute,
            warmup_steps, window_steps, energy, clock))
        self._timeout = None if timeout is None else checks.positive_finite("Meter", "timeout", timeout)
        self._report, self._model, self._example_inputs = report, model, example_inputs
        self._flops_per_sample = checked.flops_per_sample
        self.target_quality, self.quality_exponent = checked.target_quality, checked.quality_exponent
        self.higher_is_better = higher_is_better
        self._precision_given, self._peak_given = precision, checked.peak_flops
        self._device = None
        self._recompute = checked.recompute
        self.warmup_steps, self.window_steps = checked.warmup_steps, checked.window_steps
        self._device_kind, self._device_index, self._device_how = self._resolve_device(device, model)
        self._start_timing(device, clock, energy, energy_source)
        self._start_run_state()
        if model is not None:
            self.detect_fp8(model)
        if self._plan is not None:
            dist = running_dist()
            if dist is not None:
                check_plan_world(self._plan, dist.get_world_size())
            if report is not None:  # a model the ledger's rules cannot split is refused now, not after training
                self._plan_ledger()

    def _start_timing(self, device, clock: Callable[[], float] | None, energy: bool, energy_source) -> None:
        """The step timer of the device, the host clock, and the energy counter (``energy_source``, none when
        ``energy`` is False, else the device's)."""
        if clock is not None:
            clock = checks.checked_clock("Meter", clock)
        self._timer = make_timer(self._device_kind, device, clock)
        self._host = clock or time.perf_counter
        if energy_source is not None:
            self._energy = energy_source
        elif not energy:
            self._energy = energy_mod.NoEnergy("energy measurement turned off (energy=False)")
        else:
            self._energy = energy_mod.for_device(self._device_kind, self._device_index)

    def _start_run_state(self) -> None:
        """The run's counters before its first step: no window, step, sample, epoch, quality, result or listener."""
        self._step = _Step(self)
        self._window_open = False
        self._window_target = self.warmup_steps if self.warmup_steps > 0 else self.window_steps
        self._in_warmup = self.warmup_steps > 0
        self._pending_steps = 0
        self._pending_samples = 0
        self._pending_tokens = 0
        self._with_tokens: bool | None = None
        self._window_energy0: float | None = None
        self._window_host0 = 0.0
        self._windows: list[Window] = []
        self.samples = 0
        self.tokens = 0
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
        self._fp8: str | None = None
        self._result: RunResult | None = None
        self._ended_by: str | None = None  # what ended the run early (a signal, close() before stop())
        self._cut_step = False
        self._signals: contextlib.ExitStack | None = None
        self._listeners: list[Callable[[str, Mapping[str, Any]], None]] = []
        # Scale-out figures (flopcount.measure.harness.distributed / .ensemble): a mapping, or an object whose figures()
        # the result calls once (a CommCounter; an Ensemble, which gathers its base models' qualities).
        self.communication: Any = None
        self.ensemble: Any = None
        self._ledger = None

    # -- the loop -------------------------------------------------------------------------------------------

    def step(self, samples: int, tokens: int | None = None) -> _Step:
        """Time one training step of ``samples`` samples: ``with meter.step(samples=len(x)): ...``; a language
        model gives ``tokens=`` too (e.g. ``x.numel()``) for tokens/s and FLOPs per token. Give tokens on every
        step or on none."""
        self._step.samples = checks.samples("Meter.step", samples)
        if tokens is not None:
            tokens = checks.samples("Meter.step", tokens, "tokens")
        if self._with_tokens is None:
            self._with_tokens = tokens is not None
        elif self._with_tokens != (tokens is not None):
            raise UsageError("Meter.step: tokens= was given on " + ("earlier steps but not this one" if
                             self._with_tokens else "this step but not the earlier ones") + "; give it on every "
                             "step (tokens/s needs every step's tokens) or on none")
        self._step.tokens = tokens
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
        value = checks.finite("Meter.quality", "value", value)
        if epoch is not None:
            epoch = checks.nonneg_int("Meter.quality", "epoch", epoch)
        self._flush()
        now = self._host()
        t = now - self._t0 if self._t0 is not None else None
        epoch = len(self._epochs) if epoch is None else epoch
        self._qualities.append({"t_s": t, "value": float(value), "epoch": epoch, "samples": self.samples})
        if self._ttq is None and t is not None and self.reached(value):
            self._ttq = t
        self._emit("eval_accuracy", {"value": float(value), "epoch_num": epoch})

    @contextlib.contextmanager
    def evaluating(self, epoch: int | None = None) -> Iterator[None]:
        """Mark an evaluation: ``with meter.evaluating(epoch): meter.quality(evaluate(model))``. It collects the
        pending steps first (evaluation falls between timed windows) and tells the listeners ``eval_start`` and
        ``eval_stop`` (the MLPerf log's eval interval)."""
        where = "Meter.evaluating"
        epoch = len(self._epochs) if epoch is None else checks.nonneg_int(where, "epoch", epoch)
        self._flush()
        self._emit("eval_start", {"epoch_num": epoch})
        try:
            yield
        finally:
            self._emit("eval_stop", {"epoch_num": epoch})

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

    def close(self, reason: str | None = None) -> None:
        """End the run however it ended. A run already stopped (:meth:`stop`, :meth:`result`) stays as it is; any
        other ended early: the listeners get ``run_stop`` with ``status: aborted`` (the MLPerf log is closed as
        MLPerf's rules want), and the result is formed from the steps and windows done so far, with
        ``complete: False`` and ``ended_by`` = ``reason`` (a signal's name; default "Meter.close() before the end of
        training"). ``with meter:`` calls it when its block ends by an exception or a signal."""
        if reason is not None and not isinstance(reason, str):
            raise UsageError(f"Meter.close: reason must be a string (what ended the run), got {reason!r}")
        if self._t_end is not None:
            return
        self._ended_by = reason or "Meter.close() before the end of training"
        self._flush()
        self._t_end = self._host()
        self._emit("run_stop", {"status": "aborted"})

    def __enter__(self) -> "Meter":
        """``with Meter(...) as meter:`` around the training loop: SIGINT and SIGTERM end the run cleanly
        (:mod:`.interrupts`); a block that ends normally stops the meter, one that ends by a signal or an exception
        closes it as ended early (:meth:`close`) and lets the exception go on."""
        from .interrupts import on_signals

        self._signals = contextlib.ExitStack()
        self._signals.enter_context(on_signals())
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._signals is not None:
            self._signals.close()
            self._signals = None
        if exc_type is None:
            self.stop()
            return False
        if isinstance(exc, Interrupted):
            reason = exc.signal
            if exc.meter is None:
                exc.meter = self
        elif isinstance(exc, KeyboardInterrupt):
            reason = "SIGINT"
        else:
            reason = f"{exc_type.__name__} raised in the training loop"
        self.close(reason)
        failure = self._peer_failure(exc)
        if failure is not None:
            raise failure from None
        return False

    def _peer_failure(self, exc: BaseException):
        """The :class:`MeasurementError` naming a rank that stopped answering, when ``exc`` is a failed collective
        and ``timeout=`` was given (:func:`.distributed.peer_failure`); else None."""
        if self._timeout is None or not isinstance(exc, RuntimeError):
            return None
        from . import distributed

        ranks = distributed.current()
        return distributed.peer_failure(exc, ranks, self._timeout, "timeout=") if ranks is not None else None

    @property
    def complete(self) -> bool:
        """False once the run ended early (:meth:`close` before :meth:`stop`, a signal)."""
        return self._ended_by is None

    def subscribe(self, listener: Callable[[str, Mapping[str, Any]], None]) -> None:
        """Call ``listener(event, fields)`` at run_start, epoch_start/stop, eval_start/stop, eval_accuracy and
        run_stop (the MLPerf
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
        if self._cut_step:
            stamps, self._cut_step = stamps[:-1], False
        energy_j = energy_s = None
        if self._window_energy0 is not None:
            energy_j = self._energy.read_j() - self._window_energy0
            energy_s = self._host() - self._window_host0
        steps, samples, tokens = self._pending_steps, self._pending_samples, self._pending_tokens
        self.steps += steps
        self.samples += samples
        self.tokens += tokens
        self._pending_steps = self._pending_samples = self._pending_tokens = 0
        self._window_open = False
        if self._in_warmup:
            self._in_warmup = self.steps < self.warmup_steps
            self._window_target = self.warmup_steps - self.steps if self._in_warmup else self.window_steps
            return
        if stamps:
            span = stamps[-1][1] - stamps[0][0]
            self._windows.append(Window(steps, samples, span, tuple(e - s for s, e in stamps), energy_j, energy_s,
                                        tokens if self._with_tokens else None))

    def _flush(self) -> None:
        if self._pending_steps:
            self._close_window()
        elif self._cut_step:  # only a cut step is pending: its stamps go
            self._timer.collect()
            self._cut_step = False

    def detect_fp8(self, module) -> None:
        """Look for torchao ``Float8Linear`` modules in ``module`` (``model=`` is looked at when given; the
        Lightning callback passes its LightningModule): their matrix products run in fp8, and the peak is weighted
        by the work each dtype does (:mod:`.mfu`)."""
        from .mfu import fp8_modules

        n = fp8_modules(module)
        if n:
            self._fp8 = f"torchao Float8Linear modules ({n})"

    def _check_autocast(self) -> None:
        self._autocast_checks += 1
        if self._fp8 is None and "transformer_engine.pytorch" in sys.modules:
            from .mfu import transformer_engine_fp8

            if transformer_engine_fp8():
                self._fp8 = "TransformerEngine fp8_autocast seen in the steps"
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

    def flops_per_sample_known(self) -> bool:
        """Whether C is known without counting the model now (a report or ``flops_per_sample=`` was given)."""
        return self._report is not None or self._flops_per_sample is not None

    @property
    def timed_windows(self) -> tuple[Window, ...]:
        """The timed windows closed so far (warm-up excluded)."""
        return tuple(self._windows)

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
        if dist is None or not self.complete:  # (a run cut short calls no collective)
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
        """The run's figures as an immutable :class:`RunResult` (the meter stops; call once training is over).

        The meter counts the model, gathers every rank's figures, finds the peak and asks the attached scale-out
        objects for theirs; :func:`~flopcount.measure.harness.figures.run_figures` forms the figures from that
        snapshot (``device``: a :class:`~flopcount.measure.machine.devices.Device` already described, or None)."""
        if self._result is not None:
            return self._result
        self._result = run_figures(self.snapshot(device))
        return self._result

    def snapshot(self, device=None) -> RunSnapshot:
        """Stop the run and take its :class:`~flopcount.measure.harness.figures.RunSnapshot` (counting the model,
        gathering the ranks and describing the device as needed: under torch.distributed every rank calls this)."""
        self.stop()
        dist = running_dist()
        if self._plan is not None:
            check_plan_world(self._plan, dist.get_world_size() if dist is not None else 1)
        work = self._counted_work()
        local = local_figures(self._windows, self.samples, self.steps)
        # A run cut short gathers nothing: the other ranks may be cut at another step, or gone.
        try:
            per_rank = gather_ranks(local) if self.complete else [dict(local, rank=_rank())]
        except RuntimeError as e:
            failure = self._peer_failure(e)
            if failure is None:
                raise
            raise failure from None
        precision, peak = self._peak(device, work.parts)
        communication, ensemble = self._attachments(work, per_rank) if self.complete else (None, None)
        parallel = self._parallel_figures(per_rank, peak) if self.complete else None
        prediction = (predicted_beside(self.counted_report(), self._plan, self._plan_recompute, self._machine,
                                       per_rank, self._device_kind) if self.complete and self._machine else None)
        energy = self._energy
        from ..machine.ceilings import load_per_core

        return RunSnapshot(
            samples=self.samples, steps=self.steps, warmup_steps=self.warmup_steps, timer_kind=self._timer.kind,
            start_how=self._start_how,
            wall_s=(self._t_end - self._t0) if self._t0 is not None and self._t_end is not None else None,
            windows=tuple(self._windows), per_rank=tuple(per_rank), epochs=tuple(self._epochs),
            qualities=tuple(self._qualities), time_to_quality_s=self._ttq, target_quality=self.target_quality,
            quality_exponent=self.quality_exponent, higher_is_better=self.higher_is_better,
            flops_per_sample=work.flops_per_sample, flops_per_sample_how=work.how,
            forward_flops_per_sample=work.forward_flops_per_sample,
            recompute_flops_per_sample=work.recompute_flops_per_sample, optimizer_flops_per_step=work.optimizer_flops, precision=precision.label, precision_how=precision.how,
            peak_flops=peak.flops_per_s, peak_source=peak.source, recompute=self._recompute,
            energy_kind=energy.kind, energy_reason=getattr(energy, "reason", ""),
            energy_min_window_s=getattr(energy, "min_window_s", 0.0), communication=communication,
            communication_attached=self.communication is not None, ensemble=ensemble,
            load_per_core=load_per_core() if self._device_kind == "cpu" else None,
            peak_load_per_core=peak.load_per_core, ended_by=self._ended_by, parallel=parallel,
            parallel_given=self._plan is not None, prediction=prediction, machine_given=self._machine is not None)

    def _counted_work(self) -> _Work:
        """C (training FLOPs per sample), how it is known, the forward FLOPs per sample, the optimizer's FLOPs per
        step and the work split by family (for the peak), from the counting report or ``flops_per_sample=``."""
        from .mfu import split_work

        report = self.counted_report()
        if report is None:
            return _Work(self._flops_per_sample, "given (flops_per_sample=)")
        opt = report.optimizer
        return _Work(report.per_sample.flops,
                     ("analytic training FLOPs per sample (forward + backward) of flopcount's count, convention "
                      f"{report.convention.name}"),
                     split_work(report), report.forward.flops / report.batch, opt[1].flops if opt else None,
                     report.batch, full_recompute_flops(report) if self._recompute == "full" else None)

    def _peak(self, device, parts):
        """The run's precision and the peak of one device that MFU divides by (describing the device, which on a
        CPU measures or reads its GEMM ceiling, unless ``device`` is given)."""
        from .mfu import detect_precision, effective_peak

        precision = detect_precision(self._device_kind, self._precision_given, self._autocast, self._param_dtype(),
                                     self._fp8)
        if device is not None and self._device is None:
            self._device = device  # to_json describes the same device, and calls no collective on rank 0 alone
        dev = device if device is not None else self.device()
        return precision, effective_peak(dev, precision, parts, self._peak_given)

    def _parallel_figures(self, per_rank: list, peak) -> dict[str, Any] | None:
        """Every rank's MFU and HFU under the plan (:mod:`.rank_mfu`), from the ledger of the counted model and the
        step times gathered once; None without a plan."""
        if self._plan is None:
            return None
        from .rank_mfu import rank_figures

        return rank_figures(self._plan_ledger(), per_rank, peak.flops_per_s, peak.source)

    def _plan_ledger(self) -> dict[str, Any]:
        """The per-rank ledger of the counted model under the plan, as a mapping (formed once): the decoder rules of
        :func:`flopcount.parallel.ranks.ledger`, or for a data-parallel plan on another model
        :func:`.rank_mfu.data_parallel_ledger`."""
        if self._ledger is None:
            from flopcount.parallel.ranks import ledger

            from .rank_mfu import data_parallel_ledger

            report = self.counted_report()
            try:
                self._ledger = ledger(report, self._plan, self._plan_recompute).as_dict()
            except UsageError:
                p = self._plan
                if p.tp * p.pp * p.cp * p.ep != 1:
                    raise
                self._ledger = data_parallel_ledger(report, p, self._plan_recompute)
        return self._ledger

    def _attachments(self, work: _Work, per_rank: list) -> tuple[Any, Any]:
        """The figures of the attached communication counter and ensemble: a mapping as attached, or what the
        object's ``figures()`` returns (called once; an ensemble gathers its base models' qualities there)."""
        C = work.flops_per_sample
        communication, ensemble = self.communication, self.ensemble
        if hasattr(communication, "figures"):
            communication = communication.figures(C, self.samples, self.steps)
        if hasattr(ensemble, "figures"):
            batch = work.batch if work.batch is not None else (self.samples / self.steps if self.steps else None)
            ensemble = ensemble.figures({"per_rank": per_rank, "flops_per_sample": C, "batch": batch,
                                         "quality": last_quality(self._qualities)})
        return communication, ensemble

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
        write_atomic(path, dumps(doc), "run report")
