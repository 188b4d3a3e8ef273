"""The frontends take one :class:`~flopcount.options.CountOptions`: the public keywords build it once at the call
(a bad setting is refused before any export), the internal paths adjust it with ``dataclasses.replace``, and
``ModelSource`` dispatches with it."""

from __future__ import annotations

import dataclasses

import pytest
from flopcount.frontends import common
from flopcount.frontends.source import NOT_FOR_GENERATION, ModelSource

from flopcount.errors import UsageError
from flopcount.options import CountOptions


@pytest.mark.parametrize(("kwargs", "training", "mode", "trains"), [
    pytest.param({}, None, "inference", False, id="default-inference"),
    pytest.param({"mode": "train"}, None, "train", True, id="mode-train-follows"),
    pytest.param({}, True, "train", True, id="training-graph-counts-train"),
    pytest.param({"mode": "inference"}, True, "inference", True, id="mode-given-wins"),
    pytest.param({"mode": "train"}, False, "train", False, id="inference-graph-trained"),
])
def test_options_of_resolves_training_and_mode(kwargs, training, mode, trains):
    options, resolved = common.options_of("from_torch", kwargs, training)
    assert (options.mode, resolved) == (mode, trains)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    pytest.param({"colour": 1}, TypeError, "from_torch: got an unexpected keyword argument 'colour'", id="unknown"),
    pytest.param({"batch": 0}, UsageError, "from_torch: batch must be a positive int", id="batch"),
    pytest.param({"mode": "training"}, UsageError, "unknown mode 'training'", id="mode"),
    pytest.param({"optimizer": "adam"}, UsageError, "optimizer 'adam': give one of", id="optimizer-without-train"),
])
def test_options_of_refuses_at_the_call(kwargs, error, match):
    with pytest.raises(error, match=match):
        common.options_of("from_torch", kwargs)


def test_generation_keeps_every_setting_but_shapes_batch_and_training():
    given = CountOptions(batch=3, strict=True, convention="table3", free_ops=["com.example:Marker"],
                         loop_trips={"loop": 4}, trainable=["w"])
    kept = dataclasses.replace(given, **NOT_FOR_GENERATION)
    assert (kept.strict, kept.convention, kept.free_ops, dict(kept.loop_trips)) == (
        True, "table3", ("com.example:Marker",), {"loop": 4})
    assert (kept.batch, kept.trainable, kept.mode) == (None, None, "inference")


torch = pytest.importorskip("torch")


def test_a_bad_setting_is_refused_before_the_export(monkeypatch):
    from flopcount.frontends import torch as frontend

    def exported(*args, **kwargs):
        raise AssertionError("exported before the settings were checked")

    monkeypatch.setattr(frontend, "_to_onnx", exported)
    with pytest.raises(UsageError, match="unknown attention 'some'"):
        frontend.from_torch(torch.nn.Linear(5, 3), (2, 5), attention="some", cache_dir=False)


def test_count_module_and_the_source_count_the_record(tmp_path, monkeypatch):
    from flopcount.frontends.torch import count_module, from_torch

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "tiny_linear.py").write_text("import torch\n\ndef make():\n    return torch.nn.Linear(37, 11)\n")
    # batch 7 re-sizes dim 0 of the example (given at 1): 2*7*37*11 for the products + 7*11 for the bias
    expected = 2 * 7 * 37 * 11 + 7 * 11
    options = CountOptions(batch=7)
    by_record = count_module(torch.nn.Linear(37, 11), (1, 37), options, cache_dir=False)
    by_keywords = from_torch(torch.nn.Linear(37, 11), (1, 37), batch=7, cache_dir=False)
    monkeypatch.setenv(common.CACHE_ENV, "off")
    by_source = ModelSource("torch", "tiny_linear:make", inputs={"input": (1, 37)}).count(options)
    assert by_record.total.flops == by_keywords.total.flops == by_source.total.flops == expected
    # mode="train" (a replaced record) counts the same forward pass, and the module's 37*11 + 11 parameters trained
    trained = count_module(torch.nn.Linear(37, 11), (1, 37), dataclasses.replace(options, mode="train"),
                           cache_dir=False)
    assert trained.forward.flops == expected
    assert trained.params == 37 * 11 + 11
