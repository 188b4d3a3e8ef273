"""Context parallelism of a Hugging Face Llama, as docs/parallel.md counts ``cp=C``: the sequence of s tokens cut
into 2C chunks of s/(2C), CP rank i holding chunks i and 2C−1−i (the zigzag), every per-token op on its s/C tokens
at their own positions (the rotary table of those positions). In each attention layer's forward the rank gathers
the K and V (after the rotary embedding) of the whole sequence from the C ranks, both in one ``all_gather``
(2·b·s·kv·d·e bytes gathered), attends its queries to them under the causal mask of the tokens' positions, and in
the backward reduce-scatters their gradients (``reduce_scatter``, the same bytes in), each rank keeping its own
tokens' part summed over the ranks' queries. A recompute's rerun of a layer gathers again. The gradients of the
weights are all-reduced over the C ranks (group ``dp_cp``; DDP in a training run).

    PYTHONPATH=$PWD python3 benchmarks/step_time_cp.py PROFILE.json   # calls timed beside the prediction

runs 2 gloo processes of the benchmark's Llama (``step_time.LLAMA``, b = 4, s = 128) at ``cp=2``, times every
call of a few training steps (wall clock, and the process's CPU seconds over it: gloo moves the bytes on threads of
its own) and prints them beside the prediction's calls on the profile (``flopcount calibrate --ranks 2``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def zigzag(seq: int, cp: int, rank: int) -> torch.Tensor:
    """The positions of CP rank ``rank``'s tokens: chunks ``rank`` and 2C−1−``rank`` of s/(2C) tokens."""
    c = seq // (2 * cp)
    return torch.cat([torch.arange(a * c, (a + 1) * c) for a in (rank, 2 * cp - 1 - rank)])


class _GatherKV(torch.autograd.Function):
    """``all_gather`` of a rank's stacked K and V over the CP group; ``reduce_scatter`` of their gradient."""

    @staticmethod
    def forward(ctx, kv, cp, group):
        ctx.cp, ctx.group = cp, group
        out = kv.new_empty(cp * kv.numel())
        dist.all_gather_into_tensor(out, kv.contiguous().view(-1), group=group)
        return out.view(cp, *kv.shape)

    @staticmethod
    def backward(ctx, g):
        dx = g.new_empty(g[0].shape)
        dist.reduce_scatter_tensor(dx.view(-1), g.contiguous().view(-1), group=ctx.group)
        return dx, None, None


class ContextParallelAttention(nn.Module):
    """A Llama attention (its projections, under their own names) on CP rank ``rank`` of ``cp``: its queries those
    of the rank's tokens, its keys and values the whole sequence's, gathered."""

    def __init__(self, attn, rank: int, cp: int, group, seq: int):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self.cp, self.group = cp, group
        mine = zigzag(seq, cp, rank)
        every = torch.cat([zigzag(seq, cp, r) for r in range(cp)])  # the gathered keys' positions, rank by rank
        self.register_buffer("mask", every[None, :] <= mine[:, None], persistent=False)  # causal, by position

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        b, t, _ = hidden_states.shape
        shape = (b, t, -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *position_embeddings)
        kv = _GatherKV.apply(torch.stack((k, v)), self.cp, self.group)  # (C, 2, b, kv, t, d)
        k, v = (kv[:, j].permute(1, 2, 0, 3, 4).reshape(b, k.shape[1], self.cp * t, self.head_dim) for j in (0, 1))
        rep = q.shape[1] // k.shape[1]
        out = nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                         attn_mask=self.mask, scale=self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1)), None


def context_parallel(model, rank: int, cp: int, group, seq: int) -> torch.Tensor:
    """Each decoder layer's attention of ``model`` replaced by its CP rank ``rank`` of ``cp`` over ``group``; the
    positions of the rank's tokens (to slice its ids and give the model as ``position_ids``)."""
    for layer in model.model.layers:
        layer.self_attn = ContextParallelAttention(layer.self_attn, rank, cp, group, seq)
    return zigzag(seq, cp, rank)


