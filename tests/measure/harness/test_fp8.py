"""fp8 runs: torchao Float8Linear modules and TransformerEngine's fp8_autocast are seen, and the peak is weighted by
the work each dtype does (matrix products in fp8, attention in bf16)."""

from __future__ import annotations

import contextlib
import sys
import types

import pytest

import flopcount
from flopcount.measure.harness.mfu import Precision, detect_precision, effective_peak
from flopcount.measure.machine.devices import Device, Peak

T = 1e12
GPU = Device("cuda", "test GPU", peaks={"fp8": Peak(2000 * T, "fp8 sheet"), "bf16": Peak(1000 * T, "bf16 sheet"),
                                        "fp32": Peak(100 * T, "fp32 sheet")})


def test_peak_weighted_by_the_work_of_each_dtype():
    # per sample: 900 FLOPs of matrix products, 300 of them attention; 100 other; no convolution
    parts = {"conv": 0.0, "matmul": 900.0, "attention": 300.0, "other": 100.0}
    precision = detect_precision("cuda", None, "bf16", None, fp8="torchao Float8Linear modules (2)")
    assert (precision.conv, precision.matmul, precision.attention) == ("bf16", "fp8", "bf16")
    assert precision.label == "conv bf16, matmul fp8, attention bf16"
    peak = effective_peak(GPU, precision, parts)
    # fp8: 600 non-attention products + the 100 other (with the largest part); bf16: 300 attention
    assert peak.flops_per_s == pytest.approx(1000 / (700 / (2000 * T) + 300 / (1000 * T)))
    assert "70.0% at the fp8 peak" in peak.source and "30.0% at the bf16 peak" in peak.source
    # without fp8 the same work divides by one peak, as before
    assert effective_peak(GPU, Precision("bf16", "bf16", "autocast"), parts).flops_per_s == 1000 * T


def test_a_part_without_its_peak_gives_a_null_peak_with_the_reason():
    cpu = Device("cpu", "test CPU", peaks={"fp32": Peak(1e11, "measured")})
    precision = detect_precision("cpu", None, None, "fp32", fp8="TransformerEngine fp8_autocast seen in the steps")
    peak = effective_peak(cpu, precision, {"conv": 0.0, "matmul": 10.0, "attention": 2.0, "other": 1.0})
    assert peak.flops_per_s is None and "no fp8 peak" in peak.source


def _train(meter, model, torch, steps=6, context=contextlib.nullcontext):
    x = torch.randn(16, 64)
    for _ in range(steps):
        with meter.step(samples=16), context():
            model(x).square().mean().backward()


def test_torchao_float8_linear_is_seen_on_a_real_run():
    torch = pytest.importorskip("torch")
    float8 = pytest.importorskip("torchao.float8")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 16))
    float8.convert_to_float8_training(model)
    m = flopcount.Meter(flops_per_sample=1e4, warmup_steps=1, window_steps=2, energy=False)
    m.detect_fp8(model)
    _train(m, model, torch)
    r = m.result(device=GPU)
    assert r.precision == "conv fp32, matmul fp8, attention fp32" and "torchao Float8Linear modules (2)" in r.how["precision"]
    assert r.peak_flops == 2000 * T  # no counting report: every product at the fp8 peak
    assert r.mfu == pytest.approx(r.flops / (2000 * T))


def test_a_float8_linear_stand_in_is_seen_through_model():
    torch = pytest.importorskip("torch")

    class Float8Linear(torch.nn.Linear):  # stands in for torchao's class, which is recognised by its name
        pass

    model = torch.nn.Sequential(Float8Linear(64, 16))
    m = flopcount.Meter(model=model, example_inputs=(16, 64), warmup_steps=1, window_steps=2, energy=False)
    assert m._fp8 == "torchao Float8Linear modules (1)"


def test_transformer_engine_fp8_autocast_is_seen_in_the_steps(monkeypatch):
    torch = pytest.importorskip("torch")
    state = {"on": False}
    manager = types.SimpleNamespace(is_fp8_enabled=lambda: state["on"])
    te = types.ModuleType("transformer_engine.pytorch")
    te.fp8 = types.SimpleNamespace(FP8GlobalStateManager=manager)

    @contextlib.contextmanager
    def fp8_autocast():  # TransformerEngine's context turns its global fp8 state on for the steps inside it
        state["on"] = True
        try:
            yield
        finally:
            state["on"] = False

    monkeypatch.setitem(sys.modules, "transformer_engine", types.ModuleType("transformer_engine"))
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te)
    model = torch.nn.Linear(64, 16)
    m = flopcount.Meter(flops_per_sample=1e4, warmup_steps=1, window_steps=2, energy=False)
    x = torch.randn(16, 64)
    for _ in range(6):
        with fp8_autocast():  # entered before the step, as a training loop does
            with m.step(samples=16):
                model(x).sum().backward()
    r = m.result(device=GPU)
    assert r.precision == "conv fp32, matmul fp8, attention fp32"
    assert r.how["precision"].startswith("TransformerEngine fp8_autocast seen in the steps")
