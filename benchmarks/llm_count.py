"""Counting a full-size LLM from its configuration: time, memory and the count against its closed form.

Run from the repository root (needs ``transformers``; nothing is downloaded: the model is built from a
configuration on the meta device, so no weight is ever allocated)::

    python benchmarks/llm_count.py                    # Llama-3-8B shape (32 layers), 2048 tokens
    python benchmarks/llm_count.py --layers 2         # a quick look
    python benchmarks/llm_count.py --seq-len 8192

The model is ``LlamaForCausalLM`` with Llama-3-8B's published shape (hidden 4096, MLP 14336, 32 heads, 8 key/value
heads, vocabulary 128256, tied embeddings off). It is exported through ``flopcount.from_torch`` (torch.export on the
meta device) and counted with the ``dense`` convention (products only, as ``torch.utils.flop_counter``).

The closed form it is checked against, per sequence of S tokens (L layers, hidden d)::

    forward = 2·S·(matrix parameters) + L·2·(2·S²·d)

where the matrix parameters are every parameter except the token embedding table (a lookup, no product) and the
RMSNorm weights (scales, no product), and the second term is the two attention products (Q·Kᵀ and P·V) per layer,
counted over the full S×S matrix as every counter of unmasked ``matmul`` does. The script prints the export and count
time, the peak RSS of the process, both counts and whether they are equal. Nothing asserts: this prints figures.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mode", choices=("inference", "train"), default="inference",
                   help="train: also the backward pass (printed, not checked against a closed form)")
    args = p.parse_args(argv)
    try:
        import torch
        import transformers
    except ImportError as e:
        print(f"llm_count: needs torch and transformers ({e})", file=sys.stderr)
        return 11

    from flopcount.frontends.torch import from_torch

    d, layers, vocab = 4096, args.layers, 128256
    config = transformers.LlamaConfig(
        vocab_size=vocab, hidden_size=d, intermediate_size=14336, num_hidden_layers=layers, num_attention_heads=32,
        num_key_value_heads=8, max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    t0 = time.perf_counter()
    report = from_torch(model, {"input_ids": ((args.batch, args.seq_len), torch.int64)}, convention="dense",
                        mode=args.mode, cache_dir=False)
    elapsed = time.perf_counter() - t0
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    params = sum(p.numel() for p in model.parameters())
    norms = sum(p.numel() for name, p in model.named_parameters() if "norm" in name)
    matrices = params - model.get_input_embeddings().weight.numel() - norms
    s = args.seq_len
    closed = args.batch * (2 * s * matrices + layers * 2 * (2 * s * s * d))

    print(f"Llama-3-8B shape, {layers} layers, batch {args.batch} x {s} tokens (transformers {transformers.__version__},"
          f" torch {torch.__version__})")
    print(f"  parameters: {params:,} (report: {report.params:,})")
    print(f"  forward FLOPs (dense): {report.forward.flops:,}; closed form {closed:,}; "
          f"{'equal' if report.forward.flops == closed else 'DIFFERENT'}")
    print(f"  per token: {report.forward.flops / (args.batch * s) / 1e9:.2f} GFLOPs forward")
    if args.mode == "train":
        print(f"  backward FLOPs (dense): {report.backward.flops:,} ({report.backward.flops / report.forward.flops:.3f}x"
              f" forward); operators without a backward formula: {dict(report.backward_unsupported) or 'none'}")
    print(f"  export + count: {elapsed:.1f} s; peak RSS of this process: {peak_mb:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
