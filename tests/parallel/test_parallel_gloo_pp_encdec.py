"""Pipeline parallelism of encoder-decoders on 2 real gloo ranks: tiny models built from their configurations with
transformers (random weights, nothing downloaded), split by hand in 2 stages where a pipeline split at a layer splits
them (what runs before the split point on stage 0, the rest on stage 1, whatever crosses it sent):

* **BART**, 2 encoder and 2 decoder layers, split at the decoder's first layer: stage 0 runs the encoder and the
  decoder's embedding (its token lookup, positions and norm), stage 1 the decoder's layers, each reading the
  encoder's output in its cross-attention. Stage 0 sends the encoder's output (B·SE·H) and the decoder's embedded
  tokens (B·SD·H);
* **T5**, 3 encoder layers and 1 decoder layer, split at the encoder's layer 2: stage 0 runs the lookups (the
  encoder's and the decoder's, on their one table) and encoder layers 0 and 1, stage 1 encoder layer 2, the final
  norm and the decoder. Stage 0 sends the encoder's stream (B·SE·H), the relative position bias layer 0 made from its
  table (1 × HEADS × SE × SE, read by every encoder layer: as transformers' T5 blocks pass it on) and the decoder's
  looked-up tokens (B·SD·H).

Each microbatch's messages go forward and their gradients back (1F1B and GPipe orders run the same FLOPs and
messages). Each rank's ``FlopCounterMode`` total equals the ledger's products on its stage, the bytes it sends the
ledger's ``send_recv`` and the closed form M·Σ message bytes; each stage's parameter bytes both ledgers' and torch's."""

from __future__ import annotations

import json

import pytest
from helpers import gloo_ranks

from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H, HEADS, FFN, V = 32, 4, 64, 64  # hidden, heads, MLP width, vocabulary
B, SE, SD = 2, 8, 6  # batch, encoder tokens, decoder tokens
M = 2  # microbatches per step
#: per model, the shapes of what stage 0 sends (fp32), in the order it sends them
SENT = {"bart": ((B, SE, H), (B, SD, H)), "t5": ((B, SE, H), (1, HEADS, SE, SE), (B, SD, H))}


def config(name: str):
    if name == "bart":
        return transformers.BartConfig(d_model=H, encoder_layers=2, decoder_layers=2, encoder_attention_heads=HEADS,
                                       decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                                       vocab_size=V, max_position_embeddings=32, dropout=0.0, attention_dropout=0.0,
                                       activation_dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                                       decoder_start_token_id=2, attn_implementation="eager")
    return transformers.T5Config(d_model=H, d_kv=H // HEADS, d_ff=FFN, num_layers=3, num_decoder_layers=1,
                                 num_heads=HEADS, vocab_size=V, dropout_rate=0.0, decoder_start_token_id=0,
                                 pad_token_id=0, eos_token_id=1, attn_implementation="eager")


def ids(j: int):
    torch.manual_seed(1 + j)
    return torch.randint(3, V, (B, SE)), torch.randint(3, V, (B, SD))


@pytest.fixture(scope="module", params=sorted(SENT))
def counted(request, tmp_path_factory):
    import flopcount

    name = request.param
    return name, flopcount.from_hf(config(name), {"input_ids": (B, SE), "decoder_input_ids": (B, SD)},
                                   convention="dense", cache_dir=tmp_path_factory.mktemp(name), mode="train",
                                   optimizer="sgd", memory=MemorySettings(device="cpu"))


def _model(name: str):
    torch.manual_seed(0)
    return (transformers.BartModel if name == "bart" else transformers.T5Model)(config(name)).train()


def _causal(model, x):
    from transformers.masking_utils import create_causal_mask

    return create_causal_mask(config=model.decoder.config, inputs_embeds=x,
                              attention_mask=torch.ones(B, SD, dtype=torch.long), past_key_values=None)


def _stage0(name: str, model, j: int) -> tuple:
    """What stage 0 sends for microbatch ``j`` (:data:`SENT`)."""
    source, target = ids(j)
    if name == "bart":
        memory = model.encoder(input_ids=source).last_hidden_state
        dec = model.decoder
        x = dec.embed_tokens(target) + dec.embed_positions(target, 0, position_ids=torch.arange(SD))
        return memory, dec.layernorm_embedding(x)
    h, bias = model.encoder.dropout(model.encoder.embed_tokens(source)), None
    for block in model.encoder.block[:2]:
        h, bias, _ = block(h, None, bias)
    return h, bias, model.decoder.embed_tokens(target)


