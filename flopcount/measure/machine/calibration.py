"""A machine profile: the rates a step-time prediction divides by, measured once by ``flopcount calibrate``
(:mod:`flopcount.measure.machine.calibrate`) or, for a device that cannot be measured here, made from the sourced
peak table and published bandwidths (``calibrated: false``). This module only describes, reads and checks profiles;
it never measures.

A profile holds:

* ``compute``: per operator kind (``gemm``, ``conv``: FLOP/s at sizes; ``elementwise``, ``reduction``: bytes per
  second at sizes) a list of :class:`Point`, each with the median, best and slowest repeat;
* ``compute.elementwise_fresh`` (absent in a profile taken before it was measured): ``a + b`` as a step runs it
  (its inputs among 64 MiB of tensors, out of cache; a new output each call, kept), bytes per second at the
  elementwise sizes; from :func:`fresh_from` on, an operator in a step runs slower than the same call into a reused
  buffer on inputs in cache (``elementwise``);
* ``compute.copy`` (absent in a profile taken before it was measured): a strided copy's bytes per second
  (``torch.cat``) at the elementwise sizes: data moved by nodes without FLOPs; without it, the elementwise rate;
* ``compute.softmax``, ``compute.softmax_backward`` (absent in a profile taken before they were measured): FLOP/s
  of torch's softmax and its backward at the elementwise sizes, the count's FLOPs of the Softmax timed;
* ``compute.cross_entropy``, ``compute.cross_entropy_backward`` (absent in a profile taken before they were
  measured): FLOP/s of torch's cross-entropy loss (its log-softmax and the picked scores) and its backward (a
  gradient of zeros with a value a row, then the log-softmax's backward) at the elementwise sizes, the count's
  FLOPs of the SoftmaxCrossEntropyLoss timed;
* ``overhead``: the framework's seconds per operator in the forward and in the backward (a tiny op timed);
* ``optimizers`` (null in a profile taken before it was measured): per optimizer (``sgd``, ``momentum``, ``adam``,
  ``adamw``) the seconds its step costs per parameter tensor (``per_tensor_s``: a step over one-element tensors, a
  :class:`Point`) and per parameter element at tensor sizes (``per_element_s``: points, a step over one tensor of
  each size less its per-tensor cost), and whether torch ran its multi-tensor (``foreach``) implementation
  (:class:`OptimizerCost`);
* ``collectives``: per collective (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``,
  ``send_recv``) the timed points (message bytes → seconds) and their fit, latency + bus bytes / bus bandwidth,
  per size range (:class:`Segment`), where the bus bytes are the payload times nccl-tests' bus-bandwidth factor
  (:data:`BUS_FACTORS`);
* ``collectives_in_step`` (null in a profile taken before it was measured, and in a datasheet profile): the same
  collectives timed as a step runs them, one call after another, each after a burst of compute that evicts the
  caches (by the wall clock each figure the slowest rank's own over its calls, by the CPU seconds alone that of the
  slowest rank of each call; the larger of its wall-clock seconds and the CPU seconds of every thread of the
  process, the CPU seconds alone where the ranks' threads outnumber the cores), as points and their fit: what a
  prediction prices a step's collectives at where present. Each of its points also has the ``mean`` and the 90th
  percentile (``p90``) of its calls (absent in a profile taken before calibrate recorded them), fitted as the median
  is: a call's cost there is heavy-tailed, and a step's total sees the mean (:func:`tail_fits`);
* ``collectives_in_step_groups`` (null in a profile of fewer than 4 ranks, in one taken before it was measured,
  and in a datasheet profile): per group size g (a JSON key, the integer as text) smaller than the profile's
  ranks that divides them (``2`` of a 4-rank profile), the ``all_reduce``, ``all_gather`` and ``reduce_scatter``
  timed in a step as ``collectives_in_step`` are, over groups of g ranks (ranks 0 to g-1, g to 2g-1, ...) all
  running at the same time, as a plan's tensor- or data-parallel groups do: each collective's ``ranks`` is g.
  A message over a group of that size is priced from them (:func:`group_timing`);
* ``network`` (a datasheet profile's only; null otherwise, every rank on this machine): the devices a node holds
  and each one's network adapter bandwidth (:class:`Network`), which caps a collective whose group spans nodes;
* the versions, date, machine and rank count it was taken with, and whether it was measured (``calibrated``).

A damaged or foreign file is refused with one line (:class:`flopcount.errors.MeasurementError`, exit 12); a profile
taken on another machine, torch or rank count gives one warning line naming the difference (:func:`differences`).
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flopcount.errors import MeasurementError, UsageError

__all__ = ["BUS_FACTORS", "CALIBRATION_METHOD", "COLLECTIVES", "DEVICE_BANDWIDTHS", "FORMAT", "FORMAT_VERSION",
           "LATENCY_UNKNOWN", "METHOD_CHANGES", "MachineProfile", "Network", "OPTIMIZERS_TIMED", "OptimizerCost",
           "Point", "Segment", "TAIL", "above_ceiling", "bus_factor", "collective_seconds", "device_profile", "fresh_from", "differences",
           "fit_segments", "group_timing", "latency_known", "load_profile", "profile_from_dict", "rate_at", "tail_fits",
           "this_machine"]

FORMAT = "flopcount-machine-profile"
FORMAT_VERSION = 1
#: How ``flopcount calibrate`` times the machine, recorded in a calibrated profile's ``machine.method``: raised when a
#: figure under an unchanged key comes to be timed another way, so that a prediction from an older profile can say
#: so (the profile still reads: its figures are measurements, of something else). Absent (1): taken before
#: 2026-12-01. What each method changed from the one before: :data:`METHOD_CHANGES`.
CALIBRATION_METHOD = 3
#: Each method → what a profile of the method before it timed otherwise (a prediction's note names them).
METHOD_CHANGES = {
    2: "each collective in a step was timed after a barrier, which hides a late peer's wait, and the optimizer "
       "steps one after another, their state left in the cache",
    3: "its collectives were timed without 128 KiB, 512 KiB and 2 MiB messages and fitted in two size ranges "
       "(up to 64 KiB, and above), not three (up to 64 KiB, up to 1 MiB, and above)",
}
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
#: The optimizers whose step a calibration times (the names ``--optimizer`` takes).
OPTIMIZERS_TIMED = ("sgd", "momentum", "adam", "adamw")
#: nccl-tests' bus-bandwidth factors (its PERFORMANCE.md): bus bytes = factor × the payload (the whole tensor of an
#: all_reduce, the gathered output of an all_gather, the input of a reduce_scatter, the sent buffer of an
#: all_to_all, the message of a send/recv), so that the fitted bus bandwidth is comparable to a link's whatever n.
BUS_FACTORS = {"all_reduce": "2(n-1)/n", "all_gather": "(n-1)/n", "reduce_scatter": "(n-1)/n",
               "all_to_all": "(n-1)/n", "send_recv": "1"}
#: The statistics of a point's calls beyond its median, best and slowest, where timed (``collectives_in_step``):
#: their mean and 90th percentile.
TAIL = ("mean", "p90")
#: Bytes at which the collectives' fit changes range (a payload equal to one falls below it): latency-bound messages
#: up to 64 KiB, then the sizes a layer's activations and a small bucket have (up to 1 MiB: the calls wait on each
#: other most there, their latency and bandwidth both part of the time), then bandwidth-bound ones.
SPLIT_BYTES = (64 * 1024, 2**20)


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of ``kind`` over ``n`` ranks (:data:`BUS_FACTORS`)."""
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind == "send_recv":
        return 1.0
    return (n - 1) / n


