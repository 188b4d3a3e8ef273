"""``--generate P:N --parallel PLAN``: FLOPs per rank of the prefill and the decode steps
(:mod:`flopcount.parallel.generation`), against closed forms of what each rank runs again (norms, residual adds,
position tables), of what it hands to its collectives, and the reconcile identity with the whole generation."""

from __future__ import annotations

import json

import pytest

import flopcount
from flopcount.cli import main
from flopcount.errors import UsageError
from flopcount.options import CountOptions
from flopcount.parallel.generation import generation_ledger, sum_of_max
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.schedules import simulate_schedule
from flopcount.plans import with_plan

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, KV_HEADS, HEADS, FFN, LAYERS, VOCAB = 64, 2, 4, 176, 2, 96
D = H // HEADS  # 16, the head size
B, P, N = 3, 8, 3
STEPS = N - 1
CONTEXTS = sum(P + j for j in range(1, N))  # Σ c over the decode steps: 9 + 10
E = 4  # float32 activations


def llama_config():
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=LAYERS,
                                    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                                    architectures=["LlamaForCausalLM"])


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def report(cache):
    return flopcount.from_hf(llama_config(), generate=(P, N), batch=B, cache_dir=cache)


def norm(tokens: int) -> int:
    """RMSNorm over ``tokens`` rows of h: x², mean, the two scalings (4 per element), + eps, sqrt, 1/x (3 per row)."""
    return 4 * tokens * H + 3 * tokens


