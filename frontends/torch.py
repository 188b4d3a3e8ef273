"""PyTorch frontend: count an ``nn.Module`` by exporting it to a weightless ONNX graph.

>>> import flopcount, torch  # doctest: +SKIP
>>> report = flopcount.from_torch(torch.nn.Linear(64, 10), (8, 64))  # doctest: +SKIP
>>> report.total.flops  # 2*8*64*10 for the products + 8*10 for the bias  # doctest: +SKIP
10320

The module is exported with :mod:`flopcount.models.export`'s exporters (the torch.export-based one with
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
uses batch statistics). Inference exports try torch.export first, as :func:`flopcount.models.export.export_weightless`
does.

**Cache.** Exports are cached by a hash of the module's structure (its repr, the class, source digest and plain
attributes of every submodule, parameter and buffer names, shapes and dtypes; never their values), the input names,
shapes and dtypes, the training flag, the opset and the torch, onnx, onnxscript and flopcount versions. The cache
folder is ``cache_dir=``, else ``$FLOPCOUNT_CACHE`` (``0``/``off`` disables it), else
``$XDG_CACHE_HOME/flopcount`` or ``~/.cache/flopcount``; ``cache_dir=False`` disables caching. Files are small
(weightless graphs).

torch is imported inside the functions that need it; importing this module needs only onnx.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import onnx

from flopcount.errors import FrontendError, UsageError

from . import common
from .common import CACHE_ENV, default_cache_dir

if TYPE_CHECKING:
    import torch

    from flopcount.report import Report

__all__ = ["CACHE_ENV", "default_cache_dir", "from_torch", "load_factory", "to_onnx"]

log = logging.getLogger(__name__)

FRONTEND = "torch"
INSTALL_HINT = "pip install 'flopcount[torch]'"
_CACHE_FORMAT = 2  # bump when the export pipeline changes what it writes
#: Seconds an export runs before the progress indicator appears.
_PROGRESS_DELAY_S = 1.0
#: Loggers of the exporters, quieted while they run unless flopcount's own logging is at DEBUG.
_EXPORTER_LOGGERS = (
    "torch.onnx", "torch.export", "torch._export", "torch._dynamo", "torch.fx", "onnxscript", "onnx_ir",
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
    opset: int | None = None,
    cache_dir: str | os.PathLike | bool | None = None,
    **count_kwargs: Any,
) -> Report:
    """Export a PyTorch module to ONNX (weightless) and count it with :func:`flopcount.count`.

    Parameters
    ----------
    module : torch.nn.Module
        The model. Its train/eval flags and buffer values are the same after the call as before.
    example_inputs : Tensor, shape, or tuple of Tensors and shapes
        The arguments of ``module.forward``. A shape (a tuple of ints or a ``torch.Size``) becomes a float32
        tensor of standard-normal values drawn from a generator seeded with 0 (values matter only to
        data-dependent Python control flow), on the device of the module's parameters. ``(8, 3, 224, 224)`` is
        one input; ``((8, 16), (8, 16))`` two.
    training : bool, optional
        Export the graph as it runs in training (BatchNormalization on batch statistics, Dropout active).
        ``None`` (the default) follows ``mode``: True when ``mode="train"``. With ``training=True`` the count
        gets ``mode="train"`` (forward and backward) unless ``mode`` is given.
    input_names : sequence of str, optional
        Names of the ONNX graph inputs, one per example input; by default the names of ``forward``'s
        parameters.
    opset : int, optional
        ONNX opset of the default domain (default: :data:`flopcount.models.export.DEFAULT_OPSET`).
    cache_dir : path, bool or None
        Export cache folder; ``None`` or ``True``: ``$FLOPCOUNT_CACHE`` or ``~/.cache/flopcount``;
        ``False``: no cache.
    **count_kwargs
        Passed to :func:`flopcount.count` (``convention``, ``strict``, ``batch``, ``mode``, ...). ``batch``
        re-sizes dim 0 of every example input before the export, so the graph is exported at that batch.

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
        ``example_inputs`` or ``input_names`` are malformed.
    """
    from flopcount.counting import count

    common.check_count_kwargs("from_torch", count_kwargs)
    training = common.training_flag(training, count_kwargs, log)

    torch = _import_torch()
    _check_module(torch, module)
    inputs = _example_tensors(torch, example_inputs, _device(module))
    batch = count_kwargs.get("batch")
    if batch is not None and _shared_batch(inputs) not in (None, batch):
        inputs = tuple(x[:1].expand(batch, *x.shape[1:]) for x in inputs)
    model = to_onnx(module, inputs, training=training, input_names=input_names, opset=opset, cache_dir=cache_dir)
    if count_kwargs.get("trainable") is None:
        count_kwargs["trainable"] = _trainable_initializers(module, model)
    return count(model, **count_kwargs)


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
    Tensors of 1 KiB or more are external-data references to ``<Module>.weights``, a file that is never written.
    """
    from flopcount.models import export as ex

    torch = _import_torch()
    _check_module(torch, module)
    inputs = _example_tensors(torch, example_inputs, _device(module))
    names = _input_names(module, inputs, input_names)
    opset = ex.DEFAULT_OPSET if opset is None else opset

    def produce() -> onnx.ModelProto:
        what = f"{type(module).__name__}{' (training)' if training else ''}"
        with _progress(f"exporting {what} with torch"):
            return _export(module, inputs, names, training, opset)

    return common.export_through_cache(
        cache_dir, FRONTEND, lambda: _fingerprint(torch, module, inputs, names, training, opset), produce, path, log
    )


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


