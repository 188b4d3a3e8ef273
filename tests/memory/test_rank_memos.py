"""What the per-rank walks share between plans (:mod:`flopcount.memory.ranks`: a stage's graph at a rank's shares,
its ZeRO shards and units, and its forward and backward replayed from no bytes alive, kept for the next plan of
the same shares): every rank's figures of plans walked one after another on one count, the memos warm, are those
of each plan walked alone on a fresh copy of the count, replayed stretch by stretch (nothing kept is read)."""

from __future__ import annotations

import dataclasses

import pytest

from test_tape import stepwise_replayed

# (plan, microbatches, schedule): the plans of the same shares in turn (sharding, M), as a plan search walks them
PLANS = [
    ("dp=4", 1, "1f1b"), ("dp=4", 2, "1f1b"), ("dp=4,zero1", 2, "1f1b"), ("dp=4,zero2", 1, "1f1b"),
    ("dp=4,zero2", 2, "1f1b"), ("dp=4,fsdp", 1, "1f1b"), ("dp=4,fsdp", 2, "1f1b"), ("dp=2,fsdp", 2, "1f1b"),
    ("tp=2,dp=2", 1, "1f1b"), ("tp=2,dp=2,zero2", 2, "1f1b"), ("tp=2,sp,dp=2,fsdp", 2, "1f1b"),
    ("tp=2,sp,dp=2", 1, "1f1b"), ("tp=2,sp=megatron,dp=2,zero1", 2, "1f1b"),
    ("pp=2,dp=2", 2, "1f1b"), ("pp=2,dp=2", 4, "gpipe"), ("pp=2,dp=2,fsdp", 2, "1f1b"), ("pp=2,dp=2,zero2", 2, "1f1b"),
    ("pp=2", 4, "interleaved:2"), ("tp=2,pp=2,sp", 2, "1f1b"),
    ("cp=2,dp=2,zero1", 1, "1f1b"), ("cp=2,dp=2,fsdp", 2, "1f1b"), ("cp=2,dp=2", 2, "1f1b"),
]


@pytest.fixture(scope="module", params=["none", "full", "selective"])
def trained(request):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import flopcount
    from flopcount.memory.ledger import MemorySettings

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    return flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train", optimizer="adamw",
                             memory=MemorySettings(device="cpu", recompute=request.param))


def test_plans_walked_in_turn_are_each_walked_alone(trained, monkeypatch):
    from flopcount.memory.ranks import per_rank
    from flopcount.memory.tape import Tape
    from flopcount.parallel.plan import parse_parallel

    plans = [parse_parallel(text, microbatches=m, schedule=schedule) for text, m, schedule in PLANS]
    warm = [per_rank(trained, plan).ranks for plan in plans]
    again = [per_rank(trained, plan).ranks for plan in plans]  # every part found in the memos
    monkeypatch.setattr(Tape, "replayed", stepwise_replayed)
    _unkept(monkeypatch)
    for plan, fast, faster in zip(plans, warm, again):
        alone = per_rank(_fresh(trained), plan).ranks
        assert [r.as_dict() for r in fast] == [r.as_dict() for r in alone], plan
        assert [r.as_dict() for r in faster] == [r.as_dict() for r in alone], plan
    # the plans differ: the memos are not read across what changes a rank's figures
    peaks = {plan: tuple(r.peak_bytes for r in ranks) for plan, ranks in zip(plans, warm)}
    assert len(set(peaks.values())) > len(plans) // 2


def _fresh(report, **memory):
    """``report`` with a copy of its memory graph whose node list, tensors, saved records and gradients' flags are
    new objects (no memo of the count's graph, nor one shared with it, is read: memo_of), ``memory``'s fields
    replaced."""
    g = report.memory.graph
    graph = dataclasses.replace(g, nodes=list(g.nodes), tensors=dict(g.tensors), saved=dict(g.saved),
                                grads=dict(g.grads))
    return dataclasses.replace(report, memory=dataclasses.replace(report.memory, graph=graph, **memory))


