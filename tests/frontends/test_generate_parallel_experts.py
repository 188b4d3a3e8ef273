"""``--generate P:N --parallel ...ep=E...``: expert parallelism of generation (:mod:`flopcount.parallel.generation`)
on a tiny Qwen2-MoE (hidden H, L layers, R routed experts of width I, K per token, a shared expert), counted once:
each rank's routed-expert FLOPs and its ``all_to_all`` bytes against closed forms written here from the config's
dimensions, under balanced routing and a routing histogram, and the reconcile identity with the whole generation."""

from __future__ import annotations

import json

import pytest

import flopcount
from flopcount.cli import main
from flopcount.errors import UsageError
from flopcount.parallel.experts import ExpertLoad
from flopcount.parallel.generation import generation_ledger
from flopcount.parallel.plan import parse_parallel

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, VOCAB = 32, 2, 4, 2, 50
R, K, I_MOE, SHARED = 4, 2, 24, 56  # routed experts, experts per token, expert width, shared expert width
B, P, N = 2, 8, 3
STEPS = N - 1
E = 4  # float32 activations
COUNTS = [1, 1, 1, 5]  # a routing histogram: EP rank 0 of 2 holds experts 0-1 (2 of 8 tokens), rank 1 experts 2-3


def moe_config():
    return transformers.Qwen2MoeConfig(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=I_MOE, shared_expert_intermediate_size=SHARED,
        num_hidden_layers=L, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
        num_experts=R, num_experts_per_tok=K, decoder_sparse_step=1, architectures=["Qwen2MoeForCausalLM"])


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return flopcount.from_hf(moe_config(), generate=(P, N), batch=B, cache_dir=tmp_path_factory.mktemp("cache"))


def per_token() -> int:
    """One token's routed-expert FLOPs in one MoE layer: each of its K (token, expert) pairs runs the SwiGLU
    expert's gate, up and down products (2·3·H·I), SiLU's sigmoid and product and the gating product (3·I), and the
    scaling of its output by the routing weight (H); the K outputs are summed ((K − 1)·H)."""
    return K * (2 * 3 * H * I_MOE + 3 * I_MOE + H) + (K - 1) * H


def own_experts(tp: int, layers: int) -> tuple[int, int]:
    """(prefill, decode) routed-expert FLOPs of one rank's own tokens over ``layers`` MoE layers, one microbatch:
    B·P prompt tokens, then B tokens in each decode step, each expert's work split 1/T over TP."""
    return layers * B * P * per_token() // tp, layers * STEPS * B * per_token() // tp


def fraction(ep_rank: int, ep: int) -> float:
    per = R // ep
    return sum(COUNTS[ep_rank * per:(ep_rank + 1) * per]) / sum(COUNTS)


def phases(rank) -> tuple[int, int]:
    return rank.phases["prefill"]["hardware_flops"], rank.phases["decode"]["hardware_flops"]


def check_reconcile(led, report, plan):
    g, m = report.generation, plan.microbatches * plan.dp
    assert sum(r.model_flops for r in led.ranks) == m * g.total.flops
    assert sum(r.phases["prefill"]["model_flops"] for r in led.ranks) == m * g.prefill.flops
    assert sum(r.phases["decode"]["model_flops"] for r in led.ranks) == m * g.decode.flops
    for r in led.ranks:
        assert r.hardware_flops == r.model_flops + r.redundant_flops and r.redundant_flops >= 0
        assert r.hardware_flops == sum(phases(r))
        for ph in r.phases.values():
            assert ph["hardware_flops"] == ph["model_flops"] + ph["redundant_flops"] and ph["redundant_flops"] >= 0


def test_the_counted_experts_are_the_closed_form(report):
    # the per-token closed form the other tests build on, against the prefill's nodes inside the routed experts
    experts = sum(n.cost.flops for n, sc in zip(report.nodes, report.modules.nodes) if any(".experts" in s for s in sc))
    assert experts == own_experts(1, L)[0]
    assert report.moe.experts == R and report.moe.top_k == K


