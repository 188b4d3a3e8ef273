"""PyTorch frontend: count an ``nn.Module`` by exporting it to a weightless ONNX graph.

>>> import flopcount, torch  # doctest: +SKIP
>>> report = flopcount.from_torch(torch.nn.Linear(64, 10), (8, 64))  # doctest: +SKIP
>>> report.total.flops  # 2*8*64*10 for the products + 8*10 for the bias  # doctest: +SKIP
10320

The module is exported with :mod:`flopcount.frontends.export`'s exporters (the torch.export-based one with
BatchNormalization kept visible, then the TorchScript one), its large tensors are replaced by references to a file
that is never written, and the graph is counted with :func:`flopcount.count`. Weights are never read by the count;
the exporters see them only because torch traces the real module.

**Training graphs.** ``training=True`` exports the module as it runs in training: BatchNormalization with
``training_mode=1`` (batch statistics) and Dropout with a constant-true ``training_mode`` input. Facts about torch
2.13 / onnxscript 0.7 behind the choice of exporter:

* TorchScript exporter (``dynamo=False``): ``training=torch.onnx.TrainingMode.TRAINING`` gives exactly that
  (BatchNormalization ``training_mode=1`` with its three outputs, Dropout with ratio and ``training_mode``
  constants). Without it (the default ``TrainingMode.EVAL``) the exporter switches the module to eval itself,
  even after ``module.train()``: BatchNormalization gets ``training_mode=0`` and Dropout disappears. Tracing runs
  the forward pass for real, so it updates BatchNorm running statistics; this frontend restores every buffer.
* torch.export-based exporter (``dynamo=True``): the ``training`` argument is ignored; what counts is
  ``module.train()``. Dropout is then kept with a constant-true ``training_mode``, but BatchNormalization is always
  emitted in inference form (no ``training_mode`` attribute, one output): onnxscript's translation of
  ``aten::_native_batch_norm_legit_functional`` hard-codes ``training = False``. With ``optimize=True`` it would
  also fold BatchNormalization into the convolutions.

So ``training=True`` uses the TorchScript exporter first; where that fails, it falls back to the torch.export one
and marks every BatchNormalization node ``training_mode=1`` (in a module put in ``train()``, every batch norm
uses batch statistics). Inference exports try torch.export first, as :func:`flopcount.frontends.export.export_weightless`
does.

**Weight values.** Nothing in the export depends on them: onnxscript's optimiser runs with the weights hidden
(``_weights_opaque`` in :mod:`flopcount.frontends.export`; its rule for absent Conv biases would otherwise delete real
biases that are zero), and the TorchScript exporter merges only parameters that are one tensor, never two with equal
values (:func:`_deduplicate_by_identity_only`).

**Calls.** While exporting, ``module.forward`` is replaced by a function that takes the graph inputs positionally,
calls the real ``forward`` with them (by keyword when they were given as a dict, with the non-tensor keyword
arguments), and returns the tensors of the result as a flat tuple (dicts and model outputs by value; cache objects
left out). Parameter names, and so initializer names, are those of the module. A module on the meta device is
exported by torch.export alone, its weights becoming external-data references.

**Cache.** Exports are cached by a hash of everything the export depends on except weight values: the module tree
(its repr, the source files of every class, and every attribute of every submodule described recursively by
:class:`flopcount.frontends.common.StateDescriber`: configuration objects with their private attributes, forward
hooks, functions), parameter and buffer names, shapes and dtypes, the inputs (names, shapes, dtypes and a digest of
their values), the keyword constants, the training flag, the opset and the torch, onnx, onnxscript and flopcount
versions. The key is the same in every process: sets are described in sorted order, memory addresses are left out
of reprs, hook handle ids become ranks and private ``hash()`` caches are left out (Python salts string hashes per
process). Where some state cannot be described, the export is not cached. The cache folder is ``cache_dir=``, else
``$FLOPCOUNT_CACHE`` (``0``/``off`` disables it), else ``$XDG_CACHE_HOME/flopcount`` or ``~/.cache/flopcount``;
``cache_dir=False`` disables caching. Files are small (weightless graphs).

torch is imported inside the functions that need it; importing this module needs only onnx.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import onnx

from flopcount.errors import FrontendError, UsageError, first_line, import_framework
from flopcount.pipeline.progress import phase

from . import common
from .common import CACHE_ENV, default_cache_dir
from .torch_cache import fingerprint, module_state, torch_leaf
from .torch_errors import FRONTEND, batch_norm_size_check, exporter_line, failure_message, refuse_untrainable_batch_norm

if TYPE_CHECKING:
    import torch

    from flopcount.options import CountOptions
    from flopcount.reporting.report import Report

    from .exported import Exported

__all__ = ["CACHE_ENV", "count_module", "default_cache_dir", "forward_inputs", "from_torch", "load_factory", "module_state", "to_onnx", "torch_leaf"]

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'flopcount[torch]'"
#: Seconds an export runs before the progress indicator appears.
_PROGRESS_DELAY_S = 1.0
#: Loggers of the exporters, quieted while they run unless flopcount's own logging is at DEBUG.
_EXPORTER_LOGGERS = (
    "torch", "torch.onnx", "torch.export", "torch._export", "torch._dynamo", "torch._subclasses", "torch.fx",
    "torch.utils._sympy", "onnxscript", "onnx_ir",
)


# ---------------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------------


def from_torch(
    module: torch.nn.Module,
    example_inputs: Any,
    training: bool | None = None,
    *,
    input_names: Sequence[str] | None = None,
    trainable_inputs: Sequence[str] | None = None,
    opset: int | None = None,
    cache_dir: str | os.PathLike | bool | None = None,
    **count_kwargs: Any,
) -> Report:
    """Export a PyTorch module to ONNX (weightless) and count it with :func:`flopcount.count`.

    Parameters
    ----------
    module : torch.nn.Module
        The model. Its train/eval flags and buffer values are the same after the call as before. A module built
        on the meta device (``with torch.device("meta"): ...``) is counted without any weight memory.
    example_inputs : Tensor, shape, (shape, dtype), or a tuple or dict of them
        The arguments of ``module.forward``. A tuple gives them in order; a dict gives them by the names of
        ``forward``'s parameters (``{"input_ids": ((1, 128), torch.int64), "use_cache": False}``), and a name
        ``forward`` does not have is refused with the list of those it has. A shape (a tuple of ints or a
        ``torch.Size``) becomes a float32 tensor of standard-normal values drawn from a generator seeded with 0
        (values matter only to data-dependent Python control flow), on the device of the module's parameters;
        ``(shape, dtype)`` (dtype a ``torch.dtype`` or its name, ``"int64"``) gives another type: zeros for
        integers, True for bools. ``(8, 3, 224, 224)`` is one input; ``((8, 16), (8, 16))`` two. In a dict,
        values that are not tensors or shapes (``False``, ``None``, numbers, strings) are passed to ``forward``
        as they are and are not graph inputs.
    training : bool, optional
        Export the graph as it runs in training (BatchNormalization on batch statistics, Dropout active).
        ``None`` (the default) follows ``mode``: True when ``mode="train"``. With ``training=True`` the count
        gets ``mode="train"`` (forward and backward) unless ``mode`` is given.
    input_names : sequence of str, optional
        Names of the ONNX graph inputs, one per positional example input; by default the names of ``forward``'s
        parameters. Not with a dict of inputs (its keys are the names).
    trainable_inputs : sequence of str, optional
        Inputs that are trained rather than data (an embedding fed in, a soft prompt): with ``mode="train"``
        their gradients are counted, as for parameters. Tensors passed with ``requires_grad=True`` are added.
    opset : int, optional
        ONNX opset of the default domain (default: :data:`flopcount.frontends.export.DEFAULT_OPSET`).
    cache_dir : path, bool or None
        Export cache folder; ``None`` or ``True``: ``$FLOPCOUNT_CACHE`` or ``~/.cache/flopcount``;
        ``False``: no cache.
    **count_kwargs
        The settings of the count (``convention``, ``strict``, ``batch``, ``mode``, ...: the fields of
        :class:`~flopcount.options.CountOptions`), made into one record and checked here, before the export
        (:func:`count_module` takes the record). ``batch`` re-sizes dim 0 of every example input before the export,
        so the graph is exported at that batch.

    Returns
    -------
    Report
        The same report :func:`flopcount.count` gives for the exported file.

    Raises
    ------
    FrontendError
        torch is missing, or the module cannot be exported (the message names the failing operator when the
        exporter reports it).
    UsageError
        ``example_inputs``, ``input_names`` or ``trainable_inputs`` are malformed, or the inputs do not fit
        ``forward()`` (the message shows what was passed).
    """
    options, training = common.options_of("from_torch", count_kwargs, training)
    if trainable_inputs is not None:
        options = dataclasses.replace(
            options, trainable_inputs=[trainable_inputs] if isinstance(trainable_inputs, str) else trainable_inputs)
    return count_module(module, example_inputs, options, training=training, input_names=input_names, opset=opset,
                        cache_dir=cache_dir)


def count_module(
    module: torch.nn.Module,
    example_inputs: Any,
    options: CountOptions,
    *,
    training: bool | None = None,
    input_names: Sequence[str] | None = None,
    opset: int | None = None,
    cache_dir: str | os.PathLike | bool | None = None,
) -> Report:
    """:func:`from_torch` under ``options``: the module exported (in training with ``training``, None following
    ``options.mode``; layer drop off, with a note: :mod:`.train_export`) and counted. ``options.batch`` re-sizes dim 0
    of the example inputs before the export; ``options.trainable_inputs`` are the inputs trained (tensors passed with
    ``requires_grad=True`` added); ``options.trainable`` is, when None, the module's trainable parameters."""
    from .exported import count_exported
    from .train_export import every_layer, with_notes

    with every_layer(module, options.mode == "train" if training is None else training) as drops:
        model, exported = export_module(module, example_inputs, options, training=training, input_names=input_names,
                                        opset=opset, cache_dir=cache_dir)
    return with_notes(count_exported(model, exported, options), drops)


