"""The liveness walk's record (:mod:`flopcount.memory.tape`): its replay from running sums against the replay stretch
by stretch, on records made up here and on the walks of every rank of a small Llama under several plans."""

from __future__ import annotations

import random

import pytest

from flopcount.memory.tape import Replayed, Tape, Walk


def _record(rng: random.Random) -> Tape:
    """A made-up record: names, gradients and statistics added and freed between marks, some terms read often."""
    tape = Tape("backward")
    for i in range(rng.randrange(0, 40)):
        for _ in range(rng.randrange(0, 5)):
            kind = rng.choice(("add", "free", "grad", "extra", "unextra"))
            if kind == "add":
                tape.add(f"t{rng.randrange(12)}")
            elif kind == "free":
                tape.add(f"t{rng.randrange(12)}", -1)
            elif kind == "grad":
                tape.grad(f"w{rng.randrange(5)}")
            else:
                tape.extra(rng.randrange(6), 1 if kind == "extra" else -1)
        tape.mark(f"node{i}" if rng.random() < 0.9 else None)
    return tape


@pytest.mark.parametrize("seed", range(60))
def test_running_sums_are_the_stepwise_replay(seed):
    rng = random.Random(seed)
    tape = _record(rng)
    sizes = {f"t{i}": rng.choice((0, 1, 7, 2**40 + i)) for i in range(12)}
    grads = {f"w{i}": rng.randrange(1000) for i in range(5)}
    extra = {k: rng.randrange(50) for k in range(6)}
    start = Walk(live=rng.randrange(100), peak=rng.choice((0, 150, 10**15)))
    fast, slow = Walk(**start.__dict__), Walk(**start.__dict__)
    tape.replay(fast, sizes.__getitem__, grads.__getitem__, extra)
    tape.replay_stepwise(slow, sizes.__getitem__, grads.__getitem__, extra)
    assert fast == slow
    # replayed again on other sizes (the flattened record is kept): still the same
    sizes = {k: v * 3 + 1 for k, v in sizes.items()}
    tape.replay(fast, sizes.__getitem__, grads.__getitem__, extra)
    tape.replay_stepwise(slow, sizes.__getitem__, grads.__getitem__, extra)
    assert fast == slow


