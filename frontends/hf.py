"""Hugging Face ``transformers`` models counted from their configuration alone (``--hf``, :func:`from_hf`).

A configuration is a ``config.json`` file, a folder holding one, or a Hub model id, of which only
``config.json`` is fetched (through ``huggingface_hub``, and only when the machine is online). The model is built
on the meta device with ``AutoModelForCausalLM.from_config`` where transformers has a causal-LM head for the
configuration's ``model_type``, else ``AutoModel.from_config``: no weight is downloaded or allocated. It is then
counted as :func:`flopcount.from_torch` counts any module.

A configuration that names code of its own (``auto_map``: the model's classes live in the repository, not in
transformers) is refused unless ``trust_remote_code`` is given, since building it runs that code.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flopcount.errors import ConfigError, FrontendError, UsageError, first_line, import_framework
from flopcount.limits import MAX_ELEMENTS
from flopcount.pipeline.progress import phase

from . import hf_experts, train_export

if TYPE_CHECKING:
    from flopcount.options import CountOptions


log = logging.getLogger(__name__)

__all__ = ["EXPERTS_IMPLEMENTATION", "TOKEN_INPUTS", "build_model", "config_masks", "count_config", "export_branches", "from_hf",
           "hf_inputs",
           "is_causal_lm", "with_ones_mask", "load_config", "load_model", "moe_blocks", "moe_summary",
           "model_class"]

FRONTEND = "--hf"
INSTALL_HINT = 'pip install "flopcount[hf]" (with torch installed first, see README)'
#: Inputs that carry token ids, positions or masks: int64, as a tokenizer makes them; every other input is float.
TOKEN_INPUTS = frozenset({"input_ids", "attention_mask", "token_type_ids", "position_ids", "decoder_input_ids",
                          "decoder_attention_mask", "labels", "cache_position"})
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def from_hf(config: Any, input_shapes: Mapping[str, Any] | tuple | None = None, *, trust_remote_code: bool = False,
            cache_dir: str | os.PathLike | bool | None = None, generate: tuple[int, int] | None = None,
            capacity_factor: float | None = None, repeated_layers: str = "extend", **count_kwargs: Any):
    """Count a transformers model built from its configuration, without weights.

    Parameters
    ----------
    config : str, path, dict or transformers.PretrainedConfig
        A ``config.json`` path, a folder holding one, a Hub model id (only its ``config.json`` is fetched), the
        parsed JSON, or a configuration object.
    input_shapes : mapping of input name to shape, or a shape
        The inputs of ``forward``: ``{"input_ids": (1, 2048)}``; a bare shape is the model's main input
        (``main_input_name``: ``input_ids`` for a language model). Token inputs
        (:data:`TOKEN_INPUTS`) are int64, others float32.
    trust_remote_code : bool
        Allow a configuration whose classes live in its repository (``auto_map``); building it runs that code.
    generate : (P, N), optional
        Count ``generate()`` of N new tokens after P prompt tokens
        (:func:`flopcount.frontends.generate.from_causal_lm`): the report is the prefill's, with
        ``report.generation``. ``input_shapes`` may then be
        left out; the batch is ``batch``, else dim 0 of ``input_ids``, else 1. Only for a causal LM.
    capacity_factor : float, optional
        For a mixture-of-experts model: the expert capacity factor C of its router; the report's ``moe`` adds
        the most the routed experts can run when each takes at most ⌊C·T·k/E⌋ (token, expert) pairs (the totals
        stay the no-drop count; see :mod:`flopcount.reporting.moe`).
    repeated_layers : "extend" or "export"
        ``extend`` (the default): where the model's L ≥ 3 layers are shown identical
        (:func:`flopcount.frontends.repeated.layer_stack`), export its 1- and 2-layer versions and extend their
        counts to L exactly (:func:`flopcount.derived.extension.extend`), which is much faster than exporting all L;
        otherwise, and with ``export``, export the whole model. ``report.layers`` says which was used and why.
    cache_dir, **count_kwargs
        As for :func:`flopcount.from_torch` (``mode``, ``convention``, ``batch`` ...).

    Notes
    -----
    A mixture-of-experts model (Mixtral, Qwen-MoE, DeepSeek) is built with transformers' ``batched_mm``
    experts: every token's k experts run as one batched product, so the graph counts the router, exactly k
    routed experts per token and the shared experts, and ``report.moe`` gives ``params`` and
    ``active_params`` (:func:`moe_blocks`). SwitchTransformers' and NLLB-MoE's experts, one module each, run as
    one batched top-k product too (:mod:`flopcount.frontends.hf_experts`).

    Raises
    ------
    ConfigError
        The configuration cannot be read or built here (no such file, no ``model_type``, a ``model_type`` the
        installed transformers does not know, remote code not trusted, a Hub id while offline).
    UsageError
        ``input_shapes`` is missing or names an input ``forward`` does not take.
    FrontendError
        transformers or torch is missing, or the export failed.
    """
    from . import common
    from .generate import EXPORT_KEYWORDS

    export = {k: count_kwargs.pop(k) for k in EXPORT_KEYWORDS if k in count_kwargs}
    options, training = common.options_of("from_hf", count_kwargs, export.pop("training", None))
    return count_config(config, input_shapes, options, trust_remote_code=trust_remote_code, cache_dir=cache_dir,
                        generate=generate, capacity_factor=capacity_factor, repeated_layers=repeated_layers,
                        training=training, **export)


def count_config(config: Any, input_shapes: Mapping[str, Any] | tuple | None, options: CountOptions, *,
                 trust_remote_code: bool = False, cache_dir: str | os.PathLike | bool | None = None,
                 generate: tuple[int, int] | None = None, capacity_factor: float | None = None,
                 repeated_layers: str = "extend", training: bool | None = None, **export: Any):
    """:func:`from_hf` under the settings of ``options``; ``training`` (``None`` follows ``options.mode``) and
    ``export`` (``opset``) are those of :func:`flopcount.frontends.torch.count_module`."""
    if generate is not None:
        from flopcount.reporting.generation import check_generate

        generate = check_generate(*_pair(generate))
    if capacity_factor is not None and (isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float))
                                        or not 0 < capacity_factor < float("inf")):
        raise UsageError(f"{FRONTEND}: the capacity factor must be a positive number, got {capacity_factor!r}")
    if repeated_layers not in REPEATED_LAYERS:
        raise UsageError(f"{FRONTEND}: repeated_layers is one of {', '.join(REPEATED_LAYERS)}, got {repeated_layers!r}")
    from flopcount.plans import check_generation_plan, with_plan, without_plan

    if generate is not None:
        check_generation_plan(options)
    planned, options = options, without_plan(options)  # the plan's ledgers: once, of the whole model (with_plan)
    from . import common, hf_cache

    call = hf_cache.RecipeCall(config, input_shapes, options, training, export, repeated_layers, trust_remote_code)
    folder = common.cache_folder(cache_dir)
    key = hf_cache.recipe_key(call) if folder is not None and generate is None and capacity_factor is None else None
    recipe = hf_cache.read_recipe(folder, key) if key is not None else None
    report = _served(recipe, folder, options) if recipe is not None else None
    if report is None:
        recipe = hf_cache.Recipe()
        report = _count_built(call, cache_dir, generate, capacity_factor, recipe)
        if key is not None:
            hf_cache.write_recipe(folder, key, recipe)
    return with_plan(report, planned)


def _count_built(call, cache_dir, generate: tuple[int, int] | None, capacity_factor: float | None, recipe):
    """The count of :func:`count_config` (without its plan) made from the model built from its configuration;
    ``recipe`` (:class:`flopcount.frontends.hf_cache.Recipe`) is filled with what it took from the model."""
    options, input_shapes, training, export = call.options, call.input_shapes, call.training, call.export
    loaded = load_config(call.config, trust_remote_code=call.trust_remote_code)
    if generate is not None:
        loaded = seq2seq_config(loaded)
    layers, probe = _probe(loaded)
    model = build_model(probe if probe is not None else loaded, trust_remote_code=call.trust_remote_code)
    if generate is not None:
        if not is_causal_lm(model.config) and not _is_seq2seq_lm(model):
            raise UsageError(f"{FRONTEND}: --generate is for a causal language model; {model.config.model_type} "
                             f"builds {type(model).__name__}, which does not generate (nor is it an encoder-decoder "
                             "with a language-model head); count it without --generate")
        batch = options.batch or _input_ids_batch(input_shapes) or 1

        def count(m):
            return _count_generation(m, generate, batch, cache_dir, options, training, export)

        tokens = batch * generate[0]
        if _is_seq2seq_lm(model):  # the prefill's: the encoder's blocks over the prompt, the decoder's its start token
            tokens = _stack_tokens(model, tokens, batch)
    else:
        def count(m):
            return _count(m, input_shapes, cache_dir, options, training, export, recipe)

        inputs = hf_inputs(model, input_shapes)
        tokens = _tokens(inputs, options.batch)
        if tokens and getattr(model.config, "is_encoder_decoder", False):
            tokens = _stack_tokens(model, tokens, _tokens(inputs, options.batch, DECODER_TOKEN_INPUTS))
    train = options.mode == "train" if training is None else training
    count = train_export.settled(count, train)  # the 1- and 2-layer models of a stack too
    with train_export.every_layer(model, train) as drops:
        report = _count_stack(model, count, call.repeated_layers, call.trust_remote_code,
                              loaded if probe is not None else None, recipe)
    if drops:  # the recipe holds no notes: a count with them is made again, not served
        recipe.sound = False
        report = train_export.with_notes(report, drops)
    if probe is not None and moe_blocks(model) is not None:
        log.info("%s: the mixture-of-experts summary is not formed for a model counted from a probe of %d of its "
                 "%d layers", FRONTEND, probe.num_hidden_layers, layers)
        tokens = None
    recipe.branches = list(export_branches(model))
    report = _with_branches(report, recipe.branches)
    moe = moe_summary(model, report, tokens, capacity_factor) if tokens else None
    if moe is None and capacity_factor is not None:
        raise UsageError(f"{FRONTEND}: --capacity-factor is for a mixture-of-experts model; {model.config.model_type} "
                         "has no routed experts")
    recipe.sound = recipe.sound and moe is None
    return dataclasses.replace(report, moe=moe) if moe is not None else report


def _with_branches(report, branches):
    """``report`` with a note naming the ``branches`` of transformers' code that ask whether it is exported."""
    if not branches:
        return report
    return dataclasses.replace(report, notes=(*report.notes, (
        f"transformers' modelling code ({', '.join(branches)}) asks whether it is being exported; the count is "
        "of what it computes under export, which may differ from an eager run (docs/architectures.md gives the "
        "families where it does, and by how much)")))


