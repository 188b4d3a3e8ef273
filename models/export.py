"""The command line that exports a reference model of :mod:`flopcount.models.zoo` to a weightless ONNX file::

    python -m flopcount.models.export resnet50 -o examples/resnet50-v1.5.onnx
    python models/export.py resnet50 -o examples/resnet50-v1.5.onnx

It builds the model the zoo names and hands it over to the exporter, which lives with the frontends that use it:
:func:`flopcount.frontends.export.export_weightless` (a weightless file keeps the graph and its shapes, no weights).
The second form needs flopcount installed (the exporter) but not run as a package.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flopcount.frontends.export import (
    DEFAULT_OPSET,
    EXPORTERS,
    ExportError,
    export_weightless,
)

__all__ = ["main"]

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------------------------


def _zoo() -> Any:
    try:
        from . import zoo
    except ImportError:  # run as a script (python models/export.py): the sibling is on sys.path[0]
        import zoo  # type: ignore[no-redef]
    return zoo


def _parser() -> argparse.ArgumentParser:
    models = _zoo().MODELS
    parser = argparse.ArgumentParser(
        prog="python -m flopcount.models.export",
        description="Export a reference model to a weightless ONNX file (graph and shapes, no weights).",
        epilog="models: " + "; ".join(f"{name}: {spec.summary}" for name, spec in models.items()),
    )
    parser.add_argument("model", choices=list(models), help="which model to export")
    parser.add_argument("-o", "--output", required=True, type=Path, help="path of the .onnx file to write")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default %(default)s)")
    parser.add_argument("--image-size", type=int, help="input height and width (image models; default 224)")
    parser.add_argument("--batch-size", type=int, help="input batch size (default 1; lstm: 4)")
    parser.add_argument("--num-classes", type=int, help="classifier outputs (image models; default 1000)")
    parser.add_argument("--seq-len", type=int, help="sequence length (bert-base 128, gpt2-small 1024, lstm 35)")
    parser.add_argument("--layers", type=int, help="number of layers (transformers 12, lstm 2)")
    parser.add_argument(
        "--attention", choices=["sdpa", "matmul"],
        help="transformers: F.scaled_dot_product_attention (default) or explicit matmul + softmax",
    )
    parser.add_argument(
        "--exporter", choices=["auto", *EXPORTERS], default="auto", help="torch exporter (default %(default)s)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s: %(message)s")
    try:
        import torch
    except ImportError:
        logger.error("exporting needs torch: pip install 'flopcount[torch]'")
        return 2

    zoo = _zoo()
    options = zoo.Options(
        batch_size=args.batch_size, image_size=args.image_size, num_classes=args.num_classes,
        seq_len=args.seq_len, layers=args.layers, attention=args.attention,
    )
    torch.manual_seed(0)  # weights are random; seeding keeps the small inline tensors, hence the file, stable
    try:
        built = zoo.build(args.model, options)
    except ValueError as error:
        parser.error(str(error))
    try:
        model = export_weightless(
            built.module, built.inputs, args.output, input_names=built.input_names,
            output_names=built.output_names, opset=args.opset, exporter=args.exporter,
        )
    except ExportError as error:
        logger.error("%s", error)
        return 1
    print(f"wrote {args.output} ({args.output.stat().st_size} bytes, {len(model.graph.node)} nodes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