@dataclass(frozen=True)
class Point:
    """One timed size: ``size`` (n of an n×n×n GEMM, N·C·H·W of a convolution's output, bytes of an elementwise op
    or a message) and the median, best and slowest of its repeats (a rate, or seconds for a message); ``mean`` and
    ``p90`` (the 90th percentile) where they were recorded (a collective in a step), else None."""

    size: float
    median: float
    best: float
    slowest: float
    mean: float | None = None
    p90: float | None = None

    def as_dict(self) -> dict[str, float]:
        return {"size": self.size, "median": self.median, "best": self.best, "slowest": self.slowest,
                **{k: getattr(self, k) for k in TAIL if getattr(self, k) is not None}}


@dataclass(frozen=True)
class Segment:
    """The fit of one size range of a collective: seconds = ``latency_s`` + bus bytes / ``bus_bytes_per_s``, for
    payloads from ``low`` to ``high`` bytes; one fit each for the median, best and slowest times (``which``), and
    for the mean and p90 where its points have them (:func:`tail_fits`). A
    latency of None is not known (a datasheet profile: no datasheet gives it): the time is then the bus term alone,
    a lower bound (:func:`latency_known`)."""

    low: float
    high: float
    latency_s: Mapping[str, float | None]
    bus_bytes_per_s: Mapping[str, float]

    def as_dict(self) -> dict[str, Any]:
        return {"from_bytes": self.low, "to_bytes": self.high, "latency_s": dict(self.latency_s),
                "bus_bytes_per_s": dict(self.bus_bytes_per_s)}


@dataclass(frozen=True)
class Collective:
    """A collective's timed points over ``ranks`` processes (0: a fit that holds for any group, from datasheets)
    and their fit by size range."""

    ranks: int
    points: tuple[Point, ...]
    segments: tuple[Segment, ...]

    def as_dict(self, kind: str) -> dict[str, Any]:
        return {"ranks": self.ranks, "bus_factor": BUS_FACTORS[kind], "points": [p.as_dict() for p in self.points],
                "fit": [s.as_dict() for s in self.segments]}


