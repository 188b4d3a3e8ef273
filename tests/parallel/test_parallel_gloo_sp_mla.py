"""Megatron's sequence parallelism on multi-head latent attention, against 2 real TP ranks on gloo: a DeepSeek-V3-like
model of dense layers (MLA, a SwiGLU MLP, RMSNorms, an untied LM head) at ``tp=2,sp=megatron``, written with
Megatron-style local shards; the bytes each rank hands to each collective. The attention as Megatron-Core's
``MLASelfAttention`` runs it under sp with plain down projections: the down projections (Q's to the q latent, K/V's
to the kv latent and the shared rotary key k_pe) and the latents' norms on the rank's S/T tokens; the up projections
column-parallel (Megatron's ``ColumnParallelLinear``: each normed latent all-gathered, the rank's tokens kept and
gathered again in the backward, the gradient reduce-scattered); k_pe all-gathered by
``gather_from_sequence_parallel_region`` (kept gathered, its gradient reduce-scattered); the output projection
row-parallel, reduce-scattered. So a layer's attention gathers its latents, (q_lora + kv_lora + rope)·b·s·e, where
a Llama's gathers its hidden input A. The MLP, the LM head and the embedding as in test_parallel_gloo_sp. The same
model at ``tp=2`` without sp all-reduces, in the backward, the latents' gradients where a Llama all-reduces A's.
Each call's kind and bytes by phase (forward, backward, once a step) against the step-time predictor's TP messages,
here and on test_parallel_gloo_sp's Llama-like model."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from gloo_shards import Recorder, ledger_bytes, phased, predicted_calls, recorded, rms_norm, vocab_lookup
from helpers import gloo_ranks
from test_parallel_gloo_sp import megatron_column

from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, HEADS, V, B, S, L, FFN = 32, 4, 64, 2, 8, 2, 40
QL, KL, R, NOPE, VD = 16, 8, 4, 8, 8  # q_lora_rank, kv_lora_rank, qk_rope_head_dim, qk_nope_head_dim, v_head_dim


def _worker(rank: int, world: int, init: str, out: str, sp: bool, ql: int = QL, kl: int = KL) -> None:
    """Under ``sp`` as the module says; without it, each block's input copied to the column-parallel up projections
    (the latents', and k_pe's, gradient all-reduced in the backward, partial over the rank's heads) and the
    row-parallel outputs all-reduced. Under ``sp`` the weights that run on the rank's tokens (the norms and the down
    projections) have their partial gradients all-reduced once the backward is done. ``ql``, ``kl``: the q and kv
    latents' widths. Writes the bytes by collective and those of the storages autograd keeps for the backward."""
    import torch.distributed as dist
    from helpers import saving

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec, t, partial, made = Recorder(), world, [], []
    heads = HEADS // t
    if sp:
        column, gathered, reduced = megatron_column(rec), rec.gather, rec.scatter
    else:
        def column(y, *weights):  # one copy per block (Megatron's fused gate and up)
            y = rec.copy(y)
            return tuple(y @ w.T for w in weights)
        gathered, reduced = rec.copy, rec.reduce
    torch.manual_seed(0)

    def param(*shape):
        made.append(torch.nn.Parameter(torch.randn(*shape) * 0.1))
        return made[-1]

    def norm(width):
        n = rms_norm(width)()
        partial.extend(n.parameters())
        made.extend(n.parameters())
        return n

    def layer(x):  # x: the rank's tokens (B, S/T, H) under sp, all of them without
        q_down, kv_down, o = param(ql, H), param(kl + R, H), param(H, heads * VD)
        q_up, kv_up = param(heads * (NOPE + R), ql), param(heads * (NOPE + VD), kl)
        gate, up, down = param(FFN // t, H), param(FFN // t, H), param(H, FFN // t)
        partial.extend((q_down, kv_down))
        y = norm(H)(x)
        q, = column(norm(ql)(y @ q_down.T), q_up)
        latent, k_pe = (y @ kv_down.T).split([kl, R], -1)
        kv, = column(norm(kl)(latent), kv_up)
        k_pe = gathered(k_pe.contiguous())
        q = q.view(B, S, heads, NOPE + R).transpose(1, 2)
        kv = kv.view(B, S, heads, NOPE + VD).transpose(1, 2)
        k = torch.cat([kv[..., :NOPE], k_pe[:, None].expand(B, heads, S, R)], -1)
        causal = torch.full((S, S), float("-inf")).triu(1)
        a = torch.softmax(q @ k.transpose(-1, -2) * (NOPE + R) ** -0.5 + causal, -1) @ kv[..., NOPE:]
        x = x + reduced(a.transpose(1, 2).reshape(B, S, heads * VD) @ o.T)
        g, u = column(norm(H)(x), gate, up)
        return x + reduced((torch.nn.functional.silu(g) * u) @ down.T)

    torch.manual_seed(1)
    ids = torch.randint(0, V, (B, S))
    with saving(torch.nn.Module()) as saved:  # the weights, made in the forward, left out below
        x = vocab_lookup(ids, param(V // t, H), rank, t, reduced)
        for _ in range(L):
            x = layer(x)
        logits, = column(norm(H)(x), param(V // t, H))
    forward = len(rec.calls)
    logits.sum().backward()
    backward = len(rec.calls)
    if sp:  # one all_reduce of them all, flattened, as Megatron sums the sequence-parallel weights' gradients
        rec.all_reduce(torch.cat([p.grad.reshape(-1) for p in partial]))
    with open(f"{out}.{rank}", "w") as f:
        weights = {w.untyped_storage().data_ptr() for w in made}
        json.dump({"bytes": rec.bytes(), "saved": sum(n for at, n in saved.items() if at not in weights),
                   "calls": phased(rec.calls, forward, backward)}, f)
    dist.destroy_process_group()


def _report(ql: int = QL, kl: int = KL, **options):
    import flopcount

    config = transformers.DeepseekV3Config(
        hidden_size=H, intermediate_size=FFN, moe_intermediate_size=16, num_hidden_layers=L, first_k_dense_replace=L,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, vocab_size=V, n_routed_experts=4, num_experts_per_tok=2,
        n_shared_experts=1, n_group=2, topk_group=1, q_lora_rank=ql, kv_lora_rank=kl, qk_rope_head_dim=R,
        qk_nope_head_dim=NOPE, v_head_dim=VD)
    return flopcount.from_hf(config, (B, S), cache_dir=False, mode="train", **options)


@pytest.fixture(scope="module")
def report():
    return _report()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return gloo_ranks(_worker, tmp_path_factory.mktemp("mla"), True)


@pytest.fixture(scope="module")
def seen(runs):
    return [r["bytes"] for r in runs]


A, LATENTS = B * S * H * 4, B * S * (QL + KL + R) * 4  # one activation; a layer's gathered latents, fp32
# the weights on the rank's tokens under sp, once a step: a layer's two norms, its latents' and its down projections
# (to the q latent, to the kv latent and k_pe), the final norm
PARTIAL = (L * (2 * H + QL + KL + QL * H + (KL + R) * H) + H) * 4


def test_sp_megatron_mla_on_gloo(seen, report):
    """Per layer: the latents gathered (forward) and their gradients reduce-scattered, the q and kv latents gathered
    again in the backward (Megatron's column-parallel up projections; with the MLP's input and the head's, what
    the ledger gathers again under sp=megatron, and rightly: k_pe is kept gathered), the attention's and the MLP's
    outputs reduce-scattered and their gradients gathered, the MLP's input gathered twice; the head's input twice,
    the embedding's lookup reduce-scattered."""
    regathered = B * S * (QL + KL) * 4
    sp, megatron = (ledger_bytes(ledger(report, parse_parallel(p)).ranks[0]) for p in ("tp=2,sp", "tp=2,sp=megatron"))
    assert megatron["all_gather(tp)"] - sp["all_gather(tp)"] == L * (regathered + A) + A
    for r in seen:
        assert r == {"all_gather(tp)": L * (LATENTS + regathered + 4 * A) + 3 * A,
                     "reduce_scatter(tp)": L * (LATENTS + 3 * A) + 2 * A, "all_reduce(tp)": PARTIAL}


def test_sp_megatron_mla_ledger_equals_the_run(seen, report):
    led = ledger(report, parse_parallel("tp=2,sp=megatron"))
    assert [ledger_bytes(r) for r in led.ranks] == seen


def test_tp_mla_ledger_equals_the_run(report, tmp_path):
    """Without sp: per layer the attention's and the MLP's outputs all-reduced (A each), the latents' gradients
    (q, kv and k_pe's, each partial over the rank's heads) and the MLP input's all-reduced in the backward; the
    embedding's lookup and the head input's gradient: the latents' where a Llama's layer all-reduces A."""
    runs = gloo_ranks(_worker, tmp_path, False)
    seen = [r["bytes"] for r in runs]
    assert seen == [{"all_reduce(tp)": L * (3 * A + LATENTS) + 2 * A}] * 2
    assert [ledger_bytes(r) for r in ledger(report, parse_parallel("tp=2")).ranks] == seen
    # the calls: a layer's two reductions (A each) and the embedding's in the forward; in the backward the MLP
    # input's and the head input's gradients (A each) and each latent's (q latent, kv latent, k_pe: b·s·width·4)
    latents = [("all_reduce", B * S * w * 4) for w in (QL, KL, R)]
    assert recorded(runs[0])["backward"] == Counter([("all_reduce", A)] * (L + 1) + latents * L)
    for i, run in enumerate(runs):
        assert predicted_calls(report, "tp=2", i) == recorded(run)


def test_sp_megatron_mla_calls_equal_the_run(runs, report):
    """The predictor's TP calls of each rank, by phase, are those the run makes: the latents gathered each on its
    own (q latent, kv latent, k_pe), the sequence-parallel weights' gradients summed once a step."""
    assert recorded(runs[0])["step"] == Counter([("all_reduce", PARTIAL)])
    assert recorded(runs[0])["forward"][("all_gather", B * S * R * 4)] == L
    for i, run in enumerate(runs):
        assert predicted_calls(report, "tp=2,sp=megatron", i) == recorded(run)


def test_mla_latents_per_rank_on_gloo_against_the_memory_ledger(tmp_path):
    """The latents per rank: from (q_lora, kv_lora) to twice them, each rank's storages kept for the backward grow by
    three tensors of the latents' width per token and layer (the down projection's output that the norm's square
    reads, the normed latent before its weight, and the normed latent the up projection reads), on the rank's S/T
    tokens under ``sp=megatron`` (the down projections and norms run on them; the up projection keeps the rank's
    tokens and gathers them again in its backward) and on all S tokens without sp (the latents whole on every rank);
    so do the memory ledger's activations of that rank. Not compared here: what does not grow with the latents
    (the gathered rotary key k_pe, which both keep whole under sp, the heads, the MLP)."""
    from flopcount.memory.ledger import MemorySettings
    from flopcount.memory.ranks import per_rank

    t, grown = 2, 3 * L * B * S * (QL + KL) * 4  # the whole batch's three latents of the added width, fp32
    reports = [_report(ql, kl, memory=MemorySettings(device="cpu")) for ql, kl in ((QL, KL), (2 * QL, 2 * KL))]
    for sp, plan, share in ((True, "tp=2,sp=megatron", grown // t), (False, "tp=2", grown)):
        runs = []
        for ql, kl in ((QL, KL), (2 * QL, 2 * KL)):
            (tmp_path / f"{sp}{ql}").mkdir()
            runs.append(gloo_ranks(_worker, tmp_path / f"{sp}{ql}", sp, ql, kl))
        assert [b["saved"] - a["saved"] for a, b in zip(*runs)] == [share] * t
        led = [per_rank(rep, parse_parallel(plan, microbatches=1)).ranks for rep in reports]
        assert [b.activations_bytes - a.activations_bytes for a, b in zip(*led)] == [share] * t


def _llama_worker(rank: int, world: int, init: str, out: str) -> None:
    """test_parallel_gloo_sp's Llama-like model at ``tp=2,sp`` (its vocab-parallel loss included): each call's kind
    and bytes by phase, the norms' partial gradients summed in one flattened all_reduce once the backward is done."""
    import torch.distributed as dist
    from test_parallel_gloo_sp import ids, llama_like

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec = Recorder()
    module = llama_like(world, rank, rec)
    loss = module(ids())
    forward = len(rec.calls)
    loss.backward()
    backward = len(rec.calls)
    rec.all_reduce(torch.cat([p.grad.reshape(-1) for name, p in module.named_parameters() if "norm" in name]))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"calls": phased(rec.calls, forward, backward)}, f)
    dist.destroy_process_group()


def test_llama_sp_calls_equal_the_run(tmp_path):
    """A dense Llama-like model at ``tp=2,sp``: per layer two reduce-scatters (A) in the forward and two gathers of
    each block's input, the embedding's reduce-scatter, the head's input gathered and the loss's three all_reduces
    of b·s·4 (its max, target logit and sum); the backward mirrors them; the norms' gradients once a step."""
    import flopcount
    from test_parallel_gloo_sp import H as H_, L as L_, ids, llama_like

    report = flopcount.from_torch(llama_like(), (ids(),), training=True, cache_dir=False)
    runs = gloo_ranks(_llama_worker, tmp_path)
    a = B * S * H_ * 4
    assert recorded(runs[0])["forward"] == Counter(
        [("reduce_scatter", a)] * (2 * L_ + 1) + [("all_gather", a)] * (2 * L_ + 1) + [("all_reduce", B * S * 4)] * 3)
    assert recorded(runs[0])["step"] == Counter([("all_reduce", (2 * L_ + 1) * H_ * 4)])
    for i, run in enumerate(runs):
        assert predicted_calls(report, "tp=2,sp", i) == recorded(run)
