"""FLOPs per rank under a parallel plan (flopcount.parallel.ranks): a tiny Llama (hidden H, L layers, HEADS heads of D,
KV_HEADS K/V heads, MLP width FFN, vocabulary V, batch B, sequence S) counted once, its ledger checked against
closed forms written here, the identity between ranks and the whole count, the schedules' bubbles and the
errors that name the degree."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import gloo_ranks, tiny_llama

from flopcount.errors import UsageError
from flopcount.parallel.plan import parse_parallel, parse_recompute
from flopcount.parallel.ranks import ledger, node_shares, plan_dims, plan_shares
from flopcount.parallel.schedules import simulate_schedule

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, FFN, V = 32, 4, 4, 2, 48, 64
D = H // HEADS
B, S = 2, 8
A = B * S * H * 4  # bytes of one float32 activation of a microbatch
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def report():
    return tiny_llama(H, L, HEADS, KV_HEADS, FFN, V, (B, S))


def plan(text: str, m: int = 1, schedule: str = "1f1b"):
    return parse_parallel(text, microbatches=m, schedule=schedule)


def per_rank(report, p, leaves, stage=0, tp=0, what="forward"):
    """The ledger's FLOPs of one rank (per microbatch) in the modules whose last name is in ``leaves``."""
    scopes = report.modules.nodes
    return sum(getattr(x, what) for x in node_shares(report, p)
               if x.stage == stage and x.tp == tp and scopes[x.index] and
               scopes[x.index][-1].rsplit(".", 1)[-1] in leaves)


@pytest.mark.parametrize("tp", [1, 2])
def test_projections_split_over_tp(report, tp):
    # per layer: Q and O are H×H, K and V H×(KV_HEADS·D), gate/up/down H×FFN; 2 FLOPs a multiply-add
    per_layer = 2 * B * S * (2 * H * H + 2 * H * KV_HEADS * D + 3 * H * FFN)
    for i in range(tp):
        assert per_rank(report, plan(f"tp={tp}"), PROJECTIONS, tp=i) == L * per_layer // tp
        # the backward of a product: the gradients of both operands, twice the forward
        assert per_rank(report, plan(f"tp={tp}"), PROJECTIONS, tp=i, what="backward") == 2 * L * per_layer // tp


def test_kv_heads_copied_when_fewer_than_tp(report):
    # tp=4 over 2 K/V heads: each rank projects one head (2·B·S·H·D per projection), copied on 2 ranks
    p = plan("tp=4")
    for i in range(4):
        assert per_rank(report, p, ("k_proj", "v_proj"), tp=i) == L * 2 * (2 * B * S * H * D)
        owned = per_rank(report, p, ("k_proj", "v_proj"), tp=i, what="model_forward")
        assert owned == (L * 2 * (2 * B * S * H * D) if i % 2 == 0 else 0)
    assert per_rank(report, p, ("q_proj",), tp=3) == L * 2 * B * S * H * H // 4


def test_pipeline_stages_carry_the_embedding_and_the_head(report):
    p = plan("pp=2,tp=2", m=2)
    head = 2 * B * S * H * V // 2  # vocab-parallel LM head, per TP rank
    assert per_rank(report, p, ("lm_head",), stage=1) == head
    assert per_rank(report, p, ("lm_head",), stage=0) == 0
    scopes = report.modules.nodes
    stage_of = {scopes[x.index][-1] for x in node_shares(report, p) if x.stage == 0 and x.rule != "positions"}
    assert {s for s in stage_of if ".layers." in s} and all(
        int(s.split("layers.")[1].split(".")[0]) < 2 for s in stage_of if ".layers." in s)


