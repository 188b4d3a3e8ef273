"""Every example in the package's docstrings runs: each module of ``flopcount/``, ``operators/`` and ``frontends/``
whose source holds a ``>>>`` example is imported and its examples run under :mod:`doctest`.

A module that imports an optional framework (Keras, Lightning, torch ...) is skipped where that framework is not
installed; a module is never left out for any other reason.
"""

from __future__ import annotations

import doctest
import importlib
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: folder of the checkout → the package name it is installed under
FOLDERS = {"flopcount": "flopcount", "operators": "flopcount.operators", "frontends": "flopcount.frontends"}


def modules_with_examples() -> list[str]:
    """The dotted names of the modules whose source holds a ``>>>`` example, read from the files (importing each
    module to ask would load every optional framework)."""
    names = []
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ">>>" not in path.read_text(encoding="utf-8"):
                continue
            parts = path.relative_to(ROOT / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join([package, *parts]))
    return names


MODULES = modules_with_examples()


def test_the_examples_are_found():
    # the core, the measuring half and the frontends each hold examples
    for name in ("flopcount.cost", "flopcount.reporting.report", "flopcount.measure.profile.roofline"):
        assert name in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name and e.name.split(".")[0] != "flopcount":
            pytest.skip(f"needs {e.name}")
        raise
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
