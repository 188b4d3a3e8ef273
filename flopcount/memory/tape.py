"""A liveness walk's record apart from the sizes: what it adds and frees between two of its marks, by name, so that
a rank's next walk of the same nodes sums its own sizes without deciding again what lives and dies.

The backward walk (:func:`flopcount.memory.ledger.ledger`) decides from the graph's structure alone which tensors,
gradients and statistics are alive at each node; only their bytes differ between ranks of the same stage. Recorded
once on a :class:`Tape`, it is replayed on each rank's sizes (:meth:`Tape.replay`): between two marks only the
sum of what was added and freed matters, since the peak is read at the marks alone, so the replay gives the same
live bytes at every mark, the same peak and the same place, as the walk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

__all__ = ["Tape", "Walk"]


@dataclass
class Walk:
    """The running tally of a liveness walk: the bytes alive, and the most alive at a mark so far, with its
    phase and node."""

    live: int = 0
    peak: int = 0
    phase: str = "forward"
    node: str = ""

    def add(self, nbytes: int) -> None:
        self.live += nbytes

    def mark(self, phase: str, node: str) -> None:
        if self.live > self.peak:
            self.peak, self.phase, self.node = self.live, phase, node


class Tape:
    """Per stretch between marks: the names whose bytes are added and freed, the parameters whose gradient is
    made (a rank's gradient share), the node indices whose statistics are added and freed, and the node the
    stretch ends at (None: the end of the walk, no mark). ``touched``: names whose size the walk read without
    adding them (read again on replay, so an unknown size is reported alike)."""

    def __init__(self, phase: str):
        self.phase = phase
        self.stretches: list[tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[int, ...],
                                   tuple[int, ...], str | None]] = []
        self.touched: set[str] = set()
        self._open()

    def _open(self) -> None:
        self._plus: list[str] = []
        self._minus: list[str] = []
        self._grads: list[str] = []
        self._extra: list[int] = []
        self._freed: list[int] = []

    def add(self, name: str, sign: int = 1) -> None:
        (self._plus if sign > 0 else self._minus).append(name)

    def grad(self, param: str) -> None:
        self._grads.append(param)

    def extra(self, node: int, sign: int = 1) -> None:
        (self._extra if sign > 0 else self._freed).append(node)

    def mark(self, node: str | None) -> None:
        self.stretches.append((tuple(self._plus), tuple(self._minus), tuple(self._grads), tuple(self._extra),
                               tuple(self._freed), node))
        self._open()

    def replay(self, w: Walk, nbytes: Callable[[str], int], grad_size: Callable[[str], int],
               extra: Mapping[int, int]) -> None:
        """Walk again on these sizes: ``nbytes`` of a name, ``grad_size`` of a parameter's gradient, ``extra``
        node index → its statistics' bytes."""
        for name in self.touched:
            nbytes(name)
        for plus, minus, grads, more, freed, node in self.stretches:
            w.live += sum(map(nbytes, plus)) - sum(map(nbytes, minus)) + sum(map(grad_size, grads)) + \
                sum(extra[k] for k in more) - sum(extra[k] for k in freed)
            if node is not None:
                w.mark(self.phase, node)