@pytest.mark.parametrize("text,m,recompute", [
    pytest.param("tp=2", 1, "none", id="tp2"),
    pytest.param("tp=4,pp=2,dp=2", 4, "selective", id="tp4-pp2-dp2-selective"),
    pytest.param("tp=4,sp,dp=3,fsdp", 2, "full", id="tp4-sp-fsdp-full"),
    pytest.param("pp=4", 5, "none", id="pp4"),
    pytest.param("tp=2,cp=2,pp=2,dp=2", 2, "selective", id="tp2-cp2-pp2-dp2-selective"),
    pytest.param("cp=4,dp=3", 3, "full", id="cp4-dp3-full"),
])
def test_sum_over_ranks_is_the_whole_count(report, text, m, recompute):
    p = plan(text, m)
    led = ledger(report, p, parse_recompute(recompute))
    whole = report.forward.flops + report.backward.flops
    assert led.whole_flops == whole
    assert len(led.ranks) == p.tp * p.pp * p.cp * p.dp
    assert sum(r.model_flops for r in led.ranks) == whole * m * p.dp
    assert all(r.hardware_flops == r.model_flops + r.redundant_flops + r.recompute_flops for r in led.ranks)
    assert all(r.model_flops == m * r.per_microbatch["model_flops"] for r in led.ranks)
    if p.tp > 1 and not p.sp:
        assert all(r.redundant_flops > 0 for r in led.ranks if r.coords["tp"] > 0)  # norms, embedding


@pytest.mark.parametrize("text, m, recompute", [
    pytest.param("dp=4", 2, "none", id="dp4"),
    pytest.param("tp=2,pp=2,dp=2,zero2", 4, "selective", id="tp2-pp2-dp2-zero2"),
    pytest.param("tp=2,sp,dp=3,fsdp", 2, "full", id="tp2-sp-dp3-fsdp"),
    pytest.param("cp=2,dp=3,zero1", 3, "none", id="cp2-dp3-zero1"),
])
def test_data_parallel_rank_0_alone(report, text, m, recompute):
    """``replicas=False`` (what a plan search reads): the ranks of data-parallel rank 0 of the whole ledger, the same
    figures and collectives, and the whole ledger's model FLOPs D times theirs."""
    p = plan(text, m, "gpipe" if "pp" in text else "1f1b")
    whole = ledger(report, p, parse_recompute(recompute))
    alone = ledger(report, p, parse_recompute(recompute), replicas=False)
    assert alone.ranks == tuple(r for r in whole.ranks if r.coords["dp"] == 0)
    assert len(alone.ranks) * p.dp == len(whole.ranks)
    assert p.dp * sum(r.model_flops for r in alone.ranks) == sum(r.model_flops for r in whole.ranks)
    assert max(r.hardware_flops for r in alone.ranks) == max(r.hardware_flops for r in whole.ranks)


def test_sequence_parallel_splits_the_norms(report):
    scopes = report.modules.nodes
    norms = sum(n.cost.flops for n, sc in zip(report.nodes, scopes) if sc and sc[-1].endswith("norm"))
    whole_run = [per_rank(report, plan("tp=4"), ("input_layernorm", "post_attention_layernorm", "norm"), tp=i)
                 for i in range(4)]
    split_run = [per_rank(report, plan("tp=4,sp"), ("input_layernorm", "post_attention_layernorm", "norm"), tp=i)
                 for i in range(4)]
    assert whole_run == [norms] * 4 and sum(split_run) == norms
    redundant = [ledger(report, plan(text)).ranks[1].redundant_flops for text in ("tp=4,sp", "tp=4")]
    assert redundant[0] < redundant[1]


def test_recompute_runs_the_forward_again(report):
    layers_fwd = sum(n.cost.flops for n, sc in zip(report.nodes, report.modules.nodes)
                     if any(".layers." in s for s in sc))
    full = ledger(report, plan("dp=1"), parse_recompute("full")).ranks[0]
    assert full.recompute_flops == layers_fwd  # each layer's whole forward (Megatron, torch's reentrant checkpoint)
    early = ledger(report, plan("dp=1"), parse_recompute("non-reentrant")).ranks[0]
    # all but each layer's down projection and the residual add after it (saved input: non-reentrant checkpoint
    # stops before them; tests/parallel/test_recompute_policies.py runs both)
    assert early.recompute_flops == layers_fwd - L * (2 * B * S * FFN * H + B * S * H)
    selective = ledger(report, plan("dp=1"), parse_recompute("selective")).ranks[0]
    products = L * 2 * (2 * B * HEADS * S * S * D)  # scores Q·Kᵀ and the product with V
    assert products <= selective.recompute_flops < products + L * 10 * B * HEADS * S * S
    none = ledger(report, plan("dp=1")).ranks[0]
    assert none.hardware_flops == none.model_flops == report.forward.flops + report.backward.flops