def export_module(module: torch.nn.Module, example_inputs: Any, options: CountOptions, *,
                  training: bool | None = None, input_names: Sequence[str] | None = None, opset: int | None = None,
                  cache_dir: str | os.PathLike | bool | None = None) -> tuple[onnx.ModelProto, Exported]:
    """The export :func:`count_module` counts, and what its count takes from ``module``
    (:class:`~flopcount.frontends.exported.Exported`)."""
    from .exported import GIVEN, Exported, onnx_type

    if training is None:
        training = options.mode == "train"
    torch = _import_torch()
    _check_module(torch, module)
    call = _bind(torch, module, example_inputs, input_names, _device(module))
    batch = options.batch
    if batch is not None and _shared_batch(call.tensors) not in (None, batch):
        call = call.with_tensors(tuple(x[:1].expand(batch, *x.shape[1:]) for x in call.tensors))
    trained = _trainable_inputs(call, options.trainable_inputs)
    model, key = _to_onnx(torch, module, call, training=training, opset=opset, cache_dir=cache_dir)
    # inputs named by trainable_inputs need mode="train" (count says so); requires_grad alone is ignored otherwise
    named = trained and (options.trainable_inputs or options.mode == "train")
    trainable, unread, frozen = GIVEN, {}, {}
    if options.trainable is None:
        trainable, unread, frozen = _trainable_initializers(module, model)
    parameters = dict(module.named_parameters(remove_duplicate=False)) if unread else {}
    return model, Exported(
        key=key, signature=_signature(call), trainable_inputs=trained if named else None, trainable=trainable,
        unread=tuple((name, n, onnx_type(parameters[name].dtype), tuple(parameters[name].shape))
                     for name, n in unread.items()), frozen=tuple(frozen.items()))


