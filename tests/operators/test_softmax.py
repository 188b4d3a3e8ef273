"""Softmax, LogSoftmax, Hardmax: counted per row of n elements (R rows).

Softmax per row: max (n − 1) + subtract (n) + exp (n) + sum (n − 1) + divide (n) = 5n − 2, n exps.
LogSoftmax per row: the same up to the sum, then one log and n subtractions = 5n − 1, n + 1
transcendentals. Hardmax per row: n − 1 comparisons.
"""

import pytest
from helpers import one_node, single

import flopcount

# X = (3, 5, 7) throughout; |X| = 105
ROWS = [
    # id: opset, axis (None = the schema default), R rows, n elements per row (derived here)
    pytest.param(13, None, 3 * 5, 7, id="opset13-default-last-axis"),
    pytest.param(13, -1, 3 * 5, 7, id="opset13-axis-1"),
    pytest.param(18, 1, 3 * 7, 5, id="opset18-axis1-middle"),
    pytest.param(18, 0, 5 * 7, 3, id="opset18-axis0"),
    pytest.param(11, None, 3, 5 * 7, id="opset11-default-axis1-coerced-2d"),
    pytest.param(11, 2, 3 * 5, 7, id="opset11-axis2"),
    pytest.param(11, 0, 1, 3 * 5 * 7, id="opset11-axis0-one-row"),
]


def _model(op, opset, axis):
    attrs = {} if axis is None else {"axis": axis}
    return single(op, {"x": (3, 5, 7)}, opset=opset, **attrs)


@pytest.mark.parametrize("opset, axis, rows, n", ROWS)
def test_softmax(opset, axis, rows, n):
    r = flopcount.count(_model("Softmax", opset, axis)).total
    assert r.flops == rows * (5 * n - 2)
    assert r.transcendentals == rows * n == 105
    assert r.macs == 0


@pytest.mark.parametrize("opset, axis, rows, n", ROWS)
def test_log_softmax(opset, axis, rows, n):
    r = flopcount.count(_model("LogSoftmax", opset, axis)).total
    assert r.flops == rows * (5 * n - 1)
    assert r.transcendentals == rows * (n + 1)


@pytest.mark.parametrize("opset, axis, rows, n", ROWS)
def test_hardmax(opset, axis, rows, n):
    r = flopcount.count(_model("Hardmax", opset, axis)).total
    assert r.flops == rows * (n - 1)
    assert r.transcendentals == 0


def test_softmax_spelled_out():
    # X (2, 9), last axis: 2 rows of 9 → max 8 + sub 9 + exp 9 + sum 8 + div 9 = 43 per row
    r = flopcount.count(single("Softmax", {"x": (2, 9)})).total
    assert (r.flops, r.transcendentals) == (2 * 43, 2 * 9)


def test_softmax_same_under_table3():
    m = single("Softmax", {"x": (3, 5, 7)})
    assert flopcount.count(m, convention="table3").total == flopcount.count(m).total


# -----------------------------------------------------------------------------------------------------------------
# Backward (mode="train"): Hardmax, an explicit zero.
#
# Each expected value is a closed form written here from the sizes (distinct odd sizes, so that a
# swapped dimension cannot pass). A tensor needs a gradient when it is a trainable float initializer
# (``weight``) fed to a differentiable input, or computed from one; graph inputs are data and need none.
# Which inputs may get a gradient at all is the schema's say (``onnx.defs.get_schema``), checked in
# ``tests/pipeline/test_schema.py`` before the cases rely on it.
# -----------------------------------------------------------------------------------------------------------------


XR = (5, 7, 9)


def test_hardmax_gradient_is_an_explicit_zero():
    # piecewise constant: dX = 0; the node has a formula (not reported missing), costing nothing
    r = flopcount.count(one_node("Hardmax", XR, axis=1), mode="train")
    assert not r.backward_unsupported and r.backward == flopcount.Cost()
