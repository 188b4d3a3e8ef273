"""The one registry of operator costs, keyed by ``(domain, op_type)``.

Every operator is in exactly one of three groups:

* a **formula**: a pure function ``rule(ctx, **attributes) -> Cost`` registered with
  :func:`formula` right below its definition;
* **zero-cost**: registered with :func:`zero_cost` and a reason (layout, indexing, metadata);
* **unsupported**: anything not registered; reported in every output, fatal with ``strict``.

Each ``(domain, op_type)`` has one :class:`Operator` entry, which holds everything registered for it: its forward
rule (:func:`formula` or :func:`zero_cost`, with a quantized operator's data inputs), its output-type rule for
operators ONNX's inference does not know (:func:`shape_function`), its backward formula with its buffers and
straight-through flag (:func:`backward`), and its saved-for-backward rule (:func:`saves`). :data:`OPERATORS` maps
keys to entries; :data:`RULES`, :data:`BACKWARD` and :data:`SAVED` are read-only views of one part of them.

Registering the same part of an operator twice raises :class:`~flopcount.errors.RegistryError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Callable, Collection, Mapping

from .cost import Cost
from .errors import RegistryError
from .saved import NOTHING, Saved

DEFAULT_DOMAIN = ""


def canonical_domain(domain: str) -> str:
    """``"ai.onnx"`` and ``""`` name the same default domain."""
    return DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain


@dataclass(frozen=True)
class Rule:
    domain: str
    op_type: str
    family: str
    fn: Callable[..., Cost] | None  # None: zero-cost
    reason: str = ""  # why a zero-cost op is free

    @property
    def zero_cost(self) -> bool:
        return self.fn is None

    @property
    def equation(self) -> str:
        """First paragraph of the formula's docstring (the equation), or the zero-cost reason."""
        if self.fn is None:
            return f"0 ({self.reason})"
        doc = (self.fn.__doc__ or "").strip()
        return " ".join(doc.split("\n\n", 1)[0].split())


@dataclass(frozen=True)
class Operator:
    """Everything registered for one ``(domain, op_type)``; a part not registered is None (or empty)."""

    domain: str
    op_type: str
    rule: Rule | None = None  #: the forward rule: a formula or a zero-cost reason
    quantized: Collection[int] | None = None  #: a quantized operator's data input positions
    shape: Callable[..., tuple] | None = None  #: output types where ONNX's inference does not know the operator
    backward: Callable[..., Cost] | None = None  #: the backward formula
    buffers: frozenset[int] = field(default_factory=frozenset)  #: inputs never trained
    straight_through: bool = False  #: integer outputs that still carry a gradient
    saved: Callable[..., Saved] | None = None  #: what the backward keeps


_OPERATORS: dict[tuple[str, str], Operator] = {}
OPERATORS: Mapping[tuple[str, str], Operator] = MappingProxyType(_OPERATORS)


class _Part(Mapping):
    """A read-only view of one part of the registered operators: key → that part, for those that have it."""

    def __init__(self, part: str) -> None:
        self._part = part

    def __getitem__(self, key: tuple[str, str]) -> Any:
        value = getattr(_OPERATORS[key], self._part) if key in _OPERATORS else None
        if value is None:
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return (key for key, op in _OPERATORS.items() if getattr(op, self._part) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)


RULES: Mapping[tuple[str, str], Rule] = _Part("rule")
BACKWARD: Mapping[tuple[str, str], Callable[..., Cost]] = _Part("backward")
SAVED: Mapping[tuple[str, str], Callable[..., Saved]] = _Part("saved")


def _key(domain: str, op_type: str) -> tuple[str, str]:
    return DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain, op_type


def _register(domain: str, op_type: str, part: str, what: str, already: Callable[[Operator], str] | None = None,
              **parts: Any) -> None:
    """Set ``parts`` of the entry of ``(domain, op_type)``; ``part`` must not be set yet (``what`` names it)."""
    key = _key(domain, op_type)
    entry = _OPERATORS.get(key) or Operator(*key)
    if getattr(entry, part) is not None:
        detail = already(entry) if already else ""
        raise RegistryError(f"{what} of {op_type!r} ({key[0] or 'ai.onnx'}) is registered twice{detail}")
    _OPERATORS[key] = replace(entry, **parts)


def _add(rule: Rule) -> None:
    _register(rule.domain, rule.op_type, "rule", "operator", lambda e: f" (family {e.rule.family!r} and {rule.family!r})",
              rule=rule)


def formula(*op_types: str, family: str, domain: str = DEFAULT_DOMAIN, quantized: Collection[int] | None = None):
    """Register the decorated function as the cost formula of ``op_types``.

    ``quantized`` (quantized operators): the input positions that hold data (a quantized operand, an
    int32 or float bias), as opposed to the scales and zero points that describe them. A stored
    tensor at a data position is a parameter however ONNX's schema marks it; scales and zero points
    never are (see :mod:`flopcount.pipeline.parameters`).
    """

    def register(fn: Callable[..., Cost]) -> Callable[..., Cost]:
        for op_type in op_types:
            _add(Rule(canonical_domain(domain), op_type, family, fn))
            if quantized is not None:
                _OPERATORS[_key(domain, op_type)] = replace(_OPERATORS[_key(domain, op_type)], quantized=quantized)
        return fn

    return register


