"""``flopcount plan`` keeps the objects alive before it, and those each group of plans leaves, out of the cyclic
collector's reach while it searches (``gc.freeze``), and gives them back when it returns: garbage made before the
search is still collected after it, and the collector is as the caller left it, objects the caller froze itself
still frozen."""

from __future__ import annotations

import gc
import io
import json
import weakref
from contextlib import redirect_stdout

import pytest

from flopcount.cli import main

from helpers import llama_config


class _Cycle:
    def __init__(self):
        self.me = self


def _args(tmp_path) -> list[str]:
    pytest.importorskip("transformers")
    folder = llama_config(tmp_path, 32, 2, 4, 2, 64, 128)
    return ["plan", "--hf", folder, "--input-shape", "input_ids=2x8:int64", "--optimizer", "adamw", "--device",
            "H100", "--format", "json", "--devices", "2", "--device-memory", "80GiB"]


def test_the_search_gives_the_collector_back(tmp_path):
    args = _args(tmp_path)
    gc.unfreeze()
    frozen, enabled = gc.get_freeze_count(), gc.isenabled()
    garbage = _Cycle()
    dead = weakref.ref(garbage)
    del garbage  # a reference cycle: only the collector frees it
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(args) == 0
    assert json.loads(out.getvalue())["plans"]
    assert gc.get_freeze_count() == frozen and gc.isenabled() == enabled
    gc.collect()
    assert dead() is None  # frozen through the search (made before it), the collector's again after


def test_what_the_caller_froze_stays_frozen(tmp_path):
    args = _args(tmp_path)
    garbage = _Cycle()
    dead = weakref.ref(garbage)
    gc.freeze()  # the caller's own (as a server freezes what it made before forking), the cycle among them
    del garbage
    try:
        with redirect_stdout(io.StringIO()):
            assert main(args) == 0
        gc.collect()
        assert dead() is not None  # still frozen: none of the caller's given back to the collector
    finally:
        gc.unfreeze()
    gc.collect()
    assert dead() is None
