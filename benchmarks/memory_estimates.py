"""The memory ledger of one training step beside the three rules of thumb users are given: accelerate's
``estimate-memory``, DeepSpeed's ZeRO estimators and Megatron-LM's ``report_theoretical_memory``, on Llama-3-8B- and
70B-shaped configurations (bf16 weights with an fp32 master copy, AdamW fused, selective recompute, one rank). Needs
transformers.

Run from the repository root::

    python benchmarks/memory_estimates.py                  # both, batch 1, 4096 tokens
    python benchmarks/memory_estimates.py --models 8b --seq 2048

The rules, as their sources state them (N parameters, s tokens, b sequences, h hidden, V vocabulary, L layers;
restated here as arithmetic):

* accelerate ``estimate-memory``: "Total for Adam: 4x model size in full precision": 4 · 4N bytes (weights,
  gradients and two Adam states, each fp32), no activations.
* DeepSpeed ``estimate_zero2_model_states_mem_needs`` on one GPU without offload: 4N + 16N bytes (fp16 weights and
  gradients, fp32 master weights and two states); ``estimate_zero3_model_states_mem_needs``: 18N + 4·(the largest
  module's own parameters). Model states only.
* Megatron-LM ``report_theoretical_memory`` (one rank, no distributed optimizer): 18 bytes per parameter (bf16
  weight, fp32 main gradient, fp32 master weight and two states), N from its own parameter formula; activations of
  selective recompute without sequence parallelism (Korthikanti et al. 2022, Table 2): 34·s·b·h per layer, plus
  8·s·b (the embedding's input) + s·b·h (its dropout) + 2·(s·b·V + s·b·h) (logits and the last norm's output),
  all × 1.05.

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
from memory_at_scale import SHAPES, config  # noqa: E402

GIB = 2**30
VOCAB = 128256
KV_HEADS = 8


def megatron(shape: dict, s: int, b: int) -> tuple[int, float, float]:
    """(N by Megatron's parameter formula, weight-and-optimizer bytes, activation bytes) for a Llama shape."""
    h, ffn, layers, heads = (shape[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                 "num_attention_heads"))
    attention = 2 * h * h * (1 + KV_HEADS / heads)  # q and o, k and v of the query groups
    layer = 2 * h * (ffn * 3 / 2 + 1) + attention  # SwiGLU MLP and two RMSNorms
    n = int(layer * layers + h + 2 * h * VOCAB)  # the final norm, untied embedding and head
    activations = (34 * s * b * h * layers + 8 * s * b + s * b * h + 2 * (s * b * VOCAB + s * b * h)) * 1.05
    return n, 18 * n, activations


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="8b,70b")
    p.add_argument("--seq", type=int, default=4096)
    args = p.parse_args(argv)
    s, b = args.seq, 1
    for name in args.models.split(","):
        shape = SHAPES[name]
        settings = MemorySettings(recompute="selective", implementation="fused", master_weights=True)
        t0 = time.perf_counter()
        r = flopcount.from_hf(config(name), {"input_ids": (b, s)}, mode="train", optimizer="adamw", memory=settings,
                              cache_dir=False)
        seconds = time.perf_counter() - t0
        (m,) = r.memory.ranks
        n = r.trainable_params
        n_megatron, megatron_states, megatron_activations = megatron(shape, s, b)
        largest = VOCAB * shape["hidden_size"]  # the embedding (and the head): the largest module's own weights
        states = m.params_bytes + m.grads_bytes + m.optimizer_bytes
        rows = [
            ("flopcount ledger", states, m.activations_bytes, m.peak_bytes,
             f"peak in the {m.peak_phase}, {seconds:.1f} s"),
            ("accelerate estimate-memory", 16 * n, None, 16 * n, "4 × fp32 model size"),
            ("DeepSpeed ZeRO-2 (1 GPU)", 20 * n, None, 20 * n, "4N + 16N, model states only"),
            ("DeepSpeed ZeRO-3 (1 GPU)", 18 * n + 4 * largest, None, 18 * n + 4 * largest, "18N + 4·largest module"),
            ("Megatron-LM theoretical", megatron_states, megatron_activations, megatron_states + megatron_activations,
             f"18 bytes/param, 34·s·b·h per layer; its N = {n_megatron:,}"),
        ]
        print(f"\n{name}: N = {n:,} parameters, s = {s}, b = {b}, bf16 + fp32 master, AdamW fused, selective recompute")
        print(f"{'':28} {'states GiB':>10} {'activ. GiB':>10} {'total GiB':>10}  note")
        for label, st, act, total, note in rows:
            a = "—" if act is None else f"{act / GIB:.2f}"
            print(f"{label:28} {st / GIB:>10.2f} {a:>10} {total / GIB:>10.2f}  {note}")
        print(f"  ledger by part: params {m.params_bytes / GIB:.2f}, grads {m.grads_bytes / GIB:.2f}, optimizer "
              f"{m.optimizer_bytes / GIB:.2f} (+ {m.optimizer_temp_bytes / GIB:.2f} step temporaries), "
              f"statistics {m.statistics_bytes / GIB:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
