"""A sequence of repeated items held once: ``head``, then ``copies`` renamed copies of ``block``, then ``tail``.

The report of a stack of L identical layers (:func:`flopcount.derived.extension.extend`) holds its nodes and their module
scopes this way: the nodes of the 2-layer graph, with those of its second layer copied for layers 2 … L − 1. A
copy is made when it is read (indexing, slicing, iteration), so a report of 10**9 layers takes the memory of
2, and every figure that sums over the nodes sums the block once and multiplies (:func:`weighted`).

A listing of every node (``--per-node``, the HTML node table, a by-module depth that names each layer) reads each
copy; above :data:`MAX_LISTED_NODES` it is refused in one line (:func:`check_listable`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ..errors import UsageError

__all__ = ["MAX_LISTED_NODES", "Tiled", "TiledMapping", "check_listable", "distinct", "weighted"]

#: The most nodes a listing of every node (or of every layer's module) reads from a repeated stack: a million
#: rows is already more than a reader reads, and takes seconds to print.
MAX_LISTED_NODES = 1_000_000


class Tiled(Sequence):
    """``head + block·copies + tail`` as an immutable sequence: item ``i`` of copy ``t`` (1 … ``copies``) is
    ``make(block[i], i, t)``; every item read at position ``p`` is passed through ``place(item, p)`` (which may
    return it unchanged)."""

    __slots__ = ("head", "block", "copies", "tail", "_make", "_place", "_items")

    def __init__(self, head: Sequence, block: Sequence, copies: int, tail: Sequence,
                 make: Callable[[Any, int, int], Any], place: Callable[[Any, int], Any] | None = None):
        self.head, self.block, self.copies, self.tail = tuple(head), tuple(block), int(copies), tuple(tail)
        self._make = make
        self._place = place or (lambda item, _p: item)
        self._items: tuple | None = None

    def listed(self, flag: str) -> "Tiled":
        """The same sequence with every item made once, now (refused as :func:`check_listable` refuses, naming
        ``flag``, what asked for it): reading it again makes no copy, as a tuple of its items would not, while it
        stays a :class:`Tiled` (what a reader of its structure, the head, block and tail, reads)."""
        check_listable(self, flag, "nodes")
        out = Tiled(self.head, self.block, self.copies, self.tail, self._make, self._place)
        out._items = tuple(self)
        return out

    def __len__(self) -> int:
        return len(self.head) + len(self.block) * self.copies + len(self.tail)

    def __getitem__(self, i):
        if self._items is not None:
            return self._items[i]
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        n = len(self)
        if not isinstance(i, int) or isinstance(i, bool):
            raise TypeError(f"Tiled indices must be integers or slices, not {type(i).__name__}")
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("Tiled index out of range")
        h, b = len(self.head), len(self.block)
        if i < h:
            item = self.head[i]
        elif i < h + b * self.copies:
            t, j = divmod(i - h, b)
            item = self._make(self.block[j], j, t + 1)
        else:
            item = self.tail[i - h - b * self.copies]
        return self._place(item, i)

    def __iter__(self) -> Iterator:
        if self._items is not None:
            yield from self._items
            return
        p = 0
        for item in self.head:
            yield self._place(item, p)
            p += 1
        for t in range(1, self.copies + 1):
            for j, item in enumerate(self.block):
                yield self._place(self._make(item, j, t), p)
                p += 1
        for item in self.tail:
            yield self._place(item, p)
            p += 1

    def block_position(self, p: int) -> int | None:
        """The position in ``block`` of the item that position ``p`` (0 … len − 1) is a copy of; None for a position
        of the head or the tail.

        >>> t = Tiled(("h",), ("x", "y"), 3, ("t",), lambda item, j, c: f"{item}{c}")
        >>> [t.block_position(p) for p in range(len(t))]
        [None, 0, 1, 0, 1, 0, 1, None]
        """
        h, b = len(self.head), len(self.block)
        return (p - h) % b if b and h <= p < h + b * self.copies else None

    def copy(self, t: int) -> tuple:
        """Copy ``t`` (1 … ``copies``) of the block, unplaced."""
        return tuple(self._make(item, j, t) for j, item in enumerate(self.block))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Tiled):
            return (self.head, self.block, self.copies, self.tail) == (other.head, other.block, other.copies,
                                                                       other.tail) and self.copy(1) == other.copy(1)
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(other) == len(self) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Tiled({len(self.head)} head, {len(self.block)} × {self.copies:,} copies, {len(self.tail)} tail: "
                f"{len(self):,} items)")


class TiledMapping(Mapping):
    """``base`` and ``copies`` renamed copies of ``block`` (a mapping): key ``k`` of copy ``t`` is
    ``rename(k, t)``, its value unchanged. Iterates every copy; :func:`weighted` reads it once per key."""

    __slots__ = ("base", "block", "copies", "_rename", "_keys")

    def __init__(self, base: Mapping, block: Mapping, copies: int, rename: Callable[[Any, int], Any]):
        self.base, self.block, self.copies, self._rename = dict(base), dict(block), int(copies), rename
        self._keys: dict | None = None

    def __len__(self) -> int:
        return len(self.base) + len(self.block) * self.copies

    def __iter__(self) -> Iterator:
        yield from self.base
        for t in range(1, self.copies + 1):
            for key in self.block:
                yield self._rename(key, t)

    def __getitem__(self, key):
        if key in self.base:
            return self.base[key]
        for t in range(1, self.copies + 1) if self.copies * len(self.block) <= MAX_LISTED_NODES else ():
            for k, v in self.block.items():
                if self._rename(k, t) == key:
                    return v
        raise KeyError(key)

    def __repr__(self) -> str:
        return f"TiledMapping({len(self.base)} base, {len(self.block)} × {self.copies:,} copies)"


def weighted(items: Iterable) -> Iterator[tuple[Any, int]]:
    """``(item, times)`` pairs whose multiset is ``items``: a :class:`Tiled` sequence gives its head and tail once
    and its block's first copy (unplaced) ``copies`` times; anything else gives each item once. For sums that do
    not depend on names."""
    if isinstance(items, Tiled):
        for item in items.head:
            yield item, 1
        if items.copies:
            for item in items.copy(1):
                yield item, items.copies
        for item in items.tail:
            yield item, 1
    else:
        for item in items:
            yield item, 1


def distinct(items: Iterable) -> set:
    """The distinct items of ``items``, with a :class:`Tiled` sequence's block read in its first copy only (for
    questions that renaming does not change, such as the lengths of scope chains)."""
    return {item for item, _ in weighted(items)}


def check_listable(items: Sequence, flag: str, what: str = "nodes") -> None:
    """:class:`UsageError` naming ``flag`` where ``items`` is a repeated stack too long to list."""
    if isinstance(items, Tiled) and len(items) > MAX_LISTED_NODES:
        raise UsageError(f"{flag}: the report holds {len(items):,} {what} ({items.copies:,} copies of a repeated "
                         f"block of layers), above the limit of {MAX_LISTED_NODES:,} a listing reads; leave out "
                         f"{flag}, or count fewer layers")
