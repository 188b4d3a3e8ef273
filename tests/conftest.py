"""Fixtures shared by the tests. The model builders live in tests/helpers.py (``from helpers import model``); they
are imported here too, for tests that still take them from conftest."""

from __future__ import annotations

import onnx
import pytest
from onnx import TensorProto

from helpers import const, model, single, weight  # noqa: F401


@pytest.fixture
def save(tmp_path):
    """Write a model to a file (no external data written) and return its path."""

    def _save(m: onnx.ModelProto, name: str = "model.onnx") -> str:
        path = tmp_path / name
        path.write_bytes(m.SerializeToString())
        return str(path)

    return _save


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
