"""Counting a full-size LLM from its configuration: whole-process times, peak memory, and the count against its
closed form and against the whole-model export.

Run from the repository root (needs ``transformers``; nothing is downloaded: the model is built from a
configuration on the meta device, so no weight is ever allocated)::

    python benchmarks/llm_count.py                    # Llama-3-8B shape (32 layers), 2048 tokens, training
    python benchmarks/llm_count.py --skip-export      # without the slow whole-model export
    python benchmarks/llm_count.py --seq-len 8192 --mode inference

The model is ``LlamaForCausalLM`` with Llama-3-8B's published shape (hidden 4096, MLP 14336, 32 heads, 8 key/value
heads, vocabulary 128256, tied embeddings off), given as a ``config.json`` in a temporary folder. Each figure is one
whole ``flopcount --hf FOLDER --input-shape input_ids=BxS --mode train --convention dense --format json`` process
(imports, building the model, exports and the count), timed from outside with its peak RSS from ``wait4``:

1. ``--repeated-layers extend`` (the default) with the export cache off (``FLOPCOUNT_CACHE=0``): 1- and 2-layer
   exports, extended to 32 layers;
2. the same with a fresh cache folder, twice: the second run is the repeat, served from the cache;
3. ``--repeated-layers export`` with the cache off: the whole 32-layer model exported (tens of seconds).

The counts of 1 and 3 must be equal in every figure the JSON holds (totals, forward, backward, per operator type,
parameters), and the forward products must equal the closed form, per sequence of S tokens (L layers, hidden d)::

    forward = 2·S·(matrix parameters) + L·2·(2·S²·d)

where the matrix parameters are every parameter except the token embedding table (a lookup, no product) and the
RMSNorm weights (scales, no product), and the second term is the two attention products (Q·Kᵀ and P·V) per layer,
counted over the full S×S matrix as every counter of unmasked ``matmul`` does. In training the dense backward is
twice the forward: every product has two operands that need a gradient (the embedding table is trained, so even
the first layer's input needs one). The targets the issue set: at most 15 s
with the cache off, at most 5 s for a cached repeat, on a 2-core machine. Nothing asserts: this prints figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
    "max_position_embeddings": 8192, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
    "hidden_act": "silu", "bos_token_id": 128000, "eos_token_id": 128001,
}


def run(folder: Path, shape: str, mode: str, cache: str, *extra: str) -> tuple[dict, float, float]:
    """One whole ``flopcount --hf`` process: its JSON report, wall seconds and peak RSS in MB."""
    command = [sys.executable, "-m", "flopcount", "--hf", str(folder), "--input-shape", f"input_ids={shape}",
               "--mode", mode, "--convention", "dense", "--format", "json", *extra]
    env = dict(os.environ, FLOPCOUNT_CACHE=cache)
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(process.pid, 0)  # this child's own peak RSS
        elapsed = time.perf_counter() - t0
        out.seek(0), err.seek(0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"llm_count: {' '.join(command)} failed: {err.read().strip()[-500:]}")
        return json.loads(out.read()), elapsed, usage.ru_maxrss / 1024


def figures(doc: dict) -> dict:
    """What must not depend on how the stack was counted."""
    return {k: doc[k] for k in ("total", "forward", "backward", "by_op_type", "training") if k in doc}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--mode", choices=("inference", "train"), default="train")
    p.add_argument("--skip-export", action="store_true", help="leave out the whole-model export (tens of seconds)")
    args = p.parse_args(argv)
    try:
        import transformers
    except ImportError as e:
        print(f"llm_count: needs torch and transformers ({e})", file=sys.stderr)
        return 11
    shape = f"{args.batch}x{args.seq_len}"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "Llama-3-8B"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(CONFIG))
        cache = str(Path(tmp) / "cache")
        print(f"Llama-3-8B shape, 32 layers, batch {args.batch} x {args.seq_len} tokens, {args.mode} (transformers "
              f"{transformers.__version__}); whole processes, {os.cpu_count()} CPUs")
        extended, t_cold, m_cold = run(folder, shape, args.mode, "0")
        print(f"  extended from 1 and 2 layers, cache off: {t_cold:.1f} s, peak RSS {m_cold:.0f} MB (target 15 s); "
              f"layers: {extended.get('layers', {}).get('method')}: {extended.get('layers', {}).get('reason')}")
        _, t_fill, _ = run(folder, shape, args.mode, cache)
        cached, t_warm, m_warm = run(folder, shape, args.mode, cache)
        print(f"  the same, cache filled ({t_fill:.1f} s), then repeated: {t_warm:.1f} s, peak RSS {m_warm:.0f} MB "
              f"(target 5 s); {'equal' if figures(cached) == figures(extended) else 'DIFFERENT'} counts")
        if not args.skip_export:
            whole, t_export, m_export = run(folder, shape, args.mode, "0", "--repeated-layers", "export")
            same = figures(whole) == figures(extended)
            print(f"  whole model exported, cache off: {t_export:.1f} s, peak RSS {m_export:.0f} MB; every figure "
                  f"{'equal to the extended count' if same else 'DIFFERENT from the extended count'}")
    closed_form(extended, args)
    return 0


def closed_form(doc: dict, args) -> None:
    """The forward products against 2·S·(matrix parameters) + 4·L·S²·d, per sequence, times the batch."""
    d, layers, vocab, mlp, kv = 4096, 32, 128256, 14336, 1024
    per_layer = d * d + 2 * d * kv + d * d + 3 * d * mlp  # q, k and v, o, gate/up/down
    matrices = layers * per_layer + vocab * d  # the head; the embedding table is a lookup
    s = args.seq_len
    closed = args.batch * (2 * s * matrices + layers * 2 * (2 * s * s * d))
    forward = doc["forward"]["flops"]
    params = doc["total"]["params"]
    expected_params = layers * (per_layer + 2 * d) + 2 * vocab * d + d  # + the norms' scales, embedding, final norm
    print(f"  parameters: {params:,} (closed form {expected_params:,}: {'equal' if params == expected_params else 'DIFFERENT'})")
    print(f"  forward FLOPs (dense): {forward:,}; closed form {closed:,}; {'equal' if forward == closed else 'DIFFERENT'}")
    print(f"  per token: {forward / (args.batch * s) / 1e9:.2f} GFLOPs forward")
    if args.mode == "train":
        backward = doc["backward"]["flops"]
        print(f"  backward FLOPs (dense): {backward:,} ({backward / forward:.4f}x forward); twice the forward "
              f"{2 * forward:,}: {'equal' if backward == 2 * forward else 'DIFFERENT'}")

if __name__ == "__main__":
    sys.exit(main())
