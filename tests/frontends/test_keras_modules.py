"""Per-layer counts of a Keras model through the frontend: layers as Keras names them (nested ones by path,
``block1/c1``), a layer called twice summed, every figure a closed form."""

from __future__ import annotations

import pytest

import flopcount

pytest.importorskip("tf2onnx")
keras = pytest.importorskip("keras")


def test_layers_of_a_functional_model_with_a_nested_block_called_twice(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_CACHE", "0")
    inp = keras.Input((16, 16, 3), name="img")
    x = keras.layers.Conv2D(4, 3, name="stem")(inp)  # valid: 14x14x4
    x = keras.layers.BatchNormalization(name="stem_bn")(x)
    block = keras.Sequential([keras.layers.Conv2D(4, 3, padding="same", name="c1"), keras.layers.ReLU(name="act")],
                             name="block1")
    x = block(block(x))
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    model = keras.Model(inp, keras.layers.Dense(5, name="head")(x), name="net")

    report = flopcount.from_keras(model, (1, 16, 16, 3))
    act = 14 * 14 * 4  # elements of every activation after the stem
    stem = 2 * act * 3 * 3 * 3 + act  # products (2 FLOPs per MAC over a 3x3x3 window) and the bias
    c1 = 2 * act * 3 * 3 * 4 + act
    rows = {r.module: (r.depth, r.flops, r.params) for r in report.by_module(2)}
    assert rows == {
        "stem": (1, stem, 3 * 3 * 3 * 4 + 4),
        "stem_bn": (1, act, 4 + 4),  # one FLOP per element; gamma and beta (the moving statistics are buffers)
        "block1": (1, 2 * (c1 + act), 3 * 3 * 4 * 4 + 4),  # two calls, weights once
        "block1/c1": (2, 2 * c1, 3 * 3 * 4 * 4 + 4),
        "block1/act": (2, 2 * act, 0),
        "gap": (1, act, 0),  # each element read once
        "head": (1, 2 * 4 * 5 + 5, 4 * 5 + 5),
    }
    assert report.params == model.count_params() - 2 * 4  # less the moving mean and variance
