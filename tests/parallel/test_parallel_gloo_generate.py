"""Generation under tensor parallelism against 2 real TP ranks on gloo (``--generate P:N --parallel tp=2``,
:mod:`flopcount.parallel.generation`): a tiny transformers Llama (4 heads, 2 K/V heads, SwiGLU, untied head), its
weights cut into Megatron-style local shards (Q, K, V, gate and up by output rows, O and down by input columns,
the embedding and the LM head by vocabulary rows), greedy-decoded with a KV cache of each rank's K/V heads: the
prefill of the P prompt tokens, then N − 1 decode steps of one token. The vocab-parallel lookup and each attention
and MLP block's output are all-reduced; the last position's logits of each phase, this rank's V/T, are all-gathered
for every rank to pick the same next token. Each rank's logits equal the whole model's (transformers' forward over
the generated sequence), the bytes it hands to each collective equal the generation ledger's, and its
``FlopCounterMode`` products in each phase equal the ledger's share of the product nodes of the prefill's and
each decode step's graphs."""

from __future__ import annotations

import json

import pytest
from gloo_shards import Recorder, ledger_bytes, vocab_lookup
from helpers import gloo_ranks

from flopcount.parallel.generation import generation_ledger
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import node_shares

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H, L, HEADS, KV, FFN, V = 32, 2, 4, 2, 48, 64
D = H // HEADS
B, P, N = 2, 8, 3  # N new tokens: the prefill's, then N − 1 decode steps


def config():
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=FFN, num_hidden_layers=L,
                                    num_attention_heads=HEADS, num_key_value_heads=KV, vocab_size=V,
                                    architectures=["LlamaForCausalLM"])


def llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config()).eval()


def prompt():
    torch.manual_seed(1)
    return torch.randint(0, V, (B, P))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import flopcount

    return flopcount.from_hf(config(), generate=(P, N), batch=B, cache_dir=tmp_path_factory.mktemp("cache"))


def shards(model, t: int, rank: int) -> dict:
    """This rank's local shards of ``model``'s weights (nn.Linear's (out, in) layout): column-parallel by output
    rows (whole heads: the K/V heads' rows for K and V), row-parallel by input columns, norms whole."""
    sd = model.state_dict()
    rows, cols = (lambda w: w.chunk(t, 0)[rank]), (lambda w: w.chunk(t, 1)[rank])
    out = {"embed": rows(sd["model.embed_tokens.weight"]), "head": rows(sd["lm_head.weight"]),
           "norm": sd["model.norm.weight"]}
    for i in range(L):
        pre = f"model.layers.{i}."
        for name in ("q", "k", "v"):
            out[f"{i}.{name}"] = rows(sd[f"{pre}self_attn.{name}_proj.weight"])
        out[f"{i}.o"] = cols(sd[f"{pre}self_attn.o_proj.weight"])
        out[f"{i}.gate"], out[f"{i}.up"] = rows(sd[f"{pre}mlp.gate_proj.weight"]), rows(sd[f"{pre}mlp.up_proj.weight"])
        out[f"{i}.down"] = cols(sd[f"{pre}mlp.down_proj.weight"])
        out[f"{i}.norm1"] = sd[f"{pre}input_layernorm.weight"]
        out[f"{i}.norm2"] = sd[f"{pre}post_attention_layernorm.weight"]
    return out


