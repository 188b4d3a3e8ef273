"""Every file flopcount writes, written whole or not at all.

A report, a plot, an HTML page, a cached ceiling or export, an MLPerf log: each is written to a temporary file in
the target's own folder, flushed to the disk (``fsync``) and renamed over the target (``os.replace``, atomic on
one file system). On any failure (a full disk, a read-only folder, a missing folder) the temporary file is removed,
the earlier file at the target is left whole, and the error is an :class:`~flopcount.errors.OutputError` (exit 8)
naming the path. A command checks its output paths with :func:`check_writable` before any work starts.

* :func:`write_atomic` text or bytes to a path
* :func:`atomic_path` a temporary path for a writer that needs one (matplotlib, ``onnx.save_model``)
* :class:`LineStream` a log written line by line (each line flushed), renamed over the target when it closes
* :func:`check_writable` a path's folder exists and takes a new file, tried for real

>>> import os, tempfile
>>> folder = tempfile.mkdtemp()
>>> target = os.path.join(folder, "r.json")
>>> write_atomic(target, '{"a": 1}\\n', "report")
>>> open(target).read(), sorted(os.listdir(folder))
('{"a": 1}\\n', ['r.json'])
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from typing import IO, Iterator

from flopcount.errors import OutputError

__all__ = ["LineStream", "atomic_path", "check_writable", "write_atomic"]


def _new_file_mode() -> int:
    """The mode ``open(path, "w")`` would give a new file: 0o666 less the process's umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _refused(path: str | os.PathLike, what: str, e: OSError | str) -> OutputError:
    reason = e if isinstance(e, str) else (e.strerror or type(e).__name__)
    return OutputError(f"{os.fspath(path)}: cannot write the {what} ({reason}); the earlier file there, if any, is "
                       "unchanged")


def _temporary(path: str) -> tuple[int, str]:
    folder, name = os.path.split(os.path.abspath(path))
    suffix = os.path.splitext(name)[1]
    return tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=f".part{suffix}")


def _sync_folder(path: str) -> None:
    """Make the rename itself durable where the platform allows (a folder cannot be opened on Windows)."""
    with contextlib.suppress(OSError):
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _commit(tmp: str, path: str) -> None:
    """fsync ``tmp``, give it the mode the target has (or a new file would have), and rename it over ``path``."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = _new_file_mode()
    fd = os.open(tmp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    _sync_folder(path)


def _special(path: str) -> bool:
    """Whether ``path`` exists and is no regular file (``/dev/stdout``, ``/dev/null``, a named pipe): it is
    written in place, as renaming a file over it would replace the device or pipe itself."""
    try:
        return not stat.S_ISREG(os.stat(path).st_mode) and not stat.S_ISDIR(os.stat(path).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, what: str) -> Iterator[str]:
    """A temporary path beside ``path`` (ending in the same suffix) for a writer that takes a path; when the block
    ends without an exception it is fsynced and renamed over ``path`` (over the file a symbolic link points to,
    which keeps the link; a device or pipe such as ``/dev/stdout`` is written in place). Any ``OSError`` of the
    block or the rename is an :class:`OutputError` naming ``path`` and ``what`` it holds; the temporary file never
    stays behind."""
    shown = os.fspath(path)
    if _special(shown):  # (os.stat follows the links: /dev/stdout -> /proc/self/fd/1 -> a pipe)
        try:
            yield shown
        except OSError as e:
            raise _refused(shown, what, e) from None
        return
    path = os.path.realpath(shown)
    if os.path.isdir(path):
        raise _refused(shown, what, "it is a folder")
    try:
        fd, tmp = _temporary(path)
    except OSError as e:
        raise _refused(shown, what, e) from None
    os.close(fd)
    try:
        yield tmp
        _commit(tmp, path)
    except OSError as e:
        raise _refused(shown, what, e) from None
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # gone already after a successful rename


def write_atomic(path: str | os.PathLike, data: str | bytes, what: str = "report") -> None:
    """Write ``data`` (text as UTF-8) to ``path`` whole, or raise an :class:`OutputError` leaving the earlier file
    at ``path`` as it was."""
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    with atomic_path(path, what) as tmp:
        with open(tmp, "wb") as f:
            f.write(raw)


def check_writable(path: str | os.PathLike, what: str, option: str | None = None) -> None:
    """Refuse, before any work, an output path that cannot be written: its folder is missing, it is a folder, or
    a file cannot be created in its folder (read-only file system, permissions, no inode left; a disk that is
    full only later is :func:`write_atomic`'s to report). The check creates
    and removes a real temporary file there, so what it says holds for the superuser and read-only mounts alike.
    ``option`` (``-o``, ``--plot`` ...) is named in the message."""
    path = os.fspath(path)
    label = f"{what} ({option})" if option else what
    if _special(path):
        if not os.access(path, os.W_OK):
            raise OutputError(f"{path}: cannot write the {label}: not writable; give another path")
        return
    folder = os.path.dirname(os.path.realpath(path))
    if not os.path.isdir(folder):
        raise OutputError(f"{path}: cannot write the {label}: no folder {folder}; create it or give another path")
    if os.path.isdir(path):
        raise OutputError(f"{path}: cannot write the {label}: it is a folder; give a file name")
    try:
        fd, tmp = _temporary(path)
    except OSError as e:
        raise OutputError(f"{path}: cannot write the {label} ({e.strerror or type(e).__name__}); give a path in a "
                          "writable folder") from None
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


class LineStream:
    """A log written as it happens: each :meth:`write` is flushed to a temporary file beside ``path`` at once, and
    :meth:`close` fsyncs it and renames it over ``path`` (the earlier log stays whole until then).

    The first failing write (a full disk) removes the temporary file and is remembered, not raised: the run that
    writes the log goes on, later writes are dropped, and :meth:`close` raises the :class:`OutputError` naming
    ``path``, so that the caller can first write its other files. :attr:`failed` is that error, or None."""

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        self.path = os.fspath(path)
        self.what = what
        self.failed: OutputError | None = None
        self._closed = False
        self._target = self.path if _special(self.path) else os.path.realpath(self.path)
        if os.path.isdir(self._target):
            raise _refused(self.path, what, "it is a folder")
        self._tmp: str | None = None
        try:
            if _special(self._target):  # a pipe or a device is written in place
                self._f: IO[str] = open(self._target, "w", encoding="utf-8")
                return
            fd, self._tmp = _temporary(self._target)
        except OSError as e:
            raise _refused(self.path, what, e) from None
        self._f = os.fdopen(fd, "w", encoding="utf-8")

    def write(self, line: str) -> None:
        if self.failed is not None or self._closed:
            return
        try:
            self._f.write(line)
            self._f.flush()
        except OSError as e:
            self._fail(e)

    def _fail(self, e: OSError) -> None:
        self.failed = _refused(self.path, self.what, e)
        with contextlib.suppress(OSError):
            self._f.close()
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)

    def close(self) -> None:
        """Put the log in place (or raise the error of the write that failed); a second call does nothing."""
        if self._closed:
            return
        self._closed = True
        if self.failed is None:
            try:
                self._f.close()
                if self._tmp is not None:
                    _commit(self._tmp, self._target)
            except OSError as e:
                self._fail(e)
        if self.failed is not None:
            raise self.failed
