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


@pytest.fixture
def small_disk(tmp_path):
    """``small_disk(kib, readonly=False, files={})``: a folder on a tmpfs of ``kib`` KiB holding ``files`` (name ->
    bytes), remounted read-only when asked: a real full disk and a real read-only folder, which the superuser
    cannot write either. Skips where mounting is not allowed (not root, a container without the capability)."""
    import os
    import subprocess

    mounts = []

    def _mount(kib: int, readonly: bool = False, files=None):
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root")
        folder = tmp_path / f"disk{len(mounts)}"
        folder.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(folder)],
                              capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
        mounts.append(folder)
        for name, data in (files or {}).items():
            (folder / name).write_bytes(data)
        if readonly:
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
        return folder

    yield _mount
    for folder in reversed(mounts):
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def pytest_configure(config):
    """No tqdm monitor thread in the test processes: a progress bar that a framework shows (an export, a model built
    from its configuration) starts tqdm's monitor, a Python thread that lives until the process ends. The count stops
    it before it forks (:func:`flopcount.pipeline.shapes.guarded.fork_safe`, tested with one in
    tests/pipeline/test_large_graphs.py), but the tests' own forks (the gloo ranks of helpers) do not."""
    try:
        import tqdm.std
    except ImportError:
        return
    tqdm.std.tqdm.monitor_interval = 0
