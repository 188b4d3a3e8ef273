"""``flopcount bench image_classification --data DIR``: ResNet-50 v1.5 trained on the user's own images, laid out
as an ImageFolder (one subfolder per class holding its JPEG and PNG files), to a target top-1 accuracy on a real
evaluation split.

The split: when DIR holds ``train/`` and ``val/`` (each with the same class subfolders, ImageNet's layout), those;
otherwise every class's files, sorted by name and shuffled with a fixed seed, give :data:`EVAL_FRACTION` of them
(at least one of a class with two or more) to evaluation and the rest to training. Images are read with Pillow
(torchvision is not needed), converted to RGB, resized to ``--image-size`` (default 224×224, bilinear), scaled to
[0, 1] and normalised with ImageNet's mean and standard deviation; every image is decoded once per process and held
in memory, so the timed steps read no files. Each epoch visits the training set in a seeded random order; the
accuracy on the evaluation split is taken after every epoch (an MLPerf eval interval), and training stops at the
first epoch reaching the target (time-to-quality) or after ``--epochs``.

C is ResNet-50's forward and backward per sample at the configured size, with a fully connected layer to the
folder's class count; the loss is outside the counted graph and the optimizer's update is reported apart.
"""

from __future__ import annotations

import functools
import os
import random
from dataclasses import dataclass

from flopcount.errors import DeviceError, UsageError

from .common import (Config, EpochLoop, Run, counting_optimizer, make_meter, optimizer, progress, seed_everything,
                     torch_device, torch_or_error, train_epochs)

DEFAULTS = Config(workload="image_classification", batch_size=32, max_epochs=30, optimizer="sgd", lr=0.1,
                  momentum=0.9, target_quality=0.763, quality_exponent=5,
                  quality_metric="top-1 accuracy on the evaluation split (HPC AI500 target 0.763)",
                  image_size=(224, 224), warmup_steps=5, window_steps=20)
#: Image files read, by suffix (case-insensitive).
EXTENSIONS = (".jpg", ".jpeg", ".png")
#: The share of each class's images held out for evaluation when DIR has no train/ and val/ of its own.
EVAL_FRACTION = 0.2
SPLIT_SEED = 0
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Folder:
    """An ImageFolder split: class names (subfolder names, sorted), the (file, label) pairs of each split, and how
    the split was made."""

    root: str
    classes: tuple[str, ...]
    train: tuple[tuple[str, int], ...]
    eval: tuple[tuple[str, int], ...]
    split_how: str


def _images(folder: str) -> list[str]:
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                  if f.lower().endswith(EXTENSIONS) and os.path.isfile(os.path.join(folder, f)))


def _class_folders(root: str) -> dict[str, list[str]]:
    return {d: _images(os.path.join(root, d)) for d in sorted(os.listdir(root))
            if os.path.isdir(os.path.join(root, d)) and _images(os.path.join(root, d))}


def scan(root: str) -> Folder:
    """The classes and the split of the ImageFolder at ``root`` (no image is decoded here)."""
    if not os.path.isdir(root):
        raise UsageError(f"--data {root}: no such folder (give an ImageFolder: one subfolder per class of JPEG/PNG "
                         "images)")
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    if os.path.isdir(train_dir) and os.path.isdir(val_dir):
        train, val = _class_folders(train_dir), _class_folders(val_dir)
        classes = tuple(sorted(train))
        if set(val) - set(train):
            raise UsageError(f"--data {root}: val/ has classes train/ lacks: {', '.join(sorted(set(val) - set(train)))}")
        index = {c: i for i, c in enumerate(classes)}
        pairs = (tuple((f, index[c]) for c in classes for f in train[c]),
                 tuple((f, index[c]) for c in sorted(val) for f in val[c]))
        how = "the folder's own train/ and val/"
    else:
        by_class = _class_folders(root)
        classes = tuple(by_class)
        rng = random.Random(SPLIT_SEED)
        train_pairs, eval_pairs = [], []
        for label, c in enumerate(classes):
            files = list(by_class[c])
            rng.shuffle(files)
            held = 0 if len(files) < 2 else max(1, round(EVAL_FRACTION * len(files)))
            eval_pairs += [(f, label) for f in files[:held]]
            train_pairs += [(f, label) for f in files[held:]]
        pairs = (tuple(train_pairs), tuple(eval_pairs))
        how = f"{EVAL_FRACTION:.0%} of each class held out (seeded shuffle, seed {SPLIT_SEED})"
    if len(classes) < 2:
        raise UsageError(f"--data {root}: {len(classes)} class subfolder(s) holding JPEG/PNG images; an ImageFolder "
                         "needs one subfolder per class, at least two")
    if not pairs[1]:
        raise UsageError(f"--data {root}: no image left for evaluation; give each class two images or more")
    return Folder(root, classes, pairs[0], pairs[1], how)


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise DeviceError("flopcount bench --data reads images with Pillow, which is not installed: "
                          "pip install Pillow") from None
    return Image


