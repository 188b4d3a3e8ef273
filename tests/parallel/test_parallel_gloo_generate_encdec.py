"""Generation of an encoder-decoder under tensor parallelism against 2 real TP ranks on gloo (``--generate P:N
--parallel tp=2 --memory``, :mod:`flopcount.parallel.generation`): a tiny transformers T5 (4 heads, a ReLU MLP, the
token table shared by the encoder, the decoder and the head), its weights cut into Megatron-style local shards (Q,
K, V and the MLP's wi by output rows, O and wo by input columns, the token table and the head by vocabulary rows,
the relative position bias by heads), greedy-decoded as ``generate()`` runs it: the prefill is the encoder over the
P prompt tokens and the decoder over its start token, which projects the encoder's output to each layer's
cross-attention keys and values of this rank's heads, cached; then N − 1 decode steps of one token over the
decoder's own cache and the cached cross-attention keys and values. The vocab-parallel lookups and each attention
and MLP block's output are all-reduced; the head's logits, this rank's V/T, are all-gathered for every rank to pick
the same next token. Each rank's logits equal the whole model's (transformers' forward over the generated
sequence); the bytes it hands to each collective, its ``FlopCounterMode`` products in each phase, the bytes of the
caches it holds at the end and of its parameters equal the generation ledger's and the memory ledger's, and the
closed forms written here."""

from __future__ import annotations

import json

import pytest
from gloo_shards import Recorder, ledger_bytes, vocab_lookup
from helpers import gloo_ranks

from flopcount.parallel.ranks import node_shares

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H, L, HEADS, D, FFN, V = 32, 2, 4, 8, 48, 64  # hidden, layers of each stack, heads, head size, MLP width, vocabulary
B, P, N = 2, 6, 3  # N new tokens: the prefill's, then N − 1 decode steps


