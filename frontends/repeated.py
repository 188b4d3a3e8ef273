"""The stack of layers of a transformers model, shown to repeat, and the smaller versions it is counted from.

A decoder-only language model is an embedding, L decoder layers and a head. When the L layers are the same
computation, the model's count is affine in L and :func:`flopcount.derived.extension.extend` extends the counts of its 1-
and 2-layer versions exactly, which spares exporting all L. Likewise when, after its first a layers, the stack
repeats a block of p layers (Gemma's alternating sliding and full layers: a = 0, p = 2; DeepSeek's dense first
layers, then MoE layers: p = 1; Qwen2's full layers up to ``max_window_layers``, then windowed ones): it is
counted from a + p and a + 2p layers. Each layer's kind is its description, and identity is shown, never assumed:

* the stack is the one ``torch.nn.ModuleList`` of the model with ``config.num_hidden_layers`` (L ≥ 3) entries,
  and the configuration is not an encoder-decoder's;
* a layer's description is, per submodule, its class (name and source digest), its parameters' and buffers'
  names, shapes and dtypes, and every attribute its ``forward`` may read, configurations included (described as
  the export cache describes them, :class:`flopcount.frontends.common.StateDescriber`), except the layer's own
  index (``layer_idx``, which must equal its position) and the number of layers; and its entry of each of the
  configuration's lists named for layers (``layer_types``), which the smaller configurations shorten. Other lists
  of L entries must hold one value;
* the kinds by layer split into a first a and a block of p repeated three times or more (:func:`repeats`, the
  cheapest a + 2p);
* the smaller models, built from the configuration with only ``num_hidden_layers`` and the per-layer lists
  shortened, have layers with the full model's first descriptions, and the full model's parameters are those of
  the a + p layer model plus (L − a)/p − 1 times what a block adds.

Anything else, and the whole model is exported: :func:`layer_stack` returns the reason.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from flopcount.reporting.layers import EXPORTED, RepeatedLayers

from . import common

__all__ = ["LayerStack", "layer_stack", "per_layer_lists", "repeats"]

#: Attributes that hold a layer's position in its stack (read for KV-cache slots, which a count without cache
#: does not use); they must equal the position and are left out of the comparison.
INDEX_ATTRIBUTES = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number"})


@dataclass(frozen=True)
class LayerStack:
    """The stack at ``path`` (``model.layers``) of ``layers`` layers, each described by its entry of
    ``descriptions`` (see :func:`describe_layer`): its first ``first`` layers, then a block of ``period`` layers
    repeated ``blocks`` times (``first`` 0 and ``period`` 1: identical layers). ``per_layer`` names the
    configuration's per-layer lists, which :meth:`config_of` shortens."""

    path: str
    layers: int
    descriptions: tuple[str, ...]
    per_layer: tuple[str, ...]
    first: int = 0
    period: int = 1

    @property
    def blocks(self) -> int:
        return (self.layers - self.first) // self.period

    @property
    def sizes(self) -> tuple[int, int]:
        """The layers of the two smaller models counted: one block and two after the first layers."""
        return self.first + self.period, self.first + 2 * self.period

    def summary(self) -> str:
        if self.first == 0 and self.period == 1:
            return f"{self.layers} identical layers: counted from exports of 1 and 2 layers, extended exactly"
        shape = (f"the first {self.first}, then " if self.first else "") + (
            f"a block of {self.period} layers" if self.period > 1 else "identical layers")
        return (f"{self.layers} layers, {shape} repeated {self.blocks} times: counted from exports of "
                f"{self.sizes[0]} and {self.sizes[1]} layers, extended exactly")

    def config_of(self, config, layers: int):
        """A copy of ``config`` with ``layers`` layers: ``num_hidden_layers`` and the per-layer lists shortened."""
        small = copy.deepcopy(config)
        small.num_hidden_layers = layers
        for name in self.per_layer:
            value = getattr(small, name)
            setattr(small, name, type(value)(value[:layers]))
        return small

    def compare(self, model, layers: int) -> str | None:
        """Why ``model`` (built from :meth:`config_of` ``layers``) is not this stack cut to ``layers`` layers, or
        None when it is."""
        found = _module_lists(model, layers)
        if [path for path, _ in found] != [self.path]:
            return f"the {layers}-layer model has no single stack of {layers} layers at {self.path}"
        for k, layer in enumerate(found[0][1]):
            if describe_layer(layer, k, self.per_layer, model.config) != self.descriptions[k]:
                return f"layer {k} of the {layers}-layer model differs from the full model's layer {k}"
        return None

    def exported(self, reason: str) -> RepeatedLayers:
        return RepeatedLayers(self.path, self.layers, EXPORTED, reason)


