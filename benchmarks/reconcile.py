"""Full-size reconciliation of flopcount's ``dense`` convention with ``torch.utils.flop_counter.FlopCounterMode``.

Run from the repository root (needs torch and onnxscript; takes a few minutes on two cores)::

    python benchmarks/reconcile.py                      # every model of flopcount.models.zoo, full size
    python benchmarks/reconcile.py --models bert-base,lstm --repeat 9
    python benchmarks/reconcile.py --opset 23           # SDPA exported as ONNX Attention nodes
    python benchmarks/reconcile.py --attention matmul   # attention written as matmul + softmax
    python benchmarks/reconcile.py --cpu                # also FlopCounterMode on CPU (real arithmetic: slower)

Each model is built with random weights (nothing is downloaded), exported weightless with
``export_weightless`` (dynamo exporter) to a temporary directory, and counted with ``flopcount.count`` under the
``dense`` convention (products only, 2 FLOPs per MAC) and the ``default`` one (everything). FlopCounterMode runs one
eval-mode forward pass of the same module on the meta device, where ``F.scaled_dot_product_attention`` and
``nn.LSTM`` decompose into matrix products that it counts; on CPU (``--cpu``) it counts neither (see
``tests/acceptance/test_reconcile_torch.py``). "diff %" is (flopcount dense − FlopCounterMode meta) / FlopCounterMode meta.

Times: export once (seconds of tracing and ONNX optimisation); dense count the median of ``--repeat`` runs after
one warm-up; the default-convention count one run. This prints figures; nothing asserts.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from tabulate import tabulate

import flopcount
from flopcount.frontends import export
from flopcount.models import zoo

GIGA = 1e9


@dataclass(frozen=True)
class Row:
    model: str
    dense: int
    torch_meta: int
    torch_cpu: int | None
    default: int
    export_s: float
    count_s: float
    default_count_s: float
    ops: str  # the dense op types, for the reader

    @property
    def diff_percent(self) -> float:
        return 100.0 * (self.dense - self.torch_meta) / self.torch_meta


def torch_flops(module, inputs) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        module.eval()(*inputs)
    return counter.get_total_flops()


def measure(name: str, directory: Path, *, opset: int, attention: str | None, repeat: int, cpu: bool) -> Row:
    import torch

    torch.manual_seed(0)
    options = {"attention": attention} if attention and "attention" in zoo.MODELS[name].options else {}
    built = zoo.build(name, **options)
    path = directory / f"{name}.onnx"

    start = time.perf_counter()
    export.export_weightless(built.module, built.inputs, path, input_names=built.input_names,
                             output_names=built.output_names, opset=opset)
    export_s = time.perf_counter() - start

    dense = flopcount.count(path, convention="dense")  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        dense = flopcount.count(path, convention="dense")
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    default = flopcount.count(path)
    default_s = time.perf_counter() - start

    torch_cpu = torch_flops(built.module, built.inputs) if cpu else None
    torch_meta = torch_flops(built.module.to("meta"), tuple(x.to("meta") for x in built.inputs))
    ops = "+".join(key for key, summary in dense.by_op_type.items() if summary.cost.flops)
    if dense.unsupported:
        ops += f" (unsupported: {dict(dense.unsupported)})"
    return Row(name, dense.total.flops, torch_meta, torch_cpu, default.total.flops, export_s,
               statistics.median(times), default_s, ops)


def render(rows: Sequence[Row], cpu: bool) -> str:
    headers = ["model", "flopcount dense GFLOPs", "FlopCounterMode GFLOPs (meta)", "diff %"]
    headers += ["FlopCounterMode GFLOPs (CPU)"] if cpu else []
    headers += ["default-convention GFLOPs", "export s", "count s (dense, median)", "count s (default)", "dense ops"]
    table = []
    for r in rows:
        diff = "0 (equal)" if r.dense == r.torch_meta else f"{r.diff_percent:+.4f}"
        line = [r.model, f"{r.dense / GIGA:.4f}", f"{r.torch_meta / GIGA:.4f}", diff]
        line += [f"{r.torch_cpu / GIGA:.4f}"] if cpu else []
        line += [f"{r.default / GIGA:.4f}", f"{r.export_s:.1f}", f"{r.count_s:.3f}", f"{r.default_count_s:.3f}", r.ops]
        table.append(line)
    return tabulate(table, headers=headers, tablefmt="github", disable_numparse=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(zoo.MODELS), help="comma-separated zoo names (default: all)")
    parser.add_argument("--opset", type=int, default=export.DEFAULT_OPSET, help="ONNX opset (default %(default)s)")
    parser.add_argument("--attention", choices=["sdpa", "matmul"], help="transformers' attention (default sdpa)")
    parser.add_argument("--repeat", type=int, default=5, help="timed dense counts per model (default %(default)s)")
    parser.add_argument("--cpu", action="store_true", help="also run FlopCounterMode on CPU")
    parser.add_argument("--keep", type=Path, help="write the .onnx files here instead of a temporary directory")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = [n for n in names if n not in zoo.MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(zoo.MODELS)}")

    import torch  # noqa: F401 - before quietening its loggers, which it configures on import

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # "torchvision is not installed" and the like
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as temporary:
        directory = args.keep or Path(temporary)
        directory.mkdir(parents=True, exist_ok=True)
        rows = []
        for name in names:
            rows.append(measure(name, directory, opset=args.opset, attention=args.attention, repeat=args.repeat,
                                cpu=args.cpu))
            print(f"{name}: done", file=sys.stderr, flush=True)
    print(f"opset {args.opset}, attention {args.attention or 'sdpa'}, torch FlopCounterMode on the meta device")
    print(render(rows, args.cpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
