"""The export cache's write side: an entry is written whole or not at all, and a cache that cannot be written is a
warning, never a failed count (the read side's checks are tested apart)."""

from __future__ import annotations

import logging
import os

import onnx
import pytest
from onnx import TensorProto, helper

from flopcount.frontends import common

log = logging.getLogger("flopcount.test")


def tiny(name: str) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])
    return helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], name, [x], [y]))


def test_an_entry_replaces_the_earlier_one_whole(tmp_path):
    entry = tmp_path / "torch-abc.onnx"
    common.write_cache(entry, tiny("first"), log)
    common.write_cache(entry, tiny("second"), log)
    assert onnx.load(str(entry)).graph.name == "second" and os.listdir(tmp_path) == ["torch-abc.onnx"]


def test_a_failed_write_keeps_the_earlier_entry_and_warns(tmp_path, monkeypatch, caplog):
    entry = tmp_path / "torch-abc.onnx"
    common.write_cache(entry, tiny("first"), log)
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with caplog.at_level(logging.WARNING, logger="flopcount.test"):
        common.write_cache(entry, tiny("second"), log)
    monkeypatch.undo()
    assert onnx.load(str(entry)).graph.name == "first" and os.listdir(tmp_path) == ["torch-abc.onnx"]
    (record,) = caplog.records
    assert record.getMessage().startswith(f"cannot write the export cache {tmp_path} (")
    assert "No space left on device" in record.getMessage()


def test_a_read_only_cache_is_a_warning_and_the_model_is_still_saved(small_disk, tmp_path, caplog):
    ro = small_disk(64, readonly=True)
    out = tmp_path / "saved.onnx"
    with caplog.at_level(logging.WARNING, logger="flopcount.test"):
        model = common.export_through_cache(ro, "torch", lambda: "k" * 64, lambda: tiny("made"), out, log)
    assert model.graph.name == "made" and onnx.load(str(out)).graph.name == "made"
    assert os.listdir(ro) == [] and os.listdir(tmp_path) == ["saved.onnx", ro.name]
    assert any("Read-only file system" in r.getMessage() for r in caplog.records)


def test_a_saved_model_that_cannot_be_written_is_exit_8(tmp_path, monkeypatch):
    from flopcount.errors import OutputError

    out = tmp_path / "saved.onnx"
    out.write_bytes(b"earlier")
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(122, "Disk quota exceeded")))
    with pytest.raises(OutputError, match=f"^{out}: cannot write the ONNX model \\(Disk quota exceeded\\)"):
        common.export_through_cache(False, "torch", lambda: None, lambda: tiny("made"), out, log)
    monkeypatch.undo()
    assert out.read_bytes() == b"earlier" and os.listdir(tmp_path) == ["saved.onnx"]
