"""Keras recurrent layers (TensorFlow 2.21, Keras 3) converted by tf2onnx 1.17: each layer becomes an ONNX ``Loop``
whose trip count is the sequence length, whose condition is TensorFlow's while test, and whose body declares every
carried state with a symbolic first dim (``['unk__477', H]``) when the batch is open.

Two conversions: the project's own (``from_keras``, static shapes, the variables as weightless initializers) and
the one a third party ships (``tf2onnx.convert.from_function`` with the batch and the sequence length left open,
the variables as graph inputs), counted with ``input_shapes``.

Closed forms, per time step, batch B, input size I, hidden size H, in the convention of the ONNX recurrent
operators (``operators/recurrent.py``): the gate products count 2 FLOPs per MAC over I + H for each of the g·H
gate units, the two gate sums (the recurrent product's and the bias's) 1 FLOP each per gate unit, each activation
evaluation 1 FLOP, and the cell's own element-wise work 1 FLOP per operation:

* LSTM (g = 4): 2·B·4H·(I + H) + 2·B·4H + 5·B·H (3 sigmoids, 2 tanh) + 4·B·H (c = f·c + i·g̃: 2 products and a
  sum; h = o·tanh(c): 1 product);
* GRU (g = 3, Keras 3's ``reset_after=True``: an input and a recurrent bias): 2·B·3H·(I + H) + 2·B·3H
  + 3·B·H (2 sigmoids, 1 tanh) + 2·B·H (the gates' sums z, r) + 2·B·H (r·(hU)_h and its sum) + 4·B·H
  (h = (1 − z)·h̃ + z·h: a difference, 2 products, a sum);
* SimpleRNN (g = 1): 2·B·H·(I + H) + 2·B·H + B·H (tanh).

Around each step tf2onnx's while test compares two counters, cast to float: 2 FLOPs per step (and one comparison
before the loop, at the top level).
"""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("tf2onnx")

import flopcount
from flopcount.cli import main
from flopcount.frontends import keras as frontend

tf, keras, tf2onnx = frontend.import_frameworks()

B, S, I, H = 3, 7, 5, 11  # distinct odd sizes: a swapped dim cannot pass
WHILE_TEST = 2  # FLOPs per step of tf2onnx's while condition (two float comparisons)


def lstm_step(i: int, h: int = H, b: int = B) -> int:
    return 2 * b * 4 * h * (i + h) + 2 * b * 4 * h + 5 * b * h + 4 * b * h


def gru_step(i: int, h: int = H, b: int = B) -> int:
    return 2 * b * 3 * h * (i + h) + 2 * b * 3 * h + 3 * b * h + 2 * b * h + 2 * b * h + 4 * b * h


def rnn_step(i: int, h: int = H, b: int = B) -> int:
    return 2 * b * h * (i + h) + 2 * b * h + b * h


def loop(step: int) -> int:
    return S * (step + WHILE_TEST)


CASES = {
    # name: (layers, FLOPs of each Loop in graph order, MACs)
    "lstm": (lambda: [keras.layers.LSTM(H)], [loop(lstm_step(I))], S * B * 4 * H * (I + H)),
    "gru": (lambda: [keras.layers.GRU(H)], [loop(gru_step(I))], S * B * 3 * H * (I + H)),
    "simple_rnn": (lambda: [keras.layers.SimpleRNN(H)], [loop(rnn_step(I))], S * B * H * (I + H)),
    "bidirectional": (lambda: [keras.layers.Bidirectional(keras.layers.LSTM(H))], [loop(lstm_step(I))] * 2,
                      2 * S * B * 4 * H * (I + H)),
    "stacked": (lambda: [keras.layers.LSTM(H, return_sequences=True), keras.layers.LSTM(H)],
                [loop(lstm_step(I)), loop(lstm_step(H))], S * B * 4 * H * (I + H) + S * B * 4 * H * (H + H)),
}


def build(name: str, length: int | None = S) -> keras.Model:
    return keras.Sequential([keras.Input((length, I)), *CASES[name][0]()], name=name)


def third_party(name: str):
    """The model as tf2onnx's public ``from_function`` writes it with the batch and sequence length open."""
    model = build(name, length=None)
    trainable, fixed = model.trainable_variables, model.non_trainable_variables
    signature = [tf.TensorSpec((None, None, I), tf.float32, name="x"),
                 [tf.TensorSpec(v.shape, v.dtype) for v in trainable], [tf.TensorSpec(v.shape, v.dtype) for v in fixed]]
    function = tf.function(lambda x, t, n: model.stateless_call(t, n, x)[0])
    converted, _ = tf2onnx.convert.from_function(function, input_signature=signature, opset=18)
    return converted