def _served(recipe, folder, options: CountOptions):
    """The count a recipe (:mod:`flopcount.frontends.hf_cache`) describes, its exports taken from the cache in
    ``folder``; None where one of them is not served (the count is then made from the configuration)."""
    from flopcount.derived.extension import NotExtendable, extend
    from flopcount.reporting.layers import EXTENDED, RepeatedLayers

    from .common import entry_path, read_cache
    from .exported import count_exported
    from .torch_errors import FRONTEND as TORCH

    models = [read_cache(entry_path(folder, TORCH, e.key), log, e.key, e.signature) for e in recipe.counts]
    if any(m is None for m in models):
        return None
    reports = [count_exported(m, e, options) for m, e in zip(models, recipe.counts)]
    if recipe.stack is None:
        report = dataclasses.replace(reports[0], layers=recipe.layers)
    else:
        layers, path, first, period, summary = recipe.stack
        try:
            report = extend(reports[0], reports[1], layers, path, first=first, period=period)
        except NotExtendable:
            return None
        report = dataclasses.replace(report, layers=RepeatedLayers(path, layers, EXTENDED, summary))
    log.info("%s: counted from the export cache, without building the model", FRONTEND)
    return _with_branches(report, recipe.branches)


def _to_full_stack(stack, full):
    """``stack`` (of the probe) as the stack of the full configuration ``full``: its block must tile the layers
    after its first ones, and each per-layer list of ``full`` must repeat with the block (NotExtendable
    otherwise)."""
    from flopcount.derived.extension import NotExtendable

    from .common import canonical_json
    from .repeated import per_layer_lists

    layers, first, period = full.num_hidden_layers, stack.first, stack.period
    if (layers - first) % period:
        raise NotExtendable(f"{layers} layers are not the first {first} and whole blocks of {period}")
    for name in per_layer_lists(full, layers):
        entries = [canonical_json(v) for v in getattr(full, name)]
        if any(entries[k] != entries[first + (k - first) % period] for k in range(first, layers)):
            raise NotExtendable(f"the configuration's {name} does not repeat a block of {period} after its first "
                                f"{first} entries")
    return dataclasses.replace(stack, layers=layers)


