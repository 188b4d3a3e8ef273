"""A headline says what it totals: a generation's report heads its table with the prefill's totals, named so, and
the whole generation's total (prefill and decode) stands beside them; the JSON keys stay as they are."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.cost import Cost
from flopcount.output.html import to_html
from flopcount.output.render import render
from flopcount.reporting.generation import DecodePiece, Generation

PREFILL = 2 * 2 * 8 * 8  # x[2,8] @ w[8,8]: 2·M·K·N = 256
# decode steps at contexts 5 and 6, each 100 + 10·c FLOPs: (100 + 50) + (100 + 60) = 310
DECODE = (100 + 10 * 5) + (100 + 10 * 6)


def _count():
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
                          [numpy_helper.from_array(np.zeros((8, 8), np.float32), "w")])
    return flopcount.count(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def _generation(report):
    piece = DecodePiece(5, 6, Cost(flops=100), Cost(flops=10))
    return dataclasses.replace(report, generation=Generation(2, 4, 3, report.total, (piece,)))


def test_a_plain_count_heads_with_its_total():
    text = render(_count(), "table")
    assert f"Total FLOPs: {PREFILL:,}" in text and "Prefill total" not in text


def test_a_generation_names_the_prefill_total_and_gives_the_whole():
    report = _generation(_count())
    text = render(report, "table")
    lines = text.splitlines()
    assert f"Prefill total FLOPs: {PREFILL:,} (256 FLOPs)" in lines
    assert not any(line.startswith("Total FLOPs") for line in lines)
    assert f"Per-sample prefill FLOPs: {PREFILL // 2:,} (128 FLOPs)" in lines
    assert any(line.startswith(f"Generation total FLOPs: {PREFILL + DECODE:,} ") for line in lines)


def test_the_json_keys_stay():
    doc = json.loads(render(_generation(_count()), "json"))
    assert doc["total"]["flops"] == PREFILL
    assert doc["generation"]["total"]["flops"] == PREFILL + DECODE


def test_the_html_page_names_both():
    page = to_html(_generation(_count()))
    assert f"<dt>Prefill total FLOPs</dt><dd>{PREFILL:,}</dd>" in page
    assert f"<dt>Generation total FLOPs (prefill and decode)</dt><dd>{PREFILL + DECODE:,}</dd>" in page
    assert "<dt>Total FLOPs</dt>" not in page