def test_communication_closed_forms(report):
    m = 3
    params = V * H + L * (2 * H * H + 2 * H * KV_HEADS * D + 3 * H * FFN + 2 * H) + H + H * V
    dp = {(c.kind, c.group): c.bytes for c in ledger(report, plan("dp=2", m)).ranks[0].communication}
    assert dp == {("all_reduce", "dp"): 4 * params}
    tp = {(c.kind, c.group): c.bytes for c in ledger(report, plan("tp=2", m)).ranks[1].communication}
    # 2 all_reduces a layer forward and 2 backward, the embedding's output and the head's input gradient
    assert tp == {("all_reduce", "tp"): m * (4 * L * A + A + A)}
    sp = {(c.kind, c.group): c.bytes for c in ledger(report, plan("tp=2,sp", m)).ranks[0].communication}
    # and once a step the norms' weights' gradients, partial under sp (each rank's tokens only): (2L + 1)·H float32
    assert sp == {("all_gather", "tp"): m * (4 * L * A + A + A), ("reduce_scatter", "tp"): m * (4 * L * A + A + A),
                  ("all_reduce", "tp"): (2 * L + 1) * H * 4}
    # tp=4 over 2 K/V heads: each head's copies sum their dWk, dWv once a step, one head of D rows each, per layer
    kv = {(c.kind, c.group): c.bytes for c in ledger(report, plan("tp=4", m)).ranks[3].communication}
    assert kv == {("all_reduce", "tp"): m * (4 * L * A + A + A), ("all_reduce", "tp_kv"): L * 2 * D * H * 4}
    pp = ledger(report, plan("pp=2", m))
    assert {(c.kind, c.group): c.bytes for c in pp.ranks[0].communication} == {("send_recv", "pp"): m * A}
    assert {(c.kind, c.group): c.bytes for c in pp.ranks[1].communication} == {("send_recv", "pp"): m * A}
    fsdp = {(c.kind, c.group): c.bytes for c in ledger(report, plan("dp=2,fsdp", m)).ranks[0].communication}
    # a layer's parameters gathered twice a microbatch, the root's (embedding, final norm, LM head) once; every first
    # dimension is even, so FSDP2 pads nothing
    root = V * H + H + H * V
    assert fsdp == {("all_gather", "dp"): m * 4 * (2 * params - root), ("reduce_scatter", "dp"): m * 4 * params}


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m", [(2, 2), (4, 4), (4, 8), (3, 7)])
def test_bubble_from_the_order_of_actions(schedule, p, m):
    makespan, busy = simulate_schedule(schedule, p, m, [1.0] * p, [2.0] * p)
    assert makespan == (m + p - 1) * 3 and busy == [3.0 * m] * p
    assert 1 - sum(busy) / (p * makespan) == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m,v", [(2, 2, 2), (2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 8, 3)])
def test_interleaved_bubble_shrinks_by_the_chunks(p, m, v):
    # v chunks per rank, each 1/v of a stage: the bubble is (P − 1)/(v·M + P − 1) of the time
    makespan, busy = simulate_schedule("interleaved", p, m, [1.0 / v] * (p * v), [2.0 / v] * (p * v), v)
    assert busy == pytest.approx([3.0 * m] * p)
    assert 1 - sum(busy) / (p * makespan) == pytest.approx((p - 1) / (v * m + p - 1))


def test_interleaved_ledger_chunks_and_sends(report):
    m = 4
    led = ledger(report, plan("pp=2", m, "interleaved:2"))
    flat = ledger(report, plan("pp=2", m, "1f1b"))
    assert sum(r.model_flops for r in led.ranks) == led.whole_flops * m
    assert led.bubble_fraction < flat.bubble_fraction
    # rank 0 holds chunks 0 and 2 (layers 0 and 2): it sends forward from both, backward from chunk 2 only
    sends = [{c.kind: c.bytes for c in r.communication}["send_recv"] for r in led.ranks]
    assert sends == [m * 3 * A, m * 3 * A]
    scopes = report.modules.nodes
    layers0 = {scopes[x.index][1] for x in node_shares(report, plan("pp=2", m, "interleaved:2"))
               if x.stage == 0 and len(scopes[x.index]) > 1 and ".layers." in scopes[x.index][1]}
    assert layers0 == {"model.layers.0", "model.layers.2"}


