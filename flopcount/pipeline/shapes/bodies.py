"""Shapes inside the bodies of If / Loop / Scan, and of the Loop outputs ONNX's inference leaves without one."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import ModelProto, TensorProto, helper, numpy_helper

from ...context import TensorInfo
from ...errors import ShapeError
from ..graph import node_label
from .guarded import infer
from .tensors import (
    SUBGRAPH_OPS,
    collect,
    declared_shape,
    static,
    tensor_type,
    value_info,
)

log = logging.getLogger(__name__)


def _body_inputs(node: onnx.NodeProto, body: onnx.GraphProto, tensors: Mapping[str, TensorInfo]) -> list:
    """Types of a body's formal inputs, from the node's actual inputs."""
    outer = [tensors.get(n) if n else None for n in node.input]
    if node.op_type == "Loop":
        return [TensorInfo("", TensorProto.INT64, ()), TensorInfo("", TensorProto.BOOL, ()), *outer[2:]]
    if node.op_type == "Scan":
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        m = attrs.get("num_scan_inputs", 0)
        n_states = len(node.input) - m
        axes = attrs.get("scan_input_axes") or [0] * m
        scans = []
        for t, axis in zip(outer[n_states:], axes):
            if t is None or t.shape is None:
                scans.append(t)
            else:
                a = axis % len(t.shape)
                scans.append(TensorInfo(t.name, t.elem_type, t.shape[:a] + t.shape[a + 1 :]))
        return [*outer[:n_states], *scans]
    if node.op_type == "SequenceMap":  # one element of each sequence (recorded by element type), tensors as they are
        return outer
    return [None] * len(body.input)


def infer_bodies(model: ModelProto, graph: onnx.GraphProto, tensors: dict, values: Mapping, where: str) -> None:
    """Infer shapes inside subgraphs whose inputs ONNX left untyped or typed with open dims, as standalone graphs
    whose inputs carry the outer node's types (see :func:`_formal_inputs`); recurses into nested bodies.

    A carried value (a Loop's or Scan's state) keeps the outer dims only if the body gives it back with the same
    shape: one whose shape changes from one iteration to the next (a growing Concat) is inferred again with the
    body's own declared type, so that the first iteration's shape is never taken for every iteration's."""
    for node in graph.node:
        if node.op_type not in SUBGRAPH_OPS:
            continue
        for a in node.attribute:
            for body in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
                if all(tensors.get(o) is not None and tensors[o].is_static for n in body.node for o in n.output if o):
                    continue
                inputs = _formal_inputs(body, _body_inputs(node, body, tensors))
                found = _infer_body(model, node, body, inputs, tensors, values, where)
                for _ in _carried(node, body):  # each pass gives at least one more state its declared type back
                    if found is None:
                        break
                    changed = [k for k, out in _carried(node, body) if inputs[k] is not body.input[k]
                               and declared_shape(inputs[k]) != _found_shape(found.get(out))]
                    if not changed:
                        break
                    inputs = [body.input[k] if k in changed else vi for k, vi in enumerate(inputs)]
                    found = _infer_body(model, node, body, inputs, tensors, values, where)
                if found is None:
                    continue
                for name, info in found.items():
                    prev = tensors.get(name)
                    if prev is None or (not prev.is_static and (info.is_static or prev.shape is None)):
                        tensors[name] = info
                infer_bodies(model, body, tensors, values, where)


def _found_shape(t: TensorInfo | None) -> tuple | None:
    return None if t is None else t.shape


def _formal_inputs(body: onnx.GraphProto, formal: Sequence[TensorInfo | None]) -> list[onnx.ValueInfoProto]:
    """The body's inputs, typed from the outer node's (``formal``): a body input declared without a type takes the
    outer one whole, and a declared dim that is symbolic or empty (tf2onnx's ``['unk__477', 300]`` for every Loop
    state) takes the outer known dim. A dim the body declares as a number stays (the body says what it reads).
    Where nothing is taken, the body's own input is returned (the same object)."""
    out = []
    for vi, t in zip(body.input, formal):
        declared = tensor_type(vi)
        if t is None or vi.type.HasField("sequence_type"):
            out.append(vi)
        elif not declared.HasField("shape") or not declared.elem_type:
            out.append(value_info(vi.name, t))
        else:
            dims = declared_shape(vi)
            merged = dims if t.shape is None or len(t.shape) != len(dims) else tuple(
                d if isinstance(d, int) and d > 0 else (o if isinstance(o, int) else d) for d, o in zip(dims, t.shape))
            out.append(vi if merged == dims else value_info(vi.name, TensorInfo(vi.name, declared.elem_type, merged)))
    out.extend(body.input[len(out):])
    return out