@pytest.fixture(scope="module")
def policies():
    """A small Llama counted under each recompute policy, the graphs holding the first's node list, tensors, saved
    records and gradients' flags (as ``flopcount plan``'s counts hold them)."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("torch")
    import flopcount
    from flopcount.cli.plan import _shared_graph
    from flopcount.memory.ledger import MemorySettings

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=64)
    counts = [flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train", optimizer="adamw",
                                memory=MemorySettings(device="cpu", recompute=policy))
              for policy in ("none", "full", "selective")]
    return [counts[0]] + [dataclasses.replace(c, memory=_shared_graph(c.memory, counts[0].memory)) for c in counts[1:]]


def test_the_policies_share_what_reads_no_recompute_unit(policies, monkeypatch):
    """The memos of the policies' graphs share what reads no recompute unit (the stages' tensors at a rank's shares,
    the stored shares, the stage states); the plans walked policy after policy, the memos warm, are each the plan
    walked alone on a fresh copy of its count (replayed stretch by stretch, nothing kept read)."""
    from flopcount.memory.rank_memo import memo_of
    from flopcount.memory.ranks import per_rank, stage_states
    from flopcount.memory.tape import Tape
    from flopcount.parallel.plan import parse_parallel

    graphs = [c.memory.graph for c in policies]
    assert graphs[1].nodes is graphs[0].nodes and graphs[1].units != graphs[0].units
    plans = [parse_parallel(text, microbatches=m, schedule=schedule) for text, m, schedule in PLANS]
    warm = [(per_rank(c, plan).ranks, stage_states(c, plan)) for plan in plans for c in policies]
    assert memo_of(graphs[2]).tensors is memo_of(graphs[0]).tensors and memo_of(graphs[0]).tensors
    assert memo_of(graphs[2]).walks is not memo_of(graphs[0]).walks
    monkeypatch.setattr(Tape, "replayed", stepwise_replayed)
    _unkept(monkeypatch)
    alone = [(per_rank(_fresh(c), plan).ranks, stage_states(_fresh(c), plan)) for plan in plans for c in policies]
    for (fast, states), (slow, want) in zip(warm, alone):
        assert [r.as_dict() for r in fast] == [r.as_dict() for r in slow]
        assert states == want


def test_stage_states_are_the_counts_whatever_was_asked_of_its_graph(trained):
    """The stage states of one graph counted with other optimizers and master weights (the same graph, so its
    memos): each that of a fresh copy of that count."""
    from flopcount.memory.ranks import stage_states
    from flopcount.parallel.plan import parse_parallel

    plan = parse_parallel("pp=2,dp=2,zero1", microbatches=2)
    settings = trained.memory.settings
    asked = [{}, {"optimizer": "sgd"}, {"optimizer": "momentum"},
             {"settings": dataclasses.replace(settings, master_weights=True)},
             {"settings": dataclasses.replace(settings, implementation="foreach")}]
    for memory in asked * 2:
        count = dataclasses.replace(trained, memory=dataclasses.replace(trained.memory, **memory))
        assert stage_states(count, plan) == stage_states(_fresh(trained, **memory), plan), memory


class _Unkept(dict):
    """A memo that keeps nothing: every answer found anew."""

    def __setitem__(self, key, value) -> None:
        pass


def _unkept(monkeypatch) -> None:
    """The module-wide memos of :mod:`flopcount.memory.ranks` (the shares by shape, the statistics by record)
    keeping nothing, so that a walk finds each share itself."""
    from flopcount.memory import ranks

    monkeypatch.setattr(ranks, "_SIZED", _Unkept())
    monkeypatch.setattr(ranks, "_SCALED", _Unkept())


def test_a_share_is_its_own_whatever_was_sized_before():
    """A tensor's share (⌈elements · mul / div⌉ elements, flattened) and bytes, written out, asked after tensors of
    the same shape and other names, types, divisors or multipliers: each its own name, type and size."""
    from flopcount.context import TensorInfo
    from flopcount.memory.ranks import _resized, _sized

    asked = [(TensorInfo("a", 1, (3, 5, 7)), 2, 1, 53, 212), (TensorInfo("b", 1, (3, 5, 7)), 2, 1, 53, 212),
             (TensorInfo("c", 10, (3, 5, 7)), 2, 1, 53, 106), (TensorInfo("d", 1, (3, 5, 7)), 4, 1, 27, 108),
             (TensorInfo("e", 1, (3, 5, 7)), 4, 3, 79, 316), (TensorInfo("f", 7, (3, 5, 7)), 1, 1, 105, 840)]
    for info, div, mul, elements, nbytes in asked * 2:
        share, found = _sized(info, div, mul)
        assert share == TensorInfo(info.name, info.elem_type, (elements,)) and found == nbytes
        assert _resized(info, div, mul) == share
    for info in (TensorInfo("g", 1, (3, "N")), TensorInfo("h", 0, (3, 5, 7)), TensorInfo("i", 1)):
        assert _sized(info, 2) == (info, None)  # of unknown size: itself


def test_statistics_scaled_are_their_own_whatever_was_scaled_before():
    """A node's statistics at a rank's share, each ⌈bytes · mul / div⌉, asked after equal records at other
    shares."""
    from flopcount.memory.ranks import _scaled
    from flopcount.saved import Saved

    record = Saved(inputs=(0,), extra=(("mask", 10), ("stats", 7)))
    for mul, div, extra in [(1, 2, (5, 4)), (1, 4, (3, 2)), (3, 4, (8, 6)), (1, 1, (10, 7))] * 2:
        scaled, nbytes = _scaled(Saved(inputs=(0,), extra=record.extra), mul, div)
        assert scaled == Saved(inputs=(0,), extra=(("mask", extra[0]), ("stats", extra[1]))) and nbytes == sum(extra)
    assert _scaled(Saved(inputs=(1,), extra=record.extra), 1, 2)[0].inputs == (1,)


def test_each_stage_walk_keeps_its_own_trained_tensors_in_the_graphs_order(trained):
    """A stage's walk structure keeps the trained tensors its optimizer steps (:func:`flopcount.memory.ledger.ledger`
    reads them from there on the next walk of the stage): the stage's own, in the count's tensors' order."""
    from flopcount.memory.rank_memo import memo_of
    from flopcount.memory.ranks import per_rank
    from flopcount.parallel.plan import parse_parallel

    fresh = _fresh(trained)
    g = fresh.memory.graph
    for text in ("pp=2,dp=2", "pp=2,dp=2,zero1"):  # the second walks from the first's structures
        per_rank(fresh, parse_parallel(text, microbatches=2))
    walks = memo_of(g).walks
    assert len(walks) == 2  # one structure per stage
    expected = []
    for (keep, _), structure in walks.items():
        read = {x.name for k in keep for x in g.nodes[k].inputs if x is not None}
        expected.append([n for n in g.tensors if n in g.trainable and n in read])
        assert structure["trained"] == expected[-1]
    assert expected[0] and expected[1] and not set(expected[0]) & set(expected[1])
