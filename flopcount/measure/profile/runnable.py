"""The model onnxruntime runs: the counted graph with its weights (inline, external files present beside it, or
synthesised from their dims and dtypes), every node named, inputs fixed to the count's resolved shapes; and inputs
to feed it."""

from __future__ import annotations

import logging
import os
from typing import Any

from flopcount.errors import MeasurementError, ShapeError
from flopcount.pipeline.graph import model_tensors
from flopcount.reporting.report import Report

__all__ = ["make_inputs", "runnable_model"]

log = logging.getLogger(__name__)


def _has_data(t) -> bool:
    from onnx import TensorProto

    if t.data_location == TensorProto.EXTERNAL:
        return False
    n = 1
    for d in t.dims:
        n *= d
    if n == 0:
        return True
    return any(len(getattr(t, f)) for f in ("raw_data", "float_data", "int32_data", "string_data", "int64_data",
                                            "double_data", "uint64_data"))


def _synthesize(t, rng):
    """A tensor of ``t``'s name, dims and dtype with synthetic values (see the module docstring)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    dims = tuple(t.dims)
    try:
        np_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    except (KeyError, TypeError, ValueError):
        np_dtype = None
    floating = t.data_type in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16)
    if floating:
        if len(dims) >= 2:
            fan_in = max(1, int(np.prod(dims[1:])))
            values = rng.uniform(-1, 1, size=dims) / np.sqrt(fan_in)
        else:
            values = rng.uniform(0.5, 1.5, size=dims)
        if t.data_type == TensorProto.BFLOAT16:
            return helper.make_tensor(t.name, t.data_type, dims, values.astype(np.float32).ravel().tolist())
        return numpy_helper.from_array(values.astype(np_dtype), t.name)
    if np_dtype is not None and np_dtype.kind in "iub":
        return numpy_helper.from_array(np.zeros(dims, dtype=np_dtype), t.name)
    raise MeasurementError(f"initializer {t.name!r} ({onnx.TensorProto.DataType.Name(t.data_type)}) has no data "
                           "and flopcount cannot synthesise that type; give the model with its weights")


def _fill_graph(graph, rng, counts: dict[str, int]) -> None:
    from onnx import AttributeProto

    for i, t in enumerate(graph.initializer):
        if _has_data(t):
            counts["from_model"] += 1
        else:
            graph.initializer[i].CopyFrom(_synthesize(t, rng))
            counts["synthesized"] += 1
    for node in graph.node:
        for a in node.attribute:
            if a.type == AttributeProto.TENSOR and not _has_data(a.t):
                a.t.CopyFrom(_synthesize(a.t, rng))
                counts["synthesized"] += 1
            elif a.type == AttributeProto.GRAPH:
                _fill_graph(a.g, rng, counts)
            elif a.type == AttributeProto.GRAPHS:
                for g in a.graphs:
                    _fill_graph(g, rng, counts)


def _load_present_external_data(model, folder: str) -> None:
    """Read the model's external weights when every file they name exists in ``folder`` (a location that leaves the
    folder, or a file that is absent or too short, leaves the weights to be synthesised, with a log line)."""
    import onnx
    from onnx import TensorProto, external_data_helper

    tensors = [t for t in model_tensors(model) if t.data_location == TensorProto.EXTERNAL]
    if not tensors:
        return
    locations = {next((e.value for e in t.external_data if e.key == "location"), "") for t in tensors}
    root = os.path.realpath(folder)
    inside = all(loc and os.path.realpath(os.path.join(root, loc)).startswith(root + os.sep) for loc in locations)
    if not inside or not all(os.path.isfile(os.path.join(root, loc)) for loc in locations):
        log.info("external weights (%s) absent or outside the model's folder: synthesised",
                 ", ".join(sorted(locations))[:200])
        return
    try:
        external_data_helper.load_external_data_for_model(model, root)
    except (OSError, ValueError, onnx.checker.ValidationError) as e:
        log.warning("external weights could not be read (%s): synthesised", e)
        for t in tensors:  # anything half-read is synthesised from its dims
            t.ClearField("raw_data")
            t.data_location = TensorProto.EXTERNAL


def runnable_model(source, report: Report, seed: int = 0):
    """The model onnxruntime runs: ``source`` (a path, a ``ModelProto``, or a
    :class:`~flopcount.pipeline.loading.LoadedModel` from :func:`~flopcount.pipeline.loading.load_with_weights`, which is used in place)
    read with its inline data (and its external data when every file is present beside it), model-local
    functions expanded as counting expands them, every node given a unique name (kept where it already is one),
    missing weights synthesised, and graph inputs and outputs fixed to the count's resolved shapes. Returns the
    model, the node names by graph position, and ``{"from_model": k, "synthesized": m}``."""
    import numpy as np
    import onnx

    from flopcount.pipeline.loading import LoadedModel

    if isinstance(source, LoadedModel):
        model, path = source.model, source.path
    elif isinstance(source, onnx.ModelProto):
        model, path = onnx.ModelProto(), None
        model.CopyFrom(source)
    else:
        path = os.fspath(source)
        try:
            model = onnx.load(path, load_external_data=False)
        except Exception as e:  # count() has read it already: unlikely
            raise MeasurementError(f"{source}: cannot be read for running ({e})") from None
    if path is not None:
        _load_present_external_data(model, os.path.dirname(os.path.abspath(path)))
    if model.functions:
        import onnx.inliner

        model = onnx.inliner.inline_local_functions(model)
    graph = model.graph
    if len(graph.node) != len(report.nodes):
        raise MeasurementError(f"{report.model.path or '<model>'}: the graph onnxruntime would run has "
                               f"{len(graph.node)} nodes but the count has {len(report.nodes)}; profile the file "
                               "as it is on disk")
    seen: set[str] = set()
    names = []
    for i, node in enumerate(graph.node):
        name = node.name
        if not name or name in seen:
            name = f"{node.op_type}_{i}"
            while name in seen:
                name += "_"
            node.name = name
        seen.add(name)
        names.append(name)
    counts = {"from_model": 0, "synthesized": 0}
    _fill_graph(graph, np.random.default_rng(seed), counts)
    resolved = {t.name: t for t in (*report.model.inputs, *report.model.outputs)}
    for vi in (*graph.input, *graph.output):
        info = resolved.get(vi.name)
        if info is None or not vi.type.HasField("tensor_type"):
            continue
        shape = vi.type.tensor_type.shape
        shape.ClearField("dim")
        if info.shape is not None:
            for d in info.shape:
                dim = shape.dim.add()
                if isinstance(d, int):
                    dim.dim_value = d
                elif isinstance(d, str):
                    dim.dim_param = d
        else:
            vi.type.tensor_type.ClearField("shape")
    graph.ClearField("value_info")  # stale intermediate shapes would contradict the fixed inputs
    return model, names, counts


def make_inputs(report: Report, seed: int = 0) -> dict[str, Any]:
    """Random floating-point inputs (standard normal) and zero integer/boolean inputs of the resolved shapes."""
    import numpy as np
    from onnx import helper

    rng = np.random.default_rng(seed + 1)
    feeds = {}
    for t in report.model.inputs:
        if not t.is_static:
            raise ShapeError(f"input {t.name!r} has dims {t.shape_text()}, not all known; fix them with "
                             f"--input-shape {t.name}=DIMS (or --batch N)")
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        if dtype.kind == "f":
            feeds[t.name] = rng.standard_normal(t.shape).astype(dtype)
        else:
            feeds[t.name] = np.zeros(t.shape, dtype=dtype)
    return feeds
