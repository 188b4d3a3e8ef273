"""What the prediction of a plan shares with the plans before it and between its own ranks (each node's work found
once per node and share, a chunk's works held as one tuple per content and timed once, a stage's optimizer tensors
once per share, the ledger's node shares once per node's figures and its optimizer elements once per what they
read) is what each plan finds alone, on a count whose node lists, scopes and parameters are new objects (nothing
found before is read), to the bit; a rank's compute seconds are its nodes' seconds summed chunk by chunk in order,
each node timed on its own; and a rank's optimizer elements and its stage's data-parallel gradient bytes (summed
once per kind of module) are the sums over its stage's modules one by one."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import fresh_nodes, tiny_llama

# (plan, microbatches, schedule, recompute): the plans of the same shares one after another, as a search asks them
# (other sharding, M and schedule on the same shares), then other shares
PLANS = [("tp=2,sp", 1, "1f1b", "none"), ("tp=2,sp,dp=2,zero1", 2, "1f1b", "none"),
         ("tp=2,pp=2", 4, "1f1b", "full"), ("tp=2,pp=2,zero1,dp=2", 4, "gpipe", "full"),
         ("tp=2,pp=2,dp=2,zero2", 2, "1f1b", "full"), ("tp=2,pp=2,dp=2,fsdp", 2, "1f1b", "selective"),
         ("pp=2,dp=2", 4, "interleaved:2", "none"), ("pp=2,dp=2,zero1", 2, "interleaved:2", "non-reentrant"),
         ("tp=4", 2, "1f1b", "none"), ("tp=4,sp,cp=2", 2, "1f1b", "full"), ("dp=4,fsdp", 2, "1f1b", "none")]


def _alone(report):
    """A copy of ``report`` whose node and scope lists and parameter tables are new objects."""
    modules = dataclasses.replace(report.modules, nodes=tuple(list(report.modules.nodes)),
                                  params=dict(report.modules.params), parameters=frozenset(report.modules.parameters))
    return dataclasses.replace(report, nodes=fresh_nodes(report.nodes), modules=modules)


def _predicted(report, text, m, schedule, recompute, profile):
    """(the ledger, the prediction's work, its point) as a plan search predicts a plan."""
    from flopcount.measure.predict import predict_point, work_of
    from flopcount.parallel.plan import parse_parallel, parse_recompute
    from flopcount.parallel.ranks import ledger

    plan = parse_parallel(text, m, schedule)
    led = ledger(report, plan, parse_recompute(recompute), replicas=plan.ep > 1)
    work = work_of(dataclasses.replace(report, parallel=led))
    return led, work, predict_point(work, profile)


def _compute_seconds(work, profile):
    """Each rank's compute seconds a step: its chunks' nodes each timed on its own (node_seconds at the median
    repeats), summed in order per chunk, the chunks' forwards then backwards summed, M times."""
    from flopcount.measure.predict import node_seconds

    out = []
    for r in work.ranks:
        fwd, bwd = {}, {}
        for c, nodes in r.chunks.items():
            f = b = 0.0
            for w in nodes:
                nf, nb, _ = node_seconds(w, profile, "median")
                f += nf
                b += nb
            fwd[c], bwd[c] = f, b
        out.append(work.plan["microbatches"] * (sum(fwd.values()) + sum(bwd.values())))
    return out


def _optimizer_elements(report, plan, ranks):
    """Each rank's optimizer elements (held, of which redundant), module by module of its stage (the optimizer
    ledger's rules for a model without experts: the module's elements on its TP rank, Layout.elements, then 1/(D·C)
    of its own and of its copy under a sharding; without one, all of them redundant past the first replica)."""
    from flopcount.parallel.layout import layout_of, split

    layout = layout_of(report, plan)
    rows = layout.stage_params(report.modules.params)
    out = []
    for r in ranks:
        held = redundant = 0
        place = r.coords["cp"] + plan.cp * r.coords["dp"]  # the rank's place among the D·C ranks
        for _, share, n in rows.get(r.stage, ()):
            x, copy = layout.elements(share, n, r.coords["tp"])
            if plan.zero_stage:
                own, copy = split(x - copy, plan.dp * plan.cp, place), split(copy, plan.dp * plan.cp, place)
                x = own + copy
            elif place:
                copy = x
            held += x
            redundant += copy
        out.append((held, redundant))
    return out


def _gradient_bytes(report, plan, led):
    """Each stage's gradient bytes reduced over the data-parallel ranks a step (ZeRO-2: a microbatch), module by
    module: what TP rank 0 holds of each (Layout.elements) at the parameters' bytes."""
    from flopcount.parallel.layout import layout_of

    layout = layout_of(report, plan)
    rows = layout.stage_params(report.modules.params)
    return [led.dims["param_bytes"] * sum(layout.elements(share, n, 0)[0] for _, share, n in rows.get(s, ()))
            for s in range(plan.pp)]


def _check_elements(report, plan, led):
    """The ledger's optimizer FLOPs and data-parallel gradient bytes per rank are the module-by-module sums."""
    from flopcount.parallel.optimizer import per_element

    each = per_element(report)
    assert [(r.optimizer_flops, r.optimizer_redundant_flops) for r in led.ranks] == [
        (each * x, each * y) for x, y in _optimizer_elements(report, plan, led.ranks)]
    if plan.dp * plan.cp > 1 and not plan.fsdp:
        kind, times = ("reduce_scatter", plan.microbatches) if plan.zero2 else ("all_reduce", 1)
        found = {r.stage: [c.bytes for c in r.communication if c.kind == kind and c.group in ("dp", "dp_cp")]
                 for r in led.ranks}
        assert [found[s] for s in range(plan.pp)] == [[times * g] for g in _gradient_bytes(report, plan, led)]


def _check(report, plans, profile):
    from flopcount.measure.predict import predict_work
    from flopcount.parallel.plan import parse_parallel

    shared_chunks = 0
    for text, m, schedule, recompute in plans:
        led, work, point = _predicted(report, text, m, schedule, recompute, profile)
        alone = _predicted(_alone(report), text, m, schedule, recompute, profile)
        ranks = led.ranks
        assert ranks == alone[0].ranks, text
        if report.moe is None:
            _check_elements(report, parse_parallel(text, m, schedule), led)
        assert work == alone[1], text
        assert point == alone[2], text
        assert [row["compute_seconds"] for row in predict_work(work, profile).ranks] == \
            _compute_seconds(work, profile), text
        chunks = [nodes for r in work.ranks for nodes in r.chunks.values()]
        shared_chunks += len(chunks) - len({id(nodes) for nodes in chunks})
        if any(r.optimizer for r in work.ranks):  # the optimizer step's tensors read (a profile that times them)
            assert all(r.optimizer_tensors for r in work.ranks), text
    return shared_chunks


def test_the_shared_work_is_each_plans_alone():
    pytest.importorskip("transformers")
    from flopcount.measure.machine.calibration import device_profile

    report = tiny_llama(32, 4, 4, 2, 64, 128, (2, 16), optimizer="adamw")
    # the TP ranks of an even split run the same works: one tuple, timed once
    assert _check(report, PLANS, device_profile("H100", 8)) > 10


def test_the_shared_work_of_experts_is_each_plans_alone():
    pytest.importorskip("transformers")
    import transformers

    import flopcount
    from flopcount.measure.machine.calibration import device_profile

    config = transformers.MixtralConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, num_key_value_heads=2, vocab_size=128,
                                        num_local_experts=4, num_experts_per_tok=2)
    report = flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train", optimizer="adamw")
    plans = [("dp=2,ep=2", 2, "1f1b", "none"), ("dp=2,ep=2,zero1", 2, "1f1b", "none"),
             ("tp=2,dp=2,ep=2", 2, "1f1b", "full"), ("pp=2,dp=2,ep=2", 2, "gpipe", "none")]
    _check(report, plans, device_profile("H100", 8))


def test_a_work_split_over_the_sequence_is_its_own_whatever_was_split_before():
    """A node's work under cp ranks (its FLOPs 1/C, its bytes 1/C but the whole ones), written out here, asked for
    chunks holding the same works (a chunk's layers) at other C and after other works: each its own figures."""
    from flopcount.measure.predict import NodeWork
    from flopcount.measure.predict_report import _split_context

    a = NodeWork("gemm", 120.0, 60.0, 240.0, 120.0, 1.0, 2.0, 12.0)
    b = NodeWork("attention", 48.0, 36.0, 96.0, 0.0, 4.0, 2.0, 24.0)
    chunks = [{0: (a, b, a), 1: (b, a)}, {0: (b, b), 1: (a,)}]
    for cp in (2, 4, 2, 3, 1) * 2:
        for asked in chunks:
            for c, works in _split_context(asked, cp).items():
                assert works == tuple(NodeWork(w.kind, w.flops / cp, (w.bytes - w.whole_bytes) / cp + w.whole_bytes,
                                               w.backward_flops / cp, w.recompute_flops / cp, w.matrices,
                                               w.backward_kernels, w.whole_bytes) for w in asked[c]), (cp, c)
