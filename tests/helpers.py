"""Builders for small ONNX models, imported by tests as ``from helpers import model, weight, ...``. Weights are
external-data references to a file that does not exist, so every test also checks that counting never reads
weights."""

from __future__ import annotations

from math import prod
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["const", "model", "single", "weight"]


def weight(name: str, dims: Sequence[int], dtype: int = TensorProto.FLOAT) -> TensorProto:
    """An initializer with dims and type whose data lives in a missing external file."""
    t = TensorProto(name=name, dims=list(dims), data_type=dtype)
    t.data_location = TensorProto.EXTERNAL
    itemsize = np.dtype(helper.tensor_dtype_to_np_dtype(dtype)).itemsize
    for k, v in (("location", "absent.weights"), ("offset", "0"), ("length", str(prod(dims) * itemsize))):
        t.external_data.add(key=k, value=v)
    return t


def const(name: str, values, dtype=np.int64) -> TensorProto:
    """A small inline initializer (shape vectors, axes)."""
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Mapping[str, Sequence | None],
    outputs: Sequence[str],
    initializers: Sequence[TensorProto] = (),
    opset: int = 18,
    dtype: int = TensorProto.FLOAT,
    extra_opsets: Mapping[str, int] | None = None,
    **kw,
) -> onnx.ModelProto:
    g = helper.make_graph(
        list(nodes),
        "test",
        [helper.make_tensor_value_info(n, dtype, s) for n, s in inputs.items()],
        [helper.make_empty_tensor_value_info(n) for n in outputs],
        list(initializers),
    )
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra_opsets or {}).items()]
    return helper.make_model(g, opset_imports=imports, **kw)


def single(op_type: str, inputs: Mapping[str, Sequence], initializers: Sequence[TensorProto] = (),
           n_outputs: int = 1, opset: int = 18, dtype: int = TensorProto.FLOAT, **attrs) -> onnx.ModelProto:
    """A model of one node; ``inputs`` lists graph inputs, ``initializers`` follow them as node inputs.

    Use "" in ``inputs`` for an omitted optional input.
    """
    names = list(inputs) + [t.name for t in initializers]
    outs = [f"y{i}" for i in range(n_outputs)]
    node = helper.make_node(op_type, names, outs, **attrs)
    graph_inputs = {n: s for n, s in inputs.items() if n}
    return model([node], graph_inputs, outs, initializers, opset=opset, dtype=dtype)
