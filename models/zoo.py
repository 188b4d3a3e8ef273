"""The reference models by name, with the example inputs they are exported and counted at.

:data:`MODELS` maps a name to a :class:`ModelSpec`; :func:`build` returns a freshly initialised module (random
weights) and zero-valued example inputs. The command line of :mod:`export` and ``benchmarks/reconcile.py`` read
this table, so both export the same graphs.

=================  ==================================================  ==============================
name               model                                               example input (batch 1 unless
                                                                       stated)
=================  ==================================================  ==============================
resnet50           ResNet-50 v1.5 (:mod:`resnet`)                      images 1x3x224x224
resnext50-32x4d    ResNeXt-50 32x4d (:mod:`resnext`)                   images 1x3x224x224
mobilenet-v2       MobileNetV2, width 1.0 (:mod:`mobilenet`)           images 1x3x224x224
vit-b16            ViT-B/16 (:mod:`transformer`)                       images 1x3x224x224
bert-base          BERT-base encoder + pooler (:mod:`transformer`)     token ids 1x128
gpt2-small         GPT-2 small with tied LM head (:mod:`transformer`)  token ids 1x1024
lstm               2-layer LSTM, input 64, hidden 128 (:mod:`lstm`)    features 4x35x64 (batch 4)
=================  ==================================================  ==============================

Importing this module does not import torch; :func:`build` does.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["MODELS", "Built", "ModelSpec", "Options", "build"]


@dataclass(frozen=True)
class Options:
    """Size options; None means the model's own default (the full-size model of the table above)."""

    batch_size: int | None = None
    image_size: int | None = None
    num_classes: int | None = None
    seq_len: int | None = None
    layers: int | None = None
    attention: str | None = None  # "sdpa" or "matmul" (see transformer.SelfAttention)


@dataclass(frozen=True)
class ModelSpec:
    """How to build one reference model and its example inputs."""

    summary: str
    factory: Callable[[Options], Any]  # Options -> torch.nn.Module
    example: Callable[[Options], tuple[Any, ...]]  # Options -> example tensors
    options: frozenset[str]  # the Options fields (besides batch_size) that apply
    input_names: tuple[str, ...] = ("input",)
    output_names: tuple[str, ...] = ("logits",)
    default_batch: int = 1


@dataclass(frozen=True)
class Built:
    """A module ready to export: random weights, zero-valued inputs, graph input and output names."""

    module: Any
    inputs: tuple[Any, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]


def _sibling(name: str) -> Any:
    """A sibling module, whether this one was imported as ``flopcount.models.zoo`` or run from ``models/``."""
    return importlib.import_module(f"{__package__}.{name}" if __package__ else name)


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


def _images(o: Options) -> tuple[Any, ...]:
    import torch

    size = _or(o.image_size, 224)
    return (torch.zeros(o.batch_size, 3, size, size),)


def _tokens(default_seq: int) -> Callable[[Options], tuple[Any, ...]]:
    def example(o: Options) -> tuple[Any, ...]:
        import torch

        return (torch.zeros(o.batch_size, _or(o.seq_len, default_seq), dtype=torch.long),)

    return example


def _features(default_seq: int, features: int) -> Callable[[Options], tuple[Any, ...]]:
    def example(o: Options) -> tuple[Any, ...]:
        import torch

        return (torch.zeros(o.batch_size, _or(o.seq_len, default_seq), features),)

    return example


_IMAGE = frozenset({"image_size", "num_classes"})
_TEXT = frozenset({"seq_len", "layers", "attention"})

MODELS: dict[str, ModelSpec] = {
    "resnet50": ModelSpec(
        "ResNet-50 v1.5",
        lambda o: _sibling("resnet").resnet50(num_classes=_or(o.num_classes, 1000)),
        _images,
        _IMAGE,
    ),
    "resnext50-32x4d": ModelSpec(
        "ResNeXt-50 32x4d",
        lambda o: _sibling("resnext").resnext50_32x4d(num_classes=_or(o.num_classes, 1000)),
        _images,
        _IMAGE,
    ),
    "mobilenet-v2": ModelSpec(
        "MobileNetV2, width 1.0",
        lambda o: _sibling("mobilenet").mobilenet_v2(num_classes=_or(o.num_classes, 1000)),
        _images,
        _IMAGE,
    ),
    "vit-b16": ModelSpec(
        "ViT-B/16",
        lambda o: _sibling("transformer").vit(
            layers=_or(o.layers, 12), image_size=_or(o.image_size, 224), num_classes=_or(o.num_classes, 1000),
            attention=_or(o.attention, "sdpa"),
        ),
        _images,
        _IMAGE | {"layers", "attention"},
    ),
    "bert-base": ModelSpec(
        "BERT-base encoder and pooler",
        lambda o: _sibling("transformer").bert(layers=_or(o.layers, 12), attention=_or(o.attention, "sdpa")),
        _tokens(128),
        _TEXT,
        input_names=("input_ids",),
        output_names=("last_hidden_state", "pooler_output"),
    ),
    "gpt2-small": ModelSpec(
        "GPT-2 small, causal, LM head tied",
        lambda o: _sibling("transformer").gpt2(layers=_or(o.layers, 12), attention=_or(o.attention, "sdpa")),
        _tokens(1024),
        _TEXT,
        input_names=("input_ids",),
    ),
    "lstm": ModelSpec(
        "2-layer LSTM, input 64, hidden 128",
        lambda o: _sibling("lstm").lstm(num_layers=_or(o.layers, 2)),
        _features(35, 64),
        frozenset({"seq_len", "layers"}),
        output_names=("output",),
        default_batch=4,
    ),
}


def build(name: str, options: Options | None = None, **overrides: Any) -> Built:
    """Build model ``name`` with random weights and its zero-valued example inputs.

    ``overrides`` are :class:`Options` fields. An option the model does not take raises ``ValueError``.
    Seed torch first (``torch.manual_seed``) for reproducible weights.

    Examples
    --------
    >>> built = build("bert-base", layers=2, seq_len=16)
    >>> len(built.module.blocks), tuple(built.inputs[0].shape), built.output_names
    (2, (1, 16), ('last_hidden_state', 'pooler_output'))
    """
    try:
        spec = MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}") from None
    options = dataclasses.replace(options or Options(), **overrides)
    given = {f.name for f in dataclasses.fields(options) if getattr(options, f.name) is not None} - {"batch_size"}
    if given - spec.options:
        raise ValueError(f"{name} does not take {', '.join(sorted(given - spec.options))}")
    options = dataclasses.replace(options, batch_size=_or(options.batch_size, spec.default_batch))
    return Built(spec.factory(options), spec.example(options), spec.input_names, spec.output_names)
