"""``flopcount calibrate``: measure this machine once into a :class:`~.calibration.MachineProfile`.

The measurement runs where a training run of ``ranks`` processes would: with ``ranks`` > 1, that many processes are
spawned on this host, join a gloo group over loopback (127.0.0.1), each on ``cores // ranks`` threads (at least 1;
or ``--threads``), and measure **at the same time**, so that every compute rate is the rate one rank gets while the
others work beside it (on a CPU the ranks share the cores). In each process:

* **GEMM**: square products at each size, timed by :func:`~.ceilings.measure_gemm` (the one GEMM timer), each
  size alone: its best, median and slowest repeat (``gemm_in_cache``: the peak is its best); and again with a
  64 MiB buffer written before each repeat, so that the operands come from memory as a training step's products
  find their weights (``gemm``, the rate products are predicted at);
* **elementwise** (``a + b`` into ``c``: 12 bytes an element) and **reduction** (``sum(a)``: 4 bytes an element)
  at each size, as bytes per second, timed by :func:`~.ceilings.repeat_times`;
* **elementwise in a step** (``elementwise_fresh``): ``a + b`` at the same sizes and bytes as a step runs it
  (:func:`_in_step_rates`): over a pool of inputs holding 64 MiB, each call reading the next two (a step's operator
  reads tensors made long before, out of the cores' caches), its output a new tensor kept until the repeat ends (a
  forward keeps its activations for the backward), then freed; a repeat's rate is its bytes over its seconds (the
  process's CPU seconds where the ranks' threads with the machine's load outnumber the cores: the wall clock of a
  repeat that long holds the other ranks' turns on the cores). The same call on the same inputs into a reused
  buffer (``elementwise``) finds them in cache, several times faster at the sizes of a step's activations;
* **copy** (``copy``): ``torch.cat`` of two float32 halves [r, 32] into [r, 64] (a rotary embedding's join) at the
  elementwise sizes, as a step runs it (as above): bytes per second of twice the output's bytes (read and
  written): what a node without FLOPs that copies (a concatenation, a cast, a slice's backward) runs at, a strided
  copy slower than ``a + b`` moves its bytes;
* **softmax** (``softmax``, ``softmax_backward``): ``torch.softmax`` over rows of 512 float32 at the elementwise
  sizes and its backward (``_softmax_backward_data``), each as a step runs it (as above), as FLOP/s of the count's
  FLOPs of an ONNX Softmax of that shape (forward, and backward with its input needing a gradient): its
  exponentials and its passes over each row run far slower than a pass of ``a + b``;
* **dropout**: torch's dropout (``F.dropout``, p = 0.1, training) of a float32 tensor of each elementwise size / 4
  elements, as elements per second (the count's FLOPs of a training Dropout: one per element): on a CPU it draws
  its random mask far slower than an elementwise operator moves its bytes;
* **overhead**: the seconds a tiny operator costs in the forward (recorded by autograd) and in the backward, from a
  chain of 200 additions of one element;
* **attention**: torch's fused attention (``scaled_dot_product_attention``, causal, the kernel a decoder's attention
  runs) over a batch of 16 heads at each (sequence, head size), forward and forward + backward, as FLOP/s of the
  full attention's products (forward 4·B·S²·D, backward twice that: the count's ``--attention full``), at the
  effective size ∛(S²·D) of one product;
* **optimizers**: each optimizer's step (torch's own, its implementation as torch picks it on this device) over
  64 one-element tensors (seconds per tensor) and, for each of 2^12, 2^16, 2^18 and 2^20 elements, over as many
  tensors of that size as hold 2^22 elements in all (``Sizes.optimizer_held``; seconds per element at that size,
  less the per-tensor cost of each tensor): a step reads every parameter, its gradient and its states once, more
  than the cache holds, so each tensor's elements come from memory, where one tensor stepped again and again
  finds them in cache (on a Sapphire Rapids core, AdamW's 2^20 elements timed alone cost 3 ns an element, 5.5 as
  a 4-million-element model's set). Before each step a buffer as large as the last-level cache is written
  (:func:`optimizer_flush_bytes`: shared out among the ranks; the machine's ``optimizer_flush_bytes`` records a
  rank's): between two optimizer steps a training step's forward and backward move more bytes than that cache
  holds, where steps one after another would find a 64 MiB state in a large one (on a 480 MiB Xeon 6 cache,
  AdamW over a 4.2-million-element Llama's tensors took 12.5 ms a step one after another, 16.4 ms with 640 MiB
  written between, 16.2 to 16.6 ms in its training loop);
* **cross-entropy**: torch's cross-entropy loss (``torch.nn.functional.cross_entropy``, class targets, the mean)
  over rows of 512 scores at the elementwise sizes, and its backward (``nll_loss_backward``, a gradient of zeros
  with a value a row, then ``_log_softmax_backward_data``, which takes an exponential an element where a
  softmax's backward takes none), each as a step runs it, as FLOP/s of the count's SoftmaxCrossEntropyLoss;
* **collectives** (rank 0 records the slowest rank of each repeat): ``all_reduce``, ``all_gather``,
  ``reduce_scatter``, ``all_to_all`` of each message size over all ``ranks`` processes, each repeat after a barrier;
  ``send_recv`` one way, half of a round trip between ranks 0 and 1. Their fit is
  :func:`~.calibration.fit_segments`;
* **collectives in a step** (``collectives_in_step``): the same calls and sizes, made as a step makes them: one
  after another with no barrier between, each after a burst of compute as a step runs between its collectives (a
  16 MiB buffer written, which evicts the caches the call's buffers and gloo's state were in, then a layer's piece of
  work: five 512×256 by 256×256 products, each followed by three elementwise operators into new tensors, during
  which gloo's threads go idle). A rank that leaves one call late arrives late at the next, where its peer waits: a
  barrier before each call would hide that wait, which a step pays. Each call is timed as the larger of its
  wall-clock seconds and the CPU seconds of the whole process over it (every thread: gloo reduces and moves the
  bytes on threads of its own); by the CPU seconds alone where the ranks' threads, with the machine's other load
  when the calibration began (the cores busy then, from /proc/stat over 0.25 s, else the 1-minute load average; in
  whole cores, less than half a core counted as none), outnumber the cores (the wall clock then holds the other
  ranks' and processes' turns on the cores; the profile's ``machine.collectives_in_step_clock`` says which: ``cpu``
  or ``wall_or_cpu``). In a tight loop the same call finds its buffers in cache and gloo's threads awake. A call's
  cost there is heavy-tailed (most calls near the median, a few costing ten times more: gloo's event-loop thread
  burning the CPU while a peer is late), so each size is timed ``in_step_repeats`` (40) times, or at least
  ``in_step_least`` (12) once the size has taken ``in_step_budget_s`` (0.3 s: the ranks agree whether to stop at the
  start of each chain of 6 calls), and its point records the mean and the 90th percentile of the calls beside the
  median, best and slowest (:func:`tail_stats`): by the wall clock each the slowest rank's own figure over its calls
  (a step lasts its own calls), by the CPU seconds alone each of the slowest rank of each call (see
  :func:`_collectives`);
* **collectives in a step over smaller groups** (``collectives_in_step_groups``, with ``ranks`` ≥ 4): for each
  group size g from 2 to below ``ranks`` that divides it (:func:`group_sizes`: the tensor- or data-parallel groups
  a plan on these ranks can make), the ranks split into groups of g (0 to g-1, g to 2g-1, ...; each made by
  every rank, in the same order, with ``dist.new_group``), every group timing its own calls at the same time, as
  a step runs its groups' collectives side by side: ``all_reduce``, ``all_gather`` and ``reduce_scatter``
  (``Sizes.group_kinds``: what a step's groups run) at the same sizes, timed in a step as above, each size
  stopped once at least ``in_step_least`` repeats are done and it has taken ``group_budget_s`` (0.15 s), the
  slowest rank of all the groups recorded. A 2-rank group's call on a machine of fewer cores than ranks costs
  far less than a call over all the processes, which is what a plan's smaller groups pay.
* **FSDP2's own work around its gather** (``compute.fsdp_copy``, with ``ranks`` > 1 and torch's ``fully_shard``):
  a module of four square float32 weights of ``Sizes.fsdp`` bytes in all, sharded over every rank by torch's
  ``fully_shard``, its ``unshard()`` timed (each after a burst of compute as above and a barrier, the module resharded
  after it) beside a plain ``all_gather_into_tensor`` of the same bytes: the difference, repeat by repeat, is what
  FSDP2 does besides the collective (the shard copied into the gather's input, the gathered output copied out into
  each parameter's new memory, its own framework), recorded as bytes of the gathered payload per second (the slowest
  rank's). A prediction adds it to each of FSDP2's gathers and reduce-scatters (:mod:`flopcount.measure.predict`).

The whole calibration is bounded: the processes are killed and a MeasurementError (exit 12) raised once
``timeout_s`` is spent.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass

from flopcount.errors import MeasurementError, UsageError

from .calibration import (CALIBRATION_METHOD, COLLECTIVES, OPTIMIZERS_TIMED, Collective, MachineProfile,
                          OptimizerCost, Point, fit_segments)

__all__ = ["DEFAULT_SIZES", "QUICK_SIZES", "Sizes", "UNKNOWN_CACHE_FLUSH", "calibrate", "group_sizes", "measure_rank",
           "message_sizes", "optimizer_flush_bytes", "tail_stats"]


@dataclass(frozen=True)
class Sizes:
    """What a calibration times: GEMM sizes n, elementwise bytes, message bytes (each rounded down to a multiple of
    4·ranks bytes, a size that rounds to 0 left out: :func:`message_sizes`),
    repeats of each (of each collective in a step: ``in_step_repeats``, enough to see its tail, or at least
    ``in_step_least`` once it has taken ``in_step_budget_s``; ``group_budget_s`` over smaller groups, of the
    ``group_kinds`` only), and the seconds each GEMM size may take."""

    gemm: tuple[int, ...] = (16, 64, 128, 256, 512, 768)
    elementwise: tuple[int, ...] = (1024, 16 * 1024, 256 * 1024, 4 * 2**20, 32 * 2**20)
    # from 64 bytes (an MoE router's counts per expert, gathered before each dispatch) to 32 MiB (DDP's 25 MiB
    # buckets inside the calibrated sizes), every factor of 2 from 64 KiB to 2 MiB (a layer's activations, where the
    # calls of a step wait on each other most)
    messages: tuple[int, ...] = (64, 1024, 4 * 1024, 16 * 1024, 64 * 1024, 128 * 1024, 256 * 1024, 512 * 1024,
                                 1 * 2**20, 2 * 2**20, 4 * 2**20, 16 * 2**20, 32 * 2**20)
    repeats: int = 7
    gemm_budget_s: float = 0.6
    attention: tuple[tuple[int, int], ...] = ((64, 32), (128, 32), (256, 64), (512, 64))  # (sequence, head size)
    optimizer_elements: tuple[int, ...] = (2**12, 2**16, 2**18, 2**20)
    # each size's tensors hold this many elements in all (at least one tensor): 16 MiB of float32 parameters, 64 MiB
    # with adam's gradients and two states, more than the cache, as a model's whole state is
    optimizer_held: int = 2**22
    # the bytes written before each optimizer step, shared out among the ranks (None: the last-level cache's, or
    # UNKNOWN_CACHE_FLUSH where the system does not say it)
    optimizer_flush: int | None = None
    in_step_repeats: int = 40  # at most; at least in_step_least once a size has taken in_step_budget_s
    in_step_least: int = 12
    in_step_budget_s: float = 0.3
    group_kinds: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter")
    group_budget_s: float = 0.15
    # FSDP2's parameter bytes gathered a call (a layer's, from a small model's to a large one's on this machine)
    fsdp: tuple[int, ...] = (256 * 1024, 2**20, 4 * 2**20, 16 * 2**20)


DEFAULT_SIZES = Sizes()
#: A calibration of seconds, for tests.
QUICK_SIZES = Sizes(gemm=(32, 64), elementwise=(4096, 65536), messages=(4096, 16384, 131072, 524288), repeats=3,
                    gemm_budget_s=0.1, attention=((32, 16), (64, 16)), optimizer_elements=(2**10, 2**14),
                    in_step_repeats=10, in_step_least=10, in_step_budget_s=0.1, group_budget_s=0.1,
                    optimizer_held=2**15, optimizer_flush=2**20, fsdp=(65536, 262144))


def message_sizes(messages: tuple[int, ...], ranks: int) -> tuple[int, ...]:
    """The message bytes timed over ``ranks``: each rounded down to a multiple of 4·ranks (float32 elements that
    split evenly over the ranks), those that round to 0 left out.

    >>> message_sizes((64, 1024), 2), message_sizes((64, 1024), 3), message_sizes((64, 1024), 32)
    ((64, 1024), (60, 1020), (1024,))
    """
    return tuple(b - b % (4 * ranks) for b in messages if b >= 4 * ranks)


def group_sizes(ranks: int) -> tuple[int, ...]:
    """The smaller group sizes a calibration of ``ranks`` times its collectives in a step over: each g from 2 to
    below ``ranks`` that divides it (none below 4 ranks).

    >>> group_sizes(2), group_sizes(4), group_sizes(8), group_sizes(12)
    ((), (2,), (2, 4), (2, 3, 4, 6))
    """
    return tuple(g for g in range(2, ranks) if ranks % g == 0)


def _stats(values: list[float], higher_is_better: bool) -> tuple[float, float, float]:
    """(median, best, slowest) of repeats: rates (higher is better) or seconds."""
    med = statistics.median(values)
    return (med, max(values), min(values)) if higher_is_better else (med, min(values), max(values))


def tail_stats(seconds: list[float]) -> tuple[float, float]:
    """(mean, 90th percentile) of calls' seconds; the percentile by nearest rank: the ⌈0.9·n⌉-th smallest.

    >>> tail_stats([1.0] * 9 + [11.0])
    (2.0, 1.0)
    """
    ordered = sorted(seconds)
    return statistics.fmean(ordered), ordered[-(-9 * len(ordered) // 10) - 1]


#: The bytes written before each optimizer step where the last-level cache's size is not known: more than the
#: last-level cache a core reaches on today's server CPUs (up to 480 MiB on one Xeon 6 socket, 96 MiB a chiplet on
#: AMD's EPYC with 3D V-Cache).
UNKNOWN_CACHE_FLUSH = 512 * 2**20


def optimizer_flush_bytes(sizes: Sizes, ranks: int) -> int:
    """The bytes each of ``ranks`` calibrating processes writes before an optimizer step: ``sizes.optimizer_flush``,
    else the last-level cache's size (:func:`~.devices.last_level_cache_bytes`), else :data:`UNKNOWN_CACHE_FLUSH`,
    shared out among the ranks (they share the cache and write at the same time).

    >>> optimizer_flush_bytes(Sizes(optimizer_flush=2**20), 4)
    262144
    """
    from .devices import last_level_cache_bytes

    whole = sizes.optimizer_flush if sizes.optimizer_flush is not None else (
        last_level_cache_bytes() or UNKNOWN_CACHE_FLUSH)
    return whole // max(1, ranks)


def _compute(sizes: Sizes, clock=None, flush_bytes: int = 0) -> dict:
    """This process's GEMM, elementwise and reduction points and its per-operator overhead; the work timed as a
    step runs it (:func:`_in_step_rates`, whose repeats are long) on ``clock`` (by default the wall clock); a
    buffer of ``flush_bytes`` written before each optimizer step (:func:`_optimizers`)."""
    import torch

    from .ceilings import measure_gemm, repeat_times

    out: dict = {"gemm_in_cache": [], "elementwise": [], "reduction": []}
    for n in sizes.gemm:
        g = measure_gemm("cpu", "fp32", (n,), sizes.repeats, sizes.gemm_budget_s)
        out["gemm_in_cache"].append([n, g.median_flops_per_s, g.flops_per_s, g.min_flops_per_s])
    out["gemm"] = _gemm_out_of_cache(sizes)
    start = time.perf_counter()
    for nbytes in sizes.elementwise:
        k = max(1, nbytes // 12)
        a, b, c = torch.ones(k), torch.ones(k), torch.empty(k)
        ts = repeat_times(lambda: torch.add(a, b, out=c), "cpu", sizes.repeats, start, float("inf"))
        out["elementwise"].append([12 * k, *_stats([12 * k / t for t in ts], True)])
        fresh = _in_step_rates(torch.add, _pool(lambda: torch.ones(k), 4 * k), 12 * k, sizes.repeats, clock)
        out.setdefault("elementwise_fresh", []).append([12 * k, *_stats(fresh, True)])
        x = torch.ones(max(1, nbytes // 4))
        ts = repeat_times(lambda: torch.sum(x), "cpu", sizes.repeats, start, float("inf"))
        out["reduction"].append([4 * x.numel(), *_stats([4 * x.numel() / t for t in ts], True)])
    out["copy"] = []
    for nbytes in sizes.elementwise:  # two halves of rows of 64 elements joined: a rotary embedding's cat
        rows = max(1, nbytes // 16 // 32)
        rates = _in_step_rates(lambda a, b: torch.cat((a, b), dim=-1), _pool(lambda: torch.ones(rows, 32), 128 * rows),
                               16 * 32 * rows, sizes.repeats, clock)
        out["copy"].append([16 * 32 * rows, *_stats(rates, True)])
    out["softmax"], out["softmax_backward"] = _softmax(sizes, clock)
    out["cross_entropy"], out["cross_entropy_backward"] = _cross_entropy(sizes, clock)
    out["dropout"] = []
    for nbytes in sizes.elementwise:
        x = torch.randn(max(1, nbytes // 4))
        ts = repeat_times(lambda: torch.nn.functional.dropout(x, 0.1, True), "cpu", sizes.repeats, start,
                          float("inf"))
        out["dropout"].append([x.numel(), *_stats([x.numel() / t for t in ts], True)])
    out["overhead"] = _overhead(sizes.repeats)
    out["attention"], out["attention_backward"] = _attention(sizes)
    out["optimizers"] = _optimizers(sizes.repeats, sizes.optimizer_elements, sizes.optimizer_held, flush_bytes)
    return out


def _softmax(sizes: Sizes, clock=None) -> tuple[list, list]:
    """[FLOPs, median, best, slowest] FLOP/s of torch's softmax over rows of 512 float32 (``torch.softmax``) and of
    its backward (``_softmax_backward_data``), at the elementwise sizes (the input's bytes), each over a pool of
    inputs with its outputs kept, as a step runs them (:func:`_in_step_rates`), each of the FLOPs the count gives
    an ONNX Softmax of that shape whose input needs a gradient."""
    import torch

    fwd, bwd = [], []
    for nbytes in sizes.elementwise:
        rows = max(1, nbytes // 4 // 512)
        flops, back = _softmax_flops(rows, 512)
        pool = _pool(lambda: torch.softmax(torch.randn(rows, 512), -1), 2048 * rows)
        rates = _in_step_rates(lambda x, _: torch.softmax(x, -1), pool, flops, sizes.repeats, clock)
        fwd.append([flops, *_stats(rates, True)])
        rates = _in_step_rates(lambda g, y: torch.ops.aten._softmax_backward_data(g, y, -1, torch.float32), pool,
                               back, sizes.repeats, clock)
        bwd.append([back, *_stats(rates, True)])
    return fwd, bwd


def _softmax_flops(rows: int, n: int, loss: bool = False) -> tuple[int, int]:
    """(forward, backward) FLOPs the count gives a Softmax over the last axis of [rows, n] whose input needs a
    gradient (the input a product of a weight); with ``loss``, a SoftmaxCrossEntropyLoss of those scores against a
    class per row (the mean over the rows)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from flopcount import count

    info = helper.make_tensor_value_info
    op = "SoftmaxCrossEntropyLoss" if loss else "Softmax"
    last = (helper.make_node(op, ["h", "labels"], ["y"], reduction="mean") if loss
            else helper.make_node(op, ["h"], ["y"], axis=-1))
    inputs = [info("x", TensorProto.FLOAT, [rows, n])] + ([info("labels", TensorProto.INT64, [rows])] if loss else [])
    graph = helper.make_graph(
        [helper.make_node("Mul", ["x", "w"], ["h"]), last], op, inputs,
        [info("y", TensorProto.FLOAT, [] if loss else [rows, n])],
        [numpy_helper.from_array(np.ones((n,), np.float32), "w")])
    report = count(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), mode="train")
    node = next(nd for nd in report.nodes if nd.op_type == op)
    return node.cost.flops, node.backward.flops