@dataclass(frozen=True)
class Network:
    """How a datasheet system joins its devices beyond one node: ``devices`` per node (joined by NVLink inside it),
    each with its own network adapter of ``bytes_per_s`` in one direction, as the system's datasheet gives them
    (``source``). A calibrated profile has none: its ranks share this machine."""

    devices: int
    bytes_per_s: float
    source: str

    def bus_cap(self, ranks: int, stride: int) -> float | None:
        """The most bus bandwidth a collective over ``ranks`` ranks ``stride`` apart (global rank ids r, r + stride,
        ...; the group of rank 0) reaches when they span several nodes: m x the adapter's bandwidth, m the fewest
        of its ranks on one of its nodes (a ring leaves each node through the adapters of its ranks there, one ring
        per adapter); None when the group lies in one node.

        >>> net = Network(8, 25e9, "")
        >>> net.bus_cap(8, 1), net.bus_cap(16, 1) / 1e9, net.bus_cap(32, 8) / 1e9, net.bus_cap(2, 64) / 1e9
        (None, 200.0, 25.0, 25.0)
        """
        return _bus_cap(self.devices, self.bytes_per_s, ranks, stride)

    def as_dict(self) -> dict[str, Any]:
        return {"devices_per_node": self.devices, "bytes_per_s": self.bytes_per_s, "source": self.source}


@functools.lru_cache(maxsize=4096)
def _bus_cap(devices: int, bytes_per_s: float, ranks: int, stride: int) -> float | None:
    per_node: dict[int, int] = {}
    for i in range(ranks):
        node = i * stride // devices
        per_node[node] = per_node.get(node, 0) + 1
    if len(per_node) <= 1:
        return None
    return min(per_node.values()) * bytes_per_s


@dataclass(frozen=True)
class OptimizerCost:
    """An optimizer's step as timed on the machine: seconds per parameter tensor (a :class:`Point`) and per
    parameter element at tensor sizes (points: ``size`` the elements of the tensor it was timed on), and whether
    torch ran its multi-tensor implementation (``foreach``) there."""

    per_tensor_s: Point
    per_element_s: tuple[Point, ...]
    foreach: bool

    def as_dict(self) -> dict[str, Any]:
        return {"per_tensor_s": self.per_tensor_s.as_dict(), "per_element_s": [p.as_dict() for p in self.per_element_s],
                "foreach": self.foreach}


@dataclass(frozen=True)
class MachineProfile:
    """A machine's rates (see the module). ``peak_flops_per_s``: what MFU divides by (a CPU's best measured GEMM
    rate; a GPU's datasheet peak of ``dtype``)."""

    calibrated: bool
    device: str
    ranks: int
    compute: Mapping[str, tuple[Point, ...]]
    overhead: Mapping[str, Point]
    collectives: Mapping[str, Collective]
    peak_flops_per_s: float
    dtype: str = "fp32"
    date: str = ""
    torch: str | None = None
    machine: Mapping[str, Any] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    load_per_core: float | None = None
    optimizers: Mapping[str, OptimizerCost] | None = None  # None: not measured (a profile taken before it was)
    collectives_in_step: Mapping[str, Collective] | None = None  # None: not measured (taken before it was)
    network: Network | None = None  # a datasheet system's nodes and adapters; None: every rank on one node
    #: group size → collectives timed in a step over groups of that size; None: not measured
    collectives_in_step_groups: Mapping[int, Mapping[str, Collective]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "version": FORMAT_VERSION, "calibrated": self.calibrated, "device": self.device,
                "dtype": self.dtype, "date": self.date, "torch": self.torch, "machine": dict(self.machine),
                "ranks": self.ranks, "load_per_core": self.load_per_core, "peak_flops_per_s": self.peak_flops_per_s,
                "compute": {k: [p.as_dict() for p in v] for k, v in self.compute.items()},
                "overhead": {k: p.as_dict() for k, p in self.overhead.items()},
                "collectives": {k: c.as_dict(k) for k, c in self.collectives.items()},
                "optimizers": None if self.optimizers is None else {k: o.as_dict() for k, o in self.optimizers.items()},
                "collectives_in_step": None if self.collectives_in_step is None
                else {k: c.as_dict(k) for k, c in self.collectives_in_step.items()},
                "network": None if self.network is None else self.network.as_dict(),
                "collectives_in_step_groups": None if self.collectives_in_step_groups is None
                else {str(g): {k: c.as_dict(k) for k, c in cs.items()}
                      for g, cs in sorted(self.collectives_in_step_groups.items())},
                "sources": list(self.sources)}


def rate_at(points: Sequence[Point], size: float, which: str = "median") -> tuple[float, bool]:
    """The rate of ``points`` at ``size`` (``which``: median, best or slowest), interpolated linearly in log(size)
    between the two calibrated sizes around it; outside them, the nearest one's, and True (extrapolated)."""
    pts = sorted(points, key=lambda p: p.size)
    if size <= pts[0].size or len(pts) == 1:
        return getattr(pts[0], which), size < pts[0].size * 0.999
    if size >= pts[-1].size:
        return getattr(pts[-1], which), size > pts[-1].size * 1.001
    for a, b in zip(pts, pts[1:]):
        if a.size <= size <= b.size:
            w = math.log(size / a.size) / math.log(b.size / a.size)
            return getattr(a, which) + w * (getattr(b, which) - getattr(a, which)), False
    raise AssertionError("unreachable: size inside the points")


