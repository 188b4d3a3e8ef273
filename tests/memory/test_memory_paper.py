"""The reference transformer block of Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", section 4.1): multi-head attention, a 4h GELU MLP, dropout after the attention probabilities
and after both projections, two layer norms, fp16. Its activations are 34·s·b·h + 5·a·s²·b bytes per layer; with
selective recompute (the attention core recomputed) 34·s·b·h. The paper leaves out the layer norms' statistics
("small buffers"): each keeps a float32 mean and rstd per token, 2·4·s·b bytes, which we count beside it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.memory.ledger import MemorySettings
from helpers import weight

B, S, H, A = 3, 5, 12, 3  # batch, sequence, hidden, heads (distinct, so that a swapped dim cannot pass)
D = H // A
F16 = TensorProto.FLOAT16


def _c(name, value, dtype):
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def block():
    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", "g1", "c1"], ["ln1"], name="ln1", axis=-1),
        *(n("MatMul", ["ln1", f"w{p}"], [f"{p}0"], name=f"{p}_proj") for p in "qkv"),
        *(n("Add", [f"{p}0", f"b{p}"], [f"{p}1"], name=f"{p}_bias") for p in "qkv"),
        *(n("Reshape", [f"{p}1", "heads"], [f"{p}2"], name=f"{p}_heads") for p in "qkv"),
        n("Transpose", ["q2"], ["qt"], name="q_t", perm=[0, 2, 1, 3]),
        n("Transpose", ["k2"], ["kt"], name="k_t", perm=[0, 2, 3, 1]),
        n("Transpose", ["v2"], ["vt"], name="v_t", perm=[0, 2, 1, 3]),
        n("MatMul", ["qt", "kt"], ["scores"], name="scores"),
        n("Mul", ["scores", "scale"], ["scaled"], name="scale"),
        n("Softmax", ["scaled"], ["probs"], name="softmax", axis=-1),
        n("Dropout", ["probs", "ratio", "train"], ["probs_d"], name="attn_dropout"),
        n("MatMul", ["probs_d", "vt"], ["ctx"], name="context"),
        n("Transpose", ["ctx"], ["ctx_t"], name="ctx_t", perm=[0, 2, 1, 3]),
        n("Reshape", ["ctx_t", "merged"], ["ctx_m"], name="ctx_merge"),
        n("MatMul", ["ctx_m", "wo"], ["o0"], name="o_proj"),
        n("Add", ["o0", "bo"], ["o1"], name="o_bias"),
        n("Dropout", ["o1", "ratio", "train"], ["o_d"], name="o_dropout"),
        n("Add", ["x", "o_d"], ["r1"], name="residual1"),
        n("LayerNormalization", ["r1", "g2", "c2"], ["ln2"], name="ln2", axis=-1),
        n("MatMul", ["ln2", "w1"], ["f0"], name="fc1"),
        n("Add", ["f0", "b1"], ["f1"], name="fc1_bias"),
        n("Gelu", ["f1"], ["g"], name="gelu"),
        n("MatMul", ["g", "w2"], ["m0"], name="fc2"),
        n("Add", ["m0", "b2"], ["m1"], name="fc2_bias"),
        n("Dropout", ["m1", "ratio", "train"], ["m_d"], name="mlp_dropout"),
        n("Add", ["r1", "m_d"], ["y"], name="residual2"),
    ]
    inits = [
        weight("g1", (H,), F16), weight("c1", (H,), F16), weight("g2", (H,), F16), weight("c2", (H,), F16),
        *(weight(f"w{p}", (H, H), F16) for p in "qkvo"), *(weight(f"b{p}", (H,), F16) for p in "qkvo"),
        weight("w1", (H, 4 * H), F16), weight("b1", (4 * H,), F16),
        weight("w2", (4 * H, H), F16), weight("b2", (H,), F16),
        _c("heads", [B, S, A, D], np.int64), _c("merged", [B, S, H], np.int64),
        _c("scale", 1 / np.sqrt(D), np.float16), _c("ratio", 0.1, np.float16), _c("train", True, np.bool_),
    ]
    g = helper.make_graph(nodes, "paper_block", [helper.make_tensor_value_info("x", F16, [B, S, H])],
                          [helper.make_tensor_value_info("y", F16, [B, S, H])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])


LN_STATISTICS = 2 * (2 * 4 * S * B)  # two layer norms, a float32 mean and rstd per token


@pytest.mark.parametrize("recompute, expected", [
    pytest.param("none", 34 * S * B * H + 5 * A * S * S * B, id="none: 34sbh + 5as^2b"),
    pytest.param("selective", 34 * S * B * H, id="selective: 34sbh"),
])
def test_activations_are_the_papers_formula_exactly(recompute, expected):
    report = flopcount.count(block(), mode="train", memory=MemorySettings(recompute=recompute))
    (r,) = report.memory.ranks
    assert not report.memory.lower_bound
    assert r.activations_bytes == expected + LN_STATISTICS


def test_full_recompute_of_the_block_keeps_only_its_input():
    """A graph without numbered layers is checkpointed whole: only its input x (2·s·b·h bytes) is kept."""
    (r,) = flopcount.count(block(), mode="train", memory=MemorySettings(recompute="full")).memory.ranks
    assert (r.activations_bytes, r.statistics_bytes) == (2 * S * B * H, 0)


def test_the_kept_statistics_are_the_masks_and_the_norms():
    """Of the total, the smaller records (not whole tensors): three dropout masks as bools (a·s²·b, s·b·h, s·b·h)
    and the norms' statistics."""
    (r,) = flopcount.count(block(), mode="train", memory=True).memory.ranks
    assert r.statistics_bytes == A * S * S * B + 2 * S * B * H + LN_STATISTICS
