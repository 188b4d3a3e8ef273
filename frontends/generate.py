"""Generation counted from the graphs of a causal LM (``--generate P:N``, ``from_hf(..., generate=(P, N))``,
:func:`from_causal_lm` for any PyTorch causal LM whose ``forward`` takes a KV cache), and of an encoder-decoder LM
(T5, BART, and Whisper over audio features: :func:`count_seq2seq_generation`, the same way with its encoder and
cross-attention cache).

Two kinds of graph are exported and counted exactly, as :func:`flopcount.from_torch` counts any module:

* the prefill: ``forward(input_ids[B, P], logits_to_keep=1)`` (where ``forward`` takes ``logits_to_keep``),
  the logits of the last position only, as ``generate()`` computes them;
* a decode step: one token per sequence over a KV cache of L positions, exported *with the cache as graph
  inputs* (a module that rebuilds the model's cache object from them and passes it as the model's cache argument,
  see :func:`cache_argument`). Its cost is affine in the context c = L + 1 (see :mod:`flopcount.reporting.generation`): the step
  is counted at the first and last contexts of the run and, with four or more steps, checked at a third
  context between them; the N − 1 steps are then summed exactly. A step that is not affine (a sliding window
  that crops the cache) is refused with that reason.

The cache's layout (layers, heads, head size, element type) comes from running the model on P tokens under
fake tensors: no weight is read and no memory allocated.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
from typing import TYPE_CHECKING, Any

from flopcount.errors import FrontendError, UsageError, import_framework
from flopcount.reporting.generation import (
    DecodePiece,
    Generation,
    affine_steps,
    check_generate,
    context_lengths,
    segments,
)

if TYPE_CHECKING:
    from flopcount.options import CountOptions

log = logging.getLogger(__name__)

__all__ = ["EXPORT_KEYWORDS", "CacheLayout", "Seq2SeqLayout", "cache_argument", "cache_layout", "count_generation",
           "count_seq2seq_generation", "decode_pieces", "decode_step_module", "from_causal_lm", "is_encoder_decoder",
           "layout_of",
           "rebuild_cache", "seq2seq_layout", "seq2seq_step_module"]


def from_causal_lm(model, generate: tuple[int, int], *, batch: int = 1, cache_dir=None, breakpoints=(),
                   **count_kwargs: Any):
    """Count ``generate()`` of a causal LM: the report of its prefill graph, with ``report.generation``
    (:class:`flopcount.reporting.generation.Generation`) for the whole run.

    Parameters
    ----------
    model : torch.nn.Module
        A causal LM whose ``forward`` takes ``input_ids`` and a KV cache (:func:`cache_argument`) and returns
        logits (a transformers ``...ForCausalLM``, or any module with that interface), or an encoder-decoder LM
        whose ``forward`` also takes ``encoder_outputs`` and ``decoder_input_ids`` (T5, BART:
        :func:`count_seq2seq_generation`); on the meta device it costs no memory.
    generate : (P, N)
        Prompt tokens and new tokens, both at least 1.
    batch : int
        Sequences generated at once (B); every figure is for the whole batch.
    breakpoints : sequence of int
        Contexts where the step's form may change: the sliding windows of the model's layers (``--hf`` reads them
        from the configuration); the contexts are cut there and each piece is fitted and checked apart.
    cache_dir, **count_kwargs
        As for :func:`flopcount.from_torch` (``convention``, ``strict`` ...); inference only.
    """
    from . import common

    export = {k: count_kwargs.pop(k) for k in EXPORT_KEYWORDS if k in count_kwargs}
    _check_generation(generate, batch, count_kwargs.get("mode", "inference"), export.get("training"))
    options, _ = common.options_of("from_causal_lm", count_kwargs)
    return count_generation(model, generate, options, batch=batch, cache_dir=cache_dir, breakpoints=breakpoints,
                            **export)


#: The keywords of :func:`flopcount.from_torch` that shape the export rather than the count.
EXPORT_KEYWORDS = ("training", "input_names", "opset")


def _check_generation(generate, batch, mode, training) -> tuple[int, int]:
    prompt, new = check_generate(*generate)
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UsageError(f"generate: the batch must be a positive integer, got {batch!r}")
    if mode != "inference" or training:
        raise UsageError("generate: generation is inference; leave out --mode train (mode='train')")
    return prompt, new


def count_generation(model, generate: tuple[int, int], options: CountOptions, *, batch: int = 1, cache_dir=None,
                     breakpoints=(), training: bool | None = None, **export: Any):
    """:func:`from_causal_lm` under the settings of ``options`` (inference; ``options.batch`` is replaced by
    ``batch``); ``export`` (``opset``) is passed to :func:`flopcount.frontends.torch.count_module`."""
    from flopcount.plans import check_generation_plan, with_plan, without_plan

    from .torch import count_module

    if is_encoder_decoder(model):
        return count_seq2seq_generation(model, generate, options, batch=batch, cache_dir=cache_dir, training=training,
                                        **export)
    prompt, new = _check_generation(generate, batch, options.mode, training)
    check_generation_plan(options)
    planned, options = options, dataclasses.replace(without_plan(options), batch=batch)
    torch = _torch()
    parameters = _forward_parameters(model)
    if "input_ids" not in parameters or cache_argument(model) is None:
        raise UsageError(f"generate: {type(model).__name__}.forward takes no input_ids and no KV cache argument "
                         f"({_cache_names_hint()}): it is not a causal LM with a KV cache; count it without --generate")
    layout = cache_layout(model, batch, prompt)  # before the prefill's export: a model without a KV cache stops here
    _check_cache(model, layout, batch, prompt, prompt + new - 1)
    end = cache_layout(model, batch, prompt + new - 1)  # the cache as the model holds it after the last step
    ids = ((batch, prompt), torch.int64)
    prefill_inputs: dict[str, Any] = {"input_ids": ids}
    if "use_cache" in parameters:
        prefill_inputs["use_cache"] = False  # the cache costs nothing to return; the step graphs count its use
    if "logits_to_keep" in parameters:
        prefill_inputs["logits_to_keep"] = 1
    report = count_module(model, prefill_inputs, options, cache_dir=cache_dir, **export)
    step = decode_step_module(model, layout)
    contexts = context_lengths(prompt, new)

    def count_step(context: int):
        cache = tuple(((*shape[:-2], context - 1, shape[-1]), dtype) for shape, dtype in layout.tensors)
        inputs = (((batch, 1), torch.int64), *cache)
        names = ["input_ids", *layout.names]
        return count_module(step, inputs, options, input_names=names, cache_dir=cache_dir, **export)

    pieces, steps, method = decode_pieces(contexts, breakpoints, count_step)
    log.info("generate: %s", method)
    generation = Generation(batch, prompt, new, report.forward, pieces, end.bytes(), method, steps)
    return with_plan(_with(report, generation), planned)  # the plan's ledgers per rank, of the whole generation


def decode_pieces(contexts: range, breakpoints, count_step) -> tuple[tuple[DecodePiece, ...], tuple, str]:
    """``(pieces, steps, method)`` of the decode steps at ``contexts``, cut at ``breakpoints``
    (:func:`flopcount.reporting.generation.segments`): ``count_step(c)``, the report of the step at context c, is
    taken at each piece's first and last contexts and, with four or more steps, checked at a third between them;
    ``steps`` holds ``(context, report)`` at each piece's ends; ``method`` says how, in words."""
    pieces, checked, steps = [], [], []
    for segment in segments(contexts, breakpoints):
        chosen = sorted({segment[0], segment[-1], *([segment[len(segment) // 2]] if len(segment) >= 4 else [])})
        reports = {c: count_step(c) for c in chosen}
        steps += [(c, reports[c]) for c in sorted({segment[0], segment[-1]})]  # the per-rank ledger's endpoints
        counts = {c: r.forward for c, r in reports.items()}
        try:
            constant, per_position = affine_steps(counts)
        except ValueError as e:
            raise FrontendError(f"generate: {e}: the decode step is not affine in its context between "
                                f"{segment[0]} and {segment[-1]} (a sliding window the configuration does not "
                                "name?), which is not counted yet") from None
        pieces.append(DecodePiece(segment[0], segment[-1], constant, per_position))
        checked += chosen[1:2] if len(chosen) == 3 else []
    exported = sorted({c for p in pieces for c in (p.first, p.last)})
    method = ("no decode step (N = 1)" if not pieces else
              "decode step exported with its KV cache at context" + ("s " if len(exported) > 1 else " ")
              + ", ".join(map(str, exported))
              + (f", its line checked at {', '.join(map(str, checked))}" if checked else "")
              + (f"; pieces cut at the sliding window{'s' if len(set(breakpoints)) > 1 else ''} "
                 f"{', '.join(map(str, sorted(set(breakpoints))))}" if len(pieces) > 1 else ""))
    return tuple(pieces), tuple(steps), method


#: The most bytes of KV cache the last decode step's export may be given as example inputs (they are allocated).
MAX_CACHE_BYTES = 2**35


def _check_cache(model, layout: CacheLayout, batch: int, prompt: int, context: int) -> None:
    """A :class:`UsageError`, before any export, where the last decode step's KV cache would not fit in memory as
    the example inputs of its export (``--generate 8:1099511627776``): a clear line, not minutes and a failed
    allocation. The cache after P positions (``layout``) grown to ``context`` is an upper bound (a layer with a
    sliding window holds fewer); only above the limit is the model run again, under fake tensors, at ``context``."""
    def grown(shape, dtype) -> int:
        n = dtype.itemsize
        for d in shape:
            n *= d
        return n * context // prompt if shape[-2] >= prompt else n

    held = sum(grown(shape, dtype) for shape, dtype in layout.tensors)
    if held <= MAX_CACHE_BYTES:
        return
    try:
        held = sum(cache_layout(model, batch, context).bytes().values())
    except FrontendError:  # a context too long for the model to run even under fake tensors: the bound stands
        pass
    _check_held(held, context)


def _check_held(held: int, context: int) -> None:
    if held > MAX_CACHE_BYTES:
        raise UsageError(f"generate: the KV cache at context {context:,} is {held / 2**30:,.1f} GiB, which the export "
                         f"of the last decode step holds as example inputs (at most {MAX_CACHE_BYTES // 2**30} GiB); "
                         "give fewer tokens (--generate P:N, generate=(P, N))")


def _with(report, generation: Generation):
    if report.memory is not None:  # the ledger of the prefill, with the cache after the last step beside it
        kv = sum(generation.kv_cache_bytes.values())
        memory = dataclasses.replace(report.memory, ranks=tuple(dataclasses.replace(r, kv_cache_bytes=kv)
                                                                for r in report.memory.ranks))
        report = dataclasses.replace(report, memory=memory)
    return dataclasses.replace(report, generation=generation)


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """The KV cache's graph inputs: names, ``(shape after P positions, dtype)`` each (position axis −2; a layer
    with a sliding window holds fewer), and how to
    rebuild the model's cache object from them (``kind``: ``"dynamic"`` a transformers ``DynamicCache``,
    ``"tuple"`` the legacy tuple of (key, value) per layer)."""

    names: tuple[str, ...]
    tensors: tuple[tuple[tuple[int, ...], Any], ...]
    kind: str

    def bytes(self) -> dict[str, int]:
        """Bytes the cache holds, by element type (``"float32"`` ...), over every layer and sequence."""
        out: dict[str, int] = {}
        for shape, dtype in self.tensors:
            n = dtype.itemsize
            for d in shape:
                n *= d
            key = str(dtype).removeprefix("torch.")
            out[key] = out.get(key, 0) + n
        return out


def cache_layout(model, batch: int, prompt: int) -> CacheLayout:
    """The KV cache ``model`` returns after P prompt tokens, found under fake tensors (nothing allocated)."""
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    parameters = _forward_parameters(model)
    kwargs = {"use_cache": True} if "use_cache" in parameters else {}
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            ids = torch.zeros(batch, prompt, dtype=torch.int64, device=_device(model))
            out = model(input_ids=ids, **kwargs)
    except Exception as e:  # noqa: BLE001 - the model's own code may raise anything
        raise FrontendError(f"generate: {type(model).__name__} cannot run {prompt} prompt tokens to show its KV "
                            f"cache: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    return layout_of(model, _output_cache(out, cache_argument(model)), prompt)


def layout_of(model, cache, positions: int, prefix: str = "past") -> CacheLayout:
    """The :class:`CacheLayout` of ``cache`` (a transformers ``DynamicCache`` or a tuple of (key, value) per
    layer) holding ``positions`` positions (fewer on a layer with a sliding window), its inputs named
    ``{prefix}_key_{i}``, ``{prefix}_value_{i}``; a :class:`UsageError` for another kind of cache."""
    torch = _torch()
    layers = getattr(cache, "layers", None)
    if layers is not None and all(isinstance(getattr(layer, "keys", None), torch.Tensor)
                                  and isinstance(getattr(layer, "values", None), torch.Tensor) for layer in layers):
        pairs, kind = [(layer.keys, layer.values) for layer in layers], "dynamic"
    elif isinstance(cache, (tuple, list)) and all(isinstance(p, (tuple, list)) and len(p) == 2 for p in cache):
        pairs, kind = [tuple(p) for p in cache], "tuple"
    else:
        raise UsageError(f"generate: {type(model).__name__} returns no KV cache ({_cache_names_hint()}) from its "
                         "forward, or one of another kind than keys and values per layer; it is not a model that "
                         "generate() runs with a KV cache")
    names, tensors = [], []
    for i, pair in enumerate(pairs):
        for which, t in zip(("key", "value"), pair):
            if t is None or t.dim() < 3 or not 0 < t.shape[-2] <= positions:
                raise UsageError(f"generate: layer {i}'s cached {which}s do not hold the {positions} positions "
                                 f"on axis -2 (shape {None if t is None else tuple(t.shape)}); this cache is not "
                                 "supported")
            names.append(f"{prefix}_{which}_{i}")
            tensors.append((tuple(t.shape), t.dtype))
    return CacheLayout(tuple(names), tuple(tensors), kind)


def decode_step_module(model, layout: CacheLayout):
    """A module whose ``forward(input_ids, *cache)`` runs one decode step of ``model``: one token per sequence
    at position L over the cache tensors of L positions (key, value per layer), logits of that token."""
    torch = _torch()
    parameters = _forward_parameters(model)
    argument = cache_argument(model)
    extra = {"use_cache": True} if "use_cache" in parameters else {}
    if "logits_to_keep" in parameters:
        extra["logits_to_keep"] = 1

    class DecodeStep(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, input_ids, *cache):
            past = rebuild_cache(self.lm, layout.kind, cache)
            n = cache[0].shape[-2]
            kwargs = dict(extra)
            position = torch.arange(n, n + input_ids.shape[1], device=input_ids.device)
            if "position_ids" in parameters:
                kwargs["position_ids"] = position.unsqueeze(0).expand(input_ids.shape[0], -1)
            if "cache_position" in parameters:
                kwargs["cache_position"] = position
            kwargs[argument] = past
            out = self.lm(input_ids=input_ids, **kwargs)
            return out.logits if hasattr(out, "logits") else out[0]

    DecodeStep.__name__ = DecodeStep.__qualname__ = f"{type(model).__name__}DecodeStep"
    return DecodeStep(model)


def rebuild_cache(model, kind: str, cache: tuple):
    """The model's cache object from the flat tensors (key, value per layer) of a :class:`CacheLayout` of ``kind``."""
    pairs = [(cache[i], cache[i + 1]) for i in range(0, len(cache), 2)]
    if kind == "tuple":
        return tuple(pairs)
    from transformers import DynamicCache

    config = getattr(model, "config", None)
    takes_config = "config" in _parameters(DynamicCache.__init__)
    past = DynamicCache(config=config) if config is not None and takes_config else DynamicCache()
    if len(getattr(past, "layers", pairs)) < len(pairs):  # sized by the encoder's layers (T5 with fewer than the
        past = DynamicCache()  # decoder's: transformers' own generate() fails there): each layer made as filled
    for i, (k, v) in enumerate(pairs):
        past.update(k, v, i)
    return past


#: The name plain PyTorch causal LMs (not transformers models) give their cache argument, the last one tried.
CONVENTIONAL_CACHE_ARGUMENT = "past_key_values"


def cache_argument(model) -> str | None:
    """The name of the parameter of ``model.forward`` that takes its KV cache, found from the model and the
    installed transformers, never from one release of it: the first of the names transformers' own generation
    passes the cache under (``generation.utils.ALL_CACHE_NAMES``: ``past_key_values`` up to 5.23, ``cache`` from
    5.24) that ``forward`` takes; else a parameter annotated with transformers' ``Cache``; else
    :data:`CONVENTIONAL_CACHE_ARGUMENT` where ``forward`` takes it. None where ``forward`` takes no cache."""
    parameters = _forward_parameters(model)
    for name in _transformers_cache_names():
        if name in parameters:
            return name
    cache_class = _transformers_cache_class()
    if cache_class is not None:
        for name, parameter in parameters.items():
            if _annotates(parameter.annotation, cache_class):
                return name
    return CONVENTIONAL_CACHE_ARGUMENT if CONVENTIONAL_CACHE_ARGUMENT in parameters else None


def _transformers_cache_names() -> tuple[str, ...]:
    """The names transformers' ``generate()`` passes and reads the cache under, as the installed release has them
    (empty without transformers)."""
    try:
        from transformers.generation import utils
    except ImportError:
        return ()
    return tuple(name for name in getattr(utils, "ALL_CACHE_NAMES", ()) if isinstance(name, str))


def _transformers_cache_class():
    try:
        from transformers import Cache
    except ImportError:
        return None
    return Cache


def _annotates(annotation, cls) -> bool:
    """Whether ``annotation`` (``Cache``, ``Cache | None``, ``Optional[DynamicCache]``, a string of one) names
    ``cls`` or a subclass of it."""
    import typing

    if isinstance(annotation, str):
        return cls.__name__ in annotation
    if isinstance(annotation, type):
        return issubclass(annotation, cls)
    return any(_annotates(a, cls) for a in typing.get_args(annotation))


def _cache_names_hint() -> str:
    names = dict.fromkeys((*_transformers_cache_names(), CONVENTIONAL_CACHE_ARGUMENT))
    version = _transformers_version()
    return (" or ".join(names) + " or a parameter annotated as transformers' Cache"
            + (f", as transformers {version} names it" if version else ""))


def _transformers_version() -> str | None:
    try:
        import transformers
    except ImportError:
        return None
    return getattr(transformers, "__version__", None)


def _output_cache(out, argument: str | None):
    """The cache in the output of ``forward``: the field named as the cache argument or as transformers' generation
    reads it back, else any field holding a transformers ``Cache``, else the second item of a plain tuple."""
    names = dict.fromkeys((*((argument,) if argument else ()), *_transformers_cache_names()))
    for name in names:
        value = out.get(name) if isinstance(out, dict) else getattr(out, name, None)
        if value is not None:
            return value
    cache_class = _transformers_cache_class()
    if cache_class is not None and isinstance(out, dict):
        for value in out.values():
            if isinstance(value, cache_class):
                return value
    if isinstance(out, tuple) and len(out) > 1:
        return out[1]
    return None


def _forward_parameters(model) -> dict:
    return _parameters(getattr(model, "forward", None))


def _parameters(function) -> dict:
    try:
        return dict(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return {}


def _device(model):
    for p in model.parameters():
        return p.device
    return "cpu"


def _torch():
    try:
        return import_framework("torch")
    except ModuleNotFoundError:
        raise FrontendError("generate: torch is not installed; pip install torch (see README)") from None


def is_encoder_decoder(model) -> bool:
    """Whether ``generate()`` of ``model`` runs an encoder and then a decoder: its ``forward`` takes what
    transformers' generation passes an encoder-decoder's decoder, ``encoder_outputs`` and ``decoder_input_ids``."""
    parameters = _forward_parameters(model)
    return "encoder_outputs" in parameters and "decoder_input_ids" in parameters


def count_seq2seq_generation(model, generate: tuple[int, int], options: CountOptions, *, batch: int = 1,
                             cache_dir=None, training: bool | None = None, **export: Any):
    """``generate()`` of an encoder-decoder LM (T5, BART: ``forward`` takes ``input_ids``, ``decoder_input_ids``,
    ``encoder_outputs`` and an ``EncoderDecoderCache``; Whisper, ``input_features`` in place of the ids:
    :func:`_encoder_input`) as transformers runs it: the report of its prefill, the encoder over the P prompt tokens
    (or audio positions) and the decoder over its start token (one graph, the model's forward with
    ``decoder_input_ids`` of one token: the cross-attention keys and values of the encoder's output are computed
    there, once), with ``report.generation`` (``encoder_decoder``) whose N − 1 decode steps each run one token over
    the decoder's own cache of c − 1 positions and the cached cross-attention keys and values, exported with both
    caches and the encoder's output as graph inputs and counted as :func:`count_generation` counts a causal LM's."""
    from flopcount.plans import check_generation_plan, with_plan, without_plan

    from .torch import count_module

    prompt, new = _check_generation(generate, batch, options.mode, training)
    check_generation_plan(options, encoder_decoder=True)
    planned, options = options, dataclasses.replace(without_plan(options), batch=batch)
    torch = _torch()
    parameters = _forward_parameters(model)
    missing = [n for n in ("decoder_input_ids", "encoder_outputs") if n not in parameters]
    if missing or cache_argument(model) is None:
        raise UsageError(f"generate: {type(model).__name__}.forward takes no {' and no '.join(missing or ['cache'])}: "
                         "it is not an encoder-decoder that generate() runs with a KV cache")
    source = _encoder_input(model, batch, prompt, parameters)
    layout = seq2seq_layout(model, batch, prompt, source)
    own, cross = layout.own.bytes(), layout.cross.bytes()  # one position of the decoder's own; the P of the prompt
    end = {k: own.get(k, 0) * new + cross.get(k, 0) for k in dict.fromkeys([*own, *cross])}  # after the last step
    _check_held(sum(end.values()), new)
    prefill_inputs: dict[str, Any] = {source[0]: source[1], "decoder_input_ids": ((batch, 1), torch.int64)}
    if "use_cache" in parameters:
        prefill_inputs["use_cache"] = False  # the cache costs nothing to return; the step graphs count its use
    try:
        report = count_module(model, prefill_inputs, options, cache_dir=cache_dir, **export)
    except FrontendError:  # the encoder's mask of ones, as generate() hands it (SwitchTransformers' traced encoder)
        from .hf import with_ones_mask

        filled = with_ones_mask(model, prefill_inputs)
        if filled is None:
            raise
        report = count_module(model, filled, options, cache_dir=cache_dir, **export)
    step = seq2seq_step_module(model, layout)

    def count_step(context: int):
        own = tuple(((*shape[:-2], context - 1, shape[-1]), dtype) for shape, dtype in layout.own.tensors)
        inputs = (((batch, 1), torch.int64), layout.encoded, *own, *layout.cross.tensors)
        names = ["decoder_input_ids", "encoder_hidden_states", *layout.own.names, *layout.cross.names]
        return count_module(step, inputs, options, input_names=names, cache_dir=cache_dir, **export)

    pieces, steps, method = decode_pieces(range(2, new + 1), (), count_step)
    what = "prompt" if source[0] == "input_ids" else "audio"
    method = (f"an encoder-decoder: the prefill is its encoder and its decoder over the start token, the decode steps "
              f"run over the decoder's own cache (the context c) and the cached cross-attention keys and values of "
              f"the {prompt} {what} positions; {method}")
    log.info("generate: %s", method)
    generation = Generation(batch, prompt, new, report.forward, pieces, end, method, steps, encoder_decoder=True)
    return with_plan(_with(report, generation), planned)


@dataclasses.dataclass(frozen=True)
class Seq2SeqLayout:
    """What an encoder-decoder's decode step takes besides its token: the encoder's output ``(shape, dtype)``,
    the decoder's own cache after one position (``own``) and the cross-attention cache of the P prompt positions
    (``cross``), each a :class:`CacheLayout`; ``output``: the class of the encoder's output, which the model's
    forward takes back as ``encoder_outputs`` (a mixture-of-experts encoder's carries its router logits)."""

    encoded: tuple
    own: CacheLayout
    cross: CacheLayout
    output: Any = None


def _encoder_input(model, batch: int, prompt: int, parameters) -> tuple[str, tuple]:
    """The encoder's input in an encoder-decoder's prefill, ``(name, (shape, dtype))``: P token ids
    (``input_ids``), or audio features (``input_features``, Whisper: mel bins × frames, its encoder's 1-D
    convolutions reducing the frames by their strides to the ``max_source_positions`` positions its decoder's
    cross-attention reads, which P must be)."""
    torch = _torch()
    if "input_ids" in parameters:
        return "input_ids", ((batch, prompt), torch.int64)
    config = getattr(model, "config", None)
    bins, positions = getattr(config, "num_mel_bins", None), getattr(config, "max_source_positions", None)
    encoder = model.get_encoder() if callable(getattr(model, "get_encoder", None)) else None
    if "input_features" not in parameters or not isinstance(bins, int) or not isinstance(positions, int) or (
            encoder is None):
        raise UsageError(f"generate: {type(model).__name__}.forward takes no input_ids and no input_features of "
                         "an audio encoder (num_mel_bins, max_source_positions in its configuration): --generate P:N "
                         "counts an encoder-decoder over P token ids or audio positions; this encoder's input is not "
                         "counted")
    stride = math.prod(m.stride[0] for m in encoder.modules() if isinstance(m, torch.nn.Conv1d))
    if prompt != positions:
        raise UsageError(f"--generate {prompt}:N: {type(model).__name__}'s encoder reads audio features "
                         f"(input_features of {bins} mel bins x {positions * stride} frames) and gives {positions} "
                         f"positions, which the decoder's cross-attention reads; give P = {positions}")
    return "input_features", ((batch, bins, positions * stride), next(model.parameters()).dtype)


def seq2seq_layout(model, batch: int, prompt: int, source: tuple | None = None) -> Seq2SeqLayout:
    """The caches ``model`` returns after P prompt tokens (or its encoder's ``source``, ``(name, (shape, dtype))``:
    :func:`_encoder_input`) and the decoder's first token, found under fake tensors (nothing allocated): its
    ``EncoderDecoderCache``'s self-attention and cross-attention caches. The encoder runs first and the model on its
    output, as ``generate()`` runs them (SwitchTransformers' encoder refuses the ``use_cache`` of a forward over
    both)."""
    torch = _torch()
    from torch._subclasses.fake_tensor import FakeTensorMode

    name, (shape, dtype) = source or ("input_ids", ((batch, prompt), torch.int64))
    try:
        with FakeTensorMode(allow_non_fake_inputs=True), torch.no_grad():
            start = torch.zeros(batch, 1, dtype=torch.int64, device=_device(model))
            encoded = torch.zeros(shape, dtype=dtype, device=_device(model))
            source_out = model.get_encoder()(**{name: encoded})
            out = model(encoder_outputs=source_out, decoder_input_ids=start, use_cache=True)
    except Exception as e:  # noqa: BLE001 - the model's own code may raise anything
        raise FrontendError(f"generate: {type(model).__name__} cannot run {prompt} prompt tokens to show its caches: "
                            f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    cache = _output_cache(out, cache_argument(model))
    own, cross = (getattr(cache, name, None) for name in ("self_attention_cache", "cross_attention_cache"))
    encoded = getattr(out, "encoder_last_hidden_state", None)
    if own is None or cross is None or not isinstance(encoded, torch.Tensor):
        raise UsageError(f"generate: {type(model).__name__} returns no encoder output and no cache of self-attention "
                         "and cross-attention keys and values (transformers' EncoderDecoderCache); it is not an "
                         "encoder-decoder that generate() runs with a KV cache")
    layout = Seq2SeqLayout((tuple(encoded.shape), encoded.dtype), layout_of(model, own, 1),
                           layout_of(model, cross, prompt, prefix="cross"), type(source_out))
    if layout.own.kind != "dynamic" or layout.cross.kind != "dynamic":
        raise UsageError(f"generate: {type(model).__name__}'s encoder-decoder cache holds tuples, not transformers' "
                         "DynamicCache per attention; this cache is not supported")
    return layout


def seq2seq_step_module(model, layout: Seq2SeqLayout):
    """A module whose ``forward(decoder_input_ids, encoder_hidden_states, *own, *cross)`` runs one decode step of
    the encoder-decoder ``model``: one token per sequence over its own cache of L positions and the cached
    cross-attention keys and values (an ``EncoderDecoderCache`` whose cross-attention layers are filled, so the
    model reuses them as ``generate()`` does), logits of that token."""
    torch = _torch()
    from transformers import EncoderDecoderCache
    from transformers.modeling_outputs import BaseModelOutput, ModelOutput

    argument = cache_argument(model)
    extra = {"use_cache": True} if "use_cache" in _forward_parameters(model) else {}
    split = len(layout.own.names)

    class DecodeStep(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, decoder_input_ids, encoder_hidden_states, *cache):
            own = rebuild_cache(self.lm, layout.own.kind, cache[:split])
            cross = rebuild_cache(self.lm, layout.cross.kind, cache[split:])
            encoded = (layout.output if isinstance(layout.output, type) and issubclass(layout.output, ModelOutput)
                       else BaseModelOutput)(last_hidden_state=encoder_hidden_states)
            kwargs = {**extra, argument: EncoderDecoderCache(own, cross)}
            out = self.lm(encoder_outputs=encoded, decoder_input_ids=decoder_input_ids, **kwargs)
            return out.logits if hasattr(out, "logits") else out[0]

    DecodeStep.__name__ = DecodeStep.__qualname__ = f"{type(model).__name__}DecodeStep"
    return DecodeStep(model)
