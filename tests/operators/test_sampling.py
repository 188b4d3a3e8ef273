"""Random sampling: generation itself is not counted; Bernoulli compares, Multinomial builds a CDF
and searches it."""

import pytest
from helpers import model, single
from onnx import helper

import flopcount


def test_bernoulli_one_comparison_per_element():
    assert flopcount.count(single("Bernoulli", {"p": (7, 11, 13)}, opset=22)).total.flops == 7 * 11 * 13


def test_multinomial():
    # B = 7 rows of C = 37 classes (⌈log2 37⌉ = 6), S = 11 samples per row
    r = flopcount.count(single("Multinomial", {"logits": (7, 37)}, opset=22, sample_size=11)).total
    assert r.flops == 7 * (2 * 37 - 1) + 7 * 11 * (1 + 6)
    assert r.transcendentals == 7 * 37


@pytest.mark.parametrize(
    "op, inputs, attrs",
    [
        pytest.param("RandomNormal", {}, {"shape": [7, 11]}, id="normal"),
        pytest.param("RandomUniform", {}, {"shape": [7, 11]}, id="uniform"),
        pytest.param("RandomNormalLike", {"x": (7, 11)}, {}, id="normal-like"),
        pytest.param("RandomUniformLike", {"x": (7, 11)}, {}, id="uniform-like"),
    ],
)
def test_generators_are_free(op, inputs, attrs):
    node = helper.make_node(op, list(inputs), ["y"], **attrs)
    (n,) = flopcount.count(model([node], inputs, ["y"], opset=22)).nodes
    assert (n.status, n.cost.flops) == ("zero-cost", 0)
