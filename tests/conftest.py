"""Fixtures shared by the tests. The model builders and other helpers live in tests/helpers.py
(``from helpers import model``)."""

from __future__ import annotations

import onnx
import pytest


@pytest.fixture
def save(tmp_path):
    """Write a model to a file (no external data written) and return its path."""

    def _save(m: onnx.ModelProto, name: str = "model.onnx") -> str:
        path = tmp_path / name
        path.write_bytes(m.SerializeToString())
        return str(path)

    return _save


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh export cache per test (the frontends'), also as $FLOPCOUNT_CACHE (so nothing goes to ~/.cache)."""
    folder = tmp_path / "cache"
    from flopcount.frontends import torch as frontend

    monkeypatch.setenv(frontend.CACHE_ENV, str(folder))
    return folder


@pytest.fixture
def exports(monkeypatch):
    """Counts the real exports of the PyTorch frontend (cache misses)."""
    from flopcount.frontends import torch as frontend

    calls = []
    real = frontend._export

    def counting(module, inputs, *args):
        calls.append(tuple(tuple(x.shape) for x in inputs))
        return real(module, inputs, *args)

    monkeypatch.setattr(frontend, "_export", counting)
    return calls
