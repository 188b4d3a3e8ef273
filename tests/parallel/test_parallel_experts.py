"""Context and expert parallelism in FLOPs per rank (flopcount.parallel.experts through flopcount.parallel.ranks.ledger):
a tiny Qwen2-MoE (hidden H, L layers, E routed experts of width I, K per token, a shared expert) and a tiny Llama
counted once each; the zigzag balance, the expert load, the all_to_all and K/V bytes against closed forms written
here, and the identity between ranks and the whole count."""

from __future__ import annotations

import json

import pytest

from flopcount.errors import UsageError
from flopcount.parallel.experts import ExpertLoad, load_expert_load, zigzag_pairs
from flopcount.parallel.plan import parse_parallel, parse_recompute
from flopcount.parallel.ranks import ledger

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, V = 32, 2, 4, 2, 50
D = H // HEADS
E, K, I_MOE, SHARED = 6, 2, 24, 56
B, S = 2, 8
T = B * S  # tokens of a microbatch


@pytest.fixture(scope="module")
def moe():
    import flopcount

    config = transformers.Qwen2MoeConfig(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=I_MOE, shared_expert_intermediate_size=SHARED,
        num_hidden_layers=L, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V,
        num_experts=E, num_experts_per_tok=K, decoder_sparse_step=1)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")


@pytest.fixture(scope="module")
def dense():
    import flopcount

    config = transformers.LlamaConfig(hidden_size=H, intermediate_size=48, num_hidden_layers=L,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=64)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")


def plan(text: str, m: int = 1):
    return parse_parallel(text, microbatches=m)


def expert_flops(report) -> int:
    """Forward and backward FLOPs of the nodes inside the routed experts, one microbatch, all layers."""
    return sum(n.cost.flops + n.backward.flops for n, sc in zip(report.nodes, report.modules.nodes)
               if any(".experts" in s for s in sc))


def comm(rank) -> dict:
    return {(c.kind, c.group): c.bytes for c in rank.communication}


