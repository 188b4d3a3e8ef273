"""What the user fixes before any inference: input shapes (``--input-shape``, ``--batch``) and input values
(``--input-value``)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from math import prod

import numpy as np
import onnx
from onnx import ModelProto, helper, numpy_helper

from ...errors import ShapeError, UsageError
from .tensors import FOLD_LIMIT, MAX_ELEMENTS, declared_shape, tensor_type

# input overrides


def parse_dims(text: str) -> tuple[int, ...]:
    """``"8x3x224x224"`` (or ``8,3,224,224``) → ``(8, 3, 224, 224)``; ``""`` → ``()`` (a scalar)."""
    text = text.strip()
    if not text:
        return ()
    parts = re.split(r"[x,×*]", text)
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"cannot read shape {text!r}: write dims as integers joined by 'x', e.g. 8x3x224x224") from None
    if any(d <= 0 for d in dims):
        raise UsageError(f"shape {text!r} has a zero or negative dim; every dim must be a positive integer")
    if any(d > MAX_ELEMENTS for d in dims) or prod(dims) > MAX_ELEMENTS:
        raise UsageError(f"shape {text!r} is too large: a tensor may hold at most 2**48 elements; give real dims")
    return dims


def apply_overrides(
    model: ModelProto,
    real_inputs: Sequence[str],
    input_shapes: Mapping[str, Sequence[int]],
    batch: int | None,
    where: str,
) -> bool:
    """Set input dims in place from ``input_shapes`` and ``batch``; True when anything changed."""
    by_name = {vi.name: vi for vi in model.graph.input}
    unknown = [n for n in input_shapes if n not in real_inputs]
    if unknown:
        raise UsageError(
            f"{where}: --input-shape names {', '.join(map(repr, unknown))}, which is not an input of the "
            f"model; its inputs are: {', '.join(map(repr, real_inputs)) or '(none)'}"
        )
    if batch is not None and not 0 < batch <= MAX_ELEMENTS:
        raise UsageError(f"--batch must be a positive integer of at most 2**48, not {batch}")
    for name, dims in input_shapes.items():
        if any(not isinstance(d, int) or d <= 0 or d > MAX_ELEMENTS for d in dims) or prod(dims) > MAX_ELEMENTS:
            raise UsageError(f"{where}: the shape given for input {name!r} ({list(dims)}) must be positive integers, "
                             "with at most 2**48 elements in all")
    if batch is not None:
        for name, dims in input_shapes.items():
            if len(dims) and dims[0] != batch:
                raise UsageError(
                    f"{where}: --batch {batch} (batch=) and --input-shape {name}={'x'.join(map(str, dims))} "
                    f"(input_shapes=) give dim 0 of input {name!r} differently ({batch} and {dims[0]}); "
                    "give one of them, or both alike"
                )
    _dynamic_minus_one(model, real_inputs)
    for name in real_inputs:
        declared = declared_shape(by_name[name])
        for i, d in enumerate(declared or ()):
            if isinstance(d, int) and d < 0:
                raise ShapeError(
                    f"{where}: graph input {name!r} declares dim {i} as {d}; dims cannot be negative: "
                    f"fix the model or give --input-shape {name}=..."
                )
    changed = False
    for name in real_inputs:
        vi = by_name[name]
        declared = declared_shape(vi)
        if name in input_shapes:
            dims = tuple(input_shapes[name])
            if declared is not None and len(declared) != len(dims):
                raise UsageError(
                    f"{where}: input {name!r} has rank {len(declared)} "
                    f"({'x'.join(str(d) if d is not None else '?' for d in declared)}), "
                    f"but --input-shape gives {len(dims)} dims"
                )
        elif batch is not None and declared:
            dims = (batch, *declared[1:])
        else:
            continue
        if dims != declared:
            changed = True
            shape = tensor_type(vi).shape
            shape.ClearField("dim")
            for d in dims:
                if isinstance(d, int):
                    shape.dim.add().dim_value = d
                elif d:
                    shape.dim.add().dim_param = d
                else:
                    shape.dim.add()
    if changed:
        # Annotations written for the old shapes would contradict the new ones.
        model.graph.ClearField("value_info")
        for o in model.graph.output:
            if o.type.tensor_type.HasField("shape"):
                o.type.tensor_type.ClearField("shape")
    return changed


def _dynamic_minus_one(model: ModelProto, real_inputs: Sequence[str]) -> None:
    """Graph inputs that declare a dim as -1 (Paddle2ONNX's way of writing a dynamic dim) get an
    unknown dim instead, in place; ``--input-shape`` and ``--batch`` fix it like a symbolic one."""
    wanted = set(real_inputs)
    for vi in model.graph.input:
        if vi.name in wanted and tensor_type(vi).HasField("shape"):
            for d in tensor_type(vi).shape.dim:
                if d.HasField("dim_value") and d.dim_value == -1:
                    d.Clear()


# --------------------------------------------------------------------------------------------
# inference
def apply_values(model: ModelProto, real_inputs: Sequence[str], input_values: Mapping[str, object], where: str,
                 shapes: Mapping[str, Sequence[int]] | None = None) -> None:
    """Turn inputs whose values are given (axes, sizes, an ``attention_mask``: small tensors) into
    initializers of ``model``, in place, so that inference and folding see them as constants. A flat list of
    values (``--input-value attention_mask=1,1,1,0,...``) takes the shape given in ``shapes``, else the input's
    declared static shape, where the number of values fits it."""
    by_name = {vi.name: vi for vi in model.graph.input}
    for name, value in input_values.items():
        if name not in real_inputs:
            raise UsageError(
                f"{where}: --input-value names {name!r}, which is not an input of the model; its inputs are: "
                f"{', '.join(map(repr, real_inputs)) or '(none)'}"
            )
        vi = by_name[name]
        elem = vi.type.tensor_type.elem_type
        declared = declared_shape(vi)
        try:
            array = np.asarray(value, dtype=helper.tensor_dtype_to_np_dtype(elem) if elem else None)
        except (OverflowError, ValueError, TypeError) as e:
            raise UsageError(f"{where}: the value given for input {name!r} does not fit its type ({e})") from None
        if declared is not None and len(declared) == 0 and array.size == 1:
            array = array.reshape(())
        target = (shapes or {}).get(name) or (declared if declared and all(isinstance(d, int) for d in declared) else None)
        if array.ndim == 1 and target is not None and len(target) != 1 and prod(target) == array.size:
            array = array.reshape(tuple(int(d) for d in target))
        if array.size > FOLD_LIMIT:
            raise UsageError(f"{where}: --input-value {name!r} has {array.size} elements; give values only for small "
                             f"shape-like inputs (at most {FOLD_LIMIT}), and shapes for the rest")
        if declared is not None and (len(declared) != array.ndim or any(
                isinstance(d, int) and d != a for d, a in zip(declared, array.shape))):
            raise UsageError(f"{where}: the value given for input {name!r} has shape {list(array.shape)}, "
                             f"but the model declares {['?' if d is None else d for d in declared]}")
        model.graph.input.remove(vi)
        model.graph.initializer.append(numpy_helper.from_array(array, name))


def real_inputs(graph: onnx.GraphProto) -> tuple[str, ...]:
    """Declared graph inputs that are not initializers (older exports declare both)."""
    initializers = {t.name for t in graph.initializer}
    return tuple(i.name for i in graph.input if i.name not in initializers)


def prepare(
    model: ModelProto,
    input_shapes: Mapping[str, Sequence[int]] | None,
    batch: int | None,
    where: str,
    input_values: Mapping[str, object] | None = None,
) -> None:
    """Apply what the user fixes (``input_values``, then ``input_shapes`` and ``batch``) to
    ``model`` in place, before any inference."""
    inputs = real_inputs(model.graph)
    input_shapes = dict(input_shapes or {})
    if input_values:
        apply_values(model, inputs, input_values, where, input_shapes)
        inputs = tuple(n for n in inputs if n not in input_values)
        both = set(input_shapes) & set(input_values)  # a shape given with the value must be the value's
        applied = {t.name: tuple(t.dims) for t in model.graph.initializer if t.name in both}
        for name in sorted(both):
            dims, value = tuple(input_shapes.pop(name)), applied[name]
            if dims != value:
                raise UsageError(f"{where}: input {name!r} is given the shape {list(dims)} and a value of shape "
                                 f"{list(value)}; give one of them, or both alike")
    apply_overrides(model, inputs, input_shapes, batch, where)

