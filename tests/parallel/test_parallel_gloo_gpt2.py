"""FLOPs, collective bytes and parameters per rank against 2 real TP ranks on gloo, for a GPT-2-like model the
ledger has never seen by name: a fused QKV projection (Conv1D's layout, one Gemm with its bias), GELU MLP, biases
everywhere, LayerNorms, learned positions and an LM head tied to a vocab-parallel embedding, its modules named
``blocks.N.mix.qkv``/``out`` and ``blocks.N.ff.up``/``down`` (no Hugging Face name), so that the layout finds each
part by its role in the graph. Written with Megatron-style local shards: the fused QKV and the MLP's first
projection column-parallel with their biases split, the two output projections row-parallel with their biases whole
on every rank, added after the all_reduce (Megatron's RowParallelLinear, torch's RowwiseParallel)."""

from __future__ import annotations

import json

import pytest
from gloo_shards import B, H, L, M, P, S, V, Recorder, gpt2_like, ledger_bytes
from helpers import gloo_ranks

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

torch = pytest.importorskip("torch")


def ids():
    torch.manual_seed(1)
    return torch.randint(0, V, (B, S))


@pytest.fixture(scope="module")
def report():
    import flopcount

    return flopcount.from_torch(gpt2_like(), (ids(),), training=True, optimizer="sgd", cache_dir=False,
                                memory=MemorySettings(device="cpu"))


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec = Recorder()
    module = gpt2_like(world, rank, rec)
    with FlopCounterMode(display=False) as counter:
        module(ids()).backward()
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "bytes": rec.bytes(), "params": params}, f)
    dist.destroy_process_group()


def test_whole_model_is_the_one_counted(report):
    # the counted model is the t = 1 build: its parameters, the tied embedding once
    assert report.params == V * H + P * H + L * (2 * 2 * H + 3 * H * H + 3 * H + H * H + H + 4 * H * H + 4 * H
                                                 + 4 * H * H + H) + 2 * H


def test_tp_on_gloo_equals_the_ledger(report, tmp_path):
    seen = gloo_ranks(_worker, tmp_path)
    p = parse_parallel("tp=2")
    led = ledger(report, p)
    mem = per_rank(report, p).ranks
    # torch's addmm counts 2·M·K·N: the ledger's Gemms also count their bias adds and the bias gradients' sums,
    # M·N each, split with the column-parallel projections (3H and 4H outputs), whole with the row-parallel ones
    bias = L * 2 * (M * 3 * H // 2 + M * 4 * H // 2 + 2 * M * H)
    for i, rank in enumerate(seen):
        products = sum(x.forward + x.backward for x in node_shares(report, p)
                       if x.tp == i and report.nodes[x.index].family in ("matmul", "gemm"))
        assert rank["flops"] == products - bias
        assert rank["bytes"] == ledger_bytes(led.ranks[i])  # all_reduce(tp): no other collective
        # the parameters each rank holds (row-parallel biases whole), in the memory and the optimizer ledgers
        assert rank["params"] == mem[i].params_bytes == 4 * led.ranks[i].optimizer_flops // 2