def config():
    c = transformers.T5Config(d_model=H, d_kv=D, d_ff=FFN, num_layers=L, num_heads=HEADS, vocab_size=V,
                              decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    c._attn_implementation = "eager"
    return c


def t5():
    torch.manual_seed(0)
    return transformers.T5ForConditionalGeneration(config()).eval()


def prompt():
    torch.manual_seed(1)
    return torch.randint(2, V, (B, P))


@pytest.fixture(scope="module")
def report():
    import flopcount

    return flopcount.from_hf(config(), generate=(P, N), batch=B, parallel="tp=2", memory=True, cache_dir=False)


def shards(model, t: int, rank: int) -> dict:
    """This rank's local shards of ``model``'s weights (nn.Linear's (out, in) layout): column-parallel by output
    rows (whole heads), row-parallel by input columns, norms whole; ``e0.q`` (encoder layer 0's Q), ``d1.cq``
    (decoder layer 1's cross-attention Q) and so on."""
    sd = model.state_dict()
    rows, cols = (lambda w: w.chunk(t, 0)[rank]), (lambda w: w.chunk(t, 1)[rank])
    out = {"tokens": rows(sd["shared.weight"]), "head": rows(sd["lm_head.weight"]),
           "e.final": sd["encoder.final_layer_norm.weight"], "d.final": sd["decoder.final_layer_norm.weight"]}
    for stack in ("encoder", "decoder"):  # the relative position bias table (buckets, heads): this rank's heads
        out[f"{stack[0]}.bias"] = cols(sd[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"])
    for stack, blocks in (("encoder", ("SelfAttention", "DenseReluDense")),
                          ("decoder", ("SelfAttention", "EncDecAttention", "DenseReluDense"))):
        for i in range(L):
            mine = f"{stack[0]}{i}."
            for j, block in enumerate(blocks):
                pre, c = f"{stack}.block.{i}.layer.{j}.", "c" if block == "EncDecAttention" else ""
                out[f"{mine}norm{j}"] = sd[f"{pre}layer_norm.weight"]
                if block == "DenseReluDense":
                    out[f"{mine}wi"], out[f"{mine}wo"] = rows(sd[f"{pre}{block}.wi.weight"]), cols(
                        sd[f"{pre}{block}.wo.weight"])
                    continue
                for name in "qkv":
                    out[f"{mine}{c}{name}"] = rows(sd[f"{pre}{block}.{name}.weight"])
                out[f"{mine}{c}o"] = cols(sd[f"{pre}{block}.o.weight"])
    return out


class Rank:
    """T5's forward on TP rank ``rank`` of ``t`` from its shards ``w``, collectives recorded by ``rec``."""

    def __init__(self, model, w: dict, t: int, rank: int, rec: Recorder):
        self.model, self.w, self.t, self.rank = model, w, t, rank
        self.reduce = rec.all_reduce if t > 1 else (lambda x: x)
        self.gather = rec.gather

    def norm(self, z, name: str):
        eps = self.model.config.layer_norm_epsilon
        return self.w[name] * (z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps))

    def project(self, y, name: str):  # (b, s, h) -> this rank's heads (b, heads/t, s, d)
        return (y @ self.w[name].T).view(y.shape[0], y.shape[1], -1, D).transpose(1, 2)

    def attend(self, q, k, v, bias, out: str):  # T5: no scaling; the bias of this rank's heads
        a = torch.softmax(q @ k.transpose(-1, -2) + bias, -1) @ v
        return self.reduce(a.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1) @ self.w[out].T)

    def mlp(self, x, pre: str, j: int):
        y = self.norm(x, f"{pre}norm{j}")
        return x + self.reduce(torch.relu(y @ self.w[f"{pre}wi"].T) @ self.w[f"{pre}wo"].T)

    def bias(self, stack, s: int, keys: int, past: int = 0):
        """The relative position bias of this rank's heads (1, heads/t, s, keys): T5's buckets of the positions'
        distances, looked up in the rank's columns of the table."""
        attn = self.model.get_encoder() if stack == "e" else self.model.get_decoder()
        attn = attn.block[0].layer[0].SelfAttention
        distance = torch.arange(keys)[None, :] - (torch.arange(s)[:, None] + past)
        buckets = attn._relative_position_bucket(distance, bidirectional=not attn.is_decoder,
                                                 num_buckets=attn.relative_attention_num_buckets,
                                                 max_distance=attn.relative_attention_max_distance)
        return torch.nn.functional.embedding(buckets, self.w[f"{stack}.bias"]).permute(2, 0, 1)[None]

    def encode(self, ids):
        x = vocab_lookup(ids, self.w["tokens"], self.rank, self.t, self.reduce)
        bias = self.bias("e", P, P)
        for i in range(L):
            y = self.norm(x, f"e{i}.norm0")
            x = x + self.attend(*(self.project(y, f"e{i}.{n}") for n in "qkv"), bias, f"e{i}.o")
            x = self.mlp(x, f"e{i}.", 1)
        return self.norm(x, "e.final")

    def decode(self, ids, past: int, own: list, cross: list, memory=None):
        """One decoder call of one token over ``past`` cached positions: K and V appended to ``own``; the
        cross-attention's K and V projected from ``memory`` into ``cross`` (the first call) or read from it."""
        x = vocab_lookup(ids, self.w["tokens"], self.rank, self.t, self.reduce)
        bias = self.bias("d", 1, past + 1, past)
        for i in range(L):
            pre = f"d{i}."
            y = self.norm(x, f"{pre}norm0")
            q, k, v = (self.project(y, f"{pre}{n}") for n in "qkv")
            if memory is None:
                k, v = torch.cat([own[i][0], k], 2), torch.cat([own[i][1], v], 2)
                own[i] = (k, v)
            else:
                own.append((k, v))
                cross.append((self.project(memory, f"{pre}ck"), self.project(memory, f"{pre}cv")))
            x = x + self.attend(q, k, v, bias, f"{pre}o")
            q = self.project(self.norm(x, f"{pre}norm1"), f"{pre}cq")
            x = x + self.attend(q, *cross[i], 0.0, f"{pre}co")
            x = self.mlp(x, pre, 2)
        y = self.norm(x, "d.final")
        if self.model.config.scale_decoder_outputs:
            y = y * H ** -0.5
        logits = y @ self.w["head"].T  # (b, 1, V/t): this rank's vocabulary
        return (self.gather(logits.transpose(1, 2)).transpose(1, 2) if self.t > 1 else logits)[:, 0]


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    rec, model = Recorder(), t5()
    me = Rank(model, shards(model, world, rank), world, rank, rec)
    own, cross, logits, flops = [], [], [], []
    seq = torch.zeros(B, 1, dtype=torch.int64)  # the decoder's start token
    with torch.no_grad():
        for j in range(N):  # the prefill (the encoder and the start token), then the decode steps
            with FlopCounterMode(display=False) as counter:
                memory = me.encode(prompt()) if j == 0 else None
                last = me.decode(seq[:, -1:], j, own, cross, memory)
            flops.append(counter.get_total_flops())
            logits.append(last.tolist())
            seq = torch.cat([seq, last.argmax(-1, keepdim=True)], 1)
    held = sum(z.numel() * z.element_size() for pair in own + cross for z in pair)
    unique = {z.data_ptr(): z.numel() * z.element_size() for z in me.w.values()}  # a tied table and head once
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"bytes": rec.bytes(), "flops": flops, "logits": logits, "seq": seq.tolist(), "held": held,
                   "params": sum(unique.values())}, f)
    dist.destroy_process_group()


