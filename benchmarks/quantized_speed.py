"""Whole-process time of counting an int8 model against counting its float original.

Run from the repository root::

    python benchmarks/quantized_speed.py                    # QOperator (QLinearConv, com.microsoft QLinearAdd ...)
    python benchmarks/quantized_speed.py --format qdq       # QuantizeLinear/DequantizeLinear pairs around float ops
    python benchmarks/quantized_speed.py --format dynamic   # ConvInteger/MatMulInteger after DynamicQuantizeLinear
    python benchmarks/quantized_speed.py --repeat 7 --blocks 12

The float model is a residual CNN written with onnx.helper and numpy (``--blocks`` blocks of Conv, Relu, Conv, Add
and Relu on 64 channels, then global pooling and a classifier; no framework needed), quantized by
``onnxruntime.quantization`` in a temporary folder (static quantization calibrated on random inputs, or dynamic).
Each measurement runs ``flopcount.count`` of one file in a fresh interpreter, so its wall time includes every import
the count needs: onnxruntime's symbolic shape inference once pulled torch in through ``onnxruntime.tools``, 8-11 s for
an int8 model where its float original took 2 s. Float and int8 are measured alternately, after a warm-up of each;
the figures are medians, and the ratio is int8 over float. The target is at most 1.2. This is a benchmark that prints
figures, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

TARGET_RATIO = 1.2
CHANNELS, SIZE, CLASSES = 64, 32, 10

COUNT = "import sys, flopcount; flopcount.count(sys.argv[1])"
IMPORTS = ("import sys, flopcount; flopcount.count(sys.argv[1]); "
           "print(' '.join(m for m in ('torch', 'sympy', 'onnxruntime', 'onnxruntime.tools') if m in sys.modules))")


def make_float_model(blocks: int, seed: int = 0) -> onnx.ModelProto:
    """A residual CNN on [1, 3, SIZE, SIZE] images: a stem Conv, ``blocks`` residual blocks of two 3x3 Convs,
    global average pooling, a Gemm classifier."""
    rng = np.random.default_rng(seed)
    weights: list[TensorProto] = []

    def weight(name: str, *shape: int) -> str:
        weights.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.05).astype(np.float32), name))
        return name

    nodes = [helper.make_node("Conv", ["x", weight("stem_w", CHANNELS, 3, 3, 3), weight("stem_b", CHANNELS)], ["h0"],
                              pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["h0"], ["a0"])]  # fmt: skip
    for i in range(blocks):
        x, y = f"a{i}", f"a{i + 1}"
        nodes += [
            helper.make_node("Conv", [x, weight(f"w{i}a", CHANNELS, CHANNELS, 3, 3), weight(f"b{i}a", CHANNELS)],
                             [f"c{i}a"], pads=[1, 1, 1, 1]),
            helper.make_node("Relu", [f"c{i}a"], [f"r{i}"]),
            helper.make_node("Conv", [f"r{i}", weight(f"w{i}b", CHANNELS, CHANNELS, 3, 3), weight(f"b{i}b", CHANNELS)],
                             [f"c{i}b"], pads=[1, 1, 1, 1]),
            helper.make_node("Add", [f"c{i}b", x], [f"s{i}"]),
            helper.make_node("Relu", [f"s{i}"], [y]),
        ]  # fmt: skip
    nodes += [helper.make_node("GlobalAveragePool", [f"a{blocks}"], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"]),
              helper.make_node("Gemm", ["flat", weight("fc_w", CLASSES, CHANNELS), weight("fc_b", CLASSES)], ["logits"],
                               transB=1)]  # fmt: skip
    image = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, SIZE, SIZE])
    graph = helper.make_graph(nodes, "resnet", [image],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, CLASSES])], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="flopcount-benchmark")


def quantize(source: str, target: str, fmt: str) -> None:
    """``source`` quantized to int8 into ``target`` by onnxruntime's quantizer."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType
    from onnxruntime.quantization import quantize_dynamic, quantize_static

    if fmt == "dynamic":
        quantize_dynamic(source, target, weight_type=QuantType.QInt8)
        return

    class RandomImages(CalibrationDataReader):
        def __init__(self) -> None:
            rng = np.random.default_rng(1)
            self.batches = iter([{"x": rng.standard_normal((1, 3, SIZE, SIZE)).astype(np.float32)} for _ in range(4)])

        def get_next(self):
            return next(self.batches, None)

    quantize_static(source, target, RandomImages(),
                    quant_format=QuantFormat.QOperator if fmt == "qoperator" else QuantFormat.QDQ)  # fmt: skip


def measure(code: str, path: str) -> tuple[float, str]:
    """Wall seconds of a fresh interpreter running ``code`` on ``path``, and what it printed."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"counting {path} exited with {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return seconds, done.stdout.strip()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--format", choices=("qoperator", "qdq", "dynamic"), default="qoperator")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        paths = {"float": os.path.join(folder, "float.onnx"), "int8": os.path.join(folder, "int8.onnx")}
        onnx.save_model(make_float_model(args.blocks), paths["float"])
        quantize(paths["float"], paths["int8"], args.format)
        kinds = {name: sorted({(n.domain or "ai.onnx") + ":" + n.op_type for n in onnx.load(p).graph.node})
                 for name, p in paths.items()}  # fmt: skip
        for name, ops in kinds.items():
            print(f"{name:6s} {os.path.getsize(paths[name]) / 2**20:6.2f} MB  {', '.join(ops)}")
        for name, path in paths.items():  # warm-up, and what each count imported
            _, imported = measure(IMPORTS, path)
            print(f"{name:6s} imports {imported or 'none of torch, sympy, onnxruntime'}")
        runs: dict[str, list[float]] = {name: [] for name in paths}
        for _ in range(args.repeat):
            for name, path in paths.items():  # alternately, so that a busier moment weighs on both
                runs[name].append(measure(COUNT, path)[0])
        medians = {name: statistics.median(r) for name, r in runs.items()}
        for name, seconds in medians.items():
            each = ", ".join(f"{s:.2f}" for s in runs[name])
            print(f"{name:6s} {seconds:6.2f} s  (median of {args.repeat}; runs {each})")
        print(f"ratio  {medians['int8'] / medians['float']:6.2f} x  (int8 over float, {args.format}; target: at most "
              f"{TARGET_RATIO:g}x)")


if __name__ == "__main__":
    main()
