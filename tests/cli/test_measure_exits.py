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
