"""flopcount: analytic FLOP counts of neural networks from their ONNX graphs, without weights.

>>> import flopcount
>>> report = flopcount.count("model.onnx", input_shapes={"input": (8, 3, 224, 224)})  # doctest: +SKIP
>>> report.per_sample.flops  # doctest: +SKIP

The counting core, one module each (the rooms and their arrows: docs/architecture.md):

* :mod:`.loading` read a model without its weights; :mod:`.validate` check its graph; :mod:`.graph` the node DAG
  and :func:`~flopcount.graph.walk_graphs`
* :mod:`.shapes` ONNX shape inference with data propagation, run once
* :mod:`.counting` :func:`count`: shapes, formulas, backward, the report; :mod:`.parameters` which tensors train
* :mod:`.registry` the one formula registry; :mod:`.context` what a formula reads; :mod:`.cost` the cost record
* :mod:`.conventions` counting conventions; :mod:`.report` the immutable report; :mod:`.render` its text forms
* :mod:`.errors` the exception hierarchy with exit codes; :mod:`.docs` generates docs/operators.md
* :mod:`.onnx_cases` ONNX's own test cases, for the inventory of operators
* :mod:`.generation` what ``generate()`` costs (prefill, decode steps); :mod:`.masks` executed attention's masks;
  :mod:`.moe` mixture-of-experts layers (params, active params, capacity)

Around it: :mod:`flopcount.operators` (formulas), :mod:`flopcount.frontends`, :mod:`flopcount.models`,
:mod:`flopcount.measure` (the measuring half), :mod:`flopcount.workloads` and :mod:`flopcount.cli`.
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
from .frontends.generate import from_causal_lm
from .frontends.hf import from_hf
from .frontends.keras import from_keras
from .frontends.torch import from_torch
from .measure.harness.meter import Meter
from .measure.harness.result import RunResult
from .generation import Generation
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
    "Generation",
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
    "from_causal_lm",
    "from_hf",
    "from_keras",
    "from_torch",
]
