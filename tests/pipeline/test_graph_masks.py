"""``--attention executed`` on masks a plain ONNX graph builds from position ranges: each mask kind (causal,
causal over a cache, sliding window, bidirectional, padding from input values) built with Range, Unsqueeze and
comparisons, counted against a brute-force count of the true entries of the same mask written here in numpy; once
with the mask computed as an array and once held by its rows (as for long sequences)."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import flopcount
from flopcount.pipeline import graph_masks

B, HEADS, E, EV = 2, 3, 5, 11
NEG = np.finfo(np.float32).min


def true_entries(batch, s_q, t, *, causal=False, window=None, lengths=None, prefix=None) -> int:
    """Kept (query, key) pairs of every sequence, entry by entry: query i sits at position t − s_q + i."""
    total = 0
    for b in range(batch):
        for i in range(s_q):
            p = t - s_q + i
            for j in range(t):
                keep = True
                if causal:
                    keep &= j <= p or (prefix is not None and j < prefix)
                if window is not None:
                    keep &= j > p - window
                if lengths is not None:  # a valid key, and a padded query runs nothing
                    keep &= j < lengths[b] and p < lengths[b]
                total += keep
    return total


def const(name, value, dtype=np.int64):
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def range_masked_model(s_q, t, *, causal=True, window=None, padding=False, combine="where", batch=B, operator=False,
                       prefix=None, order=None):
    """Eager attention whose mask is built from positions as exporters do: query positions P + Range(S_q) (P = T −
    S_q from the shapes of Q and K), key positions Range(T); ``j <= p`` (causal), ``j > p - w`` (window), the
    ``attention_mask`` input's values (padding); And; Where(kept, 0, lowest) added to the scores (``combine``
    "where"), or the scores selected by Where(kept, scores, lowest) ("select"), or (1 − kept)·lowest added
    ("cast"). ``prefix``: keys before it are seen by every query too (Or); ``order``: the key positions come
    permuted (key j at position order[j])."""
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [batch, HEADS, s_q, E]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, [batch, HEADS, t, E]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, [batch, HEADS, t, EV])]
    inits = [const("zero", 0), const("one", 1), const("two", 2), const("ax0", [0]), const("ax1", [1]),
             const("fzero", 0.0, np.float32), const("low", NEG, np.float32), const("fone", 1.0, np.float32)]
    nodes = [helper.make_node("Shape", ["q"], ["qshape"]), helper.make_node("Shape", ["k"], ["kshape"]),
             helper.make_node("Gather", ["qshape", "two"], ["sq"]),
             helper.make_node("Gather", ["kshape", "two"], ["t"]),
             helper.make_node("Sub", ["t", "sq"], ["past"]),
             helper.make_node("Range", ["zero", "sq", "one"], ["qidx"]),
             helper.make_node("Add", ["qidx", "past"], ["qpos"]),
             helper.make_node("Range", ["zero", "t", "one"], ["kpos0" if order is not None else "kpos"])]
    if order is not None:  # key j holds position order[j]
        inits.append(const("order", order))
        nodes.append(helper.make_node("Gather", ["kpos0", "order"], ["kpos"]))
    nodes += [helper.make_node("Unsqueeze", ["qpos", "ax1"], ["col"]),  # [S_q, 1]
              helper.make_node("Unsqueeze", ["kpos", "ax0"], ["row"])]  # [1, T]
    kept = []
    if causal:
        nodes.append(helper.make_node("LessOrEqual", ["row", "col"], ["causal"]))
        kept.append("causal")
    if prefix is not None:
        inits.append(const("prefix", prefix))
        nodes += [helper.make_node("Less", ["row", "prefix"], ["early"]),
                  helper.make_node("Or", [kept.pop(), "early"], ["causal_or_early"])]
        kept.append("causal_or_early")
    if window is not None:
        inits.append(const("w", window))
        nodes += [helper.make_node("Sub", ["col", "w"], ["start"]),
                  helper.make_node("Greater", ["row", "start"], ["inside"])]
        kept.append("inside")
    if not kept:  # bidirectional: every key at or after position 0
        nodes.append(helper.make_node("GreaterOrEqual", ["row", "zero"], ["all"]))
        kept.append("all")
    if padding:
        inputs.append(helper.make_tensor_value_info("attention_mask", TensorProto.INT64, [batch, t]))
        inits.append(const("ax12", [1, 2]))
        nodes += [helper.make_node("Cast", ["attention_mask"], ["amb"], to=TensorProto.BOOL),
                  helper.make_node("Unsqueeze", ["amb", "ax12"], ["pad"])]  # [B, 1, 1, T]
        kept.append("pad")
    while len(kept) > 1:
        out = f"and{len(kept)}"
        nodes.append(helper.make_node("And", kept[:2], [out]))
        kept = [out] + kept[2:]
    if operator:  # the ONNX Attention operator, the boolean mask its attn_mask
        nodes.append(helper.make_node("Attention", ["q", "k", "v", kept[0]], ["y"]))
        g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    nodes += [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s"])]
    if combine == "where":
        nodes += [helper.make_node("Where", [kept[0], "fzero", "low"], ["bias"]),
                  helper.make_node("Add", ["s", "bias"], ["masked"])]
    elif combine == "select":
        nodes.append(helper.make_node("Where", [kept[0], "s", "low"], ["masked"]))
    else:
        nodes += [helper.make_node("Cast", [kept[0]], ["keptf"], to=TensorProto.FLOAT),
                  helper.make_node("Sub", ["fone", "keptf"], ["off"]),
                  helper.make_node("Mul", ["off", "low"], ["bias"]),
                  helper.make_node("Add", ["s", "bias"], ["masked"])]
    nodes += [helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", "v"], ["y"])]
    g = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def products(pairs: int) -> int:
    """FLOPs of Q·Kᵀ and probs·V over ``pairs`` kept pairs per head: 2·(E + E_v) each, for every head."""
    return 2 * HEADS * pairs * (E + EV)


@pytest.fixture(params=["array", "rows"])
def held(request, monkeypatch):
    """Evaluate the mask as an array, or force it to be held by its rows as for long sequences."""
    if request.param == "rows":
        monkeypatch.setattr(graph_masks, "EVAL_LIMIT", 0)
    return request.param


@pytest.mark.parametrize("s_q, t, kind, combine", [
    pytest.param(7, 7, dict(causal=True), "where", id="causal"),
    pytest.param(5, 17, dict(causal=True), "where", id="causal-query-block-over-cache"),
    pytest.param(1, 9, dict(causal=True), "select", id="causal-decode-step-selected"),
    pytest.param(13, 13, dict(causal=True, window=4), "where", id="sliding-window"),
    pytest.param(6, 23, dict(causal=True, window=7), "cast", id="sliding-window-over-cache-cast"),
    pytest.param(11, 11, dict(causal=False, window=3), "select", id="window-not-causal"),
    pytest.param(9, 9, dict(causal=False), "where", id="bidirectional"),
    pytest.param(10, 10, dict(causal=True, prefix=4), "where", id="prefix-lm-or"),
])
def test_range_built_mask_counts_its_true_entries(held, s_q, t, kind, combine):
    model = range_masked_model(s_q, t, combine=combine, **kind)
    r = flopcount.count(model, convention="dense", attention="executed")
    assert r.total.flops == products(true_entries(B, s_q, t, **kind))
    assert flopcount.count(model, convention="dense").total.flops == products(B * s_q * t)  # full: every pair
    assert "position comparisons in the graph" in r.attention


@pytest.mark.parametrize("s_q, t, kind", [
    pytest.param(7, 7, dict(causal=True), id="causal"),
    pytest.param(5, 17, dict(causal=True, window=6), id="sliding-window-over-cache"),
])
def test_attention_operator_with_a_range_built_attn_mask(held, s_q, t, kind):
    r = flopcount.count(range_masked_model(s_q, t, operator=True, **kind), convention="dense", attention="executed")
    assert r.total.macs == HEADS * true_entries(B, s_q, t, **kind) * (E + EV)  # Q·Kᵀ and probs·V per kept pair
    full = flopcount.count(range_masked_model(s_q, t, operator=True, **kind), convention="dense")
    assert full.total.macs == HEADS * B * s_q * t * (E + EV)
    assert "position comparisons in the graph" in r.attention


@pytest.mark.parametrize("order", [
    pytest.param([5, 4, 3, 2, 1, 0], id="keys-in-falling-positions"),
    pytest.param([0, 2, 4, 1, 3, 5], id="keys-kept-apart"),
    pytest.param([3, 0, 4, 1, 5, 2], id="keys-kept-apart-2"),
])
def test_permuted_key_positions(held, order):
    """Key j at position order[j], kept when p − 2 < order[j] ≤ p: falling positions keep one interval of keys per
    row, interleaved ones keep keys apart (counted from the mask's array)."""
    r = flopcount.count(range_masked_model(6, 6, order=np.array(order), window=2), convention="dense",
                        attention="executed")
    kept = sum(1 for p in range(6) for j in range(6) if p - 2 < order[j] <= p)
    assert r.total.flops == products(B * kept)


def test_keys_kept_apart_in_a_long_sequence_count_full_and_say_so(held):
    """Keys at interleaved positions (j mod 2 · 50 + j div 2) over 100 × 100 scores: exact from the array; held by
    rows (as a long sequence is) a row keeps keys apart, which is not modelled: counted full, and said."""
    t, w = 100, 3
    m = range_masked_model(t, t, window=w, batch=1)
    nodes = list(m.graph.node)
    at = next(k for k, n in enumerate(nodes) if n.output[0] == "kpos")
    nodes[at] = helper.make_node("Range", ["zero", "t", "one"], ["j"])
    nodes[at + 1:at + 1] = [helper.make_node("Mod", ["j", "two"], ["odd"]),
                            helper.make_node("Div", ["j", "two"], ["half"]),
                            helper.make_node("Mul", ["odd", "fifty"], ["base"]),
                            helper.make_node("Add", ["base", "half"], ["kpos"])]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    m.graph.initializer.append(const("fifty", t // 2))
    r = flopcount.count(m, convention="dense", attention="executed")
    position = [j % 2 * (t // 2) + j // 2 for j in range(t)]
    kept = sum(1 for p in range(t) for j in range(t) if p - w < position[j] <= p)
    if held == "array":
        assert r.total.flops == HEADS * 2 * kept * (E + EV)
    else:
        assert r.total.flops == HEADS * 2 * t * t * (E + EV)
        assert "was not evaluated" in r.attention and "counted full" in r.attention


def test_attention_nodes_of_equal_shapes_and_different_masks():
    """Two Attention nodes on the same Q, K, V: one under the causal mask, one under causal and a window of 3."""
    s = 9
    m = range_masked_model(s, s, window=3, operator=True)
    m.graph.node.append(helper.make_node("Attention", ["q", "k", "v", "causal"], ["y2"]))
    m.graph.output.append(helper.make_tensor_value_info("y2", TensorProto.FLOAT, None))
    r = flopcount.count(m, convention="dense", attention="executed")
    kept = true_entries(B, s, s, causal=True, window=3) + true_entries(B, s, s, causal=True)
    assert r.total.macs == HEADS * kept * (E + EV)


def test_the_report_names_the_mask_found():
    r = flopcount.count(range_masked_model(5, 17, window=3), convention="dense", attention="executed")
    assert r.attention == "executed: causal + sliding window 3, from position comparisons in the graph (1 attentions)"


def test_padding_from_the_attention_mask_values(held):
    """Right-padded sequences of 9 and 4 valid tokens: each valid query keeps the valid keys at or before it (the
    graph's mask also keeps keys for the padded queries, which a kernel does not run)."""
    values = [[1] * 9, [1] * 4 + [0] * 5]
    r = flopcount.count(range_masked_model(9, 9, padding=True), convention="dense", attention="executed",
                        input_values={"attention_mask": values})
    assert r.total.flops == products(true_entries(B, 9, 9, causal=True, lengths=(9, 4)))
    assert r.attention == ("executed: causal + padding (lengths 9, 4), from position comparisons in the graph and the "
                           "attention_mask values (1 attentions)")


def test_a_mask_read_from_an_input_without_values_counts_full():
    r = flopcount.count(range_masked_model(9, 9, padding=True), convention="dense", attention="executed")
    assert r.total.flops == products(B * 9 * 9)
    assert "is data, not structure" in r.attention and "'attention_mask'" in r.attention


@pytest.mark.parametrize("window", [None, 4096])
def test_long_sequences_are_counted_exactly_and_fast(window):
    """131072 positions: the 2^34-entry mask is held by its rows, never built."""
    s = 131072
    start = time.perf_counter()
    r = flopcount.count(range_masked_model(s, s, window=window, batch=1), convention="dense", attention="executed")
    elapsed = time.perf_counter() - start
    # causal: S(S+1)/2; with a window of w: w(w+1)/2 for the first w rows, then w per row
    kept = s * (s + 1) // 2 if window is None else window * (window + 1) // 2 + (s - window) * window
    assert r.total.flops == products(kept)
    assert elapsed < 10


def test_cli_takes_the_attention_mask_values(tmp_path):
    """``--input-value attention_mask=...``: flat values take the input's shape [2, 9]."""
    path = tmp_path / "masked.onnx"
    import onnx

    onnx.save(range_masked_model(9, 9, padding=True), path)
    values = ",".join(map(str, [1] * 9 + [1] * 4 + [0] * 5))
    p = subprocess.run([sys.executable, "-m", "flopcount", str(path), "--convention", "dense", "--attention",
                        "executed", "--input-value", f"attention_mask={values}"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"Total FLOPs: {products(true_entries(B, 9, 9, causal=True, lengths=(9, 4))):,}" in p.stdout
    assert "Attention: executed: " in p.stdout and "the attention_mask values" in p.stdout


def test_a_graph_mask_for_scores_of_another_size():
    """Counted over the scores it was evaluated for; over others, by the structure it was recognised as, else all."""
    kept = np.array([[1, 2, 3]])  # causal over 3 positions
    causal = graph_masks.GraphMask(kept, 3, flopcount.masks.AttentionMask(causal=True))
    assert causal.pairs(2, 3, 3).pairs == 2 * (1 + 2 + 3)
    assert causal.pairs(1, 4, 4).pairs == 4 * 5 // 2
    assert graph_masks.GraphMask(kept, 3).pairs(1, 4, 4).pairs == 4 * 4
