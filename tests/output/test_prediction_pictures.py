"""The HTML page of a prediction: each rank's predicted step and the pipeline's predicted schedule, drawn as inline
SVG, checked against the prediction's JSON (``render(..., "json", prediction=...)``): a bar per set of ranks with
the same figures, each part as wide as its seconds on the chart's time axis, the critical rank marked, an interval
end drawn only when it is known; an action per action of the simulated schedule at its start and end; then the
same pages in a real browser (no console error, a screenshot where FLOPCOUNT_TEST_ARTIFACTS points).

Every expected figure is read from the JSON, and every position from the chart's own axis line, never from the
figures the picture writes."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from html.parser import HTMLParser
from pathlib import Path

import pytest

from flopcount.output.render import render
from flopcount.parallel.plan import parse_parallel
from flopcount.plans import parallel_ledger

from helpers import browser, console_errors, needs_chromium

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

#: (id, --parallel, microbatches, profile): one rank, data parallel, a 1F1B pipeline of 4 microbatches (on a
#: profile whose interval has both ends), and all three (ranks with the same figures share a bar).
CASES = [("one-rank", None, 1, "datasheet"), ("dp2", "dp=2", 1, "datasheet"), ("pp2-1f1b-m4", "pp=2", 4, "flat"),
         ("tp2-pp2-dp2", "tp=2,pp=2,dp=2", 4, "datasheet")]


@pytest.fixture(scope="module")
def counted():
    from helpers import tiny_llama

    return tiny_llama(32, 4, 4, 2, 64, 128, (2, 8), optimizer="adamw")


def _flat_profile():
    """A calibrated profile whose every rate covers every size (no extrapolation: both ends of the interval known),
    the best repeats a fifth faster than the medians."""
    from flopcount.measure.machine.calibration import Collective, MachineProfile, Point, Segment

    def points(v):
        return (Point(1e-9, v, 1.2 * v, v), Point(1e18, v, 1.2 * v, v))

    seg = Segment(0, math.inf, {"median": 20e-6, "best": 15e-6}, {"median": 2e9, "best": 2.4e9})
    kinds = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
    return MachineProfile(True, "cpu", 8, {"gemm": points(50e9), "elementwise": points(10e9),
                                           "reduction": points(8e9)},
                          {"forward": Point(1, 2e-6, 1e-6, 3e-6), "backward": Point(1, 2e-6, 1e-6, 3e-6)},
                          {k: Collective(0, (), (seg,)) for k in kinds}, peak_flops_per_s=50e9, date="2026-01-01")


def _case(counted, parallel, microbatches, profile):
    from flopcount.measure.machine.calibration import device_profile
    from flopcount.measure.predict import predict

    report = counted
    if parallel is not None:
        report = dataclasses.replace(counted, parallel=parallel_ledger(counted, parse_parallel(parallel, microbatches,
                                                                                                 "1f1b")))
    ranks = 1 if report.parallel is None else len(report.parallel.ranks)
    pred = predict(report, device_profile("H100", ranks) if profile == "datasheet" else _flat_profile())
    return render(report, "html", prediction=pred), json.loads(render(report, "json", prediction=pred))["prediction"]


class _Svg(HTMLParser):
    """The groups of the two pictures (``rank-time``, ``predicted-action``) with their rectangles and lines, and
    each figure's axis line (its first line: x1 the time 0, x2 the span)."""

    def __init__(self):
        super().__init__()
        self.groups: list[tuple[dict, list[dict], list[dict]]] = []
        self.axes: dict[str, tuple[float, float]] = {}
        self.figure = None
        self.open = None
        self.in_axis = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "figure":
            self.figure = a.get("id")
        cls = a.get("class", "")
        if tag == "g" and cls.split()[:1] in (["rank-time"], ["predicted-action"]):
            self.open = (a, [], [])
            self.groups.append(self.open)
        elif tag == "g" and cls == "time-axis":
            self.in_axis = True
        elif tag == "rect" and self.open is not None:
            self.open[1].append(a)
        elif tag == "line" and self.in_axis and self.figure not in self.axes:
            self.axes[self.figure] = (float(a["x1"]), float(a["x2"]))
        elif tag == "line" and self.open is not None:
            self.open[2].append(a)

    def handle_endtag(self, tag):
        if tag == "g":
            self.open, self.in_axis = None, False


def _parsed(page: str) -> _Svg:
    p = _Svg()
    p.feed(page)
    return p


def _expected_parts(row) -> list[tuple[str, float]]:
    """A rank's parts as the JSON gives them, in the picture's order, and what is left of its step."""
    parts = [("compute", row["compute_seconds"])]
    parts += [(f"exposed {k}", v["exposed"]) for k, v in sorted(row["communication_seconds"].items())]
    parts += [("bubble", row["bubble_seconds"]), ("optimizer", row["optimizer_seconds"])]
    left = row["step_seconds"] - sum(v for _, v in parts)
    return parts + ([("wait", left)] if left > 1e-9 * row["step_seconds"] else [])


