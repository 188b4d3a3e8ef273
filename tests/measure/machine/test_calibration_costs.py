"""The profile's optimizer timing and fused attention: a profile with them reads back equal, one taken before they
were measured loads with ``optimizers`` null, every damaged figure is refused with one line (exit 12), and a quick
calibration measures them at the sizes asked (the attention's effective size ∛(S²·D) written out), and torch's
dropout at the rate the test finds for the same call."""

from __future__ import annotations

import json
import math

import pytest

from flopcount.errors import MeasurementError
from flopcount.measure.machine import calibration as cal


def _with_optimizers() -> dict:
    doc = cal.device_profile("H100", 8).as_dict()
    point = {"size": 1, "median": 2e-5, "best": 1.5e-5, "slowest": 3e-5}
    doc["optimizers"] = {"adamw": {"per_tensor_s": dict(point),
                                   "per_element_s": [{"size": 4096, "median": 2e-9, "best": 1e-9, "slowest": 3e-9}],
                                   "foreach": False}}
    return doc


def test_optimizers_read_back_and_absent_is_null():
    doc = _with_optimizers()
    p = cal.profile_from_dict(doc)
    adamw = p.optimizers["adamw"]
    assert adamw.per_tensor_s.best == 1.5e-5 and adamw.per_element_s[0].size == 4096 and adamw.foreach is False
    assert cal.profile_from_dict(json.loads(json.dumps(p.as_dict()))) == p
    del doc["optimizers"]
    assert cal.profile_from_dict(doc).optimizers is None
    doc["optimizers"] = None
    assert cal.profile_from_dict(doc).optimizers is None


@pytest.mark.parametrize("path, value, words", [
    ((), [], "'optimizers' is not an object"),
    (("adamw", "foreach"), "yes", "optimizers.adamw is not one of"),
    (("adagrad",), None, "optimizers.adagrad is not one of"),
    (("adamw", "per_element_s"), [], "per_element_s has no points"),
    (("adamw", "per_tensor_s", "best"), 0.0, "has a time of 0"),
    (("adamw", "per_tensor_s", "median"), math.nan, "numbers >= 0"),
    (("adamw", "per_element_s", 0, "slowest"), -1e-9, "numbers >= 0"),
    (("adamw", "per_element_s", 0, "best"), 0, "has a time of 0"),
], ids=["not-object", "foreach-text", "unknown", "no-points", "zero-tensor", "nan", "negative", "zero-element"])
def test_damaged_optimizer_timing_is_refused_with_one_line(path, value, words):
    doc = _with_optimizers()
    if not path:
        doc["optimizers"] = value
    else:
        d = doc["optimizers"]
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    with pytest.raises(MeasurementError) as e:
        cal.profile_from_dict(doc, "p.json")
    assert words in str(e.value) and "\n" not in str(e.value) and e.value.exit_code == 12


