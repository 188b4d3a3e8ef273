"""Pipeline parallelism of an encoder-decoder on 2 real gloo ranks: a tiny BART built from its configuration with
transformers (random weights, nothing downloaded), split by hand where a pipeline split at the decoder's first layer
splits it. Stage 0 runs the encoder and the decoder's embedding (its token lookup, positions and norm); stage 1 the
decoder's layers, each reading the encoder's output in its cross-attention. Per microbatch stage 0 sends the
encoder's output (B·SE·H) and the decoder's embedded tokens (B·SD·H), and stage 1 sends both gradients back.
Each rank's ``FlopCounterMode`` total equals the ledger's products on its stage, and the bytes it sends the ledger's
``send_recv`` and the closed form M·B·(SE + SD)·H·4; per stage the model FLOPs add up to the whole model's."""

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

H, HEADS, FFN, V, LAYERS = 32, 4, 64, 64, 2  # hidden, heads, MLP width, vocabulary, layers of each stack
B, SE, SD = 2, 8, 6  # batch, encoder tokens, decoder tokens
M = 2  # microbatches per step


def config():
    return transformers.BartConfig(d_model=H, encoder_layers=LAYERS, decoder_layers=LAYERS,
                                   encoder_attention_heads=HEADS, decoder_attention_heads=HEADS, encoder_ffn_dim=FFN,
                                   decoder_ffn_dim=FFN, vocab_size=V, max_position_embeddings=32, dropout=0.0,
                                   attention_dropout=0.0, activation_dropout=0.0, pad_token_id=1, bos_token_id=0,
                                   eos_token_id=2, decoder_start_token_id=2, attn_implementation="eager")


def ids(j: int):
    torch.manual_seed(1 + j)
    return torch.randint(3, V, (B, SE)), torch.randint(3, V, (B, SD))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    import flopcount

    return flopcount.from_hf(config(), {"input_ids": (B, SE), "decoder_input_ids": (B, SD)}, convention="dense",
                             cache_dir=tmp_path_factory.mktemp("bart"), mode="train", optimizer="sgd",
                             memory=MemorySettings(device="cpu"))


def _model():
    torch.manual_seed(0)
    return transformers.BartModel(config()).train()


def _stage0(model, j: int):
    """The encoder's output and the decoder's embedded tokens of microbatch ``j``."""
    source, target = ids(j)
    memory = model.encoder(input_ids=source).last_hidden_state
    dec = model.decoder
    x = dec.embed_tokens(target) + dec.embed_positions(target, 0, position_ids=torch.arange(SD))
    return memory, dec.layernorm_embedding(x)


def _stage1(model, memory, x):
    """The decoder's layers on its embedded tokens ``x``, reading the encoder's output ``memory``: the loss."""
    from transformers.masking_utils import create_causal_mask

    mask = create_causal_mask(config=model.config, inputs_embeds=x, attention_mask=torch.ones(B, SD, dtype=torch.long),
                              past_key_values=None)
    for layer in model.decoder.layers:
        out = layer(x, attention_mask=mask, encoder_hidden_states=memory, use_cache=False)
        x = out[0] if isinstance(out, tuple) else out
    return x.sum()


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    model = _model()
    sent = 0

    def send(x) -> None:
        nonlocal sent
        sent += x.numel() * x.element_size()
        dist.send(x.contiguous(), 1 - rank)

    with FlopCounterMode(display=False) as counter:
        for j in range(M):  # a send returns once received: each microbatch's backward before the next forward
            if rank == 0:
                memory, x = _stage0(model, j)
                send(memory.detach())
                send(x.detach())
                grads = torch.empty(B, SE, H), torch.empty(B, SD, H)
                for g in grads:
                    dist.recv(g, 1)
                torch.autograd.backward((memory, x), grads)
            else:
                memory, x = torch.empty(B, SE, H), torch.empty(B, SD, H)
                for y in (memory, x):
                    dist.recv(y, 0)
                    y.requires_grad_()
                _stage1(model, memory, x).backward()
                send(memory.grad)
                send(x.grad)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"flops": counter.get_total_flops(), "sent": sent}, f)
    dist.destroy_process_group()


def test_the_whole_model_runs_what_the_stages_run():
    """The hand split runs the model: its two stages' loss is the whole decoder's output summed."""
    model = _model()
    source, target = ids(0)
    whole = model(input_ids=source, decoder_input_ids=target).last_hidden_state.sum()
    assert torch.allclose(_stage1(model, *_stage0(model, 0)), whole, atol=1e-4)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_pp_of_an_encoder_decoder_on_gloo_equals_the_ledger(report, tmp_path, schedule):
    seen = gloo_ranks(_worker, tmp_path)
    p = parse_parallel("pp=2", microbatches=M, schedule=schedule)
    led = ledger(report, p)
    shares = node_shares(report, p)
    message = B * (SE + SD) * H * 4  # the encoder's output and the decoder's embedded tokens, fp32
    whole = report.forward.flops + report.backward.flops
    assert sum(r.model_flops for r in led.ranks) == M * whole
    for rank, r in enumerate(seen):
        assert r["flops"] == M * sum(x.forward + x.backward for x in shares if x.stage == rank
                                     and report.nodes[x.index].family in ("matmul", "gemm"))
        pp = [c.bytes for c in led.ranks[rank].communication if c.group == "pp"]
        assert r["sent"] == pp[0] == M * message, rank
    mem = per_rank(report, p).ranks
    assert [r.stage for r in mem] == [0, 1] and all(r.peak_bytes > 0 for r in mem)


def test_each_stage_holds_its_layers_and_the_encoder_output_it_receives(report):
    """Stage 1's walk receives the encoder's output and the decoder's embedded tokens (B·SE·H and B·SD·H fp32): its
    activations of a microbatch hold them, and its parameters are the decoder's layers (torch's elements)."""
    p = parse_parallel("pp=2", microbatches=M)
    mem = per_rank(report, p).ranks
    model = _model()
    decoder = sum(x.numel() for x in model.decoder.layers.parameters())
    assert mem[1].params_bytes == 4 * decoder
    assert mem[0].params_bytes == 4 * (sum(x.numel() for x in model.parameters()) - decoder)
