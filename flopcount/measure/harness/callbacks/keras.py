"""Keras: :class:`MeterCallback` runs :class:`flopcount.Meter` around ``model.fit``.

Sketch (the model and the data are the user's)::

    from flopcount.measure.harness.callbacks.keras import MeterCallback
    cb = MeterCallback(batch_size=64, monitor="val_accuracy", target_quality=0.95, quality_exponent=5)
    model.fit(x, y, batch_size=64, epochs=10, validation_data=(xv, yv), callbacks=[cb])
    print(cb.meter.summary())

The model is counted once, when training begins, through :func:`flopcount.from_keras` in training mode at
``batch_size`` (unless ``flops_per_sample=`` is given). Steps are timed from ``on_train_batch_begin`` to
``on_train_batch_end`` on the host clock (Keras returns from a training step once its results are ready), epochs
from ``on_epoch_begin`` to ``on_epoch_end``, and the ``monitor`` entry of each epoch's logs is the quality.
MFU on a CPU divides by TensorFlow's own measured GEMM ceiling (``tf.linalg.matmul`` on the intra-op threads
TensorFlow uses, :func:`flopcount.measure.machine.ceilings.measured_tf_cpu_device`), never torch's.
Keras hooks do not say how many samples a batch held: every batch counts ``batch_size`` samples, except the last
of an epoch when ``samples_per_epoch=`` is given (then the remainder). ``result`` holds the
:class:`flopcount.RunResult` after training.

Needs Keras 3 with TensorFlow and tf2onnx (``pip install "flopcount[tf]"``: TensorFlow's CPU build); importing this module
imports keras.
"""

from __future__ import annotations

from typing import Any

import keras

from flopcount.errors import UsageError
from flopcount.measure.harness import checks
from flopcount.measure.harness.meter import Meter, check_meter_kwargs


class MeterCallback(keras.callbacks.Callback):
    def __init__(self, batch_size: int, *, flops_per_sample: float | None = None, monitor: str | None = None,
                 samples_per_epoch: int | None = None, **meter_kwargs: Any) -> None:
        super().__init__()
        where = "keras MeterCallback"
        self.batch_size = checks.positive_int(where, "batch_size", batch_size)
        self.flops_per_sample = (None if flops_per_sample is None
                                 else checks.positive_finite(where, "flops_per_sample", flops_per_sample))
        if monitor is not None and not isinstance(monitor, str):
            raise UsageError(f"{where}: monitor must be the name of a logged metric (e.g. 'val_accuracy'), "
                             f"got {monitor!r}")
        self.monitor = monitor
        self.samples_per_epoch = (None if samples_per_epoch is None
                                  else checks.positive_int(where, "samples_per_epoch", samples_per_epoch))
        check_meter_kwargs(where, meter_kwargs)
        self.meter_kwargs = meter_kwargs
        self.meter: Meter | None = None
        self.result = None
        self._step = None
        self._seen = 0

    def on_train_begin(self, logs=None) -> None:
        kwargs = dict(self.meter_kwargs)
        kwargs.setdefault("device", "cpu")
        if self.flops_per_sample is not None:
            self.meter = Meter(flops_per_sample=self.flops_per_sample, **kwargs)
        else:
            from flopcount.frontends.keras import from_keras

            self.meter = Meter(from_keras(self.model, batch=self.batch_size, mode="train"), **kwargs)

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._seen = 0
        self.meter.epoch_start()

    def on_train_batch_begin(self, batch, logs=None) -> None:
        samples = self.batch_size
        if self.samples_per_epoch is not None:
            samples = min(samples, self.samples_per_epoch - self._seen)
            if samples < 1:
                raise UsageError(f"keras MeterCallback: samples_per_epoch={self.samples_per_epoch} is fewer than "
                                 f"the batches of this epoch hold (batch {batch} starts past it); give the epoch's "
                                 "sample count")
        self._seen += samples
        self._step = self.meter.step(samples=samples)
        self._step.__enter__()

    def on_train_batch_end(self, batch, logs=None) -> None:
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.meter.epoch_end()
        if self.monitor is not None and logs and self.monitor in logs:
            self.meter.quality(float(logs[self.monitor]), epoch=epoch + 1)

    def on_train_end(self, logs=None) -> None:
        self.result = self.meter.result(device=self._device())

    def _device(self):
        """The CPU with TensorFlow's own GEMM ceiling at the threads TensorFlow used (the steps ran in TensorFlow,
        not torch); None (the meter's default) when a peak was given or the run was not on a CPU."""
        if self.meter_kwargs.get("peak_flops") is not None or self.meter_kwargs.get("device", "cpu") != "cpu":
            return None
        from flopcount.measure.machine.ceilings import measured_tf_cpu_device

        return measured_tf_cpu_device()