@pytest.mark.parametrize("text,m", [
    pytest.param("ep=2,dp=2", 1, id="ep2-dp2"),
    pytest.param("tp=2,ep=2,dp=2", 2, id="tp2-ep2-dp2"),
    pytest.param("ep=2,dp=2,pp=2", 2, id="ep2-dp2-pp2"),
    pytest.param("tp=2,ep=2,cp=2,pp=2", 2, id="tp2-ep2-cp2-pp2"),
    pytest.param("ep=4,dp=2,cp=2", 1, id="ep4-dp2-cp2"),
])
def test_sum_over_ranks_is_the_whole_generation_times_m_dp(report, text, m):
    plan = parse_parallel(text, microbatches=m)
    for load in (None, ExpertLoad([COUNTS], "counts.json")):
        led = generation_ledger(report, plan, load)
        assert len(led.ranks) == plan.tp * plan.pp * plan.cp * plan.dp
        check_reconcile(led, report, plan)
        assert led.expert_load == ("balanced" if load is None else "counts.json")
        assert (led.dims["moe_layers"], led.dims["experts"], led.dims["top_k"]) == (L, R, K)


@pytest.mark.parametrize("text,m", [
    pytest.param("ep=2,dp=2", 1, id="ep2-dp2"),
    pytest.param("tp=2,ep=2,dp=2", 2, id="tp2-ep2-dp2"),
    pytest.param("ep=2,dp=2,pp=2", 2, id="ep2-dp2-pp2"),
])
def test_each_rank_runs_its_ep_rank_share_of_the_pooled_experts(report, text, m):
    plan = parse_parallel(text, microbatches=m)
    ep = plan.ep
    alone = generation_ledger(report, parse_parallel(text.replace(f"ep={ep},", ""), microbatches=m))
    balanced = generation_ledger(report, plan)
    skewed = generation_ledger(report, plan, ExpertLoad([COUNTS], "counts.json"))
    own_p, own_d = own_experts(plan.tp, L // plan.pp)  # the MoE layers of the rank's stage
    for a, b, r in zip(alone.ranks, balanced.ranks, skewed.ranks):
        assert a.rank == b.rank == r.rank and r.coords["ep"] == (r.coords["dp"] * plan.cp + r.coords["cp"]) % ep
        # balanced: the group's E members' tokens pooled, each EP rank runs 1/E of them: its own tokens' work
        assert phases(b) == phases(a) and b.model_flops == a.model_flops
        # a histogram: each EP rank runs E × (a member's own work) × its experts' fraction of the tokens
        f = fraction(r.coords["ep"], ep)
        assert phases(r) == (phases(b)[0] + m * round(own_p * (ep * f - 1)),
                             phases(b)[1] + m * round(own_d * (ep * f - 1)))


@pytest.mark.parametrize("text,m", [
    pytest.param("ep=2,dp=2", 3, id="ep2-dp2"),
    pytest.param("tp=2,ep=2,dp=2", 2, id="tp2-ep2-dp2"),
    pytest.param("ep=2,dp=2,pp=2", 2, id="ep2-dp2-pp2"),
    pytest.param("ep=2,cp=2", 1, id="ep2-cp2"),
])
def test_all_to_all_bytes(report, text, m):
    plan = parse_parallel(text, microbatches=m)
    layers = L // plan.pp  # MoE layers on each stage
    for load in (None, ExpertLoad([COUNTS], "counts.json")):
        led = generation_ledger(report, plan, load)
        for r in led.ranks:
            f = 1 / plan.ep if load is None else fraction(r.coords["ep"], plan.ep)
            # per MoE layer, forward only: dispatch the rank's tokens' K hidden vectors and their K probabilities
            # (float32: Qwen2-MoE's top-k weights in its logits' dtype), get back the outputs of the pairs its
            # experts ran (E × its own pairs × f); the prefill's B·P/C tokens, then B in each step
            prefill = B * (P // plan.cp) * K * H * E
            step = B * K * H * E
            probs = (B * (P // plan.cp) + STEPS * B) * K * 4
            expected = m * layers * (prefill + round(plan.ep * prefill * f)
                                     + STEPS * (step + round(plan.ep * step * f)) + probs)
            got = [c.bytes for c in r.communication if c.kind == "all_to_all"]
            assert got == [expected] and all(c.group == "ep" for c in r.communication if c.kind == "all_to_all")


@pytest.mark.parametrize("plan, message", [
    pytest.param("ep=2,dp=3", "ep must divide dp·cp", id="ep-not-dividing-dp-cp"),
    pytest.param("ep=3,dp=3", "ep must divide the 4 routed experts", id="ep-not-dividing-experts"),
    pytest.param("tp=2,sp,ep=2,dp=2", "a decode step has one token; leave out sp", id="sp"),
])
def test_bad_plans_exit_2(report, plan, message):
    with pytest.raises(UsageError, match=message):
        generation_ledger(report, parse_parallel(plan))


def test_a_histogram_of_the_wrong_length_exits_2(report):
    with pytest.raises(UsageError, match="3 token counts for a layer of 4 routed experts"):
        generation_ledger(report, parse_parallel("ep=2,dp=2"), ExpertLoad([[1, 2, 3]], "short.json"))
    with pytest.raises(UsageError, match="3 layers of token counts for 2 MoE layers"):
        generation_ledger(report, parse_parallel("ep=2,dp=2"), ExpertLoad([COUNTS] * 3, "long.json"))


@pytest.mark.slow
def test_cli_json_with_expert_load(capsys, tmp_path):
    moe_config().save_pretrained(tmp_path)
    load = tmp_path / "load.json"
    load.write_text(json.dumps(COUNTS))
    argv = ["--hf", str(tmp_path), "--generate", f"{P}:{N}", "--batch", str(B), "--parallel", "ep=2,dp=2",
            "--expert-load", str(load), "--format", "json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    par = doc["parallel"]
    assert par["mode"] == "generate" and par["expert_load"] == str(load)
    assert [r["coords"]["ep"] for r in par["ranks"]] == [0, 1]
    assert sum(r["model_flops"] for r in par["ranks"]) == 2 * doc["generation"]["total_flops"]
    # EP rank 1's experts take 6 of the 8 tokens, rank 0's 2: the pooled expert work moves to rank 1
    own_p, own_d = own_experts(1, L)
    r0, r1 = par["ranks"]
    assert r1["hardware_flops"] - r0["hardware_flops"] == 2 * (own_p + own_d) * (6 - 2) // 8
    assert main([*argv[:-4], "--parallel", "ep=3,dp=3", "--format", "json"]) == 2


@pytest.mark.parametrize("text,m", [pytest.param("ep=2,dp=2", 2, id="ep2-dp2"),
                                    pytest.param("ep=2,cp=2", 1, id="ep2-cp2")])
def test_the_all_gather_dispatcher_gathers_over_tp_ep(report, text, m):
    """``--token-dispatcher allgather`` (T = 1): per MoE layer and phase, forward only, the routing map (a byte an
    entry), the probabilities (float32) and the hidden states of the E ranks' tokens all-gathered over ``tp_ep`` and
    the outputs reduce-scattered there in the probabilities' dtype; no ``all_to_all``, no counts; the same FLOPs."""
    import dataclasses

    plan = parse_parallel(text, microbatches=m)
    led = generation_ledger(report, dataclasses.replace(plan, token_dispatcher="allgather"))
    base = generation_ledger(report, plan)
    tokens = B * (P // plan.cp) + STEPS * B  # a rank's tokens over the prefill and the steps
    gathered = plan.ep * tokens * L  # every EP rank's, per MoE layer
    for r, b in zip(led.ranks, base.ranks):
        assert r.phases == b.phases and r.hardware_flops == b.hardware_flops
        moe = {(c.kind, c.group): c.bytes for c in r.communication if c.group in ("ep", "tp_ep")}
        assert moe == {("all_gather", "tp_ep"): m * gathered * (R + R * 4 + H * E),
                       ("reduce_scatter", "tp_ep"): m * gathered * H * 4}


def test_the_all_gather_dispatcher_under_tp_and_ep_is_refused(report):
    import dataclasses

    plan = dataclasses.replace(parse_parallel("tp=2,ep=2,dp=2"), token_dispatcher="allgather")
    with pytest.raises(UsageError, match="--token-dispatcher allgather under tp=2 and ep=2 without sp is not "
                                         "modelled") as caught:
        generation_ledger(report, plan)
    assert "\n" not in str(caught.value)
