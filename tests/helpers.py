"""Builders for small ONNX models, imported by tests as ``from helpers import model, weight, ...``. Weights are
external-data references to a file that does not exist, so every test also checks that counting never reads
weights."""

from __future__ import annotations

import os
from math import prod
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["RESNET50_ONNX", "RESNET50_STAGES", "const", "direct_backward", "model", "resnet50_architecture", "single",
           "weight"]


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


def direct_backward(op_type: str, inputs, outputs, grads, opset: int, values=None, **attrs):
    """Call the registered backward formula of ``op_type`` on a hand-built context, for gradients a
    count never asks for (inputs the schema marks non-differentiable). ``inputs``: (name, shape) or
    (name, shape, elem_type) per input, "" for an omitted one; ``outputs``: shapes; ``grads``: which
    inputs need a gradient."""
    from flopcount.context import NodeContext, TensorInfo
    from flopcount.conventions import CONVENTIONS
    from flopcount.registry import lookup_backward

    values = values or {}
    ins = tuple(
        TensorInfo(spec[0], spec[2] if len(spec) > 2 else TensorProto.FLOAT, spec[1]) if spec[0] else None
        for spec in inputs
    )
    outs = tuple(TensorInfo(f"y{i}", TensorProto.FLOAT, shape) for i, shape in enumerate(outputs))
    ctx = NodeContext("op", op_type, "", opset, ins, outs, CONVENTIONS["default"], values.get, grads=tuple(grads))
    return lookup_backward("", op_type)(ctx, **attrs)


#: The bundled weightless ResNet-50 v1.5 graph and its stages.
RESNET50_ONNX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "resnet50-v1.5.onnx")
RESNET50_STAGES = [(3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)]  # blocks, width, stride of first block


def resnet50_architecture(hw=224):
    """ResNet-50 v1.5's per-layer closed forms: conv MACs, BN / ReLU / Add elements, and the pool windows."""
    conv_macs, bn, relu, add = [], 0, 0, 0
    h = hw // 2  # stem 7x7/2
    conv_macs.append(h * h * 64 * 3 * 7 * 7)
    bn += 64 * h * h
    relu += 64 * h * h
    stem_out = 64 * h * h
    h //= 2  # max pool 3x3/2, pad 1
    maxpool_out = 64 * h * h
    c_in = 64
    for blocks, w, stride in RESNET50_STAGES:
        for b in range(blocks):
            s = stride if b == 0 else 1
            ho = h // s
            conv_macs += [h * h * w * c_in, ho * ho * w * w * 9, ho * ho * 4 * w * w]
            bn += w * h * h + w * ho * ho + 4 * w * ho * ho
            relu += w * h * h + w * ho * ho + 4 * w * ho * ho
            add += 4 * w * ho * ho
            if b == 0:
                conv_macs.append(ho * ho * 4 * w * c_in)  # projection shortcut, 1x1 stride s
                bn += 4 * w * ho * ho
            c_in, h = 4 * w, ho
    return dict(conv_macs=conv_macs, bn=bn, relu=relu, add=add, stem_out=stem_out,
                maxpool_out=maxpool_out, gap_in=2048 * h * h, fc_macs=2048 * 1000)
