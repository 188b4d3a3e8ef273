"""The HTML report: one self-contained page whose tables carry every figure without JavaScript, checked as text
and in a real browser (headless Chromium, where it is installed)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.output.html import DEFAULT_MAX_ROWS, to_html
from helpers import browser, needs_chromium

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "resnet50-v1.5.onnx"
F = TensorProto.FLOAT


def chain(n_blocks: int, name_of=lambda i: f"/blocks.{i}/fc/MatMul") -> onnx.ModelProto:
    """x[2,8] through ``n_blocks`` MatMuls by an 8x8 weight each (2·2·8·8 = 256 FLOPs), then a Relu."""
    nodes = [helper.make_node("MatMul", [f"h{i}", f"w{i}"], [f"h{i + 1}"], name=name_of(i)) for i in range(n_blocks)]
    nodes.append(helper.make_node("Relu", [f"h{n_blocks}"], ["y"], name="/Relu"))
    nodes[0].input[0] = "x"
    inits = [numpy_helper.from_array(np.zeros((8, 8), np.float32), f"w{i}") for i in range(n_blocks)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 8])],
                          [helper.make_tensor_value_info("y", F, [2, 8])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_page_is_self_contained_and_holds_the_figures():
    page = to_html(flopcount.count(chain(3)), depth=2)
    assert page.startswith("<!DOCTYPE html>")
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|\bhref=|@import|url\(", page)  # nothing fetched
    assert re.findall(r"https?://[^\s\"']+", page) == ["http://www.w3.org/2000/svg"] * 2  # SVG namespace only
    total = 3 * 2 * 2 * 8 * 8 + 2 * 8
    assert f"<dd>{total:,}</dd>" in page
    for i in range(3):
        assert f">blocks.{i}<" in page and f">blocks.{i}.fc<" in page
    assert page.count("<svg") == 2  # FLOPs by module and by operator type


def test_hostile_names_are_escaped():
    page = to_html(flopcount.count(chain(2, lambda i: f"/<img src=x onerror=alert({i})>/MatMul")))
    assert "<img" not in page and "&lt;img src=x onerror=alert(0)&gt;" in page


def test_a_graph_without_scopes_says_so():
    page = to_html(flopcount.count(chain(2, lambda i: f"mm{i}")))
    assert 'id="modules-missing"' in page and "no module scopes" in page


def test_ten_thousand_nodes_stay_under_two_megabytes():
    m = chain(10_000, lambda i: f"/stage{i // 1000}/blocks.{i % 1000}/fc/MatMul")
    r = flopcount.count(m)
    page = to_html(r)
    assert len(page.encode()) < 2 * 2**20
    # the deepest tree within the row budget: 10 stages (and the outside row) fit, their 10,000 blocks do not
    assert page.count('<tr data-depth="') == len(r.by_module(1)) == 11 < DEFAULT_MAX_ROWS < len(r.by_module(2))
    assert len(to_html(r, depth=3).encode()) < 8 * 2**20  # asked for, every block is listed



@needs_chromium
@pytest.mark.parametrize("script", ["on", "off"])
def test_example_report_in_a_realbrowser(tmp_path, script):
    page = tmp_path / "report.html"
    r = flopcount.count(str(EXAMPLE))
    html = to_html(r, depth=2)
    if script == "off":  # the page's one script removed: what a reader with JavaScript off gets
        html = re.sub(r"<script>.*?</script>", "", html, flags=re.S)
        assert "<script" not in html
    page.write_text(html)
    dom = browser(tmp_path / "profile", "--dump-dom", page.as_uri()).stdout
    text = re.sub(r"<[^>]+>", " ", dom)
    assert f"{r.total.flops:,}" in text  # 8,206,518,248
    for module in ("conv1", "layer1", "layer4.2", "fc"):
        assert f" {module} " in text
    # the script adds a collapse toggle to each row with children (layer1 to layer4 at depth 2); without it, none
    assert dom.count('class="toggle"') == (4 if script == "on" else 0)


@needs_chromium
def test_example_report_screenshot(tmp_path):
    """A screenshot of the bundled example's page, kept where FLOPCOUNT_TEST_ARTIFACTS points (CI sets it)."""
    import os

    out = Path(os.environ.get("FLOPCOUNT_TEST_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    page = tmp_path / "report.html"
    page.write_text(to_html(flopcount.count(str(EXAMPLE), mode="train")))
    shot = out / "resnet50-report.png"
    browser(tmp_path / "profile", "--window-size=1280,1800", f"--screenshot={shot}", page.as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a real picture, not a blank page
