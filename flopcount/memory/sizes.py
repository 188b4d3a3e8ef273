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

__all__ = ["UNITS", "gib", "parse_size"]

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
