"""A liveness walk's record apart from the sizes: what it adds and frees between two of its marks, by name, so that
a rank's next walk of the same nodes sums its own sizes without deciding again what lives and dies.

The backward walk (:func:`flopcount.memory.ledger.ledger`) decides from the graph's structure alone which tensors,
gradients and statistics are alive at each node; only their bytes differ between ranks of the same stage. Recorded
once on a :class:`Tape`, it is replayed on each rank's sizes (:meth:`Tape.replay`): between two marks only the
sum of what was added and freed matters, since the peak is read at the marks alone, so the replay gives the same
live bytes at every mark, the same peak and the same place, as the walk. The running sums are numpy's 64-bit
integers where none can reach 2**62 (every size at least 0, the largest times the terms at most below it: the same
integers as Python's), Python's integers otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Mapping, NamedTuple

__all__ = ["Replayed", "Tape", "Walk"]

#: Running sums below this bound are exact in 64-bit integers, with room to spare (:meth:`Tape._summed`).
_EXACT_INT64 = 1 << 62


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


class Replayed(NamedTuple):
    """A tape's walk from no bytes alive: the most alive at a mark (None without marks), its phase and its first
    node, and the bytes alive at the end. The walk from any start is this one moved by the start, the same
    integers added: the most at a mark and where it first is, and the end, move by the start alone."""

    top: int | None
    phase: str
    node: str
    end: int

    def apply(self, w: Walk) -> None:
        """The walk from ``w``'s bytes alive: its peak if more than ``w``'s peak, the bytes alive at its end."""
        start = w.live
        if self.top is not None and start + self.top > w.peak:
            w.peak, w.phase, w.node = start + self.top, self.phase, self.node
        w.live = start + self.end


class Tape:
    """The walk's terms (a name's bytes, a parameter's gradient share, a node's statistics: ``terms``, each read
    once on replay, so a name of unknown size is reported alike) and, per stretch between marks, the indexes of
    the terms it adds and of those it frees, and the nodes of the marks, in order (the last stretch runs to the
    walk's end, unmarked)."""

    def __init__(self, phase: str):
        self.phase = phase
        self.terms: list[tuple[str, str | int]] = []
        self.stretches: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        self.nodes: list[str] = []
        self._index: dict[tuple[str, str | int], int] = {}
        self._plus: list[int] = []
        self._minus: list[int] = []
        self._flat: _Flat | None = None

    def term(self, kind: str, key: str | int) -> int:
        """The index of the term: ``kind`` "bytes" of a name, "grad" of a parameter, "extra" of a node index."""
        i = self._index.get((kind, key))
        if i is None:
            i = self._index[(kind, key)] = len(self.terms)
            self.terms.append((kind, key))
            self._flat = None
        return i

    def add(self, name: str, sign: int = 1) -> None:
        i = self._index.get(("bytes", name))
        (self._plus if sign > 0 else self._minus).append(self.term("bytes", name) if i is None else i)

    def grad(self, param: str) -> None:
        self._plus.append(self.term("grad", param))

    def extra(self, node: int, sign: int = 1) -> None:
        i = self._index.get(("extra", node))
        (self._plus if sign > 0 else self._minus).append(self.term("extra", node) if i is None else i)

    def mark(self, node: str | None) -> None:
        """End the stretch at a mark at ``node`` (None: the walk's end)."""
        self.stretches.append((tuple(self._plus), tuple(self._minus)))
        self._plus, self._minus = [], []
        self._flat = None
        if node is not None:
            self.nodes.append(node)

    def replay(self, w: Walk, nbytes: Callable[[str], int], grad_size: Callable[[str], int],
               extra: Mapping[int, int]) -> None:
        """Walk again on these sizes: ``nbytes`` of a name, ``grad_size`` of a parameter's gradient, ``extra``
        node index → its statistics' bytes. The peak is the walk's: the most alive at a mark if more than
        ``w``'s peak, at the first mark it is reached (:meth:`replayed` applied to ``w``)."""
        self.replayed(nbytes, grad_size, extra).apply(w)

    def replayed(self, nbytes: Callable[[str], int], grad_size: Callable[[str], int],
                 extra: Mapping[int, int], known: Mapping[str, int | None] | None = None) -> "Replayed":
        """The walk on these sizes from no bytes alive (see :meth:`replay`), as :class:`Replayed`: the bytes
        alive after each stretch are what every stretch up to it added, less what they freed (:class:`_Flat`'s
        running sums): integers, so the same as stretch by stretch (:meth:`replay_stepwise`). ``known``: names
        whose ``nbytes`` is already known (read from it; ``nbytes`` asked of the others and of a None there)."""
        flat = self._flat or self._flattened()
        if known is None:
            values = list(map(nbytes, flat.keys[0]))
        else:
            values = list(map(known.get, flat.keys[0]))
            if None in values:
                values = [nbytes(name) if b is None else b for name, b in zip(flat.keys[0], values)]
        values += map(grad_size, flat.keys[1])
        values += map(extra.__getitem__, flat.keys[2])
        if values and self.nodes and min(values) >= 0 and \
                max(values) * max(len(flat.plus), len(flat.minus)) < _EXACT_INT64:
            return self._summed(flat, values)
        added = list(accumulate(map(values.__getitem__, flat.plus), initial=0))
        freed = list(accumulate(map(values.__getitem__, flat.minus), initial=0))
        marked = [added[a] - freed[b] for a, b in zip(flat.plus_ends[:len(self.nodes)],
                                                      flat.minus_ends[:len(self.nodes)])]
        top = max(marked, default=None)
        node = self.nodes[marked.index(top)] if marked else ""
        return Replayed(top, self.phase, node, added[-1] - freed[-1])

    def _summed(self, flat: "_Flat", values: list[int]) -> "Replayed":
        """:meth:`replayed`'s running sums in 64-bit integers (numpy), where no sum can reach 2**62 (every value
        at least 0 and the largest times the terms below it): the same integers, the first mark of the most."""
        import numpy as np

        plus, minus, plus_ends, minus_ends = flat.arrays
        v = np.array(values, dtype=np.int64)
        added = np.zeros(len(plus) + 1, dtype=np.int64)
        freed = np.zeros(len(minus) + 1, dtype=np.int64)
        np.cumsum(v[plus], out=added[1:])
        np.cumsum(v[minus], out=freed[1:])
        marked = added[plus_ends] - freed[minus_ends]
        at = int(marked.argmax())  # the first of the most
        return Replayed(int(marked[at]), self.phase, self.nodes[at], int(added[-1]) - int(freed[-1]))

    def replay_stepwise(self, w: Walk, nbytes: Callable[[str], int], grad_size: Callable[[str], int],
                        extra: Mapping[int, int]) -> None:
        """:meth:`replay` stretch by stretch: each stretch's sum added to the bytes alive in turn (the reference
        :meth:`replay` is checked against)."""
        of = {"bytes": nbytes, "grad": grad_size, "extra": extra.__getitem__}
        get = [of[kind](key) for kind, key in self.terms].__getitem__
        lives = list(accumulate((sum(map(get, plus)) - sum(map(get, minus)) for plus, minus in self.stretches),
                                initial=w.live))
        marked = lives[1:len(self.nodes) + 1]
        top = max(marked, default=w.peak)
        if top > w.peak:
            w.peak, w.phase, w.node = top, self.phase, self.nodes[marked.index(top)]
        w.live = lives[-1]

    def _flattened(self) -> "_Flat":
        """The record as :class:`_Flat` (found at the first replay; a term or mark after it finds it again)."""
        kinds = ("bytes", "grad", "extra")
        order = sorted(range(len(self.terms)), key=lambda i: kinds.index(self.terms[i][0]))  # stable: by kind
        place = [0] * len(self.terms)
        for new, old in enumerate(order):
            place[old] = new
        keys = tuple([self.terms[i][1] for i in order if self.terms[i][0] == kind] for kind in kinds)
        plus: list[int] = []
        minus: list[int] = []
        plus_ends: list[int] = []
        minus_ends: list[int] = []
        at = place.__getitem__
        for p, m in self.stretches:
            plus += map(at, p)
            minus += map(at, m)
            plus_ends.append(len(plus))
            minus_ends.append(len(minus))
        import numpy as np

        arrays = tuple(np.array(x, dtype=np.intp) for x in (plus, minus, plus_ends[:len(self.nodes)],
                                                            minus_ends[:len(self.nodes)]))
        self._flat = _Flat(keys, plus, minus, plus_ends, minus_ends, arrays)
        return self._flat


@dataclass(frozen=True)
class _Flat:
    """A :class:`Tape` flattened for its replay: the terms' keys by kind (bytes, grad, extra; their values listed
    in that order), every stretch's added and freed terms one after another (as places in that list), and after
    each stretch how many of each have been."""

    keys: tuple[list, list, list]
    plus: list[int]
    minus: list[int]
    plus_ends: list[int]
    minus_ends: list[int]
    arrays: tuple  # plus, minus and the marks' ends as numpy indexes (Tape._summed's)
