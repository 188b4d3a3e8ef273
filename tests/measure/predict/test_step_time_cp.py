"""``benchmarks/step_time_cp.py`` on 2 real gloo ranks does what the ledger of ``cp=2`` describes and the predictor
prices: a tiny Llama (2 layers, 4 heads, 2 K/V heads), each rank its zigzag half of the sequence. Each rank's logits
equal the whole model's at its tokens and its gradients, summed over both ranks, the whole model's; the calls each
rank makes, recorded as they run (by kind, and in the forward or in autograd's backward), are those the predictor
sends: per layer and microbatch one ``all_gather`` of the whole sequence's K and V in the forward and one
``reduce_scatter`` of their gradients in the backward, and one more ``all_gather`` in the backward when a checkpoint
reruns each layer (``--recompute non-reentrant``, and ``full`` as torch's reentrant checkpoint), each of the bytes
written here in closed form."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections import Counter

import pytest
from helpers import gloo_ranks

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

H, L, HEADS, KV, I, V, B, S = 32, 2, 4, 2, 48, 64, 2, 8
CP = 2
KV_BYTES = 2 * B * S * KV * (H // HEADS) * 4  # a layer's K and V of the whole sequence, fp32
BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "benchmarks")
POLICIES = (None, "non-reentrant", "full")


def _config():
    return transformers.LlamaConfig(hidden_size=H, intermediate_size=I, num_hidden_layers=L, num_attention_heads=HEADS,
                                    num_key_value_heads=KV, vocab_size=V)


class _Recorded:
    """``torch.distributed`` as ``step_time_cp`` calls it: each call counted by kind, phase and payload (the
    gathered output, the scattered input)."""

    def __init__(self, dist, calls: Counter):
        self.dist, self.calls = dist, calls

    def __getattr__(self, name):
        return getattr(self.dist, name)

    def _note(self, kind, out, x):
        phase = "backward" if torch._C._current_graph_task_id() != -1 else "forward"  # inside autograd's backward
        self.calls[f"{kind} {phase} {max(out.numel(), x.numel()) * x.element_size()}"] += 1

    def all_gather_into_tensor(self, out, x, *args, **kwargs):
        self._note("all_gather", out, x)
        return self.dist.all_gather_into_tensor(out, x, *args, **kwargs)

    def reduce_scatter_tensor(self, out, x, *args, **kwargs):
        self._note("reduce_scatter", out, x)
        return self.dist.reduce_scatter_tensor(out, x, *args, **kwargs)


def _worker(rank: int, world: int, init: str, out: str) -> None:
    import copy

    import torch.distributed as dist

    torch.set_num_threads(1)  # a forked child must not wait on the parent's intra-op pool
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    sys.path.insert(0, BENCHMARKS)
    import step_time_cp

    torch.manual_seed(0)
    whole = transformers.LlamaForCausalLM(_config())
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(1))
    want = whole(input_ids=ids).logits
    want.sum().backward()
    seen = {}
    for policy in POLICIES:
        model = copy.deepcopy(whole)
        model.zero_grad(set_to_none=True)
        model.train()
        if policy is not None:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": policy == "full"})
        pos = step_time_cp.context_parallel(model, rank, CP, None, S)
        calls: Counter = Counter()
        step_time_cp.dist = _Recorded(dist, calls)
        logits = model(input_ids=ids[:, pos], position_ids=pos[None].expand(B, -1)).logits
        logits.sum().backward()
        step_time_cp.dist = dist
        close = True
        for p, q in zip(model.parameters(), whole.parameters()):
            g = p.grad.clone()
            dist.all_reduce(g)  # the rank's tokens' part of each gradient, summed over the CP ranks
            close &= torch.allclose(g, q.grad, atol=1e-5, rtol=1e-4)
        seen[str(policy)] = {"calls": dict(calls), "grads": close,
                             "logits": torch.allclose(logits, want[:, pos], atol=1e-5, rtol=1e-4)}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


def test_the_benchmarks_context_parallel_step_is_the_predictors(tmp_path):
    import flopcount
    from flopcount.measure.predict import work_of
    from flopcount.parallel.plan import parse_parallel, parse_recompute
    from flopcount.plans import parallel_ledger

    seen = gloo_ranks(_worker, tmp_path, world=CP)
    report = flopcount.from_hf(_config(), (B, S), cache_dir=False, mode="train")
    for policy in POLICIES:
        again = policy is not None  # a checkpointed layer's rerun gathers its K and V again, in the backward
        want = {f"all_gather forward {KV_BYTES}": L, f"reduce_scatter backward {KV_BYTES}": L,
                **({f"all_gather backward {KV_BYTES}": L} if again else {})}
        led = parallel_ledger(report, parse_parallel("cp=2"), parse_recompute(policy) if policy else None)
        work = work_of(dataclasses.replace(report, parallel=led))
        for rank, r in enumerate(seen):
            run = r[str(policy)]
            assert run["logits"] and run["grads"], (policy, rank)
            assert run["calls"] == want, (policy, rank)
            sent = Counter()
            for m in work.ranks[rank].messages:
                if m.group == "cp":
                    sent[f"{m.kind} {m.phase} {m.bytes:.0f}"] += m.count
            assert sent == want, (policy, rank)
            listed = {c.kind: c.bytes for c in led.ranks[rank].communication if c.group == "cp"}
            assert listed == {"all_gather": (1 + again) * L * KV_BYTES, "reduce_scatter": L * KV_BYTES}


def test_the_benchmarks_cp_labels_are_the_whole_sequences_next_tokens():
    """``step_time.py``'s cp runs: over both ranks' zigzag positions, each label is the next token of the whole
    sequence, written here as ids[:, p + 1], and the sequence's last position (on rank 0, whose second chunk ends
    it) is ignored (-100): the ranks' losses together are the whole sequence's."""
    sys.path.insert(0, BENCHMARKS)
    import step_time
    import step_time_cp

    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(0))
    seen = {}
    for rank in range(CP):
        pos = step_time_cp.zigzag(S, CP, rank)
        for j, p in enumerate(pos.tolist()):
            seen[p] = step_time.cp_labels(ids, pos)[:, j]
    assert sorted(seen) == list(range(S))
    for p in range(S - 1):
        assert seen[p].tolist() == ids[:, p + 1].tolist()
    assert seen[S - 1].tolist() == [-100] * B
