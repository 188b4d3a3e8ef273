"""What the benchmark workloads share: their configuration, the precision context, the optimizer, progress bars
and the meter they train under."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from flopcount.errors import DeviceError, UsageError, import_framework

#: The precisions a workload trains in (autocast for bf16 and fp16).
PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Config:
    """One benchmark's configuration, recorded in the report's ``config``."""

    workload: str
    device: str = "cpu"
    precision: str = "fp32"
    batch_size: int = 32
    max_epochs: int | None = None  # train on real data until the target or this many epochs
    steps: int | None = None  # synthetic data: this many steps
    optimizer: str = "sgd"
    lr: float = 0.1
    lr_policy: str = "constant"
    momentum: float = 0.9
    seed: int = 0
    channels_last: bool = False
    target_quality: float | None = None
    quality_exponent: float | None = None
    quality_metric: str | None = None
    warmup_steps: int = 5
    window_steps: int = 20
    peak_flops: float | None = None
    image_size: tuple[int, ...] | None = None
    threads: int | None = None
    data: str = "synthetic"
    extra: Mapping[str, Any] = field(default_factory=dict)
    parallel: Mapping[str, Any] | None = None  # the run's ParallelPlan as a mapping (bench --parallel)
    recompute: str = "none"  # what the run recomputes (bench --recompute)
    machine: str | None = None  # a machine profile: the step predicted beside the measured one (bench --machine)

    def replace(self, **changes: Any) -> "Config":
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        return d


def torch_or_error():
    try:
        return import_framework("torch")
    except ModuleNotFoundError:
        raise DeviceError("flopcount bench trains with PyTorch, which is not installed: pip install torch "
                          "'flopcount[measure]' (on a CPU-only machine, a CPU build of torch)") from None


def torch_device(cfg: Config):
    torch = torch_or_error()
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise DeviceError(f"--device {cfg.device}: torch sees no CUDA device (a CPU build of torch, no driver, or "
                          "CUDA_VISIBLE_DEVICES is empty); use --device cpu")
    if cfg.device != "cpu" and not cfg.device.startswith("cuda"):
        raise UsageError(f"--device {cfg.device!r}: expected cpu, cuda or cuda:N")
    return torch.device(cfg.device)


def autocast(cfg: Config) -> contextlib.AbstractContextManager:
    """Mixed precision for bf16/fp16 (autocast on the device), nothing for fp32."""
    if cfg.precision == "fp32":
        return contextlib.nullcontext()
    torch = torch_or_error()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[cfg.precision]
    return torch.autocast(device_type="cuda" if cfg.device.startswith("cuda") else "cpu", dtype=dtype)


def grad_scaler(cfg: Config):
    """A gradient scaler for fp16 on CUDA (fp16's range needs one); None otherwise."""
    if cfg.precision == "fp16" and cfg.device.startswith("cuda"):
        return torch_or_error().amp.GradScaler("cuda")
    return None


def optimizer(cfg: Config, params):
    torch = torch_or_error()
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum)
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr)
    raise UsageError(f"optimizer {cfg.optimizer!r}: expected sgd or adam")


def counting_optimizer(cfg: Config) -> str:
    """The name flopcount's count uses for the update step of ``cfg.optimizer``."""
    return {"sgd": "momentum" if cfg.momentum else "sgd", "adam": "adam"}[cfg.optimizer]


def progress(total: int | None, desc: str, enabled: bool):
    """A tqdm bar on stderr when it is a terminal (and tqdm is installed); a no-op object otherwise."""
    if enabled and sys.stderr.isatty():
        try:
            from tqdm import tqdm

            return tqdm(total=total, desc=desc, unit="step", leave=False, file=sys.stderr)
        except ImportError:
            pass
    return _NoBar()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


def make_meter(cfg: Config, report, listeners: tuple[Callable, ...] = ()):
    """The meter a workload trains under: its FLOPs from ``report``, the configuration's target, warm-up, windows,
    peak and precision (autocast runs inside the steps, so the precision is stated, not sampled)."""
    from flopcount.measure.harness.meter import Meter
    from flopcount.parallel.plan import ParallelPlan

    plan = ParallelPlan(**cfg.parallel) if cfg.parallel is not None else None
    meter = Meter(report, plan=plan, target_quality=cfg.target_quality, quality_exponent=cfg.quality_exponent,
                  device=cfg.device, precision=None if cfg.precision == "fp32" else cfg.precision,
                  peak_flops=cfg.peak_flops, recompute=cfg.recompute, warmup_steps=cfg.warmup_steps,
                  window_steps=cfg.window_steps, machine=cfg.machine)
    for listener in listeners:
        meter.subscribe(listener)
    return meter


def seed_everything(seed: int) -> None:
    import random

    import numpy as np

    torch = torch_or_error()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass(frozen=True)
class Run:
    """One training run of a workload as the bench command asks for it: its number ``index`` (seeded
    ``cfg.seed + index``), the meter's event listeners, whether a progress bar may show, and the data-parallel
    layout (a :class:`~flopcount.measure.harness.distributed.DataParallel` or
    :class:`~flopcount.measure.harness.ensemble.Ensemble` under torch.distributed; None: one process)."""

    index: int = 0
    listeners: tuple[Callable, ...] = ()
    show_progress: bool = True
    parallel: Any = None


@dataclass(frozen=True)
class EpochLoop:
    """What :func:`train_epochs` trains: the model, its optimizer and loss, the training rows and labels, their
    order in each epoch (``order(epoch)``, a permutation of the rows), the evaluation that gives each epoch's
    quality (``evaluate() -> float``), and the progress bar."""

    model: Any
    opt: Any
    loss_fn: Callable
    xtr: Any
    ytr: Any
    order: Callable[[int], Any]
    evaluate: Callable[[], float]
    bar: Any


def train_epochs(cfg: Config, meter, loop: EpochLoop) -> None:
    """The benchmarks' epoch loop: each epoch's batches, taken in ``loop.order(epoch)`` through the meter's loader,
    one timed step a batch (in ``cfg``'s autocast, channels-last where asked), then ``loop.evaluate()`` as the
    epoch's quality; it stops once the meter's target is reached, and stops the meter."""
    with meter:  # a signal closes the run (run_stop aborted) and goes on to the caller
        _epochs(cfg, meter, loop)
    loop.bar.close()


def _epochs(cfg: Config, meter, loop: EpochLoop) -> None:
    import torch

    device, xtr, ytr, bar = loop.xtr.device, loop.xtr, loop.ytr, loop.bar
    for epoch in range(1, cfg.max_epochs + 1):
        rows = loop.order(epoch)
        batches = ((xtr[idx], ytr[idx]) for idx in (rows[i:i + cfg.batch_size].to(device)
                                                    for i in range(0, len(rows), cfg.batch_size)))
        for x, y in meter.loader(batches):
            if cfg.channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            with meter.step(samples=len(x)):
                loop.opt.zero_grad(set_to_none=True)
                with autocast(cfg):
                    loss = loop.loss_fn(loop.model(x), y)
                loss.backward()
                loop.opt.step()
            bar.update()
        with meter.evaluating(epoch):
            acc = loop.evaluate()
            meter.quality(acc, epoch=epoch)
        bar.set_postfix_str(f"epoch {epoch} accuracy {acc:.4f}")
        if meter.reached():
            break

