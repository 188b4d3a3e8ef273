"""What a ``transformers`` model built weightlessly does differently in training, settled before its export.

* Parameters the modelling code makes off the meta device: wav2vec2-family models (Hubert, Wav2Vec2,
  Data2VecAudio) make SpecAugment's learned mask vector ``masked_spec_embed`` with the legacy ``torch.Tensor(n)``
  constructor, which ignores ``torch.device("meta")``; one CPU parameter among meta ones sends the example inputs to
  the CPU (the module's first parameter is its device), where every other weight is meta. :func:`on_meta` moves them.
* Layer drop: a stack whose ``forward`` reads a ``layerdrop`` probability p > 0 skips each of its layers with
  probability p in training (``torch.rand([]) < p``), a branch on a random value that no export can hold.
  :func:`every_layer` sets p to 0 for the export, so the count is of the step that runs every layer, and
  :func:`layer_drop_note` says that the expected step runs (1 - p) of those layers' work. The stacks are found from
  the modules (a ``self.layerdrop`` or ``self.config.layerdrop`` that ``forward`` reads and that is a float > 0),
  not from a list of models.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from collections.abc import Iterator
from typing import Any

#: ``self.layerdrop`` or ``self.<attribute>.layerdrop`` (``self.config.layerdrop``) read in a ``forward``'s source.
_READ = re.compile(r"\bself\.((?:\w+\.)?)layerdrop\b")


@dataclasses.dataclass(frozen=True)
class LayerDrop:
    """A stack (``path`` in the model, its class ``kind``) whose layers are dropped with probability ``p``."""

    path: str
    kind: str
    p: float


def on_meta(model) -> None:
    """Move the parameters of ``model`` that are not on the meta device onto it (their values are never read: the
    export is weightless)."""
    import torch

    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is not None and not parameter.is_meta:
                module._parameters[name] = torch.nn.Parameter(parameter.detach().to("meta"),
                                                              requires_grad=parameter.requires_grad)


@contextlib.contextmanager
def every_layer(model, training: bool) -> Iterator[list[LayerDrop]]:
    """Meanwhile, where ``training``, every layer-drop probability of ``model`` is 0 (restored after); yields the
    stacks that drop layers (none outside training)."""
    found: list[LayerDrop] = []
    saved: dict[int, tuple[Any, float]] = {}
    if training:
        for path, module in model.named_modules():
            for holder in _holders(module):
                p = getattr(holder, "layerdrop", None)
                if isinstance(p, float) and p > 0:
                    found.append(LayerDrop(path or type(module).__name__, type(module).__name__, p))
                    saved.setdefault(id(holder), (holder, p))
    try:
        for holder, _ in saved.values():
            holder.layerdrop = 0.0
        yield found
    finally:
        for holder, p in saved.values():
            holder.layerdrop = p


def layer_drop_note(drops: list[LayerDrop]) -> str | None:
    """The report's note on the layer drop of ``drops``; None where there is none."""
    if not drops:
        return None
    stacks = ", ".join(f"{d.path} ({d.kind}) p = {d.p:g}" for d in drops)
    return (f"layer drop: in training, {stacks} skip(s) each of its layers with probability p; the count is of the "
            "step that runs every layer, and the expected step runs (1 - p) of those layers' work")


def _holders(module) -> list[Any]:
    """The objects whose ``layerdrop`` the ``forward`` of ``module`` reads (the module, its configuration)."""
    holders = []
    for attribute in dict.fromkeys(_READ.findall(_source(type(module)))):
        holder = getattr(module, attribute[:-1], None) if attribute else module
        if holder is not None:
            holders.append(holder)
    return holders


_SOURCES: dict[type, str] = {}


def _source(cls: type) -> str:
    if cls not in _SOURCES:
        try:
            _SOURCES[cls] = inspect.getsource(cls.forward)
        except (OSError, TypeError, AttributeError):  # a builtin or generated forward: no source, no layer drop read
            _SOURCES[cls] = ""
    return _SOURCES[cls]
