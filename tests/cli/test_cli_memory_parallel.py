"""``flopcount --hf DIR --memory --parallel ...``: the memory ledger per rank through the identical-layer extension,
in the JSON (``memory.ranks[]`` with coords, stage and DP replicas) and as a table by rank."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from helpers import llama_config

from flopcount.cli import main

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, FFN, V, B, S = 32, 4, 4, 2, 48, 64, 2, 8
D = H // HEADS


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return llama_config(tmp_path_factory.mktemp("llama"), H, L, HEADS, KV_HEADS, FFN, V)


@pytest.fixture(autouse=True)
def cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("FLOPCOUNT_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


def test_json_ranks_and_table(capsys, llama):
    argv = ["--hf", llama, "--input-shape", f"input_ids={B}x{S}", "--mode", "train", "--optimizer", "adamw",
            "--memory", "--memory-device", "cpu", "--parallel", "tp=2,pp=2,dp=2", "--microbatches", "4"]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ranks = doc["memory"]["ranks"]
    assert [(r["coords"]["tp"], r["stage"], r["replicas"]) for r in ranks] == [
        (0, 0, [0, 2]), (1, 0, [1, 3]), (0, 1, [4, 6]), (1, 1, [5, 7])]
    # a layer on a TP rank of 2: Q, O H×H/2, K, V one K/V head H·D, gate, up, down H×FFN/2, two norms H whole
    layer = H * H + 2 * H * D + 3 * H * FFN // 2 + 2 * H
    first, last = V * H // 2 + 2 * layer, 2 * layer + H + V * H // 2  # embedding / final norm and head
    assert [r["params_bytes"] for r in ranks] == [4 * first, 4 * first, 4 * last, 4 * last]
    assert [r["microbatches_in_flight"] for r in ranks] == [2, 2, 1, 1]  # 1F1B: P − s
    assert main([*argv, "--device-memory", "1GiB"]) == 0
    out = capsys.readouterr().out.splitlines()
    # the plan's summary first: the most a rank holds against the device, then a row per class of ranks holding
    # the same bytes (the 2 TP ranks of a stage and their DP replicas: 4 ranks), every line short
    most = max(r["peak_bytes"] for r in ranks)
    stage = min(r["stage"] for r in ranks if r["peak_bytes"] == most)
    assert out[0] == "Plan tp=2,pp=2,cp=1,ep=1,dp=2 microbatches=4 schedule=1f1b (8 ranks):"
    assert out[1].startswith("  Memory: fits: ") and out[1].endswith(
        f"of 1.0 GiB, {(2**30 - most) / 2**20:,.1f} MiB free (stage {stage})")  # under a GiB: in MiB
    assert [line.split()[:3] for line in out if re.match(r"  [01] +0,1 ", line)] == [["0", "0,1", "4"], ["1", "0,1", "4"]]
    assert max(len(line) for line in out[:out.index("")]) <= 120


def test_cp_ranks_in_json(capsys, llama):
    argv = ["--hf", llama, "--input-shape", f"input_ids={B}x{S}", "--mode", "train", "--optimizer", "adamw",
            "--memory", "--memory-device", "cpu", "--parallel", "tp=2,cp=2,dp=2,fsdp", "--format", "json"]
    assert main(argv) == 0
    ranks = json.loads(capsys.readouterr().out)["memory"]["ranks"]
    # one entry per TP rank, its 2 CP × 2 DP replicas; the gathered K and V of one layer that the fused attention
    # kernel keeps, both before the grouped-query repeat: the one K/V head a TP rank holds, B·S·D each, float32
    assert [(r["coords"]["tp"], r["replicas"]) for r in ranks] == [(0, [0, 2, 4, 6]), (1, [1, 3, 5, 7])]
    assert {r["cp_kv_bytes"] for r in ranks} == {4 * 2 * B * S * D}
    layer = H * H + 2 * H * D + 3 * H * FFN // 2 + 2 * H  # a layer on a TP rank of 2, as above
    assert {r["params_bytes"] for r in ranks} == {4 * (V * H + L * layer + H) // 4}  # fsdp over dp·cp = 4


def test_csv_and_html_carry_the_ranks(capsys, llama):
    """``--format csv`` and ``--format html`` with ``--parallel --memory`` keep the per-rank tables: a CSV row per
    rank (after the operator table and a blank line), the page's tables and pictures."""
    argv = ["--hf", llama, "--input-shape", f"input_ids={B}x{S}", "--mode", "train", "--optimizer", "adamw",
            "--memory", "--memory-device", "cpu", "--parallel", "tp=2,pp=2,dp=2", "--microbatches", "4",
            "--device-memory", "1GiB"]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert main([*argv, "--format", "csv"]) == 0
    ops, ranks = capsys.readouterr().out.split("\n\n")
    rows = list(csv.DictReader(io.StringIO(ranks)))
    assert [(int(r["rank"]), int(r["hardware_flops"])) for r in rows] == [
        (r["rank"], r["hardware_flops"]) for r in doc["parallel"]["ranks"]]
    peaks = {x: m["peak_bytes"] for m in doc["memory"]["ranks"] for x in m["replicas"]}
    assert [int(r["peak_bytes"]) for r in rows] == [peaks[k] for k in range(8)]
    assert [int(r["headroom_bytes"]) for r in rows] == [2**30 - peaks[k] for k in range(8)]
    assert main([*argv, "--format", "html"]) == 0
    page = capsys.readouterr().out
    for table in ('id="plan-summary"', 'id="rank-table"', 'id="memory-table"', 'id="schedule-chart"'):
        assert table in page
    assert page.count('<g class="action"') == len(doc["parallel"]["schedule"]["actions"]) == 2 * 4 * 2