def fresh_from(profile: "MachineProfile") -> float | None:
    """The bytes from which an elementwise operator writing a new output runs at the profile's fresh rate: the
    smallest calibrated size at which, and at every larger one, ``elementwise_fresh``'s median is below the slowest
    repeat of ``elementwise`` (into a reused buffer) at that size; None where the profile has no fresh timing or no
    such size (the fresh output then costs nothing more)."""
    fresh = sorted(profile.compute.get("elementwise_fresh", ()), key=lambda p: p.size)
    found = None
    for p in reversed(fresh):
        if p.median >= rate_at(profile.compute["elementwise"], p.size, "slowest")[0]:
            break
        found = p.size
    return found


def collective_seconds(c: Collective, kind: str, payload: float, n: int, which: str = "median",
                       bus_cap: float | None = None) -> tuple[float, bool]:
    """Seconds of one ``kind`` of ``payload`` bytes over ``n`` ranks: latency + bus_factor(n) × payload / bus
    bandwidth of the size range it falls in (at most ``bus_cap``: the network's, for a group across nodes), and
    whether it lies outside the calibrated sizes (the nearest range's fit then)."""
    if n <= 1 or payload <= 0:
        return 0.0, False
    seg = next((s for s in c.segments if s.low <= payload <= s.high), None)
    outside = seg is None
    if seg is None:
        seg = c.segments[0] if payload < c.segments[0].low else c.segments[-1]
    bus = seg.bus_bytes_per_s[which] if bus_cap is None else min(seg.bus_bytes_per_s[which], bus_cap)
    return (seg.latency_s[which] or 0.0) + bus_factor(kind, n) * payload / bus, outside


def group_timing(profile: "MachineProfile", kind: str, ranks: int) -> Collective | None:
    """The profile's ``kind`` timed in a step over groups of ``ranks`` ranks (``collectives_in_step_groups``),
    where it has it; else None."""
    return ((profile.collectives_in_step_groups or {}).get(ranks) or {}).get(kind)


def tail_fits(c: Collective) -> bool:
    """Whether every fit of ``c`` has the mean and the p90 of its calls (:data:`TAIL`): a collective timed in a
    step by a calibration that recorded them."""
    return all(w in s.latency_s and w in s.bus_bytes_per_s for s in c.segments for w in TAIL)


def latency_known(profile: "MachineProfile") -> bool:
    """Whether every collective fit of ``profile`` has a latency (a datasheet profile's is None: not known)."""
    return all(v is not None for c in profile.collectives.values() for s in c.segments for v in s.latency_s.values())


