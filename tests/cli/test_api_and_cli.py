"""The plan is a count option: ``flopcount.count(model, parallel=..., microbatches=..., memory=True)`` (and
``from_hf`` with the same keywords) gives the ledgers per rank that ``flopcount ... --parallel ... --format json``
prints for the same flags, rank for rank; and the public ledger functions give them from a report already counted."""

from __future__ import annotations

import json

import pytest
from helpers import llama_config, refusal_lines

import flopcount
from flopcount.cli import main
from flopcount.output.render import render

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

H, L, HEADS, KV_HEADS, FFN, V, B, S = 32, 4, 4, 2, 48, 64, 2, 8
FLAGS = {"mode": "train", "optimizer": "adamw", "memory": True, "parallel": "tp=2,pp=2", "microbatches": 4,
         "schedule": "gpipe", "recompute": "full"}
ARGV = ["--mode", "train", "--optimizer", "adamw", "--memory", "--parallel", "tp=2,pp=2", "--microbatches", "4",
        "--schedule", "gpipe", "--recompute", "full", "--format", "json"]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return llama_config(tmp_path_factory.mktemp("llama"), H, L, HEADS, KV_HEADS, FFN, V)


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def cli_json(capsys, argv) -> dict:
    assert main(argv) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_count_gives_the_ledgers_the_command_line_prints(capsys, llama, tmp_path):
    from flopcount.frontends.source import ModelSource

    path = tmp_path / "llama.onnx"
    onnx.save(ModelSource("hf", llama, inputs={"input_ids": ((B, S), "int64")}).to_onnx(), str(path))
    report = flopcount.count(str(path), **FLAGS)
    api = json.loads(render(report, "json"))
    cli = cli_json(capsys, [str(path), *ARGV])
    assert api["parallel"] == cli["parallel"] and api["memory"] == cli["memory"]
    # rank = tp + T·(dp + D·pp): 2 TP ranks on each of 2 stages, each rank's whole step of 4 microbatches
    assert [(r["coords"]["tp"], r["stage"]) for r in api["parallel"]["ranks"]] == [(0, 0), (1, 0), (0, 1), (1, 1)]
    assert sum(r["model_flops"] for r in api["parallel"]["ranks"]) == 4 * report.total.flops
    assert api["parallel"]["plan"]["schedule"] == "gpipe" and api["parallel"]["recompute"] == "full"
    assert len(api["memory"]["ranks"]) == 4 and api["memory"]["recompute"] == "full"

    # the public entry points give the same ledgers from the one-rank count, the plan as text or as a record
    one = flopcount.count(str(path), mode="train", optimizer="adamw", memory=True, recompute="full")
    plan = flopcount.ParallelPlan(tp=2, pp=2, microbatches=4, schedule="gpipe")
    assert flopcount.parallel_ledger(one, plan, "full").as_dict() == api["parallel"]
    assert flopcount.memory_per_rank(one, plan).as_dict() == api["memory"]
    assert flopcount.parallel_ledger(one, "tp=2").plan == flopcount.ParallelPlan(tp=2)


def test_from_hf_gives_the_ledgers_of_hf_on_the_command_line(capsys, llama):
    """Through the identical-layer extension (4 layers counted from exports of 1 and 2), the ledgers are of the
    extended model, taken once."""
    report = flopcount.from_hf(llama, {"input_ids": (B, S)}, **FLAGS)
    assert report.layers.method == "extended"
    api = json.loads(render(report, "json"))
    cli = cli_json(capsys, ["--hf", llama, "--input-shape", f"input_ids={B}x{S}", *ARGV])
    assert api["parallel"] == cli["parallel"] and api["memory"] == cli["memory"]
    assert api["parallel"]["whole_flops_per_microbatch"] == report.total.flops


def test_an_expert_load_on_a_dense_model_is_refused(capsys, llama, tmp_path):
    """A routing histogram changes nothing on a model without routed experts: one line, exit 2, not a silent
    balanced ledger."""
    load = tmp_path / "load.json"
    load.write_text("[3, 1, 1, 1]")
    assert main(["--hf", llama, "--input-shape", f"input_ids={B}x{S}", "--parallel", "dp=2",
                 "--expert-load", str(load)]) == 2
    err = capsys.readouterr().err
    assert f"--expert-load {load}: the model has no routed experts" in err and len(refusal_lines(err)) == 1


def test_a_generation_whose_cache_cannot_be_held_is_refused_before_any_export(capsys, llama):
    """``--generate 8:2**40``: the last decode step's KV cache, 2**40 + 7 positions in every K and V tensor, is far
    above what an export can be given as example inputs: refused in one line, in seconds, where it took minutes and
    ended in a failed allocation."""
    import time

    start = time.monotonic()
    assert main(["--hf", llama, "--generate", f"8:{2**40}"]) == 2
    err = capsys.readouterr().err
    assert "--generate P:N" in err and "GiB" in err and len(refusal_lines(err)) == 1
    assert time.monotonic() - start < 60