def to_onnx(
    module: torch.nn.Module,
    example_inputs: Any,
    *,
    training: bool = False,
    input_names: Sequence[str] | None = None,
    opset: int | None = None,
    cache_dir: str | os.PathLike | bool | None = None,
    path: str | os.PathLike | None = None,
) -> onnx.ModelProto:
    """Export ``module`` to a weightless ONNX model (cached); optionally also write it to ``path``.

    The arguments are those of :func:`from_torch`. Graph inputs and outputs have static shapes; where all inputs
    share dimension 0, the graph is traced with a symbolic batch first, so no node hard-codes the batch size.
    Tensors of 1 KiB or more (and every weight of a module on the meta device) are external-data references to
    ``<Module>.weights``, a file that is never written. Outputs that are not tensors (a Hugging Face cache object)
    are left out of the graph's outputs; what computes them is counted where other outputs need it.
    """
    torch = _import_torch()
    _check_module(torch, module)
    call = _bind(torch, module, example_inputs, input_names, _device(module))
    return _to_onnx(torch, module, call, training=training, opset=opset, cache_dir=cache_dir, path=path)[0]


def _signature(call: _Call) -> list:
    """The graph inputs' names, shapes and element types, as a cache entry records them."""
    return [[n, list(x.shape), str(x.dtype)] for n, x in zip(call.names, call.tensors)]


