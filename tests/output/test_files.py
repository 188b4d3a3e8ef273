"""flopcount.output.files: every file written whole or not at all; an earlier file survives any failure."""

from __future__ import annotations

import os
import stat

import pytest

from flopcount.errors import OutputError
from flopcount.output import files

OLD = b'{"old": "report"}\n'


def listing(folder):
    return sorted(os.listdir(folder))


def test_write_replaces_the_file_whole_and_keeps_its_mode(tmp_path):
    target = tmp_path / "r.json"
    target.write_bytes(OLD)
    os.chmod(target, 0o640)
    files.write_atomic(target, "new\n", "report")
    assert target.read_text() == "new\n" and listing(tmp_path) == ["r.json"]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640  # the target's mode, not mkstemp's 0o600
    files.write_atomic(tmp_path / "b.bin", b"\x00\x01", "export")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert stat.S_IMODE(os.stat(tmp_path / "b.bin").st_mode) == 0o666 & ~mask  # as open(path, "w") gives


@pytest.mark.parametrize("fail", ["write", "fsync", "replace"])
def test_a_failure_at_any_stage_leaves_the_earlier_file_and_nothing_else(tmp_path, monkeypatch, fail):
    target = tmp_path / "r.json"
    target.write_bytes(OLD)
    full = OSError(28, "No space left on device")

    def boom(*a, **k):
        raise full

    if fail == "write":
        real_open = open

        class Full:
            def __init__(self, f):
                self.f = f

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.f.close()

            def write(self, data):
                self.f.write(data[: len(data) // 2])  # half is written, then the disk is full
                raise full

        monkeypatch.setattr("builtins.open", lambda p, *a, **k: Full(real_open(p, *a, **k)))
    else:
        monkeypatch.setattr(os, fail, boom)
    with pytest.raises(OutputError) as e:
        files.write_atomic(target, "x" * 10_000, "report")
    monkeypatch.undo()
    assert str(e.value) == (f"{target}: cannot write the report (No space left on device); the earlier file there, "
                            "if any, is unchanged")
    assert target.read_bytes() == OLD and listing(tmp_path) == ["r.json"]


def test_a_new_file_that_fails_leaves_no_empty_file(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    with pytest.raises(OutputError, match="Input/output error"):
        files.write_atomic(tmp_path / "new.json", "{}", "report")
    monkeypatch.undo()
    assert listing(tmp_path) == []


def test_atomic_path_for_a_writer_that_takes_a_path(tmp_path):
    target = tmp_path / "plot.svg"
    target.write_bytes(OLD)
    with pytest.raises(OutputError):
        with files.atomic_path(target, "plot") as tmp:
            assert tmp.endswith(".svg") and os.path.dirname(tmp) == str(tmp_path)
            open(tmp, "w").write("<svg")
            raise OSError(28, "No space left on device")  # the writer failed half way
    assert target.read_bytes() == OLD and listing(tmp_path) == ["plot.svg"]
    with files.atomic_path(target, "plot") as tmp:
        open(tmp, "w").write("<svg/>")
    assert target.read_text() == "<svg/>" and listing(tmp_path) == ["plot.svg"]


def test_check_writable_refuses_a_missing_folder_and_a_folder(tmp_path):
    with pytest.raises(OutputError) as e:
        files.check_writable(tmp_path / "no" / "r.json", "report", "-o")
    assert str(e.value) == (f"{tmp_path / 'no' / 'r.json'}: cannot write the report (-o): no folder "
                            f"{tmp_path / 'no'}; create it or give another path")
    with pytest.raises(OutputError, match="it is a folder"):
        files.check_writable(tmp_path, "plot", "--plot")
    files.check_writable(tmp_path / "ok.json", "report")
    assert listing(tmp_path) == []  # the probe file is gone


def test_full_and_read_only_disks_for_real(small_disk):
    ro = small_disk(64, readonly=True, files={"r.json": OLD})
    with pytest.raises(OutputError, match="Read-only file system"):
        files.check_writable(ro / "r.json", "report", "-o")  # root is refused too: no mode bits involved
    with pytest.raises(OutputError, match="Read-only file system"):
        files.write_atomic(ro / "r.json", "new", "report")
    assert (ro / "r.json").read_bytes() == OLD
    full = small_disk(16, files={"r.json": OLD})
    with pytest.raises(OutputError, match="No space left on device"):
        files.write_atomic(full / "r.json", "x" * 64 * 1024, "report")
    assert (full / "r.json").read_bytes() == OLD and listing(full) == ["r.json"]


def test_line_stream_flushes_each_line_and_renames_at_close(tmp_path):
    target = tmp_path / "run.log"
    target.write_bytes(OLD)
    log = files.LineStream(target, "MLPerf log")
    log.write("a\n")
    (part,) = [p for p in listing(tmp_path) if p != "run.log"]
    assert (tmp_path / part).read_text() == "a\n"  # flushed: readable while the run goes on
    assert target.read_bytes() == OLD  # the earlier log stays until this one is whole
    log.write("b\n")
    log.close()
    log.close()
    assert target.read_text() == "a\nb\n" and listing(tmp_path) == ["run.log"]


def test_line_stream_on_a_full_disk_fails_once_at_close(small_disk):
    disk = small_disk(8, files={"run.log": OLD})
    log = files.LineStream(disk / "run.log", "MLPerf log (--mllog)")
    for _ in range(200):  # 20 KB into 8 KB
        log.write("x" * 99 + "\n")
    assert isinstance(log.failed, OutputError)
    assert listing(disk) == ["run.log"]  # the partial log is gone at once
    with pytest.raises(OutputError) as e:
        log.close()
    assert str(e.value).startswith(f"{disk / 'run.log'}: cannot write the MLPerf log (--mllog) (No space left")
    assert (disk / "run.log").read_bytes() == OLD


def test_a_symbolic_link_keeps_pointing_at_the_new_file_and_devices_are_written_in_place(tmp_path):
    real = tmp_path / "real.json"
    real.write_bytes(OLD)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    files.write_atomic(link, "new", "report")
    assert link.is_symlink() and real.read_text() == "new" and listing(tmp_path) == ["link.json", "real.json"]
    files.check_writable("/dev/null", "report", "-o")
    files.check_writable("/dev/stdout", "report", "-o")  # a link to a pipe or a terminal
    files.write_atomic("/dev/null", "x", "report")  # a device is written, never replaced by a file
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        log = files.LineStream(fifo, "MLPerf log")
        log.write("a\n")
        log.close()
        assert os.read(reader, 100) == b"a\n" and stat.S_ISFIFO(os.stat(fifo).st_mode)
    finally:
        os.close(reader)
