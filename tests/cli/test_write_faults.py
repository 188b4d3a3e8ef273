"""Commands whose output cannot be written: exit 8 in one line naming the path, before any work where the path is
known to be unwritable, and never an earlier report lost or a partial one left."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from flopcount.cli import main

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "resnet50-v1.5.onnx")
OLD = b'{"earlier": "report"}\n'


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_count_report_on_a_full_disk_keeps_the_earlier_report(small_disk, capsys):
    disk = small_disk(24, files={"r.json": OLD})
    # the per-node JSON of ResNet-50 is far above the 24 KiB left
    rc = main([EXAMPLE, "--format", "json", "--per-node", "-o", str(disk / "r.json")])
    line = one_line(capsys)
    assert rc == 8 and line.startswith(f"flopcount: error: {disk / 'r.json'}: cannot write the report (No space")
    assert (disk / "r.json").read_bytes() == OLD and os.listdir(disk) == ["r.json"]


def test_count_report_replaces_the_earlier_one_whole(tmp_path):
    out = tmp_path / "r.json"
    out.write_bytes(OLD)
    assert main([EXAMPLE, "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["total"]["flops"] > 0 and os.listdir(tmp_path) == ["r.json"]


@pytest.mark.parametrize("option, what", [("-o", "report"), ("--plot", "plot")])
def test_unwritable_outputs_of_count_are_refused_before_counting(tmp_path, monkeypatch, capsys, option, what):
    import flopcount.counting

    monkeypatch.setattr(flopcount.counting, "count", lambda *a, **k: pytest.fail("counted before the check"))
    path = tmp_path / "missing" / "out.svg"
    rc = main([EXAMPLE, option, str(path)])
    assert rc == 8 and one_line(capsys) == (f"flopcount: error: {path}: cannot write the {what} ({option}): no "
                                            f"folder {path.parent}; create it or give another path")


def test_bench_report_into_a_read_only_folder_is_refused_before_training(small_disk, monkeypatch, capsys):
    pytest.importorskip("torch")
    from flopcount.workloads import digits

    monkeypatch.setattr(digits, "count", lambda *a, **k: pytest.fail("counted before the check"))
    monkeypatch.setattr(digits, "train", lambda *a, **k: pytest.fail("trained before the check"))
    ro = small_disk(64, readonly=True, files={"r.json": OLD})
    rc = main(["bench", "digits", "--no-progress", "-o", str(ro / "r.json")])
    assert rc == 8 and one_line(capsys) == (f"flopcount: error: {ro / 'r.json'}: cannot write the report (-o) "
                                            "(Read-only file system); give a path in a writable folder")
    assert (ro / "r.json").read_bytes() == OLD


def test_meter_to_json_on_a_full_disk_keeps_the_earlier_report(small_disk):
    from flopcount.errors import OutputError
    from flopcount.measure.harness.meter import Meter

    disk = small_disk(4, files={"run.json": OLD})
    ticks = iter(range(1000))
    meter = Meter(flops_per_sample=1e6, peak_flops=1e9, warmup_steps=0, window_steps=2, energy=False,
                  clock=lambda: float(next(ticks)))
    for _ in range(4):
        with meter.step(samples=8):
            pass
    with pytest.raises(OutputError, match=f"^{disk / 'run.json'}: cannot write the run report \\(No space"):
        meter.to_json(str(disk / "run.json"), config={"padding": "x" * 8192})
    assert (disk / "run.json").read_bytes() == OLD and os.listdir(disk) == ["run.json"]


def test_a_plot_on_a_full_disk_keeps_the_earlier_plot(small_disk, capsys):
    pytest.importorskip("matplotlib")
    disk = small_disk(8, files={"p.svg": b"<svg>earlier</svg>"})
    rc = main([EXAMPLE, "--plot", str(disk / "p.svg")])  # an SVG chart of ResNet-50's op types is above 8 KiB
    line = capsys.readouterr().err.strip().splitlines()
    assert rc == 8 and len(line) == 1
    assert line[0].startswith(f"flopcount: error: {disk / 'p.svg'}: cannot write the plot (No space left on device)")
    assert (disk / "p.svg").read_bytes() == b"<svg>earlier</svg>" and os.listdir(disk) == ["p.svg"]