#: The values of ``repeated_layers`` (``--repeated-layers``).
REPEATED_LAYERS = ("extend", "export")


#: The most layers a model is built with to decide whether its layers repeat (and exported with where they do not):
#: a configuration of more is counted from a probe of fewer layers (:func:`_probe`).
MAX_BUILT_LAYERS = 512
#: The most layers a configuration may have. A stack counted from a probe holds its repeated layers once
#: (:class:`flopcount.reporting.tiled.Tiled`): its memory and time do not grow with L, and every figure is an exact Python
#: int. 2**31 layers is past any model a machine holds; a listing of every node of so many is refused
#: (:data:`flopcount.reporting.tiled.MAX_LISTED_NODES`).
MAX_LAYERS = 2**31


def _probe(config) -> tuple[int | None, Any]:
    """``(L, probe)``: the configuration's own number of layers, and where it is above :data:`MAX_BUILT_LAYERS` a
    copy of the configuration with fewer layers, M, that the full model's layers are decided from (``None``
    otherwise). M exceeds every integer of the configuration below L by 32, so that any layer index the
    configuration may name (``max_window_layers``, the first dense layers) and three periods of its per-layer
    lists lie within the probe; a configuration that needs more is a :class:`ConfigError` with the limit."""
    layers = getattr(config, "num_hidden_layers", None)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers <= MAX_BUILT_LAYERS:
        return layers, None
    if layers > MAX_LAYERS:
        raise ConfigError(f"{config.model_type}: num_hidden_layers is {layers}, above the limit of {MAX_LAYERS} "
                          "layers; fix num_hidden_layers")
    if getattr(config, "is_encoder_decoder", False):
        raise ConfigError(f"{config.model_type}: num_hidden_layers is {layers}, above the limit of "
                          f"{MAX_BUILT_LAYERS} layers an encoder-decoder is built with; fix the configuration")
    below = [v for v in _integers(config.to_dict()) if 0 <= v < layers]
    probe_layers = max(below, default=0) + 33
    if probe_layers > MAX_BUILT_LAYERS:
        raise ConfigError(
            f"{config.model_type}: num_hidden_layers is {layers}; showing that its layers repeat needs a probe of "
            f"{probe_layers} layers (past every integer of the configuration below {layers}, such as "
            f"{max(below)}), above the limit of {MAX_BUILT_LAYERS} layers built; fix num_hidden_layers")
    from .repeated import per_layer_lists

    probe = copy.deepcopy(config)
    probe.num_hidden_layers = probe_layers
    for name in per_layer_lists(config, layers):
        value = getattr(probe, name)
        setattr(probe, name, type(value)(value[:probe_layers]))
    return layers, probe


def _integers(value: Any, depth: int = 0):
    """Every int in a configuration's dict (nested dicts and lists included, bools left out)."""
    if isinstance(value, bool) or depth > 20:
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _integers(v, depth + 1)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _integers(v, depth + 1)