def test_quick_calibration_times_attention_and_optimizers():
    torch = pytest.importorskip("torch")
    from torch.optim.optimizer import _default_to_fused_or_foreach

    from flopcount.measure.machine.calibrate import QUICK_SIZES, calibrate

    p = calibrate(1, QUICK_SIZES, threads=1)
    # how it was timed, and the bytes written before each optimizer step (the quick sizes' own, one rank)
    assert p.machine["method"] == cal.CALIBRATION_METHOD
    assert p.machine["optimizer_flush_bytes"] == QUICK_SIZES.optimizer_flush
    sizes = [(s * s * d) ** (1 / 3) for s, d in QUICK_SIZES.attention]
    for kind in ("attention", "attention_backward"):
        assert [pt.size for pt in p.compute[kind]] == pytest.approx(sizes)
        assert all(0 < pt.slowest <= pt.median <= pt.best for pt in p.compute[kind])  # rates
    foreach = _default_to_fused_or_foreach([torch.zeros(1, requires_grad=True)], differentiable=False,
                                           use_fused=False)[1]
    assert set(p.optimizers) == set(cal.OPTIMIZERS_TIMED)
    for o in p.optimizers.values():
        assert o.foreach is bool(foreach)
        assert 0 < o.per_tensor_s.best <= o.per_tensor_s.median <= o.per_tensor_s.slowest  # seconds
        assert [pt.size for pt in o.per_element_s] == list(QUICK_SIZES.optimizer_elements)
    # torch's dropout, timed here too at the largest size: the calibrated rate (elements/s) is that of the same call
    n = QUICK_SIZES.elementwise[-1] // 4
    assert [pt.size for pt in p.compute["dropout"]] == [b // 4 for b in QUICK_SIZES.elementwise]
    x = torch.randn(n)
    fastest = min(_seconds(lambda: torch.nn.functional.dropout(x, 0.1, True)) for _ in range(7))
    assert n / fastest / 3 <= p.compute["dropout"][-1].best <= 3 * n / fastest
    # elementwise work into fresh memory, timed at the elementwise sizes, as rates
    assert [pt.size for pt in p.compute["elementwise_fresh"]] == [pt.size for pt in p.compute["elementwise"]]
    assert all(0 < pt.slowest <= pt.median <= pt.best for pt in p.compute["elementwise_fresh"])
    # on one thread, as the calibration ran (two threads wait on each other when other work shares the cores)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # a copy (torch.cat of two halves of rows of 64): twice its output's bytes over the seconds of the same call
        # as a step runs it (its inputs among 64 MiB of tensors, its outputs kept)
        rows = QUICK_SIZES.elementwise[-1] // 16 // 32
        assert [pt.size for pt in p.compute["copy"]] == [b // 16 // 32 * 16 * 32 for b in QUICK_SIZES.elementwise]
        halves = [torch.ones(rows, 32) for _ in range(64 * 2**20 // (128 * rows))]
        # (within 6 times: either process's outputs may take pages new from the system where the other's reuse them,
        # as the C library's thresholds stand in each, 2 to 3.5 times slower measured)
        fastest = _in_a_step(lambda i: torch.cat((halves[i], halves[i - 1]), dim=-1), len(halves))
        assert 2 * (rows * 64 * 4) / fastest / 6 <= p.compute["copy"][-1].best <= 6 * 2 * (rows * 64 * 4) / fastest
        # torch's softmax over rows of 512 and its backward, as FLOP/s of R·(5n − 2) and R·(4n − 1) FLOPs
        rows = [max(1, b // 4 // 512) for b in QUICK_SIZES.elementwise]
        assert [pt.size for pt in p.compute["softmax"]] == [r * (5 * 512 - 2) for r in rows]
        assert [pt.size for pt in p.compute["softmax_backward"]] == [r * (4 * 512 - 1) for r in rows]
        xs = [torch.randn(rows[-1], 512) for _ in range(64 * 2**20 // (2048 * rows[-1]))]
        fastest = _in_a_step(lambda i: torch.softmax(xs[i], -1), len(xs))
        flops = rows[-1] * (5 * 512 - 2)
        assert flops / fastest / 6 <= p.compute["softmax"][-1].best <= 6 * flops / fastest
        # torch's cross-entropy over the same rows, a class a row, as FLOP/s of the count's SoftmaxCrossEntropyLoss:
        # R·(5n − 1) for the log-softmax, R negations, R − 1 additions and a division for the mean; backward
        # R·(2n + 1) + 1
        assert [pt.size for pt in p.compute["cross_entropy"]] == [r * (5 * 512 + 1) for r in rows]
        assert [pt.size for pt in p.compute["cross_entropy_backward"]] == [r * (2 * 512 + 1) + 1 for r in rows]
        target = torch.randint(0, 512, (rows[-1],))
        fastest = _in_a_step(lambda i: torch.nn.functional.cross_entropy(xs[i], target), len(xs))
        flops = rows[-1] * (5 * 512 + 1)
        assert flops / fastest / 6 <= p.compute["cross_entropy"][-1].best <= 6 * flops / fastest
    finally:
        torch.set_num_threads(threads)
    assert all(0 < pt.slowest <= pt.median <= pt.best for pt in p.compute["softmax_backward"])
    assert all(0 < pt.slowest <= pt.median <= pt.best for pt in p.compute["cross_entropy_backward"])
    assert cal.profile_from_dict(json.loads(json.dumps(p.as_dict()))) == p


def _in_a_step(call, n: int) -> float:
    """The best over 7 repeats of the mean seconds of ``call(i)`` for i over n inputs, every output kept until the
    repeat ends (from a warm-up repeat on)."""
    import time

    best = math.inf
    for _ in range(8):
        t0 = time.perf_counter()
        kept = [call(i) for i in range(n)]
        best = min(best, (time.perf_counter() - t0) / n)
        del kept
    return best


def _seconds(fn) -> float:
    import time

    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def test_optimizer_elements_timed_over_a_set_larger_than_one_tensor(monkeypatch):
    """Each per-element size n is stepped over max(1, held // n) tensors of n elements (a model's whole state, out of
    cache), and its seconds per element are the step's less that many per-tensor costs, over their elements: with
    the clock stepping 1 s per tensor and 1 ms per element, a point of n elements is 1 ms less the one-element
    tensors' millisecond (within the per-tensor cost) spread over its n."""
    torch = pytest.importorskip("torch")
    from flopcount.measure.machine import calibrate as cb

    held, elements = 2**12, (2**8, 2**10, 2**13)
    seen: list[list[int]] = []
    clock = [0.0]

    def counted(base):
        class Counted(base):
            def __init__(self, params, **kw):
                params = list(params)
                seen.append([p.numel() for p in params])
                super().__init__(params, **kw)

            def step(self, closure=None):
                clock[0] += sum(1.0 + 1e-3 * p.numel() for g in self.param_groups for p in g["params"])

        return Counted

    for name in ("SGD", "Adam", "AdamW"):
        monkeypatch.setattr(torch.optim, name, counted(getattr(torch.optim, name)))
    monkeypatch.setattr(cb.time, "perf_counter", lambda: clock[0])
    out = cb._optimizers(3, elements, held)
    per_optimizer = [[1] * 64] + [[n] * max(1, held // n) for n in elements]
    assert seen == per_optimizer * len(cal.OPTIMIZERS_TIMED)  # 16, 4 and 1 tensors of the three sizes
    for o in out.values():
        assert o["per_tensor_s"][1:] == pytest.approx([1.0 + 1e-3] * 3)  # a one-element tensor's second and 1 ms
        # k tensors: k·(1 s + n ms) less k·(1 s + 1 ms), over k·n elements
        assert o["per_element_s"] == [pytest.approx([n, *[1e-3 * (n - 1) / n] * 3]) for n in elements]


def test_a_buffer_is_written_before_each_optimizer_step_outside_its_timing(monkeypatch):
    """With a flush of 4 KiB, a buffer of 1024 float32 is made once and 1 added to it before every step: 2 warm-up
    and 3 timed steps of the one-element tensors and of each of 2 sizes, for each optimizer timed, so each element
    ends at 4 · 3 · 5 = 60. The clock reads the steps alone: the per-tensor second of a one-element tensor is
    unchanged by the flush."""
    torch = pytest.importorskip("torch")
    from flopcount.measure.machine import calibrate as cb

    made, clock = [], [0.0]
    zeros = torch.zeros

    def recorded(*shape, **kw):
        t = zeros(*shape, **kw)
        made.append(t)
        return t

    class Counted(torch.optim.SGD):
        def step(self, closure=None):
            clock[0] += sum(1.0 for g in self.param_groups for _ in g["params"])

    for name in ("SGD", "Adam", "AdamW"):
        monkeypatch.setattr(torch.optim, name, lambda ps, **kw: Counted(ps, lr=1e-3))
    monkeypatch.setattr(torch, "zeros", recorded)
    monkeypatch.setattr(cb.time, "perf_counter", lambda: clock[0])
    out = cb._optimizers(3, (2**4, 2**6), 2**6, flush_bytes=4096)
    flushes = [t for t in made if t.numel() == 1024]
    assert len(flushes) == 1 and bool((flushes[0] == 4 * 3 * 5).all())
    assert all(o["per_tensor_s"][1:] == pytest.approx([1.0] * 3) for o in out.values())


def test_the_flush_is_the_last_level_cache_shared_out_among_the_ranks(monkeypatch):
    from flopcount.measure.machine import calibrate as cb
    from flopcount.measure.machine import devices

    monkeypatch.setattr(devices, "last_level_cache_bytes", lambda: 480 * 2**20)
    assert cb.optimizer_flush_bytes(cb.DEFAULT_SIZES, 1) == 480 * 2**20
    assert cb.optimizer_flush_bytes(cb.DEFAULT_SIZES, 4) == 120 * 2**20
    monkeypatch.setattr(devices, "last_level_cache_bytes", lambda: None)  # not said: more than today's caches
    assert cb.optimizer_flush_bytes(cb.DEFAULT_SIZES, 2) == cb.UNKNOWN_CACHE_FLUSH // 2 == 256 * 2**20
    assert cb.optimizer_flush_bytes(cb.QUICK_SIZES, 1) == cb.QUICK_SIZES.optimizer_flush
