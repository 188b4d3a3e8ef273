"""Step timers: stamps around training steps, read back once per window.

A timer records a start and an end stamp for every step and hands the stamps back only when :meth:`collect` is
called, which the meter does once per report window. On the CPU the stamps are ``time.perf_counter`` readings; on
a CUDA device they are CUDA events recorded on the current stream, and :meth:`CudaEventTimer.collect` synchronises
**once** (on the last end event) for the whole window, never per step: CUDA work is asynchronous, and a per-step
synchronisation would stall the very pipeline being measured.

Both timers give stamps in seconds on their own time line; only differences between stamps of one timer mean
anything.
"""

from __future__ import annotations

import time
from typing import Callable, Protocol


class StepTimer(Protocol):
    kind: str

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def collect(self) -> list[tuple[float, float]]:
        """(start, end) stamps in seconds of every step since the last collect, in order."""
        ...


class HostTimer:
    """Stamps from a host clock (``time.perf_counter`` unless another zero-argument clock is injected, as tests
    do to check the arithmetic exactly)."""

    kind = "host"

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._starts: list[float] = []
        self._ends: list[float] = []

    def start(self) -> None:
        self._starts.append(self._clock())

    def stop(self) -> None:
        self._ends.append(self._clock())

    def collect(self) -> list[tuple[float, float]]:
        out = list(zip(self._starts, self._ends))
        self._starts.clear()
        self._ends.clear()
        return out


class CudaEventTimer:
    """Stamps from CUDA events recorded on the current stream of ``device``.

    Events are taken from a pool and returned to it after each collect, so a long run allocates a window's worth.
    Stamps are milliseconds since a reference event recorded at the first step, converted to seconds.
    """

    kind = "cuda-events"

    def __init__(self, device=None) -> None:
        import torch

        self._torch = torch
        self._device = device
        self._pool: list = []
        self._pending: list = []  # [start, end, start, end, ...]
        self._ref = None

    def _event(self):
        if self._pool:
            return self._pool.pop()
        return self._torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        ev = self._event()
        ev.record()
        if self._ref is None:
            self._ref = ev
        self._pending.append(ev)

    def stop(self) -> None:
        ev = self._event()
        ev.record()
        self._pending.append(ev)

    def collect(self) -> list[tuple[float, float]]:
        if not self._pending:
            return []
        self._pending[-1].synchronize()  # the one synchronisation of the window
        ref = self._ref
        stamps = [ref.elapsed_time(ev) / 1e3 for ev in self._pending]
        out = list(zip(stamps[0::2], stamps[1::2]))
        self._pool.extend(ev for ev in self._pending if ev is not ref)
        self._pending.clear()
        return out


def make_timer(device_kind: str, device=None, clock: Callable[[], float] | None = None) -> StepTimer:
    """The timer for a device kind: CUDA events on ``"cuda"``, the host clock elsewhere (or an injected clock)."""
    if clock is not None:
        return HostTimer(clock)
    if device_kind == "cuda":
        return CudaEventTimer(device)
    return HostTimer()
