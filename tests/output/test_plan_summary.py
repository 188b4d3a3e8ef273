"""A plan's summary (flopcount.memory.summary.plan_summary) and its ledgers in every format: the most a rank holds
against the device's memory, the slowest rank, the MFU ceiling, the classes of ranks that hold the same bytes; the
per-rank tables in text, JSON, CSV, Markdown and HTML, and the HTML page's pictures, also in a real browser.

Every figure asserted is derived here from the ledgers' per-rank records (sums, maxima, the schedule's actions) or
from closed forms of the tiny Llama's sizes, never from the summary itself."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from pathlib import Path

import pytest

import flopcount
from flopcount.memory.ledger import MemorySettings
from flopcount.memory.summary import plan_summary
from flopcount.output.render import render
from flopcount.parallel.plan import parse_parallel
from flopcount.plans import memory_per_rank, parallel_ledger
from helpers import browser, console_errors, needs_chromium

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, FFN, V, B, S = 32, 4, 4, 2, 48, 64, 2, 8
D = H // HEADS
DEVICE = 2**20  # 1 MiB: more than any rank of the plans below holds


@pytest.fixture(scope="module")
def counted():
    config = transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V)
    return flopcount.from_hf(config, (B, S), mode="train", optimizer="adam", cache_dir=False,
                             memory=MemorySettings(device="cpu", device_memory=DEVICE))


def planned(report, text: str, microbatches: int = 1, schedule: str = "1f1b"):
    plan = parse_parallel(text, microbatches, schedule)
    return dataclasses.replace(report, parallel=parallel_ledger(report, plan), memory=memory_per_rank(report, plan))


def held(rank) -> int:
    return rank.peak_bytes + (rank.kv_cache_bytes or 0)


def test_verdict_against_the_device(counted):
    report = planned(counted, "tp=2,pp=2,dp=2", 4)
    ranks = report.memory.ranks
    most = max(held(r) for r in ranks)
    stage = min(r.stage for r in ranks if held(r) == most)
    s = plan_summary(report.parallel, report.memory)
    assert (s.device_memory_bytes, s.held_bytes, s.stage, s.fits) == (DEVICE, most, stage, True)
    assert s.headroom_bytes == DEVICE - most
    assert s.verdict.startswith("fits: ") and "of 1.0 MiB" in s.verdict and s.verdict.endswith(f"(stage {stage})")
    over = plan_summary(report.parallel, report.memory, device_memory=most - 1024)  # a KiB short
    assert (over.fits, over.headroom_bytes) == (False, -1024)
    assert over.verdict.endswith("by 1.0 KiB") and over.verdict.startswith(f"stage {stage}: ")
    exact = plan_summary(report.parallel, report.memory, device_memory=most)
    assert (exact.fits, exact.headroom_bytes) == (True, 0)
    bare = plan_summary(report.parallel, dataclasses.replace(
        report.memory, settings=dataclasses.replace(report.memory.settings, device_memory=None)))
    assert (bare.fits, bare.headroom_bytes, bare.device_memory_bytes) == (None, None, None)
    assert "no device memory given" in bare.verdict


def test_classes_group_ranks_holding_the_same_bytes(counted):
    report = planned(counted, "tp=2,pp=2,dp=2", 4)
    s = plan_summary(report.parallel, report.memory)
    world = 2 * 2 * 2
    members = [x for c in s.classes for x in c.ranks]
    assert sorted(members) == list(range(world)) and s.world == world  # every rank once
    # TP ranks of a stage hold the same bytes (the plan's degrees divide): one class per stage, 4 ranks each
    assert [(c.stage, c.tp, len(c.ranks)) for c in s.classes] == [(0, (0, 1), 4), (1, (0, 1), 4)]
    # on a TP rank of 2, a layer: Q, O H×H/2, K, V one K/V head H·D, gate, up, down H×FFN/2, two norms H whole
    layer = H * H + 2 * H * D + 3 * H * FFN // 2 + 2 * H
    assert [c.params_bytes for c in s.classes] == [4 * (V * H // 2 + 2 * layer), 4 * (2 * layer + H + V * H // 2)]
    by_rank = {x: r for r in report.memory.ranks for x in r.replicas}
    for c in s.classes:
        r = by_rank[c.ranks[0]]
        assert c.activations_bytes == r.activations_bytes * r.microbatches_in_flight  # 1F1B: P − s in flight
        assert c.held_bytes == held(r) and c.headroom_bytes == DEVICE - held(r)
        assert c.hardware_flops == max(f.hardware_flops for f in report.parallel.ranks if f.rank in c.ranks)


def test_whole_model_on_each_data_parallel_rank(counted):
    report = planned(counted, "dp=2")
    (c,) = plan_summary(report.parallel, report.memory).classes
    # Llama's parameters whole: embedding and head V×H, per layer Q, O H×H, K, V H×2D, MLP 3·H×FFN, two norms, the
    # final norm; float32
    assert c.ranks == (0, 1) and c.params_bytes == 4 * (2 * V * H + L * (2 * H * H + 2 * H * 2 * D + 3 * H * FFN
                                                                         + 2 * H) + H)


def test_mfu_ceiling_without_a_pipeline(counted):
    led = planned(counted, "tp=2,dp=2").parallel
    s = plan_summary(led)
    model = sum(r.model_flops for r in led.ranks)
    step = max(r.hardware_flops for r in led.ranks)  # no pipeline: the slowest rank's work is the step
    assert led.schedule is None and s.step_flops == step
    assert s.mfu_ceiling == pytest.approx(model / (4 * step))
    assert s.model_flops == model == 2 * counted.total.flops  # one microbatch on each of 2 DP replicas
    assert s.slowest_hardware_flops == step and s.classes == ()


def test_mfu_ceiling_with_the_pipeline_bubble(counted):
    p, m = 2, 4
    led = planned(counted, f"pp={p}", m).parallel
    sched = led.schedule
    # 1F1B: each pipeline rank runs M forwards and M backwards, P − 1 − p forwards before its first backward
    assert len(sched.actions) == p * m * 2
    for rank in range(p):
        kinds = "".join(a.kind for a in sched.actions if a.rank == rank)
        warm = p - 1 - rank
        assert kinds == "F" * warm + "FB" * (m - warm) + "B" * warm
    assert sched.makespan == max(a.end for a in sched.actions)
    busy = [sum(a.end - a.start for a in sched.actions if a.rank == rank) for rank in range(p)]
    assert list(sched.busy) == pytest.approx(busy)
    assert led.bubble_fraction == pytest.approx(1 - sum(busy) / (p * sched.makespan))
    # the step: each rank's hardware FLOPs stretched by its pipeline rank's idle time, the longest
    step = max(r.hardware_flops * sched.makespan / busy[r.stage] for r in led.ranks)
    s = plan_summary(led)
    assert s.step_flops == pytest.approx(step)
    assert s.mfu_ceiling == pytest.approx(sum(r.model_flops for r in led.ranks) / (p * step))
    assert s.mfu_ceiling < 1 - led.bubble_fraction + 1e-9  # at best what the bubble leaves


def test_text_puts_the_summary_first_in_short_lines(counted):
    report = planned(counted, "tp=2,pp=2,dp=2", 4)
    s = plan_summary(report.parallel, report.memory)
    out = render(report, "table")
    first = out.split("\n\n")[0].splitlines()
    assert first[0] == f"Plan {report.parallel.plan} (8 ranks):"
    assert first[1] == f"  Memory: {s.verdict}"
    assert max(len(line) for line in first) <= 120
    assert len([x for x in first if re.match(r"  [01] +0,1 +4 ", x)]) == 2  # a row per class: stage, TP, ranks
    slowest = max(report.parallel.ranks, key=lambda r: (r.hardware_flops, -r.rank))
    assert f"Slowest rank: {slowest.rank}, {slowest.hardware_flops:,} hardware FLOPs a step" in first[2]
    assert "activations B / mb" not in out  # the per-rank bytes are in JSON and CSV, grouped here
    md = render(report, "markdown")
    assert md.startswith(f"Plan {report.parallel.plan}") and "| stage   | TP" in md


def test_json_carries_the_device_and_the_headroom(counted):
    report = planned(counted, "tp=2,pp=2,dp=2", 4)
    doc = json.loads(render(report, "json"))
    ranks = doc["memory"]["ranks"]
    assert doc["memory"]["device_memory_bytes"] == DEVICE
    assert [r["headroom_bytes"] for r in ranks] == [DEVICE - r["peak_bytes"] for r in ranks]
    summary = doc["summary"]
    assert summary["held_bytes"] == max(r["peak_bytes"] for r in ranks)
    assert summary["headroom_bytes"] == DEVICE - summary["held_bytes"] and summary["fits"] is True
    assert sorted(x for c in summary["classes"] for x in c["ranks"]) == list(range(8))
    assert [c["count"] for c in summary["classes"]] == [4, 4]
    flops = doc["parallel"]["ranks"]
    assert summary["slowest_hardware_flops"] == max(r["hardware_flops"] for r in flops)
    assert summary["model_flops"] == sum(r["model_flops"] for r in flops)
    assert len(doc["parallel"]["schedule"]["actions"]) == 2 * 4 * 2


def test_csv_has_a_row_per_rank(counted):
    report = planned(counted, "tp=2,pp=2,dp=2", 4)
    ops, ranks = render(report, "csv").split("\n\n")
    assert ops.splitlines()[0].startswith("op_type,")
    rows = list(csv.DictReader(io.StringIO(ranks)))
    assert [int(r["rank"]) for r in rows] == list(range(8))
    by_rank = {x: m for m in report.memory.ranks for x in m.replicas}
    for row, f in zip(rows, report.parallel.ranks):
        assert (int(row["model_flops"]), int(row["hardware_flops"])) == (f.model_flops, f.hardware_flops)
        assert {k: int(row[f"{c.kind}_{c.group}_bytes"]) for c in f.communication for k in [(c.kind, c.group)]} \
            == {(c.kind, c.group): c.bytes for c in f.communication}
        m = by_rank[f.rank]
        assert (int(row["peak_bytes"]), int(row["headroom_bytes"])) == (m.peak_bytes, DEVICE - m.peak_bytes)
        assert int(row["pp"]) == m.stage == f.stage


def _flops_bars(report) -> int:
    """The distinct bars of the FLOPs chart: ranks of the same stage and the same model, redundant and recomputed
    FLOPs draw one."""
    return len({(r.stage, r.model_flops, r.redundant_flops, r.recompute_flops) for r in report.parallel.ranks})


def test_html_pictures_count_the_ledgers(counted):
    report = planned(counted, "tp=2,pp=2,dp=2", 4)
    page = render(report, "html")
    assert not re.search(r"<(link|img|iframe)\b|\bsrc=|\bhref=|@import|url\(", page)  # nothing fetched
    assert page.count('<g class="flops-bar"') == _flops_bars(report) == 4
    assert page.count('<g class="memory-bar"') == len({(r.stage, r.peak_bytes) for r in report.memory.ranks}) == 2
    assert page.count('<g class="action" data-kind="F"') == page.count('<g class="action" data-kind="B"') == 2 * 4
    assert page.count('class="device-memory"') == 1
    for f in report.parallel.ranks:  # in the table, and each bar's title
        assert f">{f.hardware_flops:,}<" in page and f"<title>model {f.model_flops:,} FLOPs</title>" in page
    for table in ("plan-summary", "class-table", "rank-table", "memory-table"):
        assert f'id="{table}"' in page


def test_the_memory_alone_in_every_format(counted):
    """Without a plan, the one rank's peak against the device: a line of the text, the summary in JSON (no FLOPs
    figures), a row in CSV, a bar and the device's line on the page."""
    (rank,) = counted.memory.ranks
    line = next(x for x in render(counted, "table").splitlines() if x.startswith("  device memory: "))
    assert line.startswith("  device memory: fits: ") and line.endswith("(stage 0)")
    summary = json.loads(render(counted, "json"))["summary"]
    assert (summary["held_bytes"], summary["headroom_bytes"]) == (rank.peak_bytes, DEVICE - rank.peak_bytes)
    assert [c["ranks"] for c in summary["classes"]] == [[0]] and summary["mfu_ceiling"] is None
    (row,) = csv.DictReader(io.StringIO(render(counted, "csv").split("\n\n")[1]))
    assert (int(row["peak_bytes"]), int(row["headroom_bytes"])) == (rank.peak_bytes, DEVICE - rank.peak_bytes)
    page = render(counted, "html")
    assert page.count('<g class="memory-bar"') == 1 and page.count('class="device-memory"') == 1
    assert f"<td>{rank.peak_bytes:,}</td>" in page and '<g class="action"' not in page