def tp_step(model, w: dict, ids, start: int, cache: list, t: int, rank: int, rec: Recorder):
    """One phase on this rank: the tokens ``ids`` at positions ``start``… through the layers, K and V appended to
    ``cache``; the last position's logits, all V of them once gathered."""
    reduce = rec.all_reduce if t > 1 else (lambda x: x)
    b, s = ids.shape
    x = vocab_lookup(ids, w["embed"], rank, t, reduce)
    cos, sin = model.model.rotary_emb(x, torch.arange(start, start + s).expand(b, s))
    cos, sin = cos[:, None], sin[:, None]

    def rope(z):
        half = torch.cat([-z[..., D // 2:], z[..., :D // 2]], -1)
        return z * cos + half * sin

    def norm(z, weight):
        return weight * (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + model.config.rms_norm_eps))

    for i in range(L):
        y = norm(x, w[f"{i}.norm1"])
        q, k, v = ((y @ w[f"{i}.{n}"].T).view(b, s, -1, D).transpose(1, 2) for n in "qkv")
        q, k = rope(q), rope(k)
        if len(cache) > i:
            k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
            cache[i] = (k, v)
        else:
            cache.append((k, v))
        k, v = (z.repeat_interleave(HEADS // KV, 1) for z in (k, v))
        mask = torch.full((s, k.shape[2]), float("-inf")).triu(k.shape[2] - s + 1)  # causal over the cache
        a = torch.softmax(q @ k.transpose(-1, -2) * D ** -0.5 + mask, -1) @ v
        x = x + reduce(a.transpose(1, 2).reshape(b, s, -1) @ w[f"{i}.o"].T)
        y = norm(x, w[f"{i}.norm2"])
        x = x + reduce((torch.nn.functional.silu(y @ w[f"{i}.gate"].T) * (y @ w[f"{i}.up"].T)) @ w[f"{i}.down"].T)
    logits = norm(x[:, -1:], w["norm"]) @ w["head"].T  # (b, 1, V/t): the last position's, this rank's vocabulary
    return (rec.gather(logits.transpose(1, 2)).transpose(1, 2) if t > 1 else logits)[:, 0]


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec, model = Recorder(), llama()
    w, cache, seq, logits, flops = shards(model, world, rank), [], prompt(), [], []
    with torch.no_grad():
        for j in range(N):  # the prefill, then the decode steps: each feeds the tokens not yet in the cache
            with FlopCounterMode(display=False) as counter:
                last = tp_step(model, w, seq[:, -1:] if j else seq, seq.shape[1] - 1 if j else 0, cache, world,
                               rank, rec)
            flops.append(counter.get_total_flops())
            logits.append(last.tolist())
            seq = torch.cat([seq, last.argmax(-1, keepdim=True)], 1)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"bytes": rec.bytes(), "flops": flops, "logits": logits, "seq": seq.tolist()}, f)
    dist.destroy_process_group()


def products(report, plan, rank: int) -> int:
    return sum(x.forward for x in node_shares(report, plan)
               if x.tp == rank and report.nodes[x.index].family in ("matmul", "gemm"))


def test_tp_decode_on_gloo_equals_the_generation_ledger(report, tmp_path):
    seen = gloo_ranks(_worker, tmp_path)
    plan = parse_parallel("tp=2")
    led = generation_ledger(report, plan)
    steps = dict(report.generation.step_reports)
    a_p, a_d = B * P * H * 4, B * H * 4  # the prefill's activation and a decode step's, fp32
    with torch.no_grad():
        whole = llama()(torch.tensor(seen[0]["seq"])).logits  # the whole model over the generated sequence
    for i, rank in enumerate(seen):
        assert rank["seq"] == seen[0]["seq"]  # every rank picks the same tokens from the gathered logits
        for j, got in enumerate(rank["logits"]):  # the last position of each phase: the prompt's, each new token's
            assert torch.allclose(torch.tensor(got), whole[:, P - 1 + j], atol=1e-5)
        # all_reduce after the lookup and each attention and MLP block, in the prefill and each decode step;
        # all_gather of the last position's V logits of each phase
        assert rank["bytes"] == ledger_bytes(led.ranks[i]) == {
            "all_reduce(tp)": (2 * L + 1) * (a_p + (N - 1) * a_d), "all_gather(tp)": N * B * V * 4}
        prefill, *decode = rank["flops"]
        assert prefill == products(report, plan, i)
        assert decode == [products(steps[P + j], plan, i) for j in range(1, N)]
