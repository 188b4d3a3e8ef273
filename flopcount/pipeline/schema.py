"""Queries of ONNX operator schemas that several stages share: the schema of an op at an opset, and which inputs a
gradient may flow through. Cached: a graph asks the same few questions for many nodes."""

from __future__ import annotations

from functools import lru_cache

import onnx

from ..registry import buffer_inputs

__all__ = ["differentiable_inputs", "newest_category", "schema"]


@lru_cache(maxsize=None)
def schema(op_type: str, version: int, domain: str):
    """The schema of ``op_type`` in ``domain`` as of opset ``version``; None when onnx has none."""
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


# Where a schema leaves an input's gradient category Unknown (older opsets, a few ops), the newest
# schema of the op is asked for the input of the same name; inputs never trained though no schema
# says so are the ``buffers`` of their backward registration.
@lru_cache(maxsize=None)
def differentiable_inputs(op_type: str, version: int, domain: str, n_inputs: int) -> tuple[bool, ...]:
    """Per input position: may a gradient flow through it (schema category not NonDifferentiable,
    and not a buffer such as BatchNormalization's running statistics)?"""
    found = schema(op_type, version, domain) if version else None
    buffers = buffer_inputs(domain, op_type)
    unknown = onnx.defs.OpSchema.DifferentiationCategory.Unknown
    out = []
    for i in range(n_inputs):
        ok = True
        if found is not None and found.inputs:
            formal = found.inputs[min(i, len(found.inputs) - 1)]
            category = formal.differentiation_category
            if category == unknown:
                category = newest_category(op_type, domain, formal.name)
            ok = category != onnx.defs.OpSchema.DifferentiationCategory.NonDifferentiable
        out.append(ok and i not in buffers)
    return tuple(out)


def newest_category(op_type: str, domain: str, input_name: str):
    """The gradient category the newest schema of ``op_type`` gives the input named
    ``input_name``; Unknown when it says none."""
    unknown = onnx.defs.OpSchema.DifferentiationCategory.Unknown
    newest = schema(op_type, 10**6, domain)
    for formal in newest.inputs if newest is not None else ():
        if formal.name == input_name and formal.differentiation_category != unknown:
            return formal.differentiation_category
    return unknown
