"""The export made ahead in a forked child (flopcount.frontends.ahead): where it is used, where this process exports
instead (another key, a failed, dead or hung child, no fork allowed), and that a Hugging Face stack counted with
it gives the very report counted without it."""

from __future__ import annotations

import logging
import os

import pytest
from onnx import TensorProto, helper

from flopcount.frontends import ahead
from flopcount.pipeline.shapes.guarded import fork_safe

pytestmark = pytest.mark.skipif(not (fork_safe() and ahead._cores() >= 2),
                                reason="needs fork (Linux, one thread) and two cores")


def made_here(tag: str = "") -> helper.ModelProto:
    """A one-node model whose doc string names the process that made it."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph)
    model.doc_string = f"{os.getpid()}{tag}"
    return model


class Module:
    """Stands for a torch module: only its identity matters."""


def test_the_child_makes_the_export_and_this_process_takes_it(caplog):
    m = Module()
    key = (id(m), "inputs", True, 18)
    with caplog.at_level(logging.INFO, logger="flopcount.frontends.ahead"):
        with ahead.exporting(m, lambda: ahead.produced(key, made_here)):
            model = ahead.produced(key, made_here)
    assert model.doc_string != str(os.getpid())  # made by the child
    assert list(model.metadata_props) == []  # the key it carried back is taken off
    assert "made ahead" in caplog.text
    assert not ahead._PENDING


def test_another_key_is_exported_here():
    m = Module()
    with ahead.exporting(m, lambda: ahead.produced((id(m), "batch 1", True, 18), made_here)):
        model = ahead.produced((id(m), "batch 2", True, 18), made_here)
    assert model.doc_string == str(os.getpid())


def test_a_failed_child_leaves_the_export_to_this_process():
    parent = os.getpid()
    m = Module()

    def fails_in_child():
        if os.getpid() != parent:
            raise RuntimeError("the exporter failed")
        return made_here()

    key = (id(m), "inputs", False, 18)
    with ahead.exporting(m, lambda: ahead.produced(key, fails_in_child)):
        model = ahead.produced(key, fails_in_child)
    assert model.doc_string == str(parent)


def test_a_child_that_dies_leaves_the_export_to_this_process():
    parent = os.getpid()
    m = Module()

    def dies_in_child():
        if os.getpid() != parent:
            os.kill(os.getpid(), 9)
        return made_here()

    key = (id(m), "inputs", False, 18)
    with ahead.exporting(m, lambda: ahead.produced(key, dies_in_child)):
        model = ahead.produced(key, dies_in_child)
    assert model.doc_string == str(parent)


def test_a_hung_child_is_killed_and_the_export_made_here(monkeypatch):
    import time

    parent = os.getpid()
    monkeypatch.setattr(ahead, "GRACE_S", 0.5)
    m = Module()

    def hangs_in_child():
        while os.getpid() != parent:
            time.sleep(1)
        return made_here()

    key = (id(m), "inputs", False, 18)
    start = time.perf_counter()
    with ahead.exporting(m, lambda: ahead.produced(key, hangs_in_child)):
        child = ahead._PENDING[id(m)]
        model = ahead.produced(key, hangs_in_child)
    assert model.doc_string == str(parent)
    assert time.perf_counter() - start < 30
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # killed and reaped
    assert not os.path.exists(child.path)


def test_an_unused_child_is_stopped_when_the_block_ends():
    m = Module()
    with ahead.exporting(m, lambda: ahead.produced((id(m), "k", False, 18), made_here)):
        child = ahead._PENDING[id(m)]
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)
    assert not os.path.exists(child.path) and not ahead._PENDING


def test_no_child_where_forking_is_turned_off(monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_PARALLEL", "0")
    m = Module()
    with ahead.exporting(m, lambda: ahead.produced((id(m), "k", False, 18), made_here)):
        assert not ahead._PENDING
        model = ahead.produced((id(m), "k", False, 18), made_here)
    assert model.doc_string == str(os.getpid())


def test_a_stack_counted_with_the_export_ahead_is_the_stack_counted_without(monkeypatch, caplog):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import flopcount
    from flopcount.output.render import to_dict

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                                      num_key_value_heads=2, vocab_size=64)

    def counted():
        r = flopcount.from_hf(config, {"input_ids": (2, 8)}, mode="train", cache_dir=False)
        d = to_dict(r, per_node=True, by_module=3)
        d.pop("timings", None)
        return d

    with caplog.at_level(logging.INFO, logger="flopcount.frontends.ahead"):
        ahead_made = counted()
    assert "made ahead" in caplog.text  # the 2-layer model's export came from the child
    monkeypatch.setenv("FLOPCOUNT_PARALLEL", "0")
    assert counted() == ahead_made
