"""flopcount: analytic FLOP counts of neural networks from their ONNX graphs, without weights.

>>> import flopcount
>>> report = flopcount.count("model.onnx", input_shapes={"input": (8, 3, 224, 224)})  # doctest: +SKIP
>>> report.per_sample.flops  # doctest: +SKIP
"""

from importlib.metadata import PackageNotFoundError, version as _version

from .conventions import CONVENTIONS, Convention
from .cost import Cost
from .counting import count
from .errors import (
    FlopcountError,
    FrontendError,
    InvalidGraphError,
    ModelFileError,
    OpsetError,
    ShapeError,
    UnsupportedOperatorError,
    UsageError,
)
from .frontends.keras import from_keras
from .frontends.torch import from_torch
from .measure.harness.meter import Meter
from .measure.harness.result import RunResult
from .report import ModelInfo, NodeCount, OpTypeSummary, Report

try:
    __version__ = _version("flopcount")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "CONVENTIONS",
    "Convention",
    "Cost",
    "FlopcountError",
    "FrontendError",
    "InvalidGraphError",
    "Meter",
    "ModelFileError",
    "ModelInfo",
    "NodeCount",
    "OpTypeSummary",
    "OpsetError",
    "Report",
    "RunResult",
    "ShapeError",
    "UnsupportedOperatorError",
    "UsageError",
    "count",
    "from_keras",
    "from_torch",
]
