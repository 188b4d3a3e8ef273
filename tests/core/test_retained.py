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
    retained.arm()
    assert _report_outlives_its_name()
    first = retained._held[-1]  # the report, the last object a count hands over
    flopcount.count(_matmul_model())
    assert retained._held[-1] is not first  # the earlier count's state was let go
    assert all(obj is not first for obj in retained._held)
