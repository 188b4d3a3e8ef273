"""Per-rank FLOPs, communication and memory of encoder-decoders (BART: learned positions, biases; T5: relative
position bias, no biases) under tensor parallelism: both stacks' layers found, self- and cross-attention split by
heads, the cross-attention's K/V projections column-parallel on the encoder's output, each decoder layer's three
blocks ending in a TP reduction, and T5's relative position bias table split by heads. Each figure is checked against
a closed form written here from the configuration (and the parameters torch itself lists). Under pipeline
parallelism both stacks' layers are split in stages, and each stage sends what crosses its boundary (the stream, the
encoder's output, T5's position bias), and under context parallelism each attention gathers the K and V it reads
(a cross-attention the encoder's), in closed form."""

from __future__ import annotations

import functools

import pytest

from flopcount.errors import UsageError
from flopcount.memory.ledger import MemorySettings
from flopcount.memory.ranks import per_rank
from flopcount.parallel.plan import parse_parallel
from flopcount.parallel.ranks import ledger, node_shares

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, L, HEADS, FFN, V, P = 32, 2, 4, 64, 64, 32  # hidden, layers of each stack, heads, MLP width, vocabulary, positions
D = H // HEADS
B, SE, SD = 2, 8, 6  # batch, encoder tokens, decoder tokens
BUCKETS = 32  # T5's relative attention buckets (its default)
F32 = 4


def bart_config():
    return transformers.BartConfig(d_model=H, encoder_layers=L, decoder_layers=L, encoder_attention_heads=HEADS,
                                   decoder_attention_heads=HEADS, encoder_ffn_dim=FFN, decoder_ffn_dim=FFN,
                                   vocab_size=V, max_position_embeddings=P, pad_token_id=0, bos_token_id=1,
                                   eos_token_id=2)


def t5_config():
    return transformers.T5Config(d_model=H, d_kv=D, d_ff=FFN, num_layers=L, num_heads=HEADS, vocab_size=V,
                                 relative_attention_num_buckets=BUCKETS, decoder_start_token_id=0, pad_token_id=0,
                                 eos_token_id=1)


CONFIGS = {"bart": bart_config, "t5": t5_config}


@functools.cache
def count(name: str, sd: int = SD):
    """The encoder-decoder ``name`` counted for training (SGD, the memory ledger), once per module."""
    import flopcount

    config = CONFIGS[name]()
    config._attn_implementation = "eager"
    return flopcount.from_hf(config, {"input_ids": (B, SE), "decoder_input_ids": (B, sd)}, cache_dir=False,
                             mode="train", optimizer="sgd", memory=MemorySettings(device="cpu"))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model(request):
    return request.param, count(request.param)


def plan(text: str, m: int = 1):
    return parse_parallel(text, microbatches=m)


def products(t: int) -> int:
    """Forward FLOPs of the products (MatMul) on one of t TP ranks, 2 a multiply-add, all split 1/t: per encoder
    layer of B·SE tokens Q, K, V, O (H×H) and the MLP's two (H×FFN), scores and context (B·HEADS·SE·SE·D
    each); per decoder layer of B·SD tokens the self-attention's four, the cross-attention's Q and O on the
    decoder's tokens and its K and V on the encoder's B·SE, the MLP's two, self scores and context (SD×SD) and
    cross (SD×SE)."""
    return L * sum(layer_products()) // t


def layer_products() -> tuple[int, int]:
    """:func:`products`' terms of one encoder layer and of one decoder layer, on one rank."""
    me, md = B * SE, B * SD
    encoder = 4 * 2 * me * H * H + 2 * 2 * me * H * FFN + 2 * 2 * B * HEADS * SE * SE * D
    decoder = (6 * 2 * md * H * H + 2 * 2 * me * H * H + 2 * 2 * md * H * FFN + 2 * 2 * B * HEADS * SD * SD * D
               + 2 * 2 * B * HEADS * SD * SE * D)
    return encoder, decoder


def bart_elements(t: int) -> int:
    """BART's parameter elements on one of t TP ranks: the shared embedding V·H/t (vocab-parallel); two position
    tables ((P + 2)·H: BART's offset of 2) and two embedding LayerNorms (2H) whole; per encoder layer Q, K, V
    (H·H + H)/t and fc1 (H·FFN + FFN)/t column-parallel, O H·H/t and fc2 FFN·H/t row-parallel with their biases H
    whole, two LayerNorms; per decoder layer the same with a cross-attention's Q, K, V, O more and three LayerNorms."""
    column, row = (H * H + H) // t, H * H // t + H
    mlp = (H * FFN + FFN) // t + FFN * H // t + H
    encoder = 3 * column + row + mlp + 2 * 2 * H
    decoder = 6 * column + 2 * row + mlp + 3 * 2 * H
    return V * H // t + 2 * (P + 2) * H + 2 * 2 * H + L * (encoder + decoder)


