"""What a torch model does differently in training, settled before its export: a ``transformers`` model built
weightlessly (``--hf``, :mod:`.hf`) and a module of one's own (``--torch``, ``from_torch``: :mod:`.torch`) alike.

* Parameters the modelling code makes off the meta device: wav2vec2-family models (Hubert, Wav2Vec2,
  Data2VecAudio) make SpecAugment's learned mask vector ``masked_spec_embed`` with the legacy ``torch.Tensor(n)``
  constructor, which ignores ``torch.device("meta")``; one CPU parameter among meta ones sends the example inputs to
  the CPU (the module's first parameter is its device), where every other weight is meta. :func:`on_meta` moves them.
* Layer drop: a stack whose ``forward`` reads a ``layerdrop`` probability p > 0 skips each of its layers with
  probability p in training (``torch.rand([]) < p``), a branch on a random value that no export can hold.
  :func:`every_layer` sets p to 0 for the export, so the count is of the step that runs every layer, and
  :func:`training_notes` says that the expected step runs (1 - p) of those layers' work. The stacks are found from
  the modules (a ``self.layerdrop`` or ``self.config.layerdrop`` that ``forward`` reads and that is a float > 0),
  not from a list of models, so a hand-built stack that reads its own ``self.layerdrop`` is settled as transformers'
  are.
* SpecAugment: a module whose class reads ``mask_time_prob`` or ``mask_feature_prob`` > 0 (wav2vec2's
  ``_mask_hidden_states``) draws the masked positions in numpy at the traced batch, a constant that would fix the
  graph's batch; :func:`every_layer` sets them to 0 too, and the note says the mask's select is not counted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Any

#: The probabilities set to 0 for a training export, each with whether it is read anywhere in the module's class
#: (SpecAugment's, in ``_mask_hidden_states``) rather than in its ``forward`` (layer drop's); read as ``self.NAME`` or
#: ``self.<attribute>.NAME`` (``self.config.layerdrop``).
_SETTLED = (("layerdrop", False), ("mask_time_prob", True), ("mask_feature_prob", True))


@dataclasses.dataclass(frozen=True)
class Settled:
    """A probability ``attribute`` = ``p`` that the module at ``path`` (its class ``kind``; "" for the model itself)
    reads in training."""

    path: str
    kind: str
    attribute: str
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
def every_layer(model, training: bool) -> Iterator[list[Settled]]:
    """Meanwhile, where ``training``, every layer-drop and SpecAugment probability of ``model`` is 0 (restored
    after); yields what was set (nothing outside training)."""
    found: list[Settled] = []
    saved: dict[tuple[int, str], tuple[Any, str, float]] = {}
    if training:
        for path, module in model.named_modules():
            for attribute, whole in _SETTLED:
                for holder in _holders(module, attribute, whole):
                    p = getattr(holder, attribute, None)
                    if isinstance(p, float) and p > 0:
                        found.append(Settled(path, type(module).__name__, attribute, p))
                        saved.setdefault((id(holder), attribute), (holder, attribute, p))
    try:
        for holder, attribute, _ in saved.values():
            setattr(holder, attribute, 0.0)
        yield found
    finally:
        for holder, attribute, p in saved.values():
            setattr(holder, attribute, p)


def settled(count: Callable[[Any], Any], training: bool) -> Callable[[Any], Any]:
    """``count`` (of a model) made under :func:`every_layer` of the model it is given."""
    def count_settled(model):
        with every_layer(model, training):
            return count(model)

    return count_settled


def training_notes(settled: list[Settled]) -> list[str]:
    """The report's notes on what :func:`every_layer` set to 0 for the export."""
    notes = []
    drops = [s for s in settled if s.attribute == "layerdrop"]
    if drops:
        stacks = ", ".join(f"{d.path or 'the model'} ({d.kind}) p = {d.p:g}" for d in drops)
        notes.append(f"layer drop: in training, {stacks} skip(s) each of its layers with probability p; the count is "
                     "of the step that runs every layer, and the expected step runs (1 - p) of those layers' work")
    masks = [s for s in settled if s.attribute != "layerdrop"]
    if masks:
        where = ", ".join(f"{m.path or 'the model'} ({m.kind}) {m.attribute} = {m.p:g}" for m in masks)
        notes.append(f"SpecAugment: in training, {where} set(s) a random fraction of the hidden states to a learned "
                     "vector (time) or to 0 (features), positions drawn in numpy, which no export can hold; the count "
                     "is of the step without the mask: its select (one an element) and the vector's gradient are not "
                     "counted")
    return notes


def with_notes(report, settled: list[Settled]):
    """``report`` with :func:`training_notes` of ``settled`` added to its notes (``report`` itself where nothing was
    settled)."""
    if not settled:
        return report
    return dataclasses.replace(report, notes=(*report.notes, *training_notes(settled)))


def _holders(module, attribute: str, whole: bool) -> list[Any]:
    """The objects whose ``attribute`` the code of ``module`` reads (``forward``'s, or its class's where
    ``whole``): the module, its configuration."""
    holders = []
    read = re.compile(rf"\bself\.((?:\w+\.)?){attribute}\b")
    for path in dict.fromkeys(read.findall(_source(type(module), whole))):
        holder = getattr(module, path[:-1], None) if path else module
        if holder is not None:
            holders.append(holder)
    return holders


_SOURCES: dict[tuple[type, bool], str] = {}


def _source(cls: type, whole: bool) -> str:
    if (cls, whole) not in _SOURCES:
        try:
            _SOURCES[cls, whole] = inspect.getsource(cls if whole else cls.forward)
        except (OSError, TypeError, AttributeError):  # builtin or generated code: no source, nothing read
            _SOURCES[cls, whole] = ""
    return _SOURCES[cls, whole]
