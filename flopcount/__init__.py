"""flopcount: analytic FLOP counts of neural networks from their ONNX graphs, without weights.

>>> import flopcount
>>> report = flopcount.count("model.onnx", input_shapes={"input": (8, 3, 224, 224)})  # doctest: +SKIP
>>> report.per_sample.flops  # doctest: +SKIP

The counting core, one module a line, in the order a count runs through them (the rooms and their arrows:
docs/architecture.md):

* :mod:`.loading` reads a model without its weights (:func:`~flopcount.loading.load_with_weights` with them)
* :mod:`.graph` the node DAG and its frozen :class:`~flopcount.graph.GraphIndex`; :func:`~flopcount.graph.walk_graphs`
* :mod:`.validate` checks the graph and the resolved shapes
* :mod:`.shapes` ONNX shape inference with data propagation, run once
* :mod:`.schema` the operator-schema queries (differentiable inputs) that several stages share
* :mod:`.parameters` which stored tensors are parameters, buffers or constants
* :mod:`.counting` :func:`count`: shapes, formulas, backward, the report
* :mod:`.modules` the module scopes an exporter wrote, and the per-module rows of a report
* :mod:`.registry` the one formula registry
* :mod:`.context` what a formula reads: a node's tensors and attributes
* :mod:`.cost` the frozen cost record
* :mod:`.conventions` counting conventions
* :mod:`.report` the immutable report
* :mod:`.render` its text forms (table, JSON, CSV)
* :mod:`.html` the report as one self-contained HTML page
* :mod:`.symbolic` the count as exact formulas in dims given as names (``--symbolic``)
* :mod:`.errors` the exception hierarchy with exit codes, and :func:`~flopcount.errors.first_line`
* :mod:`.docs` generates docs/operators.md
* :mod:`.onnx_cases` ONNX's own test cases, for the inventory of operators
* :mod:`.generation` what ``generate()`` costs (prefill, decode steps); :mod:`.masks` executed attention's masks;
  :mod:`.moe` mixture-of-experts layers (params, active params, capacity)
* :mod:`.layers` how a stack of identical layers was counted; :mod:`.extension` a count of L layers from counts of
  1 and 2 (``--hf``)
* :mod:`.graph_masks` the attention masks a graph computes from positions, evaluated for ``--attention executed``
* :mod:`.saved` what an operator's backward keeps; :mod:`.memory` the memory ledger of a step (``--memory``);
  :mod:`.plan` the parallel plan and recompute policy

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
from .memory import Memory, MemorySettings
from .plan import ParallelPlan, Recompute
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
    "Memory",
    "MemorySettings",
    "Meter",
    "ModelFileError",
    "ModelInfo",
    "NodeCount",
    "OpTypeSummary",
    "OpsetError",
    "ParallelPlan",
    "Recompute",
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