def t5_elements(t: int) -> int:
    """T5's on one of t TP ranks: the shared embedding V·H/t; the relative attention bias (BUCKETS × HEADS) of each
    stack's layer 0 split by heads, BUCKETS·HEADS/t; per encoder layer Q, K, V, O (H·H/t, no biases), wi and wo
    H·FFN/t and two RMS norms (H); per decoder layer eight attention projections and three norms; two final norms."""
    encoder = 4 * H * H // t + 2 * H * FFN // t + 2 * H
    decoder = 8 * H * H // t + 2 * H * FFN // t + 3 * H
    return V * H // t + 2 * BUCKETS * HEADS // t + L * (encoder + decoder) + 2 * H


ELEMENTS = {"bart": bart_elements, "t5": t5_elements}


def tp_bytes(sp: bool) -> dict[str, int]:
    """One training microbatch's TP collectives, in bytes (fp32): per encoder layer 2 blocks (attention, MLP) of
    B·SE tokens reduced after their row-parallel projection and 2 before their column-parallel ones in the
    backward; per decoder layer 3 blocks (self-attention, cross-attention, MLP) of B·SD tokens, and the
    cross-attention's K/V input, the encoder's B·SE tokens, reduced in the backward besides; the two vocab-parallel
    lookups' outputs (B·SE + B·SD). With sp each all_reduce is an all_gather and a reduce_scatter, and the stream
    after the layers (B·SD) is gathered."""
    unit = B * H * F32
    rows = L * 2 * SE + L * 3 * SD
    cols = rows + L * SE
    embedded = SE + SD
    if not sp:
        return {"all_reduce": unit * (rows + cols + embedded)}
    return {"all_gather": unit * (cols + rows + SD + embedded), "reduce_scatter": unit * (rows + cols)}


@pytest.mark.parametrize("t", [2, 4])
def test_products_split_by_heads_in_both_stacks(model, t):
    name, report = model
    shares = node_shares(report, plan(f"tp={t}"))
    for i in range(t):
        got = sum(x.forward for x in shares if x.tp == i and report.nodes[x.index].op_type == "MatMul")
        assert got == products(t)


@pytest.mark.parametrize("t", [2, 4])
def test_parameters_per_tp_rank_closed_form_in_both_ledgers(model, t):
    name, report = model
    assert report.params == ELEMENTS[name](1)
    led = ledger(report, plan(f"tp={t}"))
    mem = {r.rank: r.params_bytes for r in per_rank(report, plan(f"tp={t}")).ranks}
    for r in led.ranks:
        assert r.optimizer_flops // 2 == ELEMENTS[name](t)  # SGD: 2 FLOPs an element
        assert mem[r.rank] == F32 * ELEMENTS[name](t)
    assert sum(r.optimizer_flops - r.optimizer_redundant_flops for r in led.ranks) == 2 * report.params


@pytest.mark.parametrize("text", ["tp=2", "tp=2,sp"])
def test_tp_collectives_closed_form(model, text):
    name, report = model
    led = ledger(report, plan(text))
    want = tp_bytes("sp" in text)
    for r in led.ranks:
        got = {c.kind: c.bytes for c in r.communication if c.group == "tp"}
        if "sp" in text:
            # BART adds its position tables to the lookups: all-reduced, not reduce-scattered, as Megatron's
            # embedding does; the norms' partial gradients are all-reduced once a step (their elements × 4)
            summed = B * H * F32 * (SE + SD) if name == "bart" else 0
            norms = 2 * L * H + 3 * L * H + 2 * H if name == "t5" else (2 * 2 * L + 3 * 2 * L) * H + L * (2 + 3) * H
            assert got["all_gather"] == want["all_gather"]
            assert got["reduce_scatter"] == want["reduce_scatter"] + B * H * F32 * (SE + SD) - summed
            assert got["all_reduce"] == summed + F32 * norms
        else:
            assert got == want
    whole = report.forward.flops + report.backward.flops
    assert sum(r.model_flops for r in led.ranks) == whole
    assert all(r.hardware_flops == r.model_flops + r.redundant_flops + r.recompute_flops for r in led.ranks)


def test_relative_position_bias_split_by_heads():
    # T5's bias table (BUCKETS × HEADS) in each stack's layer 0: each TP rank looks up its heads' columns (torch's
    # ColwiseParallel on the Embedding shards dim 1), so its lookup's output, (SE, SE, HEADS/t), is 1/t
    report = count("t5")
    from flopcount.parallel.layout import layout_of

    layout = layout_of(report, plan("tp=2"))
    tables = [k for k, n in enumerate(report.nodes) if n.op_type == "Gather" and layout.layer[k] is not None]
    assert len(tables) == 2 and {layout.rule(k) for k in tables} == {"split"}
    assert layout.stacks == (("encoder.block", 0), ("decoder.block", L))


