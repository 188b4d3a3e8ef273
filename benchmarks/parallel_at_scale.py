"""FLOPs per GPU of Llama-3-70B and DeepSeek-V3 training plans (bf16, one sequence a microbatch, 1F1B with 16
microbatches, selective recompute): the per-rank ledger (docs/parallel.md) through the identical-layer extension,
beside the per-GPU conventions of Megatron-LM and MaxText computed from the same shapes, each difference
explained by term. Needs transformers.

Run from the repository root::

    python benchmarks/parallel_at_scale.py                  # both models
    python benchmarks/parallel_at_scale.py --models 70b --seq 4096

No weight is read and nothing is downloaded: the configurations are built from the dicts below (the published
config.json shapes). This prints figures; nothing asserts.

The conventions, as maths (G sequences of s tokens per step over W GPUs, L layers, hidden h, n heads of d, g K/V
heads, MLP width f, vocabulary V):

* Megatron-LM (``num_floating_point_operations`` in its ``training.py``): 12·G·s·L·h²·[(1 + g/n + s/h) +
  1.5·f/h + V/(2·L·h)] for a gated MLP (for MoE layers k·f_moe + f_shared in place of f); 12 = 2 FLOPs a
  multiply-add × 3 (forward and the two products of the backward); attention scores counted on every
  (query, key) pair (s/h); recompute left out; reported per GPU as the total / W.
* MaxText (``calculate_tflops_training_per_device``): with the per-device batch G/W, 3·[L·(2·s·h·(n + 2g)·d +
  2·s·n·d·h + 2·s·3·h·f) + 2·s·h·V] + 3·L·4·s²·n·d per sequence; the same terms as Megatron's in another order.

For MLA (DeepSeek-V3) both are written here with its projections in place of Q/K/V: per token h·r_q + r_q·n·(d_n +
d_r) + h·(r_kv + d_r) + r_kv·n·(d_n + d_v) + n·d_v·h multiply-adds, scores and product with V s·n·(d_n + d_r) and
s·n·d_v.
"""

from __future__ import annotations

import argparse
import sys
import time

import flopcount
from flopcount.parallel.plan import parse_parallel, parse_recompute
from flopcount.parallel.ranks import ledger

LLAMA_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
             "rope_theta": 500000.0, "rms_norm_eps": 1e-5}
