"""``import flopcount`` stays light: the package face loads its names on first use.

Each check runs in a fresh interpreter, since this test process has long since imported everything.
"""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "flopcount.measure", "flopcount.counting", "onnx", "tensorflow", "transformers")


def _modules_after(code: str) -> set[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return set(json.loads(out.stdout.splitlines()[-1]))


@pytest.mark.parametrize("heavy", HEAVY)
def test_import_flopcount_loads_no_heavy_module(heavy):
    assert heavy not in _modules_after("import flopcount")


def test_cli_parser_loads_neither_torch_nor_the_core():
    # what `flopcount --help` imports: the command line's parser, not the counting core or the measuring half
    loaded = _modules_after("import flopcount.cli; flopcount.cli.build_parser()")
    assert not loaded & {"torch", "onnx", "numpy", "networkx", "flopcount.counting", "flopcount.measure"}


def test_public_names_resolve_to_their_defining_modules():
    import flopcount
    import flopcount.counting
    import flopcount.errors
    import flopcount.measure.harness.meter

    assert flopcount.count is flopcount.counting.count
    assert flopcount.Meter is flopcount.measure.harness.meter.Meter
    assert flopcount.UsageError is flopcount.errors.UsageError
    assert set(flopcount.__all__) <= set(dir(flopcount))
    for name in flopcount.__all__:
        assert getattr(flopcount, name) is not None


def test_unknown_name_is_an_attribute_error():
    import flopcount

    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        flopcount.no_such_name  # noqa: B018


def test_version_is_the_installed_metadata():
    from importlib.metadata import version

    import flopcount

    assert flopcount.__version__ == version("flopcount")
    out = subprocess.run([sys.executable, "-m", "flopcount", "--version"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"flopcount {version('flopcount')}"


def test_json_count_of_a_plain_graph_loads_neither_networkx_nor_tabulate(tmp_path):
    # the DAG is built where a graph algorithm needs it (a cycle, an error's search upstream, the memory ledger's
    # attention cores), tables are drawn only for the table formats
    from helpers import model
    from onnx import helper

    path = tmp_path / "m.onnx"
    path.write_bytes(model([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
                           {"x": (2, 3)}, ["z"]).SerializeToString())
    code = ("import contextlib, io\nfrom flopcount.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
            f"    assert main([{str(path)!r}, '--format', 'json']) == 0")
    loaded = _modules_after(code)
    assert "flopcount.counting" in loaded and not loaded & {"networkx", "tabulate"}


def test_json_count_without_memory_loads_no_memory_ledger(tmp_path):
    # --memory and its settings are read only when asked for; with --memory the ledger is there
    from helpers import model
    from onnx import helper

    path = tmp_path / "m.onnx"
    path.write_bytes(model([helper.make_node("Relu", ["x"], ["y"])], {"x": (2, 3)}, ["y"]).SerializeToString())
    runs = {}
    for flags in ((), ("--memory",)):
        code = ("import contextlib, io\nfrom flopcount.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
                f"    assert main([{str(path)!r}, '--format', 'json', *{flags!r}]) == 0")
        runs[flags] = _modules_after(code)
    assert "flopcount.counting" in runs[()] and "flopcount.memory.ledger" not in runs[()]
    assert "flopcount.memory.ledger" in runs[("--memory",)]
