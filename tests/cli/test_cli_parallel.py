"""``flopcount --hf DIR --parallel ...``: the per-rank ledger in the JSON (schema 8) and as a table by rank, the
flags shared with ``--memory``, and exit 2 naming the degree or the part not modelled yet."""

from __future__ import annotations

import json

import pytest

from helpers import llama_config, refusal_lines

from flopcount.cli import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, FFN, V, B, S = 32, 4, 4, 2, 48, 64, 2, 8


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return llama_config(tmp_path_factory.mktemp("llama"), H, L, HEADS, KV_HEADS, FFN, V)


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def test_json_block_and_table(capsys, llama):
    argv = ["--hf", llama, "--input-shape", f"input_ids={B}x{S}", "--mode", "train", "--parallel", "tp=2,pp=2,dp=2",
            "--microbatches", "4", "--schedule", "gpipe", "--recompute", "full"]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 9
    par = doc["parallel"]
    assert par["plan"]["tp"] == 2 and par["plan"]["pp"] == 2 and par["plan"]["dp"] == 2
    assert par["plan"]["schedule"] == "gpipe" and par["recompute"] == "full"
    assert [r["rank"] for r in par["ranks"]] == list(range(8))
    # rank = tp + T·(dp + D·pp)
    assert [(r["coords"]["tp"], r["coords"]["dp"], r["coords"]["pp"]) for r in par["ranks"]] == [
        (t, d, p) for p in range(2) for d in range(2) for t in range(2)]
    assert all(r["stage"] == r["coords"]["pp"] for r in par["ranks"])
    whole = doc["total"]["flops"]
    assert par["whole_flops_per_microbatch"] == whole
    assert sum(r["model_flops"] for r in par["ranks"]) == whole * 4 * 2
    assert all(r["hardware_flops"] == 4 * r["per_microbatch"]["hardware_flops"] for r in par["ranks"])
    assert 0 < par["bubble_fraction"] < 1 and par["slowest_rank"] in range(8) and par["imbalance"] >= 1
    a = B * S * H * 4
    tp = [c for c in par["ranks"][0]["communication"] if c["group"] == "tp"]
    # stage 0, per microbatch: 2 layers × 2 all_reduces forward and backward, both again in each layer's rerun
    # (full recompute), and the embedding's all_reduce
    assert tp == [{"kind": "all_reduce", "group": "tp", "bytes": 4 * (2 * 2 * 2 * a + 2 * 2 * a + a)}]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "FLOPs per rank a step" in out and "hardware" in out and "redundant" in out and "all_reduce(tp)" in out
    assert max(len(line) for line in out.splitlines()) <= 120  # tables in classes, the long line wrapped
    assert "Parallel (tp=2,pp=2,cp=1,ep=1,dp=2 microbatches=4 schedule=gpipe, recompute full, train)" in out


def test_operator_list_recompute_with_memory_per_rank(capsys, llama):
    """``--parallel tp=2 --memory --recompute Softmax,Mul``: the FLOPs per rank run the listed nodes again and the
    memory per rank keeps less than without recompute (what only the units' own nodes keep is made again), on
    both TP ranks alike. On the CPU's fused sdpa (on CUDA this fp32 grouped-query model runs the math path, whose
    probabilities the product with V keeps whatever is recomputed)."""
    argv = ["--hf", llama, "--input-shape", f"input_ids={B}x{S}", "--mode", "train", "--memory", "--parallel",
            "tp=2", "--format", "json", "--memory-device", "cpu"]
    docs = {}
    for policy in ("none", "Softmax,Mul"):
        assert main([*argv, "--recompute", policy]) == 0
        docs[policy] = json.loads(capsys.readouterr().out)
    ops, none = docs["Softmax,Mul"], docs["none"]
    assert ops["memory"]["recompute"] == ops["parallel"]["recompute"] == "Mul,Softmax"
    assert all(r["recompute_flops"] > 0 for r in ops["parallel"]["ranks"])
    kept = [r["activations_bytes"] for r in ops["memory"]["ranks"]]
    assert len(kept) == 2 and kept[0] == kept[1] < none["memory"]["ranks"][0]["activations_bytes"]


@pytest.mark.parametrize("flags, message", [
    pytest.param(["--parallel", "tp=3"], "--parallel tp=3: tp must divide the 4 attention heads", id="tp"),
    pytest.param(["--parallel", "pp=3", "--microbatches", "3"], "--parallel pp=3: pp must divide the 4 layers",
                 id="pp"),
    pytest.param(["--parallel", "cp=3"], "--parallel cp=3: the zigzag split needs 2·cp = 6 to divide the "
                 "sequence length 8", id="cp"),
    pytest.param(["--parallel", "ep=2,dp=2"], "--parallel ep=2: ", id="ep-dense"),
    pytest.param(["--parallel", "dp=2", "--expert-load", "missing-load.json"], "--expert-load missing-load.json: "
                 "cannot read it as JSON", id="expert-load-file"),
    pytest.param(["--expert-load", "load.json"], "--expert-load needs --parallel", id="expert-load-alone"),
    pytest.param(["--token-dispatcher", "allgather"], "--token-dispatcher needs --parallel",
                 id="token-dispatcher-alone"),
    pytest.param(["--parallel", "tp=2", "--token-dispatcher", "alltoall"], "--token-dispatcher alltoall: the model "
                 "has no routed experts", id="token-dispatcher-dense"),
    pytest.param(["--parallel", "pp=2", "--microbatches", "3", "--schedule", "interleaved"],
                 "--microbatches 3: the interleaved schedule runs microbatches in groups of pp=2", id="interleaved"),
    pytest.param(["--parallel", "tp=2", "--recompute", "full"], "give --mode train", id="recompute-inference"),
    pytest.param(["--parallel", "tp=2,sp", "--generate", "4:2"], "--parallel sp with --generate: sp splits the "
                 "sequence, and a decode step has one token", id="generate-sp"),
    pytest.param(["--parallel", "tp=2", "--generate", "4:2", "--recompute", "full"], "recompute changes training "
                 "only", id="generate-recompute"),
])
def test_bad_plans_exit_2(capsys, llama, flags, message):
    assert main(["--hf", llama, "--input-shape", f"input_ids={B}x{S}", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(refusal_lines(err)) == 1