@pytest.mark.parametrize("seq,cp", [(16, 4), (8, 2), (24, 3), (64, 8)])
def test_zigzag_gives_every_rank_the_same_causal_pairs(seq, cp):
    # the whole sequence has s(s+1)/2 causal (query, key) pairs; zigzag gives each rank exactly 1/C of them
    assert [zigzag_pairs(seq, cp, i) for i in range(cp)] == [seq * (seq + 1) // (2 * cp)] * cp
    # contiguous chunks of s/C would give the last rank the most: its chunk's queries see (C−1)·s/C earlier keys
    n = seq // cp
    assert (cp - 1) * n * n + n * (n + 1) // 2 > seq * (seq + 1) // (2 * cp)


def test_experts_products_are_the_closed_form(moe):
    # K experts per token: gate, up and down (H × I each), forward 2 FLOPs a multiply-add, backward twice that
    products = sum(n.cost.flops + n.backward.flops for n, sc in zip(moe.nodes, moe.modules.nodes)
                   if any(".experts" in s for s in sc) and n.family in ("matmul", "gemm"))
    assert products == L * 3 * (T * K * 2 * 3 * H * I_MOE)
    assert expert_flops(moe) > products  # the activation, gating product and weighting run there too


@pytest.mark.parametrize("text,m,recompute", [
    pytest.param("ep=2,dp=2", 2, "none", id="ep2-dp2"),
    pytest.param("tp=2,ep=3,dp=3,cp=2", 2, "selective", id="tp2-ep3-dp3-cp2"),
    pytest.param("ep=2,cp=2,pp=2", 2, "full", id="ep2-cp2-pp2-full"),
])
def test_sum_over_ranks_is_the_whole_count_times_m_dp(moe, text, m, recompute):
    p = plan(text, m)
    for load in (None, ExpertLoad([[1, 2, 3, 4, 5, 9]], "test")):
        led = ledger(moe, p, parse_recompute(recompute), load)
        assert len(led.ranks) == p.tp * p.pp * p.cp * p.dp
        assert sum(r.model_flops for r in led.ranks) == (moe.forward.flops + moe.backward.flops) * m * p.dp
        assert all(r.hardware_flops == r.model_flops + r.redundant_flops + r.recompute_flops for r in led.ranks)


def test_balanced_experts_leave_each_rank_its_own_tokens_work(moe):
    # balanced: each rank's T·K pairs spread evenly over the E EP ranks, each receives T·K: its own work
    base = ledger(moe, plan("tp=2,dp=2"))
    ep = ledger(moe, plan("tp=2,dp=2,ep=2"))
    assert [r.hardware_flops for r in ep.ranks] == [r.hardware_flops for r in base.ranks]
    assert ep.imbalance == base.imbalance and ep.expert_load == "balanced"


def test_expert_load_moves_the_experts_work(moe):
    counts = [1, 1, 1, 2, 2, 5]  # EP rank 0 holds experts 0-2 (3 of 12 tokens), rank 1 experts 3-5 (9 of 12)
    x = expert_flops(moe)  # one rank's own pairs per microbatch; the EP group of 2 runs 2x
    base = ledger(moe, plan("dp=2")).ranks[0].hardware_flops
    led = ledger(moe, plan("dp=2,ep=2"), expert_load=ExpertLoad([counts], "counts.json"))
    r0, r1 = led.ranks
    assert (r0.coords["ep"], r1.coords["ep"]) == (0, 1)
    # per layer the group's 2·x/L is split cumulatively: rank 0 ⌊2·(x/L)·3/12⌋, rank 1 the rest
    per_layer = x // L
    assert r0.hardware_flops == base - x + L * (2 * per_layer * 3 // 12)
    assert r1.hardware_flops == base - x + L * (2 * per_layer - 2 * per_layer * 3 // 12)
    assert led.slowest_rank == 1
    assert led.imbalance == pytest.approx(r1.hardware_flops / ((r0.hardware_flops + r1.hardware_flops) / 2))


def test_all_to_all_bytes(moe):
    m = 3
    vec = T * K * H * 4  # the T·K hidden vectors of a microbatch, float32
    probs = T * K * 4  # their probabilities, float32 (the model's routing weights)
    balanced = ledger(moe, plan("dp=2,ep=2", m)).ranks[0]
    # per MoE layer: dispatch (the vectors and their probabilities) and combine in the forward, both again in the
    # backward (the probabilities' gradient)
    assert comm(balanced)[("all_to_all", "ep")] == m * L * (4 * vec + 2 * probs)
    led = ledger(moe, plan("dp=2,ep=2", m), expert_load=ExpertLoad([[1, 1, 1, 2, 2, 5]], "x"))
    # combine: the outputs of the pairs its experts ran, 2·T·K·(3/12) for rank 0, 2·T·K·(9/12) for rank 1, and back
    # the gradient of those pairs' probabilities
    assert comm(led.ranks[0])[("all_to_all", "ep")] == m * L * (2 * (vec + 2 * vec * 3 // 12)
                                                                + probs + 2 * probs * 3 // 12)
    assert comm(led.ranks[1])[("all_to_all", "ep")] == m * L * (2 * (vec + 2 * vec * 9 // 12)
                                                                + probs + 2 * probs * 9 // 12)


def test_tp_sp_ep_dispatch_own_tokens_and_gather_over_expert_tp(moe):
    """tp=2,sp,ep=2 (Megatron-Core's all-to-all dispatcher under TP with sp): each TP rank dispatches its own T/2
    tokens' pairs (half the all_to_all of tp=2 without sp), the G = T·K pairs its TP group receives (balanced) are
    all-gathered over etp with their probabilities and their outputs reduce-scattered there; the shared expert, a
    dense MLP, keeps the MoE block's TP gather and reduce-scatter (the same tp bytes as under ep=1)."""
    m, t = 2, 2
    vec, probs = T * K * H * 4, T * K * 4  # a microbatch's pairs' vectors and probabilities, float32
    sp = ledger(moe, plan("tp=2,sp,dp=2,ep=2", m))
    whole = ledger(moe, plan("tp=2,dp=2,ep=2", m))
    dense = ledger(moe, plan("tp=2,sp,dp=2", m))
    g = T * K  # the pairs a TP group receives: E·(T/t)·K·(1/E) each, t of them
    for r, w, d in zip(sp.ranks, whole.ranks, dense.ranks):
        c = comm(r)
        assert c[("all_to_all", "ep")] == m * L * (4 * vec + 2 * probs) // t == comm(w)[("all_to_all", "ep")] // t
        assert c[("all_gather", "etp")] == c[("reduce_scatter", "etp")] == m * L * g * (2 * H * 4 + 4)
        assert {k: b for k, b in c.items() if k[1] == "tp"} == {k: b for k, b in comm(d).items() if k[1] == "tp"}
        assert ("all_gather", "etp") not in comm(w)


def test_expert_load_one_list_per_layer(moe):
    per_layer = ExpertLoad([[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]], "two.json")
    r0, r1 = ledger(moe, plan("dp=2,ep=2"), expert_load=per_layer).ranks
    assert r0.hardware_flops == r1.hardware_flops  # each rank takes all of one layer's pairs
    with pytest.raises(UsageError, match=r"--expert-load three.json: 3 layers of token counts for 2 MoE layers"):
        ledger(moe, plan("dp=2,ep=2"), expert_load=ExpertLoad([[1] * E] * 3, "three.json"))
    with pytest.raises(UsageError, match=r"--expert-load five.json: 5 token counts for a layer of 6"):
        ledger(moe, plan("dp=2,ep=2"), expert_load=ExpertLoad([[1] * 5], "five.json"))


def test_ep_must_divide_the_experts_and_the_ranks(moe):
    with pytest.raises(UsageError, match=r"ep=4: ep must divide the 6 routed experts"):
        ledger(moe, plan("dp=4,ep=4"))
    with pytest.raises(UsageError, match=r"ep=2: expert parallelism reuses the dp·cp = 3 .*ep must divide dp·cp"):
        ledger(moe, plan("dp=3,ep=2"))


def test_bad_expert_load_files_name_the_file(tmp_path):
    assert load_expert_load(None).per_layer is None
    good = tmp_path / "load.json"
    good.write_text(json.dumps([[1, 2], [3, 4.5]]))
    assert load_expert_load(good).per_layer == [[1, 2], [3, 4.5]]
    for name, text in (("broken.json", "[1, 2"), ("negative.json", "[1, -2]"), ("zeros.json", "[0, 0]"),
                       ("object.json", '{"a": 1}')):
        path = tmp_path / name
        path.write_text(text)
        with pytest.raises(UsageError, match=f"--expert-load {path}"):
            load_expert_load(path)
    with pytest.raises(UsageError, match="missing.json"):
        load_expert_load(tmp_path / "missing.json")


def test_context_parallel_splits_every_node_and_gathers_kv(dense):
    m, cp = 2, 2
    whole = dense.forward.flops + dense.backward.flops
    led = ledger(dense, plan(f"cp={cp},dp=2", m))
    per_rank = [r.per_microbatch["hardware_flops"] for r in led.ranks]
    assert sorted(set(per_rank)) in ([whole // cp], [whole // cp, whole // cp + 1])
    r = comm(led.ranks[0])
    kv = 2 * B * S * KV_HEADS * D * 4  # K and V of the whole sequence, float32, per layer
    assert r[("all_gather", "cp")] == m * L * kv and r[("reduce_scatter", "cp")] == m * L * kv
    full = comm(ledger(dense, plan(f"cp={cp}", m), parse_recompute("full")).ranks[0])
    assert full[("all_gather", "cp")] == m * L * 2 * kv  # gathered again when the layer is recomputed
    assert ("all_reduce", "dp_cp") in r
    tp = comm(ledger(dense, plan("tp=2,cp=2", m)).ranks[0])
    a = B * (S // cp) * H * 4  # a CP rank's activation
    assert tp[("all_reduce", "tp")] == m * (4 * L * a + a + a)  # as without CP, on S/C tokens
    kv_tp = 2 * B * S * (KV_HEADS // 2) * D * 4
    assert tp[("all_gather", "cp")] == m * L * kv_tp


@pytest.mark.slow  # two more exports (DeepSeek-V3's MLA and 8 experts): about 20 s
@pytest.mark.parametrize("name", ["mixtral", "deepseek_v3"])
def test_other_moe_decoders_sum_to_the_whole_count(name):
    import flopcount

    config = {
        # no dense MLP: every layer's experts sit under block_sparse_moe (or mlp), 4 experts
        "mixtral": lambda: transformers.MixtralConfig(
            hidden_size=H, intermediate_size=48, num_hidden_layers=2, num_attention_heads=HEADS,
            num_key_value_heads=KV_HEADS, vocab_size=V, num_local_experts=4, num_experts_per_tok=K),
        # multi-head latent attention, layer 0 dense, 8 routed experts and a shared one
        "deepseek_v3": lambda: transformers.DeepseekV3Config(
            hidden_size=H, intermediate_size=40, moe_intermediate_size=I_MOE, num_hidden_layers=2,
            first_k_dense_replace=1, num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=V,
            n_routed_experts=8, num_experts_per_tok=K, n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=16,
            kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=8, v_head_dim=8),
    }[name]()
    r = flopcount.from_hf(config, (B, S), cache_dir=False, mode="train")
    p = plan("tp=2,ep=4,dp=2,cp=2", 2)
    led = ledger(r, p, expert_load=ExpertLoad([[1, 2, 3, 4] * (r.moe.experts // 4)], "test"))
    assert sum(x.model_flops for x in led.ranks) == (r.forward.flops + r.backward.flops) * 2 * p.dp
    assert {x.coords["ep"] for x in led.ranks} == {0, 1, 2, 3} and led.imbalance > 1



def test_optimizer_step_over_expert_ranks_sums_to_the_whole_step():
    import flopcount

    config = transformers.Qwen2MoeConfig(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=I_MOE, shared_expert_intermediate_size=SHARED,
        num_hidden_layers=L, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V,
        num_experts=E, num_experts_per_tok=K, decoder_sparse_step=1)
    report = flopcount.from_hf(config, (B, S), cache_dir=False, mode="train", optimizer="sgd")
    params = sum(report.modules.params.values())
    for text in ("tp=2,ep=2,dp=2", "tp=2,ep=2,dp=2,fsdp", "ep=2,cp=2,dp=3,fsdp"):
        led = ledger(report, plan(text))
        # SGD: w -= lr·g, 2 FLOPs an element; every element updated once apart from the named redundant copies
        assert sum(r.optimizer_flops - r.optimizer_redundant_flops for r in led.ranks) == 2 * params, text


def test_expert_gradients_on_the_expert_data_parallel_group(moe):
    # each EP rank holds E/ep experts of 3·H·I float32 elements per layer; their gradients are reduced over the
    # dp·cp/ep ranks holding the same experts (Megatron's expert data-parallel group), the rest over dp
    experts = L * E * 3 * H * I_MOE
    dense = moe.params - experts
    four = comm(ledger(moe, plan("ep=2,dp=4")).ranks[0])
    assert four == {("all_reduce", "dp"): 4 * dense, ("all_to_all", "ep"): four[("all_to_all", "ep")],
                    ("all_reduce", "edp"): 4 * experts // 2,
                    ("all_gather", "tp_ep"): L * 2 * E * 8}  # each layer's int64 counts per expert of the 2 EP ranks
    two = comm(ledger(moe, plan("ep=2,dp=2")).ranks[0])  # dp·cp/ep = 1: no rank shares its experts
    assert ("all_reduce", "edp") not in two and two[("all_reduce", "dp")] == 4 * dense
    fsdp = comm(ledger(moe, plan("ep=2,dp=4,fsdp")).ranks[0])
    # FSDP2 pads each parameter's dim 0 to a multiple of its group: the stacked experts (E, 2·I, H) and (E, H, I)
    # hold E/2 = 3 experts on an EP rank, 2 rows on each of the 2 ranks of the edp group: 4 experts' worth gathered
    assert fsdp[("reduce_scatter", "edp")] == 4 * L * 4 * 3 * H * I_MOE
    # over dp=4: the embedding and the LM head (V = 50 rows: 13 each, 52), each layer's router (6 rows: 2 each, 8)
    # and shared expert's gate (1 row: 1 each, 4); every other first dimension divides by 4
    padding = 2 * (4 * 13 - V) * H + L * ((4 * 2 - E) * H + (4 * 1 - 1) * H)
    assert fsdp[("reduce_scatter", "dp")] == 4 * (dense + padding)
    # the root's parameters (embedding, final norm, LM head) gathered once a microbatch, a layer's twice
    root = 4 * (2 * 4 * 13 * H + H)
    assert fsdp[("all_gather", "dp")] == 2 * 4 * (dense + padding) - root
    assert fsdp[("all_gather", "edp")] == 2 * fsdp[("reduce_scatter", "edp")]


def _with(text: str, dispatcher: str | None, m: int = 1):
    import dataclasses

    return dataclasses.replace(plan(text, m), token_dispatcher=dispatcher)


def _moved(rank) -> dict[str, int]:
    return {f"{c.kind}({c.group})": c.bytes for c in rank.communication}


def test_naming_the_default_dispatcher_changes_nothing(moe):
    """allgather under ep = 1 and alltoall under ep > 1 are what a plan without ``token_dispatcher`` runs."""
    for text, default in (("tp=2,sp,dp=2", "allgather"), ("tp=2,sp,dp=2,ep=2", "alltoall"), ("dp=2,ep=2", "alltoall")):
        assert ledger(moe, _with(text, default)).ranks == ledger(moe, plan(text)).ranks


def test_the_all_gather_dispatcher_under_ep(moe):
    """``dp=2,ep=2`` under ``allgather``, training: per MoE layer the routing map (a byte an entry), the fp32
    probabilities and the hidden states of the 2 EP ranks' B·S tokens all-gathered over ``tp_ep``, the outputs
    reduce-scattered there in fp32, and in the backward the probabilities' and hidden states' gradients
    reduce-scattered and the outputs' gathered; no ``all_to_all``, no counts; the FLOPs of the all-to-all
    dispatcher's ranks."""
    m, n = 2, 2 * T  # the tokens of the EP group's 2 ranks
    led, base = ledger(moe, _with("dp=2,ep=2", "allgather", m)), ledger(moe, plan("dp=2,ep=2", m))
    for r, b in zip(led.ranks, base.ranks):
        assert r.hardware_flops == b.hardware_flops and r.model_flops == b.model_flops
        moved = _moved(r)
        assert {k: v for k, v in moved.items() if k.endswith(("(tp_ep)", "(ep)"))} == {
            "all_gather(tp_ep)": m * L * (n * E + n * E * 4 + n * H * 4 + n * H * 4),
            "reduce_scatter(tp_ep)": m * L * (n * H * 4 + n * E * 4 + n * H * 4)}
        assert moved["all_reduce(dp)"] == _moved(b)["all_reduce(dp)"]


def test_the_all_to_all_dispatcher_without_ep(moe):
    """``tp=2,sp`` under ``alltoall``: no ``all_to_all`` (an EP group of one rank), the counts of the 2 TP ranks
    gathered over ``tp_ep`` before each dispatch (int64), the pairs of the rank's S/T tokens (B·S/T·K of them, K
    per token) gathered over ``etp`` with their fp32 probabilities and their outputs reduce-scattered there (and
    back in the backward); no routing map gathered; the FLOPs and the shared expert's TP block unchanged."""
    led, base = ledger(moe, _with("tp=2,sp", "alltoall")), ledger(moe, plan("tp=2,sp"))
    g = 2 * (T // 2) * K  # the pairs the 2 TP ranks gather
    for r, b in zip(led.ranks, base.ranks):
        assert r.hardware_flops == b.hardware_flops
        moved, was = _moved(r), _moved(b)
        assert {k: v for k, v in moved.items() if k.split("(")[1] in ("tp_ep)", "etp)", "ep)")} == {
            "all_gather(tp_ep)": L * 2 * E * 8,
            "all_gather(etp)": L * (g * (H * 4 + 4) + g * H * 4),
            "reduce_scatter(etp)": L * (g * H * 4 + g * (H * 4 + 4))}
        assert "all_gather(tp_ep)" in was and "all_gather(etp)" not in was  # the routing map's, by default
        assert {k: v for k, v in moved.items() if k.endswith("(tp)")} == {
            k: v for k, v in was.items() if k.endswith("(tp)")}  # the shared expert keeps the MoE block's TP block


def test_the_all_gather_dispatcher_under_tp_and_ep_needs_sp(moe):
    with pytest.raises(UsageError, match="--token-dispatcher allgather under tp=2 and ep=2 without sp is not "
                                         "modelled") as caught:
        ledger(moe, _with("tp=2,dp=2,ep=2", "allgather"))
    assert "\n" not in str(caught.value)


def test_the_command_line_names_the_dispatcher(moe, tmp_path, capsys):
    """``--token-dispatcher allgather`` gives the ledger of the plan that names it, and its JSON plan says so."""
    from flopcount.cli import main

    transformers.Qwen2MoeConfig(
        hidden_size=H, intermediate_size=40, moe_intermediate_size=I_MOE, shared_expert_intermediate_size=SHARED,
        num_hidden_layers=L, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V,
        num_experts=E, num_experts_per_tok=K, decoder_sparse_step=1).save_pretrained(tmp_path)
    assert main(["--hf", str(tmp_path), "--input-shape", f"input_ids={B}x{S}", "--mode", "train", "--parallel",
                 "dp=2,ep=2", "--token-dispatcher", "allgather", "--format", "json"]) == 0
    par = json.loads(capsys.readouterr().out)["parallel"]
    assert par["plan"]["token_dispatcher"] == "allgather"
    assert par["ranks"] == ledger(moe, _with("dp=2,ep=2", "allgather")).as_dict()["ranks"]
    assert not any(c["kind"] == "all_to_all" for r in par["ranks"] for c in r["communication"])


def test_block_ends_are_each_scopes_own_whatever_was_asked_before():
    """Per layer, the last node inside a routed MoE block (a block's own scope, or one below it; not a sibling of
    the same prefix), written out here, asked in turn of two models' scopes and other layer lists: each its own
    (the nodes inside a block are kept per scopes)."""
    from flopcount.parallel.experts import block_ends

    moe = (("model.embed_tokens",), ("model.layers.0.mlp.gate",), ("model.layers.0.mlp.experts.0.w1",),
           ("model.layers.0.mlp.experts.1.w1",), ("model.layers.0.mlp",), ("model.layers.0.mlp_norm",),
           ("model.layers.1.mlp.experts.0.w1",), ("model.layers.1.post",), ("lm_head",))
    dense = (("model.embed_tokens",), ("model.layers.0.mlp.up",), ("model.layers.0.mlp",), ("lm_head",))
    per_layer = [None, 0, 0, 0, 0, 0, 1, 1, None]
    moved = [None, 0, 0, 0, 1, 1, 1, 1, None]  # node 4 counted in layer 1
    asked = [(moe, per_layer, {0: 4, 1: 6}), (moe, moved, {0: 3, 1: 6}), (dense, [None, 0, 0, None], {}),
             (moe, per_layer, {0: 4, 1: 6}), (list(moe), moved, {0: 3, 1: 6}), (dense, [None, 0, 0, None], {})]
    for scopes, layer, want in asked * 2:
        assert block_ends(scopes, layer) == want
