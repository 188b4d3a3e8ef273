"""Where the CPU time of a one-rank training step goes, by kind of work, beside the prediction's seconds of the
same kinds: ``step_time.py``'s one-rank runs (its Llama, GPT-2 and Mixtral at batch 4, AdamW, one thread) measured
by the CPU seconds of each aten call, against each node's predicted seconds
(:func:`flopcount.measure.predict.node_seconds` of :func:`flopcount.measure.predict_report.node_works`, the
one-rank prediction's nodes) from a profile calibrated beforehand, grouped alike:

* ``gemm``: matrix products of a weight (aten ``mm``/``addmm``/grouped products; the nodes of kind gemm);
* ``attention``: the fused attention and its backward, or the math attention's batched products (``bmm``) and
  softmax (the nodes of kind attention and the Softmax nodes);
* ``dropout``, ``embedding`` (the token embedding's gather and its gradient's scatter), ``loss`` (log-softmax and
  the negative log-likelihood);
* ``elementwise``: every other operator that moves bytes (norms, activations, residual adds, rotary, copies,
  the gradient sums of tensors read by several nodes);
* ``optimizer``: AdamW's step, its CPU seconds timed apart, against the prediction's optimizer seconds;
* ``framework``: the step's CPU seconds outside every aten operator that does work (Python, autograd's engine,
  views and other metadata-only calls), against the predicted framework overhead (per node and per backward
  kernel); the aten calls per step and the counted nodes are printed beside.

The step's CPU seconds (user and system, every thread of the process) are measured alone, the optimizer's apart;
each aten call's CPU seconds in a separate pass of the same steps under a dispatch mode (its own cost outside the
calls it times), and ``framework`` is the rest of the forward and backward's CPU seconds. Each model is measured
twice and the figures printed side by side; ``--top`` adds the costliest aten operators and each product's shape
(matrices × m × k × n) with its CPU seconds beside the profile's GEMM rate at its size ∛(m·k·n).

    PYTHONPATH=$PWD python3 -m flopcount calibrate --ranks 1 --threads 1 -o /tmp/profile-1.json
    PYTHONPATH=$PWD python3 benchmarks/step_time_parts.py --profile /tmp/profile-1.json --models llama,gpt2,mixtral

The CPU's cores are shared with whatever else runs: the 1-minute load average is printed.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import time

import step_time

BATCH = 4
KINDS = ("gemm", "attention", "dropout", "embedding", "loss", "elementwise", "optimizer", "framework")
# aten operators by kind; any other aten operator that is not metadata-only is elementwise work
_ATEN = {
    # a weight's product runs as one mm of its rows (addmm with a bias, a grouped product over experts' weights)
    "gemm": ("mm", "addmm", "addbmm", "_grouped_mm", "linear_backward"),
    # torch's math attention (GPT-2 with its attention dropout) runs bmm and a softmax
    "attention": ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
                  "bmm", "baddbmm", "_softmax", "_safe_softmax", "_softmax_backward_data"),
    "dropout": ("native_dropout", "native_dropout_backward", "bernoulli_", "bernoulli"),
    "embedding": ("embedding", "embedding_dense_backward", "index_select", "embedding_backward", "index_add_"),
    "loss": ("_log_softmax", "_log_softmax_backward_data", "nll_loss_forward", "nll_loss_backward",
             "nll_loss2d_forward", "nll_loss2d_backward"),
}
_KIND_OF = {op: kind for kind, ops in _ATEN.items() for op in ops}
# aten operators that move no bytes of their own (views, allocation, metadata): framework cost
_METADATA = frozenset((
    "view", "reshape", "_reshape_alias", "transpose", "t", "expand", "as_strided", "unsqueeze", "squeeze", "slice",
    "select", "permute", "_unsafe_view", "detach", "alias", "empty", "empty_like", "empty_strided", "resize_",
    "lift_fresh", "unbind", "split", "chunk", "contiguous", "flatten", "unflatten", "view_as", "expand_as", "narrow",
    "to", "type_as", "result_type", "is_nonzero", "item", "_local_scalar_dense", "set_", "movedim", "swapaxes",
    "diagonal", "new_empty", "new_empty_strided", "_has_compatible_shallow_copy_type",
    # composites whose work is in the operators they call (their self time is dispatch)
    "matmul", "linear", "dropout", "softmax", "log_softmax", "cross_entropy_loss", "nll_loss", "nll_loss_nd",
    "scaled_dot_product_attention", "_scaled_dot_product_attention_math", "sum_to_size"))


def node_kind(node, work) -> str:
    """The kind (:data:`KINDS`) a counted node's seconds are grouped under."""
    if work.kind == "attention" or node.op_type == "Softmax":
        return "attention"
    if work.kind in ("gemm", "conv"):
        return "gemm"
    if work.kind == "dropout":
        return "dropout"
    if node.op_type == "Gather" and node.family == "indexing":
        return "embedding"
    if node.family == "loss" or node.op_type in ("LogSoftmax", "NegativeLogLikelihoodLoss"):
        return "loss"
    return "elementwise"


