"""TopK (≤ |X|·⌈log2(k + 1)⌉ comparisons: heap insertion) and Unique (merge sort + neighbour checks)."""

import pytest
from helpers import const, model, one_node, single
from onnx import TensorProto, helper

import flopcount

TOPK = [
    # id: X, axis, k, ⌈log2(k + 1)⌉ written out
    pytest.param((7, 37, 23), 1, 5, 3, id="k5-axis1"),
    pytest.param((7, 37, 23), 1, 1, 1, id="k1-is-a-max"),
    pytest.param((7, 37, 23), 1, 37, 6, id="k-equals-L-full-sort"),
    pytest.param((7, 37, 23), -1, 9, 4, id="k9-last-axis"),
]


@pytest.mark.parametrize("x, axis, k, log", TOPK)
def test_top_k(x, axis, k, log):
    m = single("TopK", {"x": x}, [const("k", [k])], n_outputs=2, opset=11, axis=axis)
    r = flopcount.count(m).total
    assert (r.flops, r.int_ops) == (7 * 37 * 23 * log, 0)


def test_top_k_integer_input_counts_int_ops():
    m = single("TopK", {"x": (7, 37)}, [const("k", [5])], n_outputs=2, opset=11, dtype=TensorProto.INT32)
    assert flopcount.count(m).total.int_ops == 7 * 37 * 3


def test_top_k_opset1_attribute():
    m = single("TopK", {"x": (7, 37)}, n_outputs=2, opset=1, k=5)
    assert flopcount.count(m).total.flops == 7 * 37 * 3


def test_top_k_runtime_k_bounded_by_axis_length():
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    m = model([node], {"x": (7, 37, 23)}, ["v", "i"], opset=11)
    m.graph.input.append(helper.make_tensor_value_info("k", TensorProto.INT64, [1]))
    assert flopcount.count(m).total.flops == 7 * 37 * 23 * 6  # k ≤ 37: ⌈log2 38⌉


UNIQUE = [
    # id: X, axis attrs, n items, s elements per item, ⌈log2 n⌉
    pytest.param((7, 9), {}, 63, 1, 6, id="flattened"),
    pytest.param((7, 9, 5), {"axis": 1}, 9, 7 * 5, 4, id="slices-axis1"),
    pytest.param((7, 9, 5), {"axis": -1}, 5, 7 * 9, 3, id="slices-last-axis"),
]


@pytest.mark.parametrize("x, attrs, n, s, log", UNIQUE)
def test_unique(x, attrs, n, s, log):
    m = single("Unique", {"x": x}, n_outputs=4, opset=11, **attrs)
    assert flopcount.count(m).total.flops == s * (n * log + n - 1)


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): TopK.
#
# Each expected value is a closed form written here from the sizes (distinct odd sizes, so that a
# swapped dimension cannot pass). A tensor needs a gradient when it is a trainable float initializer
# (``weight``) fed to a differentiable input, or computed from one; graph inputs are data and need none.
# Which inputs may get a gradient at all is the schema's say (``onnx.defs.get_schema``), checked in
# ``tests/pipeline/test_schema.py`` before the cases rely on it.
# -----------------------------------------------------------------------------------------------------------------


XR = (5, 7, 9)


NXR, NYR = 5 * 7 * 9, 5 * 9  # reduced over axis 1, keepdims


def test_topk_scatters_dy_into_distinct_positions():
    # dX gets the |Y| = 5·3·9 values moved to their k = 3 positions per row of 7: no arithmetic
    m = one_node("TopK", XR, extra_inits=[const("k", [3])], n_outputs=2, axis=1)
    r = flopcount.count(m, mode="train")
    assert not r.backward_unsupported and r.backward == flopcount.Cost()
    assert r.trainable_params == NXR