DEEPSEEK_V3 = {"hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
               "num_hidden_layers": 61, "first_k_dense_replace": 3, "num_attention_heads": 128,
               "num_key_value_heads": 128, "vocab_size": 129280, "n_routed_experts": 256, "num_experts_per_tok": 8,
               "n_shared_experts": 1, "n_group": 8, "topk_group": 4, "q_lora_rank": 1536, "kv_lora_rank": 512,
               "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "max_position_embeddings": 4096}
#: (name, plan) per model. DeepSeek-V3's 61 layers have no equal pipeline split, so its plans have pp=1.
PLANS = {
    "70b": [("tp=8,pp=4,cp=2,dp=4", 16), ("tp=8,pp=8,cp=2,dp=2", 16)],
    "deepseek-v3": [("tp=1,ep=64,dp=64", 16), ("tp=2,ep=8,dp=8", 16)],
}


def config(name: str):
    import transformers

    if name == "70b":
        return transformers.LlamaConfig(**LLAMA_70B, torch_dtype="bfloat16", architectures=["LlamaForCausalLM"])
    return transformers.DeepseekV3Config(**DEEPSEEK_V3, torch_dtype="bfloat16",
                                         architectures=["DeepseekV3ForCausalLM"])


def conventions(name: str, s: int) -> tuple[float, float, dict[str, float]]:
    """(Megatron, MaxText) FLOPs of one sequence of s tokens, and the per-sequence terms both use."""
    c = LLAMA_70B if name == "70b" else DEEPSEEK_V3
    h, L, n, V = c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["vocab_size"]
    if name == "70b":
        d, g = h // n, c["num_key_value_heads"]
        proj = s * (h * n * d + 2 * h * g * d + n * d * h)  # multiply-adds of Q, K, V, O
        scores = 2 * s * s * n * d  # Q·Kᵀ and the product with V, every pair
        mlp = L * s * 3 * h * c["intermediate_size"]
    else:
        rq, rkv, dn, dr, dv = (c[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                                              "v_head_dim"))
        proj = s * (h * rq + rq * n * (dn + dr) + h * (rkv + dr) + rkv * n * (dn + dv) + n * dv * h)
        scores = s * s * n * (dn + dr + dv)
        dense, moe = c["first_k_dense_replace"], L - c["first_k_dense_replace"]
        per_moe = (c["num_experts_per_tok"] + c["n_shared_experts"]) * 3 * h * c["moe_intermediate_size"]
        mlp = s * (dense * 3 * h * c["intermediate_size"] + moe * per_moe)
    terms = {"projections": 6 * L * proj, "attention scores": 6 * L * scores, "MLP/experts": 6 * mlp,
             "LM head": 6 * s * h * V}
    megatron = sum(terms.values())
    maxtext = 3 * (2 * L * proj + 2 * mlp + 2 * s * h * V) + 3 * L * 2 * scores
    return megatron, maxtext, terms


def our_terms(report) -> dict[str, int]:
    """The counted step's FLOPs (forward + backward, one sequence) by the same terms, and the rest."""
    out = {"projections": 0, "attention scores": 0, "MLP/experts": 0, "LM head": 0, "router": 0,
           "other ops (norms, softmax, rotary, activations, loss)": 0}
    for node, sc in zip(report.nodes, report.modules.nodes):
        f = node.cost.flops + node.backward.flops
        leaf = sc[-1].rsplit(".", 1)[-1] if sc else ""
        product = node.family in ("matmul", "gemm", "einsum")
        if not product:
            key = "other ops (norms, softmax, rotary, activations, loss)"
        elif leaf == "lm_head":
            key = "LM head"
        elif leaf == "gate":
            key = "router"
        elif leaf == "self_attn":
            key = "attention scores"
        elif ".mlp" in sc[-1] or ".experts" in sc[-1]:
            key = "MLP/experts"
        else:
            key = "projections"
        out[key] += f
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="70b,deepseek-v3")
    p.add_argument("--seq", type=int, default=0, help="tokens a sequence (default 8192 for 70b, 4096 DeepSeek-V3)")
    args = p.parse_args(argv)
    for name in args.models.split(","):
        s = args.seq or (8192 if name == "70b" else 4096)
        c = config(name)
        t0 = time.perf_counter()
        r = flopcount.from_hf(c, {"input_ids": (1, s)}, mode="train", cache_dir=False)
        counted = time.perf_counter() - t0
        megatron, maxtext, terms = conventions(name, s)
        ours = our_terms(r)
        print(f"\n{name}: {r.layers.layers} layers ({r.layers.method}), {s} tokens a sequence; counted in "
              f"{counted:.1f} s")
        print(f"  per sequence, forward + backward, TFLOPs: {'term':<54} {'ours':>10} {'Megatron':>10}")
        for key, v in ours.items():
            print(f"  {'':<40} {key:<54} {v / 1e12:>10.2f} {terms.get(key, 0) / 1e12:>10.2f}")
        print(f"  {'':<40} {'total':<54} {sum(ours.values()) / 1e12:>10.2f} {megatron / 1e12:>10.2f}"
              f"   (MaxText {maxtext / 1e12:.2f})")
        for text, m in PLANS[name]:
            plan = parse_parallel(text, microbatches=m, schedule="1f1b")
            t1 = time.perf_counter()
            led = ledger(r, plan, parse_recompute("selective"))
            took = time.perf_counter() - t1
            world = plan.world_size
            sequences = m * plan.dp
            mean_model = sum(x.model_flops for x in led.ranks) / world
            slow = next(x for x in led.ranks if x.rank == led.slowest_rank)
            print(f"  {plan} ({world} GPUs, {sequences} sequences a step): ledger {took:.1f} s; TFLOPs per GPU "
                  f"per step: Megatron {megatron * sequences / world / 1e12:.1f}, MaxText "
                  f"{maxtext * sequences / world / 1e12:.1f}, ours mean model {mean_model / 1e12:.1f}, slowest "
                  f"rank {slow.rank} model {slow.model_flops / 1e12:.1f} + redundant "
                  f"{slow.redundant_flops / 1e12:.1f} + recompute {slow.recompute_flops / 1e12:.1f} = hardware "
                  f"{slow.hardware_flops / 1e12:.1f}; bubble {led.bubble_fraction:.3f}, imbalance "
                  f"{led.imbalance:.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
