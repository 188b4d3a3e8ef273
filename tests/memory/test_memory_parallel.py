"""Memory per rank under a parallel plan (flopcount.memory.ranks): a tiny Llama (hidden H, L layers, HEADS heads
of D, KV_HEADS K/V heads, MLP width FFN, vocabulary V) trained with Adam in float32, its per-rank parameters,
gradients and optimizer states checked against closed forms written here, the TP identity, the pipeline's
microbatches in flight, and the plans it refuses."""

from __future__ import annotations

import pytest

from flopcount.errors import UsageError
from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import in_flight, per_rank
from flopcount.parallel.plan import parse_parallel

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, FFN, V = 32, 4, 4, 2, 48, 64
D = H // HEADS
B, S = 2, 8
NORMS = 2 * H  # two RMSNorm weights per layer, replicated over TP


def layer(t: int) -> int:
    """Parameter elements of one layer on a TP rank of t: Q, O H×H/t; K, V H×KV·D/min(t, KV); gate, up, down
    H×FFN/t; norms whole."""
    return 2 * H * H // t + 2 * H * KV_HEADS * D // min(t, KV_HEADS) + 3 * H * FFN // t + NORMS


@pytest.fixture(scope="module")
def report():
    import flopcount

    config = transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train", optimizer="adam",
                             memory=MemorySettings(device="cpu"))


def plan(text: str, m: int = 1, schedule: str = "1f1b"):
    return parse_parallel(text, microbatches=m, schedule=schedule)


@pytest.mark.parametrize("t", [2, 4])
def test_params_per_tp_rank_closed_form(report, t):
    # embedding and LM head V×H/t (vocab-parallel), L layers, the final norm H whole; 4 bytes an element
    elements = V * H // t + L * layer(t) + H + V * H // t
    for r in per_rank(report, plan(f"tp={t}")).ranks:
        assert r.params_bytes == r.grads_bytes == 4 * elements
        # Adam: two moments of every element, a float32 step counter per tensor (9 per layer + 3 outside)
        assert r.optimizer_bytes == 2 * 4 * elements + 4 * (9 * L + 3)


@pytest.mark.parametrize("t", [2, 4])
def test_tp_group_sums_to_whole_plus_replicated(report, t):
    whole = report.memory.ranks[0].params_bytes
    replicated = 4 * (L * NORMS + H)
    ranks = per_rank(report, plan(f"tp={t}")).ranks
    assert sum(r.params_bytes for r in ranks) == whole + replicated * (t - 1) + (
        4 * L * 2 * H * D * (t - KV_HEADS) if t > KV_HEADS else 0)  # K and V: one head copied on t/KV ranks


def test_pipeline_stages_hold_their_layers(report):
    ranks = per_rank(report, plan("pp=2", 4)).ranks
    first = V * H + 2 * layer(1)  # the embedding and layers 0-1
    last = 2 * layer(1) + H + V * H  # layers 2-3, the final norm and the head
    assert [r.params_bytes for r in ranks] == [4 * first, 4 * last]
    assert [r.microbatches_in_flight for r in ranks] == [2, 1]  # 1F1B: P − s


def test_in_flight_by_schedule():
    assert [in_flight(plan("pp=4", 8, "gpipe"), s) for s in range(4)] == [8] * 4
    assert [in_flight(plan("pp=4", 8), s) for s in range(4)] == [4, 3, 2, 1]
    # Megatron's interleaved: (P − p − 1)·2 + (v − 1)·P + 1 chunk-forwards of 1/v of the rank's layers
    assert [in_flight(plan("pp=4", 8, "interleaved:2"), s) for s in range(4)] == [
        (6 + 4 + 1) / 2, (4 + 4 + 1) / 2, (2 + 4 + 1) / 2, (0 + 4 + 1) / 2]


