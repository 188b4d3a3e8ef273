"""What a formula sees of one node: its tensors' shapes and dtypes, its opset and the convention."""

from __future__ import annotations

from math import prod
from operator import itemgetter
from typing import Any, Callable, Mapping, NamedTuple

import numpy as np
from onnx import TensorProto

from .conventions import Convention
from .errors import ShapeError

Dim = int | str | None
FLOAT_TYPES = frozenset(
    {
        TensorProto.FLOAT,
        TensorProto.DOUBLE,
        TensorProto.FLOAT16,
        TensorProto.BFLOAT16,
        *(
            getattr(TensorProto, n)
            for n in (
                "FLOAT8E4M3FN",
                "FLOAT8E4M3FNUZ",
                "FLOAT8E5M2",
                "FLOAT8E5M2FNUZ",
                "FLOAT4E2M1",
                "FLOAT8E8M0",
                "COMPLEX64",
                "COMPLEX128",
            )
            if hasattr(TensorProto, n)
        ),
    }
)


_IS_INT = int.__instancecheck__  # dims are ints, str (symbolic) or None; never bool


class TensorInfo(tuple):
    """A tensor's name, ONNX element type (0 when unknown) and shape (``None`` when the rank is unknown).

    Dims are ints when resolved, else the symbolic name (str) or ``None``. Immutable (a tuple:
    a graph of 100k nodes creates a few hundred thousand of these).

    >>> TensorInfo("x", 1, (2, "N")).is_static, TensorInfo("x", 1, (2, 3)).shape_text()
    (False, '2x3')
    """

    __slots__ = ()

    def __new__(cls, name: str, elem_type: int = 0, shape: tuple[Dim, ...] | None = None) -> "TensorInfo":
        static = shape is not None and all(map(_IS_INT, shape))
        return tuple.__new__(cls, (name, elem_type, shape, static))

    name = property(itemgetter(0))
    elem_type = property(itemgetter(1))
    shape = property(itemgetter(2))
    is_static = property(itemgetter(3))  # every dim a known int

    def __repr__(self) -> str:
        return f"TensorInfo(name={self.name!r}, elem_type={self.elem_type}, shape={self.shape!r})"

    def __getnewargs__(self):
        return self[:3]

    @property
    def is_float(self) -> bool:
        return self.elem_type in FLOAT_TYPES

    def shape_text(self) -> str:
        if self.shape is None:
            return "?"
        return "x".join("?" if d is None else str(d) for d in self.shape) if self.shape else "scalar"


class NodeContext(NamedTuple):
    """One node as a formula sees it (immutable). Dimension names follow the docstrings' vocabulary
    (``N, C_in, C_out, H_out, W_out, K, G``)."""

    name: str
    op_type: str
    domain: str
    opset: int
    inputs: tuple[TensorInfo | None, ...]  # None where an optional input is omitted
    outputs: tuple[TensorInfo | None, ...]
    convention: Convention
    lookup_value: Callable[[str], np.ndarray | None]  # small constants by tensor name (see value())
    hint: str = ""  # how to fix unknown shapes, appended to ShapeError messages
    count_subgraph: Callable[[Any], Any] | None = None  # see subgraph_cost()
    trips: int | None = None  # trip count given for this node (``--loop-trips``), if any
    grads: tuple[bool, ...] = ()  # training: which inputs need a gradient
    backward_subgraph: Callable[..., Any] | None = None  # see subgraph_backward()

    def needs_grad(self, i: int) -> bool:
        """Training: whether input ``i`` needs a gradient (it depends on a trainable parameter
        through differentiable inputs, or is one)."""
        return i < len(self.grads) and self.grads[i]

    # --- presence -------------------------------------------------------------------------------
    def has_input(self, i: int) -> bool:
        return i < len(self.inputs) and self.inputs[i] is not None

    @property
    def n_inputs(self) -> int:
        """Number of inputs actually given (omitted optional inputs not counted)."""
        return sum(t is not None for t in self.inputs)

    # --- shapes ---------------------------------------------------------------------------------
    def _static(self, t: TensorInfo | None, what: str) -> tuple[int, ...]:
        if t is None:
            raise ShapeError(f"node {self.name!r} ({self.op_type}) has no {what}")
        if not t.is_static:
            raise ShapeError(
                f"node {self.name!r} ({self.op_type}): shape of tensor {t.name!r} is {t.shape_text()}, "
                f"not fully known, and its cost depends on it. {self.hint}".rstrip()
            )
        return t.shape  # type: ignore[return-value]

    def shape(self, i: int) -> tuple[int, ...]:
        """Static shape of input ``i``; raises :class:`ShapeError` naming the tensor when unknown."""
        return self._static(self.inputs[i] if i < len(self.inputs) else None, f"input {i}")

    def out_shape(self, i: int = 0) -> tuple[int, ...]:
        return self._static(self.outputs[i] if i < len(self.outputs) else None, f"output {i}")

    def numel(self, i: int) -> int:
        return prod(self.shape(i))

    def out_numel(self, i: int = 0) -> int:
        return prod(self.out_shape(i))

    def out_is_float(self, i: int = 0) -> bool:
        t = self.outputs[i] if i < len(self.outputs) else None
        return t is not None and t.is_float

    def in_is_float(self, i: int) -> bool:
        t = self.inputs[i] if i < len(self.inputs) else None
        return t is not None and t.is_float

    def subgraph_cost(self, graph: Any) -> Any:
        """Cost of one run of a subgraph attribute (an If branch, a Loop or Scan body), counted by the
        same machinery, recursively."""
        return self.count_subgraph(graph)

    def subgraph_backward(self, graph: Any, needs: Any = (), carried: Any = ()) -> Any:
        """Training: the backward cost of one run of a subgraph attribute, given the names of its
        formal inputs that need a gradient (``needs``) and, for loop-carried values, (body output,
        body input) pairs; what the body reads from enclosing scopes is known already."""
        return self.backward_subgraph(graph, needs, carried)

    def value(self, i: int) -> np.ndarray | None:
        """Constant value of input ``i`` when it is known without reading weights (small constants)."""
        t = self.inputs[i] if i < len(self.inputs) else None
        return None if t is None else self.lookup_value(t.name)


def attribute_defaults(schema: Any) -> Mapping[str, Any]:
    """Default attribute values of an ``onnx.defs.OpSchema`` as Python values."""
    from onnx import helper

    out = {}
    for name, attr in schema.attributes.items():
        dv = attr.default_value
        if dv is not None and dv.name:
            out[name] = python_value(helper.get_attribute_value(dv))
    return out


def python_value(v: Any) -> Any:
    """An attribute value with strings decoded (ONNX stores them as bytes)."""
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode() for s in v]
    return v
