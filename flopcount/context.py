"""What a formula sees of one node: its tensors' shapes and dtypes, its opset and the convention."""

from __future__ import annotations

from collections.abc import Sequence
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
    saved_subgraph: Callable[..., Any] | None = None  # see subgraph_saved()

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

    def subgraph_saved(self, graph: Any, needs: Any = (), carried: Any = ()) -> Any:
        """Training, memory: what one run of a subgraph attribute keeps for its backward
        (:class:`flopcount.saved.BodySaved`), its gradients planned as :meth:`subgraph_backward` plans them."""
        return self.saved_subgraph(graph, needs, carried)

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


#: Repeated attributes longer than this reach formulas as a :class:`RepeatedAttribute` (a tree ensemble holds
#: millions of node ids and thresholds, which Python lists would hold at 36 bytes each).
LONG_ATTRIBUTE = 4096


class RepeatedAttribute(Sequence):
    """A long INTS, FLOATS or STRINGS attribute, read only when a formula asks: a sequence (``len``, indexing,
    iteration: the values as :func:`python_value` gives them) that ``numpy.asarray`` turns into an int64 or float32
    array in one pass, without a Python object per value (STRINGS: an object array of the raw bytes). Formulas read
    most long attributes not at all (a tree ensemble's thresholds and weights)."""

    __slots__ = ("_field", "_kind", "_values")

    def __init__(self, field: Any, kind: str):
        self._field, self._kind, self._values = field, kind, None  # kind: "ints", "floats" or "strings"

    def _read(self) -> Any:
        if self._values is None:
            if self._kind == "strings":
                self._values = [v.decode() for v in self._field]
            else:
                self._values = np.array(self._field, dtype=np.int64 if self._kind == "ints" else np.float32)
                self._values.flags.writeable = False
        return self._values

    def __array__(self, dtype=None, copy=None):
        if self._kind == "strings":  # the raw bytes: decoding millions of strings costs more than the whole count
            return np.array(list(self._field) if self._values is None else [v.encode() for v in self._values],
                            dtype=object)
        return np.asarray(self._read(), dtype=dtype)

    def __len__(self) -> int:
        return len(self._field)

    def __getitem__(self, i):
        return self._read()[i]

    def __iter__(self):
        return iter(self._read())

    def __repr__(self) -> str:
        return f"RepeatedAttribute({self._kind}, {len(self)} values)"


def attribute_value(a: Any) -> Any:
    """The value of an ``onnx.AttributeProto`` as formulas read it: :func:`python_value`, or a
    :class:`RepeatedAttribute` for a repeated one longer than :data:`LONG_ATTRIBUTE`."""
    from onnx import AttributeProto, helper

    kind = {AttributeProto.INTS: "ints", AttributeProto.FLOATS: "floats", AttributeProto.STRINGS: "strings"}.get(a.type)
    if kind is not None:
        field = getattr(a, kind)
        if len(field) > LONG_ATTRIBUTE:
            return RepeatedAttribute(field, kind)
    return python_value(helper.get_attribute_value(a))


def is_long(a: Any) -> bool:
    """Whether an ``onnx.AttributeProto`` holds more than :data:`LONG_ATTRIBUTE` repeated values."""
    return len(a.ints) > LONG_ATTRIBUTE or len(a.floats) > LONG_ATTRIBUTE or len(a.strings) > LONG_ATTRIBUTE