def predicted(model: str, profile_path: str, folder: str) -> dict:
    """Seconds per kind of the one-rank prediction at the best repeats, nodes per kind, and the prediction's
    figures (its step, compute, optimizer and overhead seconds)."""
    from flopcount.cli.count import build_parser, count_source
    from flopcount.measure.machine.calibration import load_profile
    from flopcount.measure.predict import node_overhead, node_seconds, predict_work, work_of
    from flopcount.measure.predict_report import node_works

    config = os.path.join(folder, f"{model}.json")
    with open(config, "w", encoding="utf-8") as f:
        json.dump(step_time.MODELS[model], f)
    cmd = step_time._count_command(step_time.Run(model, model, BATCH), config, profile_path)
    report = count_source(build_parser().parse_args(cmd[3:]))
    profile = load_profile(profile_path)
    secs, nodes = collections.Counter(), collections.Counter()
    def work_s(w) -> float:
        f, b, _ = node_seconds(w, profile, "best")
        return f + b - sum(node_overhead(w, profile, "best"))

    for node, w in node_works(report):
        kind, bare = node_kind(node, w), dataclasses.replace(w, sums=0.0)
        secs[kind] += work_s(bare)
        secs["elementwise"] += work_s(w) - work_s(bare)  # its outputs' gradient sums: aten add calls
        secs["framework"] += sum(node_overhead(w, profile, "best"))
        nodes[kind] += 1
    row = predict_work(work_of(report), profile).ranks[0]
    secs["optimizer"] += row["optimizer_seconds"]
    return {"seconds": secs, "nodes": nodes, "step": row["step_seconds"], "overhead": row["overhead_seconds"]}