def zero_cost(*op_types: str, family: str, reason: str, domain: str = DEFAULT_DOMAIN) -> None:
    """Declare ``op_types`` deliberately free of arithmetic, with the reason."""
    for op_type in op_types:
        _add(Rule(canonical_domain(domain), op_type, family, None, reason))


def quantized_data(domain: str, op_type: str) -> Collection[int] | None:
    """The data input positions of a quantized operator (see :func:`formula`); None for other operators."""
    entry = _OPERATORS.get(_key(domain, op_type))
    return entry.quantized if entry is not None else None


def lookup(domain: str, op_type: str) -> Rule | None:
    entry = _OPERATORS.get(_key(domain, op_type))
    return entry.rule if entry is not None else None


# --------------------------------------------------------------------------------------------
# output types of operators that ONNX's shape inference does not know (other domains)


def shape_function(*op_types: str, domain: str):
    """Register the decorated function as the output-type rule of ``op_types``, operators of another
    domain that ONNX's inference does not know: ``rule(inputs, **attributes)`` gets the inputs'
    :class:`~flopcount.context.TensorInfo` (None where omitted or unknown) and returns one
    ``(elem_type, shape)`` per output (None where it cannot tell), or raises ``ValueError``.
    :func:`flopcount.pipeline.shapes.resolve` applies it and lets ONNX's inference carry on downstream."""

    def register(fn: Callable[..., tuple]) -> Callable[..., tuple]:
        for op_type in op_types:
            _register(domain, op_type, "shape", "shape function", shape=fn)
        return fn

    return register


def lookup_shape(domain: str, op_type: str) -> Callable[..., tuple] | None:
    entry = _OPERATORS.get(_key(domain, op_type))
    return entry.shape if entry is not None else None


# --------------------------------------------------------------------------------------------
# backward (training) formulas


def backward(*op_types: str, domain: str = DEFAULT_DOMAIN, buffers: tuple[int, ...] = (),
             straight_through: bool = False):
    """Register the decorated function as the backward formula of ``op_types``: the cost of the
    gradients of the inputs that need one (``ctx.needs_grad(i)``), given the output gradients.

    ``buffers`` lists input positions that are never trained though a schema calls them
    differentiable, or (for operators without an ONNX schema) says nothing: state updated in
    training (BatchNormalization's running mean and variance), fixed tables (rotary cos/sin caches)
    and settings (a dropout ratio). A float initializer there is not a parameter and gets no gradient.

    ``straight_through``: the op's integer outputs still carry a gradient (fake quantization in
    quantization-aware training); other ops whose outputs are all integers pass none back.
    """

    def register(fn: Callable[..., Cost]) -> Callable[..., Cost]:
        for op_type in op_types:
            _register(domain, op_type, "backward", "backward formula", backward=fn, buffers=frozenset(buffers),
                      straight_through=straight_through)
        return fn

    return register


def straight_through(domain: str, op_type: str) -> bool:
    """Whether the op's integer outputs carry a gradient (see :func:`backward`)."""
    entry = _OPERATORS.get(_key(domain, op_type))
    return entry is not None and entry.straight_through


def buffer_inputs(domain: str, op_type: str) -> frozenset[int]:
    entry = _OPERATORS.get(_key(domain, op_type))
    return entry.buffers if entry is not None else frozenset()


def lookup_backward(domain: str, op_type: str) -> Callable[..., Cost] | None:
    entry = _OPERATORS.get(_key(domain, op_type))
    return entry.backward if entry is not None else None


# --------------------------------------------------------------------------------------------
# saved-for-backward rules (flopcount.saved, flopcount.memory.ledger)


def saves(*op_types: str, domain: str = DEFAULT_DOMAIN):
    """Register the decorated function as the saved-for-backward rule of ``op_types``:
    ``rule(ctx, **attributes) -> Saved``, what the op's backward keeps from its forward (see
    :mod:`flopcount.saved`). An operator without one is listed by the memory ledger, never taken to keep
    nothing."""

    def register(fn: Callable[..., Saved]) -> Callable[..., Saved]:
        for op_type in op_types:
            _register(domain, op_type, "saved", "saved-for-backward rule", saved=fn)
        return fn

    return register


def saves_nothing(*op_types: str, domain: str = DEFAULT_DOMAIN) -> None:
    """Declare that the backward of ``op_types`` needs only shapes (Add, Reshape, Concat, ReduceSum ...)."""
    saves(*op_types, domain=domain)(_nothing)


def _nothing(ctx: Any, **_: Any) -> Saved:
    """Nothing: the backward needs only shapes."""
    return NOTHING


def lookup_saved(domain: str, op_type: str) -> Callable[..., Saved] | None:
    entry = _OPERATORS.get(_key(domain, op_type))
    return entry.saved if entry is not None else None
