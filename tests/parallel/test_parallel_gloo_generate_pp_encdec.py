"""Generation of an encoder-decoder under pipeline parallelism against 2 real pipeline ranks on gloo (``--generate
P:N --parallel pp=2 --microbatches 2``, :mod:`flopcount.parallel.generation`): a tiny transformers BART of 1 encoder
layer and 3 decoder layers, split where a pipeline split at the model's layer 2 (the decoder's layer 1) splits it,
the model's 4 layers in 2 stages of 2: stage 0 runs the encoder, the decoder's embedding (its token and position
lookups, its norm) and the decoder's layer 0, stage 1 the decoder's layers 1 and 2 and the LM head. Each
microbatch is greedy-decoded as ``generate()`` runs it, each stage caching its decoder layers' own keys and values
and, in the prefill, their cross-attention keys and values of the encoder's output:

* the prefill: stage 0 runs the encoder over the P prompt tokens and the decoder's layer 0 over its start token,
  and sends the encoder's output (B·P·h, which the cross-attentions of stage 1's layers read) and the decoder's
  stream (B·h); stage 1 runs its layers and the head and sends the new token ids back to stage 0 (B int64);
* each of the N − 1 decode steps: stage 0 looks the token up and runs the decoder's layer 0 over its cache, and
  sends the stream (B·h); stage 1 runs its layers over their caches (the cross-attention's keys and values read from
  the cache, no encoder output sent again) and sends the token ids back, but in the last step.

Stage 1's logits equal the whole model's (transformers' forward over the generated sequence), the tokens are their
greedy picks; each rank's ``FlopCounterMode`` products in each phase equal the
ledger's share of the products of that phase's graph on its stage, its phases' sum its FLOPs in the ledger, and the
bytes it sends the ledger's ``send_recv``, and the bytes of the caches it holds at the end (its M microbatches') the
memory ledger's, each equal to the closed forms written here."""

from __future__ import annotations

import json

import pytest
from helpers import gloo_ranks

from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import plan_shares

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H, HEADS, FFN, V = 32, 4, 48, 64  # hidden, heads, MLP width, vocabulary
ENC, DEC = 1, 3  # the encoder's layers and the decoder's: the model's 4 in 2 stages, the split at decoder layer 1
B, P, N, M = 2, 6, 2, 2  # batch of a microbatch, prompt, new tokens, microbatches


def config():
    return transformers.BartConfig(d_model=H, encoder_layers=ENC, decoder_layers=DEC, encoder_attention_heads=HEADS,
                                   decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                                   vocab_size=V, max_position_embeddings=32, pad_token_id=1, bos_token_id=0,
                                   eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=None,
                                   attn_implementation="eager")


def bart():
    torch.manual_seed(0)
    return transformers.BartForConditionalGeneration(config()).eval()


def prompt(j: int):
    torch.manual_seed(1 + j)
    return torch.randint(3, V, (B, P))


@pytest.fixture(scope="module")
def report():
    import flopcount

    return flopcount.from_hf(config(), generate=(P, N), batch=B, parallel="pp=2", microbatches=M, memory=True,
                             cache_dir=False)


def _embedded(model, ids, past: int):
    """The decoder's embedding of one token a sequence at position ``past``: token and position lookups, norm."""
    dec = model.model.decoder
    x = dec.embed_tokens(ids) + dec.embed_positions(ids, past, position_ids=torch.tensor([past]))
    return dec.layernorm_embedding(x)


def _layers(model, x, memory, cache, which):
    """The decoder's layers ``which`` over one token a sequence, their caches in ``cache``."""
    for i in which:
        out = model.model.decoder.layers[i](x, encoder_hidden_states=memory, past_key_values=cache, use_cache=True)
        x = out[0] if isinstance(out, tuple) else out
    return x


def _stage0(model, j: int, step: int, state: dict, ids):
    """What stage 0 sends in phase ``step`` of microbatch ``j`` (0: the prefill)."""
    if step == 0:
        state["memory"] = model.model.encoder(input_ids=prompt(j)).last_hidden_state
        sent = (state["memory"],)
    else:
        sent = ()
    x = _layers(model, _embedded(model, ids, step), state["memory"], state["cache"], range(1))
    return (*sent, x)


def _stage1(model, step: int, state: dict, got):
    """The logits of the new token of phase ``step`` from what stage 0 sent."""
    if step == 0:
        state["memory"], x = got
    else:
        (x,) = got
    x = _layers(model, x, state["memory"], state["cache"], range(1, DEC))
    return model.lm_head(x)[:, -1] + model.final_logits_bias[0]