def _count_stack(model, count, repeated_layers: str, trust_remote_code: bool, full=None, recipe=None):
    """``count(model)`` (a report), from ``count`` of its 1- and 2-layer versions where its layers are shown
    identical (and ``repeated_layers`` is ``extend``), else of the whole model; ``report.layers`` says which.

    ``full``, where given, is the configuration of L layers of which ``model`` is a probe of fewer layers
    (:func:`_probe`): the probe's stack must repeat, its per-layer lists must follow the same period up to L, and the
    count is extended to L; else the model is refused (:class:`ConfigError`), never exported whole."""
    from flopcount.derived.extension import NotExtendable, extend
    from flopcount.reporting.layers import EXTENDED, RepeatedLayers

    from .ahead import exporting
    from .repeated import LayerStack, layer_stack

    full_layers = None if full is None else full.num_hidden_layers
    stack = layer_stack(model)
    if isinstance(stack, LayerStack) and repeated_layers == "export" and full is None:
        stack = stack.exported("--repeated-layers export: the whole model exported")
    if isinstance(stack, LayerStack):
        smalls = []
        for layers in stack.sizes:
            small = build_model(stack.config_of(model.config, layers), trust_remote_code=trust_remote_code)
            reason = stack.compare(small, layers)
            if reason is not None:
                stack = stack.exported(reason)
                break
            smalls.append((layers, small))
    if isinstance(stack, LayerStack):
        counts = []
        # the larger model's export is made ahead, in a child, while this process counts the smaller one
        with exporting(smalls[-1][1], lambda: count(smalls[-1][1])):
            for layers, small in smalls:
                with phase(f"the {layers}-layer model (to extend to {stack.layers} layers)"):
                    counts.append((small, count(small)))
    if isinstance(stack, LayerStack):
        (one, r1), (two, r2) = counts
        p1, p2, p = (sum(x.numel() for x in m.parameters()) for m in (one, two, model))
        try:
            if p != p1 + (stack.blocks - 1) * (p2 - p1):
                raise NotExtendable(f"its {p:,} parameters are not those of {stack.sizes[0]} layers and "
                                    f"{stack.blocks - 1} more blocks")
            if full is not None:
                stack = _to_full_stack(stack, full)
            report = extend(r1, r2, stack.layers, stack.path, first=stack.first, period=stack.period)
        except NotExtendable as e:
            stack = stack.exported(str(e))
        else:
            if recipe is not None:
                recipe.counts[:] = recipe.counts[-2:]
                recipe.stack = [stack.layers, stack.path, stack.first, stack.period, stack.summary()]
            return dataclasses.replace(report, layers=RepeatedLayers(stack.path, stack.layers, EXTENDED,
                                                                     stack.summary()))
    if full is not None:
        raise ConfigError(f"{model.config.model_type}: num_hidden_layers is {full_layers}, above the limit of "
                          f"{MAX_BUILT_LAYERS} layers exported whole, and its layers cannot be counted from a probe "
                          f"of {model.config.num_hidden_layers}: {stack.reason}; fix num_hidden_layers")
    log.info("%s: the whole model exported: %s", FRONTEND, stack.reason)
    report = dataclasses.replace(count(model), layers=stack if stack.path or stack.layers else None)
    if recipe is not None:
        recipe.counts[:], recipe.layers = recipe.counts[-1:], report.layers
    return report


def _count_generation(model, generate: tuple[int, int], batch: int, cache_dir, options: CountOptions, training,
                      export):
    """``generate()`` of ``model`` counted by :func:`flopcount.frontends.generate.count_generation` (an
    encoder-decoder's too), its decode steps cut at the configuration's sliding windows, with its masks for executed
    attention."""
    from .generate import count_generation

    _check_attention(model)
    windows = [m.window for m in config_masks(model.config) or () if m is not None and m.window]
    window = getattr(model.config, "sliding_window", None)
    if isinstance(window, int) and window > 0:
        windows.append(window)  # a cache may crop at the window even where attention counts full
    return count_generation(model, generate, _with_masks(model, options), batch=batch, cache_dir=cache_dir,
                            breakpoints=sorted(set(windows)), training=training, **export)


def _count(model, input_shapes, cache_dir, options: CountOptions, training, export, recipe=None):
    """``model`` counted by :func:`flopcount.frontends.torch.count_module`, with its configuration's masks for
    executed attention; what the count took from the model is added to ``recipe``."""
    from .exported import count_exported
    from .torch import export_module

    _check_attention(model)
    masked = _with_masks(model, options)
    inputs = hf_inputs(model, input_shapes)
    try:
        onnx_model, exported = export_module(model, inputs, masked, training=training, cache_dir=cache_dir, **export)
    except FrontendError:
        filled = with_ones_mask(model, inputs)
        if filled is None:
            raise
        onnx_model, exported = export_module(model, filled, masked, training=training, cache_dir=cache_dir, **export)
    if recipe is not None:
        recipe.counts.append(exported)
        recipe.sound = recipe.sound and masked is options
    return count_exported(onnx_model, exported, masked)


#: The attention implementations the exporter cannot write, and why (the model built, before its export).
UNEXPORTABLE_ATTENTION = {
    "flex_attention": "torch's FlexAttention runs on a real device only, not on the meta device the weightless "
                      "export builds on, and the ONNX exporter has no function for its block mask (a stable sort) "
                      "even on the CPU; count the model with attn_implementation 'sdpa' or 'eager'",
}


