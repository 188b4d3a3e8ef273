"""The one registry of operator costs, keyed by ``(domain, op_type)``.

Every operator is in exactly one of three groups:

* a **formula**: a pure function ``rule(ctx, **attributes) -> Cost`` registered with
  :func:`formula` right below its definition;
* **zero-cost**: registered with :func:`zero_cost` and a reason (layout, indexing, metadata);
* **unsupported**: anything not registered; reported in every output, fatal with ``strict``.

Registering the same ``(domain, op_type)`` twice raises :class:`~flopcount.errors.RegistryError`.
"""

from __future__ import annotations

from dataclasses import dataclass
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


_RULES: dict[tuple[str, str], Rule] = {}
RULES: Mapping[tuple[str, str], Rule] = MappingProxyType(_RULES)


def _add(rule: Rule) -> None:
    key = (rule.domain, rule.op_type)
    if key in _RULES:
        raise RegistryError(
            f"operator {rule.op_type!r} of domain {rule.domain or 'ai.onnx'!r} is registered twice "
            f"(family {_RULES[key].family!r} and {rule.family!r})"
        )
    _RULES[key] = rule


_QUANTIZED: dict[tuple[str, str], Collection[int]] = {}


def formula(*op_types: str, family: str, domain: str = DEFAULT_DOMAIN, quantized: Collection[int] | None = None):
    """Register the decorated function as the cost formula of ``op_types``.

    ``quantized`` (quantized operators): the input positions that hold data (a quantized operand, an
    int32 or float bias), as opposed to the scales and zero points that describe them. A stored
    tensor at a data position is a parameter however ONNX's schema marks it; scales and zero points
    never are (see :mod:`flopcount.parameters`).
    """

    def register(fn: Callable[..., Cost]) -> Callable[..., Cost]:
        for op_type in op_types:
            _add(Rule(canonical_domain(domain), op_type, family, fn))
            if quantized is not None:
                _QUANTIZED[(canonical_domain(domain), op_type)] = quantized
        return fn

    return register


def zero_cost(*op_types: str, family: str, reason: str, domain: str = DEFAULT_DOMAIN) -> None:
    """Declare ``op_types`` deliberately free of arithmetic, with the reason."""
    for op_type in op_types:
        _add(Rule(canonical_domain(domain), op_type, family, None, reason))


def quantized_data(domain: str, op_type: str) -> Collection[int] | None:
    """The data input positions of a quantized operator (see :func:`formula`); None for other operators."""
    return _QUANTIZED.get((canonical_domain(domain), op_type))


# --------------------------------------------------------------------------------------------
# output types of operators that ONNX's shape inference does not know (other domains)

_SHAPES: dict[tuple[str, str], Callable[..., tuple]] = {}


def shape_function(*op_types: str, domain: str):
    """Register the decorated function as the output-type rule of ``op_types``, operators of another
    domain that ONNX's inference does not know: ``rule(inputs, **attributes)`` gets the inputs'
    :class:`~flopcount.context.TensorInfo` (None where omitted or unknown) and returns one
    ``(elem_type, shape)`` per output (None where it cannot tell), or raises ``ValueError``.
    :func:`flopcount.shapes.resolve` applies it and lets ONNX's inference carry on downstream."""

    def register(fn: Callable[..., tuple]) -> Callable[..., tuple]:
        for op_type in op_types:
            key = (canonical_domain(domain), op_type)
            if key in _SHAPES:
                raise RegistryError(f"shape function of {op_type!r} ({domain}) is registered twice")
            _SHAPES[key] = fn
        return fn

    return register


def lookup_shape(domain: str, op_type: str) -> Callable[..., tuple] | None:
    return _SHAPES.get((canonical_domain(domain), op_type))


def lookup(domain: str, op_type: str) -> Rule | None:
    return _RULES.get((DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain, op_type))


# --------------------------------------------------------------------------------------------
# backward (training) formulas: a second table with the same keys

_BACKWARD: dict[tuple[str, str], Callable[..., Cost]] = {}
BACKWARD: Mapping[tuple[str, str], Callable[..., Cost]] = MappingProxyType(_BACKWARD)
_BUFFERS: dict[tuple[str, str], frozenset[int]] = {}
_STRAIGHT_THROUGH: set[tuple[str, str]] = set()


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
            key = (canonical_domain(domain), op_type)
            if key in _BACKWARD:
                raise RegistryError(f"backward formula of {op_type!r} ({domain or 'ai.onnx'}) is registered twice")
            _BACKWARD[key] = fn
            if buffers:
                _BUFFERS[key] = frozenset(buffers)
            if straight_through:
                _STRAIGHT_THROUGH.add(key)
        return fn

    return register


def straight_through(domain: str, op_type: str) -> bool:
    """Whether the op's integer outputs carry a gradient (see :func:`backward`)."""
    return (DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain, op_type) in _STRAIGHT_THROUGH


def buffer_inputs(domain: str, op_type: str) -> frozenset[int]:
    return _BUFFERS.get((DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain, op_type), frozenset())


def lookup_backward(domain: str, op_type: str) -> Callable[..., Cost] | None:
    return _BACKWARD.get((DEFAULT_DOMAIN if domain in ("", "ai.onnx") else domain, op_type))


# --------------------------------------------------------------------------------------------
# saved-for-backward rules: a third table with the same keys (flopcount.saved, flopcount.memory)

_SAVED: dict[tuple[str, str], Callable[..., Saved]] = {}
SAVED: Mapping[tuple[str, str], Callable[..., Saved]] = MappingProxyType(_SAVED)


def saves(*op_types: str, domain: str = DEFAULT_DOMAIN):
    """Register the decorated function as the saved-for-backward rule of ``op_types``:
    ``rule(ctx, **attributes) -> Saved``, what the op's backward keeps from its forward (see
    :mod:`flopcount.saved`). An operator without one is listed by the memory ledger, never taken to keep
    nothing."""

    def register(fn: Callable[..., Saved]) -> Callable[..., Saved]:
        for op_type in op_types:
            key = (canonical_domain(domain), op_type)
            if key in _SAVED:
                raise RegistryError(f"saved-for-backward rule of {op_type!r} ({domain or 'ai.onnx'}) is registered twice")
            _SAVED[key] = fn
        return fn

    return register


def saves_nothing(*op_types: str, domain: str = DEFAULT_DOMAIN) -> None:
    """Declare that the backward of ``op_types`` needs only shapes (Add, Reshape, Concat, ReduceSum ...)."""
    saves(*op_types, domain=domain)(_nothing)


def _nothing(ctx: Any, **_: Any) -> Saved:
    """Nothing: the backward needs only shapes."""
    return NOTHING


def lookup_saved(domain: str, op_type: str) -> Callable[..., Saved] | None:
    return _SAVED.get((canonical_domain(domain), op_type))