@pytest.mark.parametrize("text, schedule, stages", [
    ("pp=2", "1f1b", ("e" * L, "d" * L)), ("pp=2", "gpipe", ("e" * L, "d" * L)), ("pp=4", "1f1b", ("e", "e", "d", "d")),
    ("tp=2,pp=2", "1f1b", ("e" * L, "d" * L)), ("pp=2", "interleaved:2", ("ed", "ed"))],
    ids=["pp=2", "pp=2-gpipe", "pp=4", "tp=2,pp=2", "pp=2-interleaved:2"])
def test_pipeline_stages_run_their_layers(model, text, schedule, stages):
    """Both stacks' layers in order (the encoder's, then the decoder's) in P stages (P·v chunks of one layer each,
    chunk c on rank c mod P, interleaved): each TP rank of a stage runs its layers' products (1/T each), and the
    model FLOPs of all ranks add up to the whole model's of the step's microbatches."""
    _, report = model
    p = parse_parallel(text, microbatches=4, schedule=schedule)
    shares = node_shares(report, p)
    encoder, decoder = layer_products()
    for s, layers in enumerate(stages):
        for i in range(p.tp):
            got = sum(x.forward for x in shares
                      if x.stage == s and x.tp == i and report.nodes[x.index].op_type == "MatMul")
            assert got == sum(encoder if c == "e" else decoder for c in layers) // p.tp, (s, i)
    led = ledger(report, p)
    assert sum(r.model_flops for r in led.ranks) == 4 * (report.forward.flops + report.backward.flops)
    assert led.schedule is not None and 0 < led.bubble_fraction < 1