def _check_ranks(svg: _Svg, doc) -> None:
    x0, x1 = svg.axes["prediction-chart"]
    known = [v for v in doc["interval"] if v is not None]
    span = max([doc["step_seconds"], *known])
    px = (x1 - x0) / span  # pixels a second
    bars = [g for g in svg.groups if g[0]["class"].startswith("rank-time")]
    distinct = {tuple(_expected_parts(r)) for r in doc["ranks"]}
    assert len(bars) == len(distinct)
    by_rank = {r["rank"]: r for r in doc["ranks"]}
    drawn = [int(x) for g in bars for x in g[0]["data-ranks"].split(",")]
    assert sorted(drawn) == sorted(by_rank)  # every rank in one bar
    for attrs, rects, lines in bars:
        members = [by_rank[int(x)] for x in attrs["data-ranks"].split(",")]
        assert len({tuple(_expected_parts(r)) for r in members}) == 1  # a bar shares figures
        parts = _expected_parts(members[0])
        assert [r["class"] for r in rects] == [c for c, _ in parts]
        x = x0
        for r, (_, seconds) in zip(rects, parts):  # one decimal of a pixel
            assert float(r["x"]) == pytest.approx(x, abs=0.06) and float(r["width"]) == pytest.approx(
                seconds * px, abs=0.06)
            x += seconds * px
        assert x == pytest.approx(x0 + members[0]["step_seconds"] * px, abs=0.1)
        critical = doc["critical_rank"] in [m["rank"] for m in members]
        assert ("critical" in attrs["class"].split()) == critical
        ends = {ln["class"]: float(ln["x1"]) for ln in lines}
        if not critical:
            assert not ends
            continue
        for name, v in zip(("interval-low", "interval-high"), doc["interval"]):
            if v is None:  # not known: absent, never drawn at zero
                assert name not in ends
            else:
                assert ends[name] == pytest.approx(x0 + v * px, abs=0.06)


def _check_actions(svg: _Svg, doc) -> None:
    sched = doc["schedule"]
    actions = [g for g in svg.groups if g[0]["class"] == "predicted-action"]
    if sched is None:
        assert not actions and "timeline-chart" not in svg.axes
        return
    x0, x1 = svg.axes["timeline-chart"]
    px = (x1 - x0) / sched["makespan"]
    assert len(actions) == len(sched["actions"]) > 0
    for (attrs, rects, _), a in zip(actions, sched["actions"]):
        assert (attrs["data-kind"], int(attrs["data-rank"])) == (a["kind"], a["rank"])
        part = sched["parts"][a["chunk"]]["forward" if a["kind"] == "F" else "backward"]
        drawn = [(k, v) for k, v in (("compute", part["compute_seconds"]),
                                     ("collectives", part["collective_seconds"]),
                                     ("send", part["send_seconds"])) if v > 0]
        assert [r["class"] for r in rects] == [k for k, _ in drawn]
        assert float(rects[0]["x"]) == pytest.approx(x0 + a["start"] * px, abs=0.06)
        end = float(rects[-1]["x"]) + float(rects[-1]["width"]) + 0.5  # each rectangle half a pixel short
        assert end == pytest.approx(x0 + a["end"] * px, abs=0.2)
        assert sum(v for _, v in drawn) == pytest.approx(a["end"] - a["start"], rel=1e-9)


@pytest.mark.parametrize("name, parallel, microbatches, profile", CASES, ids=[c[0] for c in CASES])
def test_the_pictures_draw_the_prediction(counted, name, parallel, microbatches, profile):
    page, doc = _case(counted, parallel, microbatches, profile)
    svg = _parsed(page)
    _check_ranks(svg, doc)
    _check_actions(svg, doc)
    if parallel == "pp=2":  # 1F1B, 2 stages, 4 microbatches: a forward and a backward of each on each stage
        assert len(doc["schedule"]["actions"]) == 2 * 2 * 4 and None not in doc["interval"]
    if profile == "datasheet":  # no high end: the caption says so and why is in the note beside it
        assert doc["interval"][1] is None and "not known]" in page and "no high end" in page


@needs_chromium
def test_the_pictures_in_a_realbrowser(counted, tmp_path):
    """Chromium builds the same elements from each page (its DOM, dumped), logs no console error, and draws them
    (a screenshot per page, kept where FLOPCOUNT_TEST_ARTIFACTS points)."""
    out = Path(os.environ.get("FLOPCOUNT_TEST_ARTIFACTS") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    for name, parallel, microbatches, profile in CASES[:3]:
        page, doc = _case(counted, parallel, microbatches, profile)
        path = tmp_path / f"{name}.html"
        path.write_text(page)
        run = browser(tmp_path / f"profile-{name}", "--dump-dom", path.as_uri())
        assert not console_errors(run.stderr), run.stderr
        svg = _parsed(run.stdout)
        _check_ranks(svg, doc)
        _check_actions(svg, doc)
        shot = out / f"prediction-{name}.png"
        browser(tmp_path / f"shot-{name}", "--window-size=1280,2600", f"--screenshot={shot}", path.as_uri())
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_writes_the_pictures(tmp_path):
    """``--predict --format html -o``: the page of a pipelined plan with both pictures, its action count the
    1F1B schedule's 2 stages × 4 microbatches × (forward, backward)."""
    from helpers import llama_config

    from flopcount.cli import main

    out = tmp_path / "report.html"
    assert main(["--hf", llama_config(tmp_path, 32, 4, 4, 2, 64, 128), "--input-shape", "input_ids=2x8:int64",
                 "--mode", "train", "--parallel", "pp=2", "--microbatches", "4", "--predict", "--device", "H100",
                 "--format", "html", "-o", str(out)]) == 0
    svg = _parsed(out.read_text())
    assert len([g for g in svg.groups if g[0]["class"] == "predicted-action"]) == 2 * 4 * 2
    assert set(svg.axes) == {"prediction-chart", "timeline-chart"}