def _llama_config():
    """The benchmark's Llama (``step_time.LLAMA``) as a transformers configuration."""
    import transformers

    import step_time

    values = step_time.LLAMA
    return transformers.AutoConfig.for_model(values["model_type"], **{
        k: v for k, v in values.items() if k not in ("model_type", "architectures")})


def _timed_worker(rank: int, port: int, steps: int) -> None:
    """One of 2 CP ranks of the benchmark's Llama: 2 warm-up steps, then ``steps`` whose calls are timed; rank 0
    prints every rank's (kind, wall seconds, CPU seconds, payload bytes) per call as JSON."""
    import json
    import time

    import step_time

    real = dist
    torch.set_num_threads(1)
    real.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    import transformers

    b, seq = 4, step_time.SEQ
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(_llama_config())
    model.train()
    pos = context_parallel(model, rank, 2, None, seq)
    ids = torch.randint(0, step_time.LLAMA["vocab_size"], (b, seq), generator=torch.Generator().manual_seed(1))
    calls: list = []
    record = [False]

    class _Timed:
        def __getattr__(self, name):
            return getattr(real, name)

        def all_gather_into_tensor(self, out, x, **kwargs):
            self._timed("all_gather", real.all_gather_into_tensor, out, x, kwargs)

        def reduce_scatter_tensor(self, out, x, **kwargs):
            self._timed("reduce_scatter", real.reduce_scatter_tensor, out, x, kwargs)

        def _timed(self, kind, fn, out, x, kwargs):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(out, x, **kwargs)
            if record[0]:  # the payload as the ledger counts it: the gathered output, the scattered input
                payload = max(out.numel(), x.numel()) * x.element_size()
                calls.append((kind, time.perf_counter() - t0, time.process_time() - c0, payload))

    globals()["dist"] = _Timed()
    for k in range(steps + 2):
        record[0] = k >= 2
        real.barrier()
        model(input_ids=ids[:, pos], position_ids=pos[None].expand(b, -1)).logits.sum().backward()
    real.barrier()
    gathered = [None, None]
    real.all_gather_object(gathered, calls)
    if rank == 0:
        print(json.dumps({"calls": gathered, "steps": steps}))
    real.destroy_process_group()


def main() -> None:
    import argparse
    import dataclasses
    import json
    import os
    import socket
    import statistics
    import subprocess
    import sys

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", help="a profile of 2 ranks (flopcount calibrate --ranks 2 --threads 1)")
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys, torch.multiprocessing as mp; sys.path.insert(0, {here!r}); import step_time_cp as m; "
            f"mp.start_processes(m._timed_worker, args=({port}, {args.steps}), nprocs=2, start_method='fork')")
    got = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seen = json.loads([line for line in got.stdout.splitlines() if line.startswith("{")][-1])

    import flopcount
    import step_time
    from flopcount.measure.machine.calibration import load_profile
    from flopcount.measure.predict import predict_work, work_of
    from flopcount.parallel.plan import parse_parallel
    from flopcount.plans import parallel_ledger

    report = flopcount.from_hf(_llama_config(), (4, step_time.SEQ), cache_dir=False, mode="train")
    work = work_of(dataclasses.replace(report, parallel=parallel_ledger(report, parse_parallel("cp=2"))))
    pred = predict_work(work, load_profile(args.profile))
    n = seen["steps"]
    for rank, calls in enumerate(seen["calls"]):
        for kind in ("all_gather", "reduce_scatter"):
            mine = [c for c in calls if c[0] == kind]
            msgs = [m for m in work.ranks[rank].messages if m.group == "cp" and m.kind == kind]
            predicted = pred.ranks[rank]["communication_seconds"][kind]["exposed"]
            print(f"rank {rank} {kind}: {len(mine) / n:g} calls a step of {statistics.median(c[3] for c in mine):.0f} "
                  f"bytes (predicted {sum(m.count for m in msgs):g} of {msgs[0].bytes:.0f}); a step's calls "
                  f"{sum(c[1] for c in mine) / n * 1e3:.2f} ms wall, {sum(c[2] for c in mine) / n * 1e3:.2f} ms CPU, "
                  f"predicted {predicted * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