def boundaries(name: str, stages: int, t: int = 1, sp: bool = False) -> list[int]:
    """Bytes crossing each stage boundary per microbatch, forward (fp32), on one of t TP ranks: the stream (B·SE·H in
    the encoder, B·SD·H in the decoder; 1/t under sp); the encoder's output (B·SE·H) from its last layer on; the
    decoder's looked-up tokens (B·SD·H) from stage 0, where its table is, to its embedding's ops, which run with the
    encoder's last layer; T5's position bias (HEADS × S × S, as transformers makes it in each stack's layer 0 before the
    mask is added; 1/t: split by heads) inside a stack. Two stacks of L = 2 layers: 2 stages (one boundary, between
    the stacks) or 4 (one layer each)."""
    stream = lambda s: B * s * H * F32 // (t if sp else 1)  # noqa: E731
    bias = (lambda s: HEADS * s * s * F32 // t) if name == "t5" else (lambda s: 0)  # noqa: E731
    if stages == 2:
        return [stream(SE) + stream(SD)]
    return [stream(SE) + bias(SE) + stream(SD), stream(SE) + stream(SD), stream(SD) + stream(SE) + bias(SD)]


@pytest.mark.parametrize("text", ["pp=2", "pp=4", "tp=2,pp=4", "tp=2,sp,pp=2", "tp=2,sp,pp=4",
                                  "pp=2 --schedule interleaved:2"])
def test_pipeline_messages_closed_form(model, text):
    """Each (virtual) stage sends what crosses its boundary forward and the gradients of what crossed the one before
    (every message is floating point), M times a step; interleaved, rank p runs chunks p and p + P (4 chunks of one
    layer: the boundaries of pp=4)."""
    name, report = model
    degrees, _, schedule = text.partition(" --schedule ")
    p = parse_parallel(degrees, microbatches=4, schedule=schedule or "1f1b")
    chunks = p.pp * (p.virtual_stages if schedule else 1)
    cut = boundaries(name, chunks, p.tp, p.sp)
    for r in ledger(report, p).ranks:
        want = sum((cut[c] if c < chunks - 1 else 0) + (cut[c - 1] if c else 0) for c in range(r.stage, chunks, p.pp))
        assert [c.bytes for c in r.communication if c.group == "pp"] == [4 * want], (text, r.rank)


def test_cp_refused_on_a_decoder_sequence_the_zigzag_does_not_divide(model):
    # the decoder's SD = 6 tokens: 2·cp = 4 does not divide them (the encoder's SE = 8 it does)
    _, report = model
    with pytest.raises(UsageError) as e:
        ledger(report, plan("cp=2", 2))
    assert "\n" not in str(e.value) and e.value.exit_code == 2
    assert f"the zigzag split needs 2·cp = 4 to divide the sequence length {SD} of layer {L} (decoder." in str(e.value)


@pytest.mark.slow  # one more export per model: about 7 s each
@pytest.mark.parametrize("text", ["cp=2", "tp=2,cp=2", "cp=2,pp=2"])
def test_cp_kv_collectives_closed_form(model, text):
    """Under cp each attention gathers the K and V it reads over the CP ranks and reduce-scatters their gradients:
    per encoder layer those of its SE tokens, per decoder layer those of its own and the encoder's (its
    cross-attention's), 2·B·S·(HEADS/T)·D·4 bytes for S tokens (fp32); a decoder of SE tokens too, which 2·cp
    divides. Every rank runs 1/C of its stage's work."""
    name, _ = model
    report = count(name, sd=SE)
    p = parse_parallel(text, microbatches=2)
    led = ledger(report, p)
    unit = 2 * B * (HEADS // p.tp) * D * F32
    stages = [L * SE + L * 2 * SE] if p.pp == 1 else [L * SE, L * 2 * SE]  # tokens whose K and V a stage gathers
    for r in led.ranks:
        got = {c.kind: c.bytes for c in r.communication if c.group == "cp"}
        assert got == {"all_gather": 2 * unit * stages[r.stage], "reduce_scatter": 2 * unit * stages[r.stage]}
        peer = next(x for x in led.ranks if x.stage == r.stage and x.coords["tp"] == r.coords["tp"] and x is not r)
        assert abs(r.model_flops - peer.model_flops) <= 2  # the remainder of a split to the first rank
    assert sum(r.model_flops for r in led.ranks) == 2 * (report.forward.flops + report.backward.flops)
    assert {x for r in per_rank(report, p).ranks for x in r.replicas} == set(range(p.world_size))


@pytest.mark.slow  # one more export: about 7 s
def test_sp_refused_on_a_decoder_sequence_tp_does_not_divide():
    report = count("bart", sd=5)
    with pytest.raises(UsageError, match=r"tp must divide the sequence length 5 of layer 2 \(decoder.layers\)"):
        ledger(report, plan("tp=2,sp"))


def torch_shard_products(t: int) -> int:
    """FlopCounterMode's products (forward and backward) of one TP rank's shard of the T5 above, run for real: T5's
    heads (HEADS/t, each of D) and MLP width (FFN/t) are settings of their own, so the shard is the same T5 with
    HEADS/t heads (its Q, K, V H×(HEADS/t)·D, O back to H, the bias table's HEADS/t columns) and d_ff FFN/t; the
    lookups and norms make no products."""
    from torch.utils.flop_counter import FlopCounterMode

    config = transformers.T5Config(d_model=H, d_kv=D, d_ff=FFN // t, num_layers=L, num_heads=HEADS // t,
                                   vocab_size=V, relative_attention_num_buckets=BUCKETS, decoder_start_token_id=0,
                                   pad_token_id=0, eos_token_id=1)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    shard = transformers.T5Model(config).train()
    ids, dec = torch.randint(0, V, (B, SE)), torch.randint(0, V, (B, SD))
    with FlopCounterMode(display=False) as counter:
        out = shard(input_ids=ids, decoder_input_ids=dec)
        (out.last_hidden_state.sum() + out.encoder_last_hidden_state.sum()).backward()
    return sum(n for op, n in counter.get_flop_counts()["Global"].items() if str(op) in ("aten.mm", "aten.bmm"))


@pytest.mark.parametrize("t", [2, 4])
def test_t5_rank_products_equal_a_real_run_of_its_shard(t):
    report = count("t5")
    shares = node_shares(report, plan(f"tp={t}"))
    for i in range(t):
        got = sum(x.forward + x.backward for x in shares
                  if x.tp == i and report.nodes[x.index].family in ("matmul", "gemm"))
        assert got == torch_shard_products(t)


@pytest.mark.parametrize("policy", ["full", "non-reentrant"])
def test_recompute_reruns_each_stacks_reductions(model, policy):
    # the rerun passes each block's reduction again (B·SE tokens an encoder block, B·SD a decoder one); torch's
    # non-reentrant checkpoint stops before each layer's last product (the MLP's down projection), so that
    # block's reduction, the layer's own tokens, does not run again
    from flopcount.parallel.plan import parse_recompute

    _, report = model
    unit = B * H * F32
    again = L * 2 * SE + L * 3 * SD - (L * SE + L * SD if policy == "non-reentrant" else 0)
    base = ledger(report, plan("tp=2")).ranks[0].communication
    rerun = ledger(report, plan("tp=2"), parse_recompute(policy)).ranks[0].communication
    assert rerun[0].kind == base[0].kind == "all_reduce" and rerun[0].bytes - base[0].bytes == unit * again
