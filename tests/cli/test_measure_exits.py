"""Exit codes of the measuring commands for files and devices they cannot use (never an internal error)."""

from __future__ import annotations

import pytest

from flopcount.cli import main


def test_bench_mllog_in_a_missing_folder_exits_8_before_training(tmp_path, capsys):
    pytest.importorskip("torch")
    path = tmp_path / "nonexistent" / "x.log"
    rc = main(["bench", "digits", "--no-progress", "--mllog", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 8 and len(err) == 1 and str(path) in err[0] and "MLPerf log" in err[0]


def test_ceilings_on_cuda_without_cuda_exits_11(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this torch sees a CUDA device")
    for argv in (["ceilings", "--device", "cuda"], ["ceilings", "--device", "cuda:0", "--quick"]):
        rc = main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 11 and len(err) == 1 and "torch sees no CUDA device" in err[0]


def test_ceilings_without_torch_exits_11(tmp_path):
    """As roofline does: torch hidden from the process, ceilings is one line and exit 11, nothing written."""
    import subprocess
    import sys

    out = tmp_path / "c.json"
    code = ("import sys; sys.modules['torch'] = None\n"
            "from flopcount.cli import main\n"
            f"sys.exit(main(['ceilings', '--quick', '-o', {str(out)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    err = done.stderr.strip().splitlines()
    assert done.returncode == 11, done.stderr
    assert len(err) == 1 and "torch, which is not installed" in err[0] and "internal error" not in err[0]
    assert not out.exists()


def test_ceilings_and_roofline_give_one_memory_bandwidth(tmp_path, monkeypatch):
    """The copy bandwidth ceilings measures is offered to the cache roofline reads; a slower one measured later
    reports the cached best, so both commands give the same figure."""
    pytest.importorskip("torch")
    from dataclasses import replace

    from flopcount.measure.machine import ceilings

    monkeypatch.setenv("FLOPCOUNT_CACHE", str(tmp_path / "cache"))
    measured = ceilings.measure_cpu_bandwidth("cpu")
    assert measured.message_bytes == 128 * 2**20 and measured.repeats == 5
    kept, note = ceilings.best_bandwidth(measured)
    assert kept == measured and note == ""
    assert ceilings.cached_memory_bandwidth("cpu").bytes_per_s == measured.bytes_per_s  # roofline's figure
    slower = replace(measured, bytes_per_s=measured.bytes_per_s / 2)
    kept, note = ceilings.best_bandwidth(slower)
    assert kept.bytes_per_s == measured.bytes_per_s and "the best rate cached for this machine" in note
    assert ceilings.default_ceilings().memory_bandwidth.value == measured.bytes_per_s