def _trainable_initializers(module, model: onnx.ModelProto) -> list[str] | None:
    """The initializers of ``model`` that are ``module``'s trainable parameters (``named_parameters()`` with
    ``requires_grad``), by name: the exporters name initializers after the parameters (the torch.export path gives a
    weight folded through a transpose its parameter's name back, see :mod:`flopcount.models.export`). None, so that
    the graph's structure decides, when some trainable parameter has no initializer of its name (an exporter that
    re-packs weights, such as the TorchScript one for LSTM)."""
    names = {t.name for t in model.graph.initializer}
    wanted = [n for n, p in module.named_parameters() if p.requires_grad and p.numel() > 0]
    missing = [n for n in wanted if n not in names]
    if missing:
        log.debug("parameters without an initializer of their name (%s): the graph decides what is trained",
                  ", ".join(missing[:5]))
        return None
    return wanted


def _import_torch():
    try:
        import torch
    except ImportError:
        raise FrontendError(f"{FRONTEND}: PyTorch is not installed; {INSTALL_HINT}") from None
    return torch


def _is_shape(value: Any) -> bool:
    return isinstance(value, (tuple, list)) and len(value) > 0 and all(
        isinstance(d, int) and not isinstance(d, bool) for d in value
    )


def _check_module(torch, module: Any) -> None:
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"{FRONTEND}: expected a torch.nn.Module, got {type(module).__name__}")