def _to_onnx(torch, module, call: _Call, *, training: bool, opset: int | None, cache_dir,
             path=None) -> tuple[onnx.ModelProto, str | None]:
    """The export of ``module`` called as ``call`` (from the cache where it holds it), and its cache key (None where
    no cache is used or the module has no sound key)."""
    from . import export as ex

    opset = ex.DEFAULT_OPSET if opset is None else opset

    from .ahead import produced

    signature = _signature(call)

    def export() -> onnx.ModelProto:
        what = f"{type(module).__name__}{' (training)' if training else ''}"
        with phase(f"exporting {what} with torch"), _progress(f"exporting {what} with torch"):
            return _export(module, call.tensors, call.names, training, opset, call)

    def produce() -> onnx.ModelProto:  # made ahead in a child where frontends/ahead.py says so; the key: this export
        return produced((id(module), repr(signature), bool(training), opset), export)

    keys: list[str | None] = []

    def key() -> str | None:  # called only where a cache folder is in use
        keys.append(fingerprint(torch, module, call, training, opset))
        return keys[-1]

    model = common.export_through_cache(cache_dir, FRONTEND, key, produce, path, log, signature=signature)
    return model, (keys[0] if keys else None)


def load_factory(spec: str) -> torch.nn.Module:
    """Import ``package.module:factory``, call the factory with no arguments and return the module it makes.

    The current directory is searched first (as ``python -m`` does). ``factory`` may be dotted
    (``models:Net.small``). Weights are never loaded by flopcount; whatever the factory does, it does.
    """
    return common.load_factory(
        spec, option="--torch", frontend=FRONTEND, kind="a torch.nn.Module", import_framework=_import_torch,
        accepts=lambda made: isinstance(made, _import_torch().nn.Module),
    )


# ---------------------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------------------


def _trainable_initializers(module, model: onnx.ModelProto) -> tuple[list[str] | None, dict[str, int], dict[str, int]]:
    """The initializers of ``model`` that are ``module``'s trainable parameters (``requires_grad``), by name, the
    trainable parameters the traced forward never reads, and the initializers that hold its frozen parameters
    (``requires_grad`` off: Whisper's sinusoidal position embedding; both name → elements).

    A parameter is found under any of its names (``named_parameters(remove_duplicate=False)``): the exporters name
    a tied weight after whichever module they met it in (Gemma's embedding as ``lm_head.weight``). One that has no
    initializer of any name is unread by the trace (DINOv2's ``mask_token`` without a mask), unless the graph holds
    weights that are named after no parameter or buffer (an exporter that re-packs them, such as the TorchScript
    one for LSTM; scalars left aside): then the names are None, so that the graph's structure decides, and nothing
    is called unread nor frozen."""
    from flopcount.pipeline.parameters import PARAMETER, SHAPE_TYPES, classify
    from flopcount.registry import canonical_domain

    names = {t.name for t in model.graph.initializer}
    aliases: dict[int, list[str]] = {}
    tensors: dict[int, Any] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        aliases.setdefault(id(p), []).append(name)
        tensors[id(p)] = p
    wanted, unread, frozen = [], {}, {}
    for key, every in aliases.items():
        p = tensors[key]
        found = next((n for n in every if n in names), None)
        if p.numel() == 0 or (not p.requires_grad and found is None):
            continue
        if not p.requires_grad:
            frozen[found] = int(p.numel())
        elif found is None:
            unread[every[0]] = int(p.numel())
        else:
            wanted.append(found)
    if not unread:
        return wanted, {}, frozen
    known = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    known.update(n for n, _ in module.named_buffers(remove_duplicate=False))
    opsets = {canonical_domain(o.domain): o.version for o in model.opset_import}
    guessed = classify(model, opsets).roles
    # a lifted float scalar (sdpa's √scale) or one-valued tensor (an affine-free LayerNorm's ones) is no weight
    repacked = [t.name for t in model.graph.initializer if t.name not in known and t.data_type not in SHAPE_TYPES
                and guessed.get(t.name) == PARAMETER and any(d != 1 for d in t.dims) and not common.one_value(t)]
    if repacked:
        log.debug("parameters without an initializer of their name (%s) beside weights named after none (%s): the "
                  "graph decides what is trained", ", ".join(list(unread)[:5]), ", ".join(repacked[:5]))
        return None, {}, {}
    return wanted, unread, frozen


def _import_torch():
    try:
        return import_framework("torch")
    except ModuleNotFoundError:
        raise FrontendError(f"{FRONTEND}: PyTorch is not installed; {INSTALL_HINT}") from None


