"""How long ``--hf CONFIG --memory`` takes on Llama-3-8B-, Llama-3-70B- and DeepSeek-V3-shaped configurations (bf16,
AdamW): the training ledger through the identical-layer extension (the 1- and 2-layer models exported, the L-layer
graph walked), and its figures; with ``--plan``, the per-rank ledger too (flopcount.memory.ranks.per_rank), one row
per distinct rank with its peak, and the seconds it took. Needs transformers.

Run from the repository root::

    python benchmarks/memory_at_scale.py                     # 8b and 70b, batch 1, 4096 tokens, selective recompute
    python benchmarks/memory_at_scale.py --models 8b --seq 2048 --recompute full
    python benchmarks/memory_at_scale.py --models 8b --plan tp=2,pp=2,dp=2 --microbatches 8
    python benchmarks/memory_at_scale.py --models 70b --seq 8192 --plan tp=8,pp=4,cp=2,dp=4 --microbatches 16
    python benchmarks/memory_at_scale.py --models deepseek-v3 --plan tp=2,ep=8,dp=8 --microbatches 16

No weight is read: the models are built on the meta device. This prints figures; nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import flopcount  # noqa: E402
from flopcount.memory.ledger import MemorySettings  # noqa: E402
from flopcount.memory.ranks import per_rank  # noqa: E402
from flopcount.parallel.plan import parse_parallel  # noqa: E402

#: The published shapes of the two models (their config.json files).
SHAPES = {
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32},
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64},
}


def config(name: str):
    import transformers

    if name == "deepseek-v3":
        from parallel_at_scale import config as published

        return published(name)
    return transformers.LlamaConfig(**SHAPES[name], num_key_value_heads=8, vocab_size=128256,
                                    max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                                    torch_dtype="bfloat16", architectures=["LlamaForCausalLM"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="8b,70b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--recompute", default="selective")
    p.add_argument("--plan", default="", help="a --parallel plan: also the ledger per rank, and its seconds")
    p.add_argument("--microbatches", type=int, default=1)
    p.add_argument("--schedule", default="1f1b")
    args = p.parse_args(argv)
    print(f"{'model':>6} {'layers':>6} {'method':>9} {'seconds':>8} {'peak GiB':>9}  phase     params+grads+states GiB"
          "  activations GiB")
    for name in args.models.split(","):
        settings = MemorySettings(recompute=args.recompute, implementation="fused")
        c = config(name)
        t0 = time.perf_counter()
        r = flopcount.from_hf(c, {"input_ids": (1, args.seq)}, mode="train", optimizer="adamw",
                              memory=settings, cache_dir=False)
        seconds = time.perf_counter() - t0
        (m,) = r.memory.ranks
        static = m.params_bytes + m.grads_bytes + m.optimizer_bytes
        print(f"{name:>6} {r.layers.layers:>6} {r.layers.method:>9} {seconds:>8.1f} {m.peak_bytes / 2**30:>9.2f}  "
              f"{m.peak_phase:<9} {static / 2**30:>23.2f}  {m.activations_bytes / 2**30:>15.2f}", flush=True)
        if args.plan:
            plan = parse_parallel(args.plan, microbatches=args.microbatches, schedule=args.schedule)
            t1 = time.perf_counter()
            ranks = per_rank(r, plan).ranks
            took = time.perf_counter() - t1
            print(f"  {plan} ({plan.world_size} GPUs): per rank in {took:.1f} s, {seconds + took:.1f} s in all")
            print(f"  {'stage':>5} {'tp':>3} {'ep':>3} {'replicas':>8} {'in flight':>9} {'states GiB':>10} "
                  f"{'activ./mb GiB':>13} {'peak GiB':>9}  phase")
            for x in ranks:
                states = (x.params_bytes + x.grads_bytes + x.optimizer_bytes) / 2**30
                print(f"  {x.stage:>5} {x.coords['tp']:>3} {x.coords['ep']:>3} {len(x.replicas):>8} "
                      f"{x.microbatches_in_flight:>9g} {states:>10.2f} {x.activations_bytes / 2**30:>13.2f} "
                      f"{x.peak_bytes / 2**30:>9.2f}  {x.peak_phase}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