def _device(module) -> Any:
    """The device of the module's first parameter or buffer (where made inputs go); None for the default."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return None


def _example_tensors(torch, example_inputs: Any, device: Any = None) -> tuple:
    """A tuple of tensors from a tensor, a shape, or a tuple of tensors and shapes (made on ``device``)."""
    if isinstance(example_inputs, torch.Tensor) or _is_shape(example_inputs):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise UsageError(
            f"{FRONTEND}: example_inputs must be a tensor, a shape such as (1, 3, 224, 224), or a tuple of them; "
            f"got {type(example_inputs).__name__}"
        )
    generator = None
    tensors = []
    for i, item in enumerate(example_inputs):
        if isinstance(item, torch.Tensor):
            tensors.append(item)
            continue
        if not _is_shape(item) or any(d <= 0 for d in item):
            raise UsageError(
                f"{FRONTEND}: example input {i} must be a tensor or a shape of positive ints such as (1, 3, 224, 224), "
                f"got {item!r}"
            )
        if generator is None:
            generator = torch.Generator().manual_seed(0)
        tensors.append(torch.randn(tuple(item), generator=generator, dtype=torch.float32).to(device))
    return tuple(tensors)


def _input_names(module, inputs: tuple, names: Sequence[str] | None) -> list[str]:
    if names is not None:
        names = list(names)
        if len(names) != len(inputs) or len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
            raise UsageError(f"{FRONTEND}: input_names must be {len(inputs)} distinct non-empty names, got {names!r}")
        return names
    try:
        parameters = inspect.signature(module.forward).parameters.values()
        positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        positional = []
    names = positional[: len(inputs)]
    return names + [f"input_{i}" for i in range(len(names), len(inputs))]


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


def _export(module, inputs: tuple, names: list[str], training: bool, opset: int) -> onnx.ModelProto:
    """Export ``module`` (put in train or eval mode, then restored) to a weightless ModelProto."""
    from flopcount.models import export as ex

    torch = _import_torch()
    batch = _shared_batch(inputs)
    # export.py's dynamo path traces at batch 2 by expanding dim 0, which works from a batch of 1.
    first = tuple(x[:1] for x in inputs)
    if training:
        attempts: list[tuple[str, Callable[[], onnx.ModelProto]]] = [
            ("torchscript", lambda: _torchscript(torch, module, inputs, names, opset, True, batch is not None))
        ]
        if batch is not None:
            attempts.append(("dynamo", lambda: _mark_batch_norm_training(ex._export_dynamo(module, first, names, [], opset))))
    elif batch is not None:
        attempts = [
            ("dynamo", lambda: ex._export_dynamo(module, first, names, [], opset)),
            ("torchscript", lambda: ex._export_torchscript(module, inputs, names, [], opset)),
        ]
    else:
        attempts = [("torchscript", lambda: _torchscript(torch, module, inputs, names, opset, False, False))]

    modes = [(m, m.training) for m in module.modules()]
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    errors: list[tuple[str, BaseException]] = []
    model = None
    try:
        module.train(training)
        with torch.no_grad(), _quiet_exporters():
            for name, attempt in attempts:
                try:
                    model = attempt()
                except Exception as e:  # noqa: BLE001 - any exporter failure moves on to the next exporter
                    log.info("the %s exporter failed: %s", name, _exporter_line(e))
                    errors.append((name, e))
                    continue
                log.info("exported %s with the %s exporter", type(module).__name__, name)
                break
    finally:
        with torch.no_grad():
            for b, saved in buffers:  # tracing in training mode updates BatchNorm running statistics
                b.copy_(saved)
        for m, was_training in modes:
            m.training = was_training
    if model is None:
        raise FrontendError(_failure_message(type(module).__name__, errors))
    if batch is not None:
        _pin_batch(model, batch)
    try:
        if model.ByteSize() < onnx.checker.MAXIMUM_PROTOBUF:  # the checker cannot take larger protos in memory
            onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise FrontendError(
            f"{FRONTEND}: the exported graph of {type(module).__name__} does not check: {common.first_text_line(e)}"
        ) from None
    model = ex.make_weightless(model, f"{type(module).__name__}.weights")
    ex.strip_metadata(model)
    return model


def _torchscript(torch, module, inputs, names, opset, training: bool, dynamic_batch: bool) -> onnx.ModelProto:
    """The TorchScript exporter with an explicit training mode (export.py's always exports in eval mode).

    Constant folding is off: in eval mode it would fold BatchNormalization into Conv.
    """
    buffer = io.BytesIO()
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(
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


def _mark_batch_norm_training(model: onnx.ModelProto) -> onnx.ModelProto:
    """Set ``training_mode=1`` on every BatchNormalization (the torch.export path emits them in inference form)."""
    from flopcount.models.export import _graphs

    for graph in _graphs(model.graph):
        for node in graph.node:
            if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
                kept = [a for a in node.attribute if a.name != "training_mode"]
                del node.attribute[:]
                node.attribute.extend([*kept, onnx.helper.make_attribute("training_mode", 1)])
    return model


def _pin_batch(model: onnx.ModelProto, batch: int) -> None:
    """Replace, in graph inputs and outputs, the symbolic dims that inputs carry in dim 0 by ``batch``."""
    values = (*model.graph.input, *model.graph.output)
    symbols = set()
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].dim_param:
            symbols.add(dims[0].dim_param)
    for value in values:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in symbols:
                dim.dim_value = batch


def _quiet_exporters() -> contextlib.AbstractContextManager[None]:
    """Keep the exporters' warnings, log records and stdout prints (the TorchScript exporter prints its graph to
    stdout from C++ when it fails) out of the user's output; they go to flopcount's DEBUG log instead."""
    return common.quiet(_EXPORTER_LOGGERS, log, fds=(1,))


# ---------------------------------------------------------------------------------------------------------------
# Error messages
# ---------------------------------------------------------------------------------------------------------------

#: Where the exporters name the operator they cannot convert (normalised to ``namespace::name``).
_OP_PATTERNS = (
    re.compile(r"OpOverload\(op='(?P<op>[\w.]+)'"),  # torch.export path: No ONNX function found for <OpOverload(...)>
    re.compile(r"target=torch\.ops\.(?P<op>\w+\.\w+)"),  # torch.export path: Error when translating node ...
    re.compile(r"the operator '(?P<op>\w+::\w+)'"),  # TorchScript: Exporting the operator 'aten::x' to ONNX ...
    re.compile(r"unrecognized namespace (?P<op>\w+::\w+)"),  # TorchScript: a custom op without a symbolic
)
_SUMMARY_LINE = re.compile(r"^<class '(?:[\w.]*\.)?(?P<type>\w+)'>: (?P<message>.+)$", re.MULTILINE)


def _failing_operator(e: BaseException) -> str | None:
    for link in common.chain(e):
        text = common.strip_ansi(str(link))
        for pattern in _OP_PATTERNS:
            match = pattern.search(text)
            if match:
                op = match["op"]
                return op if "::" in op else op.replace(".", "::", 1)
    return None


def _exporter_line(e: BaseException) -> str:
    """The exporter's own first line; for the torch.export path, the first line of its exception summary."""
    text = common.strip_ansi(str(e))
    match = _SUMMARY_LINE.search(text)
    if match:
        return common.shorten(f"{match['type']}: {match['message'].strip()}")
    return common.shorten(f"{type(e).__name__}: {common.first_text_line(e)}")


