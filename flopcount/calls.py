"""The arguments of :func:`flopcount.count` checked at the call: each of the wrong type or out of range is a
:class:`~flopcount.errors.UsageError` naming it, what it got and what it takes, before any work (a raw
``TypeError`` from deep inside, or a silently wrong count, otherwise).

>>> check_count_arguments(CountArguments(input_shapes={"input": (1, 3, 224, 224)}, batch=1))
>>> check_count_arguments(CountArguments(batch=1.5))
Traceback (most recent call last):
...
flopcount.errors.UsageError: count: batch must be a positive int of at most 2**48, got 1.5 (float)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import UsageError
from .limits import MAX_ELEMENTS

__all__ = ["MAX_ELEMENTS", "CountArguments", "check_count_arguments", "described"]

_EXAMPLE = '{"input": (8, 3, 224, 224)}'


def described(value: Any) -> str:
    """``value`` as an error message shows it: its repr (cut at 80 characters) and its type."""
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    return f"{text} ({type(value).__name__})"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) or type(value).__name__ in ("int64", "int32")


@dataclass(frozen=True)
class CountArguments:
    """The arguments of :func:`flopcount.count` checked at the call, as they were given (of any type: refusing the
    wrong ones is :func:`check_count_arguments`'s job)."""

    input_shapes: Any = None
    batch: Any = None
    strict: Any = False
    input_values: Any = None
    loop_trips: Any = None
    trainable_inputs: Any = None
    trainable: Any = None
    frozen: Any = None


def check_count_arguments(given: CountArguments, caller: str = "count") -> None:
    """Refuse, naming it, an argument of :func:`flopcount.count` (or of a frontend that passes it on, ``caller``) of
    the wrong type or range: ``batch`` a positive int; ``input_shapes`` a mapping of input name to a sequence of
    positive ints; ``strict`` a bool; ``input_values`` and ``loop_trips`` mappings; ``trainable_inputs``,
    ``trainable`` and ``frozen`` collections of names, not one string."""
    batch, strict = given.batch, given.strict
    if batch is not None and (not _is_int(batch) or not 0 < batch <= MAX_ELEMENTS):
        raise UsageError(f"{caller}: batch must be a positive int of at most 2**48, got {described(batch)}")
    if given.input_shapes is not None:
        _check_shapes(caller, given.input_shapes)
    if not isinstance(strict, bool):
        raise UsageError(f"{caller}: strict must be True or False, got {described(strict)}")
    for name, value, example in (("input_values", given.input_values, '{"axes": [1, 2]}'),
                                 ("loop_trips", given.loop_trips, '{"generate_loop": 32}')):
        if value is not None and not isinstance(value, Mapping):
            raise UsageError(f"{caller}: {name} must be a mapping such as {example}, got {described(value)}")
        if value is not None and not all(isinstance(k, str) for k in value):
            raise UsageError(f"{caller}: the keys of {name} must be names (str), got {described(list(value))}")
    for name in ("trainable_inputs", "trainable", "frozen"):
        value = getattr(given, name)
        if value is None:
            continue
        if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__") or isinstance(value, Mapping):
            raise UsageError(f"{caller}: {name} must be a list or other collection of initializer names "
                             f"(['embed.weight']), got {described(value)}")
        if not all(isinstance(v, str) for v in value):
            raise UsageError(f"{caller}: {name} must hold names (str), got {described(list(value))}")


def _check_shapes(caller: str, input_shapes: Any) -> None:
    if not isinstance(input_shapes, Mapping):
        raise UsageError(f"{caller}: input_shapes must be a mapping of input name to dims such as {_EXAMPLE}, "
                         f"got {described(input_shapes)}")
    for name, dims in input_shapes.items():
        if not isinstance(name, str):
            raise UsageError(f"{caller}: input_shapes names inputs by str, got the key {described(name)}")
        if isinstance(dims, (str, bytes)) or not isinstance(dims, (tuple, list)) and type(dims).__name__ != "Size":
            raise UsageError(f"{caller}: input_shapes[{name!r}] must be a tuple of dims such as (8, 3, 224, 224), "
                             f"got {described(dims)}")
        for i, d in enumerate(dims):
            if not _is_int(d) or not 0 < d <= MAX_ELEMENTS:
                raise UsageError(f"{caller}: dim {i} of input_shapes[{name!r}] must be a positive int of at most "
                                 f"2**48{described(d)}")
