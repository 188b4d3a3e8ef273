"""The HPC AI500 workloads on synthetic inputs: ``flopcount bench image_classification`` (ResNet-50 v1.5) and
``flopcount bench extreme_weather`` (the Faster R-CNN of :mod:`flopcount.models.detector`).

The inputs are random tensors of the real shapes, made once on the device (no input pipeline is timed), with
random labels, so the runs measure throughput, FLOPS, MFU and energy; their quality is ``None`` ("synthetic data":
no fake accuracy), and so are VFLOPS and time-to-quality. The real data sets (ImageNet, ExtremeWeather) are not
downloaded by flopcount; a user's own loop with :class:`flopcount.Meter` measures those.
"""

from __future__ import annotations

from .common import (Config, Run, autocast, counting_optimizer, grad_scaler, make_meter, optimizer, progress,
                     seed_everything, torch_device, torch_or_error)

IMAGE_CLASSIFICATION = Config(workload="image_classification", batch_size=8, steps=30, optimizer="sgd", lr=0.1,
                              momentum=0.9, quality_exponent=5, target_quality=None,
                              quality_metric="top-1 accuracy (null on synthetic data; HPC AI500 target 0.763)",
                              image_size=(224, 224), warmup_steps=5, window_steps=5)
EXTREME_WEATHER = Config(workload="extreme_weather", batch_size=1, steps=8, optimizer="sgd", lr=0.01,
                         momentum=0.9, quality_exponent=10, target_quality=None,
                         quality_metric="mAP@0.5 (null on synthetic data; HPC AI500 target 0.35)",
                         image_size=(256, 384), warmup_steps=2, window_steps=3, extra={"rois": 64})


def _classifier(cfg: Config):
    from flopcount.models.resnet import resnet50

    return resnet50()


def _detector(cfg: Config):
    from flopcount.models.detector import faster_rcnn_r50

    return faster_rcnn_r50(train_rois=int(cfg.extra.get("rois", 64)))


def _inputs(cfg: Config, channels: int):
    h, w = cfg.image_size
    return (cfg.batch_size, channels, h, w)


def count(cfg: Config):
    from flopcount.frontends.torch import from_torch

    torch = torch_or_error()
    if cfg.workload == "image_classification":
        model, shape = _classifier(cfg), _inputs(cfg, 3)
    else:
        model, shape = _detector(cfg), _inputs(cfg, 16)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return from_torch(model, shape, mode="train", optimizer=counting_optimizer(cfg))


def mllog_fields(cfg: Config) -> dict[str, int]:
    """MLPerf's ``train_samples`` (the steps' samples, one synthetic batch repeated) and ``eval_samples`` (none:
    synthetic data is not evaluated)."""
    return {"train_samples": cfg.steps * cfg.batch_size, "eval_samples": 0}


def _classification_loss(torch, outputs, labels):
    return torch.nn.functional.cross_entropy(outputs, labels)


def _detection_loss(torch, outputs, targets):
    class_logits, box_deltas, rpn_logits, rpn_deltas = outputs
    labels, boxes, objectness, rpn_boxes = targets
    F = torch.nn.functional
    return (F.cross_entropy(class_logits, labels) + F.smooth_l1_loss(box_deltas, boxes)
            + F.binary_cross_entropy_with_logits(rpn_logits, objectness) + F.smooth_l1_loss(rpn_deltas, rpn_boxes))


def train(cfg: Config, report, run: Run = Run()):
    """Train ``cfg.steps`` steps on one synthetic batch under a meter; return the meter. ``run.parallel`` (a
    :class:`flopcount.measure.harness.distributed.DataParallel`) replicates the model with DDP over the ranks."""
    torch = torch_or_error()
    device = torch_device(cfg)
    parallel = run.parallel
    seed_everything(cfg.seed + run.index)
    detector = cfg.workload == "extreme_weather"
    model = (_detector(cfg) if detector else _classifier(cfg)).to(device).train()
    x = torch.randn(*_inputs(cfg, 16 if detector else 3), device=device)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    if detector:
        with torch.no_grad():
            shapes = [t.shape for t in model(x)]
        targets = (torch.randint(0, shapes[0][1], (shapes[0][0],), device=device),
                   torch.randn(shapes[1], device=device), torch.rand(shapes[2], device=device).round(),
                   torch.randn(shapes[3], device=device))
        loss_of = lambda out: _detection_loss(torch, out, targets)  # noqa: E731
    else:
        labels = torch.randint(0, 1000, (cfg.batch_size,), device=device)
        loss_of = lambda out: _classification_loss(torch, out, labels)  # noqa: E731
    if parallel is not None:
        model = parallel.wrap(model)
    opt = optimizer(cfg, model.parameters())
    scaler = grad_scaler(cfg)
    meter = make_meter(cfg, report, run.listeners)
    if parallel is not None:
        meter.communication = parallel.counter
    bar = progress(cfg.steps, f"{cfg.workload} run {run.index}", run.show_progress)
    with meter:  # a signal closes the run (run_stop aborted) and goes on to the caller
        meter.start()
        for _ in range(cfg.steps):
            with meter.step(samples=cfg.batch_size):
                opt.zero_grad(set_to_none=True)
                with autocast(cfg):
                    loss = loss_of(model(x))
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
            bar.update()
    bar.close()
    return meter
