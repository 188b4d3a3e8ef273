"""PyTorch Lightning: :class:`MeterCallback` runs :class:`flopcount.Meter` around ``Trainer.fit``.

Sketch (the model and the loaders are the user's)::

    from flopcount.measure.harness.callbacks.lightning import MeterCallback
    trainer = lightning.Trainer(callbacks=[MeterCallback(target_quality=0.95, quality_exponent=5, monitor="val_acc")])
    trainer.fit(model, train_loader, val_loader); print(trainer.callbacks[0].result)

The LightningModule is counted once, at ``setup("fit")``, through :func:`flopcount.from_torch` in training mode
from its ``example_input_array`` (or ``example_inputs=``), unless ``flops_per_sample=`` is given. Steps are timed
from ``on_train_batch_start`` to ``on_train_batch_end`` with the meter's timers (CUDA events on a GPU, synchronised
once per window, never per batch); epochs from ``on_train_epoch_start`` (the clock starts there, before the first
batch is read) to ``on_train_epoch_end``; the ``monitor`` metric of each validation epoch is the quality. The
figures are logged through the trainer's loggers (``flopcount/...``) at the end of each epoch (that epoch's FLOPS
in the HPC AI500 V3.0 form) and when training ends (every figure of the run), and ``result`` holds the
:class:`flopcount.RunResult`.

What it adds to Lightning's ``ThroughputMonitor``: FLOPs counted analytically from the graph (forward and backward,
no FlopCounterMode run needed, optimizer apart), no per-batch synchronisation, peaks that know current GPUs, the
dtype actually doing the work (TF32 convolutions in fp32), VFLOPS, time-to-quality, energy and the report JSON.

Needs ``lightning`` (``pip install 'flopcount[lightning]'``); importing this module imports it.
"""

from __future__ import annotations

from typing import Any, Callable

import lightning.pytorch as pl

from flopcount.errors import UsageError
from flopcount.measure.harness import checks
from flopcount.measure.harness.meter import Meter, check_meter_kwargs

#: Lightning's precision flags → the dtype of the products.
PRECISION = {"bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16", "16-mixed": "fp16", "16-true": "fp16",
             "16": "fp16", "64-true": "fp64", "64": "fp64", "transformer-engine": "fp8"}


def batch_size_of(batch: Any) -> int:
    """Samples in a batch: the first dim of the first tensor found in it."""
    if hasattr(batch, "shape") and len(batch.shape):
        return int(batch.shape[0])
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            n = batch_size_of(item)
            if n:
                return n
    return 0


class MeterCallback(pl.Callback):
    def __init__(self, *, flops_per_sample: float | None = None, example_inputs: Any = None,
                 monitor: str | None = None, batch_size: Callable[[Any], int] = batch_size_of,
                 **meter_kwargs: Any) -> None:
        where = "lightning MeterCallback"
        self.flops_per_sample = (None if flops_per_sample is None
                                 else checks.positive_finite(where, "flops_per_sample", flops_per_sample))
        self.example_inputs = example_inputs
        if monitor is not None and not isinstance(monitor, str):
            raise UsageError(f"{where}: monitor must be the name of a logged metric (e.g. 'val_acc'), got {monitor!r}")
        self.monitor = monitor
        if not callable(batch_size):
            raise UsageError(f"{where}: batch_size must be a callable batch -> samples, got {batch_size!r}")
        self.batch_size = batch_size
        check_meter_kwargs(where, meter_kwargs)
        self.meter_kwargs = meter_kwargs
        self.meter: Meter | None = None
        self.result = None
        self._step = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or self.meter is not None:
            return
        kwargs = dict(self.meter_kwargs)
        kwargs.setdefault("device", str(pl_module.device))
        precision = PRECISION.get(str(trainer.precision))
        if precision is not None:
            kwargs.setdefault("precision", precision)
        if self.flops_per_sample is not None:
            self.meter = Meter(flops_per_sample=self.flops_per_sample, **kwargs)
            self.meter.detect_fp8(pl_module)
            return
        example = self.example_inputs if self.example_inputs is not None else pl_module.example_input_array
        if example is None:
            raise UsageError("MeterCallback: set the LightningModule's example_input_array, or give example_inputs= "
                             "or flops_per_sample=, so that its training FLOPs can be counted")
        from flopcount.frontends.torch import from_torch

        self.meter = Meter(from_torch(pl_module, example, mode="train"), **kwargs)
        self.meter.detect_fp8(pl_module)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.meter.epoch_start()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._step = self.meter.step(samples=self.batch_size(batch))
        self._step.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.meter.epoch_end()
        if self.meter.timed_epochs and self.meter.flops_per_sample_known():
            _, samples, seconds = self.meter.timed_epochs[-1]
            flops = samples * self.meter.flops_per_sample() / seconds if seconds > 0 else None
            if flops is not None:
                self._log(trainer, {"flopcount/epoch_flops": flops})

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self.monitor is None or self.meter is None:
            return
        value = trainer.callback_metrics.get(self.monitor)
        if value is not None:
            self.meter.quality(float(value), epoch=trainer.current_epoch + 1)

    def on_train_end(self, trainer, pl_module) -> None:
        self.result = self.meter.result()
        figures = {f"flopcount/{k}": v for k, v in self.result.as_dict().items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool)}
        figures["flopcount/samples_per_s"] = self.result.samples_per_s["total"]
        self._log(trainer, {k: v for k, v in figures.items() if v is not None})

    @staticmethod
    def _log(trainer, metrics) -> None:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)