def measured(model: str, steps: int) -> dict:
    """Seconds per kind of ``steps`` real steps (their median CPU seconds alone; each aten call's CPU seconds in
    a separate pass under a dispatch mode, whose own cost stays outside the calls it times), and aten calls per kind
    per step."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    torch.set_num_threads(1)
    net = step_time._build(model)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
    ids = torch.randint(0, step_time.LLAMA["vocab_size"], (BATCH, step_time.SEQ),
                        generator=torch.Generator().manual_seed(1))

    def step() -> tuple[float, float]:
        c = time.process_time()
        step_time._loss(net(input_ids=ids).logits, ids).backward()
        c2 = time.process_time()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return c2 - c, time.process_time() - c2

    class Calls(TorchDispatchMode):
        cpu: collections.Counter = collections.Counter()
        calls: collections.Counter = collections.Counter()

        products: collections.Counter = collections.Counter()  # (m, k, n, matrices): CPU seconds
        counts: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            c = time.process_time()
            out = func(*args, **(kwargs or {}))
            spent = time.process_time() - c
            name = func.overloadpacket.__name__
            self.cpu[name] += spent
            self.calls[name] += 1
            if name in ("mm", "addmm", "bmm"):
                a, b = args[1:3] if name == "addmm" else args[:2]
                key = (*a.shape[-2:], b.shape[-1], a.shape[0] if a.dim() == 3 else 1)
                self.products[key] += spent
                self.counts[key] += 1
            return out

    for _ in range(3):
        step()
    fb, op = zip(*(step() for _ in range(steps)))
    with Calls():
        for _ in range(steps):
            step_time._loss(net(input_ids=ids).logits, ids).backward()
            net.zero_grad(set_to_none=True)
    secs, calls = collections.Counter(), collections.Counter()
    for name, cpu in Calls.cpu.items():
        kind = _KIND_OF.get(name, "framework" if name in _METADATA else "elementwise")
        if kind != "framework":  # the metadata calls' seconds stay in the framework's rest
            secs[kind] += cpu / steps
        calls[kind] += Calls.calls[name] / steps
    secs["framework"] = statistics.median(fb) - sum(secs.values())
    secs["optimizer"] = statistics.median(op)
    top = sorted(((cpu / steps, Calls.calls[name] / steps, name) for name, cpu in Calls.cpu.items()),
                 reverse=True)[:15]
    products = [[*k, Calls.counts[k] / steps, v / steps] for k, v in sorted(Calls.products.items())]
    return {"seconds": secs, "calls": calls, "step": statistics.median(fb) + statistics.median(op), "top": top,
            "products": products}


def _products(found: dict, profile_path: str) -> None:
    """Each product shape's CPU seconds a step against the profile's GEMM rate (best) at its size ∛(m·k·n)."""
    from flopcount.measure.machine.calibration import load_profile, rate_at

    gemm = load_profile(profile_path).compute["gemm"]
    for m, k, n, b, calls, cpu in found["products"]:
        flops = 2.0 * m * k * n * b * calls
        want = flops / rate_at(gemm, (m * k * n) ** (1 / 3), "best")[0]
        print(f"    {b:3d} x {m:5d} x {k:5d} x {n:5d} {calls:4.0f} calls: {cpu * 1e3:7.2f} ms "
              f"({flops / cpu / 1e9:6.1f} GFLOP/s), at the profile's rate {want * 1e3:7.2f} ms")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="a profile calibrated with --ranks 1 --threads 1")
    ap.add_argument("--models", default="llama,gpt2,mixtral")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", action="store_true", help="also print each run's 15 costliest aten operators, and "
                    "each matrix product's shape against the profile's GEMM rate")
    args = ap.parse_args(argv)
    folder = tempfile.mkdtemp(prefix="flopcount-parts-")
    for model in args.models.split(","):
        pred = predicted(model, args.profile, folder)
        load0 = os.getloadavg()[0]
        runs = [measured(model, args.steps) for _ in range(2)]
        print(f"{model} b{BATCH} (load {load0:.1f}-{os.getloadavg()[0]:.1f}): step CPU "
              + " / ".join(f"{r['step']:.4f}" for r in runs) + f" s; predicted {pred['step']:.4f} s")
        print(f"  {'kind':12s} {'measured s (two runs)':>22s} {'predicted s':>12s} {'ratio':>6s}  "
              f"{'aten calls':>10s} {'nodes':>6s}")
        for kind in KINDS:
            got = [r["seconds"][kind] for r in runs]
            want = pred["seconds"][kind]
            ratio = f"{statistics.mean(got) / want:6.2f}" if want else "     -"
            print(f"  {kind:12s} {got[0]:10.4f} {got[1]:10.4f}  {want:12.4f} {ratio}  "
                  f"{runs[0]['calls'][kind]:10.0f} {pred['nodes'][kind]:6d}")
        if args.top:
            for s, n, key in runs[0]["top"]:
                print(f"    {key:60s} {s * 1e3:8.2f} ms {n:6.0f} calls")
            _products(runs[0], args.profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
