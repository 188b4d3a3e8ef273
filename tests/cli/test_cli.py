"""The command line: formats, -o, --per-node, conventions, the installed console script."""

import csv
import os
import io
import json
import subprocess
import sys

import pytest
from helpers import model, refusal_lines, weight
from onnx import helper

from flopcount.cli import main

N = helper.make_node


@pytest.fixture
def mlp_path(save):
    # x[4, 10] → Gemm(W1[10,20], b1) → Relu → MatMul(W2[20, 3])
    nodes = [N("Gemm", ["x", "W1", "b1"], ["h"], name="fc1"), N("Relu", ["h"], ["r"], name="act"),
             N("MatMul", ["r", "W2"], ["y"], name="fc2")]
    m = model(nodes, {"x": (4, 10)}, ["y"], [weight("W1", (10, 20)), weight("b1", (20,)), weight("W2", (20, 3))])
    return save(m)


GEMM = 2 * 4 * 10 * 20 + 4 * 20
RELU = 4 * 20
MATMUL = 2 * 4 * 20 * 3
TOTAL = GEMM + RELU + MATMUL


def run(capsys, *argv):
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def test_table(capsys, mlp_path):
    out = run(capsys, mlp_path)
    assert f"Total FLOPs: {TOTAL:,}" in out
    assert f"Per-sample FLOPs: {TOTAL // 4:,}" in out
    assert f"Parameters: {10 * 20 + 20 + 20 * 3:,}" in out
    assert "Unsupported operators: none" in out


def test_json_schema(capsys, mlp_path):
    doc = json.loads(run(capsys, mlp_path, "--format", "json", "--per-node"))
    assert doc["schema_version"] == 9
    assert doc["mode"] == "inference" and doc["backward"]["flops"] == 0 and doc["forward"]["flops"] == TOTAL
    assert doc["tool"]["name"] == "flopcount" and doc["tool"]["version"]
    assert doc["model"]["inputs"] == [{"name": "x", "dtype": "float", "shape": [4, 10]}]
    assert doc["model"]["opsets"] == {"ai.onnx": 18}
    assert doc["convention"]["name"] == "default"
    assert doc["batch"] == 4
    assert doc["total"]["flops"] == TOTAL and doc["total"]["macs"] == 4 * 10 * 20 + 4 * 20 * 3
    assert doc["total"]["params"] == 10 * 20 + 20 + 20 * 3
    assert doc["total"]["buffers"] == 0
    assert doc["per_sample"]["flops"] == TOTAL // 4
    assert doc["by_op_type"]["Gemm"]["flops"] == GEMM and doc["by_op_type"]["Gemm"]["nodes"] == 1
    assert doc["by_op_type"]["Relu"]["flops"] == RELU
    assert doc["unsupported"] == {}
    fc1 = doc["nodes"][0]
    assert fc1["name"] == "fc1" and fc1["op_type"] == "Gemm" and fc1["flops"] == GEMM
    assert fc1["inputs"][1] == {"name": "W1", "dtype": "float", "shape": [10, 20]}
    assert fc1["outputs"][0]["shape"] == [4, 20]


def test_json_without_per_node_has_no_nodes(capsys, mlp_path):
    assert "nodes" not in json.loads(run(capsys, mlp_path, "--format", "json"))


def test_csv_by_op_type_and_per_node(capsys, mlp_path):
    rows = list(csv.DictReader(io.StringIO(run(capsys, mlp_path, "--format", "csv"))))
    assert {r["op_type"]: int(r["flops"]) for r in rows} == {"Gemm": GEMM, "Relu": RELU, "MatMul": MATMUL}
    rows = list(csv.DictReader(io.StringIO(run(capsys, mlp_path, "--format", "csv", "--per-node"))))
    assert [r["name"] for r in rows] == ["fc1", "act", "fc2"]


def test_markdown(capsys, mlp_path):
    out = run(capsys, mlp_path, "--format", "markdown")
    assert "| op type" in out and f"- Total FLOPs: {TOTAL:,}" in out


def test_per_node_table_lists_shapes(capsys, mlp_path):
    out = run(capsys, mlp_path, "--per-node")
    assert "fc1" in out and "4x10, 10x20, 20" in out and "4x20" in out


def test_output_file(capsys, mlp_path, tmp_path):
    target = tmp_path / "r.json"
    assert run(capsys, mlp_path, "--format", "json", "-o", str(target)) == ""
    assert json.loads(target.read_text())["total"]["flops"] == TOTAL