def forward_inputs(module, inputs: Mapping[str, Any], device: Any = "cpu") -> dict[str, Any]:
    """The keyword arguments of one call of ``module.forward`` (``module(**result)``), made on ``device``: ``inputs``
    gives each by parameter name as dims or ``(dims, dtype)`` (or a plain value, passed as it is), exactly as
    :func:`from_torch`'s ``input_shapes``; the tensors come in ``forward``'s parameter order, as the export binds them.

    They are keyword arguments, never positional: ``input_ids`` and ``attention_mask`` of GPT-2 are its first and third
    parameters (``past_key_values`` lies between them)."""
    torch = _import_torch()
    call = _bind(torch, module, inputs, None, torch.device(device))
    args, kwargs = call.arguments(call.tensors)
    return kwargs


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) > 0 and all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    )


def _is_dtype(torch, value: Any) -> bool:
    return isinstance(value, torch.dtype) or (isinstance(value, str) and isinstance(getattr(torch, value, None), torch.dtype))


def _is_spec(torch, value: Any) -> bool:
    """``(shape, dtype)``."""
    return isinstance(value, (tuple, list)) and len(value) == 2 and _is_shape(value[0]) and _is_dtype(torch, value[1])


def _check_module(torch, module: Any) -> None:
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"{FRONTEND}: expected a torch.nn.Module, got {type(module).__name__}")


def _device(module) -> Any:
    """The device of the module's first parameter or buffer (where made inputs go); None for the default."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return None


class _Call:
    """How ``forward`` is called: the graph inputs (names and tensors, in graph order), whether they are passed by
    keyword, and the non-tensor keyword arguments passed as they are."""

    def __init__(self, names: list[str], tensors: tuple, keyword: bool, constants: dict[str, Any], forward: str):
        self.names, self.tensors, self.keyword, self.constants, self.forward = names, tensors, keyword, constants, forward

    def with_tensors(self, tensors: tuple) -> _Call:
        return _Call(self.names, tensors, self.keyword, self.constants, self.forward)

    def arguments(self, tensors: Sequence[Any]) -> tuple[tuple, dict[str, Any]]:
        if self.keyword:
            return (), {**dict(zip(self.names, tensors)), **self.constants}
        return tuple(tensors), dict(self.constants)

    def describe(self) -> str:
        """What was passed, as ``input_ids: int64[2, 11], use_cache=False``."""
        items = [f"{n}: {_tensor_text(x)}" for n, x in zip(self.names, self.tensors)]
        items += [f"{k}={v!r}" for k, v in self.constants.items()]
        return ", ".join(items) or "no inputs"


def _tensor_text(x) -> str:
    return f"{str(x.dtype).removeprefix('torch.')}[{', '.join(map(str, x.shape))}]"


def _forward_parameters(module) -> tuple[list[inspect.Parameter] | None, str]:
    """``forward``'s parameters (None where there is no signature) and its signature as text."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None, "forward(...)"
    bare = signature.replace(
        parameters=[p.replace(annotation=p.empty) for p in signature.parameters.values()],
        return_annotation=signature.empty,
    )
    return list(signature.parameters.values()), f"forward{bare}"


