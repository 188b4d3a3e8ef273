"""Generation of a Switch-style encoder-decoder under expert parallelism against 2 real gloo ranks (``--generate P:N
--parallel dp=2,ep=2``, :mod:`flopcount.parallel.generation`): transformers' own ``generate()`` of a tiny
SwitchTransformers (one MoE layer of 4 experts in the encoder, one in the decoder, top-1) on each rank's own prompt,
each rank holding 2 of each layer's 4 experts. Its experts' forward is replaced by an expert-parallel one that routes
token j of each call to expert 2·j mod 4 (so each EP rank's experts receive half of every phase's pooled tokens: the
ledger's balanced load), gathers the ranks' token counts over the EP group (int64), sends each token's hidden
vector and its routing probability by ``all_to_all_single`` to the rank holding its expert and brings the weighed
outputs back. The encoder's MoE layer runs once, in the prefill, over the B·P prompt tokens; the decoder's over the
B start tokens, then over the B new tokens of each of the N − 1 decode steps. Each rank's tokens equal a
one-process ``generate()`` with the same routing and every expert, its ``FlopCounterMode`` total that run's, and the
bytes it hands to each collective the generation ledger's and the closed forms written here."""

from __future__ import annotations

import json
import types
from collections import Counter

import pytest
from gloo_shards import Recorder, ledger_bytes
from helpers import gloo_ranks

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

H, D, HEADS, FF, V, E, EP = 32, 8, 4, 48, 64, 4, 2  # hidden, head size, heads, expert width, vocabulary, experts
PER = E // EP
B, P, N = 2, 6, 3  # batch a rank, prompt, new tokens: the prefill, then N − 1 decode steps
F32 = 4


def config():
    c = transformers.SwitchTransformersConfig(
        d_model=H, d_kv=D, d_ff=FF, num_layers=1, num_decoder_layers=1, num_heads=HEADS, vocab_size=V,
        num_experts=E, expert_capacity=B * P, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1,
        router_jitter_noise=0.0, dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    c._attn_implementation = "eager"
    return c


def model():
    torch.manual_seed(0)
    return transformers.SwitchTransformersForConditionalGeneration(config()).eval()


def prompt(rank: int):
    torch.manual_seed(1 + rank)
    return torch.randint(2, V, (B, P))


def routed(n: int):
    """Each call's token j to expert 2·j mod E: half the tokens to each EP rank's experts."""
    return (2 * torch.arange(n)) % E


def patched(m, dispatch=None) -> None:
    """``m``'s experts run on the fixed routes; ``dispatch(hidden, ids, weights, module)`` runs them elsewhere."""
    def forward(self, hidden, selected, weights):
        ids = routed(hidden.shape[0])
        w = weights.reshape(hidden.shape[0], -1).max(-1).values  # the routing probability of each token's expert
        if dispatch is not None:
            return dispatch(hidden, ids, w, self)
        out = torch.zeros_like(hidden)
        for e in range(E):
            rows = (ids == e).nonzero()[:, 0]
            out = out.index_put((rows,), self[f"expert_{e}"](hidden[rows]) * w[rows, None])
        return out

    for module in m.modules():
        if type(module).__name__ == "SwitchTransformersExperts":
            module.forward = types.MethodType(forward, module)


def generate(m, ids):
    return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, min_new_tokens=N,
                      do_sample=False)


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.flop_counter import FlopCounterMode

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    moved: Counter = Counter()
    rec, counts_rec = Recorder(None, "ep", moved), Recorder(None, "tp_ep", moved)
    mine = range(rank * PER, (rank + 1) * PER)
    tokens: list[int] = []

    def dispatch(hidden, ids, w, experts):
        order = ids.argsort(stable=True)  # by expert, so by the rank holding it
        count = torch.bincount(ids, minlength=E).to(torch.int64)
        tokens.append(hidden.shape[0])
        every = count.new_empty(world * E)
        counts_rec.note("all_gather", every)
        dist.all_gather_into_tensor(every, count)
        every = every.view(world, E)
        sent = [int(count[r * PER:(r + 1) * PER].sum()) for r in range(world)]
        received = [int(every[q, rank * PER:(rank + 1) * PER].sum()) for q in range(world)]
        which = torch.tensor([e for q in range(world) for e in mine for _ in range(int(every[q, e]))])
        x = rec.exchange(hidden[order], sent, received)
        p = rec.exchange(w[order].reshape(-1, 1), sent, received)  # the probabilities, with the tokens
        y = torch.zeros_like(x)
        for e in mine:
            rows = (which == e).nonzero()[:, 0]
            y = y.index_put((rows,), experts[f"expert_{e}"](x[rows]))
        back = rec.exchange(y * p, received, sent)  # weighed where the experts ran
        return torch.zeros_like(hidden).index_add(0, order, back)

    m = model()
    patched(m, dispatch)
    for module in m.modules():  # only this rank's experts kept
        if type(module).__name__ == "SwitchTransformersExperts":
            for e in set(range(E)) - set(mine):
                del module[f"expert_{e}"]
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        seq = generate(m, prompt(rank))
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"bytes": rec.bytes(), "flops": counter.get_total_flops(), "seq": seq.tolist(),
                   "tokens": tokens}, f)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def report():
    import flopcount

    return flopcount.from_hf(config(), generate=(P, N), batch=B, parallel=f"dp=2,ep={EP}", cache_dir=False)


def test_ep_generation_of_switch_on_gloo_equals_the_ledger(report, tmp_path):
    from torch.utils.flop_counter import FlopCounterMode

    seen = gloo_ranks(_worker, tmp_path)
    led = report.parallel
    # the encoder's layer over the prompt, the decoder's over the start tokens, then over each step's new tokens
    routes = [B * P, B] + [B] * (N - 1)
    assert sorted(led.ranks[0].coords.items()) == sorted({"tp": 0, "pp": 0, "cp": 0, "ep": 0, "dp": 0}.items())
    for rank, r in enumerate(seen):
        whole = model()
        patched(whole)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            alone = generate(whole, prompt(rank))
        assert r["seq"] == alone.tolist()  # the dispatched experts generate what every expert on one rank does
        assert r["flops"] == counter.get_total_flops()  # balanced: a rank runs as many pairs as it routes
        assert r["tokens"] == routes
        assert led.ranks[rank].model_flops == report.generation.total.flops  # its own batch's generation
        # per MoE call: its tokens' vectors out and half the pooled pairs' outputs back (as many), each token's
        # probability with it; the counts of both ranks before each call
        assert r["bytes"] == ledger_bytes(led.ranks[rank]) == {
            "all_to_all(ep)": sum(2 * t * H * F32 + t * F32 for t in routes),
            "all_gather(tp_ep)": len(routes) * EP * E * 8}
