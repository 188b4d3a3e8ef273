"""``flopcount bench digits``: the digits CNN (:mod:`flopcount.models.digits`) trained on scikit-learn's bundled
handwritten digits to a target test accuracy.

A real data set and a real quality, so VFLOPS and time-to-quality are real numbers on any machine, in seconds on a
CPU. The 1,797 images (8×8, grey levels 0-16 scaled to [0, 1]) are split 80/20, stratified, with a fixed seed
(1,437 training and 360 test images); each epoch visits the training set in a seeded random order; the test
accuracy is evaluated after every epoch, and training stops at the first epoch whose accuracy reaches the target
(time-to-quality) or after ``max_epochs``.

The loss (cross-entropy) is not part of the counted graph, as in HPC AI500's per-image FLOPs: C is the model's
forward and backward per sample; the optimizer's update is reported apart.
"""

from __future__ import annotations

from .common import (Config, EpochLoop, Run, counting_optimizer, make_meter, optimizer, progress, seed_everything,
                     torch_device, torch_or_error, train_epochs)

DEFAULTS = Config(workload="digits", data="sklearn.datasets.load_digits", batch_size=32, max_epochs=30,
                  optimizer="adam", lr=3e-3, momentum=0.0, target_quality=0.95, quality_exponent=5,
                  quality_metric="test accuracy (top-1)", warmup_steps=5, window_steps=20)
TEST_FRACTION = 0.2
SPLIT_SEED = 0


def load_data(device=None):
    """(x_train, y_train, x_test, y_test) tensors of the bundled digits, N×1×8×8 float32 in [0, 1]."""
    torch = torch_or_error()
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        from flopcount.errors import DeviceError

        raise DeviceError("flopcount bench digits needs scikit-learn for its bundled data set: "
                          "pip install 'flopcount[measure]'") from None
    import numpy as np

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=TEST_FRACTION, random_state=SPLIT_SEED, stratify=y)
    out = [torch.from_numpy(a) for a in (xtr, ytr, xte, yte)]
    return [t.to(device) for t in out] if device is not None else out


def build_model(cfg: Config):
    from flopcount.models.digits import digits_cnn

    torch = torch_or_error()
    model = digits_cnn()
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def count(cfg: Config):
    """The counting report of one training step at the configured batch size (forward + backward; the
    optimizer's update apart)."""
    from flopcount.frontends.torch import from_torch

    return from_torch(build_model(cfg), (cfg.batch_size, 1, 8, 8), mode="train",
                      optimizer=counting_optimizer(cfg))


def mllog_fields(cfg: Config) -> dict[str, int]:
    """MLPerf's ``train_samples`` and ``eval_samples``: the sizes of the bundled split (1,437 and 360)."""
    xtr, _, xte, _ = load_data()
    return {"train_samples": len(xtr), "eval_samples": len(xte)}


def probabilities(model, x, batch: int = 512):
    """The model's class probabilities (softmax) on ``x``, in evaluation mode."""
    torch = torch_or_error()
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(x[i:i + batch]).softmax(1) for i in range(0, len(x), batch)])
    model.train()
    return out


def accuracy(model, x, y, batch: int = 512) -> float:
    torch = torch_or_error()
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x)


def train(cfg: Config, report, run: Run = Run()):
    """Train once (seed ``cfg.seed + run.index``) under a meter; return the meter (its result is formed by the
    caller).

    ``run.parallel`` (a :class:`flopcount.measure.harness.distributed.DataParallel` or
    :class:`flopcount.measure.harness.ensemble.Ensemble`) trains data-parallel under torch.distributed: DDP over the
    model's ranks, each rank a shard of each epoch (of the model's bootstrap sample in an ensemble), the test
    accuracy of the models' averaged predictions, the same on every rank, deciding when to stop."""
    torch = torch_or_error()
    device = torch_device(cfg)
    seed, parallel = cfg.seed + run.index, run.parallel
    seed_everything(seed)
    xtr, ytr, xte, yte = load_data(device)
    if parallel is not None:
        torch.manual_seed(parallel.seed(seed))
    net = build_model(cfg).to(device)
    model = parallel.wrap(net) if parallel is not None else net
    sampler = parallel.sampler(len(xtr), seed) if parallel is not None else None
    opt = optimizer(cfg, model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    meter = make_meter(cfg, report, run.listeners)
    if parallel is not None:
        meter.communication, meter.ensemble = parallel.counter, parallel
    gen = torch.Generator().manual_seed(seed)
    steps_per_epoch = -(-len(xtr) // cfg.batch_size)
    bar = progress(steps_per_epoch * cfg.max_epochs, f"digits run {run.index}", run.show_progress)
    model.train()

    def evaluate() -> float:
        if parallel is None:
            return accuracy(net, xte, yte)
        return parallel.evaluate(probabilities(net, xte), yte)[1]

    order = sampler if sampler is not None else (lambda epoch: torch.randperm(len(xtr), generator=gen))
    train_epochs(cfg, meter, EpochLoop(model, opt, loss_fn, xtr, ytr, order, evaluate, bar))
    meter.model = net
    return meter
