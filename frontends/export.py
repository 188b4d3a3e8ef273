"""Export PyTorch modules to *weightless* ONNX files.

A weightless file keeps the whole graph (nodes, attributes, shapes, data types) but none of the large tensors:
every initializer of ``size_threshold`` bytes or more becomes an external-data reference to a file that is never
written. FLOP counting needs only shapes, so such a file is complete for flopcount's purposes while staying a few
hundred kilobytes, small enough to keep in the repository. Load one with
``onnx.load(path, load_external_data=False)``.

The frontends export through it (:mod:`flopcount.frontends.torch`, :mod:`flopcount.frontends.keras`); the command
line that exports a reference model, ``python -m flopcount.models.export resnet50 -o examples/resnet50-v1.5.onnx``,
is :mod:`flopcount.models.export`, which hands the model it builds to :func:`export_weightless`.

This module imports from flopcount's core only ``pipeline.graph`` and ``pipeline.loading``; onnx, and torch lazily,
inside the functions that export.
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx
from onnx import numpy_helper

from flopcount.pipeline.graph import walk_graphs
from flopcount.pipeline.loading import is_index_tensor

if TYPE_CHECKING:
    import torch

__all__ = [
    "DEFAULT_OPSET",
    "EXPORTERS",
    "SCOPES_KEY",
    "SIZE_THRESHOLD",
    "ExportError",
    "check_batch_agnostic",
    "export_weightless",
    "make_weightless",
    "mark_batch_norm_training",
    "no_tqdm_monitor",
    "onnx_export",
    "pin_batch",
    "strip_metadata",
]

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 18
#: Tensors of this many bytes or more lose their data; smaller ones (shape constants, axes) stay inline.
SIZE_THRESHOLD = 1024
#: Batch size used while tracing, so that nothing in the graph specialises on the real batch size (torch.export
#: specialises sizes 0 and 1, which would turn ``torch.flatten(x, 1)`` into ``Reshape(x, [1, C])``).
_TRACE_BATCH = 2
_BATCH_DIM = "batch"


class ExportError(RuntimeError):
    """The module could not be exported to a weightless ONNX graph."""


# ---------------------------------------------------------------------------------------------------------------
# Pure ONNX post-processing (no torch needed)
# ---------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def no_tqdm_monitor():
    """Keep torch.fx's (disabled) tqdm progress bars from starting tqdm's monitor thread, which would outlive the
    export in the user's process (and, while alive, keeps flopcount's shape inference from forking)."""
    try:
        from tqdm.std import tqdm
    except ImportError:
        yield
        return
    saved = tqdm.monitor_interval
    tqdm.monitor_interval = 0
    try:
        yield
    finally:
        tqdm.monitor_interval = saved


def _tensor_nbytes(tensor: onnx.TensorProto) -> int:
    """Bytes the tensor's data occupies in ONNX's raw (external-data) layout; sub-byte types are packed."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        entries = {entry.key: entry.value for entry in tensor.external_data}
        return int(entries.get("length", 0))
    if tensor.HasField("raw_data"):
        return len(tensor.raw_data)
    # Typed fields (float_data, int32_data, ...): convert once to the raw layout, which packs 4-bit types.
    return len(numpy_helper.from_array(numpy_helper.to_array(tensor)).raw_data)


