"""Shape constants checked before ONNX's inference sees them: a Reshape, Expand, ConstantOfShape or Tile whose
constant shape asks for more elements than any tensor may hold is refused naming its node
(:func:`check_shape_constants`), where ONNX's data propagation would first try to hold that many values."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from operator import attrgetter

import numpy as np
import onnx
from onnx import ModelProto, TensorProto

from ...errors import ShapeError
from .interpreter import constant_value, has_data
from .tensors import FOLD_LIMIT, MAX_ELEMENTS, SUBGRAPH_OPS

__all__ = ["check_shape_constants"]

_OP_TYPE, _NAME = attrgetter("op_type"), attrgetter("name")


#: Operators whose constant input gives their output's dims (Tile: the repeats that multiply them) → its index.
_SHAPE_INPUTS = {"Reshape": 1, "Expand": 1, "ConstantOfShape": 0, "Tile": 1}


def check_shape_constants(model: ModelProto, where: str, op_types: Sequence[str] | None = None) -> None:
    """Refuse, before ONNX's inference sees it, a Reshape, Expand, ConstantOfShape or Tile (in the graph or a body)
    whose constant shape (Tile: repeats) asks for a dim or a tensor of more than :data:`MAX_ELEMENTS` elements: a
    :class:`ShapeError` naming the node and the constant. Inference would refuse its output's dims only after
    ONNX's data propagation had tried to hold that many values (a Reshape to 2**63 - 1 elements took it to 3.9 GB).
    Zeros and -1 of a Reshape's target (a copied or an inferred dim) and negative values (refused elsewhere, naming
    their rule) are left out of the product. ``op_types``: the top graph's op types, where the caller read them."""
    graphs = [(model.graph, op_types)]
    while graphs:
        graph, ops = graphs.pop()
        ops = list(map(_OP_TYPE, graph.node)) if ops is None else ops
        present = set(ops)
        if not present.isdisjoint(SUBGRAPH_OPS):
            graphs.extend((sub, None) for i, op in enumerate(ops) if op in SUBGRAPH_OPS
                          for a in graph.node[i].attribute
                          for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs))
        if present.isdisjoint(_SHAPE_INPUTS):
            continue
        wanted: dict[str, onnx.NodeProto] = {}
        nodes = graph.node
        for i in [i for i, op in enumerate(ops) if op in _SHAPE_INPUTS]:
            node, k = nodes[i], _SHAPE_INPUTS[ops[i]]
            inputs = node.input
            if len(inputs) > k and inputs[k] and node.domain in ("", "ai.onnx"):
                wanted.setdefault(inputs[k], node)
        if not wanted:
            continue
        initializers = graph.initializer
        found = [(name, _shape_values(initializers[j])) for j, name in enumerate(map(_NAME, initializers))
                 if name in wanted]
        if "Constant" in present:
            found += [(n.output[0], constant_value(n)) for i, op in enumerate(ops) if op == "Constant"
                      and (n := graph.node[i]).output and n.output[0] in wanted]
        for name, v in found:
            if v is None or v.dtype.kind not in "iu" or v.ndim != 1:
                continue
            dims = [int(d) for d in v.tolist() if d > 0]
            if dims and (max(dims) > MAX_ELEMENTS or prod(dims) > MAX_ELEMENTS):
                node = wanted[name]
                what = "repeats" if node.op_type == "Tile" else "shape"
                raise ShapeError(
                    f"{where}: node {node.name or node.op_type!r} ({node.op_type}) makes tensor {node.output[0]!r} "
                    f"of more than 2**48 elements: its {what} {name!r} is {v.tolist()}; no real tensor is that "
                    "large: check the model's constants and --input-shape")


_NAME = attrgetter("name")


def _shape_values(t: TensorProto) -> np.ndarray | None:
    """The values of a small inline integer vector (a shape, repeats), read straight from its bytes; None for any
    other tensor."""
    if t.data_type not in (TensorProto.INT64, TensorProto.INT32) or len(t.dims) != 1 or t.dims[0] > FOLD_LIMIT \
            or not has_data(t):
        return None
    if t.HasField("raw_data"):
        dtype = np.dtype("<i8" if t.data_type == TensorProto.INT64 else "<i4")
        raw = t.raw_data
        return np.frombuffer(raw, dtype=dtype) if len(raw) == t.dims[0] * dtype.itemsize else None
    return np.array(t.int64_data if t.data_type == TensorProto.INT64 else t.int32_data, dtype=np.int64)