def _cross_entropy(sizes: Sizes, clock=None) -> tuple[list, list]:
    """[FLOPs, median, best, slowest] FLOP/s of torch's cross-entropy loss over rows of 512 float32 scores, a class
    per row (``torch.nn.functional.cross_entropy``: a log-softmax, then the picked scores' mean) and of its backward
    (``nll_loss_backward``, a gradient of zeros with one value a row, then ``_log_softmax_backward_data``), at the
    elementwise sizes (the scores' bytes), each over a pool of inputs with its outputs kept, as a step runs them
    (:func:`_in_step_rates`), each of the FLOPs the count gives an ONNX SoftmaxCrossEntropyLoss of that shape."""
    import torch

    fwd, bwd = [], []
    aten = torch.ops.aten
    for nbytes in sizes.elementwise:
        rows = max(1, nbytes // 4 // 512)
        flops, back = _softmax_flops(rows, 512, loss=True)
        target = torch.randint(0, 512, (rows,))
        pool = _pool(lambda: torch.log_softmax(torch.randn(rows, 512), -1), 2048 * rows)
        rates = _in_step_rates(lambda x, _: torch.nn.functional.cross_entropy(x, target), pool, flops,
                               sizes.repeats, clock)
        fwd.append([flops, *_stats(rates, True)])
        one, total = torch.ones(()), torch.tensor(float(rows))

        def backward(lsm, _):
            grad = aten.nll_loss_backward(one, lsm, target, None, 1, -100, total)  # reduction 1: the mean
            return aten._log_softmax_backward_data(grad, lsm, -1, torch.float32)
        rates = _in_step_rates(backward, pool, back, sizes.repeats, clock)
        bwd.append([back, *_stats(rates, True)])
    return fwd, bwd


def _pool(make, nbytes: int, held_bytes: int = 64 * 2**20, most: int = 512) -> list:
    """Tensors from ``make()`` of ``nbytes`` each, as many as hold ``held_bytes`` (at least 2, at most ``most``): an
    operator run over each in turn reads its inputs from memory, as a step's operators read tensors made long
    before."""
    return [make() for _ in range(max(2, min(most, held_bytes // max(1, nbytes))))]


def _in_step_rates(op, pool: list, moved: float, repeats: int, clock=None) -> list[float]:
    """Rates (``moved`` per call, over its seconds on ``clock``: by default the wall clock) of ``op(pool[i],
    pool[i + 1])`` run over every tensor of ``pool`` in turn, one rate per repeat after a warm-up repeat: each output
    kept until its repeat ends (a forward keeps its activations for the backward), then freed, with a small tensor
    made after them kept until the end (a step's long-lived tensors, made after its first activations, keep the
    memory the process holds); a repeat another clock saw take no time (one too coarse: some systems tick at
    15.6 ms) is timed by the wall clock. Whether a repeat's outputs take pages new from the system (about a
    microsecond each on a virtual machine) follows the C library's thresholds, which the process's history has
    raised or not, as a training process's has."""
    import torch

    wall = time.perf_counter
    clock = clock or wall
    above, rates = [], []
    for r in range(repeats + 1):
        kept = []
        t0, w0 = clock(), (wall() if clock is not wall else 0.0)
        for i in range(len(pool)):
            kept.append(op(pool[i], pool[(i + 1) % len(pool)]))
        t = clock() - t0
        if t <= 0 and clock is not wall:
            t = wall() - w0
        above.append(torch.empty(16))
        del kept
        if r:
            rates.append(moved * len(pool) / t)
    return rates


def _gemm_out_of_cache(sizes: Sizes, flush_bytes: int = 64 * 2**20) -> list:
    """[n, median, best, slowest] FLOP/s of n×n×n products, each repeat after writing ``flush_bytes`` (more than
    a server CPU's last-level cache) so that its operands come from memory, as a training step's products find
    their weights (last touched a step before) and most of their activations."""
    import torch

    flush = torch.zeros(flush_bytes // 4)
    out = []
    for n in sizes.gemm:
        a, b = torch.randn(n, n), torch.randn(n, n)
        rates = []
        for j in range(sizes.repeats + 1):  # one warm-up product
            flush.add_(1.0)
            t0 = time.perf_counter()
            torch.mm(a, b)
            t = time.perf_counter() - t0
            if j:
                rates.append(2.0 * n**3 / t)
        out.append([n, *_stats(rates, True)])
    return out


def _attention(sizes: Sizes, heads: int = 16) -> tuple[list, list]:
    """Forward and backward points of torch's fused causal attention: [size, median, best, slowest] FLOP/s, the
    size ∛(S²·D) of one of its products, the FLOPs the full attention's products (forward 4·H·S²·D, backward
    twice)."""
    import torch
    import torch.nn.functional as F

    from .ceilings import repeat_times

    fwd, bwd = [], []
    start = time.perf_counter()
    for s, d in sizes.attention:
        q, k, v = (torch.randn(1, heads, s, d, requires_grad=True) for _ in range(3))
        flops = 4.0 * heads * s * s * d
        ts_f = repeat_times(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), "cpu", sizes.repeats,
                            start, float("inf"))

        def both():
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            o.backward(torch.ones_like(o))

        ts_b = repeat_times(both, "cpu", sizes.repeats, start, float("inf"))
        f_med = statistics.median(ts_f)
        size = (s * s * d) ** (1 / 3)
        fwd.append([size, *_stats([flops / t for t in ts_f], True)])
        # the backward alone: each forward + backward repeat less the forward's median
        bwd.append([size, *_stats([2 * flops / max(t - f_med, 1e-9) for t in ts_b], True)])
    return fwd, bwd


def _optimizers(repeats: int, elements: tuple[int, ...], held: int, flush_bytes: int = 0, tensors: int = 64) -> dict:
    """Each optimizer's step: seconds per parameter tensor (over ``tensors`` one-element tensors) and per element
    at each size n of ``elements`` (over k = max(1, ``held`` // n) tensors of that size, less k times the
    per-tensor median, over their k·n elements: a step reads every parameter, gradient and state of the model
    once, more than the cache holds, as ``held`` elements of them are; one tensor stepped again and again finds them
    in cache), as [size, median, best, slowest]; and whether torch picked its multi-tensor (foreach)
    implementation. Before each step a buffer of ``flush_bytes`` is written: a training step's forward and
    backward move more bytes than the last-level cache holds between two optimizer steps, so a step finds the
    parameters, gradients and states in memory, where steps one after another would find them in that cache."""
    import torch
    from torch.optim.optimizer import _default_to_fused_or_foreach

    make = {"sgd": lambda ps: torch.optim.SGD(ps, lr=1e-3),
            "momentum": lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9),
            "adam": lambda ps: torch.optim.Adam(ps, lr=1e-3), "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-3)}

    def steps(name: str, sizes: tuple[int, ...]) -> list[float]:
        ps = [torch.randn(n, requires_grad=True) for n in sizes]
        for p in ps:
            p.grad = torch.randn_like(p)
        opt, ts = make[name](ps), []
        for j in range(repeats + 2):  # two warm-up steps (the states are made at the first)
            if flush is not None:
                flush.add_(1.0)
            t0 = time.perf_counter()
            opt.step()
            if j >= 2:
                ts.append(time.perf_counter() - t0)
        return ts

    flush = torch.zeros(flush_bytes // 4) if flush_bytes >= 4 else None
    out = {}
    for name in OPTIMIZERS_TIMED:
        per_tensor = [t / tensors for t in steps(name, (1,) * tensors)]
        mid = statistics.median(per_tensor)
        per_element = [[n, *_stats([max(t - mid * k, 1e-12) / (n * k) for t in steps(name, (n,) * k)], False)]
                       for n, k in ((n, max(1, held // n)) for n in elements)]
        foreach = bool(_default_to_fused_or_foreach([torch.zeros(1, requires_grad=True)], differentiable=False,
                                                    use_fused=False)[1])
        out[name] = {"per_tensor_s": [1, *_stats(per_tensor, False)], "per_element_s": per_element,
                     "foreach": foreach}
    return out


def _overhead(repeats: int, chain: int = 200) -> dict:
    """Seconds per tiny operator, forward (autograd recording) and backward."""
    import torch

    fwd, bwd = [], []
    for _ in range(repeats + 1):
        x = torch.ones(1, requires_grad=True)
        t0 = time.perf_counter()
        y = x
        for _ in range(chain):
            y = y + 1.0
        t1 = time.perf_counter()
        y.backward()
        t2 = time.perf_counter()
        fwd.append((t1 - t0) / chain)
        bwd.append((t2 - t1) / chain)
    return {"forward": [1, *_stats(fwd[1:], False)], "backward": [1, *_stats(bwd[1:], False)]}


@dataclass(frozen=True)
class _InStep:
    """How a collective in a step is timed: each call after ``burst`` (a function), by the CPU seconds alone with
    ``cpu_only``, the calls one after another as a step makes them, the ranks agreeing every ``chain`` calls
    whether to stop: once at least ``least`` are done and a rank has spent ``budget_s`` on them."""

    burst: object
    cpu_only: bool
    least: int
    budget_s: float
    chain: int = 6


def _time_collective(kind: str, nbytes: int, rank: int, n: int, repeats: int,
                     in_step: _InStep | None = None, group=None) -> list[float]:
    """Seconds of each repeat of one collective on this rank (send_recv: one way, half a round trip); with
    ``in_step``, each repeat after its burst, with no barrier between the calls of a chain, and timed as the larger
    of the wall-clock seconds and the process's CPU seconds (every thread) over the call, the CPU seconds alone
    with its ``cpu_only``: a collective in a step (see the module), at most ``repeats`` and, past its budget, at
    least its ``least``; over ``group`` (of ``n`` ranks; None: all of them), all the ranks agreeing when to stop."""
    import torch
    import torch.distributed as dist

    k = nbytes // 4
    full, part = torch.ones(k), torch.ones(k // n)
    if kind == "all_reduce":
        def op(): dist.all_reduce(full, group=group)
    elif kind == "all_gather":
        def op(): dist.all_gather_into_tensor(full, part, group=group)
    elif kind == "reduce_scatter":
        def op(): dist.reduce_scatter_tensor(part, full, group=group)
    elif kind == "all_to_all":
        other = torch.empty(k)

        def op(): dist.all_to_all_single(other, full)
    else:
        def op():
            if rank == 0:
                dist.send(full, 1)
                dist.recv(full, 1)
            elif rank == 1:
                dist.recv(full, 0)
                dist.send(full, 0)
    times, start = [], time.perf_counter()
    for j in range(repeats + 2):  # two warm-up calls
        if in_step is None:
            dist.barrier()
        else:
            if j % in_step.chain == 0:  # a chain's start: agree to stop, past the budget on any rank with enough
                stop = torch.tensor([float(len(times) >= in_step.least
                                           and time.perf_counter() - start > in_step.budget_s)])
                dist.all_reduce(stop, op=dist.ReduceOp.MAX)
                if stop.item():
                    break
            in_step.burst()
        c0, t0 = time.process_time(), time.perf_counter()
        op()
        t = time.perf_counter() - t0
        if in_step is not None:
            t = time.process_time() - c0 if in_step.cpu_only else max(t, time.process_time() - c0)
        if j >= 2:
            times.append(t / 2 if kind == "send_recv" else t)
    return times


def _compute_burst():
    """What a collective in a step follows: a 16 MiB buffer written (the caches evicted), then a layer's piece of
    work, five times a 512×256 by 256×256 product and three elementwise operators on its output, each into a new
    tensor (see the module)."""
    import torch

    flush, a, b = torch.zeros(4 * 2**20), torch.randn(512, 256), torch.randn(256, 256) / 16

    def burst():
        flush.add_(1.0)
        x = a
        for _ in range(5):
            x = (torch.nn.functional.silu(torch.mm(x, b)) + x) * 0.5
    return burst


def _collectives(rank: int, n: int, sizes: Sizes, in_step: _InStep | None = None, group=None,
                 kinds: tuple[str, ...] = COLLECTIVES) -> dict:
    """[bytes, median, best, slowest] seconds of each of ``kinds`` at each message size, the slowest rank of each
    repeat; with ``in_step`` as a step runs them (up to ``sizes.in_step_repeats`` repeats, and the mean and p90
    after the slowest), else in a tight loop; over ``group`` (this rank's group of ``n``; None: all the ranks).
    Timed in a step by the wall clock, each figure is the largest of the ranks' own over their calls: a rank's
    call holds its wait for a late peer, and a rank waiting in one call finds the peer waiting in another, so a
    step lasts its own calls. By the CPU seconds alone (``cpu_only``) a call does not hold that wait: the slowest
    rank of each call stands for it (the ranks leave each call together)."""
    import torch
    import torch.distributed as dist

    out = {}
    for kind in kinds:
        rows = []
        for nbytes in message_sizes(sizes.messages, n):
            repeats = sizes.repeats if in_step is None else sizes.in_step_repeats
            seconds = _time_collective(kind, nbytes, rank, n, repeats, in_step, group)
            if in_step is None or in_step.cpu_only:
                t = torch.tensor(seconds, dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank of each repeat
                rows.append([nbytes, *_stats(t.tolist(), False),
                             *(tail_stats(t.tolist()) if in_step is not None else ())])
            else:
                t = torch.tensor([*_stats(seconds, False), *tail_stats(seconds)], dtype=torch.float64)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's figures
                rows.append([nbytes, *t.tolist()])
        out[kind] = rows
    return out


def measure_rank(rank: int, n: int, port: int, sizes: Sizes, out_dir: str, threads: int, others: float = 0.0) -> None:
    """One calibrating process (spawned): join the gloo group, measure compute with the others on ``threads``
    threads, then the collectives (in a step by the CPU seconds alone where the ranks' threads and ``others``, the
    machine's load when the calibration began, outnumber the cores); rank 0 writes the result to
    ``out_dir/result.json``."""
    import warnings

    import torch

    warnings.simplefilter("ignore", FutureWarning)  # torch's renaming of the *_into_tensor collectives
    torch.set_num_threads(threads)
    if n > 1:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
                                timeout=datetime.timedelta(seconds=60))
        dist.barrier()
    from .devices import cpu_cores

    # the ranks' threads with the machine's other load (in whole cores: less than half a core busy is none)
    # outnumber the cores: the work timed in long repeats by this process's CPU seconds (its wall clock would hold
    # the other ranks' turns on the cores)
    cpu_only = n * threads + math.floor(others + 0.5) > cpu_cores()
    flush = optimizer_flush_bytes(sizes, n)
    result = _compute(sizes, time.process_time if cpu_only else None, flush)
    result["threads"] = torch.get_num_threads()
    result["optimizer_flush_bytes"] = flush
    if n > 1:
        result["collectives"] = _collectives(rank, n, sizes)
        in_step = _InStep(_compute_burst(), cpu_only, sizes.in_step_least, sizes.in_step_budget_s)
        result["collectives_in_step"] = _collectives(rank, n, sizes, in_step)
        result["collectives_in_step_clock"] = "cpu" if cpu_only else "wall_or_cpu"
        start = time.perf_counter()
        result["collectives_in_step_groups"] = _in_groups(rank, n, sizes, in_step)
        result["collectives_in_step_groups_s"] = round(time.perf_counter() - start, 2)
        copies = _fsdp_copies(rank, n, sizes, in_step.burst)
        if copies:
            result["fsdp_copy"] = copies
        dist.barrier()
        dist.destroy_process_group()
    if rank == 0:
        with open(os.path.join(out_dir, "result.json"), "w", encoding="utf-8") as f:
            json.dump(result, f)


def _fsdp_copies(rank: int, n: int, sizes: Sizes, burst, repeats: int = 12) -> list | None:
    """[payload bytes, median, best, slowest] bytes per second of FSDP2's own work around a gather of each of
    ``sizes.fsdp`` parameter bytes over all ``n`` ranks (see the module): each repeat, after ``burst`` and a
    barrier, the module's ``unshard()``, then after another burst and barrier a plain ``all_gather_into_tensor`` of
    the same bytes; the rate of a repeat is the payload over the difference (a repeat whose gather took no longer
    than the plain call is left out), the slowest rank's figures kept. None where torch has no ``fully_shard``."""
    import torch
    import torch.distributed as dist

    try:
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        return None
    mesh = DeviceMesh("cpu", list(range(n)))
    rows = []
    for nbytes in sizes.fsdp:
        side = max(n, round(math.sqrt(nbytes / 16) / n) * n)  # four side × side float32 weights, rows split evenly
        module = torch.nn.Sequential(*(torch.nn.Linear(side, side, bias=False) for _ in range(4)))
        fully_shard(module, mesh=mesh)
        payload = 16 * side * side
        full, part = torch.empty(payload // 4), torch.empty(payload // 4 // n)
        extra = []
        for j in range(repeats + 2):  # two warm-up repeats
            burst()
            dist.barrier()
            t0 = time.perf_counter()
            module.unshard()
            gather = time.perf_counter() - t0
            module.reshard()
            burst()
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_gather_into_tensor(full, part)
            plain = time.perf_counter() - t0
            if j >= 2 and gather > plain:
                extra.append(gather - plain)
        rates = [payload / t for t in extra] or [0.0]
        t = torch.tensor(_stats(rates, True), dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)  # the slowest rank's figures
        if t.min().item() > 0:
            rows.append([payload, *t.tolist()])
    return rows or None


def _in_groups(rank: int, n: int, sizes: Sizes, in_step: _InStep) -> dict:
    """Each of :func:`group_sizes` of ``n`` ranks → ``sizes.group_kinds`` timed in a step over the groups of that
    size side by side, this rank's group its own (each group made by every rank, in the same order), within
    ``sizes.group_budget_s`` a size (see the module)."""
    import dataclasses

    import torch.distributed as dist

    out = {}
    for g in group_sizes(n):
        groups = [dist.new_group(list(range(first, first + g))) for first in range(0, n, g)]
        timing = dataclasses.replace(in_step, budget_s=sizes.group_budget_s)
        out[str(g)] = _collectives(rank, g, sizes, timing, groups[rank // g], sizes.group_kinds)
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned(ranks: int, sizes: Sizes, timeout_s: float, threads: int) -> dict:
    """The result of ``ranks`` spawned calibrating processes, killed after ``timeout_s``."""
    import torch.multiprocessing as mp

    from .ceilings import load_per_core
    from .devices import busy_cores, cpu_cores

    others = busy_cores()  # the cores busy before the calibration's processes: the load now
    if others is None:  # not readable here: the 1-minute load average
        others = (load_per_core() or 0.0) * cpu_cores()
    with tempfile.TemporaryDirectory(prefix="flopcount-calibrate-") as out_dir:
        ctx = mp.start_processes(measure_rank, args=(ranks, _free_port(), sizes, out_dir, threads, others),
                                 nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=0.5):
                if time.monotonic() > deadline:
                    raise MeasurementError(f"calibrate --ranks {ranks}: not done in {timeout_s:.0f} s (a busy or "
                                           "blocked machine); try again, or with fewer ranks")
        except mp.ProcessRaisedException as e:
            raise MeasurementError(f"calibrate --ranks {ranks}: a calibrating process failed: "
                                   f"{str(e).strip().splitlines()[-1]}") from None
        except mp.ProcessExitedException as e:
            raise MeasurementError(f"calibrate --ranks {ranks}: a calibrating process exited ({e})") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        with open(os.path.join(out_dir, "result.json"), encoding="utf-8") as f:
            return json.load(f)


def calibrate(ranks: int = 1, sizes: Sizes = DEFAULT_SIZES, timeout_s: float = 110.0,
              threads: int | None = None) -> MachineProfile:
    """Measure this machine with ``ranks`` processes of ``threads`` threads each (default: the cores shared out,
    at least 1; see the module) into a calibrated profile."""
    if ranks < 1 or ranks > 64:
        raise UsageError(f"--ranks {ranks}: give 1 to 64 processes")
    try:
        import torch
    except ImportError:
        from flopcount.errors import DeviceError

        raise DeviceError("calibrate measures through PyTorch, which is not installed: pip install torch") from None
    from .ceilings import load_per_core
    from .devices import cpu_cores, cpu_name

    threads = threads or max(1, cpu_cores() // ranks)
    if ranks == 1:
        before = torch.get_num_threads()
        with tempfile.TemporaryDirectory(prefix="flopcount-calibrate-") as out_dir:
            try:
                measure_rank(0, 1, 0, sizes, out_dir, threads)
            finally:
                torch.set_num_threads(before)
            with open(os.path.join(out_dir, "result.json"), encoding="utf-8") as f:
                raw = json.load(f)
    else:
        raw = _spawned(ranks, sizes, timeout_s, threads)
    compute = {k: tuple(Point(*map(float, row)) for row in raw[k])
               for k in ("gemm", "gemm_in_cache", "elementwise", "reduction", "attention", "attention_backward",
                         "dropout", "elementwise_fresh", "copy", "softmax", "softmax_backward", "cross_entropy",
                         "cross_entropy_backward")}
    if raw.get("fsdp_copy"):
        compute["fsdp_copy"] = tuple(Point(*map(float, row)) for row in raw["fsdp_copy"])
    optimizers = {k: OptimizerCost(Point(*map(float, o["per_tensor_s"])),
                                   tuple(Point(*map(float, row)) for row in o["per_element_s"]), o["foreach"])
                  for k, o in raw["optimizers"].items()}
    overhead = {k: Point(*map(float, raw["overhead"][k])) for k in ("forward", "backward")}
    collectives, in_step = ({kind: _fitted(kind, ranks, rows) for kind, rows in raw.get(key, {}).items()}
                            for key in ("collectives", "collectives_in_step"))
    groups = {int(g): {kind: _fitted(kind, int(g), rows) for kind, rows in kinds.items()}
              for g, kinds in raw.get("collectives_in_step_groups", {}).items()}
    peak = max(p.best for p in compute["gemm_in_cache"])
    machine = {"cpu": cpu_name(), "cores": cpu_cores(), "threads_per_rank": raw["threads"],
               "method": CALIBRATION_METHOD,
               **{k: raw[k] for k in ("collectives_in_step_clock", "collectives_in_step_groups_s",
                                      "optimizer_flush_bytes") if k in raw}}
    return MachineProfile(True, "cpu", ranks, compute, overhead, collectives, peak, "fp32",
                          datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                          torch.__version__, machine,
                          ("measured by flopcount calibrate; peak_flops_per_s is the best GEMM repeat with its operands "
                           "in cache (compute.gemm_in_cache); compute.gemm times each product with its operands out of the "
                           "last-level cache, as a step's products find their weights",),
                          load_per_core(), optimizers, in_step or None, collectives_in_step_groups=groups or None)


def _fitted(kind: str, ranks: int, rows: list) -> Collective:
    """A collective's timed rows as points and their fit."""
    pts = tuple(Point(*map(float, row)) for row in rows)
    n = 2 if kind == "send_recv" else ranks  # a send and its receive: two ranks, whatever the group
    return Collective(n, pts, fit_segments(kind, n, pts))
