"""Saved-for-backward rules of CausalConvWithState and LinearAttention (closed forms written here from the
shapes); of the operators whose backward reads nothing of the forward: Binarizer and the tree ensembles
(piecewise constant in X) and the ai.onnx.preview.training optimizers (the update step itself); and of the
copying operators a gradient passes through (Trilu, CenterCropPad, MaxUnpool, Scatter, TensorScatter,
ArrayFeatureExtractor)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
import flopcount.operators  # noqa: F401  (fills the registry)
from helpers import model, shifted_op_model, weight

F32 = 4


def kept(m) -> tuple[int, int]:
    """(activations, of which statistics) of a training count of ``m``, with no rule missing."""
    report = flopcount.count(m, mode="train", memory=True)
    assert not report.memory.missing
    (r,) = report.memory.ranks
    return r.activations_bytes, r.statistics_bytes


N, C, L, K = 3, 5, 11, 4


@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_keeps_x_and_past_state_for_dw_and_the_pre_activation(activation):
    m = shifted_op_model("CausalConvWithState", ["x", "w", "", "past"], {"x": [N, C, L], "past": [N, C, K - 1]},
                         params=[weight("w", (C, 1, K))], learned=["x"], opset=27, n_outputs=2,
                         activation=activation)
    z = F32 * N * C * L if activation == "silu" else 0
    # x (its shifted copy) and past_state for dW; W, a weight, for dx is no activation
    assert kept(m) == (F32 * N * C * L + F32 * N * C * (K - 1) + z, z)


B, T, HQ, HKV, DK, DV = 2, 3, 4, 2, 5, 7


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention_keeps_its_inputs_and_the_recurrence_states(rule):
    shapes = {"q": [B, T, HQ * DK], "k": [B, T, HKV * DK], "v": [B, T, HKV * DV]}
    names = ["q", "k", "v", "", "", ""]
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated:
        shapes["decay"], names[4] = [B, T, HKV * DK], "decay"
    if delta:
        shapes["beta"], names[5] = [B, T, HKV], "beta"
    while not names[-1]:
        names.pop()
    m = shifted_op_model("LinearAttention", names, shapes, learned=["q", "k", "v"], opset=27, n_outputs=2,
                         q_num_heads=HQ, kv_num_heads=HKV, update_rule=rule)
    inputs = F32 * B * T * (HQ * DK + HKV * DK + HKV * DV + gated * HKV * DK + delta * HKV)
    states = F32 * B * T * HKV * DK * DV  # S_t per token and K/V head
    stats = states + gated * (states + F32 * B * T * HKV * DK) + delta * F32 * B * T * HKV * DV
    assert kept(m) == (inputs + stats, stats)


def test_binarizer_keeps_nothing():
    x = helper.make_node("Add", ["x", "x_shift"], ["x_t"])
    node = helper.make_node("Binarizer", ["x_t"], ["y"], domain="ai.onnx.ml", threshold=0.5)
    m = model([x, node], {"x": [N, C]}, ["y"], [weight("x_shift", (N, C))], extra_opsets={"ai.onnx.ml": 3})
    assert kept(m) == (0, 0)


@pytest.mark.parametrize("op", ["TreeEnsembleRegressor", "TreeEnsembleClassifier"])
def test_tree_ensembles_keep_nothing(op):
    tree = dict(nodes_treeids=[0, 0, 0], nodes_nodeids=[0, 1, 2], nodes_featureids=[0, 0, 0],
                nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF"], nodes_values=[0.5, 0.0, 0.0],
                nodes_truenodeids=[1, 0, 0], nodes_falsenodeids=[2, 0, 0])
    if op == "TreeEnsembleRegressor":
        attrs = dict(tree, n_targets=1, target_treeids=[0, 0], target_nodeids=[1, 2], target_ids=[0, 0],
                     target_weights=[1.0, 2.0])
        outs = ["y"]
    else:
        attrs = dict(tree, classlabels_int64s=[0, 1], class_treeids=[0, 0], class_nodeids=[1, 2], class_ids=[0, 1],
                     class_weights=[1.0, 1.0])
        outs = ["label", "scores"]
    x = helper.make_node("Add", ["x", "x_shift"], ["x_t"])
    node = helper.make_node(op, ["x_t"], outs, domain="ai.onnx.ml", **attrs)
    m = model([x, node], {"x": [N, C]}, outs, [weight("x_shift", (N, C))], extra_opsets={"ai.onnx.ml": 3})
    assert kept(m) == (0, 0)


@pytest.mark.parametrize("op", ["Adam", "Adagrad", "Momentum"])
def test_training_optimizer_ops_keep_nothing(op):
    n = 6
    r = numpy_helper.from_array(np.array(0.1, np.float32), "r")
    t = numpy_helper.from_array(np.array(1, np.int64), "t")
    states = {"Adam": ["v", "h"], "Adagrad": ["h"], "Momentum": ["v"]}[op]
    attrs = {"Momentum": {"alpha": 0.9, "beta": 1.0, "mode": "standard"}}.get(op, {})
    node = helper.make_node(op, ["r", "t", "w", "g", *states], [f"out{i}" for i in range(1 + len(states))],
                            domain="ai.onnx.preview.training", **attrs)
    m = model([node], {"g": [n], **{s: [n] for s in states}}, [f"out{i}" for i in range(1 + len(states))],
              [r, t, weight("w", (n,))], extra_opsets={"ai.onnx.preview.training": 1})
    assert kept(m) == (0, 0)


def shifted_with_indices(op, x_shape, idx_name, idx_shape, node_inputs, outputs=("y",), opset=18, extra=None,
                         domain="", consts=(), **attrs):
    """x routed through Add(x, shift) (so that it needs a gradient), then ``op``; the int64 indices ``idx_name``
    are a graph input (data, an activation), not a constant."""
    nodes = [helper.make_node("Add", ["x", "x_shift"], ["x_t"]),
             helper.make_node(op, node_inputs, list(outputs), domain=domain, **attrs)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)]
    if idx_name:
        inputs.append(helper.make_tensor_value_info(idx_name, TensorProto.INT64, idx_shape))
    g = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                          [weight("x_shift", x_shape), *consts])
    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in (extra or {}).items()]
    return helper.make_model(g, opset_imports=imports)


I64 = 8


@pytest.mark.parametrize("m, expected", [
    pytest.param(shifted_with_indices("Trilu", [4, 6], "", None, ["x_t"]), (0, 0), id="Trilu"),
    pytest.param(shifted_with_indices("CenterCropPad", [4, 6], "", None, ["x_t", "s"],
                                      consts=[numpy_helper.from_array(np.array([3, 7], np.int64), "s")]), (0, 0),
                 id="CenterCropPad"),
    pytest.param(shifted_with_indices("MaxUnpool", [1, 2, 3, 5], "i", [1, 2, 3, 5], ["x_t", "i"],
                                      kernel_shape=[2, 2], strides=[2, 2]), (I64 * 2 * 3 * 5, 0), id="MaxUnpool"),
    pytest.param(shifted_with_indices("Scatter", [3, 5], "i", [2, 5], ["x_t", "i", "u"], opset=10,
                                      consts=[weight("u", (2, 5))]), (I64 * 2 * 5, 0), id="Scatter"),
    pytest.param(shifted_with_indices("TensorScatter", [2, 3, 7, 5], "i", [2], ["x_t", "u", "i"], opset=24,
                                      consts=[weight("u", (2, 3, 1, 5))]), (I64 * 2, 0), id="TensorScatter"),
    pytest.param(shifted_with_indices("ArrayFeatureExtractor", [3, 5], "i", [2], ["x_t", "i"], domain="ai.onnx.ml",
                                      extra={"ai.onnx.ml": 3}), (I64 * 2, 0), id="ArrayFeatureExtractor"),
])
def test_copying_operators_keep_their_indices_or_nothing(m, expected):
    # the indices are int64 data: dX gathers or scatters dY at them; a crop, pad or triangle mask needs shapes only
    assert kept(m) == expected
