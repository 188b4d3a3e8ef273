"""Measured time per module (``flopcount profile --format html``): each executed node's time goes to the smallest
module holding all it runs."""

from __future__ import annotations

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("onnxruntime")

from flopcount.measure.profile import ProfileSettings, profile  # noqa: E402
from flopcount.measure.profile.modules import module_times, profile_html  # noqa: E402

F = TensorProto.FLOAT


def block_model() -> onnx.ModelProto:
    """blk.a: x[64,128] @ W[128,256]; blk.b: + bias[256]; then a Softmax in head. onnxruntime's full optimisation
    fuses the MatMul and the Add (two sibling modules) into one Gemm."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="/blk/a/MatMul"),
             helper.make_node("Add", ["m", "bias"], ["s"], name="/blk/b/Add"),
             helper.make_node("Softmax", ["s"], ["y"], name="/head/Softmax")]
    inits = [numpy_helper.from_array(rng.standard_normal((128, 256)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal(256).astype(np.float32), "bias")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [64, 128])],
                          [helper.make_tensor_value_info("y", F, [64, 256])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_unfused_nodes_time_their_own_modules():
    p = profile(block_model(), ProfileSettings(optimize="none", warmup=1, runs=3))
    times = module_times(p)
    assert set(times) == {("blk", "blk.a"), ("blk", "blk.b"), ("head",)}
    assert sum(times.values()) == pytest.approx(sum(r.time_s for r in p.nodes if r.time_s))


def test_a_kernel_fused_across_sibling_modules_times_their_parent():
    p = profile(block_model(), ProfileSettings(optimize="all", warmup=1, runs=3))
    fused = [r for r in p.nodes if len(r.covers) > 1]
    assert fused and set(fused[0].covers) == {"/blk/a/MatMul", "/blk/b/Add"}
    times = module_times(p)
    assert times.get(("blk",), 0) > 0 and ("blk", "blk.a") not in times and ("blk", "blk.b") not in times


def test_page_shows_time_per_module():
    p = profile(block_model(), ProfileSettings(optimize="none", warmup=1, runs=3))
    page = profile_html(p, depth=2)
    assert "time (ms)" in page and "share of time" in page and "GFLOP/s" in page
    row = re.search(r'<tr data-depth="2"[^>]*><td class="name"[^>]*>blk\.a</td>(.*?)</tr>', page).group(1)
    seconds = float(re.search(r'<span data-v="([0-9.e-]+)">', row).group(1))
    assert seconds == pytest.approx(module_times(p)[("blk", "blk.a")])