def _failure_message(module_name: str, errors: Sequence[tuple[str, BaseException]]) -> str:
    for exporter, error in errors:
        op = _failing_operator(error)
        if op is not None:
            return (
                f"{FRONTEND}: cannot export {module_name} to ONNX: operator {op} has no ONNX conversion "
                f"({exporter} exporter: {_exporter_line(error)}); replace that operation, register an ONNX "
                "translation for it, or export the model yourself and count the .onnx file"
            )
    details = "; ".join(f"{exporter} exporter: {_exporter_line(error)}" for exporter, error in errors)
    return (
        f"{FRONTEND}: cannot export {module_name} to ONNX ({details}); make the model exportable with "
        "torch.onnx.export, or export it yourself and count the .onnx file"
    )


# ---------------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------------


def _fingerprint(torch, module, inputs: tuple, names: Sequence[str], training: bool, opset: int) -> str:
    """Hash of everything the exported graph depends on except weight values."""
    classes = {}
    attributes = []
    for name, sub in module.named_modules():
        cls = type(sub)
        classes[f"{cls.__module__}.{cls.__qualname__}"] = common.class_digest(cls, ("torch",))
        plain = {k: v for k, v in vars(sub).items() if not k.startswith("_") and k != "training" and common.plain(v)}
        attributes.append([name, plain])
    document = {
        "format": _CACHE_FORMAT,
        "versions": {
            "torch": torch.__version__,
            "onnx": onnx.__version__,
            "onnxscript": common.dist_version("onnxscript"),
            "flopcount": common.dist_version("flopcount"),
        },
        "module": repr(module),
        "classes": classes,
        "attributes": attributes,
        "parameters": [[n, list(p.shape), str(p.dtype)] for n, p in module.named_parameters()],
        "buffers": [[n, list(b.shape), str(b.dtype)] for n, b in module.named_buffers()],
        "inputs": [[n, list(x.shape), str(x.dtype)] for n, x in zip(names, inputs)],
        "training": bool(training),
        "opset": opset,
    }
    return common.cache_key(document)


# ---------------------------------------------------------------------------------------------------------------
# Progress
# ---------------------------------------------------------------------------------------------------------------


def _progress(label: str) -> contextlib.AbstractContextManager[None]:
    """The progress line (:func:`flopcount.frontends.common.progress`) after :data:`_PROGRESS_DELAY_S`."""
    return common.progress(label, delay=_PROGRESS_DELAY_S, log=log)
