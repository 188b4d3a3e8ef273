"""A calibrated profile records how calibrate timed it (``machine.method``): a prediction from one taken by an
earlier calibrate, whose figures under the same keys were timed otherwise, says so in one note, naming what each
later method changed; one of this calibrate's says nothing of it."""

from __future__ import annotations

import dataclasses
import math

from helpers import model, weight
from onnx import helper

from flopcount.measure.machine.calibration import CALIBRATION_METHOD, Collective, MachineProfile, Point, Segment
from flopcount.measure.predict import predict_work, work_of


def _profile(machine: dict) -> MachineProfile:
    seg = Segment(0, math.inf, {"median": 0.0, "best": 0.0}, {"median": 1e9, "best": 1e9})
    flat = (Point(1, 1e9, 1e9, 1e9),)
    return MachineProfile(True, "cpu", 1, {"gemm": flat, "elementwise": flat},
                          {"forward": Point(1, 1e-6, 1e-6, 1e-6), "backward": Point(1, 1e-6, 1e-6, 1e-6)},
                          {"all_reduce": Collective(0, (), (seg,))}, 1e9, machine=machine)


def _work():
    import flopcount

    report = flopcount.count(model([helper.make_node("Mul", ["x", "w"], ["y"])], {"x": (4, 8)}, ["y"],
                                   [weight("w", (8,))]), mode="train")
    return work_of(report)


def _said(p: MachineProfile) -> list[str]:
    return [n for n in predict_work(_work(), p).notes if "earlier flopcount calibrate" in n]


def test_a_profile_of_an_earlier_calibrate_is_said_so_once():
    old = _said(_profile({"cores": 2}))  # no method: taken before calibrate recorded one
    assert len(old) == 1 and f"method 1, this one {CALIBRATION_METHOD}" in old[0] and "calibrate again" in old[0]
    assert len(_said(_profile({"cores": 2, "method": CALIBRATION_METHOD - 1}))) == 1


def test_the_note_names_what_each_later_method_changed_and_no_earlier_one():
    """A method-1 profile's note names the barrier (method 2) and the size ranges (method 3); a method-2 one's only
    the size ranges."""
    one = _said(_profile({"cores": 2}))[0]
    two = _said(_profile({"cores": 2, "method": 2}))[0]
    assert "barrier" in one and "three (up to 64 KiB, up to 1 MiB, and above)" in one
    assert "barrier" not in two and "512 KiB" in two and "method 2, this one 3" in two


def test_a_profile_of_this_calibrate_or_a_datasheet_says_nothing_of_it():
    assert _said(_profile({"cores": 2, "method": CALIBRATION_METHOD})) == []
    assert _said(dataclasses.replace(_profile({}), calibrated=False)) == []


def test_every_method_after_the_first_says_what_it_changed():
    from flopcount.measure.machine.calibration import METHOD_CHANGES

    assert sorted(METHOD_CHANGES) == list(range(2, CALIBRATION_METHOD + 1))
    assert all(text.strip() for text in METHOD_CHANGES.values())