def test_ledger_bubble_and_slowest_rank(report):
    led = ledger(report, plan("pp=2", 4, "gpipe"))
    assert 0 < led.bubble_fraction < 1 and led.slowest_rank in (0, 1)
    assert led.imbalance == pytest.approx(max(r.hardware_flops for r in led.ranks)
                                          / (sum(r.hardware_flops for r in led.ranks) / 2))


@pytest.mark.parametrize("text,schedule,words", [
    pytest.param("tp=3", "1f1b", ("tp=3", "4 attention heads"), id="tp-heads"),
    pytest.param("tp=8", "1f1b", ("tp=8", "must divide the 4 attention heads"), id="tp-over-heads"),
    pytest.param("pp=3", "1f1b", ("pp=3", "4 layers"), id="pp-layers"),
    pytest.param("cp=3", "1f1b", ("cp=3", "2·cp = 6 to divide the sequence length 8"), id="cp-zigzag"),
    pytest.param("ep=2,dp=2", "1f1b", ("ep=2", "no routed experts"), id="ep-dense"),
    pytest.param("pp=2", "interleaved:4", ("--schedule interleaved:4", "pp·v = 8 must divide the 4 layers"),
                 id="interleaved-chunks"),
])
def test_bad_plans_name_the_degree(report, text, schedule, words):
    with pytest.raises(UsageError) as e:
        ledger(report, plan(text, 4, schedule))
    assert all(w in str(e.value) for w in words)


def test_sp_needs_tp_to_divide_the_sequence():
    import flopcount

    config = transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=1,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V)
    r = flopcount.from_hf(config, (1, 7), cache_dir=False, repeated_layers="export")
    with pytest.raises(UsageError, match=r"tp=2,sp: tp must divide the sequence length 7"):
        ledger(r, plan("tp=2,sp"))


def test_a_model_without_decoder_scopes_is_refused(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    import flopcount

    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="/fc/MatMul")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 5])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 7])],
                          [helper.make_tensor("w", TensorProto.FLOAT, [5, 7], [0.0] * 35)])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g), path)
    with pytest.raises(UsageError, match="layers.N"):
        ledger(flopcount.count(str(path)), plan("tp=2"))



def _rescoped(report, change):
    """``report`` with the module scopes of its nodes rewritten by ``change(scope)``: a graph as another exporter
    or model would scope it."""
    import dataclasses

    scopes = tuple(change(sc) for sc in report.modules.nodes)
    return dataclasses.replace(report, modules=dataclasses.replace(report.modules, nodes=scopes))


def test_experts_without_a_moe_record_are_refused(report):
    moe = _rescoped(report, lambda sc: tuple(s.replace(".mlp.up_proj", ".mlp.experts.0.up_proj") for s in sc))
    with pytest.raises(UsageError, match="expert scopes but no mixture-of-experts record"):
        ledger(moe, plan("tp=2"))


def test_roles_come_from_the_graph_not_the_names(report):
    # every module renamed: the projections are found by where they sit in the dataflow, so the ledger is the same
    import dataclasses

    def rename(s: str) -> str:
        return s.replace("q_proj", "a").replace("o_proj", "b").replace("gate_proj", "c").replace(
            "down_proj", "d").replace("self_attn", "e").replace("mlp", "f")

    renamed = _rescoped(report, lambda sc: tuple(rename(s) for s in sc))
    params = {rename(k): v for k, v in report.modules.params.items()}
    renamed = dataclasses.replace(renamed, modules=dataclasses.replace(renamed.modules, params=params))
    for text in ("tp=2", "tp=4,sp"):
        assert ledger(renamed, plan(text)).as_dict()["ranks"] == ledger(report, plan(text)).as_dict()["ranks"]