def _cache():
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    return EncoderDecoderCache(DynamicCache(), DynamicCache())


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model, sent, flops, logits = bart(), 0, [[0] * N for _ in range(M)], [[] for _ in range(M)]
    states = [{"cache": _cache()} for _ in range(M)]
    seqs = [torch.full((B, 1), config().decoder_start_token_id, dtype=torch.int64) for _ in range(M)]

    def send(x) -> None:
        nonlocal sent
        sent += x.numel() * x.element_size()
        dist.send(x.contiguous(), 1 - rank)

    with torch.no_grad():
        for step in range(N):  # each phase runs the M microbatches through the two stages
            for j in range(M):
                with FlopCounterMode(display=False) as counter:
                    if rank == 0:
                        for x in _stage0(model, j, step, states[j], seqs[j][:, -1:]):
                            send(x)
                    else:
                        shapes = [(B, P, H)] * (step == 0) + [(B, 1, H)]
                        got = [torch.empty(s) for s in shapes]
                        for y in got:
                            dist.recv(y, 0)
                        last = _stage1(model, step, states[j], got)
                flops[j][step] = counter.get_total_flops()
                if rank == 1:
                    logits[j].append(last.tolist())
                    token = last.argmax(-1, keepdim=True)
                    if step < N - 1:  # the next step's token, back to stage 0
                        send(token)
                    seqs[j] = torch.cat([seqs[j], token], 1)
                elif step < N - 1:
                    token = torch.empty(B, 1, dtype=torch.int64)
                    dist.recv(token, 1)
                    seqs[j] = torch.cat([seqs[j], token], 1)
    # every microbatch's cache, all alive at the end: each of the stage's decoder layers' own and cross-attention's
    held = sum(z.numel() * z.element_size() for state in states
               for c in (state["cache"].self_attention_cache, state["cache"].cross_attention_cache)
               for layer in c.layers if getattr(layer, "keys", None) is not None for z in (layer.keys, layer.values))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"sent": sent, "flops": flops, "seqs": [s.tolist() for s in seqs], "logits": logits,
                   "held": held}, f)
    dist.destroy_process_group()


def products(report, stage: int, within=None) -> int:
    plan = parse_parallel("pp=2", microbatches=M)
    return sum(x.forward for x in plan_shares(report, plan, None, within)[1]
               if x.stage == stage and report.nodes[x.index].family in ("matmul", "gemm"))


def test_pp_generation_of_bart_on_gloo_equals_the_ledger(report, tmp_path):
    seen = gloo_ranks(_worker, tmp_path)
    led, steps = report.parallel, dict(report.generation.step_reports)
    with torch.no_grad():
        model = bart()
        for j in range(M):
            seq = torch.tensor(seen[1]["seqs"][j])
            whole = model(input_ids=prompt(j), decoder_input_ids=seq[:, :-1]).logits
            assert torch.allclose(torch.tensor(seen[1]["logits"][j]).transpose(0, 1), whole, atol=1e-5)
            assert seq[:, 1:].tolist() == whole.argmax(-1).tolist()
            assert seen[0]["seqs"][j] == seq[:, :-1].tolist()  # stage 0 got each token but the last
    assert sum(r.model_flops for r in led.ranks) == M * report.generation.total.flops
    a = B * H * 4  # one token's activation over the batch, fp32
    # stage 0: the encoder's output and the stream in the prefill, the stream in each step; stage 1: the token ids
    assert [r["sent"] for r in seen] == [M * (B * P * H * 4 + N * a), M * (N - 1) * B * 8]
    within = (ENC, ENC + DEC)  # a decode step's graph: the decoder's layers, the model's layers 1 to 3 of 4
    for stage, rank in enumerate(seen):
        pp = [c.bytes for c in led.ranks[stage].communication if c.group == "pp"]
        assert pp == [rank["sent"]]
        prefill = products(report, stage)
        decode = [products(steps[c], stage, within) for c in range(2, N + 1)]
        assert all(f == [prefill, *decode] for f in rank["flops"]), (rank["flops"], prefill, decode)
        assert decode[0] > 0  # both stages run decoder layers in each decode step
        # K and V of the stage's decoder layers (1 on stage 0, 2 on stage 1): N positions of its own, P cross-attended,
        # for each of the M microbatches
        assert rank["held"] == report.memory.ranks[stage].kv_cache_bytes == M * (1 + stage) * 2 * B * H * (N + P) * 4