def _bind(torch, module, example_inputs: Any, input_names: Sequence[str] | None, device: Any) -> _Call:
    """The call of ``forward`` that ``example_inputs`` describe (tensors made on ``device``)."""
    parameters, forward = _forward_parameters(module)
    maker = _Maker(torch, device)
    if isinstance(example_inputs, Mapping):
        if input_names is not None:
            raise UsageError(f"{FRONTEND}: input_names is for positional inputs; a dict of inputs is named by its keys")
        by_name = [p.name for p in parameters or () if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        unknown = [k for k in example_inputs if not isinstance(k, str) or k not in by_name]
        if unknown:
            raise UsageError(
                f"{FRONTEND}: {type(module).__name__}.{forward} has no parameter named "
                + ", ".join(repr(k) for k in unknown)
                + f"; inputs can be given by the names: {', '.join(by_name) or 'none'}"
            )
        names, tensors, constants = [], [], {}
        for name in by_name:  # graph inputs in forward()'s order
            if name not in example_inputs:
                continue
            value = example_inputs[name]
            if _is_input(torch, value):
                names.append(name)
                tensors.append(maker(value, name))
            elif _is_constant(value):
                constants[name] = value
            else:
                raise UsageError(
                    f"{FRONTEND}: input {name!r} must be a tensor, a shape such as (1, 3, 224, 224), (shape, dtype) "
                    f"or a plain value (bool, number, string, None), got {type(value).__name__}"
                )
        return _Call(names, tuple(tensors), True, constants, forward)

    if isinstance(example_inputs, torch.Tensor) or _is_shape(example_inputs) or _is_spec(torch, example_inputs):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise UsageError(
            f"{FRONTEND}: example_inputs must be a tensor, a shape such as (1, 3, 224, 224), (shape, dtype), or a "
            f"tuple or dict of them; got {type(example_inputs).__name__}"
        )
    tensors = []
    for i, item in enumerate(example_inputs):
        if not _is_input(torch, item):
            raise UsageError(
                f"{FRONTEND}: example input {i} must be a tensor, a shape of positive ints such as (1, 3, 224, 224) "
                f"or (shape, dtype), got {item!r}"
            )
        tensors.append(maker(item, f"example input {i}"))
    tensors = tuple(tensors)
    return _Call(_input_names(parameters, tensors, input_names), tensors, False, {}, forward)


def _is_input(torch, value: Any) -> bool:
    return isinstance(value, torch.Tensor) or _is_shape(value) or _is_spec(torch, value)


def _is_constant(value: Any) -> bool:
    return common.plain(value)


class _Maker:
    """Makes the tensor a shape or ``(shape, dtype)`` stands for (normal floats from a generator seeded with 0,
    zeros for integers, True for bools), on ``device``."""

    def __init__(self, torch, device):
        self.torch, self.device, self.generator = torch, device, None

    def __call__(self, item: Any, what: str):
        torch = self.torch
        if isinstance(item, torch.Tensor):
            return item
        shape, dtype = (item, torch.float32) if _is_shape(item) else item
        dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        if any(d <= 0 for d in shape):
            raise UsageError(
                f"{FRONTEND}: {what} must be a tensor or a shape of positive ints such as (1, 3, 224, 224), "
                f"got {tuple(shape)!r}"
            )
        shape = tuple(shape)
        if dtype.is_floating_point or dtype.is_complex:
            if self.generator is None:
                self.generator = torch.Generator().manual_seed(0)
            return torch.randn(shape, generator=self.generator, dtype=torch.float32).to(dtype).to(self.device)
        if dtype == torch.bool:
            return torch.ones(shape, dtype=dtype, device=self.device)
        return torch.zeros(shape, dtype=dtype, device=self.device)


def _input_names(parameters, inputs: tuple, names: Sequence[str] | None) -> list[str]:
    if names is not None:
        names = list(names)
        if len(names) != len(inputs) or len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise UsageError(f"{FRONTEND}: input_names must be {len(inputs)} distinct non-empty names, got {names!r}")
        return names
    positional = [p.name for p in parameters or () if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = positional[: len(inputs)]
    return names + [f"input_{i}" for i in range(len(names), len(inputs))]


def _trainable_inputs(call: _Call, names: Sequence[str] | None) -> list[str]:
    """The graph inputs trained: ``names`` (each must be a floating-point input) and tensors that require grad."""
    float_inputs = [n for n, x in zip(call.names, call.tensors) if x.is_floating_point()]
    if isinstance(names, str):
        names = [names]
    wanted = list(names or ())
    bad = [n for n in wanted if n not in float_inputs]
    if bad:
        raise UsageError(
            f"{FRONTEND}: trainable input {', '.join(map(repr, bad))} is not a floating-point input of forward(); "
            f"those are: {', '.join(float_inputs) or 'none'}"
        )
    wanted += [n for n, x in zip(call.names, call.tensors) if x.requires_grad and n in float_inputs]
    return list(dict.fromkeys(wanted))


def _shared_batch(inputs: tuple) -> int | None:
    """Dimension 0 shared by every input, or None (no inputs, a scalar, or inputs that disagree)."""
    batches = {x.shape[0] if x.dim() > 0 else None for x in inputs}
    if len(batches) != 1:
        return None
    (batch,) = batches
    return batch if batch is not None and batch > 0 else None


# ---------------------------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------------------------


def _export(module, inputs: tuple, names: list[str], training: bool, opset: int, call: _Call | None = None) -> onnx.ModelProto:
    """Export ``module`` (put in train or eval mode, then restored) to a weightless ModelProto."""
    from . import export as ex

    torch = _import_torch()
    call = (call or _Call(list(names), inputs, False, {}, "forward(...)")).with_tensors(inputs)
    batch = _shared_batch(inputs)
    meta = any(t.is_meta for t in (*module.parameters(), *module.buffers(), *inputs))
    # export.py's dynamo path traces at batch 2 by expanding dim 0, which works from a batch of 1.
    first = tuple(x[:1] for x in inputs)
    dynamo = lambda: ex.export_dynamo(module, first, names, [], opset)  # noqa: E731
    if meta:  # the TorchScript exporter needs weight data; torch.export works on shapes alone
        if batch is None:
            raise UsageError(
                f"{FRONTEND}: {type(module).__name__} is on the meta device, which only the torch.export exporter "
                f"handles, and it needs inputs that share dimension 0 (the batch); got {call.describe()}"
            )
        attempts: list[tuple[str, Callable[[], onnx.ModelProto]]] = [
            ("dynamo", (lambda: ex.mark_batch_norm_training(dynamo())) if training else dynamo)
        ]
    elif training:
        attempts = [
            ("torchscript", lambda: _torchscript(torch, module, inputs, names, opset, True, batch is not None))
        ]
        if batch is not None:
            attempts.append(("dynamo", lambda: ex.mark_batch_norm_training(dynamo())))
    elif batch is not None:
        attempts = [
            ("dynamo", dynamo),
            ("torchscript", lambda: ex.export_torchscript(module, inputs, names, [], opset)),
        ]
    else:
        attempts = [("torchscript", lambda: _torchscript(torch, module, inputs, names, opset, False, False))]
    model = _traced(torch, module, call, training, batch, attempts)
    if batch is not None:
        ex.pin_batch(model, batch)
    try:
        # The checker cannot take protos over 2 GB in memory, and wants the file that external data (the weights
        # of a meta-device module) names to exist.
        if not meta and model.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:
            onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise FrontendError(
            f"{FRONTEND}: the exported graph of {type(module).__name__} does not check: {first_line(e)}"
        ) from None
    model = ex.make_weightless(model, f"{type(module).__name__}.weights")
    ex.strip_metadata(model)
    return model


def _traced(torch, module, call: _Call, training: bool, batch: int | None, attempts) -> onnx.ModelProto:
    """The graph of the first of ``attempts`` that exports ``module`` put in train or eval mode (its modes and
    buffers restored after); UsageError where ``forward`` refuses the inputs, else FrontendError, when none does."""
    from . import export as ex

    modes = [(m, m.training) for m in module.modules()]
    buffers = [(b, b.detach().clone()) for b in module.buffers() if not b.is_meta]
    errors: list[tuple[str, BaseException]] = []
    dropped: list[str] = []
    model = misfit = None
    try:
        module.train(training)
        with torch.no_grad(), _quiet_exporters():
            with _deduplicate_by_identity_only(torch), ex.no_tqdm_monitor(), _tensor_call(torch, module, call, dropped), \
                    batch_norm_size_check(torch, module, batch, training):
                model = _first_export(attempts, call, errors, type(module).__name__)
                if model is None:  # complex arithmetic (Llama 4's rotary) as real pairs, which ONNX can hold
                    from .complex import complex_as_pairs

                    with complex_as_pairs():
                        model = _first_export(attempts, call, [], type(module).__name__)
            misfit = _misfit(module, call) if model is None else None
    finally:
        with torch.no_grad():
            for b, saved in buffers:  # tracing in training mode updates BatchNorm running statistics
                b.copy_(saved)
        for m, was_training in modes:
            m.training = was_training
    if model is None:
        if misfit is not None:
            raise UsageError(
                f"{FRONTEND}: the inputs do not fit {type(module).__name__}.{call.forward}: passed {call.describe()}; "
                f"forward() raised {misfit}; give the shapes (and :dtype) forward() expects"
            )
        raise FrontendError(failure_message(type(module).__name__, errors))
    if dropped:
        log.info(
            "outputs of %s that are not tensors (%s) are not graph outputs; a Hugging Face cache is left out by "
            "passing use_cache=False", type(module).__name__, ", ".join(dict.fromkeys(dropped)),
        )
    return model


@contextlib.contextmanager
def _tensor_call(torch, module, call: _Call, dropped: list[str]):
    """Meanwhile, ``module.forward`` takes the graph inputs positionally (named after them), passes them to the
    real ``forward`` as ``call`` says (by keyword, with the constant arguments), and returns the tensors of its
    result as a flat tuple: dicts and model outputs by value, and without what is not a tensor (a Hugging Face
    cache object, whose type names are added to ``dropped``), which neither exporter can return."""
    saved = vars(module).get("forward", _MISSING)
    real = module.forward

    def forward(*tensors):
        args, kwargs = call.arguments(tensors)
        return tuple(_output_tensors(torch, real(*args, **kwargs), dropped))

    forward.__signature__ = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in call.names]
    )
    module.forward = forward
    try:
        yield
    finally:
        if saved is _MISSING:
            del module.forward
        else:
            module.forward = saved