def test_a_product_outside_the_recognised_modules_is_refused(report):
    # the LM head scoped into the last layer: a product there that neither feeds attention nor sits around an MLP's
    # activation (the final norm between is outside the layer), which no tensor-parallel rule places
    bad = _rescoped(report, lambda sc: ("model.layers.3.lm_head",) if sc and sc[-1] == "lm_head" else sc)
    with pytest.raises(UsageError, match=r"node '.*' \(MatMul in model.layers.3.lm_head\) is a product outside the "
                                         "attention projections"):
        ledger(bad, plan("tp=2"))


# --- TP on 2 gloo ranks: Megatron-style local modules, counted by torch's FlopCounterMode on each rank ----------

def _tp_worker(rank: int, world: int, init: str, out: str, reentrant: bool | None = None) -> None:
    """One TP rank of a tiny Llama written with local shards: column-parallel Q, K, V, gate, up and LM head
    (their output features split), row-parallel O and down (their input features split, the outputs summed by
    all_reduce), a vocab-parallel embedding, replicated RMSNorms; 2 local heads of Q and 1 of K/V on each rank.
    ``reentrant``: each layer under ``torch.utils.checkpoint`` (reentrant or not; None: no checkpoint)."""
    import json

    import torch
    import torch.distributed as dist
    from torch.utils.checkpoint import checkpoint
    from torch.utils.flop_counter import FlopCounterMode

    # A forked child must not enter the intra-op thread pool the parent may have started (earlier tests of the
    # session): it would wait for threads the fork did not copy.
    torch.set_num_threads(1)

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    moved = []

    class Reduce(torch.autograd.Function):  # g: all_reduce in the forward, identity in the backward
        @staticmethod
        def forward(ctx, x):
            x = x.clone()
            moved.append(x.numel() * x.element_size())
            dist.all_reduce(x)
            return x

        @staticmethod
        def backward(ctx, g):
            return g

    class Copy(torch.autograd.Function):  # f: identity in the forward, all_reduce of the gradient in the backward
        @staticmethod
        def forward(ctx, x):
            return x

        @staticmethod
        def backward(ctx, g):
            g = g.clone()
            moved.append(g.numel() * g.element_size())
            dist.all_reduce(g)
            return g

    torch.manual_seed(0)  # the same full weights on every rank, then each keeps its shard
    t, heads, kv = world, HEADS // world, KV_HEADS // world

    def shard(out_features, in_features, dim):
        w = torch.randn(out_features, in_features) * 0.1
        return torch.nn.Parameter(w.chunk(t, dim)[rank].contiguous())

    def rms(x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)

    embed = torch.nn.Parameter(torch.randn(V, H).chunk(t, 0)[rank].contiguous())
    layers = [{"q": shard(H, H, 0), "k": shard(KV_HEADS * D, H, 0), "v": shard(KV_HEADS * D, H, 0),
               "o": shard(H, H, 1), "gate": shard(FFN, H, 0), "up": shard(FFN, H, 0), "down": shard(H, FFN, 1)}
              for _ in range(L)]
    head = shard(V, H, 0)
    ids = torch.randint(0, V, (B, S))
    lo = rank * (V // t)
    mask = (ids < lo) | (ids >= lo + V // t)
    with FlopCounterMode(display=False) as counter:
        x = torch.nn.functional.embedding((ids - lo).masked_fill(mask, 0), embed).masked_fill(mask[..., None], 0)
        x = Reduce.apply(x)
        causal = torch.full((S, S), float("-inf")).triu(1)

        def layer(x, p):
            y = Copy.apply(rms(x))
            q = (y @ p["q"].T).view(B, S, heads, D).transpose(1, 2)
            k = (y @ p["k"].T).view(B, S, kv, D).transpose(1, 2).repeat_interleave(heads // kv, 1)
            v = (y @ p["v"].T).view(B, S, kv, D).transpose(1, 2).repeat_interleave(heads // kv, 1)
            a = torch.softmax(q @ k.transpose(-1, -2) / D ** 0.5 + causal, -1) @ v
            x = x + Reduce.apply(a.transpose(1, 2).reshape(B, S, heads * D) @ p["o"].T)
            y = Copy.apply(rms(x))
            return x + Reduce.apply((torch.nn.functional.silu(y @ p["gate"].T) * (y @ p["up"].T)) @ p["down"].T)

        for p in layers:
            if reentrant is None:
                x = layer(x, p)
            else:
                x = checkpoint(layer, x, p, use_reentrant=reentrant)
        logits = Copy.apply(rms(x)) @ head.T  # vocab-parallel head: this rank's V/T logits
        logits.sum().backward()
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": sum(moved)}, f)
    dist.destroy_process_group()


@pytest.mark.parametrize("recompute,gathers,scatters", [("full", 2, 2), ("non-reentrant", 2, 1), ("selective", 0, 0)])
def test_sequence_parallel_collectives_a_recompute_runs_again(report, recompute, gathers, scatters):
    # per layer and microbatch, A = B·S·H·4: each block gathers its input and scatters its output; the whole rerun
    # runs both blocks' again, the non-reentrant one stops before the down projection and its reduce_scatter,
    # the selective one runs the attention core again, which no collective is part of
    p, a = plan("tp=2,sp", 2), B * S * H * 4

    def comm(r):
        return {c.kind: c.bytes for c in ledger(report, p, r).ranks[0].communication if c.group == "tp"}

    base, rerun = comm(None), comm(parse_recompute(recompute))
    assert rerun["all_gather"] - base["all_gather"] == 2 * L * gathers * a
    assert rerun["reduce_scatter"] - base["reduce_scatter"] == 2 * L * scatters * a


@pytest.mark.parametrize("recompute,reentrant,again", [
    pytest.param("none", None, 0, id="none"),
    pytest.param("full", True, 2, id="full: both reductions again"),
    pytest.param("non-reentrant", False, 1, id="non-reentrant: the attention's reduction again"),
])
def test_tp_on_gloo_equals_the_ledger(report, tmp_path, recompute, reentrant, again):
    """Each rank's products counted by FlopCounterMode (it counts matmuls only: the ledger's product nodes are what
    it sees) and the bytes handed to all_reduce equal the ledger's per-rank figures for tp=2; with each layer under
    a checkpoint, the rerun's products and its forward all_reduces too (``again`` per layer: the reentrant rerun
    reduces both blocks' outputs again, the non-reentrant one stops before the down projection and its
    reduction)."""
    p, r = plan("tp=2"), parse_recompute(recompute)
    ranks = gloo_ranks(_tp_worker, tmp_path, reentrant)
    led = ledger(report, p, r)
    plain = ledger(report, p)
    for i, seen in enumerate(ranks):
        products = sum(x.forward + x.backward + x.recompute for x in node_shares(report, p, r)
                       if x.tp == i and report.nodes[x.index].family in ("matmul", "gemm"))
        assert seen["flops"] == products
        tp_bytes = sum(c.bytes for c in led.ranks[i].communication if c.group == "tp")
        plain_bytes = sum(c.bytes for c in plain.ranks[i].communication if c.group == "tp")
        assert seen["bytes"] == tp_bytes == plain_bytes + again * L * B * S * H * 4


@pytest.mark.parametrize("ops,again", [
    pytest.param(["MatMul", "Mul", "MatMul", "Add"], {0, 1}, id="product-last: saved inputs, not rerun"),
    pytest.param(["MatMul", "Softmax", "Add", "Reshape"], {0, 1}, id="softmax-last: saved output, rerun"),
    pytest.param(["Add", "Neg"], set(), id="nothing-saved"),
])
def test_non_reentrant_recompute_stops_at_the_last_saved_tensor(ops, again):
    # a checkpointed layer runs again until every tensor its backward saved is back (torch's non-reentrant
    # checkpoint): an op that saves its inputs saves them before it runs, one that saves its output after
    from types import SimpleNamespace

    from flopcount.parallel.ranks import _rerun_layers

    nodes = [SimpleNamespace(op_type=op) for op in ["Gather", *ops, "MatMul"]]
    layout = SimpleNamespace(layer=[None] + [0] * len(ops) + [None])  # the embedding, one layer, the LM head
    assert _rerun_layers(nodes, layout) == {k + 1 for k in again}


# --- the optimizer step per rank ---------------------------------------------------------------------------------

#: FLOPs per parameter element of each update, written out from its equations: SGD w -= lr·g (mul, sub); momentum
#: v = mu·v + g, w -= lr·v; Adam m = b1·m + (1-b1)·g (3), v = b2·v + (1-b2)·g·g (4), m/(1-b1^t), v/(1-b2^t) (2),
#: w -= lr·m̂/(sqrt(v̂)+eps) (sqrt, add, div, mul, sub: 5); AdamW adds w -= lr·wd·w (2).
PER_ELEMENT = {"sgd": 2, "momentum": 2 + 2, "adam": 3 + 4 + 2 + 5, "adamw": 3 + 4 + 2 + 5 + 2}
PARAMS = V * H + L * (2 * H * H + 2 * H * KV_HEADS * D + 3 * H * FFN + 2 * H) + H + H * V


@pytest.fixture(scope="module", params=["sgd", "adamw"])  # adam: tests/parallel/test_parallel_gloo.py
def trained(request):
    return request.param, tiny_llama(H, L, HEADS, KV_HEADS, FFN, V, (B, S), optimizer=request.param)


def test_optimizer_step_per_rank_closed_form(trained):
    # tp=4,pp=2,dp=2: each stage holds 2 layers; on TP rank i, Q and O H·H/4 each, K and V one of the 2 K/V heads
    # (H·KV_HEADS·D/2 each, copied on ranks 2j and 2j+1), gate/up/down H·FFN/4 each, both norms whole (2H);
    # stage 0 adds the vocab-parallel embedding V·H/4, stage 1 the final norm H and the LM head H·V/4
    name, report = trained
    f = PER_ELEMENT[name]
    layer = 2 * H * H // 4 + 2 * H * KV_HEADS * D // 2 + 3 * H * FFN // 4 + 2 * H
    led = ledger(report, plan("tp=4,pp=2,dp=2", m=3))
    for r in led.ranks:
        tp, stage, dp = r.coords["tp"], r.stage, r.coords["dp"]
        held = 2 * layer + (V * H // 4 if stage == 0 else H + H * V // 4)
        copied = 2 * (2 * H * KV_HEADS * D // 2) * (tp % 2) + (2 * 2 * H + (H if stage == 1 else 0)) * (tp > 0)
        assert r.optimizer_flops == f * held  # once per step: the same for m=3 as for m=1
        assert r.optimizer_redundant_flops == f * (held if dp == 1 else copied)  # DP replica 1 repeats replica 0
    assert led.whole_optimizer_flops == report.optimizer[1].flops == f * PARAMS


@pytest.mark.parametrize("text", [
    pytest.param("tp=2", id="tp2"),
    pytest.param("tp=4,pp=2,dp=2", id="tp4-kv-copies-pp2-dp2"),
    pytest.param("tp=4,sp,dp=3,fsdp", id="tp4-sp-dp3-fsdp-uneven"),
    pytest.param("tp=2,cp=2,pp=2,dp=2,fsdp", id="tp2-cp2-pp2-dp2-fsdp"),
    pytest.param("pp=2,interleaved:2", id="pp2-interleaved2"),
])
def test_optimizer_sum_over_ranks_is_the_whole_step_plus_redundant(trained, text):
    name, report = trained
    text, _, schedule = text.partition(",interleaved")
    p = plan(text, m=4, schedule="interleaved" + schedule if schedule else "1f1b")
    led = ledger(report, p)
    held = sum(r.optimizer_flops for r in led.ranks)
    assert held - sum(r.optimizer_redundant_flops for r in led.ranks) == PER_ELEMENT[name] * PARAMS
    if p.fsdp:  # sharded over dp·cp, nothing repeats over DP: TP rank 0 runs no redundant update
        assert all(r.optimizer_redundant_flops == 0 for r in led.ranks if r.coords["tp"] == 0)


def test_optimizer_step_is_null_without_an_optimizer(report):
    led = ledger(report, plan("tp=2,dp=2"))
    assert all(r.optimizer_flops is None and r.as_dict()["optimizer_flops"] is None for r in led.ranks)
    assert led.optimizer is None and "--optimizer" in led.as_dict()["optimizer_note"]


def test_sp_megatron_gathers_each_column_input_again_per_stage():
    """A Hugging Face Llama of 4 layers (counted from its 1-layer export, the stack extended by copies that repeat
    the tensors' names) at tp=2,pp=2 with 2 microbatches: ``sp=megatron`` all-gathers in the backward each input
    of the Q/K/V and the MLP products (2 a layer) and the LM head's (last stage), A each a microbatch, which
    ``sp`` keeps gathered instead: the rank keeps A/T of each in place of A. The rest is the same."""
    import flopcount
    from flopcount.memory.ledger import MemorySettings
    from flopcount.memory.ranks import per_rank as memory_per_rank

    config = transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V)
    report = flopcount.from_hf(config, (B, S), cache_dir=False, mode="train", memory=MemorySettings(device="cpu"))
    kept, again = plan("tp=2,pp=2,sp", 2), plan("tp=2,pp=2,sp=megatron", 2)
    leds = ledger(report, kept), ledger(report, again)
    mems = memory_per_rank(report, kept).ranks, memory_per_rank(report, again).ranks
    for rank in range(4):
        stage = rank // 2
        inputs = L + stage  # 2 per layer of the stage's L/2, and the head's on the last stage
        one, two = ({(c.kind, c.group): c.bytes for c in led.ranks[rank].communication} for led in leds)
        assert two == {**one, ("all_gather", "tp"): one[("all_gather", "tp")] + 2 * inputs * A}
        assert leds[1].ranks[rank].hardware_flops == leds[0].ranks[rank].hardware_flops
        assert mems[0][rank].activations_bytes - mems[1][rank].activations_bytes == inputs * (A - A // 2)


@pytest.mark.parametrize("text,m,schedule", [("pp=2", 4, "gpipe"), ("pp=2,dp=2", 3, "1f1b"),
                                             ("pp=2", 4, "interleaved:2"), ("tp=2,dp=2", 2, "1f1b")])
def test_a_ledger_without_its_schedule_says_so(report, text, m, schedule):
    """``schedule=False``: no bubble nor schedule in the record (None, not a figure), every other figure the ledger's
    with its schedule simulated."""
    full = ledger(report, plan(text, m, schedule))
    lean = ledger(report, plan(text, m, schedule), schedule=False)
    assert lean.schedule is None and lean.bubble_fraction is None
    assert (full.schedule is None) == (text.startswith("tp")) and full.bubble_fraction is not None
    assert lean == dataclasses.replace(full, schedule=None, bubble_fraction=None)
    assert lean.as_dict()["bubble_fraction"] is None and lean.as_dict()["schedule"] is None


@pytest.mark.parametrize("recompute", ["none", "full", "selective"])
@pytest.mark.parametrize("text,schedule", [("tp=3", "1f1b"), ("tp=8", "1f1b"), ("pp=3", "1f1b"), ("cp=3", "1f1b"),
                                           ("ep=2,dp=2", "1f1b"), ("pp=2", "interleaved:4"), ("tp=2,pp=2,sp", "1f1b"),
                                           ("pp=2", "interleaved:2"), ("cp=2,dp=2", "gpipe")])
def test_the_dims_are_checked_as_the_shares_are(report, text, schedule, recompute):
    """:func:`plan_dims` (the memory walks' checks, no shares built) refuses a plan with the shares' own message and
    gives their dims otherwise, asked first or after the shares of another plan."""
    asked = plan(text, 4, schedule)
    again = parse_recompute(recompute)
    try:
        want = plan_shares(report, asked, again)[0]
    except UsageError as e:
        for before in (None, plan("pp=2", 2)):
            if before is not None:
                plan_shares(report, before, again)
            with pytest.raises(UsageError) as found:
                plan_dims(report, asked, again)
            assert str(found.value) == str(e)
        return
    plan_shares(report, plan("pp=2", 2), again)
    assert plan_dims(report, asked, again) == want
