"""The memory ledger of one training step beside the three rules of thumb users are given: accelerate's
``estimate-memory``, DeepSpeed's ZeRO estimators and Megatron-LM's ``report_theoretical_memory``, on Llama-3-8B- and
70B-shaped configurations (bf16 weights with an fp32 master copy, AdamW fused, selective recompute, one rank). Needs
transformers.

Run from the repository root::

    python benchmarks/memory_estimates.py                  # both, batch 1, 4096 tokens
    python benchmarks/memory_estimates.py --models 8b --seq 2048
    python benchmarks/memory_estimates.py --models 8b --plan tp=2,pp=2,dp=2,sp --microbatches 8   # per rank

Under ``--plan`` (tensor degree t, pipeline p, context c, data d, M microbatches, 1F1B) each rank's ledger
(flopcount.memory.ranks.per_rank) is printed beside the rules per GPU, as their sources divide them (Ψ = N/(t·p),
the rank's share of the weights, taken as even):

* DeepSpeed's ZeRO (Rajbhandari et al. 2020, section 5, with K = 12 for mixed-precision Adam; DeepSpeed's
  memory-requirements page for stages 2 and 3): stage 1 2Ψ + 2Ψ + 12Ψ/d, stage 2 2Ψ + 14Ψ/d, stage 3 16Ψ/d
  (+ 4·the largest module's own parameters, gathered). Its 1.5 ``additional_buffer_factor`` is documented for
  the host-memory estimates only, so the GPU figures leave it out; the column "×1.5" shows it applied anyway.
* accelerate ``estimate-memory`` does not divide by any degree: the same 16N on every rank (said in the row).
* Megatron-LM ``report_theoretical_memory``: weights and optimizer 18 bytes per parameter, 6 + 12/d with the
  distributed optimizer (``fsdp`` in the plan), on Ψ; activations on the first stage, where 1F1B keeps p
  microbatches of L/p layers (min(p, M) of them): per layer s·b·h·34/t with sequence parallelism (``sp``) and
  s·b·h·(10 + 24/t) without (Korthikanti et al. 2022, Table 2, selective recompute), s the rank's s/c tokens,
  plus the embedding's input 8·s·b and dropout s·b·h/t per microbatch in flight, and with p = 1 the logits and
  the last norm's output 2·(s·b·V + s·b·h)/t, all × 1.05 as in the one-rank row.

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
from flopcount.memory.ranks import per_rank  # noqa: E402
from flopcount.parallel.plan import parse_parallel  # noqa: E402
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


def per_gpu_rules(shape: dict, n: int, s: int, b: int, plan) -> list[tuple[str, float, float | None, str]]:
    """(rule, model-state bytes per GPU, activation bytes per GPU or None, note) under ``plan``."""
    t, p, c, d, m = plan.tp, plan.pp, plan.cp, plan.dp, plan.microbatches
    h, layers = shape["hidden_size"], shape["num_hidden_layers"]
    psi = n / (t * p)
    largest = VOCAB * h / t
    rules = [("accelerate estimate-memory", 16.0 * n, None, "not divided by any degree: the whole model"),
             ("DeepSpeed ZeRO-1", 4 * psi + 12 * psi / d, None, "2Ψ + 2Ψ + 12Ψ/d"),
             ("DeepSpeed ZeRO-2", 2 * psi + 14 * psi / d, None, "2Ψ + 14Ψ/d"),
             ("DeepSpeed ZeRO-3", 16 * psi / d + 4 * largest, None, "16Ψ/d + 4·largest module")]
    n_megatron = megatron(shape, s, b)[0]
    psi_m = n_megatron / (t * p)
    states = psi_m * ((6 + 12 / d) if plan.fsdp else 18)
    tokens = s // c
    per_layer = tokens * b * h * (34 / t if plan.sp else 10 + 24 / t)
    flight = min(p, m) if p > 1 else 1
    act = per_layer * layers / p * flight + flight * (8 * tokens * b + tokens * b * h / t)
    if p == 1:
        act += 2 * (tokens * b * VOCAB + tokens * b * h) / t
    rules.append(("Megatron-LM theoretical", states, act * 1.05,
                  f"{'6 + 12/d' if plan.fsdp else '18'} B/param, first stage, {'34/t' if plan.sp else '10 + 24/t'}"
                  f"·s·b·h a layer, {flight} microbatches"))
    return rules


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="8b,70b")
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--plan", default="", help="a --parallel plan: the ledger and the rules per rank")
    p.add_argument("--microbatches", type=int, default=1)
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
        if args.plan:
            plan = parse_parallel(args.plan, microbatches=args.microbatches, schedule="1f1b")
            t1 = time.perf_counter()
            ranks = per_rank(r, plan).ranks
            took = time.perf_counter() - t1
            print(f"\n  per rank under {plan} ({plan.world_size} GPUs; the ledger per rank in {took:.1f} s)")
            print(f"  {'':34} {'states GiB':>10} {'activ. GiB':>10} {'total GiB':>10} {'×1.5':>8}  note")
            for x in ranks:
                if x.coords["tp"] or x.coords["ep"]:
                    continue  # TP ranks of a stage are the same; one row a stage (and EP rank 0)
                st = x.params_bytes + x.grads_bytes + x.optimizer_bytes
                print(f"  {'flopcount, stage ' + str(x.stage):34} {st / GIB:>10.2f} "
                      f"{x.activations_bytes * x.microbatches_in_flight / GIB:>10.2f} {x.peak_bytes / GIB:>10.2f} "
                      f"{'':>8}  peak in the {x.peak_phase}, {x.microbatches_in_flight:g} in flight")
            for label, st, act, note in per_gpu_rules(shape, n, s, b, plan):
                a = "—" if act is None else f"{act / GIB:.2f}"
                total = st + (act or 0)
                print(f"  {label:34} {st / GIB:>10.2f} {a:>10} {total / GIB:>10.2f} {1.5 * total / GIB:>8.2f}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