def products(report, plan, rank: int) -> int:
    return sum(x.forward for x in node_shares(report, plan)
               if x.tp == rank and report.nodes[x.index].family in ("matmul", "gemm"))


def test_tp_generation_of_t5_on_gloo_equals_the_ledgers(report, tmp_path):
    seen = gloo_ranks(_worker, tmp_path)
    led, mem, plan = report.parallel, report.memory.ranks, report.parallel.plan
    steps = dict(report.generation.step_reports)
    a = B * H * 4  # one token's activation over the batch, fp32
    with torch.no_grad():
        model = t5()
        whole = model(input_ids=prompt(), decoder_input_ids=torch.tensor(seen[0]["seq"])).logits
        real = model.generate(prompt(), attention_mask=torch.ones(B, P, dtype=torch.int64), max_new_tokens=N,
                              min_new_tokens=N, do_sample=False)
    assert seen[0]["seq"] == real.tolist()  # the ranks decode what transformers' generate() does
    assert sum(r.model_flops for r in led.ranks) == report.generation.total.flops
    for i, rank in enumerate(seen):
        assert rank["seq"] == seen[0]["seq"]  # every rank picks the same tokens from the gathered logits
        for j, got in enumerate(rank["logits"]):
            assert torch.allclose(torch.tensor(got), whole[:, j], atol=1e-5)
        # the prefill: the encoder's lookup and 2 blocks a layer over P tokens, the decoder's lookup and 3 blocks a
        # layer (self-attention, cross-attention, MLP) over its start token; each decode step the decoder's again
        prefill, step = (1 + 2 * L) * P + 1 + 3 * L, 1 + 3 * L
        assert rank["bytes"] == ledger_bytes(led.ranks[i]) == {
            "all_reduce(tp)": a * (prefill + (N - 1) * step), "all_gather(tp)": N * B * V * 4}
        first, *decode = rank["flops"]
        assert first == products(report, plan, i)
        assert decode == [products(steps[c], plan, i) for c in range(2, N + 1)]
        # K and V of this rank's heads in each decoder layer: N positions of its own, the P cross-attended ones
        assert rank["held"] == mem[i].kv_cache_bytes == 2 * L * B * (HEADS // 2) * D * (N + P) * 4
        assert rank["params"] == mem[i].params_bytes
