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
    ConfigError,
    FlopcountError,
    FrontendError,
    InvalidGraphError,
    ModelFileError,
    OpsetError,
    ShapeError,
    UnsupportedOperatorError,
    UsageError,
)
from .frontends.hf import from_hf
from .frontends.keras import from_keras
from .frontends.torch import from_torch
from .measure.meter import Meter
from .measure.result import RunResult
from .report import ModelInfo, NodeCount, OpTypeSummary, Report

try:
    __version__ = _version("flopcount")
except PackageNotFoundError:  # running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "CONVENTIONS",
    "ConfigError",
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
    "from_hf",
    "from_keras",
    "from_torch",
]