@functools.lru_cache(maxsize=4)
def load(files: tuple[tuple[str, int], ...], image_size: tuple[int, int]):
    """(images N×3×H×W float32 normalised, labels N int64) of ``files``, decoded once per process."""
    import numpy as np

    torch = torch_or_error()
    Image = _pil()
    h, w = image_size
    out = np.empty((len(files), 3, h, w), dtype=np.float32)
    for i, (path, _) in enumerate(files):
        try:
            with Image.open(path) as im:
                rgb = im.convert("RGB").resize((w, h), Image.BILINEAR)
        except (OSError, ValueError) as e:
            raise UsageError(f"{path}: cannot be read as an image ({e}); remove it from --data or fix it") from None
        out[i] = (np.asarray(rgb, dtype=np.float32) / 255.0).transpose(2, 0, 1)
    mean = np.asarray(MEAN, dtype=np.float32).reshape(1, 3, 1, 1)
    std = np.asarray(STD, dtype=np.float32).reshape(1, 3, 1, 1)
    x = torch.from_numpy((out - mean) / std)
    return x, torch.tensor([label for _, label in files], dtype=torch.int64)


def build_model(cfg: Config, classes: int):
    from flopcount.models.resnet import resnet50

    torch = torch_or_error()
    model = resnet50(num_classes=classes)
    if cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model


def count(cfg: Config):
    """The counting report of one training step of ResNet-50 over the folder's classes."""
    from flopcount.frontends.torch import from_torch

    folder = scan(cfg.data)
    h, w = cfg.image_size
    return from_torch(build_model(cfg, len(folder.classes)), (cfg.batch_size, 3, h, w), mode="train",
                      optimizer=counting_optimizer(cfg))


def mllog_fields(cfg: Config) -> dict[str, int]:
    """MLPerf's ``train_samples`` and ``eval_samples``: the sizes of the two splits."""
    folder = scan(cfg.data)
    return {"train_samples": len(folder.train), "eval_samples": len(folder.eval)}


def probabilities(model, x, batch: int = 64):
    """Class probabilities of ``model`` (put back in training mode after) on every row of ``x``."""
    torch = torch_or_error()
    model.eval()
    with torch.no_grad():
        probs = torch.cat([torch.softmax(model(x[i:i + batch]).float(), dim=1) for i in range(0, len(x), batch)])
    model.train()
    return probs


def accuracy(model, x, y, batch: int = 64) -> float:
    return (probabilities(model, x, batch).argmax(1) == y).float().mean().item()


def train(cfg: Config, report, run: Run = Run()):
    """Train once (seed ``cfg.seed + run.index``) under a meter, evaluating after every epoch; return the meter.

    ``run.parallel`` (:class:`flopcount.measure.harness.distributed.DataParallel`, under torchrun or srun) trains
    data-parallel: DDP over the ranks, each rank a shard of each epoch's order, the same model on every rank, whose
    accuracy on the evaluation split decides when to stop."""
    torch = torch_or_error()
    device = torch_device(cfg)
    folder = scan(cfg.data)
    xtr, ytr = (t.to(device) for t in load(folder.train, tuple(cfg.image_size)))
    xev, yev = (t.to(device) for t in load(folder.eval, tuple(cfg.image_size)))
    seed, parallel = cfg.seed + run.index, run.parallel
    seed_everything(seed)
    if parallel is not None:
        torch.manual_seed(parallel.seed(seed))
    net = build_model(cfg, len(folder.classes)).to(device).train()
    model = parallel.wrap(net) if parallel is not None else net
    opt = optimizer(cfg, model.parameters())
    loss_fn = torch.nn.CrossEntropyLoss()
    meter = make_meter(cfg, report, run.listeners)
    gen = torch.Generator().manual_seed(seed)
    if parallel is not None:
        meter.communication, meter.ensemble = parallel.counter, parallel
        order = parallel.sampler(len(xtr), seed)
    else:
        order = lambda epoch: torch.randperm(len(xtr), generator=gen)  # noqa: E731

    def evaluate() -> float:
        if parallel is None:
            return accuracy(net, xev, yev)
        return parallel.evaluate(probabilities(net, xev), yev)[1]

    bar = progress(-(-len(xtr) // cfg.batch_size) * cfg.max_epochs, f"image_classification run {run.index}",
                   run.show_progress)
    train_epochs(cfg, meter, EpochLoop(model, opt, loss_fn, xtr, ytr, order, evaluate, bar))
    meter.model = net
    return meter