def _carried(node: onnx.NodeProto, body: onnx.GraphProto) -> list[tuple[int, str]]:
    """(body input index, body output name) of each value a Loop or Scan carries from one iteration to the next."""
    if node.op_type == "Loop":
        return [(2 + j, out.name) for j, out in enumerate(body.output[1:len(body.input) - 1])]
    if node.op_type == "Scan":
        m = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "num_scan_inputs"), 0)
        return [(k, body.output[k].name) for k in range(min(len(node.input) - m, len(body.output)))]
    return []


def _infer_body(model: ModelProto, node: onnx.NodeProto, body: onnx.GraphProto, inputs: Sequence[onnx.ValueInfoProto],
                tensors: Mapping[str, TensorInfo], values: Mapping, where: str) -> dict[str, TensorInfo] | None:
    """The tensor infos of ``body`` inferred as a standalone graph with ``inputs`` and what it reads from enclosing
    scopes (known values as initializers, else their types); None when ONNX's inference fails on it."""
    sub = ModelProto(ir_version=model.ir_version)
    sub.opset_import.extend(model.opset_import)
    g = sub.graph
    g.name = body.name or "body"
    g.node.extend(body.node)
    g.initializer.extend(body.initializer)
    g.output.extend(body.output)
    g.input.extend(inputs)
    defined = {i.name for i in body.input} | {t.name for t in body.initializer}
    defined |= {o for n in body.node for o in n.output}
    outer_refs = {x for n in body.node for x in n.input if x and x not in defined}
    from ..graph import subgraph_outer_names

    for n in body.node:
        outer_refs |= {x for x in subgraph_outer_names(n) if x not in defined}
    for name in sorted(outer_refs):
        if name in values:
            g.initializer.append(numpy_helper.from_array(np.asarray(values[name]), name))
        else:
            g.input.append(value_info(name, tensors.get(name)))
    try:
        return collect(infer(sub, where))
    except ShapeError as e:  # leave the body as it is; its formulas will name the tensor
        if not str(e).startswith(f"{where}: ONNX shape inference failed"):
            raise  # a negative or oversized dim
        log.debug("%s: cannot infer the body of %s %r: %s", where, node.op_type, node.name, e)
        return None


# --------------------------------------------------------------------------------------------
def loop_outputs(graph: onnx.GraphProto, tensors: Mapping[str, TensorInfo], values: Mapping,
                  loop_trips: Mapping[str, int] | None = None) -> dict[str, TensorInfo]:
    """Shapes of Loop outputs that ONNX's inference leaves without one, where the body settles them:
    a loop-carried value whose body output has the static shape of its initial value keeps that
    shape; a scan output stacks the body's static output over the trip count: the N that ``loop_trips``
    gives the Loop by name (``--loop-trips NAME=N``), else a known M. Where a condition may end the loop
    early, M is its maximum, as the Loop's own count takes it (both are upper bounds, which the Loop's count
    names: ``operators/control_flow.py``); a Loop with neither leaves its scan outputs open, and its count
    asks for ``--loop-trips``."""
    settled: dict[str, TensorInfo] = {}
    loop_trips = loop_trips or {}
    for position, node in enumerate(graph.node):
        if node.op_type != "Loop" or node.domain not in ("", "ai.onnx"):
            continue
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        if body is None:
            continue
        n_carried = len(node.input) - 2
        for k, out in enumerate(node.output):
            if not out or static(tensors.get(out)) or 1 + k >= len(body.output):
                continue
            inner = tensors.get(body.output[1 + k].name)
            if not static(inner):
                continue
            if k < n_carried:
                initial = tensors.get(node.input[2 + k])
                if static(initial) and initial.shape == inner.shape:
                    settled[out] = TensorInfo(out, inner.elem_type or initial.elem_type, inner.shape)
            else:
                trips = values.get(node.input[0]) if node.input[0] else None
                count = int(np.asarray(trips).reshape(())) if trips is not None and np.size(trips) == 1 else -1
                count = loop_trips.get(node_label(node, position), count)
                if count >= 0:
                    settled[out] = TensorInfo(out, inner.elem_type, (count, *inner.shape))
    return settled