def test_fsdp_divides_model_states_by_dp(report):
    base = per_rank(report, plan("tp=2,dp=2")).ranks[0]
    sharded = per_rank(report, plan("tp=2,dp=2,fsdp")).ranks[0]
    assert base.replicas == (0, 2)
    assert sharded.params_bytes == base.params_bytes // 2  # every tensor here is even
    assert sharded.grads_bytes == base.grads_bytes // 2
    # the all-gather buffer: one layer's parameters on the TP rank, whole
    assert sharded.allgather_bytes == 4 * layer(2)
    assert sharded.activations_bytes == base.activations_bytes


def test_sp_splits_activations_and_more_microbatches_raise_the_peak(report):
    tp = per_rank(report, plan("tp=2")).ranks[0]
    sp = per_rank(report, plan("tp=2,sp")).ranks[0]
    whole = report.memory.ranks[0]
    assert sp.activations_bytes < tp.activations_bytes < whole.activations_bytes
    one, four = (per_rank(report, plan("pp=2", m)).ranks[0] for m in (2, 4))
    assert four.peak_bytes == one.peak_bytes  # 1F1B keeps P − s, however many microbatches
    gpipe = per_rank(report, plan("pp=2", 4, "gpipe")).ranks[0]
    assert gpipe.peak_bytes - four.peak_bytes == 2 * four.activations_bytes  # 4 kept against 2


@pytest.mark.parametrize("c", [2, 4])
def test_cp_splits_activations_but_the_gathered_k_and_v(report, c):
    # the K and V each layer's attention reads, gathered whole on every CP rank and kept for the backward: the
    # fused attention kernel (sdpa, transformers' default) keeps K after its rotary and V as projected, both before
    # the grouped-query repeat (B·S·KV·D each, float32)
    kv = 4 * 2 * B * S * KV_HEADS * D
    whole = report.memory.ranks[0]
    ranks = per_rank(report, plan(f"cp={c}")).ranks
    assert len(ranks) == 1 and ranks[0].replicas == tuple(range(c))  # zigzag: every CP rank holds the same
    r = ranks[0]
    assert r.cp_kv_bytes == kv
    assert r.activations_bytes == (whole.activations_bytes - L * kv) // c + L * kv  # the rest: s/C tokens
    # parameters, gradients and Adam's states replicated on every CP rank
    assert (r.params_bytes, r.grads_bytes, r.optimizer_bytes) == (
        whole.params_bytes, whole.grads_bytes, whole.optimizer_bytes)


def test_cp_with_fsdp_shards_over_dp_times_cp(report):
    elements = 2 * V * H + L * layer(1) + H
    r = per_rank(report, plan("cp=2,dp=2,fsdp")).ranks[0]
    assert r.replicas == (0, 1, 2, 3)
    assert r.params_bytes == r.grads_bytes == 4 * elements // 4  # 1/(dp·cp): every tensor here divides by 4
    assert r.allgather_bytes == 4 * layer(1)


def test_count_refuses_a_plan_and_names_the_split(tmp_path):
    import flopcount

    # refused before the model is read: the count's ledger is one rank's, per_rank splits it
    with pytest.raises(UsageError, match="memory_per_rank"):
        flopcount.count(str(tmp_path / "absent.onnx"), memory=MemorySettings(plan=plan("tp=2")))


def test_fsdp_accumulates_sharded_gradients_over_microbatches(report):
    """FSDP2's default with M microbatches (as the FLOPs ledger's reduce-scatter per microbatch): each microbatch's
    backward reduce-scatters its gradients and frees them, so a later microbatch starts with the rank's shard of
    the gradients accumulated, never the whole gradients."""
    whole = report.memory.ranks[0]
    one, four = (per_rank(report, plan("dp=2,fsdp", m)).ranks[0] for m in (1, 4))
    assert four.grads_bytes == one.grads_bytes == whole.grads_bytes // 2  # every tensor here is even
    # the rise is at most the shard (kept whole until the last microbatch, the sync turned off, it could reach the
    # whole gradients, twice the shard here)
    assert one.peak_bytes < four.peak_bytes <= one.peak_bytes + one.grads_bytes < one.peak_bytes + whole.grads_bytes
