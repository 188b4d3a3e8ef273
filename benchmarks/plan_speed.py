"""How fast ``flopcount plan`` searches: Llama-3-70B (hidden 8192, 80 layers, 64 heads, 8 K/V heads, intermediate
28672, vocabulary 128256; a configuration written here, no weights) on 64 H100s of 80 GiB, sequences of 4096
tokens, a global batch of 512 sequences, microbatches of 1 and 2 sequences; trained as such a model is, in bf16 with
float32 master weights (``--master-weights``; ``--dtype float32`` counts it in float32 throughout, the configuration
of the figures in docs/predict.md before 2026-11-30 09:20 UTC).

The model is counted once per microbatch size and recompute policy from exports of 1 and 2 layers (``--repeated-layers extend``); the
search then checks, fits and predicts every plan. Printed: the plans tried, those that fit, the seconds of the counts
and of the search, plans per second, and the best plans.

    PYTHONPATH=$PWD python3 benchmarks/plan_speed.py
    PYTHONPATH=$PWD python3 benchmarks/plan_speed.py --sizes 1 --global-batch 256 --devices 64
    PYTHONPATH=$PWD python3 benchmarks/plan_speed.py --sizes 1 --sample 300   # whole groups of plans, 300 or more

The CPU's cores are shared with whatever else runs: the 1-minute load average is printed beside the figures, and
the search's CPU seconds (this process's, which a busy machine stretches less than the wall-clock seconds).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

LLAMA3_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
              "num_key_value_heads": 8, "vocab_size": 128256}


def _children_cpu() -> float:
    """CPU seconds of the worker processes this process has waited for."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=64)
    parser.add_argument("--global-batch", type=int, default=512)
    parser.add_argument("--sizes", default="1,2", help="microbatch sizes (sequences)")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--top", type=int, default=5)
    parser.add_argument("--sample", type=int, metavar="N", help="search at least N plans, whole groups of the same "
                        "node shares drawn at random (seeded), not all")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (flopcount plan --jobs; default 1)")
    parser.add_argument("--json", metavar="FILE", help="also write every plan that fits, the dropped counts and the "
                        "least peak over memory to FILE (JSON), to compare two versions' figures exactly")
    parser.add_argument("--profile", metavar="FILE", help="also write the search's cProfile statistics to FILE")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16",
                        help="the model's dtype (bfloat16: with float32 master weights)")
    a = parser.parse_args()
    import transformers

    from flopcount.cli.plan import build_parser, reports
    from flopcount.measure.machine.calibration import device_profile
    from flopcount.measure.plan_search import search
    from flopcount.measure.plan_space import RECOMPUTES, SpaceSettings
    from flopcount.parallel.layout import layout_of
    from flopcount.parallel.plan import ParallelPlan

    sizes = tuple(int(s) for s in a.sizes.split(","))
    with tempfile.TemporaryDirectory() as folder:
        config = transformers.LlamaConfig(**LLAMA3_70B, **({"torch_dtype": a.dtype} if a.dtype != "float32" else {}))
        with open(os.path.join(folder, "config.json"), "w") as f:
            f.write(config.to_json_string())
        args = build_parser().parse_args(["--hf", folder, "--input-shape", f"input_ids={sizes[0]}x{a.seq}:int64",
                                          "--optimizer", "adamw", "--device", "H100", "--devices", str(a.devices),
                                          "--device-memory", "H100",
                                          *(["--master-weights"] if a.dtype != "float32" else [])])
        args.mode, args.memory = "train", True
        report_of = reports(args)
        start = time.perf_counter()
        for size in sizes:
            for policy in RECOMPUTES:
                report_of(size, policy)
        counted = time.perf_counter() - start
        first = report_of(sizes[0])
        dims = layout_of(first, ParallelPlan()).dims
        space = SpaceSettings(a.devices, dims.layers, False, sizes, (), a.global_batch)
        profile = device_profile("H100", a.devices)
        import cProfile

        profiler = cProfile.Profile() if a.profile else None
        start, cpu = time.perf_counter(), time.process_time() - _children_cpu()
        if profiler:
            profiler.enable()
        found = search(report_of, profile, space, args.device_memory, a.sample, a.jobs)
        searched, cpu = time.perf_counter() - start, time.process_time() - cpu + _children_cpu()
        if profiler:
            profiler.disable()
            profiler.dump_stats(a.profile)
    load = os.getloadavg()[0]
    if a.json:
        import json

        with open(a.json, "w") as f:
            json.dump({"plans": [c.as_dict() for c in found.plans], "dropped": dict(found.dropped),
                       "smallest": found.smallest.as_dict() if found.smallest else None, "tried": found.tried}, f,
                      indent=1)
    print(f"Llama-3-70B ({a.dtype}) on {a.devices} H100s ({args.device_memory / 2**30:.4g} GiB), sequences of {a.seq}, global "
          f"batch {a.global_batch}, microbatch sizes {a.sizes}")
    print(f"counts: {counted:.1f} s ({len(sizes) * 3}); search: {found.tried:,} plans in {searched:.1f} s = "
          f"{found.tried / searched:,.2f} plans/s ({searched / found.tried:.3f} s a plan; CPU {cpu:.1f} s); "
          f"{len(found.plans):,} fit; {a.jobs} job(s); load average {load:.2f}")
    print("dropped: " + "; ".join(f"{n:,} x {why}" for why, n in found.dropped.most_common()))
    for c in found.plans[:a.top]:
        print(f"  {c.parallel:<28} {c.schedule:<14} {c.microbatch_size} x {c.microbatches:<4} {c.recompute:<9} "
              f"step {c.step_seconds:.3f} s  {c.tokens_per_second:,.0f} tokens/s  MFU {c.mfu:.3f}  "
              f"peak {c.peak_bytes / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