def _fit_line(xs: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
    """Least squares of t = a + x / bw in relative error (each point weighted by 1/t², so that a range's small
    messages count as much as its large ones: unweighted, the largest message's seconds decide the line, and a
    message a tenth its size is off by half), a ≥ 0 (refitted through the origin when the intercept comes out
    negative)."""
    ws = [1 / max(t, 1e-12) ** 2 for t in ts]
    sw = sum(ws)
    mx, mt = sum(w * x for w, x in zip(ws, xs)) / sw, sum(w * t for w, t in zip(ws, ts)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    slope = sum(w * (x - mx) * (t - mt) for w, x, t in zip(ws, xs, ts)) / sxx if sxx else 0.0
    a = mt - slope * mx
    if a < 0 or slope <= 0:
        a = max(0.0, min(ts) if slope <= 0 else 0.0)
        slope = sum(w * x * (t - a) for w, x, t in zip(ws, xs, ts)) / sum(w * x * x for w, x in zip(ws, xs))
    return a, 1 / slope if slope > 0 else math.inf


def fit_segments(kind: str, n: int, points: Sequence[Point]) -> tuple[Segment, ...]:
    """The fit of a collective's timed points (payload bytes → seconds) over ``n`` ranks: one segment for each size
    range that :data:`SPLIT_BYTES` bounds (each needs two points; a range with fewer joins the one below it, the
    lowest the one above), each a least-squares line (in relative error) latency + bus bytes / bus bandwidth for the
    median, best and slowest times, and for the mean and p90 where every point has them."""
    pts = sorted(points, key=lambda p: p.size)
    ranges = _size_ranges(pts)
    f = bus_factor(kind, n)
    whiches = ("median", "best", "slowest") + (TAIL if pts and all(p.mean is not None and p.p90 is not None
                                                                    for p in pts) else ())
    out = []
    for k, r in enumerate(ranges):
        lat, bw = {}, {}
        for which in whiches:
            lat[which], bw[which] = _fit_line([f * p.size for p in r], [getattr(p, which) for p in r])
        low = r[0].size if k == 0 else ranges[k - 1][-1].size
        out.append(Segment(low, r[-1].size, lat, bw))
    return tuple(out)


def _size_ranges(pts: Sequence[Point]) -> list[list[Point]]:
    """``pts`` (sorted by size) split at :data:`SPLIT_BYTES`, a range of fewer than two points joined to the one
    below it (the lowest to the one above).

    >>> [[p.size for p in r] for r in _size_ranges([Point(b, 1, 1, 1) for b in (64, 1024, 2**17, 2**19, 2**22)])]
    [[64, 1024], [131072, 524288, 4194304]]
    """
    ranges: list[list[Point]] = [[] for _ in range(len(SPLIT_BYTES) + 1)]
    for p in pts:
        ranges[bisect.bisect_left(SPLIT_BYTES, p.size)].append(p)
    ranges = [r for r in ranges if r]
    while len(ranges) > 1 and any(len(r) < 2 for r in ranges):
        k = next(k for k, r in enumerate(ranges) if len(r) < 2)
        into = k - 1 if k > 0 else 1
        ranges[min(k, into)] = ranges[min(k, into)] + ranges[max(k, into)]
        del ranges[max(k, into)]
    return ranges


# Published bandwidths of the devices a profile can be made for without measuring (per GPU): HBM from the product
# datasheets; the NVLink figure is the datasheet's total bandwidth per GPU (both directions), and a collective's
# bus bandwidth is taken as half of it (one direction), nccl-tests' busbw being per direction.
#: Beyond one node, the DGX system of each part: 8 GPUs a node, each with its own single-port network adapter
#: (``network``: its bandwidth in one direction, bytes/s), from the DGX datasheets.
_DGX_A100 = ("NVIDIA DGX A100 datasheet: 8 GPUs a node, 8 single-port ConnectX-6 adapters of 200 Gb/s HDR "
             "InfiniBand for compute (25 GB/s a GPU)")
_DGX_H100 = ("NVIDIA DGX H100/H200 datasheet: 8 GPUs a node, 8 single-port ConnectX-7 adapters of 400 Gb/s "
             "InfiniBand/Ethernet for compute (50 GB/s a GPU)")
_DGX_B200 = ("NVIDIA DGX B200 datasheet: 8 GPUs a node, 8 single-port ConnectX-7 adapters of 400 Gb/s "
             "InfiniBand/Ethernet for compute (50 GB/s a GPU)")
DEVICE_BANDWIDTHS: dict[str, dict[str, Any]] = {
    "H100 SXM": {"memory": 3.35e12, "nvlink": 900e9, "node": 8, "network": 50e9, "network_source": _DGX_H100,
                 "source": "NVIDIA H100 datasheet, SXM5: 3.35 TB/s HBM3, NVLink 900 GB/s"},
    "H200 SXM": {"memory": 4.8e12, "nvlink": 900e9, "node": 8, "network": 50e9, "network_source": _DGX_H100,
                 "source": "NVIDIA H200 datasheet, SXM: 4.8 TB/s HBM3e, NVLink 900 GB/s"},
    "A100 SXM": {"memory": 2.039e12, "nvlink": 600e9, "node": 8, "network": 25e9, "network_source": _DGX_A100,
                 "source": "NVIDIA A100 datasheet, 80GB SXM: 2,039 GB/s HBM2e, NVLink 600 GB/s"},
    "A100": {"memory": 2.039e12, "nvlink": 600e9, "node": 8, "network": 25e9, "network_source": _DGX_A100,
             "source": "NVIDIA A100 datasheet, 80GB SXM: 2,039 GB/s HBM2e, NVLink 600 GB/s"},
    "B200": {"memory": 8e12, "nvlink": 1.8e12, "node": 8, "network": 50e9, "network_source": _DGX_B200,
             "source": "NVIDIA HGX B200 datasheet, per GPU: 8 TB/s HBM3e, NVLink 1.8 TB/s"},
}
#: Why an uncalibrated profile's collective latency is null: no datasheet gives it, and a figure assumed in its place
#: would be a guess (the prediction then times each collective by its bytes alone and says so).
LATENCY_UNKNOWN = "collective latency not known (no datasheet gives it; calibrate on the machine to measure it)"


def device_profile(name: str, ranks: int = 8, dtype: str = "bf16") -> MachineProfile:
    """A ``calibrated: false`` profile of a device that cannot be measured here: its dense ``dtype`` peak from the
    sourced peak table (:mod:`flopcount.measure.machine.devices`) for every product, its datasheet HBM bandwidth for
    elementwise work and reductions, and half its NVLink bandwidth (one direction) as the bus bandwidth of every
    collective, its latency null (:data:`LATENCY_UNKNOWN`); no framework overhead. Beyond a node (8 GPUs, the
    part's DGX system) a collective's bus bandwidth is at most the network adapters' (:class:`Network`). Every
    figure is the best case: the prediction's interval has no high end, and it says the profile is from
    datasheets."""
    from .devices import gpu_entry

    entry = gpu_entry(name)
    known = ", ".join(sorted(DEVICE_BANDWIDTHS))
    if entry is None or entry.key not in DEVICE_BANDWIDTHS:
        raise UsageError(f"--device {name}: no published bandwidths recorded for it; give one of {known}, or "
                         "calibrate the machine (flopcount calibrate) and give --machine")
    if dtype not in entry.peaks:
        raise UsageError(f"--device {name}: the {entry.key} has no {dtype} peak in the table; give another dtype")
    bw = DEVICE_BANDWIDTHS[entry.key]
    peak = entry.peaks[dtype]

    def flat(v: float) -> tuple[Point, ...]:
        return (Point(1, v, v, v),)

    bus = bw["nvlink"] / 2
    seg = Segment(0, math.inf, {w: None for w in ("median", "best", "slowest")},
                  {w: bus for w in ("median", "best", "slowest")})
    zero = Point(1, 0.0, 0.0, 0.0)
    return MachineProfile(False, entry.key, ranks, {"gemm": flat(peak), "conv": flat(peak),
                                                    "elementwise": flat(bw["memory"]), "reduction": flat(bw["memory"])},
                          {"forward": zero, "backward": zero},
                          {k: Collective(0, (), (seg,)) for k in COLLECTIVES}, peak, dtype,
                          sources=(entry.source, bw["source"], bw["network_source"], LATENCY_UNKNOWN),
                          network=Network(bw["node"], bw["network"], bw["network_source"]))


def _need(doc: Mapping[str, Any], key: str, kind: type | tuple, where: str) -> Any:
    v = doc.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise MeasurementError(f"{where}: '{key}' is missing or not a {getattr(kind, '__name__', kind)}; take the "
                               "profile again with flopcount calibrate -o FILE")
    return v


def _point(d: Any, where: str) -> Point:
    if not isinstance(d, Mapping):
        raise MeasurementError(f"{where}: a point is not an object; take the profile again with flopcount calibrate")
    vals = [d.get(k) for k in ("size", "median", "best", "slowest")]
    if not all(_number(v) and v >= 0 for v in vals):
        raise MeasurementError(f"{where}: a point needs size, median, best and slowest as numbers >= 0; take the "
                               "profile again with flopcount calibrate")
    tail = [d.get(k) for k in TAIL]
    if not all(v is None or _number(v) and v >= 0 for v in tail):
        raise MeasurementError(f"{where}: a point's mean and p90 are numbers >= 0 where given; take the profile "
                               "again with flopcount calibrate")
    return Point(*map(float, vals), *(None if v is None else float(v) for v in tail))


def _number(v: Any) -> bool:
    """A finite number (not a bool): what every figure of a profile is."""
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _segment(d: Any, where: str) -> Segment:
    if not isinstance(d, Mapping):
        raise MeasurementError(f"{where}: a fit is not an object")
    try:
        lat = {w: d["latency_s"][w] for w in ("median", "best", "slowest")}
        bw = {w: d["bus_bytes_per_s"][w] for w in ("median", "best", "slowest")}
        low, high = d["from_bytes"], d["to_bytes"]
        if any(w in d["latency_s"] or w in d["bus_bytes_per_s"] for w in TAIL):  # recorded: both fits of both
            lat.update({w: d["latency_s"][w] for w in TAIL})
            bw.update({w: d["bus_bytes_per_s"][w] for w in TAIL})
    except (KeyError, TypeError):
        raise MeasurementError(f"{where}: a fit needs from_bytes, to_bytes, latency_s and bus_bytes_per_s (median, "
                               "best, slowest; mean and p90 both or neither); take the profile again with flopcount "
                               "calibrate") from None
    if not all(_number(v) and v > 0 for v in bw.values()) or \
            not all(v is None or _number(v) and v >= 0 for v in lat.values()):
        raise MeasurementError(f"{where}: a fit has a bandwidth that is not a number > 0 or a latency that is not a "
                               "number >= 0 (or null: not known); take the profile again")
    if not (_number(low) and low >= 0 and isinstance(high, (int, float)) and not isinstance(high, bool)
            and high >= low):
        raise MeasurementError(f"{where}: a fit's from_bytes and to_bytes are not sizes with from_bytes <= to_bytes; "
                               "take the profile again")
    return Segment(float(low), float(high), {w: None if v is None else float(v) for w, v in lat.items()},
                   {w: float(v) for w, v in bw.items()})


def profile_from_dict(doc: Any, where: str = "profile") -> MachineProfile:
    """A :class:`MachineProfile` from its JSON form, every field checked (a MeasurementError naming it)."""
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        raise MeasurementError(f"{where}: not a flopcount machine profile (no \"format\": \"{FORMAT}\"); make one "
                               "with flopcount calibrate -o FILE")
    if doc.get("version") != FORMAT_VERSION:
        raise MeasurementError(f"{where}: profile format version {doc.get('version')!r}, this flopcount reads "
                               f"{FORMAT_VERSION}; take the profile again with flopcount calibrate")
    compute = {}
    for kind, pts in _need(doc, "compute", Mapping, where).items():
        if not isinstance(pts, list) or not pts:
            raise MeasurementError(f"{where}: compute.{kind} has no points; take the profile again")
        compute[kind] = tuple(_point(p, f"{where}: compute.{kind}") for p in pts)
        if any(min(p.median, p.best, p.slowest) <= 0 for p in compute[kind]):
            raise MeasurementError(f"{where}: compute.{kind} has a rate of 0 (a rate is what work is divided by); "
                                   "take the profile again")
    for kind in ("gemm", "elementwise"):
        if kind not in compute:
            raise MeasurementError(f"{where}: compute.{kind} is missing; take the profile again with flopcount "
                                   "calibrate")
    overhead = {k: _point(_need(doc, "overhead", Mapping, where).get(k), f"{where}: overhead.{k}")
                for k in ("forward", "backward")}
    collectives = _collectives(_need(doc, "collectives", Mapping, where), where, "collectives")
    in_step = doc.get("collectives_in_step")
    if in_step is not None and not isinstance(in_step, Mapping):
        raise MeasurementError(f"{where}: 'collectives_in_step' is not an object (or null); take the profile again "
                               "with flopcount calibrate")
    peak = _need(doc, "peak_flops_per_s", (int, float), where)
    ranks = _need(doc, "ranks", int, where)
    if not _number(peak) or peak <= 0 or ranks < 1:
        raise MeasurementError(f"{where}: peak_flops_per_s and ranks must be finite numbers > 0; take the profile "
                               "again")
    _check_description(doc, where)
    network = _network(doc.get("network"), where)
    return MachineProfile(bool(_need(doc, "calibrated", bool, where)), str(doc.get("device", "")), ranks, compute,
                          overhead, collectives, float(peak), str(doc.get("dtype", "fp32")), str(doc.get("date", "")),
                          doc.get("torch"), dict(doc.get("machine") or {}), tuple(doc.get("sources") or ()),
                          doc.get("load_per_core"), _optimizers(doc.get("optimizers"), where),
                          None if in_step is None else _collectives(in_step, where, "collectives_in_step"),
                          network, _groups(doc.get("collectives_in_step_groups"), ranks, where))


def _groups(d: Any, ranks: int, where: str) -> dict[int, dict[str, Collective]] | None:
    """The ``collectives_in_step_groups`` field: None when absent or null (not measured), else each group size
    (an integer from 2 to below the profile's ``ranks`` that divides them) and its collectives, each over that
    many ranks, checked."""
    if d is None:
        return None
    if not isinstance(d, Mapping):
        raise MeasurementError(f"{where}: 'collectives_in_step_groups' is not an object (or null); take the profile "
                               "again with flopcount calibrate")
    out = {}
    for key, cs in d.items():
        g = int(key) if isinstance(key, str) and key.isdecimal() else 0
        if not 2 <= g < ranks or ranks % g or not isinstance(cs, Mapping):
            raise MeasurementError(f"{where}: collectives_in_step_groups.{key} is not a group size (an integer from 2 "
                                   f"to below the profile's {ranks} ranks that divides them) with its collectives; "
                                   "take the profile again with flopcount calibrate")
        out[g] = _collectives(cs, where, f"collectives_in_step_groups.{key}")
        if any(c.ranks != g for c in out[g].values()):
            raise MeasurementError(f"{where}: collectives_in_step_groups.{key} has a collective whose ranks is not "
                                   f"{g}; take the profile again with flopcount calibrate")
    return out


def _network(d: Any, where: str) -> Network | None:
    """The ``network`` field: None when absent or null (every rank on one node), else checked."""
    if d is None:
        return None
    ok = isinstance(d, Mapping) and isinstance(d.get("devices_per_node"), int) \
        and not isinstance(d.get("devices_per_node"), bool) and d["devices_per_node"] >= 1 \
        and _number(d.get("bytes_per_s")) and d["bytes_per_s"] > 0
    if not ok:
        raise MeasurementError(f"{where}: 'network' needs devices_per_node (an integer >= 1) and bytes_per_s (a "
                               "number > 0), or null; take the profile again")
    return Network(d["devices_per_node"], float(d["bytes_per_s"]), str(d.get("source", "")))


def _collectives(d: Mapping[str, Any], where: str, key: str) -> dict[str, Collective]:
    """The collectives of the field ``key``, each checked."""
    out = {}
    for kind, c in d.items():
        if kind not in COLLECTIVES or not isinstance(c, Mapping) or not isinstance(c.get("fit"), list) or not c["fit"]:
            raise MeasurementError(f"{where}: {key}.{kind} is not a known collective with a fit; take the "
                                   "profile again")
        if not isinstance(c.get("ranks", 0), int) or isinstance(c.get("ranks"), bool) or c.get("ranks", 0) < 0 \
                or not isinstance(c.get("points", []), list):
            raise MeasurementError(f"{where}: {key}.{kind} needs ranks (an integer >= 0) and points (a list); "
                                   "take the profile again")
        out[kind] = Collective(c.get("ranks", 0), tuple(_point(p, f"{where}: {key}.{kind}")
                                                        for p in c.get("points", [])),
                               tuple(_segment(s, f"{where}: {key}.{kind}") for s in c["fit"]))
    return out


def _optimizers(d: Any, where: str) -> dict[str, OptimizerCost] | None:
    """The ``optimizers`` field: None when absent or null (not measured), else each optimizer's costs checked."""
    if d is None:
        return None
    if not isinstance(d, Mapping):
        raise MeasurementError(f"{where}: 'optimizers' is not an object (or null); take the profile again with "
                               "flopcount calibrate")
    out = {}
    for name, o in d.items():
        if name not in OPTIMIZERS_TIMED or not isinstance(o, Mapping) or not isinstance(o.get("foreach"), bool):
            raise MeasurementError(f"{where}: optimizers.{name} is not one of {', '.join(OPTIMIZERS_TIMED)} with "
                                   "per_tensor_s, per_element_s and foreach (true or false); take the profile again")
        if not isinstance(o.get("per_element_s"), list) or not o["per_element_s"]:
            raise MeasurementError(f"{where}: optimizers.{name}.per_element_s has no points; take the profile again")
        tensor = _point(o.get("per_tensor_s"), f"{where}: optimizers.{name}.per_tensor_s")
        element = tuple(_point(p, f"{where}: optimizers.{name}.per_element_s") for p in o["per_element_s"])
        if min(min(p.median, p.best, p.slowest) for p in (tensor, *element)) <= 0:
            raise MeasurementError(f"{where}: optimizers.{name} has a time of 0 (a step over a tensor and over its "
                                   "elements takes time); take the profile again")
        out[name] = OptimizerCost(tensor, element, o["foreach"])
    return out


def _check_description(doc: Mapping[str, Any], where: str) -> None:
    """The profile's description fields: strings, a machine object, a list of sources, a load >= 0 or null."""
    load = doc.get("load_per_core")
    bad = [k for k in ("device", "dtype", "date") if not isinstance(doc.get(k, ""), str)]
    bad += [k for k in ("torch",) if not isinstance(doc.get(k), (str, type(None)))]
    bad += [] if isinstance(doc.get("machine") or {}, Mapping) else ["machine"]
    bad += [] if isinstance(doc.get("sources") or [], list) else ["sources"]
    bad += [] if load is None or _number(load) and load >= 0 else ["load_per_core"]
    if bad:
        raise MeasurementError(f"{where}: {', '.join(bad)} of the wrong type or value (device, dtype, date and torch "
                               "are strings, machine an object, sources a list, load_per_core a number >= 0 or null); "
                               "take the profile again with flopcount calibrate")


def load_profile(path: str) -> MachineProfile:
    """The profile in the JSON file ``path`` (a MeasurementError, exit 12, when unreadable, damaged or foreign)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise MeasurementError(f"--machine {path}: cannot read it ({e.strerror or e}); make one with flopcount "
                               "calibrate -o FILE") from None
    except ValueError as e:
        raise MeasurementError(f"--machine {path}: not JSON ({e}); the file is damaged, take the profile again "
                               "with flopcount calibrate -o FILE") from None
    return profile_from_dict(doc, f"--machine {path}")


def above_ceiling(measured: float, ceiling: float, what: str, retake: str = "flopcount calibrate",
                  unit: str = "FLOP/s") -> str | None:
    """One line when a ``measured`` rate (FLOP/s or bytes/s) is above the ``ceiling`` it is compared with: no work
    runs faster than the machine's ceiling, so the ceiling is stale (measured while the machine was busy, on fewer
    threads, or at smaller sizes than the work's) and is to be taken again with ``retake``; None when it is not
    above. ``what`` names the rate
    ("rank 0 ran", "node Conv_3 ran")."""
    if not (measured > ceiling > 0):
        return None
    return (f"{what} at {measured / 1e9:.4g} G{unit}, above the ceiling of {ceiling / 1e9:.4g} G{unit} it is "
            f"compared with: the ceiling is stale (measured while the machine was busy, on fewer threads or at smaller "
            f"sizes); take it again ({retake}) on a quiet machine")


def this_machine(threads: int | None = None, device: str = "cpu") -> dict[str, Any]:
    """What a calibrated profile is compared with (:func:`differences`): the ``device`` a run uses, this CPU and
    its cores, the torch version where torch is installed and, given, the run's ``threads`` per rank."""
    from .devices import cpu_cores, cpu_name

    here: dict[str, Any] = {"device": device, "cpu": cpu_name(), "cores": cpu_cores()}
    if threads is not None:
        here["threads_per_rank"] = threads
    try:
        import torch

        here["torch"] = torch.__version__
    except ImportError:
        pass
    return here


def differences(profile: MachineProfile, here: Mapping[str, Any], ranks: int) -> str | None:
    """One line naming how ``profile`` differs from this machine (``here``, :func:`this_machine`: ``device``,
    ``cpu``, ``cores``, ``threads_per_rank``, ``torch``) and the run's ``ranks``, or None. An uncalibrated profile
    describes another device by design: only its rank count."""
    diffs = []
    if profile.calibrated:
        if "device" in here and profile.device != here["device"]:
            diffs.append(f"device {profile.device!r} (here {here['device']!r})")
        for key in ("cpu", "cores", "threads_per_rank"):
            if key in here and profile.machine.get(key) != here[key]:
                diffs.append(f"{key} {profile.machine.get(key)!r} (here {here[key]!r})")
        if "torch" in here and profile.torch != here["torch"]:
            diffs.append(f"torch {profile.torch} (here {here['torch']})")
    if profile.ranks != ranks:
        diffs.append(f"{profile.ranks} ranks (this plan runs {ranks})")
    return None if not diffs else ("the machine profile was taken with " + ", ".join(diffs)
                                   + "; its rates may not hold here: calibrate again with flopcount calibrate "
                                   f"--ranks {ranks}")
