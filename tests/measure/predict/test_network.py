"""Collectives across nodes on a datasheet profile: a group that spans the DGX system's nodes of 8 GPUs runs at most
at its ranks' network adapters (m ranks of the group on a node: m × the adapter's bandwidth), against closed forms
written here; the groups' rank strides in Megatron's rank order; the field read back and refused when damaged."""

from __future__ import annotations

import dataclasses
import math

import pytest

from flopcount.errors import MeasurementError
from flopcount.measure.machine.calibration import DEVICE_BANDWIDTHS, Network, device_profile, profile_from_dict
from flopcount.measure.predict import Message, RankWork, Work, predict_work
from flopcount.parallel.plan import ParallelPlan

NVLINK_BUS = 600e9 / 2  # the A100's NVLink, one direction
HDR = 200e9 / 8  # one HDR InfiniBand adapter of 200 Gb/s, in bytes/s


def _step_seconds(message: Message, profile) -> float:
    """The predicted step of one rank whose only work is ``message``, once a step."""
    rank = RankWork(0, 0, 0, {0: ()}, (message,), 0.0, 0.0)
    return predict_work(Work((rank,), {"microbatches": 1, "pp": 1, "virtual": 1, "schedule": "1f1b"}, None),
                        profile).step_seconds


@pytest.mark.parametrize("ranks, stride, bus", [
    (8, 1, NVLINK_BUS),  # one node: NVLink
    (16, 1, min(NVLINK_BUS, 8 * HDR)),  # two whole nodes: 8 rings, one per adapter
    (16, 2, 4 * HDR),  # tp=2 below: 4 of the group's ranks on each of 4 nodes
    (32, 8, HDR),  # tp=8 below: one rank a node, one adapter
    (2, 64, HDR),  # a pipeline send between nodes
    (4, 2, NVLINK_BUS),  # 4 ranks 2 apart: one node
])
def test_a_group_across_nodes_runs_at_its_adapters(ranks, stride, bus):
    a100 = device_profile("A100", 64)
    assert a100.network is not None and a100.network.devices == 8 and a100.network.bytes_per_s == HDR
    payload = 64 << 20
    factor = 1.0 if ranks == 2 else 2 * (ranks - 1) / ranks
    kind = "send_recv" if ranks == 2 else "all_reduce"
    t = _step_seconds(Message(kind, "dp", payload, 1, ranks, "step", stride), a100)
    assert t == pytest.approx(factor * payload / bus)
    # a profile without the network (every rank on one node): NVLink whatever the stride
    one_node = dataclasses.replace(a100, network=None)
    assert _step_seconds(Message(kind, "dp", payload, 1, ranks, "step", stride), one_node) == \
        pytest.approx(factor * payload / NVLINK_BUS)


def test_uneven_nodes_take_the_fewest_ranks_on_one():
    """12 ranks 1 apart on nodes of 8: 8 on the first, 4 on the second, whose 4 adapters bound the ring."""
    assert Network(8, HDR, "").bus_cap(12, 1) == pytest.approx(4 * HDR)
    assert Network(8, HDR, "").bus_cap(3, 3) is None  # ranks 0, 3, 6: one node


def test_the_groups_strides_follow_the_rank_order():
    """Rank = tp + T·(cp + C·(dp + D·pp)): neighbours of each group are these many rank ids apart."""
    t, c, d, p, e = 2, 2, 4, 3, 2
    plan = ParallelPlan(tp=t, cp=c, dp=d, pp=p, ep=e, microbatches=p)
    expected = {"tp": 1, "cp": t, "dp_cp": t, "dp": t * c, "pp": t * c * d, "embedding": t * c * d * (p - 1),
                "ep": t, "edp": t * e, "tp_ep": 1, "tp_cp": 1, "tp_kv": 1}
    assert {g: plan.group_stride(g) for g in expected} == expected
    with pytest.raises(ValueError, match="no communication group"):
        plan.group_stride("nope")


def test_the_ledgers_messages_carry_their_groups_strides():
    """A tiny Llama under tp=2,dp=4 on A100s: its tensor-parallel messages are 1 rank apart, its data-parallel
    ones 2 (T), so the dp all_reduce spans the 8-GPU node only from dp·T > 8."""
    pytest.importorskip("transformers")
    import transformers

    import flopcount
    from flopcount.measure.predict import work_of
    from flopcount.parallel.plan import parse_parallel
    from flopcount.plans import parallel_ledger

    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=2, vocab_size=128)
    report = flopcount.from_hf(config, (2, 8), cache_dir=False, mode="train")
    report = dataclasses.replace(report, parallel=parallel_ledger(report, parse_parallel("tp=2,dp=4", 1, "1f1b")))
    strides = {(m.group, m.stride) for r in work_of(report).ranks for m in r.messages}
    assert {g for g, _ in strides} >= {"tp", "dp"}
    assert all(s == {"tp": 1, "dp": 2}[g] for g, s in strides if g in ("tp", "dp"))


def test_the_network_is_read_back_and_a_damaged_one_refused():
    h100 = device_profile("H100", 16)
    assert h100.network.bytes_per_s == DEVICE_BANDWIDTHS["H100 SXM"]["network"] == 400e9 / 8
    assert any("ConnectX-7" in s for s in h100.sources)
    assert profile_from_dict(h100.as_dict()).network == h100.network
    doc = h100.as_dict()
    doc["network"] = None  # every rank on one node
    assert profile_from_dict(doc).network is None
    for bad in ({"devices_per_node": 0, "bytes_per_s": 1e9}, {"devices_per_node": 8, "bytes_per_s": math.inf},
                {"devices_per_node": True, "bytes_per_s": 1e9}, [8]):
        doc["network"] = bad
        with pytest.raises(MeasurementError, match="'network' needs devices_per_node"):
            profile_from_dict(doc)
