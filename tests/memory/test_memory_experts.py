"""Memory per rank under expert parallelism (flopcount.memory.ranks with ep): a tiny Mixtral-like MoE (hidden H,
L layers, R routed experts of width I, K per token) trained with Adam in float32; the experts' weights per EP rank,
the identity over the EP group, the activations by the pairs routed to the rank, and the all_to_all buffers,
against closed forms written here."""

from __future__ import annotations

import pytest

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.experts import ExpertLoad
from flopcount.parallel.plan import parse_parallel

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, V = 32, 2, 4, 2, 50
D = H // HEADS
R, K, I_MOE = 4, 2, 24
B, S = 2, 8
EXPERTS = R * 3 * H * I_MOE  # gate, up (fused) and down of every expert of one layer
DENSE = 2 * V * H + L * (2 * H * H + 2 * H * KV_HEADS * D + R * H + 2 * H) + H  # embedding, head, attention, router, norms


def _mixtral(width: int):
    import flopcount

    config = transformers.MixtralConfig(hidden_size=H, intermediate_size=width, num_hidden_layers=L,
                                        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V,
                                        num_local_experts=R, num_experts_per_tok=K)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train", optimizer="adam",
                             memory=MemorySettings(device="cpu"))


@pytest.fixture(scope="module")
def report():
    return _mixtral(I_MOE)


def plan(text: str):
    return parse_parallel(text, microbatches=1)


def test_whole_model_params_closed_form(report):
    assert report.memory.ranks[0].params_bytes == 4 * (DENSE + L * EXPERTS)


@pytest.mark.parametrize("e", [2, 4])
def test_each_ep_rank_holds_its_experts_and_the_group_sums_to_the_model(report, e):
    ranks = per_rank(report, plan(f"ep={e},dp={e}")).ranks
    assert [r.coords["ep"] for r in ranks] == list(range(e))
    for r in ranks:  # R/E experts of every layer, the rest whole
        assert r.params_bytes == r.grads_bytes == 4 * (DENSE + L * EXPERTS // e)
    # summed over the EP group, the experts' weights are the whole model's
    assert sum(r.params_bytes for r in ranks) - (e - 1) * 4 * DENSE == report.memory.ranks[0].params_bytes


def test_tp_and_fsdp_split_experts_over_tp_ep_and_the_expert_data_group(report):
    # tp=2: attention projections, embedding and head 1/2 (one K/V head each), router and norms whole; experts
    # 1/(T·E); fsdp: the dense part 1/(dp·cp) = 1/2, the experts 1/(dp·cp/ep) = 1; FSDP2 pads dim 0: the
    # embedding's and the head's V/2 = 25 rows on a TP rank are ⌈25/2⌉ = 13 rows on each FSDP rank
    rest = L * (H * H + 2 * H * D + R * H + 2 * H) + H
    for r in per_rank(report, plan("tp=2,ep=2,dp=2,fsdp")).ranks:
        assert r.params_bytes == 4 * (2 * -(-V // 2 // 2) * H + rest // 2 + L * EXPERTS // 4)


def test_balanced_load_keeps_the_rank_its_own_pairs_and_the_all_to_all_buffers(report):
    whole = report.memory.ranks[0]
    vec = B * S * K * (H + 1) * 4  # the rank's T·k token vectors and their probabilities, float32
    for r in per_rank(report, plan("ep=2,dp=2")).ranks:
        assert r.activations_bytes == whole.activations_bytes  # E·(1/E) of the group's pairs: its own count
        assert r.alltoall_bytes == vec + 2 * vec // 2  # dispatched, and the pairs its experts ran
        assert r.peak_bytes <= whole.peak_bytes  # half the experts' states, one layer's buffers more
    c2 = per_rank(report, plan("ep=4,dp=2,cp=2")).ranks
    assert {r.alltoall_bytes for r in c2} == {vec // 2 + 4 * (vec // 2) // 4}  # s/C tokens a rank


def test_expert_load_moves_the_pairs_to_the_loaded_rank(report):
    import flopcount.parallel.experts as px

    whole = report.memory.ranks[0]
    position = {n.index: k for k, n in enumerate(report.nodes)}
    # the bytes kept of tensors the experts' nodes made on one rank (the counted graph's own tokens)
    experts = sum(b for idx, b in report.memory.kept_by_node.items()
                  if idx >= 0 and px.is_expert(report.modules.nodes[position[idx]]))
    # the products keep each pair's input (H), its gate and up outputs and the down product's input (I each), but
    # not the weight slices gathered per pair (3·I·H a pair): those are the resident experts (memory/ledger.py)
    assert 4 * L * B * S * K * (H + 3 * I_MOE) <= experts < 4 * L * B * S * K * 3 * I_MOE * H
    load = ExpertLoad([[3, 1, 1, 1]], "test")  # EP rank 0 holds experts 0 and 1: 4 of 6 pairs, rank 1: 2 of 6
    hot, cold = per_rank(report, plan("ep=2,dp=2"), load).ranks
    # E·f_r of the rank's own pairs: 2·4/6 = 4/3 and 2·2/6 = 2/3 (each tensor rounded up to a whole element)
    assert abs(hot.activations_bytes - (whole.activations_bytes + experts // 3)) <= 4 * 64
    assert abs(cold.activations_bytes - (whole.activations_bytes - experts // 3)) <= 4 * 64
    vec = B * S * K * (H + 1) * 4  # the vectors and their probabilities
    assert (hot.alltoall_bytes, cold.alltoall_bytes) == (vec + 2 * vec * 4 // 6, vec + 2 * vec * 2 // 6)
    assert hot.peak_bytes > cold.peak_bytes


def test_the_cli_passes_expert_load_to_the_memory_per_rank(report, tmp_path):
    import json

    from flopcount.options import CountOptions
    from flopcount.plans import with_plan

    path = tmp_path / "load.json"
    path.write_text(json.dumps([3, 1, 1, 1]))
    hot, cold = with_plan(report, CountOptions(parallel="ep=2,dp=2", expert_load=str(path))).memory.ranks
    vec = B * S * K * (H + 1) * 4  # the vectors and their probabilities
    assert (hot.alltoall_bytes, cold.alltoall_bytes) == (vec + 2 * vec * 4 // 6, vec + 2 * vec * 2 // 6)


def test_tp_splits_the_experts_inner_activations(report):
    """Mixtral's intermediate_size is only the experts' width I, so the activations that grow with I are exactly the
    experts' inner ones. Per (token, expert) pair the fused gate/up product keeps its output (2I: the gate and up
    halves are views of it; torch's SiLU keeps the gate half, its input), the SiLU's output (I, kept by the product
    with up) and the gated product that the down projection reads (I): 4I. TP splits the experts' weights over the inner dimension (gate/up
    column-parallel, down row-parallel), so on each TP rank these are half, and the pairs' token vectors and the down
    products' outputs stay whole."""
    wide = _mixtral(2 * I_MOE)

    def activations(r, text):
        return {x.activations_bytes for x in per_rank(r, plan(text)).ranks}

    (base,), (wider,) = activations(report, "dp=2"), activations(wide, "dp=2")
    assert wider - base == 4 * L * B * S * K * 4 * I_MOE
    (base2,), (wider2,) = activations(report, "tp=2"), activations(wide, "tp=2")
    assert wider2 - base2 == 4 * L * B * S * K * 4 * I_MOE // 2
