"""The cost record every formula returns.

Units are in the field names: ``flops`` are floating-point operations (one multiply-accumulate
is two), ``macs`` are multiply-accumulates of products (a subset of the work, never added to
``flops`` a second time), ``transcendentals`` count exp/log/sqrt/tanh/erf-like evaluations
(each also counted as one FLOP), ``int_ops`` count integer and boolean arithmetic, which is
never counted as FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class Cost(NamedTuple):
    """Work of one node or of a sum of nodes (immutable; a tuple, so that the hundreds of thousands
    a large graph creates are cheap).

    >>> Cost(flops=4, macs=2) + Cost(flops=1)
    Cost(flops=5, macs=2, transcendentals=0, int_ops=0)
    >>> 3 * Cost(flops=2)
    Cost(flops=6, macs=0, transcendentals=0, int_ops=0)
    """

    flops: int = 0
    macs: int = 0
    transcendentals: int = 0
    int_ops: int = 0

    def __add__(self, other: "Cost") -> "Cost":  # type: ignore[override]
        if not isinstance(other, Cost):
            return NotImplemented
        return Cost(
            self[0] + other[0],
            self[1] + other[1],
            self[2] + other[2],
            self[3] + other[3],
        )

    def __mul__(self, k: int) -> "Cost":  # type: ignore[override]
        if not isinstance(k, int):
            return NotImplemented
        return Cost(self[0] * k, self[1] * k, self[2] * k, self[3] * k)

    __rmul__ = __mul__

    def per(self, n: int) -> "Cost":
        """The cost divided by ``n`` (per sample), as exact integers where they divide, else floats."""

        def div(v: int) -> int | float:
            q, r = divmod(v, n)
            return q if r == 0 else v / n

        return Cost(div(self.flops), div(self.macs), div(self.transcendentals), div(self.int_ops))

    def as_dict(self) -> dict[str, int | float]:
        return {
            "flops": self.flops,
            "macs": self.macs,
            "transcendentals": self.transcendentals,
            "int_ops": self.int_ops,
        }


ZERO = Cost()


@dataclass(frozen=True, slots=True)
class Breakdown:
    """What a formula returns when its node's cost has named parts worth reporting (If branches,
    a Loop body per iteration): the node's ``total`` and the ``parts`` behind it."""

    total: Cost
    parts: tuple[tuple[str, Cost], ...]


@dataclass(frozen=True, slots=True)
class Bound:
    """What a formula returns when its count is an upper bound because the real work depends on
    data (NonMaxSuppression, TopK, an If whose condition is computed at run time): the bounding
    cost (a :class:`Cost` or :class:`Breakdown`) and why, which every report lists."""

    total: "Cost | Breakdown"
    why: str
