"""A framework that is installed but fails to import (a CUDA build of torch on a machine without the CUDA libraries
raises ImportError or OSError as it imports) is one line naming the package and its error, exit 11, in every
command: never "internal error", never a traceback, never "not installed".

Each command runs in a fresh interpreter with a fake ``torch`` package first on its path, whose import fails the
way a broken build's does.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from flopcount.errors import DeviceError, framework_failure, import_framework

ROOT = pathlib.Path(__file__).resolve().parents[2]
LIBCUDART = "libcudart.so.12: cannot open shared object file: No such file or directory"
FAILURES = {
    "ImportError": f"raise ImportError({LIBCUDART!r})",
    "OSError": f"import ctypes\nctypes.CDLL({'/nonexistent/libcudart.so.12'!r})",
    "dependency-missing": "import no_such_dependency_of_torch",
}


def _fake_torch(tmp_path: pathlib.Path, body: str) -> pathlib.Path:
    package = tmp_path / "fake" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(body + "\n")
    return package.parent


def _flopcount(fake: pathlib.Path, *argv: str, module: str = "flopcount") -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=env)


def _needs(module: str):
    """A command that checks for ``module`` before it imports torch says that ``module`` is missing where it is: the
    broken torch is reached only where ``module`` is installed."""
    import importlib.util

    return pytest.mark.skipif(importlib.util.find_spec(module) is None, reason=f"needs {module} installed")


COMMANDS = [
    pytest.param(("ceilings",), id="ceilings"),
    pytest.param(("bench", "digits", "--epochs", "1"), id="bench"),
    pytest.param(("profile", "examples/resnet50-v1.5.onnx"), id="profile", marks=_needs("onnxruntime")),
    pytest.param(("--torch", "json:loads", "--input-shape", "x=1x3"), id="count-torch"),
    pytest.param(("--hf", "examples/tiny-llama", "--input-shape", "input_ids=1x8"), id="count-hf",
                 marks=_needs("transformers")),
]


@pytest.mark.parametrize("argv", COMMANDS)
def test_every_command_names_the_broken_framework(argv, tmp_path):
    fake = _fake_torch(tmp_path, FAILURES["ImportError"])
    out = _flopcount(fake, *argv)
    assert out.returncode == 11, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr and "internal error" not in out.stderr, out.stderr
    assert lines[0].startswith("flopcount: error: torch is installed but cannot be imported: ImportError: ")
    assert LIBCUDART in lines[0]


def test_the_ncu_step_entry_point_names_it_too(tmp_path):
    fake = _fake_torch(tmp_path, FAILURES["ImportError"])
    out = _flopcount(fake, "--torch", "json:loads", "--input-shape", "x=1x3", module="flopcount.measure.ncu_step")
    assert out.returncode == 11 and "torch is installed but cannot be imported" in out.stderr, out.stderr


@pytest.mark.parametrize("failure", ["OSError", "dependency-missing"])
def test_each_way_an_import_fails_is_named(failure, tmp_path):
    fake = _fake_torch(tmp_path, FAILURES[failure])
    out = _flopcount(fake, "ceilings")
    assert out.returncode == 11, out.stderr
    expected = {"OSError": "OSError: /nonexistent/libcudart.so.12",
                "dependency-missing": "ModuleNotFoundError: No module named 'no_such_dependency_of_torch'"}[failure]
    assert f"torch is installed but cannot be imported: {expected}" in out.stderr, out.stderr


def test_a_framework_not_installed_is_left_to_its_caller():
    # not installed is not broken: the caller words which extra to install (as before)
    with pytest.raises(ModuleNotFoundError) as e:
        import_framework("no_such_framework_at_all")
    assert e.value.name == "no_such_framework_at_all"
    assert framework_failure(e.value) is None


def test_an_error_outside_any_import_is_not_a_framework_failure():
    try:
        raise OSError("disk full")
    except OSError as e:
        assert framework_failure(e) is None


def test_an_import_failing_in_a_package_names_that_package(tmp_path, monkeypatch):
    (tmp_path / "brokenpkg").mkdir()
    (tmp_path / "brokenpkg" / "__init__.py").write_text("raise OSError('libfoo.so: cannot open shared object file')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DeviceError, match=r"^brokenpkg is installed but cannot be imported: OSError: libfoo\.so"):
        import_framework("brokenpkg")
    assert DeviceError.exit_code == 11
