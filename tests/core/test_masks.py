"""``--attention executed``: each mask kind's kept (query, key) pairs against a brute-force count of the true
entries of the mask matrix, built in numpy here; and the counts of graphs whose masks are structure or data."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.masks import AttentionMask, ExecutedPairs


def brute_force(batch, s_q, t, *, causal=False, window=None, lengths=None, segments=None) -> ExecutedPairs:
    """The mask matrix of each sequence, entry by entry: query i at position t − s_q + i, key j."""
    pairs = rows = 0
    for b in range(batch):
        keep = np.ones((s_q, t), dtype=bool)
        for i in range(s_q):
            p = t - s_q + i
            for j in range(t):
                ok = True
                if causal:
                    ok &= j <= p
                if window is not None:
                    ok &= p - j < window
                if lengths is not None:
                    ok &= j < lengths[b] and p < lengths[b]
                if segments is not None:
                    ends = np.cumsum(segments)
                    ok &= int(np.searchsorted(ends, p, side="right")) == int(np.searchsorted(ends, j, side="right"))
                keep[i, j] = ok
        pairs += int(keep.sum())
        rows += int(keep.any(axis=1).sum())
    return ExecutedPairs(pairs, rows)


@pytest.mark.parametrize("batch, s_q, t, kind", [
    pytest.param(1, 13, 13, dict(causal=True), id="causal-square"),
    pytest.param(2, 5, 17, dict(causal=True), id="causal-query-block-over-cache"),
    pytest.param(1, 1, 9, dict(causal=True), id="causal-decode-step"),
    pytest.param(1, 19, 19, dict(causal=True, window=4), id="sliding-window"),
    pytest.param(3, 6, 23, dict(causal=True, window=7), id="sliding-window-over-cache"),
    pytest.param(1, 11, 11, dict(window=5), id="window-not-causal"),
    pytest.param(3, 9, 9, dict(lengths=(9, 4, 0)), id="padding"),
    pytest.param(3, 9, 9, dict(causal=True, lengths=(7, 9, 2)), id="padding-causal"),
    pytest.param(2, 14, 14, dict(causal=True, segments=(5, 1, 8)), id="packed-causal"),
    pytest.param(1, 14, 14, dict(segments=(3, 11)), id="packed-bidirectional"),
    pytest.param(2, 16, 16, dict(causal=True, window=3, segments=(9, 7)), id="packed-sliding"),
])
def test_pairs_equal_the_true_entries_of_the_mask(batch, s_q, t, kind):
    mask = AttentionMask(**kind)
    assert mask.pairs(batch, s_q, t) == brute_force(batch, s_q, t, **kind)


def test_causal_square_is_half_plus_the_diagonal():
    assert AttentionMask(causal=True).pairs(1, 2048, 2048).pairs == 2048 * 2049 // 2


B, HEADS, S, E, EV = 2, 3, 7, 5, 11


def attention_model(*, is_causal=0, past=0, left_window_size=-1):
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, HEADS, S, E]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, [B, HEADS, S, E]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, HEADS, S, EV])]
    names = ["q", "k", "v"]
    if past:
        inputs += [helper.make_tensor_value_info("pk", TensorProto.FLOAT, [B, HEADS, past, E]),
                   helper.make_tensor_value_info("pv", TensorProto.FLOAT, [B, HEADS, past, EV])]
        names += ["", "pk", "pv"]
    window = {"left_window_size": left_window_size} if left_window_size >= 0 else {}
    node = helper.make_node("Attention", names, ["y"], is_causal=is_causal, **window)
    g = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 25 if window else 24)])


@pytest.mark.parametrize("is_causal, past, window", [
    pytest.param(1, 0, None, id="causal"),
    pytest.param(1, 6, None, id="causal-over-cache"),
    pytest.param(1, 6, 4, id="causal-window-over-cache"),
])
def test_attention_operator_executed(is_causal, past, window):
    model = attention_model(is_causal=is_causal, past=past, left_window_size=-1 if window is None else window - 1)
    full = flopcount.count(model, convention="dense")
    executed = flopcount.count(model, convention="dense", attention="executed")
    t = S + past
    assert full.total.flops == 2 * B * HEADS * S * t * (E + EV)  # the whole score matrix
    kept = brute_force(B, S, t, causal=True, window=window).pairs
    assert executed.total.flops == 2 * HEADS * kept * (E + EV)
    assert full.attention == "full" and executed.attention.startswith("executed")


def eager_model(mask_from: str):
    """Q·Kᵀ, scaled, plus a mask, softmax, times V: the mask a Trilu of ones (structure) or an input (data)."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Mul", ["s", "scale"], ["ss"])]
    inits = [numpy_helper.from_array(np.array(0.5, dtype=np.float32), "scale")]
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [B, HEADS, S, E]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, [B, HEADS, S, E]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, [B, HEADS, S, EV])]
    if mask_from == "trilu":
        inits += [numpy_helper.from_array(np.ones((S, S), dtype=np.float32), "ones"),
                  numpy_helper.from_array(np.array(1e9, dtype=np.float32), "big")]
        nodes += [helper.make_node("Trilu", ["ones"], ["lower"], upper=0),
                  helper.make_node("Sub", ["lower", "ones"], ["off"]),  # 0 kept, −1 masked
                  helper.make_node("Mul", ["off", "big"], ["bias"])]  # 0 kept, −1e9 masked
    else:
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [S, S]))
    nodes += [helper.make_node("Add", ["ss", "bias"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["y"])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_eager_products_under_a_trilu_count_the_causal_pairs():
    r = flopcount.count(eager_model("trilu"), convention="dense", attention="executed")
    assert r.total.flops == 2 * HEADS * B * (S * (S + 1) // 2) * (E + EV)  # S(S+1)/2 per head and sequence
    assert "Trilu" in r.attention
    assert flopcount.count(eager_model("trilu"), convention="dense").total.flops == 2 * B * HEADS * S * S * (E + EV)


def test_a_mask_that_is_data_counts_full_and_says_so():
    r = flopcount.count(eager_model("input"), convention="dense", attention="executed")
    assert r.total.flops == 2 * B * HEADS * S * S * (E + EV)
    assert "is data, not structure" in r.attention and "counted full" in r.attention


def test_a_mask_given_for_the_eager_products():
    mask = AttentionMask(causal=True, lengths=(7, 3), source="the caller")
    r = flopcount.count(eager_model("input"), convention="dense", attention=mask)
    assert r.total.flops == 2 * HEADS * brute_force(B, S, S, causal=True, lengths=(7, 3)).pairs * (E + EV)
    assert r.attention == "executed: causal + padding (lengths 7, 3), from the caller"


def test_unknown_attention_mode():
    with pytest.raises(flopcount.UsageError, match="choose one of: full, executed"):
        flopcount.count(eager_model("input"), attention="flash")


@pytest.mark.parametrize("kind", ["attention", "eager"])
def test_executed_backward_runs_the_kept_pairs(kind):
    """Training: a masked kernel's backward runs the pairs its forward kept: dQ, dK (E per pair) and dP, dV (E_v
    per pair), twice the forward's products under --attention executed as under full."""
    model = attention_model(is_causal=1) if kind == "attention" else eager_model("trilu")
    kw = dict(convention="dense", mode="train", trainable_inputs=["q", "k", "v"])
    full = flopcount.count(model, **kw)
    executed = flopcount.count(model, attention="executed", **kw)
    kept = brute_force(B, S, S, causal=True).pairs
    assert full.backward.flops == 2 * 2 * B * HEADS * S * S * (E + EV)
    assert executed.backward.flops == 2 * 2 * HEADS * kept * (E + EV)


def test_executed_eager_attention_runs_every_term_over_the_kept_pairs():
    """Under the default convention the scale, the mask's add and the Softmax of an eager attention run over the
    pairs the causal mask keeps, forward and backward, as the products do; the mask's own construction (Trilu,
    Sub, Mul on the [S, S] constants) is not on the scores' path and counts whole."""
    kept = brute_force(B, S, S, causal=True)
    entries, rows = HEADS * kept.pairs, HEADS * kept.rows  # over the batch and every head
    full_entries, full_rows = B * HEADS * S * S, B * HEADS * S
    report = flopcount.count(eager_model("trilu"), attention="executed", mode="train",
                             trainable_inputs=["q", "k", "v"])
    scores_shape = (B, HEADS, S, S)
    by_op = {}
    for n in report.nodes:
        on_path = n.outputs[0].shape == scores_shape or n.op_type == "Softmax"
        by_op.setdefault((n.op_type, on_path), []).append(n)
    (scale,), (add,), (softmax,) = by_op[("Mul", True)], by_op[("Add", True)], by_op[("Softmax", True)]
    assert scale.cost.flops == entries and add.cost.flops == entries
    assert softmax.cost.flops == 5 * entries - 2 * rows  # per row of n kept: n − 1 max, 2n − 1 adds, n exps, n divs
    assert softmax.cost.transcendentals == entries
    assert softmax.backward.flops == 4 * entries - rows  # dX = Y·(dY − Σ dY·Y): 4n − 1 per row
    assert scale.backward.flops == entries  # d(s·c) = dY·c
    # the mask [S, S] is built from float initializers, parameters here: its gradient sums the kept entries of
    # every sequence and head into the S(S+1)/2 positions they come from
    assert add.backward.flops == entries - S * (S + 1) // 2
    (mask_mul,) = by_op[("Mul", False)]
    assert mask_mul.cost.flops == S * S  # the mask's construction, off the path: whole
    products = 2 * entries * (E + EV)
    mask_build = sum(n.cost.flops for n in report.nodes if n.op_type in ("Trilu", "Sub")) + S * S
    assert report.forward.flops == products + 2 * entries + 5 * entries - 2 * rows + mask_build
    on_path = [n for n in report.nodes if n.op_type in ("MatMul", "Softmax") or n in (scale, add)]
    assert sum(n.backward.flops for n in on_path) == 2 * products + entries + 4 * entries - rows + add.backward.flops
    full = flopcount.count(eager_model("trilu"), mode="train", trainable_inputs=["q", "k", "v"])
    full_softmax = next(n for n in full.nodes if n.op_type == "Softmax")
    assert full_softmax.cost.flops == full_rows * (5 * S - 2) == 5 * full_entries - 2 * full_rows
    assert full_softmax.backward.flops == full_rows * (4 * S - 1)
    full_add = next(n for n in full.nodes if n.op_type == "Add")
    assert full_add.cost.flops == full_entries and full_add.backward.flops == full_entries - S * S


def test_executed_eager_attention_whose_mask_is_data_counts_every_term_full():
    report = flopcount.count(eager_model("input"), attention="executed")
    softmax = next(n for n in report.nodes if n.op_type == "Softmax")
    assert softmax.cost.flops == B * HEADS * S * (5 * S - 2)
    assert next(n for n in report.nodes if n.op_type == "Add").cost.flops == B * HEADS * S * S
