"""A device's memory as the user gives it: ``80GiB``, ``94GB``, ``1.5TiB`` or a number of bytes.

Binary units (KiB, MiB, GiB, TiB) are powers of 1,024; decimal units (kB, MB, GB, TB) powers of 1,000, as the SI
and IEC prefixes say. The size is a whole number of bytes, at least one and at most 2**60 (an exabyte: more than
any device holds, and a bound that keeps the arithmetic exact).

>>> parse_size("80GiB"), parse_size("94 GB"), parse_size("1.5TiB"), parse_size(4096)
(85899345920, 94000000000, 1649267441664, 4096)
>>> gib(85899345920)
'80.0 GiB'
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import UsageError

__all__ = ["UNITS", "gib", "parse_size", "size_text", "unit_of"]

#: Unit (lower case) → bytes.
UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}

_SPELLED = ("kB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB")
_MOST = 2**60
_SIZE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)")


def parse_size(value: Any, what: str = "device memory") -> int:
    """``value`` (a positive int of bytes, or text: a number and a unit of :data:`UNITS`) in bytes; anything else
    is a :class:`~flopcount.errors.UsageError` naming ``what``."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and value.isascii() and (m := _SIZE.fullmatch(value.strip())) \
            and m.group(2).lower() in UNITS | {"": 1}:
        exact = float(m.group(1)) * UNITS.get(m.group(2).lower(), 1)
        size = math.floor(exact) if exact <= _MOST else _MOST + 1
    else:
        raise UsageError(f"{what} {value!r}: give a size such as 80GiB, 94GB or a number of bytes (units: "
                         f"{', '.join(_SPELLED)})")
    if not 1 <= size <= _MOST:
        raise UsageError(f"{what} {value!r}: a size of 1 byte to 2**60 bytes")
    return size


def gib(n: int) -> str:
    """``n`` bytes in GiB, one decimal."""
    return f"{n / 2**30:,.1f} GiB"


#: The binary units a figure is shown in, largest first.
_SHOWN = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def unit_of(n: int) -> tuple[str, int]:
    """The binary unit (name, bytes) ``n`` bytes are shown in: the largest, up to GiB, of which ``n`` is at least
    one; bytes below a KiB.

    >>> unit_of(127 * 2**30), unit_of(3 * 2**20 + 1), unit_of(1000)
    (('GiB', 1073741824), ('MiB', 1048576), ('B', 1))
    """
    return next(((name, f) for name, f in _SHOWN if abs(n) >= f), ("B", 1))


def size_text(n: int, unit: tuple[str, int] | None = None) -> str:
    """``n`` bytes with one decimal in ``unit`` (:func:`unit_of` when None).

    >>> size_text(136365211648), size_text(2**20, ("GiB", 2**30)), size_text(512)
    ('127.0 GiB', '0.0 GiB', '512 B')
    """
    name, f = unit or unit_of(n)
    return f"{n:,} B" if f == 1 else f"{n / f:,.1f} {name}"
