"""The PyTorch frontend, continued: counts that never depend on weight values, an export cache keyed on what the
export depends on, inputs given the way ``forward()`` takes them (dtypes, keywords, trained inputs), and models too
big to instantiate.

Expected counts are closed forms written out here from the layer sizes, with distinct odd sizes.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from torch import nn

from flopcount import from_torch
from flopcount.frontends import torch as frontend

N, C_IN, C_OUT, H, W, K = 2, 3, 5, 7, 9, 3


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh export cache per test, also as $FLOPCOUNT_CACHE (so nothing goes to ~/.cache)."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(frontend.CACHE_ENV, str(folder))
    return folder


# ---------------------------------------------------------------------------------------------------------------
# Counts never depend on weight values
# ---------------------------------------------------------------------------------------------------------------


def conv(bias: float | None) -> nn.Module:
    """Conv C_IN→C_OUT, K×K, padding 1, with every bias element set to ``bias`` (or no bias)."""
    layer = nn.Conv2d(C_IN, C_OUT, K, padding=1, bias=bias is not None)
    if bias is not None:
        nn.init.constant_(layer.bias, bias)
    return layer


Y = N * C_OUT * H * W  # output elements (padding 1 keeps H×W)
CONV_PRODUCTS = 2 * Y * K * K * C_IN
CONV_PARAMS = C_OUT * C_IN * K * K


@pytest.mark.parametrize("bias", [0.0, 0.1, -2.5], ids=["zero-bias", "bias=0.1", "bias=-2.5"])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_a_zero_bias_counts_like_any_other(cache, bias, mode):
    report = from_torch(conv(bias), (N, C_IN, H, W), mode=mode)
    assert report.forward.flops == CONV_PRODUCTS + Y  # products + one add per output for the bias
    assert report.params == CONV_PARAMS + C_OUT
    if mode == "train":
        # dW = dY ⋆ X: the forward products again (X is data: no dX); dB = Σ dY: one add per output
        assert report.backward.flops == CONV_PRODUCTS + Y
        assert report.trainable_params == CONV_PARAMS + C_OUT


def test_no_bias_is_still_dropped(cache):
    """aten.conv2d(bias=None) reaches ONNX as a Conv with a zero bias the exporter builds; that one goes."""
    report = from_torch(conv(None), (N, C_IN, H, W))
    assert report.forward.flops == CONV_PRODUCTS and report.params == CONV_PARAMS


class TwoLinears(nn.Module):
    """Two Linear(4, 4) on inputs with different batches (so the TorchScript exporter runs, in eval mode)."""

    def __init__(self, same_values: bool):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)
        if same_values:
            with torch.no_grad():
                for p in (*self.a.parameters(), *self.b.parameters()):
                    p.fill_(0.5)

    def forward(self, x, y):
        return self.a(x) + self.b(y).sum(0)


@pytest.mark.parametrize("same_values", [False, True], ids=["distinct", "equal-values"])
def test_parameters_with_equal_values_stay_apart(cache, same_values):
    report = from_torch(TwoLinears(same_values), ((2, 4), (3, 4)))
    assert report.params == 2 * (4 * 4 + 4)


def test_tied_weights_are_one_parameter(cache):
    module = TwoLinears(False)
    module.b.weight = module.a.weight  # the same tensor: one parameter, as torch counts it
    assert report_params(module) == sum(p.numel() for p in module.parameters()) == 4 * 4 + 2 * 4  # one weight, two biases


def report_params(module) -> int:
    return from_torch(module, ((2, 4), (3, 4))).params