def _stage1(name: str, model, sent: tuple):
    """The rest of the model on what stage 0 sent: the decoder's output summed (the loss)."""
    if name == "bart":
        memory, x = sent
        mask = _causal(model, x)
        for layer in model.decoder.layers:
            out = layer(x, attention_mask=mask, encoder_hidden_states=memory, use_cache=False)
            x = out[0] if isinstance(out, tuple) else out
        return x.sum()
    h, bias, tokens = sent
    enc, dec = model.encoder, model.decoder
    h, _, _ = enc.block[2](h, None, bias)
    memory = enc.dropout(enc.final_layer_norm(h))
    y = dec.dropout(tokens)
    y, _, _ = dec.block[0](y, _causal(model, y), None, memory, None, None, past_key_values=None, use_cache=False)
    return dec.dropout(dec.final_layer_norm(y)).sum()


def _stage_parameters(name: str, model, stage: int) -> int:
    """torch's parameter elements of a stage: stage 1's layers (and T5's final norms), stage 0 the rest."""
    if name == "bart":
        later = list(model.decoder.layers.parameters())
    else:
        later = [*model.encoder.block[2].parameters(), *model.encoder.final_layer_norm.parameters(),
                 *model.decoder.block.parameters(), *model.decoder.final_layer_norm.parameters()]
    n = sum(x.numel() for x in later)
    return n if stage == 1 else sum(x.numel() for x in model.parameters()) - n


def _worker(rank: int, world: int, init: str, out: str, name: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model = _model(name)
    sent = 0

    def send(x) -> None:
        nonlocal sent
        sent += x.numel() * x.element_size()
        dist.send(x.contiguous(), 1 - rank)

    with FlopCounterMode(display=False) as counter:
        for j in range(M):  # a send returns once received: each microbatch's backward before the next forward
            if rank == 0:
                made = _stage0(name, model, j)
                for x in made:
                    send(x.detach())
                grads = tuple(torch.empty(shape) for shape in SENT[name])
                for g in grads:
                    dist.recv(g, 1)
                torch.autograd.backward(made, grads)
            else:
                got = tuple(torch.empty(shape) for shape in SENT[name])
                for y in got:
                    dist.recv(y, 0)
                    y.requires_grad_()
                _stage1(name, model, got).backward()
                for y in got:
                    send(y.grad)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "sent": sent}, f)
    dist.destroy_process_group()


@pytest.mark.parametrize("name", sorted(SENT))
def test_the_stages_run_the_whole_model(name):
    """The hand split runs the model: its two stages' loss is the whole model's decoder output summed."""
    model = _model(name)
    source, target = ids(0)
    whole = model(input_ids=source, decoder_input_ids=target).last_hidden_state.sum()
    made = _stage0(name, model, 0)
    assert [tuple(x.shape) for x in made] == list(SENT[name])
    assert torch.allclose(_stage1(name, model, made), whole, atol=1e-4)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pp_of_an_encoder_decoder_on_gloo_equals_the_ledger(counted, tmp_path, schedule):
    name, report = counted
    seen = gloo_ranks(_worker, tmp_path, name)
    p = parse_parallel("pp=2", microbatches=M, schedule=schedule)
    led = ledger(report, p)
    shares = node_shares(report, p)
    message = sum(4 * a * b * c * (d[0] if d else 1) for a, b, c, *d in SENT[name])  # fp32
    assert sum(r.model_flops for r in led.ranks) == M * (report.forward.flops + report.backward.flops)
    mem = per_rank(report, p).ranks
    model = _model(name)
    for rank, r in enumerate(seen):
        assert r["flops"] == M * sum(x.forward + x.backward for x in shares if x.stage == rank
                                     and report.nodes[x.index].family in ("matmul", "gemm"))
        pp = [c.bytes for c in led.ranks[rank].communication if c.group == "pp"]
        assert r["sent"] == pp[0] == M * message, rank
        elements = _stage_parameters(name, model, rank)
        assert mem[rank].params_bytes == 4 * elements == 4 * led.ranks[rank].optimizer_flops // 2
