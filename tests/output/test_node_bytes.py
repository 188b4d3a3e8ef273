"""Bytes each node reads and writes, from shapes and dtypes: the per-node table, JSON and CSV of a count."""

from __future__ import annotations

import csv
import io
import json

from onnx import TensorProto

import flopcount
from flopcount.output.render import render
from flopcount.reporting.report import element_bits

from helpers import single, weight


def test_element_bits_of_common_and_sub_byte_types():
    assert [element_bits(t) for t in (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16,
                                      TensorProto.INT8, TensorProto.DOUBLE, TensorProto.INT4)] == [32, 16, 16, 8, 64, 4]
    assert element_bits(TensorProto.STRING) is None and element_bits(0) is None


def test_conv_bytes_count_the_weight_as_read():
    # Conv 7x3x11x13 * 5x3x3x3 (no pad) -> 7x5x9x11; fp32
    m = single("Conv", {"x": [7, 3, 11, 13]}, [weight("w", [5, 3, 3, 3])])
    doc = json.loads(render(flopcount.count(m), "json", per_node=True))
    node = doc["nodes"][0]
    assert node["bytes_read"] == 4 * (7 * 3 * 11 * 13 + 5 * 3 * 3 * 3)  # 12,552
    assert node["bytes_written"] == 4 * 7 * 5 * 9 * 11  # 13,860
    assert node["bytes"] == 12_552 + 13_860


def test_fp16_matmul_bytes_in_table_and_csv():
    # MatMul 37x91 @ 91x23 in fp16: read 2·(37·91 + 91·23) = 10,920, written 2·37·23 = 1,702
    m = single("MatMul", {"a": [37, 91]}, [weight("b", [91, 23], TensorProto.FLOAT16)], dtype=TensorProto.FLOAT16)
    report = flopcount.count(m)
    table = render(report, "table", per_node=True)
    assert "12,622" in table.splitlines()[2]
    rows = list(csv.DictReader(io.StringIO(render(report, "csv", per_node=True))))
    assert (int(rows[0]["bytes_read"]), int(rows[0]["bytes_written"])) == (10_920, 1_702)


def test_unknown_shape_gives_null_bytes():
    m = single("Identity", {"x": ["N", 8]})  # zero-cost: counts with a symbolic dim
    node = json.loads(render(flopcount.count(m), "json", per_node=True))["nodes"][0]
    assert node["bytes"] is None and node["bytes_read"] is None
