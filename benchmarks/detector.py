"""The extreme-weather Faster R-CNN at full size, against the 691 GFLOPs per training image of HPC AI500 V2.0.

Run from the repository root::

    python benchmarks/detector.py                  # 16x768x1152, 512 training RoIs, 300 at inference
    python benchmarks/detector.py --quick          # the main training graph only (no 2-FC and inference exports)
    python benchmarks/detector.py --height 384 --width 576 --rois 128

For :func:`flopcount.models.detector.faster_rcnn_r50` (ResNet-50 C4 backbone, RPN, TopK proposals, GridSample
RoI pooling, res5 head; design in that module's docstring) this prints:

* the time to export the training graph with ``flopcount.from_torch``'s exporter (one run, export cache off: the
  TorchScript exporter runs the model's forward pass on the CPU, which dominates) and to count it (median of
  ``--repeat`` runs after one warm-up);
* forward, backward and total GFLOPs per image, split by part (backbone, RPN, proposal selection, RoI pooling,
  RoI head), beside the 691 GFLOPs that HPC AI500 V2.0 measured with NVProf;
* a reconciliation: the training cost of one RoI, the RoI count at which the count would equal 691, the 2-FC head
  (exported and counted), a frozen stem and res2 as tf-faster-rcnn trains them, the share of 3x3 convolutions that
  cuDNN may run as Winograd, and the work outside the graph (optimizer, NMS) counted by flopcount as well;
* the inference graph (``eval()``, 300 RoIs, exported with the TorchScript exporter so that node names carry the
  module scopes).

This prints figures; nothing asserts (``tests/models/test_detector.py`` checks the closed forms).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence

import onnx
from flopcount.frontends.torch import to_onnx
from onnx import TensorProto, helper
from tabulate import tabulate

import flopcount

HPC_AI500_GFLOPS = 691.0  # per training image, HPC AI500 V2.0, NVProf on GPUs
G = 1e9
IN_CHANNELS = 16
# tf-faster-rcnn's proposal layer in training: top 12000 anchors by score, NMS at IoU 0.7, keep 2000
PRE_NMS, POST_NMS = 12000, 2000


def _models():
    from flopcount.models import detector

    return detector


def export_and_count(head: str, rois: int, test_rois: int, size: tuple[int, int], training: bool, repeat: int):
    """Export once (timed), count ``repeat`` times after a warm-up (median); return (report, export s, count s)."""
    import torch

    torch.manual_seed(0)
    model = _models().faster_rcnn_r50(head=head, train_rois=rois, test_rois=test_rois)
    start = time.perf_counter()
    if training:
        graph = to_onnx(model, (1, IN_CHANNELS, *size), training=True, cache_dir=False)
    else:
        graph = _torchscript_eval(model, torch.zeros(1, IN_CHANNELS, *size))
    export_s = time.perf_counter() - start
    mode = "train" if training else "inference"
    report = flopcount.count(graph, mode=mode)  # warm-up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        report = flopcount.count(graph, mode=mode)
        times.append(time.perf_counter() - start)
    return graph, report, export_s, statistics.median(times)


def _torchscript_eval(model, images):
    """Inference export with the TorchScript exporter, whose node names carry the module scopes that
    :func:`~flopcount.models.detector.part_of` reads (``from_torch`` exports inference graphs with torch.export,
    whose node names do not)."""
    import io
    import warnings

    import torch

    buffer = io.BytesIO()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation notice and the tracer's constant warnings
        torch.onnx.export(model.eval(), (images,), buffer, input_names=["images"], opset_version=18, dynamo=False,
                          do_constant_folding=False, training=torch.onnx.TrainingMode.EVAL)
    return onnx.load_from_string(buffer.getvalue())


def by_part(report) -> dict[str, list[int]]:
    """Forward and backward FLOPs per part, in the order of ``PARTS`` (nodes outside them under "other")."""
    detector = _models()
    parts = {part: [0, 0] for part in (*detector.PARTS, "other")}
    for node in report.nodes:
        entry = parts[detector.part_of(node.name)]
        entry[0] += node.cost.flops
        entry[1] += node.backward.flops
    return parts


def _g(flops: float) -> str:
    return f"{flops / G:,.2f}"


def part_table(parts: dict[str, list[int]], batch: int) -> str:
    total = sum(f + b for f, b in parts.values())
    rows = [
        [name, _g(f / batch), _g(b / batch), _g((f + b) / batch), f"{100 * (f + b) / total:.1f} %"]
        for name, (f, b) in parts.items()
        if f or b
    ]
    rows.append(["total", _g(sum(f for f, _ in parts.values()) / batch), _g(sum(b for _, b in parts.values()) / batch),
                 _g(total / batch), "100 %"])
    return tabulate(rows, headers=["part", "forward GF", "backward GF", "total GF", "share"], stralign="right")


def nms_bound() -> int:
    """flopcount's NonMaxSuppression bound for tf-faster-rcnn's training proposal layer (one image, one class)."""
    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out"], ["selected"])
    graph = helper.make_graph(
        [node], "nms",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [1, PRE_NMS, 4]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, 1, PRE_NMS])],
        [helper.make_tensor_value_info("selected", TensorProto.INT64, None)],
        [helper.make_tensor("max_out", TensorProto.INT64, [1], [POST_NMS])],
    )
    return flopcount.count(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])).total.flops


def winograd_candidates(report, graph: onnx.ModelProto) -> int:
    """Forward and backward FLOPs of the 3x3 stride-1 convolutions, the ones cuDNN may run as Winograd."""
    strides = {
        node.name: list(helper.get_attribute_value(a))
        for node in graph.graph.node if node.op_type == "Conv" for a in node.attribute if a.name == "strides"
    }
    total = 0
    for node in report.nodes:
        if (node.op_type == "Conv" and tuple(node.inputs[1].shape[2:]) == (3, 3)
                and strides.get(node.name, [1, 1]) == [1, 1]):
            total += node.cost.flops + node.backward.flops
    return total


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--height", type=int, default=768, help="image height (default %(default)s)")
    parser.add_argument("--width", type=int, default=1152, help="image width (default %(default)s)")
    parser.add_argument("--rois", type=int, default=512, help="RoIs per training image (default %(default)s)")
    parser.add_argument("--test-rois", type=int, default=300, help="RoIs per image at inference (default %(default)s)")
    parser.add_argument(
        "--repeat", type=int, default=5, help="timed count runs after one warm-up (default %(default)s)"
    )
    parser.add_argument("--quick", action="store_true", help="only the main training graph")
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print("this benchmark needs torch: pip install 'flopcount[torch]'", file=sys.stderr)
        return 2
    size, rois = (args.height, args.width), args.rois
    print(f"Faster R-CNN R50-C4, {IN_CHANNELS}x{size[0]}x{size[1]}, {rois} RoIs per image, training graph, batch 1",
          flush=True)

    graph, report, export_s, count_s = export_and_count("c4", rois, args.test_rois, size, True, args.repeat)
    parts = by_part(report)
    print(f"export {export_s:.1f} s (TorchScript exporter, one run, cache off), count {count_s:.2f} s "
          f"(median of {args.repeat}); {len(graph.graph.node)} nodes, {report.trainable_params:,} trainable "
          f"parameters; unsupported: {dict(report.unsupported) or 'none'}; no backward formula: "
          f"{dict(report.backward_unsupported) or 'none'}\n")
    print(part_table(parts, report.batch), "\n")

    per_image = report.per_sample.flops
    dense = flopcount.count(graph, mode="train", convention="dense").per_sample.flops
    forward = report.forward.flops / report.batch
    print(f"per training image: forward {_g(forward)} + backward {_g(report.backward.flops / report.batch)} = "
          f"{_g(per_image)} GFLOPs ({per_image / forward:.2f} x forward); products only (dense) {_g(dense)}")
    print(f"HPC AI500 V2.0 (NVProf): {HPC_AI500_GFLOPS:.0f} GFLOPs -> flopcount / measured = "
          f"{per_image / (HPC_AI500_GFLOPS * G):.2f}\n")

    # --- reconciliation -------------------------------------------------------------------------------------
    per_roi = (sum(parts["head"]) + sum(parts["roi_pool"])) / rois
    fixed = per_image - per_roi * rois  # backbone, RPN, proposal selection
    rows = [
        ["backbone + RPN + proposals (independent of R)", _g(fixed), "counted"],
        ["one RoI through pooling + res5 head (training)", _g(per_roi), "counted / R"],
        [f"C4 head, R = {rois}", _g(per_image), "counted"],
    ]
    for r in (256, 128, 64):
        if r < rois:
            rows.append([f"C4 head, R = {r}", _g(fixed + per_roi * r), "fixed + R x per-RoI"])
    rows.append(["R at which the count equals 691", f"{(HPC_AI500_GFLOPS * G - fixed) / per_roi:.0f} RoIs", ""])
    stem_res2 = sum(
        n.backward.flops for n in report.nodes
        if n.name.startswith(("/backbone/conv1/", "/backbone/bn1/", "/backbone/relu/", "/backbone/maxpool/",
                              "/backbone/layer1/"))
    )
    rows.append(["what-if: frozen stem + res2 (tf-faster-rcnn FIXED_BLOCKS=1)", f"-{_g(stem_res2)}", "their backward"])
    winograd = winograd_candidates(report, graph)
    rows.append(["what-if: 3x3 stride-1 convs as Winograd F(2x2,3x3) (1/2.25 of the products)", _g(winograd),
                 f"-{_g(winograd * (1 - 1 / 2.25))} if all ran so"])
    optimizer = flopcount.count(graph, mode="train", optimizer="momentum").optimizer[1].flops
    rows.append(["outside: momentum SGD update, per step (4 per parameter)", f"+{_g(optimizer)}", "outside the graph"])
    rows.append([f"outside: NMS {PRE_NMS} -> {POST_NMS} at IoU 0.7 (flopcount bound)", f"+{_g(nms_bound())}",
                 "outside the graph"])
    if not args.quick:
        _, two_fc, fc_export_s, _ = export_and_count("2fc", rois, args.test_rois, size, True, 1)
        fc_parts = by_part(two_fc)
        rows.append([f"2-FC head (1024, 1024), R = {rois}", _g(two_fc.per_sample.flops),
                     f"counted (head {_g(sum(fc_parts['head']))}; export {fc_export_s:.0f} s)"])
    print(tabulate(rows, headers=["reconciliation, per training image", "GFLOPs", "how"], stralign="left"))
    print("NVProf's flop_count_sp counts FP32 add/mul/FMA instructions: not tensor-core (mixed-precision) products, "
          "not special functions; cuDNN's algorithm choice (Winograd, FFT, implicit GEMM with padding) changes it.\n")

    if not args.quick:
        graph, inference, export_s, count_s = export_and_count(
            "c4", rois, args.test_rois, size, False, args.repeat
        )
        print(f"inference graph, {args.test_rois} RoIs: export {export_s:.1f} s, count {count_s:.2f} s, "
              f"unsupported: {dict(inference.unsupported) or 'none'}")
        print(part_table({k: [f, 0] for k, (f, _) in by_part(inference).items()}, inference.batch))
    return 0


if __name__ == "__main__":
    sys.exit(main())
