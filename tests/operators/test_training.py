"""Domain ai.onnx.preview.training: optimizer steps per element of the optimized tensors; Gradient free.

Two optimized tensors X1 [7, 11] and X2 [13] throughout: |X| = 7·11 + 13 elements.
"""

import pytest
from helpers import model
from onnx import TensorProto, helper

import flopcount
from flopcount.registry import lookup

TRAINING = "ai.onnx.preview.training"
SHAPES = {"1": (7, 11), "2": (13,)}
ELEMENTS = 7 * 11 + 13


def optimizer(op, state, **attrs):
    """A two-tensor optimizer node: R, T, X1, X2, G1, G2, then each state kind (V, H) for both."""
    kinds = ["X", "G", *state]
    tensors = [k + i for k in kinds for i in SHAPES]
    outs = [f"{k}{i}_new" for k in ["X", *state] for i in SHAPES]
    node = helper.make_node(op, ["R", "T", *tensors], outs, domain=TRAINING, **attrs)
    m = model([node], {t: SHAPES[t[-1]] for t in tensors}, outs, opset=18, extra_opsets={TRAINING: 1})
    m.graph.input.extend([helper.make_tensor_value_info("R", TensorProto.FLOAT, []),
                          helper.make_tensor_value_info("T", TensorProto.INT64, [])])
    return flopcount.count(m).total


OPTIMIZERS = [
    # id: op, state tensors, attrs, FLOPs and square roots per element (from the spec's pseudo code)
    pytest.param("Adagrad", ["H"], {}, 2 + 2 + 2 + 3, 1, id="adagrad"),
    pytest.param("Momentum", ["V"], {"mode": "standard", "alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0},
                 2 + 3 + 2, 0, id="momentum"),
    pytest.param("Momentum", ["V"], {"mode": "nesterov", "alpha": 0.9, "beta": 1.0, "norm_coefficient": 0.0},
                 2 + 3 + 4, 0, id="nesterov"),
    pytest.param("Adam", ["V", "H"], {}, 2 + 3 + 4 + 2 + 3 + 1, 1, id="adam"),
]


@pytest.mark.parametrize("op, state, attrs, per_element, sqrt", OPTIMIZERS)
def test_optimizer(op, state, attrs, per_element, sqrt):
    r = optimizer(op, state, **attrs)
    assert (r.flops, r.transcendentals, r.macs) == (per_element * ELEMENTS, sqrt * ELEMENTS, 0)


def test_gradient_is_declared_free_with_a_reason():
    rule = lookup(TRAINING, "Gradient")
    assert rule is not None and rule.zero_cost and "backward graph" in rule.reason