def check(report, name: str, graph) -> None:
    _, loops, macs = CASES[name]
    counted = [n for n in report.nodes if n.op_type == "Loop"]
    assert [n.cost.flops for n in counted] == loops
    outside = sum(1 for n in graph.node if n.op_type == "Less")  # the while test before each loop: 1 FLOP
    assert report.forward.flops == sum(loops) + outside
    assert report.forward.macs == macs
    assert report.upper_bounds["Loop"][0] == len(loops)
    assert f"{S} iterations counted" in report.upper_bounds["Loop"][1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(frontend.common.CACHE_ENV, str(tmp_path / "cache"))


@pytest.mark.parametrize("name", list(CASES))
def test_from_keras_counts_recurrent_layers_as_loops(cache, name):
    model = build(name)
    report = flopcount.from_keras(model, batch=B)
    check(report, name, frontend.to_onnx(model, batch=B).graph)
    assert report.params == sum(int(w.numpy().size) for w in model.weights)


@pytest.mark.parametrize("name", ["lstm", "gru", "bidirectional", "stacked"])
def test_third_party_files_with_open_batch_and_length(name, tmp_path, capsys):
    # every state declared ['unk__N', H]: the outer batch B wins; the stacked first layer is S long for the second
    converted = third_party(name)
    report = flopcount.count(converted, input_shapes={"x": (B, S, I)})
    check(report, name, converted.graph)
    if name == "stacked":
        assert "stacked output taken 7 long" in report.upper_bounds["Loop"][1]
        path = tmp_path / "stacked.onnx"
        path.write_bytes(converted.SerializeToString())
        assert main([str(path), "--input-shape", f"x={B}x{S}x{I}"]) == 0
        assert f"Upper bound for Loop (2 nodes): {S} iterations counted" in capsys.readouterr().out
        # --loop-trips on the first layer's Loop: it runs N = 4 steps, its stack is 4 long, so the second layer's
        # Loop (trip count: the stack's length) runs 4 steps too, still an upper bound by its own condition
        first = next(n.name for n in report.nodes if n.op_type == "Loop")
        given = flopcount.count(converted, input_shapes={"x": (B, S, I)}, loop_trips={first: 4})
        assert [n.cost.flops for n in given.nodes if n.op_type == "Loop"] == [
            4 * (lstm_step(I) + WHILE_TEST), 4 * (lstm_step(H) + WHILE_TEST)]
        assert given.upper_bounds["Loop"][0] == 1 and "4 iterations counted" in given.upper_bounds["Loop"][1]


# --- training: the backward through time, in the convention of docs/training.md ---------------------------------
#
# The input x is data and the initial states h0 (and the LSTM's c0) are zeros: neither needs a gradient. So every
# step computes the weight gradients of its products (dW = Aᵀ·dY, the forward's MACs each), but the recurrent
# product h·U computes dh only from the second step on (the first iteration "without the input gradients the carry
# adds"); a layer fed by another one (stacked) computes dx at every step. The while test passes no gradient.


def products_backward(k: int, i: int, dx: bool, h: int = H, b: int = B) -> int:
    """Dense backward of one recurrent layer with k gates over S steps: dW and dU every step (2·B·kH·(I + H)),
    dh on steps 2..S (2·B·kH·H), dx at every step when the input needs a gradient (2·B·kH·I)."""
    return S * 2 * b * k * h * (i + h) + (S - 1) * 2 * b * k * h * h + (S * 2 * b * k * h * i if dx else 0)


DENSE_BACKWARD = {
    "lstm": products_backward(4, I, dx=False),
    "gru": products_backward(3, I, dx=False),
    "simple_rnn": products_backward(1, I, dx=False),
    "bidirectional": 2 * products_backward(4, I, dx=False),
    "stacked": products_backward(4, I, dx=False) + products_backward(4, H, dx=True),
}


@pytest.mark.parametrize("name", list(CASES))
def test_training_products_are_the_backward_through_time(cache, name):
    report = flopcount.from_keras(build(name), batch=B, mode="train", convention="dense")
    assert not report.backward_unsupported
    assert report.backward.flops == DENSE_BACKWARD[name]


def simple_rnn_backward() -> int:
    """Default convention, per step, for tf2onnx's body Gemm(x_t, W, b) -> Gemm(h, U, C) -> Tanh:
    Tanh dY·(1 − Y²): 3·B·H; Gemm(h, U, C): dU 2·B·H·H (+ dh 2·B·H·H from step 2), and dC (C depends on W, b):
    |Y| = B·H additions; Gemm(x_t, W, b): dW 2·B·I·H and db, summed over the batch: B·H additions."""
    step = 3 * B * H + 2 * B * H * H + B * H + 2 * B * I * H + B * H
    return S * step + (S - 1) * 2 * B * H * H


def lstm_backward() -> int:
    """Default convention, per step, for tf2onnx's body MatMul(h, U) -> Gemm(x_t, W, C) -> Add(b) -> Split ->
    3 Sigmoid, Tanh -> c = σ_f·c + σ_i·g̃ -> h = σ_o·tanh(c), with G = B·4H:
    MatMul(h, U): dU 2·B·H·4H (+ dh 2·B·H·4H from step 2); Gemm: dW 2·B·I·4H and dC |Y| = G;
    Add of the bias b[4H]: dY summed over the batch, G − 4H; 3 Sigmoid and 2 Tanh, dY·Y·(1 − Y) and dY·(1 − Y²):
    5·3·B·H; Mul dA = dY·B per input needing one: σ_f·c 1 (+ 1 for dc from step 2), σ_i·g̃ 2, σ_o·tanh(c) 2;
    Add and Split 0."""
    g = B * 4 * H
    step = 2 * B * H * 4 * H + 2 * B * I * 4 * H + g + (g - 4 * H) + 5 * 3 * B * H + (1 + 2 + 2) * B * H
    return S * step + (S - 1) * (2 * B * H * 4 * H + B * H)


@pytest.mark.parametrize("name, backward", [
    pytest.param("simple_rnn", simple_rnn_backward, id="simple_rnn"),
    pytest.param("lstm", lstm_backward, id="lstm"),
])
def test_training_counts_every_op_of_the_backward_through_time(cache, name, backward):
    report = flopcount.from_keras(build(name), batch=B, mode="train")
    assert not report.backward_unsupported
    assert report.backward.flops == backward()