@pytest.mark.parametrize("seed", range(20))
def test_sums_past_64_bits_are_the_stepwise_replay(seed):
    """Sizes whose running sums reach 2**63, where 64-bit integers would wrap, and sizes below: the replay from
    no bytes alive is the stepwise one, to the byte."""
    rng = random.Random(seed)
    tape = _record(rng)
    for big in (2**62, 2**70, 2**20):
        sizes = {f"t{i}": rng.choice((0, 7, big + i, big // 3)) for i in range(12)}
        grads = {f"w{i}": rng.choice((0, big)) for i in range(5)}
        extra = {k: rng.randrange(50) for k in range(6)}
        assert tape.replayed(sizes.__getitem__, grads.__getitem__, extra) == \
            stepwise_replayed(tape, sizes.__getitem__, grads.__getitem__, extra)


def stepwise_replayed(tape: Tape, nbytes, grad_size, extra, known=None) -> Replayed:
    """:meth:`Tape.replayed` from :meth:`Tape.replay_stepwise`: the walk from no bytes alive, stretch by stretch,
    its peak below any mark's at first (None where no mark raised it); every size asked of ``nbytes`` (``known``
    unread)."""
    below = -(2**80)
    w = Walk(live=0, peak=below)
    tape.replay_stepwise(w, nbytes, grad_size, extra)
    return Replayed(None if w.peak == below else w.peak, w.phase if w.peak != below else tape.phase, w.node, w.live)


@pytest.mark.parametrize("seed", range(20))
def test_a_replay_from_any_start_is_the_one_from_none_moved(seed):
    """The walk from a start (and a peak so far) is the walk from no bytes alive moved by the start: the same peak,
    phase, node and end as the stepwise replay from that start."""
    rng = random.Random(seed)
    tape = _record(rng)
    sizes = {f"t{i}": rng.choice((0, 1, 7, 2**40 + i)) for i in range(12)}
    grads = {f"w{i}": rng.randrange(1000) for i in range(5)}
    extra = {k: rng.randrange(50) for k in range(6)}
    once = tape.replayed(sizes.__getitem__, grads.__getitem__, extra)
    assert once == stepwise_replayed(tape, sizes.__getitem__, grads.__getitem__, extra)
    for _ in range(4):
        start = Walk(live=rng.randrange(100), peak=rng.choice((0, 150, 10**15)))
        moved, slow = Walk(**start.__dict__), Walk(**start.__dict__)
        once.apply(moved)
        tape.replay_stepwise(slow, sizes.__getitem__, grads.__getitem__, extra)
        assert moved == slow


@pytest.mark.parametrize("seed", range(20))
def test_sizes_known_are_read_as_asked(seed):
    """A replay reading the names' bytes from ``known`` (some there, some None, some absent: asked of ``nbytes``)
    is the one asking every name of ``nbytes``, and asks it of those not known alone."""
    rng = random.Random(seed)
    tape = _record(rng)
    sizes = {f"t{i}": rng.choice((0, 1, 7, 2**40 + i)) for i in range(12)}
    grads = {f"w{i}": rng.randrange(1000) for i in range(5)}
    extra = {k: rng.randrange(50) for k in range(6)}
    known = {name: rng.choice((b, None)) for name, b in sizes.items() if rng.random() < 0.7}
    asked = []

    def nbytes(name: str) -> int:
        asked.append(name)
        return sizes[name]

    assert tape.replayed(nbytes, grads.__getitem__, extra, known) == \
        stepwise_replayed(tape, sizes.__getitem__, grads.__getitem__, extra)
    assert not {name for name in asked if known.get(name) is not None}


def test_a_term_after_a_replay_is_read():
    tape = Tape("forward")
    tape.add("a")
    tape.mark("n0")
    w = Walk()
    tape.replay(w, {"a": 5, "b": 9}.__getitem__, None, {})
    assert (w.live, w.peak, w.node) == (5, 5, "n0")
    tape.add("b")
    tape.mark("n1")
    w = Walk()
    tape.replay(w, {"a": 5, "b": 9}.__getitem__, None, {})
    assert (w.live, w.peak, w.node) == (14, 14, "n1")


@pytest.fixture(scope="module")
def trained():
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import flopcount
    from flopcount.memory.ledger import MemorySettings

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    return flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train", optimizer="adamw",
                             memory=MemorySettings(device="cpu"))


@pytest.mark.parametrize("text, m, schedule", [
    ("tp=2", 1, "1f1b"), ("pp=2,dp=2,zero2", 2, "gpipe"), ("tp=2,sp,dp=2,fsdp", 2, "1f1b"),
    ("cp=2,zero1", 1, "1f1b"), ("pp=2", 4, "1f1b"),
])
def test_every_rank_is_the_stepwise_walks(trained, monkeypatch, text, m, schedule):
    """Each rank's figures (peak, its phase and node, activations ...) with the replay from running sums are those
    of the replay stretch by stretch, on a copy of the count (nothing the first walks kept is read)."""
    import dataclasses

    from flopcount.memory.ranks import per_rank
    from flopcount.parallel.plan import parse_parallel

    def fresh():
        mem = dataclasses.replace(trained.memory, graph=dataclasses.replace(trained.memory.graph))
        return dataclasses.replace(trained, memory=mem)

    plan = parse_parallel(text, microbatches=m, schedule=schedule)
    fast = per_rank(fresh(), plan).ranks
    monkeypatch.setattr(Tape, "replayed", stepwise_replayed)
    slow = per_rank(fresh(), plan).ranks
    assert [r.as_dict() for r in fast] == [r.as_dict() for r in slow]
    assert len(fast) == plan.tp * plan.pp * plan.ep
