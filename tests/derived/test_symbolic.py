"""Counts as exact formulas in named dims (``--symbolic``), and counts over a list of sizes (``--sweep``)."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import onnx
import pytest
from onnx import TensorProto, helper

import flopcount
from flopcount.derived.symbolic import NotPolynomialError, fit, symbolic_count


def test_fit_finds_degrees_and_exact_coefficients():
    polys, degrees, counted, checked = fit(lambda s: {"f": 7 * s["b"] * s["s"] ** 2 + 37 * s["s"] + 91,
                                                      "g": s["s"] * (s["s"] + 1) // 2}, ["b", "s"])
    assert degrees == {"b": 1, "s": 2}
    assert str(polys["f"]) == "7·b·s² + 37·s + 91"
    assert polys["g"].terms == ((Fraction(1, 2), (0, 2)), (Fraction(1, 2), (0, 1)))  # S(S+1)/2: halves
    assert polys["g"].as_dict()["terms"][0] == {"coefficient": "1/2", "powers": [0, 2]}
    assert len(checked) == 2 and len(counted) <= 12


def test_fit_finds_a_polynomial_whose_first_values_vanish():
    # zero at the first three sizes: flat to every finite difference there, a cubic all the same
    polys, degrees, _, _ = fit(lambda s: {"f": (s["n"] - 2) * (s["n"] - 3) * (s["n"] - 4)}, ["n"])
    assert str(polys["f"]) == "n³ - 9·n² + 26·n - 24" and degrees == {"n": 3}


def test_fit_refuses_what_is_not_a_polynomial():
    with pytest.raises(NotPolynomialError, match="not a polynomial in n"):
        fit(lambda s: {"f": (s["n"] - 3) // 2 + 1}, ["n"])  # a stride-2 window count: floor


def _bert(tmp_path, layers=2, hidden=64, heads=4, ffn=128, vocab=100):
    torch = pytest.importorskip("torch")
    from flopcount.models.transformer import bert

    path = tmp_path / "bert.onnx"
    torch.onnx.export(bert(layers=layers, hidden=hidden, heads=heads, ffn=ffn, vocab=vocab).eval(),
                      (torch.zeros(2, 8, dtype=torch.int64),), str(path), dynamo=False, opset_version=17,
                      input_names=["input_ids"], dynamic_axes={"input_ids": {0: "B", 1: "S"}})
    return path


def test_bert_products_as_a_formula_in_batch_and_length(tmp_path):
    f = symbolic_count(_bert(tmp_path), convention="dense")
    h, ffn, layers = 64, 128, 2
    # per layer and token: Q, K, V, O (4 products of h·h) and the MLP (2 of h·F), 2 FLOPs each; per layer and
    # sequence: QKᵀ and the weighted sum of V (2·S²·h MACs); the pooler: one h·h product per sequence
    assert f.variables == ("B", "S") and dict(f.degrees) == {"B": 1, "S": 2}
    expected = {(1, 2): layers * 2 * 2 * h, (1, 1): layers * 2 * (4 * h * h + 2 * h * ffn), (1, 0): 2 * h * h}
    assert {powers: int(c) for c, powers in f.flops.terms} == expected


def test_the_formula_agrees_with_a_count_at_a_size_it_never_saw(tmp_path):
    path = _bert(tmp_path)
    f = symbolic_count(str(path), mode="train")
    direct = flopcount.count(str(path), input_shapes={"input_ids": (3, 37)}, mode="train")
    assert f.flops(B=3, S=37) == direct.total.flops
    assert f.backward_flops(B=3, S=37) == direct.backward.flops
    assert f.by_op_type["MatMul"](B=3, S=37) == direct.by_op_type["MatMul"].cost.flops + \
        direct.by_op_type["MatMul"].backward.flops


def strided_conv() -> onnx.ModelProto:
    g = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "H"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("w", TensorProto.FLOAT, [8, 3, 3, 3], [0.0] * 216)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_a_strided_window_is_not_a_polynomial_and_says_where():
    with pytest.raises(NotPolynomialError, match=r"not a polynomial in H") as e:
        symbolic_count(strided_conv(), start={"H": 3})
    assert e.value.exit_code == 5


def cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flopcount", *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd)


def test_cli_formula_json_and_sweep_csv(tmp_path):
    path = str(_bert(tmp_path))
    p = cli(path, "--symbolic", "--convention", "dense", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["kind"] == "flopcount.formula" and doc["variables"] == ["B", "S"]
    assert {tuple(t["powers"]): t["coefficient"] for t in doc["formula"]["terms"]} == {
        (1, 2): 512, (1, 1): 131072, (1, 0): 8192}
    p = cli(path, "--input-shape", "input_ids=2xS", "--sweep", "S=16,32", "--convention", "dense", "--format", "csv")
    assert p.returncode == 0, p.stderr
    rows = [line.split(",") for line in p.stdout.splitlines()[1:]]
    assert [int(r[1]) for r in rows] == [2 * (512 * s * s + 131072 * s + 8192) for s in (16, 32)]


@pytest.mark.parametrize("args, message", [
    pytest.param(["--input-shape", "input_ids=BxS"], "a dim given as a name is for a formula", id="name-alone"),
    pytest.param(["--symbolic", "T=4"], "no input has a dim named 'T'", id="unknown-name"),
    pytest.param(["--input-shape", "input_ids=1xS", "--sweep", "T=1,2"], "no --input-shape dim is named 'T'",
                 id="sweep-unknown"),
])
def test_cli_usage_errors(tmp_path, args, message):
    p = cli(str(_bert(tmp_path)), *args)
    assert p.returncode == 2 and message in p.stderr and "Traceback" not in p.stderr


def with_custom_op(tmp_path) -> str:
    """MatMul [B, 8]·[8, 4], then an op of a custom domain that has no formula."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 4])
    w = helper.make_tensor("w", TensorProto.FLOAT, [8, 4], [0.0] * 32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["h"]),
                               helper.make_node("Mark", ["h"], ["y"], domain="example.custom")],
                              "g", [x], [y], [w], value_info=[helper.make_tensor_value_info("h", TensorProto.FLOAT,
                                                                                            ["B", 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("example.custom", 1)])
    onnx.save(model, tmp_path / "custom.onnx")
    return str(tmp_path / "custom.onnx")


def test_cli_formula_keeps_every_count_setting(tmp_path):
    """--strict and --free-op reach each count of a formula (they used to be dropped on the way)."""
    path = with_custom_op(tmp_path)
    p = cli(path, "--symbolic", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert {tuple(t["powers"]): t["coefficient"] for t in json.loads(p.stdout)["formula"]["terms"]} == {(1,): 2 * 8 * 4}
    p = cli(path, "--symbolic", "--strict")
    assert p.returncode == 6 and "Mark" in p.stderr and "Traceback" not in p.stderr
    p = cli(path, "--input-shape", "x=Bx8", "--sweep", "B=1,2", "--strict", "--free-op", "example.custom:Mark")
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("flags", [["--memory"], ["--parallel", "tp=2"]], ids=["memory", "parallel"])
def test_cli_formula_refuses_what_a_formula_cannot_hold(tmp_path, flags):
    p = cli(with_custom_op(tmp_path), "--symbolic", *flags)
    assert p.returncode == 2 and f"--symbolic with {flags[0]}" in p.stderr and "Traceback" not in p.stderr


def test_cli_not_a_polynomial_is_exit_5(tmp_path):
    onnx.save(strided_conv(), tmp_path / "conv.onnx")
    p = cli(str(tmp_path / "conv.onnx"), "--symbolic", "H=3")
    assert p.returncode == 5 and "not a polynomial in H" in p.stderr


@pytest.mark.parametrize("attention", ["full", "executed"])
def test_hf_llama_formula(tmp_path, attention):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    h, kv, ffn, layers, vocab = 32, 16, 48, 3, 41
    transformers.LlamaConfig(hidden_size=h, intermediate_size=ffn, num_hidden_layers=layers, num_attention_heads=2,
                             num_key_value_heads=1, vocab_size=vocab).save_pretrained(tmp_path / "llama")
    p = cli("--hf", str(tmp_path / "llama"), "--input-shape", "input_ids=1xS", "--symbolic", "S=3",
            "--convention", "dense", "--format", "json", "--attention", attention, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    terms = {tuple(t["powers"]): t["coefficient"] for t in json.loads(p.stdout)["formula"]["terms"]}
    # per token: 2·(matrix parameters of the layers and the head); per sequence: 4·L·h·S² for the attention, of
    # which executed (causal) attention runs the S·(S + 1)/2 pairs on and below the diagonal: 2·L·h·S² + 2·L·h·S
    per_token = 2 * (layers * (2 * h * h + 2 * h * kv + 3 * h * ffn) + h * vocab)
    if attention == "full":
        assert terms == {(2,): 4 * layers * h, (1,): per_token}
    else:
        assert terms == {(2,): 2 * layers * h, (1,): per_token + 2 * layers * h}