_MISSING = object()


def _output_tensors(torch, value: Any, dropped: list[str]):
    if isinstance(value, torch.Tensor):
        yield value
    elif value is None or isinstance(value, (bool, int, float, str)):
        return
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _output_tensors(torch, item, dropped)
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _output_tensors(torch, item, dropped)
    else:
        dropped.append(type(value).__name__)


def _first_export(attempts, call: _Call, errors: list, what: str) -> onnx.ModelProto | None:
    """The graph of the first of ``attempts`` (exporter name, function) that succeeds, or None; each failure is
    added to ``errors``."""
    for name, attempt in attempts:
        try:
            model = attempt()
        except Exception as e:  # noqa: BLE001 - any exporter failure moves on to the next exporter
            log.info("the %s exporter failed: %s", name, exporter_line(e))
            refuse_untrainable_batch_norm(e, call)
            errors.append((name, e))
            continue
        log.info("exported %s with the %s exporter", what, name)
        return model
    return None


def _misfit(module, call: _Call) -> str | None:
    """Why ``forward`` refuses the inputs when run as it is (one line), or None when it accepts them (so the
    exporter, not the inputs, is at fault). Runs after every exporter failed; on meta-device modules it costs no
    arithmetic."""
    args, kwargs = call.arguments(call.tensors)
    try:
        module(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - any failure of the user's forward is the answer
        line = first_line(e)
        if "meta tensor" in line:  # forward reads values (.item()), which the meta device cannot give: no verdict
            return None
        return f"{type(e).__name__}: {line}"
    return None


def _torchscript(torch, module, inputs, names, opset, training: bool, dynamic_batch: bool) -> onnx.ModelProto:
    """The TorchScript exporter with an explicit training mode (export.py's always exports in eval mode).

    Constant folding is off: in eval mode it would fold BatchNormalization into Conv.
    """
    from .export import onnx_export

    buffer = io.BytesIO()
    modes = getattr(torch.onnx, "TrainingMode", None)
    if modes is None:
        raise FrontendError(f"{FRONTEND}: torch {torch.__version__} has no torch.onnx.TrainingMode, which the "
                            "TorchScript exporter needs to export in a chosen mode")
    mode = modes.TRAINING if training else modes.EVAL
    onnx_export(
        torch,
        module,
        inputs,
        buffer,
        input_names=list(names),
        opset_version=opset,
        dynamo=False,
        do_constant_folding=False,
        training=mode,
        dynamic_axes={name: {0: "batch"} for name in names} if dynamic_batch else None,
    )
    return onnx.load_from_string(buffer.getvalue())


@contextlib.contextmanager
def _deduplicate_by_identity_only(torch):
    """Keep the TorchScript exporter from merging parameters whose values happen to be equal.

    In eval mode it replaces an initializer by another one with the same contents (two freshly initialised
    BatchNorm scales, two zero biases), so the parameter count would depend on weight values. Its pass takes an
    ``is_train`` flag that limits the merge to tensors that are the same storage (tied weights); it is forced here.
    """
    name = "_jit_pass_onnx_deduplicate_initializers"
    original = getattr(torch._C, name, None)
    if original is None:
        yield
        return

    def by_identity(graph, params, is_train):
        return original(graph, params, True)

    setattr(torch._C, name, by_identity)
    try:
        yield
    finally:
        setattr(torch._C, name, original)


def _quiet_exporters() -> contextlib.AbstractContextManager[None]:
    """Keep the exporters' warnings, log records and stdout prints (the TorchScript exporter prints its graph to
    stdout from C++ when it fails) out of the user's output; they go to flopcount's DEBUG log instead."""
    return common.quiet(_EXPORTER_LOGGERS, log, fds=(1,), level=logging.CRITICAL + 1)


# ---------------------------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------------------------


def _progress(label: str) -> contextlib.AbstractContextManager[None]:
    """The progress line (:func:`flopcount.frontends.common.progress`) after :data:`_PROGRESS_DELAY_S`."""
    return common.progress(label, delay=_PROGRESS_DELAY_S, log=log)
