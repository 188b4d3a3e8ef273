"""The stack of identical layers of a transformers model, shown identical, and its 1- and 2-layer versions.

A decoder-only language model is an embedding, L decoder layers and a head. When the L layers are the same
computation, the model's count is affine in L and :func:`flopcount.extension.extend` extends the counts of its 1-
and 2-layer versions exactly, which spares exporting all L. Identity is shown, never assumed:

* the stack is the one ``torch.nn.ModuleList`` of the model with ``config.num_hidden_layers`` (L ≥ 3) entries,
  and the configuration is not an encoder-decoder's;
* every list of the configuration with L entries (``layer_types`` and the like) holds one value L times (those
  named for layers are shortened in the 1- and 2-layer configurations);
* every layer has the same description: per submodule, its class (name and source digest), its parameters' and
  buffers' names, shapes and dtypes, and every attribute its ``forward`` may read, configurations included
  (described as the export cache describes them, :class:`flopcount.frontends.common.StateDescriber`), except
  the layer's own index (``layer_idx``, which must equal its position), the number of layers and the per-layer
  lists just checked;
* the 1- and 2-layer models, built from the configuration with only ``num_hidden_layers`` and the per-layer
  lists shortened, have layers with that same description, and the full model's parameters are those of the
  1-layer model plus L − 1 times what the second layer adds.

Anything else, and the whole model is exported: :func:`layer_stack` returns the reason.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from flopcount.layers import EXPORTED, RepeatedLayers

from . import common

__all__ = ["LayerStack", "layer_stack"]

#: Attributes that hold a layer's position in its stack (read for KV-cache slots, which a count without cache
#: does not use); they must equal the position and are left out of the comparison.
INDEX_ATTRIBUTES = frozenset({"layer_idx", "layer_id", "layer_index", "layer_number"})


@dataclass(frozen=True)
class LayerStack:
    """The stack at ``path`` (``model.layers``) of ``layers`` identical layers, each described by ``description``
    (see :func:`describe_layer`), and the per-layer configuration lists (names) that :meth:`config_of`
    shortens."""

    path: str
    layers: int
    description: str
    per_layer: tuple[str, ...]

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
            if describe_layer(layer, k, self.per_layer) != self.description:
                return f"layer {k} of the {layers}-layer model differs from the full model's layers"
        return None

    def exported(self, reason: str) -> RepeatedLayers:
        return RepeatedLayers(self.path, self.layers, EXPORTED, reason)


def layer_stack(model) -> LayerStack | RepeatedLayers:
    """The :class:`LayerStack` of ``model`` (a transformers model), or the :class:`flopcount.layers.RepeatedLayers`
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
    per_layer = []
    for name, value in sorted(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == layers and not name.startswith("_"):
            if any(common.canonical_json(v) != common.canonical_json(value[0]) for v in value):
                return RepeatedLayers(path, layers, EXPORTED, f"the configuration's {name} (a list of {layers}, one "
                                                              "per layer) differs between layers")
            if "layer" in name:
                per_layer.append(name)
    per_layer = tuple(per_layer)
    description = describe_layer(stack[0], 0, per_layer)
    for k, layer in enumerate(stack):
        if k and describe_layer(layer, k, per_layer) != description:
            return RepeatedLayers(path, layers, EXPORTED, f"{path}.{k} differs from {path}.0 "
                                                          "(class, parameter shapes or configuration)")
    if description.startswith("unsound"):
        return RepeatedLayers(path, layers, EXPORTED, f"a layer's state cannot be described ({description})")
    return LayerStack(path, layers, description, per_layer)


def describe_layer(layer, index: int, per_layer: tuple[str, ...]) -> str:
    """One layer's description (see the module docstring) as canonical JSON; ``"unsound: ..."`` when some state
    cannot be described, and a description naming the index when an index attribute does not equal ``index``."""
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
    return common.canonical_json(parts)


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
        value = fields.get(name)
        if isinstance(value, (list, tuple)) and value:
            fields[name] = ["per layer", value[0]]
    return fields
