"""Context parallelism's collectives as the predictor prices them: in each attention layer's forward an
``all_gather`` of the whole sequence's K and V (group ``cp``), in its backward a ``reduce_scatter`` of their
gradients, and a recompute's rerun gathering again in the backward, as ``benchmarks/step_time_cp.py`` runs them on
gloo; against closed forms written here on a Llama-like model (L layers, KV K/V heads of D dims, M microbatches of
b×s tokens, fp32)."""

from __future__ import annotations

import dataclasses

import pytest

from helpers import collectives_profile, tiny_llama

L, HEADS, KV, H, B, S, M = 4, 4, 2, 32, 2, 8, 3
D = H // HEADS
KV_BYTES = 2 * B * S * KV * D * 4  # one layer's K and V of the whole sequence: what one call gathers
LAT, BW = 40e-6, 2e9  # every collective's latency and bus bandwidth


@pytest.fixture(scope="module")
def report():
    pytest.importorskip("transformers")
    return tiny_llama(H, L, HEADS, KV, 64, 128, (B, S))


def _work(report, plan="cp=2", recompute=None):
    from flopcount.measure.predict import work_of
    from flopcount.parallel.plan import parse_parallel
    from flopcount.plans import parallel_ledger

    led = parallel_ledger(report, parse_parallel(plan, M, "1f1b"), recompute)
    return work_of(dataclasses.replace(report, parallel=led)), led


def _calls(rank):
    return sorted((x.kind, x.phase, x.count, x.bytes, x.ranks) for x in rank.messages if x.group == "cp")


def test_a_step_is_a_gather_and_a_scatter_a_layer_and_microbatch(report):
    """M·L gathers of one layer's K and V in the forward, M·L reduce-scatters of their gradients in the backward,
    on each of the 2 ranks; their bytes the ledger's."""
    work, led = _work(report)
    for r, listed in zip(work.ranks, led.ranks):
        assert _calls(r) == [("all_gather", "forward", M * L, KV_BYTES, 2),
                             ("reduce_scatter", "backward", M * L, KV_BYTES, 2)]
        assert {c.kind: c.bytes for c in listed.communication if c.group == "cp"} == {
            "all_gather": M * L * KV_BYTES, "reduce_scatter": M * L * KV_BYTES}


@pytest.mark.parametrize("policy, again", [("full", 1), ("non-reentrant", 1), ("selective", 0)])
def test_a_rerun_gathers_again_in_the_backward(report, policy, again):
    """A rerun of each layer's forward (``full``, ``non-reentrant``) gathers its K and V again, in the backward;
    ``selective`` reruns the attention core after the gather: none again."""
    from flopcount.parallel.plan import parse_recompute

    work, _ = _work(report, recompute=parse_recompute(policy))
    for r in work.ranks:
        assert _calls(r) == sorted([("all_gather", "forward", M * L, KV_BYTES, 2),
                                    ("reduce_scatter", "backward", M * L, KV_BYTES, 2)]
                                   + ([("all_gather", "backward", again * M * L, KV_BYTES, 2)] if again else []))


def test_under_a_pipeline_a_rank_gathers_for_its_stages_layers(report):
    """``pp=2,cp=2``: each rank runs L/2 layers, so M·L/2 calls each way."""
    work, _ = _work(report, "pp=2,cp=2")
    assert len(work.ranks) == 4
    for r in work.ranks:
        assert _calls(r) == [("all_gather", "forward", M * L // 2, KV_BYTES, 2),
                             ("reduce_scatter", "backward", M * L // 2, KV_BYTES, 2)]


def test_tensor_parallel_ranks_gather_their_own_kv_heads(report):
    """``tp=2,cp=2``: each TP rank holds KV/2 of the K/V heads, so a call moves half the bytes."""
    work, _ = _work(report, "tp=2,cp=2")
    for r in work.ranks:
        assert _calls(r) == [("all_gather", "forward", M * L, KV_BYTES // 2, 2),
                             ("reduce_scatter", "backward", M * L, KV_BYTES // 2, 2)]


def test_each_call_pays_its_latency(report):
    """Priced from a profile of one latency and bus bandwidth for every collective: each call its latency and
    (n−1)/n of its bytes over the bus bandwidth, exposed (2 ranks: half the bytes)."""
    from flopcount.measure.predict import predict_work

    work, _ = _work(report)
    pred = predict_work(work, collectives_profile(("all_gather", "reduce_scatter", "all_reduce"), LAT, BW))
    for r in pred.ranks:
        for kind in ("all_gather", "reduce_scatter"):
            assert r["communication_seconds"][kind]["exposed"] == pytest.approx(M * L * (LAT + KV_BYTES / 2 / BW))
            assert r["communication_seconds"][kind]["overlapped"] == 0


def _node_flops(rank) -> float:
    return sum(w.flops + w.backward_flops + w.recompute_flops for nodes in rank.chunks.values() for w in nodes)


@pytest.mark.parametrize("plan, policy", [("cp=2", None), ("cp=2", "full"), ("tp=2,cp=2", None),
                                          ("pp=2,cp=2", "non-reentrant"), ("dp=2,cp=2", None)])
def test_a_ranks_nodes_run_its_part_of_the_sequence(report, plan, policy):
    """Under cp a rank's nodes run 1/C of its stage's work: their FLOPs (forward, backward, a rerun's) are the
    ledger's hardware FLOPs of the rank a microbatch (which rounds each node's to whole FLOPs, at most one a node
    off), and C times fewer than the same plan's without cp."""
    from flopcount.parallel.plan import parse_recompute

    recompute = parse_recompute(policy) if policy else None
    work, led = _work(report, plan, recompute)
    whole, _ = _work(report, plan.replace("cp=2", "cp=1"), recompute)
    by_place = {(r.stage, r.tp): _node_flops(r) for r in whole.ranks}
    for r, listed in zip(work.ranks, led.ranks):
        nodes = sum(len(ws) for ws in r.chunks.values())
        assert abs(_node_flops(r) - listed.hardware_flops / M) <= nodes
        assert _node_flops(r) == pytest.approx(by_place[(r.stage, r.tp)] / 2)


def test_a_product_reads_its_weight_whole_and_half_its_tokens(report):
    """The bytes of a rank's node under cp=2: its activations' half, its parameter whole. The q projection: x
    [B, S, H] in, [B, S, H] out, the weight H·H, fp32; on a CP rank B·S/2 tokens."""
    work, _ = _work(report)
    q = B * S // 2 * H * 4 * 2 + H * H * 4
    ws = [w for nodes in work.ranks[0].chunks.values() for w in nodes if w.kind == "gemm" and w.whole_bytes == H * H * 4]
    assert ws and all(w.bytes == q for w in ws if w.flops == 2 * B * S // 2 * H * H)
    assert any(w.flops == 2 * B * S // 2 * H * H for w in ws)
