"""flopcount: analytic FLOP counts of neural networks from their ONNX graphs, without weights.

>>> import flopcount
>>> report = flopcount.count("model.onnx", input_shapes={"input": (8, 3, 224, 224)})  # doctest: +SKIP
>>> report.per_sample.flops  # doctest: +SKIP

The counting core, one module a line, in the order a count runs through them (the rooms and their arrows:
docs/architecture.md):

* :mod:`.loading` reads a model without its weights (:func:`~flopcount.loading.load_with_weights` with them)
* :mod:`.graph` the node DAG and its frozen :class:`~flopcount.graph.GraphIndex`; :func:`~flopcount.graph.walk_graphs`
* :mod:`.validate` checks the graph and the resolved shapes
* :mod:`.shapes` shape resolution (a package: overrides, guarded inference, the numpy interpreter, bodies)
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
* :mod:`.progress` the phases of long work, reported on a logger while they run
* :mod:`.version` the installed version (``__version__``)
* :mod:`.files` the one writer of every file flopcount writes (temporary file, fsync, rename)
* :mod:`.options` :class:`~flopcount.options.CountOptions`, every setting of a count in one frozen record, checked
  when made
* :mod:`.calls` the checks of the Python API's arguments (a :class:`~flopcount.errors.UsageError` naming the argument)
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
* :mod:`.parallel` FLOPs, redundant work, communication bytes and the bubble per rank under a plan (``--parallel``);
  :mod:`.parallel_experts` its context- and expert-parallel rules (zigzag CP, EP over dp·cp, ``--expert-load``)
* :mod:`.memory_extension` the memory ledger of L identical layers, walked on the 2-layer graph with its second
  layer copied (``--memory`` with ``--hf``)
* :mod:`.memory_parallel` the memory ledger per rank under a parallel plan (``--memory --parallel``)
* :mod:`.tiled` a sequence of repeated items held once, its copies made when read (the nodes of L repeated layers)

Every public name below is imported on first use (``import flopcount`` loads neither torch nor the measuring half).

Around it: :mod:`flopcount.operators` (formulas), :mod:`flopcount.frontends`, :mod:`flopcount.models`,
:mod:`flopcount.measure` (the measuring half), :mod:`flopcount.workloads` and :mod:`flopcount.cli`.
"""

#: Public name → the module that defines it. Each is imported on first use (PEP 562), so ``import flopcount``
#: stays light: neither torch nor the measuring half (:mod:`flopcount.measure`) nor the counting core, nor even
#: the package metadata behind ``__version__``, is loaded until a name that needs it is read.
_LAZY = {
    "__version__": "flopcount.version",
    "CONVENTIONS": "flopcount.conventions",
    "Convention": "flopcount.conventions",
    "Cost": "flopcount.cost",
    "count": "flopcount.counting",
    "count_options": "flopcount.counting",
    "CountOptions": "flopcount.options",
    "ModelSource": "flopcount.frontends.source",
    "ConfigError": "flopcount.errors",
    "FlopcountError": "flopcount.errors",
    "FrontendError": "flopcount.errors",
    "InvalidGraphError": "flopcount.errors",
    "ModelFileError": "flopcount.errors",
    "OpsetError": "flopcount.errors",
    "ShapeError": "flopcount.errors",
    "UnsupportedOperatorError": "flopcount.errors",
    "UsageError": "flopcount.errors",
    "from_causal_lm": "flopcount.frontends.generate",
    "from_hf": "flopcount.frontends.hf",
    "from_keras": "flopcount.frontends.keras",
    "from_torch": "flopcount.frontends.torch",
    "Meter": "flopcount.measure.harness.meter",
    "RunResult": "flopcount.measure.harness.result",
    "Generation": "flopcount.generation",
    "Memory": "flopcount.memory",
    "MemorySettings": "flopcount.memory",
    "ParallelPlan": "flopcount.plan",
    "Recompute": "flopcount.plan",
    "ModelInfo": "flopcount.report",
    "NodeCount": "flopcount.report",
    "OpTypeSummary": "flopcount.report",
    "Report": "flopcount.report",
}


def __getattr__(name: str):
    """Import the module behind a public name on first use and keep the name here (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flopcount' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "__version__",
    "CONVENTIONS",
    "ConfigError",
    "Convention",
    "Cost",
    "CountOptions",
    "FlopcountError",
    "FrontendError",
    "Generation",
    "InvalidGraphError",
    "Memory",
    "MemorySettings",
    "Meter",
    "ModelFileError",
    "ModelInfo",
    "ModelSource",
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
    "count_options",
    "from_causal_lm",
    "from_hf",
    "from_keras",
    "from_torch",
]
