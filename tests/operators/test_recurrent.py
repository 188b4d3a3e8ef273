"""LSTM, GRU, RNN: gate products 2·D·S·B·g·H·(I + H) plus per-hidden-unit element-wise work,
written out here from the sizes S 5, B 3, I 7, H 11 (distinct odd, so a swapped dim cannot pass)."""

import numpy as np
import pytest
from helpers import const, model, weight
from onnx import helper

import flopcount

S, B, I, H = 5, 3, 7, 11


def rnn_model(op, gates, *, dirs=1, layout=0, bias=False, peephole=False, seq_lens=False, hidden_attr=True, **attrs):
    x = (S, B, I) if layout == 0 else (B, S, I)
    inits = [weight("W", (dirs, gates * H, I)), weight("R", (dirs, gates * H, H))]
    inits += [weight("B", (dirs, 2 * gates * H))] if bias else []
    inits += [const("seq", [S] * B, np.int32)] if seq_lens else []
    inits += [weight("P", (dirs, 3 * H))] if peephole else []
    names = ["x", "W", "R", "B" if bias else "", "seq" if seq_lens else "", "", "", "P" if peephole else ""]
    while names[-1] == "":
        names.pop()
    if dirs == 2:
        attrs["direction"] = "bidirectional"
    if hidden_attr:
        attrs["hidden_size"] = H
    node = helper.make_node(op, names, ["y", "y_h"], layout=layout, **attrs)
    return model([node], {"x": x}, ["y", "y_h"], inits)


LSTM_EW = 5 + 3 + 1  # 5 activations, c = f⊙c + i⊙g (3), h = o⊙tanh(c) (1)
GRU_EW = 3 + 1 + 4  # 3 activations, r⊙h (1), h = (1 − z)⊙ĥ + z⊙h (4)
RNN_EW = 1  # 1 activation

CASES = [
    # op, gates, rnn_model kwargs, FLOPs per hidden unit, step and direction beyond the products,
    # transcendentals per hidden unit and step summed over the directions
    pytest.param("LSTM", 4, {}, LSTM_EW, 3 + 2, id="lstm"),
    pytest.param("LSTM", 4, {"bias": True}, LSTM_EW + 2 * 4, 3 + 2, id="lstm-bias"),
    pytest.param("LSTM", 4, {"bias": True, "peephole": True}, LSTM_EW + 2 * 4 + 3 + 3, 3 + 2, id="lstm-bias-peephole"),
    pytest.param("LSTM", 4, {"peephole": True}, LSTM_EW + 3 + 3, 3 + 2, id="lstm-peephole-no-bias"),
    pytest.param("LSTM", 4, {"dirs": 2, "bias": True}, LSTM_EW + 2 * 4, 2 * (3 + 2), id="lstm-bidirectional"),
    pytest.param("LSTM", 4, {"layout": 1}, LSTM_EW, 3 + 2, id="lstm-layout1"),
    pytest.param("LSTM", 4, {"hidden_attr": False}, LSTM_EW, 3 + 2, id="lstm-hidden-from-W"),
    pytest.param("LSTM", 4, {"clip": 3.0}, LSTM_EW + 5, 3 + 2, id="lstm-clip"),
    pytest.param("LSTM", 4, {"input_forget": 1}, LSTM_EW, 3 + 2, id="lstm-input-forget"),
    pytest.param("LSTM", 4, {"activations": ["HardSigmoid", "Softplus", "Elu"]}, LSTM_EW, 3 * 0 + 2 + 1,
                 id="lstm-activations"),
    pytest.param("LSTM", 4, {"dirs": 2, "activations": ["Sigmoid", "Tanh", "Tanh", "HardSigmoid", "Relu", "Softsign"]},
                 LSTM_EW, (3 + 1 + 1) + 0, id="lstm-bidirectional-mixed-activations"),
    pytest.param("GRU", 3, {}, GRU_EW, 2 + 1, id="gru"),
    pytest.param("GRU", 3, {"linear_before_reset": 1}, GRU_EW + 1, 2 + 1, id="gru-linear-before-reset"),
    pytest.param("GRU", 3, {"bias": True}, GRU_EW + 2 * 3, 2 + 1, id="gru-bias"),
    pytest.param("GRU", 3, {"bias": True, "linear_before_reset": 1}, GRU_EW + 1 + 2 * 3, 2 + 1, id="gru-lbr-bias"),
    pytest.param("GRU", 3, {"dirs": 2, "layout": 1}, GRU_EW, 2 * (2 + 1), id="gru-bidirectional-layout1"),
    pytest.param("GRU", 3, {"clip": 2.0, "hidden_attr": False}, GRU_EW + 3, 2 + 1, id="gru-clip-hidden-from-W"),
    pytest.param("RNN", 1, {}, RNN_EW, 1, id="rnn"),
    pytest.param("RNN", 1, {"bias": True}, RNN_EW + 2, 1, id="rnn-bias"),
    pytest.param("RNN", 1, {"activations": ["Relu"]}, RNN_EW, 0, id="rnn-relu"),
    pytest.param("RNN", 1, {"dirs": 2, "layout": 1}, RNN_EW, 2 * 1, id="rnn-bidirectional-layout1"),
    pytest.param("RNN", 1, {"clip": 1.0}, RNN_EW + 1, 1, id="rnn-clip"),
]


@pytest.mark.parametrize("op, gates, kw, per_unit, trans", CASES)
def test_recurrent(op, gates, kw, per_unit, trans):
    r = flopcount.count(rnn_model(op, gates, **kw))
    dirs = kw.get("dirs", 1)
    macs = dirs * S * B * gates * H * (I + H)  # X_t·Wᵀ and H_{t−1}·Rᵀ per step and direction
    assert r.total.macs == macs
    assert r.total.flops == 2 * macs + dirs * S * B * H * per_unit
    assert r.total.transcendentals == S * B * H * trans
    assert r.nodes[0].family == "recurrent"


def test_table3_one_flop_per_mac_no_bias():
    r = flopcount.count(rnn_model("LSTM", 4, bias=True), convention="table3")
    assert r.total.flops == S * B * 4 * H * (I + H) + S * B * H * LSTM_EW


def test_sequence_lens_ignored():
    with_lens = flopcount.count(rnn_model("GRU", 3, bias=True, seq_lens=True)).total
    assert with_lens == flopcount.count(rnn_model("GRU", 3, bias=True)).total
    assert with_lens.macs == S * B * 3 * H * (I + H)


def test_unknown_activation_is_reported():
    with pytest.raises(flopcount.InvalidGraphError, match="Swish"):
        flopcount.count(rnn_model("RNN", 1, activations=["Swish"]))


@pytest.mark.parametrize("op, gates, bidirectional", [
    pytest.param("GRU", 3, False, id="gru"),
    pytest.param("GRU", 3, True, id="gru-bidirectional"),
    pytest.param("RNN", 1, False, id="rnn"),
    pytest.param("RNN", 1, True, id="rnn-bidirectional"),
])
def test_products_match_torch_flop_counter(op, gates, bidirectional):
    # torch counts only the gate products (addmm over X and H); it does not count aten.lstm at all
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    layer = getattr(torch.nn, op)(I, H, bidirectional=bidirectional)
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        layer(torch.zeros(S, B, I))
    dirs = 2 if bidirectional else 1
    assert fc.get_total_flops() == 2 * dirs * S * B * gates * H * (I + H)
    assert flopcount.count(rnn_model(op, gates, dirs=dirs)).total.macs * 2 == fc.get_total_flops()