def layer_stack(model) -> LayerStack | RepeatedLayers:
    """The :class:`LayerStack` of ``model`` (a transformers model), or the :class:`flopcount.reporting.layers.RepeatedLayers`
    record of a whole export with the reason the layers cannot be extended."""
    config = model.config
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, bool) or not isinstance(layers, int):
        return RepeatedLayers("", 0, EXPORTED, "the configuration gives no num_hidden_layers")
    if layers < 3:
        return RepeatedLayers("", layers, EXPORTED, f"{layers} layer(s): exported whole")
    if getattr(config, "is_encoder_decoder", False):
        return RepeatedLayers("", layers, EXPORTED, "an encoder-decoder: its two stacks are exported whole")
    stacks = _module_lists(model, layers)
    if len(stacks) != 1:
        where = ", ".join(path for path, _ in stacks) or "none"
        return RepeatedLayers("", layers, EXPORTED,
                              f"not one stack of num_hidden_layers={layers} layers (found: {where})")
    path, stack = stacks[0]
    for name, value in sorted(vars(config).items()):
        if (isinstance(value, (list, tuple)) and len(value) == layers and not name.startswith("_")
                and "layer" not in name
                and any(common.canonical_json(v) != common.canonical_json(value[0]) for v in value)):
            return RepeatedLayers(path, layers, EXPORTED, f"the configuration's {name} (a list of {layers}) "
                                                          "differs between layers")
    per_layer = per_layer_lists(config, layers)
    descriptions = tuple(describe_layer(layer, k, per_layer, config) for k, layer in enumerate(stack))
    unsound = next((d for d in descriptions if d.startswith("unsound")), None)
    if unsound is not None:
        return RepeatedLayers(path, layers, EXPORTED, f"a layer's state cannot be described ({unsound})")
    found = repeats(descriptions)
    if found is None:
        kinds = {d: i for i, d in enumerate(dict.fromkeys(descriptions))}
        return RepeatedLayers(path, layers, EXPORTED, "the layers do not repeat one block after their first ones "
                              f"(kinds by layer: {' '.join(str(kinds[d]) for d in descriptions)})")
    return LayerStack(path, layers, descriptions, per_layer, *found)


def per_layer_lists(config, layers: int) -> tuple[str, ...]:
    """The names of the configuration's lists of one entry per layer (``layer_types``): its public lists of
    ``layers`` entries named for layers."""
    return tuple(name for name, value in sorted(vars(config).items())
                 if isinstance(value, (list, tuple)) and len(value) == layers and not name.startswith("_")
                 and "layer" in name)


def repeats(kinds) -> tuple[int, int] | None:
    """``(first, period)``: the cheapest split of the sequence ``kinds`` into ``first`` entries, then a block of
    ``period`` entries repeated three times or more (so that exporting ``first + 2·period`` layers spares some),
    cheapest by ``first + 2·period``; None when there is none.

    >>> repeats("aaaa"), repeats("abababab"), repeats("xaaaa"), repeats("abcabd")
    ((0, 1), (0, 2), (1, 1), None)
    """
    n, best = len(kinds), None
    for period in range(1, n // 3 + 1):
        for first in range(0, n - 3 * period + 1):
            if (n - first) % period == 0 and (best is None or first + 2 * period < sum(best) + best[1]) and all(
                    kinds[k] == kinds[first + (k - first) % period] for k in range(first, n)):
                best = (first, period)
    return best


def describe_layer(layer, index: int, per_layer: tuple[str, ...], config) -> str:
    """One layer's description (see the module docstring) as canonical JSON, with its entry of each per-layer list
    of ``config``; ``"unsound: ..."`` when some state cannot be described, and a description naming the index when
    an index attribute does not equal ``index``."""
    import torch
    import transformers

    from .torch import module_state, torch_leaf

    def leaf(value: Any) -> Any:
        if isinstance(value, transformers.PretrainedConfig):
            return ["config", common.canonical(_config_fields(value, per_layer))]
        return torch_leaf(torch, value)

    describer = common.StateDescriber(leaf=leaf, framework=("torch", "transformers"))
    subs = list(layer.named_modules())
    for name, sub in subs:
        describer.name(sub, f"module:{name}")
    parts = []
    for name, sub in subs:
        state = module_state(describer, sub)
        for attribute in INDEX_ATTRIBUTES & state.keys():
            if state.pop(attribute) != index:
                return common.canonical_json(["index", name, attribute, index])
        parts.append([name, describer.object_type(sub), describer.describe(state),
                      [[n, list(p.shape), str(p.dtype)] for n, p in sub.named_parameters(recurse=False)],
                      [[n, list(b.shape), str(b.dtype)] for n, b in sub.named_buffers(recurse=False)]])
    if describer.unsound is not None:
        return f"unsound: {describer.unsound}"
    entries = [[name, common.canonical(getattr(config, name)[index])] for name in per_layer]
    return common.canonical_json([parts, entries])


def _module_lists(model, length: int) -> list[tuple[str, Any]]:
    """The ``ModuleList`` s of ``model`` with ``length`` entries that are not inside another such list."""
    import torch

    found: list[tuple[str, Any]] = []
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == length:
            if not any(name.startswith(outer + ".") for outer, _ in found):
                found.append((name, module))
    return found




def _config_fields(config, per_layer: tuple[str, ...]) -> dict[str, Any]:
    """The configuration's fields, less the layer count and with each per-layer list as its one value."""
    fields = config.to_dict()
    fields.pop("num_hidden_layers", None)
    fields.pop(getattr(config, "attribute_map", {}).get("num_hidden_layers"), None)  # GPT-2's n_layer
    for name in per_layer:
        if name in fields:
            fields[name] = "per layer"  # each layer's entry is in its own description
    return fields
