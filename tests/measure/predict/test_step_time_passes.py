"""``benchmarks/step_time.py --passes N``: each run's figures over the passes are the medians of its passes'
figures, its errors those of the medians, the spread between passes the slowest pass's median over the fastest's,
and an interval the widest of the passes' (an end unknown in any pass is unknown). Written out for three passes."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks"))
import step_time  # noqa: E402


def _row(measured, predicted, cpu, busy, interval, fastest, slowest, load):
    return {"run": "tp2", "measured_s": measured, "predicted_s": predicted, "cpu_s": cpu, "predicted_busy_s": busy,
            "predicted_overhead_s": 0.002, "interval": interval, "fastest_s": fastest, "slowest_s": slowest,
            "error": predicted / measured - 1, "cpu_error": busy / cpu - 1, "load": load}


def test_three_passes_give_the_medians_and_the_spread_between_them():
    rows = [_row(0.20, 0.15, 0.16, 0.17, [0.15, 0.18], 0.19, 0.22, [1.0, 1.2]),
            _row(0.16, 0.17, 0.14, 0.15, [0.17, 0.20], 0.15, 0.17, [1.5, 1.7]),
            _row(0.18, 0.16, 0.15, 0.18, [0.16, 0.19], 0.17, 0.19, [0.9, 1.1])]
    got = step_time._over_passes(rows)
    assert got["measured_s"] == 0.18 and got["predicted_s"] == 0.16  # the middle of 0.16, 0.18, 0.20; 0.15, 0.16, 0.17
    assert got["error"] == pytest.approx(0.16 / 0.18 - 1)  # the medians' error, not the median of the errors
    assert got["cpu_s"] == 0.15 and got["predicted_busy_s"] == 0.17
    assert got["cpu_error"] == pytest.approx(0.17 / 0.15 - 1)
    assert got["between_passes"] == pytest.approx(0.20 / 0.16 - 1)  # 25%
    assert got["fastest_s"] == 0.15 and got["slowest_s"] == 0.22
    assert got["interval"] == [0.15, 0.20] and got["load"] == [0.9, 1.7]
    assert got["passes"] == rows


def test_an_end_unknown_in_any_pass_is_unknown_over_the_passes():
    rows = [_row(0.2, 0.2, 0.2, 0.2, [None, 0.3], 0.2, 0.2, [1, 1]),
            _row(0.2, 0.2, 0.2, 0.2, [0.1, 0.3], 0.2, 0.2, [1, 1])]
    assert step_time._over_passes(rows)["interval"] == [None, 0.3]
