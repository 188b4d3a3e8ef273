"""Each package says what it holds: its ``__init__`` names every module in a line of its own and declares
``__all__``."""

from __future__ import annotations

import importlib
import pkgutil
import re

import pytest

PACKAGES = ["flopcount", "flopcount.operators", "flopcount.frontends", "flopcount.models", "flopcount.cli",
            "flopcount.workloads", "flopcount.measure", "flopcount.pipeline", "flopcount.pipeline.shapes",
            "flopcount.reporting", "flopcount.parallel", "flopcount.memory", "flopcount.derived", "flopcount.output"]


@pytest.mark.parametrize("name", PACKAGES)
def test_init_lists_each_module_on_its_own_line(name):
    package = importlib.import_module(name)
    modules = {m.name for m in pkgutil.iter_modules(package.__path__)} - {"__main__"}
    listed = re.findall(r"^\* :mod:`\.(\w+)`", package.__doc__, re.MULTILINE)
    assert sorted(set(listed)) == sorted(listed), "a module listed twice"
    missing = modules - set(listed) - _named_elsewhere(package.__doc__)
    assert not missing, f"{name}'s __init__ does not list {sorted(missing)}"
    assert isinstance(package.__all__, list)


def _named_elsewhere(doc: str) -> set[str]:
    """Modules and subpackages the docstring names in prose (measure's kept re-exports, ``:mod:`.distributed```;
    the top package's ``:mod:`flopcount.measure```)."""
    return set(re.findall(r":mod:`(?:\.|flopcount\.)(\w+)`", doc))
