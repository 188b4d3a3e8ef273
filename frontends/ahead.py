"""An export made ahead in a forked child, while this process exports and counts something else.

A configuration whose layers repeat is counted from two small models, of ``first + 1`` and ``first + 2`` blocks
(:mod:`flopcount.frontends.repeated`). Their two exports are independent and each takes seconds (torch.export with a
symbolic batch: most of the time of a large model's count), so where the machine has a second core the second one
runs in a forked child while this process exports and counts the first: a count of DeepSeek-V3's stack (4 and 5
layers) then waits for the longer export instead of both.

How it fits: :func:`exporting` forks the child, which runs the second count only as far as its export
(:func:`produced` raises :class:`_Made` there), writes the weightless ``ModelProto`` to a temporary file and exits.
When this process reaches the same export (the same module object, inputs, training mode and opset: the
:func:`produced` key), it takes the child's model instead of exporting. Where the key differs, a cache entry served
the export, or the child failed, died or ran past its time, the export is made here as it always was: the child
changes how soon a figure comes, never what it is.

The child is forked only where :func:`flopcount.pipeline.shapes.guarded.fork_safe` allows it (Linux, one Python
thread, no CUDA context, FLOPCOUNT_PARALLEL not 0) and the process may run on two cores or more. It runs torch with
one intra-op thread, logs nothing, and always leaves through ``os._exit``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import onnx

log = logging.getLogger(__name__)

__all__ = ["exporting", "produced"]

#: Seconds the child may take beyond three times the export this process made meanwhile (a hung child is killed and
#: the export made here).
GRACE_S = 60.0

#: The metadata entry that carries a child's export key back.
_KEY = "flopcount.ahead.key"
#: In this process: module id → the pending child's result. In a child: the key it exports, and where its model goes.
_PENDING: dict[int, _Child] = {}
_CHILD: dict[str, Any] = {}


class _Made(BaseException):
    """Raised in the child once its export is made, to skip the rest of the count (not an Exception, so that no
    ``except Exception`` on the way catches it)."""


class _Child:
    """A forked child's export: its pid, the file it writes and when it started."""

    def __init__(self, pid: int, path: str) -> None:
        self.pid, self.path, self.started, self.status = pid, path, time.perf_counter(), None

    def wait(self, limit: float) -> onnx.ModelProto | None:
        """The child's model, or None where it failed or was not done within ``limit`` seconds (it is then killed)."""
        deadline = time.perf_counter() + limit
        while self.status is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.status = status
                break
            if time.perf_counter() > deadline:
                log.info("the export made ahead took over %.0f s: made here instead", limit)
                self.stop()
                return None
            time.sleep(0.02)
        if not os.WIFEXITED(self.status) or os.WEXITSTATUS(self.status) != 0:
            return None
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            return onnx.load_from_string(data) if data else None
        except Exception:  # noqa: BLE001 - a file cut short or not a model: this process exports instead
            return None

    def stop(self) -> None:
        """Kill the child if it still runs, reap it, and remove its file."""
        if self.status is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, 9)
            with contextlib.suppress(OSError):
                self.status = os.waitpid(self.pid, 0)[1]
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@contextlib.contextmanager
def exporting(module: Any, run: Callable[[], Any]) -> Iterator[None]:
    """Meanwhile, the first export of ``module`` that ``run()`` (its count) makes is being made in a forked child,
    where that is safe and a second core is there; a no-op otherwise. The child is stopped and its file removed
    when the block ends, used or not."""
    from flopcount.pipeline.shapes.guarded import fork_safe

    if _CHILD or _cores() < 2 or not fork_safe():
        yield
        return
    fd, path = tempfile.mkstemp(prefix="flopcount-ahead-", suffix=".onnx")
    os.close(fd)
    try:
        pid = os.fork()
    except OSError:
        os.unlink(path)
        yield
        return
    if pid == 0:  # the child: export, write, leave
        code = 1
        try:
            logging.disable(logging.CRITICAL)
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
            _CHILD.update(module=id(module), path=path)
            run()
        except _Made:
            code = 0
        except BaseException:  # noqa: BLE001 - any failure: this process makes the export itself
            code = 1
        finally:
            os._exit(code)
    child = _PENDING[id(module)] = _Child(pid, path)
    try:
        yield
    finally:
        _PENDING.pop(id(module), None)
        child.stop()


def produced(key: tuple, produce: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
    """``produce()``, the export whose identity is ``key`` (the module's ``id`` first, then whatever else tells its
    exports apart), unless a child of :func:`exporting` made it ahead; in that child, the export made and handed
    back with its key."""
    if _CHILD:
        if key[0] != _CHILD["module"]:
            return produce()
        model = produce()
        model.metadata_props.add(key=_KEY, value=repr(key))
        tmp = _CHILD["path"] + ".part"
        with open(tmp, "wb") as f:
            f.write(model.SerializeToString())
        os.replace(tmp, _CHILD["path"])
        raise _Made
    child = _PENDING.pop(key[0], None)
    if child is None:
        return produce()
    waited = time.perf_counter()
    model = child.wait(GRACE_S + 3 * (waited - child.started))
    made_for = None
    if model is not None:  # the key rides in the model's metadata, taken off again
        props = list(model.metadata_props)
        made_for = next((p.value for p in props if p.key == _KEY), None)
        del model.metadata_props[:]
        model.metadata_props.extend(p for p in props if p.key != _KEY)
    if made_for != repr(key):
        log.info("the export made ahead failed: made here instead")
        return produce()
    log.info("the export made ahead in a child process came %.1f s after it was asked for",
             time.perf_counter() - waited)
    return model
