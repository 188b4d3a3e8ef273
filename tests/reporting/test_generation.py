"""The arithmetic of :mod:`flopcount.reporting.generation`: the decode line from counted steps, and its sums."""

from __future__ import annotations

import pytest

from flopcount.cost import Cost
from flopcount.errors import UsageError
from flopcount.reporting.generation import DecodePiece, Generation, affine_steps, context_lengths, parse_generate, segments


def test_the_line_through_counted_steps_and_its_check():
    step = {c: Cost(flops=37 + 11 * c, macs=5 + 3 * c) for c in (8, 10, 13)}
    assert affine_steps(step) == (Cost(flops=37, macs=5), Cost(flops=11, macs=3))
    bent = {**step, 10: Cost(flops=37 + 11 * 10 + 1, macs=35)}  # a step off the line
    with pytest.raises(ValueError, match="at context 10 costs 148 FLOPs, not the 147"):
        affine_steps(bent)
    with pytest.raises(ValueError, match="not a whole multiple"):
        affine_steps({8: Cost(flops=1), 10: Cost(flops=2)})


def test_sums_equal_the_steps_one_by_one():
    g = Generation(batch=3, prompt_tokens=17, new_tokens=9, prefill=Cost(flops=1000, macs=500),
                   pieces=(DecodePiece(18, 25, Cost(flops=41, macs=20), Cost(flops=7, macs=3)),))
    brute = sum((Cost(flops=41 + 7 * c, macs=20 + 3 * c) for c in range(18, 26)), Cost())  # contexts 17+1 … 17+8
    assert g.steps == 8 and list(context_lengths(17, 9)) == list(range(18, 26))
    assert g.decode == brute
    assert g.total == Cost(flops=1000, macs=500) + brute
    assert (g.first_step.flops, g.last_step.flops) == (41 + 7 * 18, 41 + 7 * 25)
    assert g.flops_per_token == (1000 + brute.flops) / 9
    assert g.as_dict()["decode_flops_per_step"]["formula"] == "41 + 7·c"


def test_pieces_sum_each_its_own_line():
    # a window of 6 keys: the step grows with c up to 6, then stays
    pieces = (DecodePiece(3, 6, Cost(flops=100), Cost(flops=10)), DecodePiece(7, 12, Cost(flops=160), Cost()))
    g = Generation(1, 2, 11, Cost(flops=5), pieces)
    assert g.decode.flops == sum(100 + 10 * min(c, 6) for c in range(3, 13))
    assert (g.first_step.flops, g.last_step.flops) == (130, 160)
    assert g.formula() == "100 + 10·c for c in 3..6; 160 + 0·c for c in 7..12"
    assert [list(r) for r in segments(range(3, 13), [6])] == [[3, 4], [5], [6], [7], [8, 9, 10, 11, 12]]
    assert [list(r) for r in segments(range(8, 12), [3])] == [[8, 9, 10, 11]]  # a window below every context


def test_one_new_token_is_the_prefill_alone():
    g = Generation(1, 5, 1, Cost(flops=10))
    assert g.decode == Cost() and g.total == Cost(flops=10) and g.first_step is None
    assert g.as_dict()["decode_flops_per_step"]["first"] is None


@pytest.mark.parametrize("text", ["4", "a:b", "0:3", "3:0", "-1:2", ":"])
def test_bad_p_n(text):
    with pytest.raises(UsageError):
        parse_generate(text)
