"""``benchmarks/step_time_ep.py`` (the benchmark's ``ep2-mixtral`` run) on 2 real gloo ranks does what the ledger of
``dp=2,ep=2`` describes: a tiny Mixtral (4 routed experts, 2 a token, 2 layers), each rank its own batch, its MoE
blocks cut to its 2 experts. Each rank's logits equal the whole model's on its tokens, its dense gradients the
whole model's, and its experts' gradients the whole model's summed over both ranks' tokens (the backward's
all_to_all carries them back); the bytes each rank hands to ``all_to_all`` and ``all_gather`` equal the ledger's
rows ``all_to_all(ep)`` and ``all_gather(tp_ep)`` given the run's recorded routing as ``--expert-load``, and closed
forms written here from the routing."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter

import pytest
from helpers import gloo_ranks

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, I, L, E, K, V, B, S = 32, 48, 2, 4, 2, 64, 2, 8
EP = 2
BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks")


def _config():
    return transformers.MixtralConfig(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=V, num_local_experts=E, num_experts_per_tok=K,
                                      architectures=["MixtralForCausalLM"])


class _Recorded:
    """``torch.distributed`` as ``step_time_ep`` calls it, the bytes handed to each collective counted."""

    def __init__(self, dist, moved: Counter):
        self.dist, self.moved = dist, moved

    def __getattr__(self, name):
        return getattr(self.dist, name)

    def all_to_all_single(self, out, x, *args, **kwargs):
        self.moved["all_to_all(ep)"] += x.numel() * x.element_size()  # the buffer the rank sends
        return self.dist.all_to_all_single(out, x, *args, **kwargs)

    def all_gather_into_tensor(self, out, x, *args, **kwargs):
        self.moved["all_gather(tp_ep)"] += out.numel() * out.element_size()  # the gathered output
        return self.dist.all_gather_into_tensor(out, x, *args, **kwargs)


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import copy

    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    sys.path.insert(0, BENCHMARKS)
    import step_time_ep

    moved: Counter = Counter()
    step_time_ep.dist = _Recorded(dist, moved)
    torch.manual_seed(0)
    whole = transformers.MixtralForCausalLM(_config())
    model = copy.deepcopy(whole)
    blocks = step_time_ep.expert_parallel(model, rank, EP, None)
    for b in blocks:
        b.record = True
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1 + rank))
    logits = model(input_ids=ids).logits
    logits.sum().backward()
    want = whole(input_ids=ids).logits
    want.sum().backward()
    mine = slice(rank * E // EP, (rank + 1) * E // EP)
    experts_close, dense_close = True, True
    for (name, p), (_, q) in zip(model.named_parameters(), whole.named_parameters()):
        if ".experts." in name:  # the whole model's gradients of this rank's experts, summed over both ranks' tokens
            g = q.grad.clone()
            dist.all_reduce(g)
            experts_close &= torch.allclose(p.grad, g[mine], atol=1e-5, rtol=1e-4)
        else:
            dense_close &= torch.allclose(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"moved": dict(moved), "counts": [b.counts.tolist() for b in blocks],
                   "logits": torch.allclose(logits, want, atol=1e-5, rtol=1e-4), "dense": dense_close,
                   "experts": experts_close}, f)
    dist.destroy_process_group()


def test_the_benchmarks_expert_parallel_step_is_the_ledgers(tmp_path):
    import flopcount
    from flopcount.parallel.experts import load_expert_load
    from flopcount.parallel.plan import parse_parallel
    from flopcount.plans import parallel_ledger

    seen = gloo_ranks(_worker, tmp_path)
    counts = seen[0]["counts"]  # both ranks' pairs per expert, each MoE layer: the same on every rank
    assert all(r["counts"] == counts for r in seen)
    assert [sum(c) for c in counts] == [EP * B * S * K] * L
    assert any(sum(c[:E // EP]) != sum(c[E // EP:]) for c in counts)  # uneven: the load's split is exercised
    assert all(r["logits"] and r["dense"] and r["experts"] for r in seen)
    load = tmp_path / "load.json"
    load.write_text(json.dumps(counts))
    report = flopcount.from_hf(_config(), (B, S), cache_dir=False, mode="train")
    led = parallel_ledger(report, parse_parallel("dp=2,ep=2"), None, load_expert_load(load))
    vec = B * S * K * H * 4  # a rank's own pairs' hidden vectors, fp32
    for rank, r in enumerate(seen):
        ran = [sum(c[rank * E // EP:(rank + 1) * E // EP]) for c in counts]  # the pairs its experts ran, a layer
        assert r["moved"] == {  # dispatch (the vectors and their fp32 probabilities) and combine, both again in the
            # backward (the probabilities' gradient from the pairs its experts ran); the counts before each dispatch
            "all_to_all(ep)": sum(2 * vec + 2 * n * H * 4 + B * S * K * 4 + n * 4 for n in ran),
            "all_gather(tp_ep)": L * EP * E * 8}
        listed = {f"{c.kind}({c.group})": c.bytes for c in led.ranks[rank].communication if c.group in ("ep", "tp_ep")}
        assert listed == r["moved"]