def _constant_tensor(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor a ``Constant`` node produces, or None where it holds no dense tensor (``sparse_value``)."""
    for attribute in node.attribute:
        if attribute.name == "value":
            return attribute.t
        if attribute.name in ("value_float", "value_floats", "value_int", "value_ints"):
            value = onnx.helper.get_attribute_value(attribute)
            data_type = onnx.TensorProto.FLOAT if "float" in attribute.name else onnx.TensorProto.INT64
            dims = [] if attribute.name in ("value_float", "value_int") else [len(value)]
            values = [value] if not dims else list(value)
            return onnx.helper.make_tensor("", data_type, dims, values)
    return None


def _lift_large_constants(graph: onnx.GraphProto, size_threshold: int) -> int:
    """Turn ``Constant`` nodes holding ``size_threshold`` bytes or more into initializers; return how many."""
    kept, lifted = [], 0
    for node in graph.node:
        tensor = _constant_tensor(node) if node.op_type == "Constant" and node.domain in ("", "ai.onnx") else None
        if tensor is None or tensor.data_type == onnx.TensorProto.STRING or _tensor_nbytes(tensor) < size_threshold:
            kept.append(node)
            continue
        initializer = copy.deepcopy(tensor)
        initializer.name = node.output[0]
        graph.initializer.append(initializer)
        lifted += 1
    del graph.node[:]
    graph.node.extend(kept)
    return lifted


def make_weightless(
    model: onnx.ModelProto, location: str, *, size_threshold: int = SIZE_THRESHOLD
) -> onnx.ModelProto:
    """Return a copy of ``model`` whose large tensors are references to an external file that is not written.

    ``Constant`` nodes holding ``size_threshold`` bytes or more are first turned into initializers. Then every
    initializer (in the main graph and in subgraphs) of ``size_threshold`` bytes or more loses its data and gets
    ``data_location = EXTERNAL`` with ``location``, ``offset`` and ``length`` entries, laid out one after another
    as if the file existed. ``dims`` and ``data_type`` are kept, so shape inference still sees every tensor.
    String tensors, which external data cannot hold, stay inline, and so do int64 tensors of up to 2**20 elements
    (:func:`flopcount.pipeline.loading.is_index_tensor`: positions and indices, from which attention masks are computed).

    Parameters
    ----------
    model : onnx.ModelProto
        The model, with its weights in memory. It is not modified.
    location : str
        File name recorded in the references, relative to the model file (for example ``"resnet50.weights"``).
    size_threshold : int
        Tensors of at least this many bytes are made external.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import helper, numpy_helper, TensorProto
    >>> big = numpy_helper.from_array(np.zeros((16, 16), np.float32), "w")   # 1024 bytes
    >>> graph = helper.make_graph(
    ...     [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
    ...     [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
    ...     [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])], [big])
    >>> light = make_weightless(helper.make_model(graph), "m.weights")
    >>> w = light.graph.initializer[0]
    >>> w.data_location == TensorProto.EXTERNAL, list(w.dims), len(w.raw_data)
    (True, [16, 16], 0)
    >>> {entry.key: entry.value for entry in w.external_data}
    {'location': 'm.weights', 'offset': '0', 'length': '1024'}
    """
    model = copy.deepcopy(model)
    offset = 0
    for graph in walk_graphs(model.graph):
        _lift_large_constants(graph, size_threshold)
        for tensor in graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.data_type == onnx.TensorProto.STRING:
                continue
            nbytes = _tensor_nbytes(tensor)
            if nbytes < size_threshold or is_index_tensor(tensor):
                continue  # small, or positions and indices (int64), whose values a count may read
            for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for key, value in (("location", location), ("offset", offset), ("length", nbytes)):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
            offset += nbytes
    return model


#: The one node metadata entry kept: the module path that ran the node (``['', 'layer1', 'layer1.0', ...]``), which
#: per-module counts read; it names modules only, nothing of the exporting machine.
SCOPES_KEY = "pkg.torch.onnx.name_scopes"


def strip_metadata(model: onnx.ModelProto) -> None:
    """Remove, in place, every ``doc_string`` and ``metadata_props`` (torch's exporter writes stack traces there,
    with absolute paths of the exporting machine) but a node's module scopes (:data:`SCOPES_KEY`), and the
    inferred ``value_info``, which readers recompute."""

    def strip(proto: Any) -> None:
        for field in ("doc_string", "metadata_props"):
            if field in proto.DESCRIPTOR.fields_by_name:
                if field == "metadata_props" and isinstance(proto, onnx.NodeProto):
                    kept = [(p.key, p.value) for p in proto.metadata_props if p.key == SCOPES_KEY]
                    proto.ClearField(field)
                    for key, value in kept:
                        proto.metadata_props.add(key=key, value=value)
                else:
                    proto.ClearField(field)

    strip(model)
    for function in model.functions:
        strip(function)
        for node in function.node:
            strip(node)
    for graph in walk_graphs(model.graph):
        strip(graph)
        del graph.value_info[:]
        for proto in (*graph.input, *graph.output, *graph.initializer, *graph.node):
            strip(proto)
        for node in graph.node:
            for attribute in node.attribute:
                strip(attribute)


def _set_batch(model: onnx.ModelProto, batch: int | str) -> None:
    """Set, in place, dimension 0 of every graph input and output to ``batch`` (a size or a symbolic name)."""
    for value in (*model.graph.input, *model.graph.output):
        shape = value.type.tensor_type.shape
        if not shape.dim:
            continue
        dim = shape.dim[0]
        if isinstance(batch, int):
            dim.dim_value = batch
        else:
            dim.dim_param = batch


def check_batch_agnostic(model: onnx.ModelProto, batch: int = 8) -> onnx.ModelProto:
    """Shape-infer a copy of ``model`` whose inputs and outputs have batch size ``batch``; return the result.

    Raises ``onnx.shape_inference.InferenceError`` where the graph hard-codes its batch size (for example a
    ``Reshape`` to ``[1, C]``). Strict mode and data propagation are on, so shape constants are followed.
    """
    resized = copy.deepcopy(model)
    _set_batch(resized, batch)
    return onnx.shape_inference.infer_shapes(resized, check_type=True, strict_mode=True, data_prop=True)


def mark_batch_norm_training(model: onnx.ModelProto) -> onnx.ModelProto:
    """Set ``training_mode=1`` on every BatchNormalization (the torch.export path emits them in inference form),
    with the running mean and variance outputs that the spec requires in training mode (read by nothing)."""
    for graph in walk_graphs(model.graph):
        for node in graph.node:
            if node.op_type == "BatchNormalization" and node.domain in ("", "ai.onnx"):
                kept = [a for a in node.attribute if a.name != "training_mode"]
                del node.attribute[:]
                node.attribute.extend([*kept, onnx.helper.make_attribute("training_mode", 1)])
                if len(node.output) == 1:
                    node.output.extend([f"{node.output[0]}/running_mean", f"{node.output[0]}/running_var"])
    return model


def pin_batch(model: onnx.ModelProto, batch: int) -> None:
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


# ---------------------------------------------------------------------------------------------------------------
# torch -> ONNX
# ---------------------------------------------------------------------------------------------------------------


def onnx_export(torch: Any, module: Any, args: Any, *positional: Any, **options: Any) -> Any:
    """``torch.onnx.export(module, args, *positional, **options)``, where the installed torch takes every option by
    that name. A release that renamed or dropped one (the TorchScript exporter's ``dynamo=False``,
    ``dynamic_axes``, ``training`` ...) gets a :class:`flopcount.errors.FrontendError` naming torch's version and
    the options it lacks, instead of a ``TypeError`` from inside the exporter."""
    import inspect

    from flopcount.errors import FrontendError

    export = torch.onnx.export
    try:
        accepted = inspect.signature(export).parameters
    except (TypeError, ValueError):  # no signature to read: let the exporter itself judge
        return export(module, args, *positional, **options)
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        missing = [name for name in options if name not in accepted]
        if missing:
            raise FrontendError(
                f"torch {getattr(torch, '__version__', '?')}: torch.onnx.export takes no {', '.join(missing)} "
                "argument; flopcount's exporters need them (CI runs torch 2.13 and the newest CPU build); install "
                "a torch whose exporter has them, or export the model yourself and count the .onnx file"
            )
    return export(module, args, *positional, **options)


def export_dynamo(
    module: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    output_names: Sequence[str],
    opset: int,
) -> onnx.ModelProto:
    """torch.export-based exporter, with onnxscript's optimiser minus the rule that folds BatchNorm into Conv."""
    import onnxscript.optimizer
    import onnxscript.rewriter
    import torch
    from onnx_ir import serde
    from onnx_ir.passes.common import LiftConstantsToInitializersPass
    from onnxscript.rewriter.rules.common import (
        materialize_reshape_shape_rule,
        remove_optional_bias_from_conv_rule,
    )

    # Trace at batch _TRACE_BATCH with a symbolic batch dimension, so that no op specialises on the batch size.
    # x[:1] first: expand() only grows a dimension of size 1, and the examples may have any batch size.
    traced = tuple(x[:1].expand(_TRACE_BATCH, *x.shape[1:]).contiguous() for x in example_inputs)
    batch = torch.export.Dim(_BATCH_DIM)
    program = onnx_export(
        torch,
        module,
        traced,
        input_names=list(input_names),
        output_names=list(output_names),
        opset_version=opset,
        dynamo=True,
        dynamic_shapes=tuple({0: batch} for _ in traced),
        # The default optimiser folds BatchNormalization into Conv weights; we want normalization visible, so we
        # run its constant folding and a chosen subset of its rewrite rules ourselves.
        optimize=False,
        verbose=False,
    )
    model = program.model
    origins = _layout_origins(model.graph)
    _attention_dropout_training(model.graph)
    with _weights_opaque(model):
        onnxscript.optimizer.fold_constants(model)
        model = onnxscript.rewriter.rewrite(
            model,
            pattern_rewrite_rules=[
                # aten.conv2d(bias=None) is exported as Conv with a zero bias built by Expand; drop it again.
                # Real biases are opaque here (see _weights_opaque), so a bias that is zero is never removed.
                remove_optional_bias_from_conv_rule,
                # torch.flatten(x, 1) becomes Reshape(x, Concat(Shape(x)[0], [C])); make that Reshape(x, [-1, C]).
                materialize_reshape_shape_rule,
            ],
        )
    onnxscript.optimizer.remove_unused_nodes(model)
    _restore_names(model.graph, origins)
    # Shape constants (the Reshape target, ReduceMean axes) as initializers rather than Constant nodes.
    LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
    _reference_meta_tensors(model, f"{type(module).__name__}.weights")
    return serde.serialize_model(model)


def _attention_dropout_training(graph: Any) -> None:
    """Give each Dropout without a ``training_mode`` input a constant-true one: onnxscript writes
    ``scaled_dot_product_attention``'s ``dropout_p`` as such a Dropout (the graph's identity, which its optimiser
    deletes), where torch draws that dropout whenever ``dropout_p`` is not 0 (sdpa takes no training flag); every
    other Dropout the exporter writes has its flag."""
    import onnx_ir as ir

    for node in list(graph):
        if node.op_type == "Dropout" and node.domain in ("", "ai.onnx") and len(node.inputs) == 2 \
                and node.inputs[1] is not None:
            flag = ir.node("Constant", [], attributes={"value": ir.tensor(True)})
            graph.insert_before(node, flag)
            node.resize_inputs(3)
            node.replace_input_with(2, flag.outputs[0])


def _is_meta(tensor: Any) -> bool:
    """An onnx_ir tensor wrapping a torch tensor on the meta device (shape and type, no data)."""
    return bool(getattr(getattr(tensor, "raw", None), "is_meta", False))


def _reference_meta_tensors(model: Any, location: str) -> None:
    """Make every initializer that is a meta-device tensor an external-data reference to ``location`` (a file never
    written), as :func:`make_weightless` does for large ones: a module built on the meta device has no data to
    serialise."""
    import onnx_ir as ir

    for value in model.graph.initializers.values():
        tensor = value.const_value
        if tensor is not None and _is_meta(tensor):
            value.const_value = ir.ExternalTensor(
                location, 0, tensor.nbytes, tensor.dtype, shape=tensor.shape, name=value.name
            )


class _weights_opaque:
    """Hide the values of the floating-point initializers torch.export made (parameters, buffers, lifted tensor
    constants) from onnxscript's optimiser while the context runs, so that nothing it does depends on weight values
    (and nothing tries to compute with the data-less tensors of a module on the meta device).

    Its rules read initializer values: ``remove_optional_bias_from_conv_rule`` deletes any Conv bias that is all
    zeros, meant for the zero bias the exporter builds for ``bias=None`` but also hitting real biases that are
    initialised to zero (Hugging Face does so), and constant folding would compute weight-derived values
    (``w / w.norm()``) once instead of at every step. Integer initializers (indices, shapes) stay visible.
    """

    def __init__(self, model: Any) -> None:
        self.hidden = [
            (value, value.const_value)
            for value in model.graph.initializers.values()
            if value.const_value is not None
            and ((value.dtype is not None and value.dtype.is_floating_point()) or _is_meta(value.const_value))
        ]

    def __enter__(self) -> None:
        for value, _ in self.hidden:
            value.const_value = None

    def __exit__(self, *exc: object) -> None:
        for value, tensor in self.hidden:
            value.const_value = tensor


# Ops that only re-lay out or convert a tensor: folding one applied to a weight gives the same weight.
_LAYOUT_OPS = frozenset({"Transpose", "Reshape", "Cast", "Identity", "Unsqueeze", "Squeeze", "Flatten"})


def _layout_origins(graph) -> dict[str, str]:
    """Output name → initializer name, for outputs that are an initializer (a parameter or buffer,
    named by its fully qualified name) seen through layout-only ops: what constant folding will turn
    into a new initializer with the output's name."""
    origins: dict[str, str] = {}
    for node in graph:
        first = node.inputs[0] if node.inputs else None
        if node.op_type not in _LAYOUT_OPS or node.domain not in ("", "ai.onnx") or first is None:
            continue
        source = origins.get(first.name, first.name if first.name in graph.initializers else None)
        if source is not None and len(node.outputs) == 1:
            origins[node.outputs[0].name] = source
    return origins


def _restore_names(graph, origins: Mapping[str, str]) -> None:
    """Give a folded initializer the name of the parameter or buffer it was folded from (a transposed
    Linear weight stays ``fc.weight``), when that name is free: counting maps a module's
    ``named_parameters()`` to the graph by name."""
    for name, value in list(graph.initializers.items()):
        source = origins.get(name)
        if source is not None and source not in graph.initializers:
            value.name = source


def export_torchscript(
    module: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    output_names: Sequence[str],
    opset: int,
) -> onnx.ModelProto:
    """Legacy TorchScript exporter (deprecated since torch 2.9).

    Constant folding is off because, in eval mode, it also folds BatchNormalization into Conv. Note that this
    exporter replaces initializers with equal contents (freshly initialised BatchNorm scales, for instance) by
    ``Identity`` nodes reading one of them.
    """
    import io
    import warnings

    import torch

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        onnx_export(
            torch,
            module,
            example_inputs,
            buffer,
            input_names=list(input_names),
            output_names=list(output_names),
            opset_version=opset,
            dynamo=False,
            do_constant_folding=False,
            dynamic_axes={name: {0: _BATCH_DIM} for name in (*input_names, *output_names)},
        )
    return onnx.load_from_string(buffer.getvalue())


EXPORTERS: dict[str, Callable[..., onnx.ModelProto]] = {
    "dynamo": export_dynamo,
    "torchscript": export_torchscript,
}


def export_weightless(
    module: torch.nn.Module,
    example_inputs: torch.Tensor | tuple[torch.Tensor, ...],
    path: str | Path,
    *,
    input_names: Sequence[str] = ("input",),
    output_names: Sequence[str] = ("logits",),
    opset: int = DEFAULT_OPSET,
    exporter: str = "auto",
    size_threshold: int = SIZE_THRESHOLD,
) -> onnx.ModelProto:
    """Export ``module`` in eval mode to a weightless ONNX file at ``path``; return the written model.

    The graph is traced with a symbolic batch dimension (dimension 0 of every input) and then pinned to the batch
    size of ``example_inputs``, so that inputs and outputs have static shapes while no node hard-codes the batch
    size. BatchNormalization nodes are kept, not folded into the convolutions. Tensors of ``size_threshold`` bytes
    or more become references to ``<stem>.weights`` beside ``path`` (see :func:`make_weightless`), a file that is
    never written; doc strings and metadata, which carry absolute paths, are removed. The output is deterministic:
    the same module and arguments give the same bytes, provided the inline (small) tensors are the same.

    Parameters
    ----------
    module : torch.nn.Module
        The model. It is put in eval mode.
    example_inputs : Tensor or tuple of Tensor
        Inputs of the shapes the file should declare; their values are not used.
    path : str or Path
        Where to write the ``.onnx`` file; its directory is created if needed.
    input_names, output_names : sequence of str
        Names of the graph inputs and outputs.
    opset : int
        ONNX opset of the default domain.
    exporter : {"auto", "dynamo", "torchscript"}
        ``"auto"`` tries the torch.export-based exporter and falls back to the TorchScript one where it fails.
    size_threshold : int
        Byte size from which a tensor is made external.
    """
    import torch

    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if exporter not in ("auto", *EXPORTERS):
        raise ValueError(f"unknown exporter {exporter!r}; choose one of auto, {', '.join(EXPORTERS)}")
    batch = _batch_of(example_inputs)
    module = module.eval()
    candidates = ["dynamo", "torchscript"] if exporter == "auto" else [exporter]
    model = _export_first(module, example_inputs, input_names, output_names, opset, candidates)
    path = Path(path)
    model = _weightless_checked(model, type(module).__name__, batch, f"{path.stem}.weights", size_threshold)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, path)
    return model


