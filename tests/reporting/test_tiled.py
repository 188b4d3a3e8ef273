"""A sequence of repeated items held once (flopcount.reporting.tiled): it reads as the list written out in full."""

from __future__ import annotations

from collections import Counter

import pytest

from flopcount.errors import UsageError
from flopcount.reporting.tiled import MAX_LISTED_NODES, Tiled, TiledMapping, check_listable, distinct, weighted


def make(item: str, j: int, t: int) -> str:
    return f"{item}@{t}"


def written_out(head, block, copies, tail) -> list:
    return [*head, *(f"{x}@{t}" for t in range(1, copies + 1) for x in block), *tail]


CASES = [
    pytest.param(("a", "b"), ("x", "y", "z"), 4, ("c",), id="head-block-tail"),
    pytest.param((), ("x",), 7, (), id="block-only"),
    pytest.param(("a",), ("x", "y"), 0, ("c", "d"), id="no-copies"),
]


@pytest.mark.parametrize("head, block, copies, tail", CASES)
def test_a_listed_copy_reads_the_same_and_makes_no_copy_again(head, block, copies, tail):
    made = []

    def counted(item: str, j: int, t: int) -> str:
        made.append(item)
        return make(item, j, t)

    full = written_out(head, block, copies, tail)
    listed = Tiled(head, block, copies, tail, counted).listed("plan")
    assert len(made) == len(block) * copies  # each copy made once, now
    assert isinstance(listed, Tiled) and (listed.head, listed.block, listed.copies) == (head, block, copies)
    assert list(listed) == full and [listed[i] for i in range(-len(full), len(full))] == full + full
    assert listed[1:-1] == tuple(full[1:-1]) and len(listed) == len(full)
    assert len(made) == len(block) * copies  # read again: nothing made
    with pytest.raises(IndexError):
        listed[len(full)]


def test_a_stack_too_long_to_list_is_not_listed():
    with pytest.raises(UsageError, match="^--per-node: .* above the limit"):
        Tiled(("a",), ("x",), MAX_LISTED_NODES, (), make).listed("--per-node")


@pytest.mark.parametrize("head, block, copies, tail", CASES)
def test_reads_as_the_list_written_out(head, block, copies, tail):
    tiled, full = Tiled(head, block, copies, tail, make), written_out(head, block, copies, tail)
    assert len(tiled) == len(full) == len(head) + len(block) * copies + len(tail)
    assert list(tiled) == full and tiled == full and tiled == tuple(full)
    assert [tiled[i] for i in range(-len(full), len(full))] == full + full
    for s in (slice(None), slice(1, -1), slice(None, None, 3), slice(-4, None), slice(5, 2)):
        assert tiled[s] == tuple(full[s])
    with pytest.raises(IndexError):
        tiled[len(full)]
    folded = Counter()
    for x, times in weighted(tiled):  # the block once, ``copies`` times: the same multiset, names aside
        folded[x.split("@")[0]] += times
    assert folded == Counter(x.split("@")[0] for x in full)


def test_placed_items_know_their_position():
    tiled = Tiled(["a"], ["x", "y"], 3, ["c"], make, lambda item, p: (p, item))
    assert list(tiled) == list(enumerate(["a", "x@1", "y@1", "x@2", "y@2", "x@3", "y@3", "c"]))
    assert tiled[5] == (5, "x@3")


def test_a_billion_copies_take_no_memory_and_sum_once():
    tiled = Tiled(["a"], [1, 2, 3], 10**9, ["c"], lambda x, _j, t: x)
    assert len(tiled) == 2 + 3 * 10**9 and tiled[-2] == 3 and tiled[1 + 3 * 10**9 - 3] == 1
    assert sum(x * times for x, times in weighted(tiled) if isinstance(x, int)) == 6 * 10**9  # (1 + 2 + 3) · 10**9
    assert distinct(tiled) == {"a", 1, 2, 3, "c"}
    with pytest.raises(UsageError, match=r"^--per-node: the report holds 3,000,000,002 nodes .*above the limit of "
                                         f"{MAX_LISTED_NODES:,}"):
        check_listable(tiled, "--per-node")
    check_listable(Tiled([], [1], MAX_LISTED_NODES, [], lambda x, _j, t: x), "--per-node")  # at the limit: listed


def test_mapping_reads_as_the_dict_written_out():
    m = TiledMapping({"l.0": 5, "l.1": 7, "head": 1}, {"l.1": 7}, 3, lambda key, t: f"l.{1 + t}")
    assert dict(m) == {"l.0": 5, "l.1": 7, "head": 1, "l.2": 7, "l.3": 7, "l.4": 7}
    assert len(m) == 6 and m["l.3"] == 7 and "l.5" not in m
