"""Expert parallelism's collectives as the predictor prices them: two calls per dispatch (the tokens and their
probabilities) and one per combine (``all_to_all``, group ``ep``) and a gather of the router's counts before each
dispatch (``all_gather``, group ``tp_ep``), as ``benchmarks/step_time_ep.py`` runs them on gloo; against closed forms
written here on a Mixtral-like model (L MoE layers, R experts, k a token, M microbatches of b×s tokens, hidden h,
fp32) under ``dp=2,ep=2``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from helpers import collectives_profile, mixtral_config


L, R, K, H, I, B, S, M = 2, 4, 2, 32, 64, 3, 8, 2
VEC = B * S * K * H * 4  # a rank's (token, expert) pairs' hidden vectors: what one dispatch sends
PROBS = B * S * K * 4  # their routing probabilities (fp32, Mixtral's), sent with them
CALL = (2 * VEC + PROBS) / 3  # balanced, a phase's three calls a layer: the vectors both ways and the probabilities
COUNTS = 2 * R * 8  # the router's int64 counts per expert of the 2 ranks of tp_ep
LAT, BW = 40e-6, 2e9  # every collective's latency and bus bandwidth


def _profile():
    return collectives_profile(("all_to_all", "all_gather", "all_reduce"), LAT, BW)


@pytest.fixture(scope="module")
def report():
    pytest.importorskip("transformers")
    import flopcount

    config = mixtral_config(H, I, L, 2, 2, 128, R, K)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")


def _work(report, recompute=None, load=None, plan="dp=2,ep=2"):
    from flopcount.measure.predict import work_of
    from flopcount.parallel.plan import parse_parallel
    from flopcount.plans import parallel_ledger

    led = parallel_ledger(report, parse_parallel(plan, M, "1f1b"), recompute, load)
    return work_of(dataclasses.replace(report, parallel=led))


def _calls(rank, group):
    return sorted((x.kind, x.phase, x.count, x.bytes, x.ranks) for x in rank.messages if x.group == group)


def test_a_balanced_step_is_six_calls_a_layer_and_microbatch(report):
    """Balanced, the forward's dispatch (the vectors and the probabilities) and combine, the backward's three again
    (the probabilities' gradient): M·L·3 calls in each phase, each the average of their bytes, VEC + VEC + PROBS;
    one gather of the counts before each forward dispatch."""
    for r in _work(report).ranks:
        assert _calls(r, "ep") == [("all_to_all", "backward", M * L * 3, CALL, 2),
                                   ("all_to_all", "forward", M * L * 3, CALL, 2)]
        assert _calls(r, "tp_ep") == [("all_gather", "forward", M * L, COUNTS, 2)]


def test_a_recomputed_layer_dispatches_and_combines_again_in_the_backward(report):
    """``--recompute full`` reruns each MoE layer's forward in the backward: its dispatch (and gather) and its
    combine again, 9 all_to_all calls a layer and microbatch, 6 of them in the backward: the vectors 3 times each way,
    the probabilities out twice (the rerun's dispatch sends them again) and their gradient back once, so each call
    the average, (6·VEC + 3·PROBS)/9 bytes."""
    from flopcount.parallel.plan import parse_recompute

    for r in _work(report, parse_recompute("full")).ranks:
        each = (6 * VEC + 3 * PROBS) / 9
        assert _calls(r, "ep") == [("all_to_all", "backward", M * L * 6, each, 2),
                                   ("all_to_all", "forward", M * L * 3, each, 2)]
        assert _calls(r, "tp_ep") == [("all_gather", "backward", M * L, COUNTS, 2),
                                      ("all_gather", "forward", M * L, COUNTS, 2)]


def test_an_uneven_load_keeps_the_ledgers_bytes_over_the_same_calls(report, tmp_path):
    """With ``--expert-load``: rank r's combine returns the pairs its experts ran, 2·VEC·f_r (f_r its experts' share
    of the layer's pairs), and the probabilities' gradient 2·PROBS·f_r; the calls stay six a layer and microbatch,
    each the average of the rank's bytes."""
    from flopcount.parallel.experts import load_expert_load

    load = tmp_path / "load.json"
    load.write_text(json.dumps([[1, 1, 1, 1], [5, 1, 1, 1]]))
    shares = [[2 / 4, 2 / 4], [6 / 8, 2 / 8]]  # each layer's share of each rank's experts
    for rank, r in enumerate(_work(report, load=load_expert_load(load)).ranks):
        total = M * sum(2 * VEC + 2 * 2 * VEC * f[rank] + PROBS + 2 * PROBS * f[rank]  # dispatch and combine,
                        for f in shares)  # both ways, and the probabilities out and their gradient back
        assert [(x.phase, x.count) for x in r.messages if x.group == "ep"] == [("forward", M * L * 3),
                                                                                ("backward", M * L * 3)]
        assert sum(x.bytes * x.count for x in r.messages if x.group == "ep") == pytest.approx(total)


def test_each_call_pays_its_latency(report):
    """Priced from a profile of one latency and bus bandwidth for every collective: the step's all_to_all is its
    calls' latencies and its bytes' bus time ((n−1)/n of them over 2 ranks), exposed."""
    from flopcount.measure.predict import predict_work

    pred = predict_work(_work(report), _profile())
    calls = M * L * 6
    for r in pred.ranks:
        a2a = r["communication_seconds"]["all_to_all"]
        assert a2a["exposed"] == pytest.approx(calls * LAT + M * L * 2 * (2 * VEC + PROBS) / 2 / BW)
        assert a2a["overlapped"] == 0
        assert r["communication_seconds"]["all_gather"]["exposed"] == pytest.approx(M * L * (LAT + COUNTS / 2 / BW))


@pytest.mark.parametrize("policy, forward, backward", [(None, 1, 0), ("non-reentrant", 1, 1), ("full", 0, 1)])
def test_the_auxiliary_losss_counts_are_a_call_a_layer_and_pass(report, policy, forward, backward):
    """``cp=2,ep=2``: the sequence split over 2 CP ranks, each MoE layer's R int64 counts all-reduced over them
    (``tp_cp``) in each pass that records the auxiliary loss: the forward's, and a non-reentrant rerun's in the
    backward; ``full`` records only in the rerun."""
    from flopcount.parallel.plan import parse_recompute

    recompute = parse_recompute(policy) if policy else None
    for r in _work(report, recompute, plan="cp=2,ep=2").ranks:
        assert _calls(r, "tp_cp") == sorted([("all_reduce", phase, k * M * L, R * 8, 2) for phase, k in
                                             (("forward", forward), ("backward", backward)) if k])


def _grouped(rank) -> list:
    """A rank's works of its experts' grouped products (gate_up and down): products of its R/2 experts' matrices,
    one an expert (the rank holds R/2 of the R under ep=2)."""
    return [w for nodes in rank.chunks.values() for w in nodes if w.kind == "gemm" and w.matrices == R // 2]


def _grouped_flops(rank) -> float:
    """A rank's FLOPs (forward and backward, a microbatch) of its experts' grouped products."""
    return sum(w.flops + w.backward_flops for w in _grouped(rank))


def test_an_uneven_load_runs_each_ranks_experts_on_their_pairs(report, tmp_path):
    """With ``--expert-load``, rank r's experts run the pairs routed to them, E·f_r of its own B·S·K a layer (f_r its
    experts' share of the layer's pairs): a pair's gate_up product 2·H·2I FLOPs and down 2·I·H forward, twice that
    backward (the input's and the weight's gradients), 18·H·I a pair. Balanced, each rank runs its own B·S·K."""
    from flopcount.parallel.experts import load_expert_load

    load = tmp_path / "load.json"
    load.write_text(json.dumps([[1, 1, 1, 1], [5, 1, 1, 1]]))
    ran = [[2 * 2 / 4, 2 * 6 / 8], [2 * 2 / 4, 2 * 2 / 8]]  # E·f_r of each layer: rank 0 the busiest
    work = _work(report, load=load_expert_load(load))
    for rank, r in enumerate(work.ranks):
        assert _grouped_flops(r) == pytest.approx(sum(18 * H * I * B * S * K * x for x in ran[rank]))
        assert sum(w.flops + w.backward_flops for nodes in r.chunks.values() for w in nodes) == pytest.approx(
            r.hardware_flops / M)  # all its nodes: the ledger's rank, a microbatch
    for r in _work(report).ranks:
        assert _grouped_flops(r) == pytest.approx(L * 18 * H * I * B * S * K)


@pytest.mark.parametrize("plan", ["cp=2,ep=2", "dp=2,cp=2,ep=4"])
def test_under_cp_and_an_uneven_load_a_ranks_nodes_are_the_ledgers(report, tmp_path, plan):
    """With the sequence split over CP ranks and an uneven load, a rank's nodes run 1/C of its stage's work and its
    experts E·f_r of its group's pairs: their FLOPs are the ledger's hardware FLOPs of the rank, a microbatch (two
    ways of splitting, each on its own: the predictor scales the nodes, the ledger splits each node's FLOPs)."""
    from flopcount.parallel.experts import load_expert_load

    load = tmp_path / "load.json"
    load.write_text(json.dumps([[1, 1, 1, 1], [5, 1, 1, 1]]))
    work = _work(report, load=load_expert_load(load), plan=plan)
    flops = [sum(w.flops + w.backward_flops for nodes in r.chunks.values() for w in nodes) for r in work.ranks]
    assert len(set(flops)) > 1  # the load is uneven: the busiest rank runs more
    for r, f in zip(work.ranks, flops):
        assert f == pytest.approx(r.hardware_flops / M)


@pytest.mark.parametrize("uneven", [False, True])
def test_an_experts_bytes_are_its_pairs_at_the_load_and_its_weights_once(report, tmp_path, uneven):
    """A grouped product reads its rank's R/2 experts' weights once whatever their load (gate_up: (R/2)·2I·H, down:
    (R/2)·I·H elements) and moves the vectors of the pairs its experts run, E·f_r of its own B·S·K a layer (its
    input and its output: gate_up H in and 2I out a pair, down I in and H out), fp32."""
    from flopcount.parallel.experts import load_expert_load

    load = tmp_path / "load.json"
    load.write_text(json.dumps([[1, 1, 1, 1], [5, 1, 1, 1]]))
    ran = [[2 * 2 / 4, 2 * 6 / 8], [2 * 2 / 4, 2 * 2 / 8]] if uneven else [[1, 1], [1, 1]]
    work = _work(report, load=load_expert_load(load) if uneven else None)
    for rank, r in enumerate(work.ranks):
        pairs = [B * S * K * x for x in ran[rank]]
        want = sorted([4 * (p * (H + 2 * I) + R // 2 * 2 * I * H) for p in pairs]
                      + [4 * (p * (I + H) + R // 2 * I * H) for p in pairs])
        assert sorted(w.bytes for w in _grouped(r)) == pytest.approx(want)
        assert sorted(w.whole_bytes for w in _grouped(r)) == sorted([4 * R // 2 * 2 * I * H] * L
                                                                    + [4 * R // 2 * I * H] * L)
