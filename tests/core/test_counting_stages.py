"""The count's stages hand each other frozen records, and the report is made once from them: never built and then
patched (a training count with its memory ledger and optimizer included)."""

from __future__ import annotations

import dataclasses

from helpers import model, weight
from onnx import helper

import flopcount
from flopcount.reporting.report import Report


def _made(monkeypatch) -> list[Report]:
    """Every Report made from now on (``dataclasses.replace`` makes one too)."""
    made: list[Report] = []
    init = Report.__init__

    def counted(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    monkeypatch.setattr(Report, "__init__", counted)
    return made


def test_a_training_count_with_its_memory_makes_one_report(monkeypatch):
    # x[4, 6] @ W[6, 5] → Relu: forward 2·4·6·5 + 4·5; backward dW = 2·6·4·5 (x needs no gradient), Relu's mask 4·5
    m = model([helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"])],
              {"x": (4, 6)}, ["y"], [weight("W", (6, 5))])
    made = _made(monkeypatch)
    report = flopcount.count(m, mode="train", memory=True, optimizer="sgd")
    assert made == [report]
    assert (report.forward.flops, report.backward.flops) == (2 * 4 * 6 * 5 + 4 * 5, 2 * 6 * 4 * 5 + 4 * 5)
    assert report.trainable_params == 6 * 5 and report.memory is not None and report.optimizer[0] == "sgd"
    assert dataclasses.is_dataclass(report) and report.timings.keys() == {"load", "graph", "shapes", "count"}


def test_an_inference_count_makes_one_report(monkeypatch):
    m = model([helper.make_node("MatMul", ["x", "W"], ["y"])], {"x": (4, 6)}, ["y"], [weight("W", (6, 5))])
    made = _made(monkeypatch)
    report = flopcount.count(m)
    assert made == [report] and report.total.flops == 2 * 4 * 6 * 5 and report.mode == "inference"
