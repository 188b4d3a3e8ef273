"""ZeRO's stages 1 and 2 (``zero1``, ``zero2``) under a parallel plan: a tiny bf16 Llama (hidden H, L layers,
HEADS heads of D, KV_HEADS K/V heads, MLP width FFN, vocabulary V) trained with AdamW, its per-rank
optimizer and gradient bytes, communication bytes and optimizer FLOPs checked against closed forms written here
for tp=1,dp=2 and tp=2,dp=2; the reconcile identity of the optimizer step; and one real step of torch's
``ZeroRedundancyOptimizer`` (ZeRO-1) under DDP on 2 gloo ranks: the optimizer states each rank keeps and the bytes
its collectives move."""

from __future__ import annotations

import json

import pytest
from helpers import gloo_ranks

from flopcount.errors import UsageError
from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, L, HEADS, KV_HEADS, FFN, V = 32, 2, 4, 2, 48, 64
D = H // HEADS
B, S = 2, 8
TENSORS = 9 * L + 3  # Q, K, V, O, gate, up, down and two norms a layer; the embedding, final norm and LM head
#: FLOPs per parameter element of AdamW's update (tests/parallel/test_parallel_ledger.py writes them out)
PER_ELEMENT = {"adamw": 16}


def config():
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                                    num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=V,
                                    torch_dtype="bfloat16")


def elements(t: int) -> int:
    """Parameter elements on a TP rank of t: the vocab-parallel embedding and LM head V·H/t each; per layer Q and
    O H·H/t, K and V H·KV·D/min(t, KV), gate, up, down H·FFN/t, two norms H whole; the final norm H whole."""
    layer = 2 * H * H // t + 2 * H * KV_HEADS * D // min(t, KV_HEADS) + 3 * H * FFN // t + 2 * H
    return 2 * V * H // t + L * layer + H


@pytest.fixture(scope="module", params=["adamw"])  # Adam's step differs in its FLOPs per element only
def trained(request):
    import flopcount

    return request.param, flopcount.from_hf(config(), (B, S), cache_dir=False, mode="train",
                                            optimizer=request.param, memory=MemorySettings(device="cpu"))


def plan(text: str, m: int = 1):
    return parse_parallel(text, microbatches=m)


