"""What LSTM, GRU and RNN keep for backpropagation through time (operators/recurrent.py's saved rule), against the
unique storages torch's ``saved_tensors_hooks`` catch while autograd records the ONNX equations run step by step,
each gate its own tensor, written here in torch (weights are parameters: not activations, left out)."""

from __future__ import annotations

import pytest
from onnx import helper

import flopcount
from helpers import model, weight

torch = pytest.importorskip("torch")
F = torch.nn.functional

S, B, I, H = 5, 3, 7, 11
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULTS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
ACT = {
    "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Relu": torch.relu, "Softplus": F.softplus, "Elu": F.elu,
    "HardSigmoid": lambda x: torch.clamp(x * 0.2 + 0.5, 0.0, 1.0),  # ONNX's alpha 0.2, beta 0.5
    "Affine": lambda x: x * 1.0 + 0.0,  # ONNX's alpha 1, beta 0: keeps nothing
}  # fmt: skip


def torch_saved_bytes(op, dirs=1, activations=None, clip=None, bias=False, initial_h=False,
                      linear_before_reset=0) -> int:
    """Bytes of the unique non-parameter storages autograd keeps for one run of the layer."""
    g = GATES[op]
    gen = torch.Generator().manual_seed(0)
    W = torch.nn.Parameter(torch.randn(dirs, g * H, I, generator=gen))
    R = torch.nn.Parameter(torch.randn(dirs, g * H, H, generator=gen))
    Bias = torch.nn.Parameter(torch.randn(dirs, 2 * g * H, generator=gen)) if bias else None
    x = torch.randn(S, B, I, generator=gen)
    h_init = torch.randn(dirs, B, H, generator=gen) if initial_h else None
    names = activations or DEFAULTS[op]
    n = len(DEFAULTS[op])
    params = {p.untyped_storage().data_ptr() for p in (W, R, Bias) if p is not None}
    kept: dict[int, int] = {}
    alive = []  # every saved tensor and every step's output, so that no storage is freed and its address reused

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        alive.append(t)
        if ptr not in params:
            kept[ptr] = t.untyped_storage().nbytes()
        return t

    def pre(d, k, xt, h, hidden_term=None):
        """X_t·W_kᵀ + H·R_kᵀ (+ Wb_k + Rb_k), clipped."""
        rows = slice(k * H, (k + 1) * H)
        v = xt @ W[d, rows].T + (h @ R[d, rows].T if hidden_term is None else hidden_term)
        if Bias is not None:
            v = v + Bias[d, rows] + (Bias[d, g * H + k * H:g * H + (k + 1) * H] if hidden_term is None else 0)
        return v.clamp(-clip, clip) if clip is not None else v

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        for d in range(dirs):
            f, gg, hh = [ACT[a] for a in (names[d * n:(d + 1) * n] if len(names) >= (d + 1) * n else names[:n])] \
                + [None] * (3 - n)
            h = h_init[d] if initial_h else torch.zeros(B, H)
            c = torch.zeros(B, H)
            for t in (range(S) if d == 0 else reversed(range(S))):
                xt = x[t]
                if op == "LSTM":  # gates i, o, f, c
                    i, o, fg, cand = f(pre(d, 0, xt, h)), f(pre(d, 1, xt, h)), f(pre(d, 2, xt, h)), gg(pre(d, 3, xt, h))
                    c = fg * c + i * cand
                    h = o * hh(c.clamp(-clip, clip) if clip is not None else c)
                elif op == "GRU":  # gates z, r, h
                    z, r = f(pre(d, 0, xt, h)), f(pre(d, 1, xt, h))
                    if linear_before_reset:
                        cand = gg(pre(d, 2, xt, h, hidden_term=r * (h @ R[d, 2 * H:].T)))
                    else:
                        cand = gg(pre(d, 2, xt, h, hidden_term=(r * h) @ R[d, 2 * H:].T))
                    h = (1 - z) * cand + z * h
                else:
                    h = f(pre(d, 0, xt, h))
                alive.append((h, c))
    return sum(kept.values())


def onnx_saved_bytes(op, dirs=1, activations=None, clip=None, bias=False, initial_h=False, **attrs) -> int:
    g = GATES[op]
    inits = [weight("W", (dirs, g * H, I)), weight("R", (dirs, g * H, H))]
    inits += [weight("B", (dirs, 2 * g * H))] if bias else []
    names = ["x", "W", "R", "B" if bias else "", "", "h0" if initial_h else ""]
    while names[-1] == "":
        names.pop()
    if dirs == 2:
        attrs["direction"] = "bidirectional"
    if activations:
        attrs["activations"] = activations
    if clip is not None:
        attrs["clip"] = clip
    node = helper.make_node(op, names, ["y"], hidden_size=H, **attrs)
    inputs = {"x": (S, B, I)} | ({"h0": (dirs, B, H)} if initial_h else {})
    report = flopcount.count(model([node], inputs, ["y"], inits), mode="train", memory=True, strict=True)
    assert not report.memory.missing
    (rank,) = report.memory.ranks
    return rank.activations_bytes


CASES = [
    pytest.param("LSTM", {}, id="lstm"),
    pytest.param("LSTM", {"dirs": 2, "bias": True}, id="lstm-bidirectional-bias"),
    pytest.param("LSTM", {"initial_h": True}, id="lstm-initial-h"),
    pytest.param("LSTM", {"activations": ["HardSigmoid", "Softplus", "Elu"]}, id="lstm-activations-keeping-inputs"),
    pytest.param("LSTM", {"clip": 0.5}, id="lstm-clip"),
    pytest.param("LSTM", {"clip": 0.5, "activations": ["Sigmoid", "Tanh", "Softplus"]}, id="lstm-clip-softplus-h"),
    pytest.param("GRU", {}, id="gru"),
    pytest.param("GRU", {"linear_before_reset": 1, "bias": True}, id="gru-linear-before-reset"),
    pytest.param("GRU", {"dirs": 2, "clip": 0.5}, id="gru-bidirectional-clip"),
    pytest.param("GRU", {"dirs": 2, "activations": ["Sigmoid", "Tanh", "HardSigmoid", "Softplus"]},
                 id="gru-bidirectional-mixed"),
    pytest.param("GRU", {"linear_before_reset": 1, "activations": ["HardSigmoid", "Tanh"]},
                 id="gru-linear-before-reset-hardsigmoid"),
    pytest.param("LSTM", {"activations": ["Affine", "Tanh", "Tanh"], "bias": True}, id="lstm-affine-gates"),
    pytest.param("RNN", {"activations": ["Affine"]}, id="rnn-affine"),
    pytest.param("RNN", {}, id="rnn"),
    pytest.param("RNN", {"activations": ["Relu"], "initial_h": True}, id="rnn-relu-initial-h"),
    pytest.param("RNN", {"activations": ["Softplus"], "clip": 0.5}, id="rnn-softplus-clip"),
    pytest.param("RNN", {"dirs": 2}, id="rnn-bidirectional"),
]


@pytest.mark.parametrize("op, kw", CASES)
def test_recurrent_layers_keep_what_autograd_keeps_step_by_step(op, kw):
    assert onnx_saved_bytes(op, **kw) == torch_saved_bytes(op, **kw)


def test_lstm_closed_form():
    # X (S·B·I) for dW, and per step the 4 gates, C_{t−1}, tanh(C_t) and H_{t−1}: 7·S·B·H, float32
    assert onnx_saved_bytes("LSTM") == 4 * (S * B * I + 7 * S * B * H)
