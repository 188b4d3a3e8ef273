"""Measured ceilings of this machine, timed through torch: GEMM and convolution throughput per dtype, memory
bandwidth (a large copy) and, under torch.distributed with several ranks, all-reduce bus bandwidth.

:func:`measure_ceilings` gathers them in one :class:`Ceilings` record (``flopcount ceilings -o c.json`` writes it
with the device description); ``flopcount profile`` and ``flopcount roofline`` read it back with
:func:`load_ceilings`. Every figure is a median of repeats after warm-up, at the size (of those tried) that reached
the most; a figure that cannot be measured here is absent with its reason under ``unavailable``.

The harness takes the CPU's "peak" from :func:`measured_cpu_device`, which passes the :func:`cached_gemm` ceiling
into the device description (a measured ceiling, never a datasheet guess); the
calibration is short (about a second) and cached per machine, keyed by the CPU model, the cores this process may
use, torch's thread count and version, under the cache folder of the frontends (``$FLOPCOUNT_CACHE``, ``0`` to
disable, else ``~/.cache/flopcount``).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from flopcount.errors import import_framework

from . import devices
from .devices import Device

log = logging.getLogger(__name__)

#: torch dtype names of the dtypes a GEMM ceiling can be measured for on a CPU.
CPU_GEMM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp64": "float64"}
#: and on a CUDA device (tf32 is float32 with TF32 tensor-core math allowed).
CUDA_GEMM_DTYPES = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64"}
_CACHE_FORMAT = 2  # 2: a GEMM ceiling is the best repeat, with its spread
CEILINGS_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class GemmCeiling:
    """The best sustained FLOP/s of square ``n×n @ n×n`` products: the maximum over repeats at the size (of those
    long enough to time, :data:`MIN_PRODUCT_S`) that reached the most, with the spread of its repeats."""

    device: str
    dtype: str
    flops_per_s: float  # the maximum over repeats: the best rate sustained for a whole product
    n: int  # the size that reached it
    repeats: int
    threads: int
    torch_version: str  # the version of the framework that ran the products (``framework``)
    load_per_core: float | None = None  # the 1-minute load average per core when it was measured (Unix)
    median_flops_per_s: float | None = None  # the spread of the repeats at that size: median and minimum
    min_flops_per_s: float | None = None
    framework: str = "torch"  # or "tensorflow": the framework whose matmul was timed

    def describe(self) -> str:
        spread = ("" if self.median_flops_per_s is None else
                  f", median {self.median_flops_per_s / 1e9:.1f} and slowest {self.min_flops_per_s / 1e9:.1f} "
                  "GFLOP/s")
        return (f"measured GEMM ceiling of this {self.device} ({self.dtype}, {self.n}x{self.n}x{self.n}, best of "
                f"{self.repeats} after warm-up{spread}, {threads_text(self.threads)}, {self.framework} "
                f"{self.torch_version})")


#: A GEMM timed for a ceiling lasts at least this long (seconds): shorter products are dominated by the timer and
#: the threads' start, and their best repeat says little about a sustained rate.
MIN_PRODUCT_S = 0.01


def threads_text(n: int) -> str:
    """A thread count in words: 1 thread, 2 threads."""
    return f"{n} thread{'' if n == 1 else 's'}"


def measure_gemm(device: str = "cpu", dtype: str = "fp32", sizes: tuple[int, ...] = (512, 1024, 2048),
                 repeats: int = 7, budget_s: float = 3.0) -> GemmCeiling:
    """Time square GEMMs of each size (warm-up, then ``repeats``), stopping a size early once ``budget_s`` is spent,
    and return the best sustained rate: the maximum over repeats (2·n³ FLOPs a product) at the size that reached
    the most among those whose median product lasts :data:`MIN_PRODUCT_S` or more (else the largest tried), with
    the median and slowest repeat of that size as its spread. A busy machine can only slow a repeat down, so the
    best repeat is the closest to what the hardware sustains."""
    import torch

    tdtype = _torch_dtype(device, dtype)
    timed: list[tuple[int, list[float]]] = []
    start = time.perf_counter()
    with _math_mode(device, dtype):
        for n in sizes:
            a = torch.randn(n, n, dtype=torch.float32, device=device).to(tdtype)
            b = torch.randn(n, n, dtype=torch.float32, device=device).to(tdtype)
            out = torch.empty(n, n, dtype=tdtype, device=device)
            times = repeat_times(lambda: torch.mm(a, b, out=out), device, repeats, start, budget_s)
            timed.append((n, times))
            if time.perf_counter() - start > budget_s:
                break
    n, times = best_sustained(timed)
    flops = 2 * n ** 3
    return GemmCeiling(device, dtype, flops / min(times), n, len(times), torch.get_num_threads(), torch.__version__,
                       load_per_core(), flops / statistics.median(times), flops / max(times))


def best_sustained(timed: list[tuple[int, list[float]]]) -> tuple[int, list[float]]:
    """Of (n, seconds of each repeat) per GEMM size, the size whose best repeat reached the most among those whose
    median product lasts :data:`MIN_PRODUCT_S` or more (else the largest tried)."""
    long_enough = [(n, t) for n, t in timed if statistics.median(t) >= MIN_PRODUCT_S] or [timed[-1]]
    return max(long_enough, key=lambda nt: 2 * nt[0] ** 3 / min(nt[1]))


#: torch dtype names' TensorFlow counterparts, for the ceiling of a Keras run.
TF_GEMM_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp64": "float64"}


def tf_threads() -> int:
    """The intra-op threads TensorFlow runs a product on: its setting, or (0, TensorFlow's default) every core."""
    import tensorflow as tf

    from .devices import cpu_cores

    return tf.config.threading.get_intra_op_parallelism_threads() or cpu_cores()


def measure_tf_gemm(dtype: str = "fp32", sizes: tuple[int, ...] = (512, 1024, 2048), repeats: int = 7,
                    budget_s: float = 3.0) -> GemmCeiling:
    """The best sustained CPU rate of TensorFlow's own matmul (``tf.linalg.matmul``, eager, on the threads
    TensorFlow uses), as :func:`measure_gemm` forms it: the ceiling a Keras run's MFU divides by."""
    import tensorflow as tf

    tdtype = getattr(tf, TF_GEMM_DTYPES[dtype])
    timed: list[tuple[int, list[float]]] = []
    start = time.perf_counter()
    with tf.device("/CPU:0"):
        for n in sizes:
            a = tf.cast(tf.random.normal((n, n)), tdtype)
            b = tf.cast(tf.random.normal((n, n)), tdtype)
            timed.append((n, repeat_times(lambda: tf.linalg.matmul(a, b), "cpu", repeats, start, budget_s)))
            if time.perf_counter() - start > budget_s:
                break
    n, times = best_sustained(timed)
    flops = 2 * n ** 3
    return GemmCeiling("cpu", dtype, flops / min(times), n, len(times), tf_threads(), tf.__version__,
                       load_per_core(), flops / statistics.median(times), flops / max(times), "tensorflow")


def cached_tf_gemm(dtype: str = "fp32") -> GemmCeiling | None:
    """TensorFlow's GEMM ceiling of ``dtype`` on this machine at its thread count, from the cache (kept until
    beaten, as :func:`cached_gemm`) or measured now; None without TensorFlow."""
    try:
        tf = import_framework("tensorflow")
    except ModuleNotFoundError:
        return None
    from flopcount.frontends.common import cache_key, default_cache_dir

    from .devices import cpu_cores, cpu_name

    folder = default_cache_dir()
    path = None if folder is None else folder / ("ceiling-gemm-tf-" + cache_key(
        [_CACHE_FORMAT, "gemm-tf", dtype, cpu_name(), cpu_cores(), tf_threads(), tf.__version__])[:20] + ".json")
    return _cached(path, GemmCeiling, lambda: measure_tf_gemm(dtype), f"TensorFlow {dtype} GEMM ceiling")


def measure_ort_gemm(dtype: str = "fp32", threads: int | None = None, sizes: tuple[int, ...] = (512, 1024, 2048),
                     repeats: int = 7, budget_s: float = 3.0) -> GemmCeiling:
    """The best sustained CPU rate of onnxruntime's own MatMul (one ONNX MatMul of two n×n inputs, run by its CPU
    provider on ``threads`` intra-op threads, its default when None), formed as :func:`measure_gemm` forms torch's:
    the ceiling an onnxruntime profile is judged against (onnxruntime's kernels and torch's differ in speed on the
    same core)."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    if dtype != "fp32":
        raise RuntimeError(f"onnxruntime's CPU GEMM ceiling is measured in fp32 only, not {dtype}")
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
    options.log_severity_level = 3
    timed: list[tuple[int, list[float]]] = []
    start = time.perf_counter()
    for n in sizes:
        graph = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["c"])], "gemm",
                                  [helper.make_tensor_value_info(x, TensorProto.FLOAT, [n, n]) for x in "ab"],
                                  [helper.make_tensor_value_info("c", TensorProto.FLOAT, [n, n])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = min(model.ir_version, 8)
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {x: rng.standard_normal((n, n), dtype=np.float32) for x in "ab"}
        timed.append((n, repeat_times(lambda: session.run(None, feeds), "cpu", repeats, start, budget_s)))
        if time.perf_counter() - start > budget_s:
            break
    n, times = best_sustained(timed)
    flops = 2 * n ** 3
    from .devices import cpu_cores

    return GemmCeiling("cpu", dtype, flops / min(times), n, len(times), threads or cpu_cores(), ort.__version__,
                       load_per_core(), flops / statistics.median(times), flops / max(times), "onnxruntime")


def cached_ort_gemm(threads: int | None = None) -> GemmCeiling | None:
    """onnxruntime's fp32 GEMM ceiling on ``threads`` threads, from the cache (kept until beaten, as
    :func:`cached_gemm`) or measured now; None without onnxruntime."""
    try:
        ort = import_framework("onnxruntime")
    except ModuleNotFoundError:
        return None
    from flopcount.frontends.common import cache_key, default_cache_dir

    from .devices import cpu_cores, cpu_name

    folder = default_cache_dir()
    path = None if folder is None else folder / ("ceiling-gemm-ort-" + cache_key(
        [_CACHE_FORMAT, "gemm-ort", cpu_name(), cpu_cores(), threads or 0, ort.__version__])[:20] + ".json")
    return _cached(path, GemmCeiling, lambda: measure_ort_gemm("fp32", threads), "onnxruntime fp32 GEMM ceiling")


def measured_tf_cpu_device(dtypes: tuple[str, ...] = ("fp32",)) -> Device:
    """This CPU described with TensorFlow's measured GEMM ceiling per dtype (for a Keras run's MFU)."""
    peaks = {}
    for dtype in dtypes:
        gemm = cached_tf_gemm(dtype)
        if gemm is not None:
            peaks[dtype] = devices.Peak(gemm.flops_per_s, gemm.describe(), gemm.load_per_core)
    return devices.cpu_device(peaks)


def _torch_dtype(device: str, dtype: str):
    import torch

    from flopcount.errors import UsageError

    table = CPU_GEMM_DTYPES if device == "cpu" else CUDA_GEMM_DTYPES
    if dtype not in table:
        raise UsageError(f"dtype {dtype!r}: on {device} the ceilings are measured for {', '.join(table)}")
    return getattr(torch, table[dtype])


class _math_mode:
    """On CUDA, fp32 runs in true fp32 and tf32 with TF32 tensor-core math (matmul and cuDNN), restored on exit."""

    def __init__(self, device: str, dtype: str):
        self.active = device.startswith("cuda") and dtype in ("fp32", "tf32")
        self.tf32 = dtype == "tf32"

    def __enter__(self):
        if self.active:
            import torch

            self.saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = self.tf32
        return self

    def __exit__(self, *exc):
        if self.active:
            import torch

            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = self.saved
        return False


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def _median_time(fn, device: str, repeats: int, start: float, budget_s: float, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` over the repeats of :func:`repeat_times`."""
    return statistics.median(repeat_times(fn, device, repeats, start, budget_s, warmup))


