"""A count's working state is held for the process's end only where the console entry point armed
flopcount.pipeline.retained (its process ends with os._exit); a count called from Python frees it as usual."""

from __future__ import annotations

import gc
import weakref

import onnx
from onnx import TensorProto, helper

import flopcount
from flopcount.pipeline import retained


def _matmul_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5]),
         helper.make_tensor_value_info("w", TensorProto.FLOAT, [5, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _report_outlives_its_name() -> bool:
    report = flopcount.count(_matmul_model())
    assert report.total.flops == 2 * 3 * 5 * 7  # the count itself is unchanged: 2·M·K·N
    ref = weakref.ref(report)
    del report
    gc.collect()
    return ref() is not None


def test_a_count_called_from_python_keeps_nothing(monkeypatch):
    monkeypatch.setattr(retained, "_held", None)
    assert not _report_outlives_its_name()


def test_an_armed_process_holds_the_last_count_only(monkeypatch):
    monkeypatch.setattr(retained, "_held", None)
    monkeypatch.setattr(retained, "_frozen", False)
    retained.arm()
    assert _report_outlives_its_name()
    first = retained._held[-1]  # the report, the last object a count hands over
    flopcount.count(_matmul_model())
    assert retained._held[-1] is not first  # the earlier count's state was let go
    assert all(obj is not first for obj in retained._held)
    gc.unfreeze()  # the rest of this test process collects as usual


class _Cycle:
    """An object in a reference cycle with itself: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_an_armed_count_freezes_what_is_alive_and_gives_it_back_at_the_next(monkeypatch):
    """The held state is moved out of the cyclic collector's reach (a full collection would rescan it while the
    report is written); the next count gives it back first, so garbage in cycles left before it is still freed."""
    monkeypatch.setattr(retained, "_held", None)
    monkeypatch.setattr(retained, "_frozen", False)
    gc.collect()
    try:
        retained.arm()
        cycle = _Cycle()
        ref = weakref.ref(cycle)
        flopcount.count(_matmul_model())  # freezes everything alive, the cycle included
        assert gc.get_freeze_count() > 0
        del cycle
        gc.collect()
        assert ref() is not None  # frozen: out of the collector's reach
        flopcount.count(_matmul_model())  # gives the earlier state back and collects before it freezes its own
        assert ref() is None
    finally:
        gc.unfreeze()  # the rest of this test process collects as usual

