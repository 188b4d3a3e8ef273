"""How long ``--hf CONFIG --memory`` takes on Llama-3-8B- and Llama-3-70B-shaped configurations (bf16, AdamW, one
rank): the training ledger through the identical-layer extension (the 1- and 2-layer models exported, the L-layer
graph walked), and its figures. Needs transformers.

Run from the repository root::

    python benchmarks/memory_at_scale.py                     # both, batch 1, 4096 tokens, selective recompute
    python benchmarks/memory_at_scale.py --models 8b --seq 2048 --recompute full

No weight is read: the models are built on the meta device. This prints figures; nothing asserts.
"""

from __future__ import annotations

import argparse
import sys
import time

import flopcount
from flopcount.memory.ledger import MemorySettings

#: The published shapes of the two models (their config.json files).
SHAPES = {
    "8b": {"hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32},
    "70b": {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64},
}


def config(name: str):
    import transformers

    return transformers.LlamaConfig(**SHAPES[name], num_key_value_heads=8, vocab_size=128256,
                                    max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                                    torch_dtype="bfloat16", architectures=["LlamaForCausalLM"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="8b,70b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--recompute", default="selective")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
