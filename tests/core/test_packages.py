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


def test_pyproject_installs_every_package():
    """``pip install .`` (not only an editable install) ships every package of the source tree: each folder with an
    ``__init__.py`` under ``flopcount/`` and the folders mapped into it is in pyproject's package list."""
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for name, folder in setuptools["package-dir"].items():
        for init in (root / folder).rglob("__init__.py"):
            found.add(".".join([name, *init.parent.relative_to(root / folder).parts]))
    assert set(setuptools["packages"]) == found


def test_the_checkout_is_the_whole_package_from_its_root():
    """From the checkout's root (where the README's paths assume you stand) ``import flopcount`` finds the checkout's
    folder before any installed copy, and its three mapped subpackages come from the same checkout, never from an
    installed copy (a non-editable install left ``flopcount.frontends`` unimportable there)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = ("import flopcount, flopcount.operators, flopcount.frontends, flopcount.models;"
            "print('\\n'.join(m.__file__ for m in (flopcount, flopcount.operators, flopcount.frontends, flopcount.models)))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True)
    files = [Path(line) for line in out.stdout.split()]
    assert files == [root / "flopcount" / "__init__.py", root / "operators" / "__init__.py",
                     root / "frontends" / "__init__.py", root / "models" / "__init__.py"]
