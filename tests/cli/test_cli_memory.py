"""``flopcount MODEL --memory``: the JSON ``memory`` key (only when asked), its table lines, and the plan and
recompute flags' exit 2 naming the bad part."""

from __future__ import annotations

import json

import pytest
from helpers import model, refusal_lines, weight
from onnx import helper

from flopcount.cli import main

N = helper.make_node
F32 = 4
# x[4, 10] → Gemm(W1[10,20], b1) → Relu → MatMul(W2[20, 3])
PARAMS = F32 * (10 * 20 + 20 + 20 * 3)


@pytest.fixture
def mlp_path(save):
    nodes = [N("Gemm", ["x", "W1", "b1"], ["h"], name="fc1"), N("Relu", ["h"], ["r"], name="act"),
             N("MatMul", ["r", "W2"], ["y"], name="fc2")]
    return save(model(nodes, {"x": (4, 10)}, ["y"], [weight("W1", (10, 20)), weight("b1", (20,)),
                                                      weight("W2", (20, 3))]))


def run_json(capsys, *argv) -> dict:
    assert main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_memory_key_only_when_asked_and_the_rest_unchanged(capsys, mlp_path):
    plain = run_json(capsys, mlp_path, "--mode", "train")
    with_memory = run_json(capsys, mlp_path, "--mode", "train", "--memory")
    assert "memory" not in plain
    memory = with_memory.pop("memory")
    assert with_memory == plain
    (rank,) = memory["ranks"]
    assert rank["params_bytes"] == rank["grads_bytes"] == PARAMS
    assert rank["activations_bytes"] == F32 * 4 * 10 + F32 * 4 * 20  # x (for dW1), relu's output
    assert memory["lower_bound"] is False and memory["missing_saved_rules"] == {}


def test_adamw_fused_on_cpu_and_master_weights(capsys, mlp_path):
    memory = run_json(capsys, mlp_path, "--mode", "train", "--optimizer", "adamw", "--memory", "--optimizer-impl",
                      "fused")["memory"]
    assert (memory["optimizer"], memory["implementation"]) == ("adamw", "fused")
    assert memory["ranks"][0]["optimizer_bytes"] == 2 * PARAMS + 3 * 4  # m, v, three float32 step counters
    auto = run_json(capsys, mlp_path, "--mode", "train", "--optimizer", "adam", "--memory", "--memory-device",
                    "cpu")["memory"]
    assert auto["implementation"] == "single-tensor"


def test_table_lines(capsys, mlp_path):
    assert main([mlp_path, "--mode", "train", "--memory", "--recompute", "full"]) == 0
    out = capsys.readouterr().out
    assert "Memory (train, recompute full):" in out and f"params {PARAMS:,} B" in out


def test_operator_list_recompute(capsys, mlp_path):
    """``--recompute Relu,Gelu``: the graph has no Gelu (nothing selected for it, as on the FLOPs side); the Relu is
    a unit of its own, which keeps its input h (the Gemm's output) and makes nothing again that a node outside it
    does not keep: r stays kept for the MatMul. So x, h and r, where no recompute keeps x and r."""
    none = run_json(capsys, mlp_path, "--mode", "train", "--memory")["memory"]
    ops = run_json(capsys, mlp_path, "--mode", "train", "--memory", "--recompute", "Relu,Gelu")["memory"]
    x, hidden = F32 * 4 * 10, F32 * 4 * 20  # h and r are both hidden-sized
    assert none["ranks"][0]["activations_bytes"] == x + hidden
    assert (ops["recompute"], ops["ranks"][0]["activations_bytes"]) == ("Gelu,Relu", x + 2 * hidden)


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--memory", "--parallel", "tp=0"], "tp=0 must be a positive integer", id="zero degree"),
    pytest.param(["--memory", "--parallel", "pp=2", "--microbatches", "2", "--schedule", "zigzag"],
                 "unknown schedule 'zigzag'", id="unknown schedule"),
    # a data-parallel plan applies to any model; one that splits layers needs them
    pytest.param(["--parallel", "tp=2"], "so the repeated layers tp=2 splits cannot be found",
                 id="plan of a model without scopes"),
    pytest.param(["--recompute", "full", "--mode", "train"], "--recompute needs --memory", id="recompute alone"),
    pytest.param(["--memory", "--recompute", "full"], "give --mode train", id="recompute in inference"),
    pytest.param(["--memory", "--mode", "train", "--recompute", "Soft max"], "none, full, non-reentrant, selective",
                 id="bad recompute"),
    pytest.param(["--memory", "--mode", "train", "--recompute", "relu"], "relu is no ONNX operator type",
                 id="recompute of a misspelt type"),
    pytest.param(["--memory", "--mode", "train", "--recompute", "non-reentrnt"],
                 "'non-reentrnt'; choose one of: none, full, non-reentrant, selective", id="misspelt policy"),
    pytest.param(["--memory", "--mode", "train", "--recompute", "reentrant"],
                 "reentrant is no ONNX operator type and no node of the graph's; its operator types: Gemm, MatMul, "
                 "Relu; or a policy: none, full, non-reentrant, selective", id="unknown policy"),
    pytest.param(["--memory", "--mode", "train", "--recompute", "Gelu,Softmax"],
                 "no node of the graph is of those types, so nothing would be recomputed", id="recompute of absent types"),
    pytest.param(["--memory", "--parallel", "cp=2"], "so the repeated layers cp=2 splits cannot be found",
                 id="cp plan of a model without scopes"),
    pytest.param(["--memory", "--parallel", "tp=2"], "so the repeated layers tp=2 splits cannot be found",
                 id="memory plan of a model without scopes"),
])
def test_bad_flags_exit_2_naming_the_part(capsys, mlp_path, argv, message):
    assert main([mlp_path, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(refusal_lines(err)) == 1


def test_by_module_rows_in_json_and_table(capsys, mlp_path):
    """The hand-built graph has no module scopes: the kept relu output is outside any module, x is a graph input."""
    memory = run_json(capsys, mlp_path, "--mode", "train", "--memory", "--by-module")["memory"]
    assert memory["by_module"] == [{"module": "(graph inputs)", "activations_bytes": F32 * 4 * 10},
                                   {"module": "(outside any module)", "activations_bytes": F32 * 4 * 20}]
    assert main([mlp_path, "--mode", "train", "--memory", "--by-module"]) == 0
    assert "Activations kept by module: (graph inputs) 160 B; (outside any module) 320 B" in capsys.readouterr().out