def with_ones_mask(model, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """``inputs`` with ``attention_mask`` of ``input_ids``' shape added, where ``model``'s forward takes one and
    none was given; None otherwise. Without a mask transformers' eager forward makes one of ones (every token
    attended), which some models (SwitchTransformers' encoder) skip while traced and then index None: the export
    with that mask of ones given is the same program the eager forward runs."""
    import inspect

    if "attention_mask" in inputs or "input_ids" not in inputs:
        return None
    if "attention_mask" not in inspect.signature(model.forward).parameters:
        return None
    shape = inputs["input_ids"][0] if isinstance(inputs["input_ids"], tuple) else None
    if shape is None or len(shape) != 2:
        return None
    return {**inputs, "attention_mask": inputs["input_ids"]}


def _check_attention(model) -> None:
    """A :class:`FrontendError` where ``model`` runs an attention implementation the exporter cannot write."""
    attn = getattr(model.config, "_attn_implementation", None)
    if attn in UNEXPORTABLE_ATTENTION:
        raise FrontendError(f"{FRONTEND}: {type(model).__name__} with attn_implementation {attn!r} cannot be "
                            f"exported to ONNX: {UNEXPORTABLE_ATTENTION[attn]}")


def _with_masks(model, options: CountOptions) -> CountOptions:
    """``options`` with ``attention="executed"`` given the masks of ``model``'s configuration, where it has any."""
    if isinstance(options.attention, str) and options.attention == "executed":
        masks = config_masks(model.config)
        if masks:
            return dataclasses.replace(options, attention=masks)
    return options


DECODER_TOKEN_INPUTS = ("decoder_input_ids", "decoder_inputs_embeds", "labels")  # an encoder-decoder's decoder's


def _tokens(inputs, batch, names=("input_ids", "inputs_embeds")) -> int | None:
    """B·S of the token input (the first of ``names`` given: ``input_ids``, else ``inputs_embeds``' first two
    dims)."""
    for name in names:
        if name in inputs:
            shape = inputs[name][0]
            b = batch or shape[0]
            return b * shape[1] if len(shape) >= 2 else None
    return None


def config_masks(config) -> tuple | None:
    """The attention masks of a model's layers, from its configuration (``--attention executed``): for a causal
    LM causal, with a sliding window of ``sliding_window`` keys on the layers ``layer_types`` calls
    ``sliding_attention`` (every layer where the configuration has a window and no ``layer_types``); for an
    encoder bidirectional (all pairs, less padding given by ``attention_mask`` values); None for an
    encoder-decoder or decoder-only configuration that is not a causal LM (its masks are the graph's to show)."""
    from flopcount.masks import AttentionMask

    if not is_causal_lm(config):
        if getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False):
            return None  # cross-attention and decoder masks: the graph's to show
        return (AttentionMask(source=f"the {config.model_type} configuration (an encoder)"),)
    window = getattr(config, "sliding_window", None)
    if getattr(config, "use_sliding_window", True) is False:
        window = None
    source = f"the {config.model_type} configuration"
    layer_types = getattr(config, "layer_types", None)
    if not layer_types:
        return (AttentionMask(causal=True, window=window or None, source=source),)
    return tuple(AttentionMask(causal=True, window=window if kind == "sliding_attention" and window else None,
                               source=source) for kind in layer_types)


def export_branches(model) -> tuple[str, ...]:
    """The modelling modules of ``model``'s classes whose code asks whether it is being exported (they hold
    transformers' ``is_torchdynamo_exporting`` or torch's ``torch.compiler.is_exporting``, found by identity):
    where they branch on it, the graph an exporter sees is not what an eager run computes (Qwen3-Next's gated delta
    rule builds an inverse by forward substitution and two products where an eager run calls
    ``solve_triangular``)."""
    import sys

    import torch

    transformers = _import("transformers")
    helpers = [getattr(transformers.utils, "is_torchdynamo_exporting", None),
               getattr(getattr(torch, "compiler", None), "is_exporting", None)]
    helpers = [h for h in helpers if h is not None]
    found = []
    for cls in dict.fromkeys(type(m) for m in model.modules()):
        namespace = vars(sys.modules.get(cls.__module__, object))
        if any(value is h for value in namespace.values() for h in helpers):
            found.append(cls.__module__.rpartition(".")[2])
    return tuple(dict.fromkeys(found))


