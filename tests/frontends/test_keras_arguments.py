"""``flopcount.from_keras`` checks its arguments at the call: each of the wrong type or range is a one-line
:class:`~flopcount.errors.UsageError` naming it and what it got, before tf2onnx converts anything (a raw
``TypeError`` from deep inside tf2onnx or the cache, a conversion error that blames the model, or a silently
accepted value otherwise)."""

from __future__ import annotations

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("tf2onnx")

import flopcount
from flopcount.errors import UsageError
from flopcount.frontends import keras as frontend

tf, keras, tf2onnx = frontend.import_frameworks()
IN, OUT = 5, 3


def dense_model():
    return keras.Sequential([keras.Input((IN,)), keras.layers.Dense(OUT)], name="dense")


@pytest.fixture
def conversions(monkeypatch):
    """The conversions tf2onnx runs (none may start for a refused argument); no cache, so each call converts."""
    done = []
    convert = frontend._convert

    def recorded(*args, **kwargs):
        done.append(args)
        return convert(*args, **kwargs)

    monkeypatch.setattr(frontend, "_convert", recorded)
    return done


@pytest.mark.parametrize("kwargs, fragments", [
    pytest.param({"training": "yes"}, ["from_keras: training must be True, False or None", "'yes' (str)"],
                 id="training-str"),
    pytest.param({"training": 1}, ["from_keras: training must be", "1 (int)"], id="training-int"),
    pytest.param({"opset": 17.5}, ["from_keras: opset must be a positive int", "17.5 (float)"], id="opset-float"),
    pytest.param({"opset": "18"}, ["from_keras: opset must be a positive int", "'18' (str)"], id="opset-str"),
    pytest.param({"opset": True}, ["from_keras: opset must be a positive int", "True (bool)"], id="opset-bool"),
    pytest.param({"opset": 0}, ["from_keras: opset must be a positive int", "0 (int)"], id="opset-zero"),
    pytest.param({"opset": 99}, ["opset 99 is newer than tf2onnx", "at most"], id="opset-too-new"),
    pytest.param({"cache_dir": 3}, ["from_keras: cache_dir must be a folder path", "3 (int)"], id="cache_dir-int"),
    pytest.param({"batch": 1.5}, ["from_keras: batch must be a positive int", "1.5 (float)"], id="batch-float"),
    pytest.param({"batch": "8"}, ["from_keras: batch must be a positive int", "'8' (str)"], id="batch-str"),
    pytest.param({"batch": 0}, ["from_keras: batch must be a positive int", "0 (int)"], id="batch-zero"),
    pytest.param({"input_shapes": "1x5"}, ["input_shapes must be a shape such as (1, 224, 224, 3)", "'1x5'"],
                 id="shapes-str"),
    pytest.param({"input_shapes": (1, 5.0)}, ["input_shapes must be a shape", "(1, 5.0)"], id="shapes-float-dim"),
    pytest.param({"input_shapes": (0, IN)}, ["zero or negative dim", f"(0, {IN})"], id="shapes-zero-batch"),
    pytest.param({"input_shapes": (1, IN, 2)}, [f"has shape (None, {IN})", f"(1, {IN}, 2)"], id="shapes-rank"),
    pytest.param({"input_shapes": {"nope": (1, IN)}}, ["has no input named 'nope'"], id="shapes-unknown-name"),
    pytest.param({"strict": "yes"}, ["from_keras: strict must be True or False", "'yes' (str)"], id="strict-str"),
    pytest.param({"loop_trips": [3]}, ["from_keras: loop_trips must be a mapping"], id="loop_trips-list"),
    pytest.param({"trainable": "dense/kernel"}, ["from_keras: trainable must be a list"], id="trainable-str"),
])
def test_from_keras_refuses_a_wrong_argument_naming_it_before_converting(kwargs, fragments, conversions):
    with pytest.raises(UsageError) as caught:
        flopcount.from_keras(dense_model(), cache_dir=kwargs.pop("cache_dir", False), **kwargs)
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message
    assert conversions == []


@pytest.mark.parametrize("model", [
    pytest.param("model.keras", id="path"), pytest.param(None, id="none"), pytest.param(object(), id="object"),
])
def test_from_keras_refuses_what_is_not_a_keras_model(model, conversions):
    with pytest.raises(UsageError, match="expected a keras.Model, got"):
        flopcount.from_keras(model, cache_dir=False)
    assert conversions == []


def test_an_argument_count_does_not_take_is_named(conversions):
    with pytest.raises(TypeError, match="from_keras: got an unexpected keyword argument 'colour'"):
        flopcount.from_keras(dense_model(), cache_dir=False, colour="red")
    assert conversions == []


def test_to_onnx_takes_training_as_a_bool_only(conversions):
    with pytest.raises(UsageError, match="to_onnx: training must be True or False, got None"):
        frontend.to_onnx(dense_model(), training=None, cache_dir=False)
    assert conversions == []


def test_right_arguments_count():
    # batch 2: x[2, 5] @ W[5, 3] is 2·2·5·3 FLOPs, and the bias 2·3
    report = flopcount.from_keras(dense_model(), batch=2, opset=17, training=False, cache_dir=False)
    assert report.forward.flops == 2 * 2 * IN * OUT + 2 * OUT