def rotary(positions: int) -> int:
    """The position table: positions × d/2 angles, cos and sin of the doubled angles, each scaled (4·d). The
    prefill's positions are one row of P; a decode step's are one per sequence (B rows of 1)."""
    return positions * (D // 2 + 4 * D)


def replicated(tokens: int, positions: int, layers: int, final: bool) -> int:
    """What every TP rank runs whole: each layer's two norms and two residual adds, the final norm, the table."""
    return (2 * layers + final) * norm(tokens) + 2 * layers * tokens * H + rotary(positions)


def phases_of(rank) -> tuple[int, int]:
    return rank.phases["prefill"]["hardware_flops"], rank.phases["decode"]["hardware_flops"]


def check_reconcile(led, report, plan):
    """Σ model FLOPs over ranks = M·dp × the whole generation, per phase too; hardware = model + redundant."""
    g = report.generation
    m = plan.microbatches * plan.dp
    assert sum(r.model_flops for r in led.ranks) == m * g.total.flops
    assert sum(r.phases["prefill"]["model_flops"] for r in led.ranks) == m * g.prefill.flops
    assert sum(r.phases["decode"]["model_flops"] for r in led.ranks) == m * g.decode.flops
    for r in led.ranks:
        assert r.hardware_flops == r.model_flops + r.redundant_flops
        assert r.hardware_flops == sum(phases_of(r)) and r.recompute_flops == 0 and r.optimizer_flops is None


def test_tp2_each_rank_runs_half_the_split_work_and_all_the_replicated(report):
    plan = parse_parallel("tp=2")
    led = generation_ledger(report, plan)
    check_reconcile(led, report, plan)
    g = report.generation
    extra_prefill = replicated(B * P, P, LAYERS, True)  # run whole on both ranks: model on rank 0 only
    extra_decode = STEPS * replicated(B, B, LAYERS, True)
    for r in led.ranks:  # kv = 2 = T: one K/V head each, no copies; (whole + replicated) / 2 on each rank
        assert phases_of(r) == ((g.prefill.flops + extra_prefill) // 2, (g.decode.flops + extra_decode) // 2)
    assert led.ranks[1].redundant_flops == extra_prefill + extra_decode and led.ranks[0].redundant_flops == 0
    # all_reduce after the embedding and each attention and MLP block; the last position's logits gathered
    a_p, a_d = B * P * H * E, B * H * E
    assert {c.kind: c.bytes for c in led.ranks[0].communication} == {
        "all_reduce": (2 * LAYERS + 1) * (a_p + STEPS * a_d), "all_gather": N * B * VOCAB * E}
    assert led.bubble_fraction == 0 and led.mode == "generate"


def test_tp2_projection_shares_are_the_closed_form(report):
    """The difference between a rank's decode step and what it runs whole is its half of the projections, the
    attention over the context and the MLP and head products, per token: stated here for the products."""
    led = generation_ledger(report, parse_parallel("tp=2"))
    g = report.generation
    split_decode = led.ranks[0].phases["decode"]["hardware_flops"] - STEPS * replicated(B, B, LAYERS, True)
    products = STEPS * (LAYERS * 2 * B * H * (H + 2 * KV_HEADS * D + H + 3 * FFN) + 2 * B * H * VOCAB) // 2
    attention_products = LAYERS * 2 * 2 * B * HEADS * D * CONTEXTS // 2  # Q·Kᵀ and ·V over each context
    rest = split_decode - products - attention_products  # softmax, scaling, rotary of the token: elementwise
    assert 0 < rest < products // 20
    assert g.step(P + 1).flops - g.step(P + 2).flops < 0  # the steps grow with the context


def test_pp2_stages_take_one_layer_each_the_last_the_head(report):
    plan = parse_parallel("pp=2", microbatches=2)
    led = generation_ledger(report, plan)
    check_reconcile(led, report, plan)
    s0, s1 = led.ranks
    head = N * 2 * B * H * VOCAB  # logits of the last position in each phase
    final_norm = norm(B * P) + STEPS * norm(B)
    tables = rotary(P) + STEPS * rotary(B)  # rebuilt on the second stage: its redundant work
    assert s1.redundant_flops == 2 * tables and s0.redundant_flops == 0
    # one identical layer each; stage 0 the embedding (no FLOPs) and the table, stage 1 the final norm and head
    assert s0.model_flops - s1.model_flops == 2 * (tables - final_norm - head)
    a_p, a_d = B * P * H * E, B * H * E
    assert s0.communication[0].as_dict() == {"kind": "send_recv", "group": "pp", "bytes": 2 * (a_p + STEPS * a_d)}
    assert s1.communication[0].as_dict() == {"kind": "send_recv", "group": "pp", "bytes": 2 * STEPS * B * 8}
    # two microbatches through two stages, each phase waiting for the last: near (P − 1)/(M + P − 1) = 1/3
    assert 0.30 < led.bubble_fraction < 0.36


def test_tp2_pp2_redundant_work_by_stage_and_rank(report):
    plan = parse_parallel("tp=2,pp=2", microbatches=2)
    led = generation_ledger(report, plan)
    check_reconcile(led, report, plan)
    tables = rotary(P) + STEPS * rotary(B)
    layer = replicated(B * P, 0, 1, False) + STEPS * replicated(B, 0, 1, False)
    final_norm = norm(B * P) + STEPS * norm(B)
    assert [r.redundant_flops for r in led.ranks] == [0, 2 * (layer + tables), 2 * tables,
                                                      2 * (tables + layer + final_norm)]
    assert [r.coords["tp"] for r in led.ranks] == [0, 1, 0, 1] and [r.stage for r in led.ranks] == [0, 0, 1, 1]


def test_dp2_replicas_generate_their_own_batch(report):
    plan = parse_parallel("dp=2")
    led = generation_ledger(report, plan)
    check_reconcile(led, report, plan)
    assert [(r.model_flops, r.hardware_flops, r.communication) for r in led.ranks] == \
        [(report.generation.total.flops, report.generation.total.flops, ())] * 2


def test_cp2_splits_the_prompt_and_the_cache_positions(report):
    """The prompt is split as in training; a decode step's token runs on both CP ranks (model work on rank 0,
    redundant on rank 1), the per-position work over the cache is halved."""
    plan = parse_parallel("cp=2")
    led = generation_ledger(report, plan)
    check_reconcile(led, report, plan)
    (piece,) = report.generation.pieces
    constant, per_position = piece.constant.flops, piece.per_position.flops
    for r in led.ranks:
        assert r.phases["prefill"]["hardware_flops"] == report.generation.prefill.flops // 2
        assert r.phases["decode"]["hardware_flops"] == STEPS * constant + CONTEXTS * per_position // 2
    assert led.ranks[1].phases["decode"]["model_flops"] == CONTEXTS * per_position // 2
    gathered = 2 * B * P * KV_HEADS * D * E * LAYERS + STEPS * LAYERS * 2 * B * HEADS * (D + 1) * E
    assert [c.as_dict() for c in led.ranks[0].communication] == [{"kind": "all_gather", "group": "cp",
                                                                  "bytes": gathered}]


def test_tp4_copies_kv_heads(report):
    plan = parse_parallel("tp=4")
    led = generation_ledger(report, plan)
    check_reconcile(led, report, plan)
    assert "copied on 2 ranks" in led.kv_rule


@pytest.mark.parametrize("plan, message", [
    pytest.param("tp=3", "tp must divide the 4 attention heads", id="tp-not-dividing-heads"),
    pytest.param("tp=2,sp", "a decode step has one token; leave out sp", id="sp"),
    pytest.param("cp=3", "the zigzag split needs 2·cp = 6 to divide the sequence length 8", id="cp-prompt"),
    pytest.param("pp=3", "pp must divide the 2 layers", id="pp-not-dividing-layers"),
    pytest.param("ep=2,dp=2", "has no routed experts", id="ep-on-a-dense-model"),
])
def test_bad_plans_exit_2(report, plan, message):
    with pytest.raises(UsageError, match=message):
        generation_ledger(report, parse_parallel(plan, microbatches=3 if "pp" in plan else 1))


def test_sum_of_max_against_each_step():
    lines = [(50, 3), (7, 9), (100, 0), (-20, 11)]
    assert sum_of_max(lines, 3, 40) == sum(max(a + b * c for a, b in lines) for c in range(3, 41))
    # the phase of M forwards through P stages: Σ τ + (M − 1) · max τ, as the schedule simulation finds it
    tau = [5.0, 9.0, 4.0]
    assert simulate_schedule("gpipe", 3, 4, tau, [0] * 3)[0] == sum(tau) + 3 * max(tau)


@pytest.mark.slow
def test_cli_table_and_json(capsys, tmp_path):
    llama_config().save_pretrained(tmp_path)
    argv = ["--hf", str(tmp_path), "--generate", f"{P}:{N}", "--batch", str(B), "--parallel", "tp=2,pp=2",
            "--microbatches", "2"]
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    par = doc["parallel"]
    assert par["mode"] == "generate" and par["generation"]["total_flops"] == doc["generation"]["total_flops"]
    assert sum(r["model_flops"] for r in par["ranks"]) == 2 * doc["generation"]["total_flops"]
    assert all(r["phases"]["prefill"]["hardware_flops"] + r["phases"]["decode"]["hardware_flops"]
               == r["hardware_flops"] for r in par["ranks"])
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "hardware FLOPs" in out and f"generate {P}:{N}" in out


def test_with_plan_keeps_the_memory_ledger_and_adds_the_flops(report):
    out = with_plan(report, CountOptions(parallel="tp=2"))
    assert out.parallel.generation["decode_steps"] == STEPS and out.memory is None


@pytest.mark.parametrize("flags, message", [
    pytest.param({"recompute": "full"}, "recompute changes training only", id="recompute"),
])
def test_with_plan_refuses_training_flags(report, flags, message):
    with pytest.raises(UsageError, match=message):
        with_plan(report, CountOptions(parallel="tp=2", mode="train", **flags))


@pytest.mark.slow
def test_a_stack_extended_from_fewer_layers_gives_the_ledger_of_the_whole_export(cache):
    """4 identical layers are counted from exports of 1 and 2 (their decode steps' graphs extended with them): each
    rank's FLOPs, phases and bytes equal those of the 4-layer model exported whole."""
    config = llama_config()
    config.num_hidden_layers = 4
    plan = parse_parallel("tp=2,pp=2", 2, "1f1b")
    ledgers = []
    for how in ("extend", "export"):
        r = flopcount.from_hf(config, generate=(P, N), batch=B, cache_dir=cache, repeated_layers=how)
        ledgers.append(generation_ledger(r, plan))
    extended, exported = ledgers
    assert [(r.model_flops, r.hardware_flops, r.phases, r.communication) for r in extended.ranks] == \
        [(r.model_flops, r.hardware_flops, r.phases, r.communication) for r in exported.ranks]
    assert extended.bubble_fraction == exported.bubble_fraction
