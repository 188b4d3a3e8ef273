"""Experts kept as one module each (:mod:`flopcount.frontends.hf_experts`), on transformers' own tiny NLLB-MoE: a
top-2 router with a capacity, routed experts (``fc1``/``fc2`` with biases) in every other layer of the encoder and
of the decoder. It is counted (its experts' loop over ``nonzero`` does not export; their batched product does), its
parameters and MoE summary are the configuration's closed forms, its graph's products equal FlopCounterMode over the
eager model's real training step less what the installed loop runs beyond top-2, and ``dp=2,ep=2`` splits its
experts over the EP ranks.

The router's jitter is 0, every dropout (and layer drop) is 0 and the capacity holds every token, so that a run can
be compared (the batched product runs the pairs a capacity drops too: the module's rules)."""

from __future__ import annotations

import pytest
from helpers import products_only

from flopcount.errors import UsageError

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, HEADS, FF, V, L = 32, 4, 48, 64, 2  # hidden, heads, expert/MLP width, vocabulary, layers a stack
E, K = 4, 2  # routed experts a MoE layer, experts a token (NLLB-MoE's top-2 router)
B, SE, SD = 2, 8, 6  # batch, encoder tokens, decoder tokens
MOE_TOKENS = (B * SE, B * SD)  # the tokens into the encoder's MoE layer and the decoder's
EXPERT = 2 * H * FF + FF + H  # fc1, fc2 with their biases
F32 = 4


def config(token_dropout: float = 0.0):
    """The tiny NLLB-MoE: 2 layers a stack, the second of each a MoE layer of 4 experts (sparse step 2)."""
    c = transformers.NllbMoeConfig(
        vocab_size=V, d_model=H, encoder_layers=L, decoder_layers=L, encoder_attention_heads=HEADS,
        decoder_attention_heads=HEADS, encoder_ffn_dim=FF, decoder_ffn_dim=FF, num_experts=E, encoder_sparse_step=2,
        decoder_sparse_step=2, expert_capacity=B * SE, router_jitter_noise=0.0, dropout=0.0, attention_dropout=0.0,
        activation_dropout=0.0, moe_token_dropout=token_dropout, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
        max_position_embeddings=32)
    c._attn_implementation = "eager"
    return c


def batch(seed: int):
    torch.manual_seed(seed)
    return torch.randint(3, V, (B, SE)), torch.randint(3, V, (B, SD))


def step(model, ids, dec) -> None:
    out = model(input_ids=ids, decoder_input_ids=dec)
    (out.last_hidden_state.sum() + out.encoder_last_hidden_state.sum()).backward()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    where = tmp_path_factory.mktemp("nllb_moe")
    config().save_pretrained(where)
    return where


@pytest.fixture(scope="module")
def report(saved):
    import flopcount
    from flopcount.memory.ledger import MemorySettings

    inputs = {"input_ids": (B, SE), "decoder_input_ids": (B, SD)}
    return flopcount.from_hf(saved, inputs, cache_dir=False, mode="train", optimizer="sgd",
                             memory=MemorySettings(device="cpu"))


def test_nllb_moe_is_counted_top2_with_its_moe_layers(report):
    torch.manual_seed(0)
    whole = transformers.NllbMoeModel(config())
    assert report.params == sum(p.numel() for p in whole.parameters())
    assert (report.moe.layers, report.moe.experts, report.moe.top_k, report.moe.expert_params) == (2, E, K, EXPERT)


def test_products_equal_the_eager_step_less_the_loops_extra_experts(report):
    """The installed loop runs E expert MLPs a token (``expert_0`` on E − 1 rows, ``expert_1`` on one: it one-hots
    the first-choice mask again), the graph the token's 2 chosen: the eager step's products exceed the graph's by
    (E − 2) rows a token and MoE layer, each 4·H·FF forward (fc1, fc2) and twice that backward (input and weight
    gradients)."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    whole = transformers.NllbMoeModel(config()).train()
    rows = []
    for name, m in whole.named_modules():
        if type(m).__name__ == "NllbMoeDenseActDense" and ".experts." in name:
            m.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[0]))
    with FlopCounterMode(display=False) as counter:
        step(whole, *batch(1))
    assert sum(rows) == E * sum(MOE_TOKENS)  # the loop's rows: E a token and MoE layer
    extra = (E - K) * sum(MOE_TOKENS) * 4 * H * FF * 3
    products = products_only(report)
    assert sum(n.cost.flops + n.backward.flops for n in products.nodes) == counter.get_total_flops() - extra


@pytest.mark.parametrize("training", [False, True])
def test_batched_experts_compute_top2_routing(training):
    """The batched product's output is each token's 2 chosen experts' outputs weighted by the router's gates (the
    gates row holds both, 0 elsewhere), times 1 − p in inference (``moe_token_dropout``); in training, a dropout
    of p on each (token, expert) pair (at p = 1 nothing is left)."""
    from flopcount.frontends import hf_experts

    p = 1.0 if training else 0.25
    torch.manual_seed(0)
    model = transformers.NllbMoeModel(config(token_dropout=p)).train(training)
    hf_experts.batch_experts(model)
    ffn = model.encoder.layers[1].ffn
    x = torch.randn(B * SE, H)
    with torch.no_grad():
        first, gates, _ = ffn.router(x)
        got = ffn.experts(x, first, gates)
        assert ((gates > 0).sum(-1) == K).all()  # no pair dropped: two gates a token
        want = sum(ffn.experts[f"expert_{e}"](x) * gates[:, e:e + 1] for e in range(E))
    torch.testing.assert_close(got, torch.zeros_like(want) if training else want * (1 - p))


def test_ep_splits_the_experts(report):
    """``dp=2,ep=2``: each rank holds E/ep experts of each MoE layer and every dense parameter."""
    from flopcount.memory.ranks import per_rank
    from flopcount.parallel.plan import parse_parallel
    from flopcount.parallel.ranks import ledger

    plan = parse_parallel("dp=2,ep=2")
    assert len(ledger(report, plan).ranks) == 2
    ranks = per_rank(report, plan).ranks
    assert {r.params_bytes for r in ranks} == {F32 * (report.params - 2 * E * EXPERT + 2 * (E // 2) * EXPERT)}