def test_convention_table3(capsys, mlp_path):
    doc = json.loads(run(capsys, mlp_path, "--format", "json", "--convention", "table3"))
    # FC = FLin·FLout per sample, no bias: 4·10·20 + 4·20·3; Relu unchanged
    assert doc["total"]["flops"] == 4 * 10 * 20 + 4 * 20 * 3 + RELU
    assert doc["convention"]["name"] == "table3"


def test_batch_option_changes_per_sample_divisor(capsys, save):
    m = model([N("MatMul", ["x", "W"], ["y"])], {"x": ("B", 5)}, ["y"], [weight("W", (5, 7))])
    doc = json.loads(run(capsys, save(m), "--batch", "3", "--format", "json"))
    assert doc["batch"] == 3 and doc["total"]["flops"] == 3 * 2 * 5 * 7 and doc["per_sample"]["flops"] == 2 * 5 * 7
    assert doc["model"]["inputs"][0]["shape"] == [3, 5]


def test_console_script_and_module(mlp_path):
    # the console script pip installed beside this interpreter (a virtualenv need not be activated to be used)
    script = os.path.join(os.path.dirname(sys.executable), "flopcount")
    for cmd in ([script, mlp_path], [sys.executable, "-m", "flopcount", mlp_path]):
        p = subprocess.run(cmd, capture_output=True, text=True)
        assert p.returncode == 0 and f"Total FLOPs: {TOTAL:,}" in p.stdout


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("flopcount ")


@pytest.mark.parametrize(
    "convention, expected",
    [
        # products only: Gemm 2·4·10·20 and MatMul 2·4·20·3 at 2 per MAC; bias and Relu left out
        pytest.param("dense", 2 * (4 * 10 * 20 + 4 * 20 * 3), id="dense"),
        pytest.param("macs", 4 * 10 * 20 + 4 * 20 * 3, id="macs"),
    ],
)
def test_product_only_conventions(capsys, mlp_path, convention, expected):
    doc = json.loads(run(capsys, mlp_path, "--format", "json", "--convention", convention))
    assert doc["total"]["flops"] == expected
    assert doc["by_op_type"]["Relu"]["flops"] == 0
    assert doc["total"]["macs"] == 4 * 10 * 20 + 4 * 20 * 3


# ---------------------------------------------------------------------------------------------------------------
# Logging: flopcount's own loggers only; the root logger (other libraries' records) is left alone

NOISY_FACTORY = '''
import logging

logging.getLogger("thirdlib").warning("thirdlib: optional kernels not loaded")  # as torchao warns on import
logging.getLogger("thirdlib").info("thirdlib: chatter")


def make():
    import torch.nn as nn
    return nn.Linear(3, 2)
'''


@pytest.mark.parametrize("verbose", [False, True])
def test_other_libraries_records_are_not_labelled_flopcount(tmp_path, verbose):
    """A library that logs while the --torch factory is imported (nobody configured a handler for it) is held back,
    so that stderr holds flopcount's lines only; with -v its warning is shown under its own logger's name, never as
    flopcount's, and its INFO stays off (-v is flopcount's verbosity, not the root logger's)."""
    pytest.importorskip("torch")
    (tmp_path / "noisy_factory.py").write_text(NOISY_FACTORY)
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "FLOPCOUNT_CACHE": "0"}
    p = subprocess.run([sys.executable, "-m", "flopcount", "--torch", "noisy_factory:make", "--input-shape",
                        "input=4x3", *(["-v"] if verbose else []), "--format", "json"], capture_output=True,
                       text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    err = p.stderr.splitlines()
    if verbose:
        assert "thirdlib: WARNING: thirdlib: optional kernels not loaded" in err
        assert any(line.startswith("flopcount: INFO: exported Linear with") for line in err)
    else:
        assert refusal_lines(p.stderr) == []  # an export slowed past 2 s by a busy machine says so: progress only
    assert not any("chatter" in line for line in err)
    assert json.loads(p.stdout)["total"]["flops"] == 2 * 4 * 3 * 2 + 4 * 2  # 2·N·in·out + the bias adds


def test_main_puts_logging_back(capsys, mlp_path):
    """main() from Python configures the ``flopcount`` logger only while it runs: afterwards the root logger's
    handlers and level, and the flopcount logger's level, handlers and propagation, are as they were."""
    import logging

    root, ours = logging.getLogger(), logging.getLogger("flopcount")
    before = (list(root.handlers), root.level, list(ours.handlers), ours.level, ours.propagate, logging.lastResort)
    assert main([mlp_path, "-vv"]) == 0
    assert (list(root.handlers), root.level, list(ours.handlers), ours.level, ours.propagate,
            logging.lastResort) == before
    assert f"Total FLOPs: {TOTAL:,}" in capsys.readouterr().out