def moe_blocks(model):
    """The routed-experts modules of ``model`` (transformers' MoE layout: a module with ``num_experts`` and its
    experts' weights stacked as 3-D parameters, ``[E, out, in]``), as ``(paths, experts, params of one expert,
    params of the shared experts)``; None when it has none. The shared experts are the modules named
    ``shared_expert``/``shared_experts`` (with ``shared_expert_gate``) beside them."""
    paths, experts, per_expert, shared = [], set(), set(), 0
    for name, module in model.named_modules():
        stacked = [p for _, p in module.named_parameters(recurse=False) if p.dim() == 3]
        e = getattr(module, "num_experts", None)
        if not hf_experts.expert_modules(module) and (
                not stacked or not isinstance(e, int) or any(p.shape[0] != e for p in stacked)):
            continue
        paths.append(name)
        experts.add(e)
        per_expert.add(sum(p.numel() for p in module.parameters()) // e)
    if not paths:
        return None
    parents = {path.rpartition(".")[0] for path in paths}
    for name, module in model.named_modules():
        parent, _, leaf = name.rpartition(".")
        if parent in parents and leaf in ("shared_expert", "shared_experts", "shared_expert_gate"):
            shared += sum(p.numel() for p in module.parameters())
    if len(experts) != 1 or len(per_expert) != 1:
        return None  # blocks of different sizes: not summarised
    return tuple(paths), experts.pop(), per_expert.pop(), shared


def _stack_tokens(model, encoder: int, decoder: int | None) -> Any:
    """The tokens of an encoder-decoder's MoE blocks for :func:`moe_summary`: ``encoder`` (B·S_enc) outside its
    decoder, ``decoder`` (B·S_dec, from ``decoder_input_ids``, ``decoder_inputs_embeds`` or ``labels``) in it,
    as a function of a block's path; None where the decoder's tokens or its module are not known (the summary
    is then not formed rather than given the encoder's tokens)."""
    get = getattr(model, "get_decoder", None)
    stack = get() if callable(get) else None
    prefix = next((name for name, m in model.named_modules() if m is stack and name), None)
    if decoder is None or prefix is None:
        log.info("%s: the mixture-of-experts summary is not formed: the tokens of the decoder's blocks are not "
                 "known (give decoder_input_ids)", FRONTEND)
        return None
    return lambda path: decoder if path.startswith(prefix + ".") else encoder


def moe_summary(model, report, tokens, capacity_factor: float | None = None):
    """The :class:`flopcount.reporting.moe.MixtureOfExperts` of ``model`` counted in ``report`` over ``tokens``
    tokens per block (an int, or a function of a block's path giving its own: :func:`_stack_tokens`), or None for a
    model without routed experts."""
    from flopcount.reporting.moe import MixtureOfExperts

    found = moe_blocks(model)
    if found is None:
        return None
    paths, experts, per_expert, shared = found
    top_k = hf_experts.top_k(model)
    if not top_k:
        return None
    inside = set(paths)
    scopes = report.modules.nodes
    routed = sum(n.cost.flops for k, n in enumerate(report.nodes)
                 if k < len(scopes) and inside.intersection(scopes[k]))
    if callable(tokens):
        each = tuple(tokens(path) for path in paths)
        tokens = each[0] if len(set(each)) == 1 else each
    return MixtureOfExperts(len(paths), experts, int(top_k), per_expert, shared,
                            sum(p.numel() for p in model.parameters()), tokens, routed, capacity_factor)


def _pair(generate) -> tuple:
    if isinstance(generate, (tuple, list)) and len(generate) == 2:
        return tuple(generate)
    raise UsageError(f"{FRONTEND}: generate is (P, N), prompt tokens and new tokens, got {generate!r}")


def _input_ids_batch(input_shapes) -> int | None:
    """Dim 0 of the given ``input_ids`` shape, if any."""
    if input_shapes is None:
        return None
    shape = input_shapes.get("input_ids") if isinstance(input_shapes, Mapping) else input_shapes
    if isinstance(shape, tuple) and len(shape) == 2 and not isinstance(shape[1], int):
        shape = shape[0]
    return int(shape[0]) if shape else None


def load_model(config: Any, *, trust_remote_code: bool = False):
    """The model of ``config`` (as :func:`from_hf` takes it) built on the meta device."""
    return build_model(load_config(config, trust_remote_code=trust_remote_code), trust_remote_code=trust_remote_code)


def load_config(source: Any, *, trust_remote_code: bool = False):
    """The ``transformers.PretrainedConfig`` of ``source`` (see :func:`from_hf`). A path that names nothing is
    refused before transformers is imported: that is the more useful message."""
    if isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        if not Path(where).exists() and (not _HUB_ID.match(where) or where.endswith(".json")):
            raise ConfigError(f"{where}: no such file or folder; give a config.json, a folder holding one, or a "
                              "Hub model id (org/name)")
    transformers = _import("transformers")
    if isinstance(source, transformers.PretrainedConfig):
        return source
    if isinstance(source, Mapping):
        return _from_dict(transformers, dict(source), "the configuration", trust_remote_code, None)
    where = os.fspath(source)
    path = Path(where)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ConfigError(f"{where}: the folder holds no config.json; give a folder or file with a model's "
                              "config.json, or a Hub model id")
    elif not path.exists():
        if not _HUB_ID.match(where) or where.endswith(".json"):
            raise ConfigError(f"{where}: no such file or folder; give a config.json, a folder holding one, or a "
                              "Hub model id (org/name)")
        path = _fetch_config(where)
    document = _read_document(transformers, path)
    if not isinstance(document, dict):
        raise ConfigError(f"{path}: a configuration is a JSON object, not {type(document).__name__}")
    return _from_dict(transformers, document, str(path), trust_remote_code, path.parent)


def _read_document(transformers, path: Path) -> Any:
    """The configuration at ``path`` as transformers reads it (its ``get_config_dict``: JSON, with the special
    floats it writes as ``{"__float__": "Infinity"}`` decoded); a :class:`ConfigError` in one line otherwise (a file
    that is not UTF-8 or JSON, or nested too deep to read)."""
    try:
        document, _ = transformers.PretrainedConfig.get_config_dict(str(path))
    except RecursionError:
        raise ConfigError(f"{path}: the JSON is nested too deep to read; give the model's config.json") from None
    except Exception as e:  # noqa: BLE001 - OSError, UnicodeDecodeError, JSONDecodeError, transformers' EnvironmentError
        raise ConfigError(f"{path}: not a readable JSON configuration ({one_line(e)}); give the model's "
                          "config.json") from None
    return document


def one_line(e: BaseException, limit: int = 1000) -> str:
    """The whole message of ``e`` on one line (white space folded), cut to ``limit`` characters."""
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _from_dict(transformers, document: dict, where: str, trust_remote_code: bool, folder: Path | None):
    model_type = document.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ConfigError(f"{where}: model_type must be a string naming a transformers model type (\"llama\"), "
                          f"got the {type(model_type).__name__} {_shown(model_type)}; fix the configuration")
    architectures = document.get("architectures")
    if architectures is not None and (not isinstance(architectures, list)
                                      or not all(isinstance(a, str) for a in architectures)):
        raise ConfigError(f"{where}: architectures must be a list of class names ([\"LlamaForCausalLM\"]), got "
                          f"{_shown(architectures)}; fix the configuration")
    if document.get("auto_map"):
        if not trust_remote_code:
            raise ConfigError(
                f"{where}: the configuration's classes live in its repository (auto_map: "
                f"{', '.join(sorted(document['auto_map']))}), and building it runs that code; pass "
                "--trust-remote-code (trust_remote_code=True) if you trust it")
        if folder is None:
            raise ConfigError(f"{where}: remote code is read from the configuration's folder; give the folder")
        try:
            return transformers.AutoConfig.from_pretrained(str(folder), trust_remote_code=True,
                                                           local_files_only=True)
        except Exception as e:  # noqa: BLE001 - the repository's own code may raise anything
            raise ConfigError(f"{where}: its remote configuration code failed: {first_line(e)}") from None
    if not model_type:
        raise ConfigError(f"{where}: the configuration has no model_type; give a transformers config.json")
    mapping = transformers.CONFIG_MAPPING
    if model_type not in mapping:
        close = difflib.get_close_matches(str(model_type), list(mapping.keys()), n=3)
        raise ConfigError(
            f"{where}: model_type {model_type!r} is unknown to transformers {transformers.__version__}"
            + (f" (did you mean {', '.join(map(repr, close))}?)" if close else "")
            + "; upgrade transformers, or pass --trust-remote-code for a model whose code is in its repository")
    try:
        return mapping[model_type].from_dict(document)
    except RecursionError:
        raise ConfigError(f"{where}: the configuration is nested too deep to read; fix the configuration") from None
    except Exception as e:  # noqa: BLE001 - a configuration class validates its own fields
        raise ConfigError(f"{where}: transformers refuses the {model_type} configuration: {one_line(e)}") from None


def _shown(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fetch_config(repo_id: str) -> Path:
    """Fetch the Hub repository's ``config.json`` (nothing else); offline, say to pass the folder."""
    hub = _import("huggingface_hub")
    try:
        return Path(hub.hf_hub_download(repo_id=repo_id, filename="config.json"))
    except Exception as e:  # noqa: BLE001 - offline, missing repository, gated model ...
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        reason = "the machine is offline (HF_HUB_OFFLINE)" if offline else first_line(e)
        raise ConfigError(f"{repo_id}: its config.json cannot be fetched from the Hub: {reason}; download the "
                          "model's config.json and pass its folder (or the file) instead") from None


def is_causal_lm(config) -> bool:
    """Whether ``config`` is a causal language model: its ``architectures`` name a ``...ForCausalLM`` class, or
    (without them) transformers has a causal-LM head for its ``model_type`` and it is neither a masked-LM encoder
    (BERT has a decoder variant, but a BERT configuration is an encoder unless ``is_decoder`` is set) nor an
    encoder-decoder (``is_encoder_decoder``: Whisper's, Pegasus's causal-LM class is their decoder alone, which
    drops the encoder and takes no ``input_features``)."""
    _import("transformers")
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    architectures = getattr(config, "architectures", None) or []
    if architectures:
        return any(a.endswith("ForCausalLM") or a.endswith("LMHeadModel") for a in architectures)
    auto_map = getattr(config, "auto_map", None) or {}
    if auto_map:
        return "AutoModelForCausalLM" in auto_map
    if getattr(config, "is_encoder_decoder", False) is True:
        return False
    return config.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and (
        config.model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES or bool(getattr(config, "is_decoder", False)))


def seq2seq_config(config):
    """``config`` to build for ``--generate``: an encoder-decoder configuration that names no ``architectures`` is
    given the class transformers' ``AutoModelForSeq2SeqLM`` (else ``AutoModelForSpeechSeq2Seq``) builds for its
    ``model_type`` (T5, BART, Whisper: their ``...ForConditionalGeneration``, the model with a language-model head
    that ``generate()`` runs), on a copy; any other configuration is returned as it is."""
    if getattr(config, "is_encoder_decoder", False) is not True or getattr(config, "architectures", None):
        return config
    _import("transformers")
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES,
    )

    name = (MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
            or MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES.get(config.model_type))
    if not isinstance(name, str):
        return config
    import copy

    config = copy.deepcopy(config)
    config.architectures = [name]
    return config


def _is_seq2seq_lm(model) -> bool:
    """Whether ``model`` is an encoder-decoder that generates (``can_generate()``)."""
    from .generate import is_encoder_decoder

    can = getattr(model, "can_generate", None)
    return is_encoder_decoder(model) and callable(can) and bool(can())


def model_class(config, *, trust_remote_code: bool = False):
    """The class that builds ``config``'s model: the first of its ``architectures`` that transformers has, else
    ``AutoModelForCausalLM`` for a causal LM (:func:`is_causal_lm`), else ``AutoModel``."""
    transformers = _import("transformers")
    if not trust_remote_code:
        for name in getattr(config, "architectures", None) or []:
            cls = getattr(transformers, name, None) if isinstance(name, str) else None
            if cls is None:
                continue
            if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
                raise ConfigError(
                    f"{config.model_type}: the configuration's architectures names {name!r}, which is a "
                    f"transformers {'class' if isinstance(cls, type) else type(cls).__name__} but not a model "
                    "class (a PreTrainedModel); name the model's class (LlamaForCausalLM) or leave architectures out")
            return cls
    return transformers.AutoModelForCausalLM if is_causal_lm(config) else transformers.AutoModel


#: The experts implementation a model is built with: each token's k experts gathered and run as one batched
#: product (transformers' ``batched_mm``), so the exported graph runs exactly k experts per token, with shapes
#: that do not depend on the routing (the default loops over the experts a batch happens to hit).
EXPERTS_IMPLEMENTATION = "batched_mm"


def build_model(config, *, trust_remote_code: bool = False):
    """The model of ``config`` on the meta device (no weight memory), in inference mode; mixture-of-experts
    blocks run :data:`EXPERTS_IMPLEMENTATION` (``config`` itself is left as it was)."""
    torch = _import("torch")
    if hasattr(config, "_experts_implementation"):
        import copy

        config = copy.deepcopy(config)
        config._experts_implementation = EXPERTS_IMPLEMENTATION
    kwargs = {"trust_remote_code": True} if trust_remote_code else {}
    try:
        with _quiet_imports():
            cls = model_class(config, trust_remote_code=trust_remote_code)
            with torch.device("meta"):
                model = cls.from_config(config, **kwargs) if hasattr(cls, "from_config") else cls._from_config(config)
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the modelling code checks the configuration in its own way
        if isinstance(e, ImportError) or type(e).__name__ == "OutOfMemoryError":
            raise
        raise ConfigError(f"{config.model_type}: transformers cannot build a model of this configuration: "
                          f"{one_line(e)}{_fields_in(config, str(e))}") from None
    _check_sizes(model, config)
    train_export.on_meta(model)
    hf_experts.batch_experts(model)
    return model.eval()


def _check_sizes(model, config) -> None:
    """A :class:`ConfigError` naming the tensor and the configuration's fields of its dims where one parameter or
    buffer of ``model`` would hold more than :data:`~flopcount.limits.MAX_ELEMENTS` elements."""
    for name, tensor in (*model.named_parameters(), *model.named_buffers()):
        elements = 1
        for d in tensor.shape:
            elements *= int(d)
        if elements > MAX_ELEMENTS:
            dims = " x ".join(str(int(d)) for d in tensor.shape)
            raise ConfigError(
                f"{config.model_type}: the configuration makes {name} a tensor of {dims} = {elements:.3g} elements, "
                f"above the limit of 2**48 = {MAX_ELEMENTS}{_fields_in(config, dims)}; fix the configuration")


def _fields_in(config, text: str) -> str:
    """`` (the configuration's hidden_size is -64)``: the configuration's integer fields whose values (other than
    0 and 1) appear as numbers in ``text``; empty where none does."""
    numbers = {int(n) for n in re.findall(r"-?\d+", text)} - {0, 1}
    try:
        fields = config.to_dict()
    except Exception:  # noqa: BLE001 - a configuration that cannot describe itself: no fields named
        return ""
    named = [f"{k} is {v}" for k, v in fields.items()
             if isinstance(v, int) and not isinstance(v, bool) and v in numbers]
    return f" (the configuration's {', '.join(named[:4])})" if named else ""


#: Loggers of the libraries that importing a transformers model class imports (transformers' quantizer integrations
#: import torchao where it is installed, which warns of kernels it cannot load and of torch registrations).
_IMPORT_LOGGERS = ("transformers", "torch", "torchao")


def _quiet_imports():
    """Keep what the modelling code's imports warn (log records, Python warnings) out of the user's output; it goes
    to flopcount's DEBUG log instead (``-vv``)."""
    from .common import quiet

    return quiet(_IMPORT_LOGGERS, log, fds=(), level=logging.ERROR)


def hf_inputs(model, input_shapes) -> dict[str, Any]:
    """The example inputs of :func:`flopcount.from_torch` for ``model``: each shape with its dtype (token inputs
    int64, others float32; a ``(shape, dtype)`` given stays), and ``use_cache=False`` where ``forward`` takes it.
    A bare shape is the model's main input (its ``main_input_name``: ``input_ids`` for a language model,
    ``pixel_values`` for a ViT, ``input_features`` for Whisper)."""
    torch = _import("torch")
    main = getattr(model, "main_input_name", None) or "input_ids"
    if input_shapes is None:
        raise UsageError(f"{FRONTEND}: give the input shapes, e.g. --input-shape {main}=1x2048 "
                         f"(input_shapes={{'{main}': (1, 2048)}})")
    if not isinstance(input_shapes, Mapping):
        input_shapes = {main: input_shapes}
    inputs: dict[str, Any] = {}
    for name, shape in input_shapes.items():
        if isinstance(shape, tuple) and len(shape) == 2 and not isinstance(shape[1], int):
            inputs[name] = shape  # (shape, dtype) given
        else:
            inputs[name] = (tuple(shape), torch.int64 if name in TOKEN_INPUTS else torch.float32)
    import inspect

    if "use_cache" in inspect.signature(model.forward).parameters and "use_cache" not in inputs:
        inputs["use_cache"] = False  # a cache object is no tensor output; generation is counted by its steps
    return inputs


def _import(name: str):
    try:
        return import_framework(name)
    except ModuleNotFoundError:
        raise FrontendError(f"{FRONTEND}: {name} is not installed; {INSTALL_HINT}") from None