@needs_chromium
def test_html_plan_in_a_realbrowser(counted, tmp_path):
    """The page of a pipelined plan drawn by Chromium: the pictures' elements in the DOM it builds, no console
    error (a page with one is caught, so the check can fail), and a screenshot kept where FLOPCOUNT_TEST_ARTIFACTS
    points."""
    import os

    report = planned(counted, "tp=2,pp=2,dp=2", 4)
    page = tmp_path / "plan.html"
    page.write_text(render(report, "html"))
    run = browser(tmp_path / "profile", "--dump-dom", page.as_uri())
    assert not console_errors(run.stderr), run.stderr
    dom = run.stdout
    assert dom.count('class="flops-bar"') == _flops_bars(report)
    assert dom.count('class="memory-bar"') == 2 and dom.count('class="action"') == len(report.parallel.schedule.actions)
    broken = tmp_path / "broken.html"
    broken.write_text(page.read_text().replace("</body>", "<script>undefinedFunction()</script></body>"))
    assert console_errors(browser(tmp_path / "profile2", "--dump-dom", broken.as_uri()).stderr)
    out = Path(os.environ.get("FLOPCOUNT_TEST_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    shot = out / "plan-report.png"
    browser(tmp_path / "profile3", "--window-size=1280,2000", f"--screenshot={shot}", page.as_uri())
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