def _batch_of(example_inputs: tuple[torch.Tensor, ...]) -> int:
    """The batch size (dimension 0) all of ``example_inputs`` share; ExportError where they disagree."""
    batches = {x.shape[0] for x in example_inputs}
    if len(batches) != 1:
        raise ExportError(f"example inputs disagree on the batch size (dimension 0): {sorted(batches)}")
    (batch,) = batches
    return batch


def _export_first(
    module: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    input_names: Sequence[str],
    output_names: Sequence[str],
    opset: int,
    candidates: Sequence[str],
) -> onnx.ModelProto:
    """``module`` exported by the first of the ``candidates`` exporters that succeeds; each failure but the last
    is logged, the last raises ExportError."""
    import torch

    with torch.no_grad(), no_tqdm_monitor():
        for name in candidates:
            try:
                model = EXPORTERS[name](module, example_inputs, input_names, output_names, opset)
            except Exception as error:
                if name == candidates[-1]:
                    message = f"exporting {type(module).__name__} with the {name} exporter failed: {error}"
                    raise ExportError(message) from error
                logger.warning("the %s exporter failed (%s); falling back to the next one", name, error)
                continue
            logger.info("exported %s with the %s exporter", type(module).__name__, name)
            return model
    raise AssertionError("no exporter candidates")


def _weightless_checked(model: onnx.ModelProto, kind: str, batch: int, location: str,
                        size_threshold: int) -> onnx.ModelProto:
    """The exported ``model`` (of a module of class ``kind``) pinned to ``batch``, checked, made weightless (its
    large tensors referencing ``location``) and stripped of metadata; ExportError where it does not check or shape
    inference fails, or where a node hard-codes the batch size."""
    _set_batch(model, batch)
    try:
        # The checker wants the data of every tensor (it rejects references to a missing file): check first.
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as error:
        raise ExportError(f"the exported graph of {kind} does not check: {error}") from error
    model = make_weightless(model, location, size_threshold=size_threshold)
    strip_metadata(model)
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
        check_batch_agnostic(model, batch=batch + 7)
    except onnx.shape_inference.InferenceError as error:
        raise ExportError(f"shape inference fails on the exported graph of {kind}: {error}") from error
    return model
