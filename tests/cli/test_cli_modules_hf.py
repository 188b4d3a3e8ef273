"""The command line of per-module tables (``--by-module``, ``--depth``, ``--format html``) and ``--hf``, run as a
user runs them: in a fresh process, exit codes and one-line errors included."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "resnet50-v1.5.onnx")


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopcount", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_by_module_json_rows_of_the_bundled_example():
    p = cli(EXAMPLE, "--by-module", "--depth", "2", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    rows = doc["modules"]
    top = [r for r in rows if r["depth"] == 1]
    assert [r["module"] for r in top] == ["conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3", "layer4",
                                         "avgpool", "fc"]
    assert sum(r["flops"] for r in top) == doc["total"]["flops"]
    assert sum(r["params"] for r in top) == doc["total"]["params"]
    # ResNet-50's 3, 4, 6 and 3 bottleneck blocks at depth 2
    assert [sum(r["parent"] == f"layer{i}" for r in rows) for i in (1, 2, 3, 4)] == [3, 4, 6, 3]
    fc = next(r for r in rows if r["module"] == "fc")
    assert fc["macs"] == 2048 * 1000 and fc["params"] == 2048 * 1000 + 1000  # Gemm 2048 -> 1000 with its bias


def test_depth_alone_gives_the_module_table_and_csv_gives_its_rows():
    p = cli(EXAMPLE, "--depth", "1", "--format", "csv")
    assert p.returncode == 0, p.stderr
    rows = list(csv.DictReader(io.StringIO(p.stdout)))
    assert len(rows) == 10 and rows[4]["module"] == "layer1" and rows[4]["depth"] == "1"


@pytest.mark.parametrize("depth", ["0", "-1", "two"])
def test_depth_below_one_is_a_usage_error(depth):
    p = cli(EXAMPLE, "--by-module", "--depth", depth)
    assert p.returncode == 2 and "--depth" in p.stderr and "Traceback" not in p.stderr


def test_html_report_to_a_file_and_an_unwritable_path(tmp_path):
    out = tmp_path / "report.html"
    p = cli(EXAMPLE, "--by-module", "--mode", "train", "--format", "html", "-o", str(out))
    assert p.returncode == 0, p.stderr
    page = out.read_text()
    assert page.startswith("<!DOCTYPE html>") and ">layer4.2.conv3<" in page  # the page's tree: as deep as fits
    p = cli(EXAMPLE, "--depth", "1", "--format", "html", "-o", str(out))
    assert p.returncode == 0 and ">layer4<" in out.read_text() and ">layer4.2<" not in out.read_text()
    bad = cli(EXAMPLE, "--format", "html", "-o", str(tmp_path / "missing" / "dir" / "r.html"))
    assert bad.returncode == 8 and bad.stderr.count("\n") == 1


def test_a_graph_without_scopes_prints_one_row_and_why(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"], name="r")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    p = cli(str(tmp_path / "m.onnx"), "--by-module")
    assert p.returncode == 0, p.stderr
    assert "(outside any module)" in p.stdout and "Modules: one row: the graph has no module scopes" in p.stdout


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("llama")
    transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2,
                             num_key_value_heads=1, vocab_size=41).save_pretrained(folder)
    return folder


def test_hf_counts_a_config_folder_by_module(llama_folder, tmp_path):
    p = cli("--hf", str(llama_folder), "--input-shape", "input_ids=1x9", "--convention", "dense", "--depth", "3",
            "--format", "json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    rows = {r["module"]: r for r in doc["modules"]}
    h, kv, ffn, s = 32, 16, 48, 9
    layer = 2 * s * (2 * h * h + 2 * h * kv) + 2 * s * 3 * h * ffn + 2 * 2 * s * s * h
    assert rows["model.layers.0"]["flops"] == rows["model.layers.1"]["flops"] == layer
    assert rows["lm_head"]["flops"] == 2 * s * h * 41


@pytest.mark.parametrize("args, code, message", [
    pytest.param(["--hf", "no/such/folder.json", "--input-shape", "input_ids=1x4"], 13, "no such file", id="missing"),
    pytest.param(["--hf", "x"], 2, "--hf needs the shape", id="no-shapes"),
    pytest.param(["--hf", "x", "m.onnx", "--input-shape", "input_ids=1x4"], 2, "give one model", id="two-models"),
])
def test_hf_errors_are_one_line(tmp_path, args, code, message):
    p = cli(*args, cwd=tmp_path)
    assert p.returncode == code, p.stderr
    last = p.stderr.strip().splitlines()[-1]  # argparse's usage lines may come first; the error is one line
    assert last.startswith("flopcount: error:") and message in last and "Traceback" not in p.stderr