def repeat_times(fn, device: str, repeats: int, start: float, budget_s: float, warmup: int = 2) -> list[float]:
    """Seconds of each of ``repeats`` calls of ``fn()`` after ``warmup`` calls (at least 3 repeats once
    ``budget_s`` since ``start`` is spent). On CUDA each call is synchronized: the sizes here take milliseconds,
    so one synchronization per call costs well under 1% of it."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s and len(times) >= 3:
            break
    return times


@dataclass(frozen=True)
class ConvCeiling:
    """The best median FLOP/s of a 3×3, stride-1, same-padded convolution ``N×C×H×W → N×C×H×W`` over the shapes
    tried (2·N·C·H·W·C·9 FLOPs each: a ResNet bottleneck's middle convolution)."""

    device: str
    dtype: str
    flops_per_s: float
    shape: tuple[int, int, int, int]  # N, C, H, W that reached it
    repeats: int
    channels_last: bool
    threads: int | None = None  # torch's intra-op threads (a CPU measurement)

    def describe(self) -> str:
        n, c, h, w = self.shape
        threads = "" if self.threads is None else f", {threads_text(self.threads)}"
        return (f"measured 3x3 convolution ceiling of this {self.device} ({self.dtype}, {n}x{c}x{h}x{w}, "
                f"{'channels-last' if self.channels_last else 'NCHW'}, median of {self.repeats} after warm-up"
                f"{threads})")


def measure_conv(device: str = "cpu", dtype: str = "fp32",
                 shapes: tuple[tuple[int, int, int, int], ...] | None = None,
                 repeats: int = 5, budget_s: float = 3.0) -> ConvCeiling:
    """Time 3×3 convolutions of each ``(N, C, H, W)`` (C in = C out) and return the fastest median FLOP/s."""
    import torch
    import torch.nn.functional as F

    cuda = device.startswith("cuda")
    if shapes is None:
        shapes = ((64, 256, 28, 28), (128, 256, 14, 14)) if cuda else ((8, 128, 28, 28), (16, 256, 14, 14))
    tdtype = _torch_dtype(device, dtype)
    best: tuple[float, tuple[int, int, int, int]] | None = None
    start = time.perf_counter()
    with _math_mode(device, dtype), torch.no_grad():
        for shape in shapes:
            n, c, h, w = shape
            x = torch.randn(n, c, h, w, device=device).to(tdtype)
            k = torch.randn(c, c, 3, 3, device=device).to(tdtype)
            if cuda:
                x, k = x.to(memory_format=torch.channels_last), k.to(memory_format=torch.channels_last)
            median = _median_time(lambda: F.conv2d(x, k, padding=1), device, repeats, start, budget_s)
            rate = 2 * n * c * h * w * c * 9 / median
            if best is None or rate > best[0]:
                best = (rate, shape)
            if time.perf_counter() - start > budget_s:
                break
    assert best is not None
    return ConvCeiling(device, dtype, best[0], best[1], repeats, cuda, None if cuda else torch.get_num_threads())


@dataclass(frozen=True)
class BandwidthCeiling:
    """Bytes per second of a transfer: memory (a large copy: each byte read once and written once) or all-reduce
    bus bandwidth (2·(R−1)/R × message bytes / time, the convention of NCCL's tests, comparable to a link's
    bandwidth whatever R is)."""

    kind: str  # "memory" or "allreduce"
    device: str
    bytes_per_s: float
    message_bytes: int
    repeats: int
    ranks: int = 1
    backend: str | None = None
    load_per_core: float | None = None  # the 1-minute load average per core when it was measured (Unix)

    def describe(self) -> str:
        if self.kind == "memory":
            return (f"measured copy bandwidth of this {self.device} ({self.message_bytes / 2**20:.0f} MiB copied, "
                    f"read + written, median of {self.repeats})")
        return (f"measured all-reduce bus bandwidth over {self.ranks} ranks ({self.backend}, "
                f"{self.message_bytes / 2**20:.0f} MiB messages, 2(R-1)/R x bytes / time, median of {self.repeats})")


def measure_memory_bandwidth(device: str = "cpu", mib: int | None = None, repeats: int = 7) -> BandwidthCeiling:
    """Copy a ``mib``-MiB fp32 buffer into another (default 256 MiB on CPU, 1 GiB on CUDA: far beyond any
    cache) and return 2 × bytes / median time."""
    import torch

    mib = mib or (1024 if device.startswith("cuda") else 256)
    n = mib * 2**20 // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    median = _median_time(lambda: dst.copy_(src), device, repeats, time.perf_counter(), float("inf"))
    return BandwidthCeiling("memory", device, 2 * 4 * n / median, 4 * n, repeats)


def measure_allreduce(mib: int = 64, repeats: int = 5, group=None) -> BandwidthCeiling:
    """All-reduce bus bandwidth of the running torch.distributed process group (every rank must call this), or of
    the process-group object ``group`` (a ``ProcessGroupGloo`` or ``ProcessGroupNCCL`` made by the caller): a
    ``mib``-MiB fp32 tensor all-reduced ``repeats`` times after warm-up, the slowest rank's median time."""
    import torch
    import torch.distributed as dist

    from flopcount.errors import DeviceError

    if group is None and not (dist.is_available() and dist.is_initialized()):
        raise DeviceError("all-reduce bandwidth needs torch.distributed running on several ranks; launch with "
                          "torchrun --nproc_per_node=R (or srun)")
    if group is None:
        ranks, backend = dist.get_world_size(), dist.get_backend()

        def all_reduce(t, op=dist.ReduceOp.SUM):
            dist.all_reduce(t, op=op)
    else:
        ranks, backend = group.size(), group.name()

        def all_reduce(t, op=dist.ReduceOp.SUM):
            group.allreduce([t], dist.AllreduceOptions() if op == dist.ReduceOp.SUM else _max_options()).wait()
    backend = backend.lower()
    device = f"cuda:{torch.cuda.current_device()}" if backend == "nccl" else "cpu"
    n = mib * 2**20 // 4
    x = torch.ones(n, dtype=torch.float32, device=device)
    all_reduce(torch.zeros(1, device=device))  # every rank is here
    median = _median_time(lambda: all_reduce(x), device, repeats, time.perf_counter(), float("inf"))
    slowest = torch.tensor([median], dtype=torch.float64, device=device)
    all_reduce(slowest, op=dist.ReduceOp.MAX)
    busbw = 2 * (ranks - 1) / ranks * 4 * n / float(slowest.item())
    return BandwidthCeiling("allreduce", "cuda" if backend == "nccl" else "cpu", busbw, 4 * n, repeats, ranks,
                            backend)


def _max_options():
    import torch.distributed as dist

    opts = dist.AllreduceOptions()
    opts.reduceOp = dist.ReduceOp.MAX
    return opts


def _cache_file(kind: str, *parts: str):
    """The cache file of one ceiling of this machine (CPU model, usable cores, torch's threads and version), or None
    when caching is off."""
    import torch

    from flopcount.frontends.common import cache_key, default_cache_dir

    from .devices import cpu_cores, cpu_name

    folder = default_cache_dir()
    if folder is None:
        return None
    key = cache_key([_CACHE_FORMAT, kind, *parts, cpu_name(), cpu_cores(), torch.get_num_threads(), torch.__version__])
    return folder / f"ceiling-{kind}-{key[:20]}.json"


def _read_cache(path, record):
    """The ``record`` cached at ``path``, or None (no file, caching off, or unreadable)."""
    if path is None or not path.is_file():
        return None
    try:
        return record(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        log.debug("ignoring an unreadable ceiling cache file %s", path)
        return None


def _write_cache(path, ceiling) -> None:
    if path is None:
        return
    from flopcount.errors import OutputError
    from flopcount.output.files import write_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(asdict(ceiling)), "ceiling cache")
    except OSError:
        log.debug("cannot write the ceiling cache %s", path)
    except OutputError as e:
        log.debug("%s", e)


def _cached(path, record, measure, what: str):
    """``record`` read from ``path``; else ``measure()`` (None: cannot be measured here), written to ``path``. A
    cached ceiling is the best rate seen and stays until a measurement beats it (:func:`offer_ceiling`): it is
    never measured again because the machine is quieter or busier than when it was measured."""
    cached = _read_cache(path, record)
    if cached is not None:
        return cached
    log.info("measuring this machine's %s (about a second; cached)", what)
    ceiling = measure()
    if ceiling is not None:
        _write_cache(path, ceiling)
    return ceiling


def _rate(ceiling) -> float:
    return getattr(ceiling, "flops_per_s", None) or getattr(ceiling, "bytes_per_s")


def offer_ceiling(kind: str, ceiling, *parts: str) -> bool:
    """Keep ``ceiling`` (a :class:`GemmCeiling` under ``kind`` "gemm" with ``parts`` device and dtype, or the
    memory :class:`BandwidthCeiling` under "memory" with the device) as this machine's cached ceiling when it beats
    the cached one, or none is cached; whether it was kept."""
    record = GemmCeiling if kind == "gemm" else BandwidthCeiling
    path = _cache_file(kind, *parts)
    cached = _read_cache(path, record)
    if cached is not None and _rate(cached) >= _rate(ceiling):
        return False
    if cached is not None:
        log.info("a measured %s ceiling (%.4g) beats the cached one (%.4g): keeping it", kind, _rate(ceiling),
                 _rate(cached))
    _write_cache(path, ceiling)
    return True


def load_per_core() -> float | None:
    """The 1-minute load average per core (Unix), or None."""
    try:
        from .devices import cpu_cores

        return os.getloadavg()[0] / cpu_cores()
    except (AttributeError, OSError):
        return None


def cached_gemm(device: str = "cpu", dtype: str = "fp32") -> GemmCeiling | None:
    """The GEMM ceiling of ``dtype`` on this machine, from the cache or measured now (and cached); None when torch
    is not installed or the dtype cannot run here."""
    try:
        import_framework("torch")
    except ModuleNotFoundError:
        return None
    if dtype not in CPU_GEMM_DTYPES:
        return None

    def measure() -> GemmCeiling | None:
        try:
            return measure_gemm(device, dtype)
        except RuntimeError as e:  # the dtype has no kernel here
            log.info("no %s GEMM on this machine: %s", dtype, e)
            return None

    return _cached(_cache_file("gemm", device, dtype), GemmCeiling, measure, f"{dtype} GEMM ceiling")


def best_gemm(g: GemmCeiling) -> tuple[GemmCeiling, str]:
    """The best of ``g`` (measured now) and this machine's cached ceiling of its dtype, which ``g`` replaces when it
    beats it, with a note saying which it is (empty for ``g`` itself)."""
    if offer_ceiling("gemm", g, g.device, g.dtype):
        return g, ""
    cached = _read_cache(_cache_file("gemm", g.device, g.dtype), GemmCeiling)
    if cached is None:
        return g, ""
    return cached, (f"; the best rate cached for this machine, above the {g.flops_per_s / 1e9:.1f} GFLOP/s "
                    "measured now")


def cached_memory_bandwidth(device: str = "cpu") -> BandwidthCeiling | None:
    """This CPU's copy bandwidth, from the cache or measured now (about a second) and cached like
    :func:`cached_gemm`; None without torch."""
    try:
        import_framework("torch")
    except ModuleNotFoundError:
        return None

    return _cached(_cache_file("memory", device), BandwidthCeiling, lambda: measure_cpu_bandwidth(device),
                   "memory bandwidth")


def measure_cpu_bandwidth(device: str = "cpu") -> BandwidthCeiling:
    """This CPU's copy bandwidth measured the one way that ``ceilings``, ``profile`` and ``roofline`` all report:
    128 MiB copied, median of 5 after warm-up."""
    return replace(measure_memory_bandwidth(device, mib=128, repeats=5), load_per_core=load_per_core())


def best_bandwidth(b: BandwidthCeiling) -> tuple[BandwidthCeiling, str]:
    """The best of ``b`` (measured now by :func:`measure_cpu_bandwidth`) and this machine's cached copy bandwidth,
    which ``b`` replaces when it beats it, with a note saying which it is (empty for ``b`` itself): as
    :func:`best_gemm`, so that ``ceilings`` and ``roofline`` give one figure."""
    if offer_ceiling("memory", b, b.device):
        return b, ""
    cached = _read_cache(_cache_file("memory", b.device), BandwidthCeiling)
    if cached is None:
        return b, ""
    return cached, (f"; the best rate cached for this machine, above the {b.bytes_per_s / 1e9:.1f} GB/s "
                    "measured now")


@dataclass(frozen=True)
class Figure:
    """One measured ceiling: ``value`` in FLOP/s (compute) or B/s (bandwidth), where it comes from, and the
    measurement's details (size, repeats, ranks ...)."""

    value: float
    source: str
    details: dict = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Ceilings:
    """The measured ceilings of one machine, as ``flopcount ceilings`` writes them.

    ``gemm`` and ``conv`` map a dtype (fp32, tf32, bf16, fp16, fp64) to FLOP/s; ``memory_bandwidth`` and
    ``allreduce_bandwidth`` are B/s (None when not measured, with the reason in ``unavailable``); ``device`` is the
    device description (:meth:`flopcount.measure.machine.devices.Device.as_dict`); ``nodes`` and ``ranks`` the topology
    the all-reduce ran over.
    """

    device: Mapping[str, Any]
    gemm: Mapping[str, Figure]
    conv: Mapping[str, Figure] = field(default_factory=dict)
    memory_bandwidth: Figure | None = None
    allreduce_bandwidth: Figure | None = None
    nodes: int = 1
    ranks: int = 1
    unavailable: Mapping[str, str] = field(default_factory=dict)

    def compute(self, dtype: str = "fp32") -> Figure | None:
        """The highest compute ceiling measured for ``dtype`` (GEMM or convolution), or None."""
        figures = [f for f in (self.gemm.get(dtype), self.conv.get(dtype)) if f is not None]
        return max(figures, key=lambda f: f.value, default=None)

    def as_dict(self) -> dict[str, Any]:
        from flopcount.version import __version__

        def compute(f: Figure) -> dict:
            return {"flops_per_s": f.value, "source": f.source, **f.details}

        def bandwidth(f: Figure | None) -> dict | None:
            return None if f is None else {"bytes_per_s": f.value, "source": f.source, **f.details}

        return {
            "schema_version": CEILINGS_SCHEMA_VERSION,
            "tool": {"name": "flopcount", "version": __version__},
            "device": dict(self.device),
            "nodes": self.nodes,
            "ranks": self.ranks,
            "gemm": {k: compute(f) for k, f in self.gemm.items()},
            "conv": {k: compute(f) for k, f in self.conv.items()},
            "memory_bandwidth": bandwidth(self.memory_bandwidth),
            "allreduce_bandwidth": bandwidth(self.allreduce_bandwidth),
            "unavailable": dict(self.unavailable),
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2) + "\n"


def _figure(doc: Any, key: str, where: str) -> Figure:
    from flopcount.errors import MeasurementError

    if not isinstance(doc, dict) or not isinstance(doc.get(key), (int, float)) or doc[key] <= 0:
        raise MeasurementError(f"{where}: expected an object with a positive {key!r}; re-measure with "
                               "flopcount ceilings -o FILE")
    details = {k: v for k, v in doc.items() if k not in (key, "source")}
    return Figure(float(doc[key]), str(doc.get("source", "")), details)


def ceilings_from_dict(doc: Any, where: str = "ceilings") -> Ceilings:
    """A :class:`Ceilings` from its JSON document; a document that is not one is a MeasurementError naming
    ``where`` and the field."""
    from flopcount.errors import MeasurementError

    if not isinstance(doc, dict) or "gemm" not in doc:
        raise MeasurementError(f"{where}: not a ceilings file (no 'gemm'); write one with flopcount ceilings -o FILE")
    version = doc.get("schema_version")
    if version != CEILINGS_SCHEMA_VERSION:
        raise MeasurementError(f"{where}: ceilings schema_version {version!r}, this flopcount reads "
                               f"{CEILINGS_SCHEMA_VERSION}; re-measure with flopcount ceilings -o FILE")
    groups = {}
    for name in ("gemm", "conv"):
        part = doc.get(name) or {}
        if not isinstance(part, dict):
            raise MeasurementError(f"{where}: {name!r} must map a dtype to a ceiling")
        groups[name] = {k: _figure(v, "flops_per_s", f"{where}: {name}.{k}") for k, v in part.items()}
    bw = {name: None if doc.get(name) is None else _figure(doc[name], "bytes_per_s", f"{where}: {name}")
          for name in ("memory_bandwidth", "allreduce_bandwidth")}
    return Ceilings(doc.get("device") or {}, groups["gemm"], groups["conv"], bw["memory_bandwidth"],
                    bw["allreduce_bandwidth"], int(doc.get("nodes") or 1), int(doc.get("ranks") or 1),
                    dict(doc.get("unavailable") or {}))


def load_ceilings(path: str) -> Ceilings:
    """Read a ``flopcount ceilings`` JSON file; a missing or malformed file is a MeasurementError naming it."""
    from flopcount.errors import MeasurementError

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise MeasurementError(f"{path}: cannot read the ceilings file ({e.strerror}); write one with "
                               "flopcount ceilings -o FILE") from None
    except ValueError as e:
        raise MeasurementError(f"{path}: not JSON ({e}); write a ceilings file with flopcount ceilings -o FILE") \
            from None
    return ceilings_from_dict(doc, path)


def _gemm_figure(g: GemmCeiling, note: str = "") -> Figure:
    details = {"n": g.n, "repeats": g.repeats, "threads": g.threads, "statistic": "max over repeats"}
    if g.median_flops_per_s is not None:
        details.update(median_flops_per_s=g.median_flops_per_s, min_flops_per_s=g.min_flops_per_s)
    return Figure(g.flops_per_s, g.describe() + note, details)


def _conv_figure(c: ConvCeiling) -> Figure:
    details = {"shape": list(c.shape), "repeats": c.repeats, "channels_last": c.channels_last}
    if c.threads is not None:
        details["threads"] = c.threads
    return Figure(c.flops_per_s, c.describe(), details)


def _bandwidth_figure(b: BandwidthCeiling, note: str = "") -> Figure:
    details: dict[str, Any] = {"message_bytes": b.message_bytes, "repeats": b.repeats}
    if b.kind == "allreduce":
        details.update(ranks=b.ranks, backend=b.backend)
    return Figure(b.bytes_per_s, b.describe() + note, details)


def default_dtypes(device: str) -> tuple[str, ...]:
    """fp32 and the reduced precisions the device runs: bf16 on a CPU; tf32, bf16 and fp16 on CUDA (those of them
    that its compute capability has: tf32 and bf16 from 8.0)."""
    if not device.startswith("cuda"):
        return ("fp32", "bf16")
    import torch

    major, _ = torch.cuda.get_device_capability(device)
    return ("fp32", "tf32", "bf16", "fp16") if major >= 8 else ("fp32", "fp16")


def measure_ceilings(device: str = "cpu", dtypes: tuple[str, ...] | None = None, quick: bool = False) -> Ceilings:
    """Measure GEMM and convolution ceilings per dtype, the memory bandwidth and, when torch.distributed runs on
    several ranks (every rank calls this), the all-reduce bus bandwidth. ``quick`` uses small sizes and few
    repeats (seconds: for tests and a first look, not for a report)."""
    from . import system
    from .devices import describe

    dev = describe(device.split(":")[0] if device.startswith("cuda") else device)  # no CUDA: a DeviceError
    dtypes = dtypes or (("fp32",) if quick else default_dtypes(device))
    unavailable: dict[str, str] = {}
    gemm: dict[str, Figure] = {}
    conv: dict[str, Figure] = {}
    gemm_sizes = (256, 512) if quick else ((4096, 8192) if device.startswith("cuda") else (512, 1024, 2048))
    conv_shapes = ((2, 64, 28, 28),) if quick else None
    for dtype in dtypes:
        try:
            g = measure_gemm(device, dtype, sizes=gemm_sizes, repeats=3 if quick else 10,
                             budget_s=1.0 if quick else 5.0)
            # a full CPU measurement is offered to the harness's cache (quick sizes are too small to be a ceiling)
            g, note = best_gemm(g) if device == "cpu" and not quick else (g, "")
            gemm[dtype] = _gemm_figure(g, note)
        except RuntimeError as e:
            unavailable[f"gemm.{dtype}"] = f"no {dtype} matrix product on this {device}: {str(e).splitlines()[0]}"
        try:
            conv[dtype] = _conv_figure(measure_conv(device, dtype, shapes=conv_shapes, repeats=3 if quick else 7,
                                                    budget_s=1.0 if quick else 5.0))
        except RuntimeError as e:
            unavailable[f"conv.{dtype}"] = f"no {dtype} convolution on this {device}: {str(e).splitlines()[0]}"
    if device == "cpu" and not quick:  # measured as roofline and profile measure it, and offered to their cache
        memory = _bandwidth_figure(*best_bandwidth(measure_cpu_bandwidth(device)))
    else:
        memory = _bandwidth_figure(measure_memory_bandwidth(device, mib=32 if quick else None,
                                                            repeats=3 if quick else 7))
    topo = system.topology()
    allreduce = None
    if int(topo["ranks"]) > 1:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            allreduce = _bandwidth_figure(measure_allreduce(mib=4 if quick else 64, repeats=3 if quick else 10))
        else:
            unavailable["allreduce_bandwidth"] = ("WORLD_SIZE says several ranks but torch.distributed is not "
                                                  "initialized in this process")
    else:
        unavailable["allreduce_bandwidth"] = ("one rank: run under torchrun --nproc_per_node=R (or srun) to measure "
                                              "the all-reduce bus bandwidth")
    return Ceilings(dev.as_dict(), gemm, conv, memory, allreduce, int(topo["nodes"]), int(topo["ranks"]),
                    unavailable)


def default_ceilings(gemm: GemmCeiling | None = None) -> Ceilings:
    """Ceilings of this CPU for ``profile`` and ``roofline`` when no ``--ceilings`` file is given: the cached fp32
    GEMM ceiling (``gemm`` when given: ``profile`` gives onnxruntime's own) and the cached copy bandwidth
    (measured once per machine, about two seconds)."""
    from flopcount.errors import DeviceError

    from .devices import cpu_device

    gemm = gemm or cached_gemm("cpu", "fp32")
    memory = cached_memory_bandwidth("cpu")
    if gemm is None or memory is None:
        raise DeviceError("measuring this machine's ceilings needs torch (pip install torch); or give "
                          "--ceilings FILE written by flopcount ceilings on a machine that has it")
    return Ceilings(cpu_device().as_dict(), {"fp32": _gemm_figure(gemm)}, {},
                    _bandwidth_figure(memory), unavailable={"conv": "not measured (cached GEMM and copy only); "
                                                            "run flopcount ceilings -o FILE for every ceiling"})


def measured_cpu_device(dtypes: tuple[str, ...] = ("fp32",)) -> Device:
    """This CPU described with its peak per dtype: the **measured** GEMM ceiling of this machine (a short
    calibration through torch, cached per machine by :func:`cached_gemm`), never a datasheet figure; without torch
    the peaks are absent."""
    peaks = {}
    for dtype in dtypes:
        gemm = cached_gemm("cpu", dtype)
        if gemm is not None:
            peaks[dtype] = devices.Peak(gemm.flops_per_s, gemm.describe(), gemm.load_per_core)
    return devices.cpu_device(peaks)
