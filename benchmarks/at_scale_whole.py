"""Whole ``flopcount --hf CONFIG ...`` processes at scale, timed from start to exit: the runs issues #28 and #29 want
under 20 s (the FLOPs ledger of Llama-3-70B and DeepSeek-V3 under their plans, the memory ledger of Llama-3-8B, 70B
and DeepSeek-V3), each a fresh process with the export cache off (``FLOPCOUNT_CACHE=0``), so that Python's start,
torch's and transformers' imports, both exports, the count, the ledger, the report and the exit are all in it.
Beside them, the process that only imports what an ``--hf`` count must (torch, transformers, the model's module):
no count can be faster than that. Needs transformers.

Run from the repository root::

    python benchmarks/at_scale_whole.py                    # every run once
    python benchmarks/at_scale_whole.py --runs 70b,8b-memory --repeat 3

The configurations are the published shapes in parallel_at_scale.py and memory_at_scale.py, written to a temporary
folder. No weight is read and nothing is downloaded. This prints figures; nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

TARGET_S = 20.0
PLAN = ["--mode", "train", "--microbatches", "16", "--schedule", "1f1b", "--recompute", "selective"]
#: name -> (config, tokens, extra arguments)
RUNS = {
    "70b": ("70b", 8192, ["--parallel", "tp=8,pp=4,cp=2,dp=4", *PLAN]),
    "deepseek-v3": ("deepseek-v3", 4096, ["--parallel", "tp=2,ep=8,dp=8", *PLAN]),
    "8b-memory": ("8b", 4096, ["--memory", "--optimizer", "adamw", "--parallel", "tp=2,pp=2,dp=2", "--mode", "train",
                               "--microbatches", "8", "--schedule", "1f1b", "--recompute", "selective"]),
    "70b-memory": ("70b", 8192, ["--memory", "--optimizer", "adamw", "--parallel", "tp=8,pp=4,cp=2,dp=4", *PLAN]),
    "deepseek-v3-memory": ("deepseek-v3", 4096, ["--memory", "--optimizer", "adamw", "--parallel", "tp=2,ep=8,dp=8",
                                                 *PLAN]),
}
_IMPORTS = {
    "llama": "import torch, transformers; from transformers.models.llama import modeling_llama",
    "deepseek-v3": "import torch, transformers; from transformers.models.deepseek_v3 import modeling_deepseek_v3",
}


def _config_file(name: str, folder: str) -> str:
    from memory_at_scale import config

    path = os.path.join(folder, f"{name}.json")
    if not os.path.exists(path):
        config(name).to_json_file(path)
    return path


def flopcount_dir() -> str:
    """The folder of the flopcount package these processes import (found without importing it)."""
    import importlib.util

    return os.path.dirname(importlib.util.find_spec("flopcount").origin)


def _env() -> dict[str, str]:
    """The export cache off, and ``PYTHONDONTWRITEBYTECODE`` unset: an installed flopcount has its ``.pyc`` files (pip
    writes them), so these processes read them too (the warm-up writes them) rather than compile every module."""
    env = dict(os.environ, FLOPCOUNT_CACHE="0")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _seconds(argv: list[str]) -> float:
    env = _env()
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return took


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", default=",".join(RUNS), help=f"comma-separated, of: {', '.join(RUNS)}")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"median of {args.repeat} whole process(es) each, export cache off, .pyc files written and read "
          f"(PYTHONDONTWRITEBYTECODE unset in the children, as for an installed flopcount)")
    # the warm-up: what pip does at install, byte-compile the package, so that no timed process compiles a module
    subprocess.run([sys.executable, "-m", "compileall", "-q", flopcount_dir()], env=_env(), check=True)
    with tempfile.TemporaryDirectory() as folder:
        floors: dict[str, float] = {}
        for name in args.runs.split(","):
            model, tokens, extra = RUNS[name]
            family = "deepseek-v3" if model == "deepseek-v3" else "llama"
            if family not in floors:
                floors[family] = statistics.median(
                    _seconds([sys.executable, "-c", _IMPORTS[family]]) for _ in range(args.repeat))
            argv_ = [sys.executable, "-m", "flopcount", "--hf", _config_file(model, folder), "--input-shape",
                     f"input_ids=1,{tokens}", *extra, "--format", "json"]
            took = statistics.median(_seconds(argv_) for _ in range(args.repeat))
            verdict = "met" if took < TARGET_S else "MISSED"
            print(f"{name:<20} {took:6.1f} s  (imports alone {floors[family]:4.1f} s)  want < {TARGET_S:.0f} s: "
                  f"{verdict}   {' '.join(extra)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