@pytest.mark.parametrize("t", [1, 2])
def test_zero_model_states_per_rank(trained, t):
    # bf16: 2 bytes an element; every tensor here has an even number of elements, so halves are exact
    _, report = trained
    e = elements(t)
    base = per_rank(report, plan(f"tp={t},dp=2")).ranks[0]
    one = per_rank(report, plan(f"tp={t},dp=2,zero1")).ranks[0]
    two = per_rank(report, plan(f"tp={t},dp=2,zero2")).ranks[0]
    # parameters whole on every DP rank; AdamW's two bf16 moments of every element and a float32 step counter per
    # tensor without ZeRO (AdamW's as Adam's); under ZeRO half of each tensor's moments and half of the counters (21 -> 11)
    assert base.params_bytes == one.params_bytes == two.params_bytes == 2 * e
    assert base.optimizer_bytes == 2 * 2 * e + 4 * TENSORS
    assert one.optimizer_bytes == two.optimizer_bytes == 2 * 2 * e // 2 + 4 * -(-TENSORS // 2)
    # gradients: whole under zero1, half under zero2
    assert base.grads_bytes == one.grads_bytes == 2 * e
    assert two.grads_bytes == 2 * e // 2
    # single-tensor Adam on the CPU: sqrt(v) and its scaled copy of each tensor in turn, the previous tensor's
    # quotient still held: at most up after gate or down after up (3·H·FFN/t elements), or the LM head (V·H/t) after
    # the final norm (H); its half under ZeRO
    most = max(3 * H * FFN // t, H + 2 * V * H // t)
    assert base.optimizer_temp_bytes == 2 * most and one.optimizer_temp_bytes == 2 * most // 2
    # zero2's bucket: the whole gradients of one layer (larger here than the embedding's or the head's)
    layer = 2 * H * H // t + 2 * H * KV_HEADS * D // min(t, KV_HEADS) + 3 * H * FFN // t + 2 * H
    assert two.gradient_bucket_bytes == 2 * layer and one.gradient_bucket_bytes == base.gradient_bucket_bytes == 0
    assert one.allgather_bytes == two.allgather_bytes == 0  # parameters are whole: nothing gathered to run
    assert one.activations_bytes == two.activations_bytes == base.activations_bytes


@pytest.mark.parametrize("zero", ["zero1", "zero2"])
def test_zero_shards_the_master_copy(trained, zero):
    """With an fp32 master copy of the bf16 weights (mixed precision as Megatron and DeepSpeed keep it), the
    moments are fp32 too: 2·4 + 4 bytes an element and a float32 step per tensor, all of it halved by ZeRO."""
    import dataclasses

    _, report = trained
    mem = report.memory
    master = dataclasses.replace(report, memory=dataclasses.replace(
        mem, settings=dataclasses.replace(mem.settings, master_weights=True)))
    e = elements(1)
    (plain,) = per_rank(master, plan("dp=2")).ranks
    (sharded,) = per_rank(master, plan(f"dp=2,{zero}")).ranks
    assert plain.optimizer_bytes == (2 * 4 + 4) * e + 4 * TENSORS
    assert sharded.optimizer_bytes == (2 * 4 + 4) * e // 2 + 4 * -(-TENSORS // 2)
    assert sharded.params_bytes == 2 * e


def test_zero1_peak_is_the_plain_peak_less_the_states_it_sheds(trained):
    """The held states are alive through the walk, so the peak moves by the states (and, where the peak is the
    optimizer step, the temporaries) ZeRO-1 sheds; zero2 sheds half the gradients and holds a layer's bucket (on
    this small model, whose peak is early in the backward, the bucket outweighs the gradients shed by then)."""
    _, report = trained
    base, one, two = (per_rank(report, plan(f"dp=2{z}")).ranks[0] for z in ("", ",zero1", ",zero2"))
    states, temps = base.optimizer_bytes - one.optimizer_bytes, base.optimizer_temp_bytes - one.optimizer_temp_bytes
    if base.peak_phase == one.peak_phase:
        assert base.peak_bytes - one.peak_bytes == states + (temps if base.peak_phase == "optimizer step" else 0)
    else:  # the step's peak sheds the temporaries too, and the backward's (lower in the plain walk) is ZeRO-1's
        assert (base.peak_phase, one.peak_phase) == ("optimizer step", "backward")
        assert base.peak_bytes - states - temps <= one.peak_bytes <= base.peak_bytes - states
    # zero2's walk is zero1's with each parameter's gradient made at half its size, and the bucket held through
    # it: at every point it holds the bucket more and at most the halved gradients less
    assert one.peak_bytes + two.gradient_bucket_bytes - (one.grads_bytes - two.grads_bytes) <= two.peak_bytes \
        <= one.peak_bytes + two.gradient_bucket_bytes


@pytest.mark.parametrize("t", [1, 2])
@pytest.mark.parametrize("m", [1, 3])
def test_zero_communication_closed_forms(trained, t, m):
    _, report = trained
    g = 2 * elements(t)  # the rank's gradients (and parameters), bf16
    plain = {(c.kind, c.group): c.bytes for c in ledger(report, plan(f"tp={t},dp=2", m)).ranks[0].communication}
    one = {(c.kind, c.group): c.bytes for c in ledger(report, plan(f"tp={t},dp=2,zero1", m)).ranks[0].communication}
    two = {(c.kind, c.group): c.bytes for c in ledger(report, plan(f"tp={t},dp=2,zero2", m)).ranks[0].communication}
    tp = {k: v for k, v in plain.items() if k[1] == "tp"}  # TP's collectives are ZeRO's business in no way
    assert plain == {("all_reduce", "dp"): g, **tp}
    # zero1: the all_reduce once a step, then the updated parameters all-gathered once a step
    assert one == {("all_reduce", "dp"): g, ("all_gather", "dp"): g, **tp}
    # zero2: the gradients reduce-scattered in each microbatch's backward, the parameters gathered once a step
    assert two == {("reduce_scatter", "dp"): m * g, ("all_gather", "dp"): g, **tp}
    cp = {(c.kind, c.group): c.bytes for c in ledger(report, plan("cp=2,zero1", m)).ranks[0].communication}
    assert cp[("all_gather", "dp_cp")] == cp[("all_reduce", "dp_cp")] == 2 * elements(1)


@pytest.mark.parametrize("zero", ["zero1", "zero2"])
@pytest.mark.parametrize("t", [1, 2])
def test_zero_optimizer_flops_per_rank(trained, zero, t):
    name, report = trained
    f = PER_ELEMENT[name]
    led = ledger(report, plan(f"tp={t},dp=2,{zero}", m=3))
    for r in led.ranks:
        # half of the rank's elements, once a step; TP rank 1's half of the norms (2 a layer and the final one,
        # whole on both TP ranks) repeats TP rank 0's; nothing repeats over DP
        assert r.optimizer_flops == f * elements(t) // 2
        assert r.optimizer_redundant_flops == (f * (2 * L * H + H) // 2 if r.coords["tp"] == 1 else 0)
    assert sum(r.optimizer_flops - r.optimizer_redundant_flops for r in led.ranks) == f * elements(1)
    assert led.whole_optimizer_flops == report.optimizer[1].flops == f * elements(1)


@pytest.mark.parametrize("text", ["dp=3,zero1", "tp=2,cp=2,dp=3,zero2", "tp=2,pp=2,dp=2,zero2"])
def test_reconcile_under_zero(trained, text):
    name, report = trained
    led = ledger(report, plan(text, m=2))
    assert sum(r.optimizer_flops - r.optimizer_redundant_flops for r in led.ranks) == \
        PER_ELEMENT[name] * elements(1)


@pytest.mark.parametrize("text, message", [
    pytest.param("dp=2,zero1,zero2", "zero1 and zero2 are different shardings", id="zero1-zero2"),
    pytest.param("dp=2,fsdp,zero1", "zero1 and fsdp are different shardings", id="fsdp-zero1"),
    pytest.param("tp=2,zero2", "zero2 shards over the data- and context-parallel ranks", id="zero2-without-dp"),
])
def test_bad_zero_plans_name_the_flags(text, message):
    with pytest.raises(UsageError, match=message) as e:
        parse_parallel(text)
    assert e.value.exit_code == 2


def test_cli_zero1_with_and_without_memory(tmp_path, capsys):
    from flopcount.cli import main

    cfg = tmp_path / "config.json"
    config().to_json_file(cfg)
    common = ["--hf", str(cfg), "--input-shape", f"input_ids={B}x{S}", "--mode", "train", "--optimizer", "adamw",
              "--parallel", "dp=2,zero1"]
    assert main([*common, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parallel"]["plan"]["zero1"] is True and out["parallel"]["plan"]["zero2"] is False
    comm = {(c["kind"], c["group"]) for c in out["parallel"]["ranks"][0]["communication"]}
    assert comm == {("all_reduce", "dp"), ("all_gather", "dp")}
    assert main([*common, "--memory", "--memory-device", "cpu"]) == 0
    assert "dp=2,zero1" in capsys.readouterr().out
    assert main([*common, "--memory", "--memory-device", "cpu", "--format", "json"]) == 0
    ranks = json.loads(capsys.readouterr().out)["memory"]["ranks"]
    assert {r["optimizer_bytes"] for r in ranks} == {2 * 2 * elements(1) // 2 + 4 * 11}  # each rank's half, counters
    assert main([*common[:-1], "dp=2,zero1,fsdp"]) == 2
    assert "zero1 and fsdp are different shardings" in capsys.readouterr().err


# --- torch's ZeroRedundancyOptimizer (ZeRO-1) on 2 gloo ranks ---------------------------------------------------


def _zero_worker(rank: int, world: int, init: str, out: str) -> None:
    """One DP rank of the tiny bf16 Llama (transformers' own) under DDP with ``ZeroRedundancyOptimizer(AdamW)``:
    one step; the bytes DDP hands to its all_reduce (its buckets, read in a communication hook), the bytes the
    step broadcasts (each rank's updated parameters sent to the others, wrapping torch.distributed.broadcast), and
    the bytes of the optimizer states the rank keeps, with the elements of the parameters it steps."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)  # a forked child must not enter the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config()).to(torch.bfloat16)
    ddp = DistributedDataParallel(model)
    moved = {"all_reduce": 0, "broadcast": 0}

    def hook(state, bucket):
        moved["all_reduce"] += bucket.buffer().numel() * bucket.buffer().element_size()
        return allreduce_hook(state, bucket)

    ddp.register_comm_hook(None, hook)
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=1e-3, foreach=False)
    torch.manual_seed(1 + rank)
    ids = torch.randint(0, V, (B, S))
    ddp(input_ids=ids, labels=ids).loss.backward()
    run = dist.broadcast

    def counted(tensor, *args, **kwargs):
        moved["broadcast"] += tensor.numel() * tensor.element_size()
        return run(tensor, *args, **kwargs)

    dist.broadcast = counted
    opt.step()
    dist.broadcast = run
    states = sum(v.numel() * v.element_size() for st in opt.optim.state.values() for v in st.values()
                 if isinstance(v, torch.Tensor))
    stepped = [p.numel() for g in opt.optim.param_groups for p in g["params"]]
    with open(f"{out}.{rank}", "w") as f:
        json.dump({**moved, "states": states, "stepped": stepped}, f)
    dist.destroy_process_group()


def test_zero_redundancy_optimizer_on_gloo(trained, tmp_path):
    """torch's ZeRO-1 partitions whole parameters greedily (largest first, to the rank with fewest elements), so a
    rank keeps the states of its own parameters: two bf16 moments and a float32 step per tensor, which the test
    checks against the parameters each rank steps; the partition of these 21 tensors cannot be even (5 norms of
    H), so the ranks' states are compared in sum with the ledger's per-rank figure, D = 2 times it, and each
    rank's difference from it is the partition's imbalance. DDP's buckets all_reduce the gradients G once; the
    step broadcasts every parameter from its owner, G bytes on each rank: the ledger's all_gather of G."""
    _, report = trained
    (mine,) = per_rank(report, plan("dp=2,zero1")).ranks
    comm = {(c.kind, c.group): c.bytes for c in ledger(report, plan("dp=2,zero1")).ranks[0].communication}
    seen = gloo_ranks(_zero_worker, tmp_path)
    g = 2 * elements(1)
    assert sorted(n for r in seen for n in r["stepped"]) == sorted(report.modules.params.values())
    for r in seen:
        assert r["states"] == 2 * 2 * sum(r["stepped"]) + 4 * len(r["stepped"])
        assert comm == {("all_reduce", "dp"): r["all_reduce"], ("all_gather", "dp"): r["broadcast"]} == {
            ("all_reduce", "dp"): g, ("all_gather", "dp"): g}
    assert sum(r["states"] for r in seen) == 2 * mine.optimizer_bytes - 4  # 21 counters: the ledger rounds up to 11
