"""flopcount: analytic FLOP counts of neural networks from their ONNX graphs, without weights.

>>> import flopcount
>>> report = flopcount.count("model.onnx", input_shapes={"input": (8, 3, 224, 224)})  # doctest: +SKIP
>>> report.per_sample.flops  # doctest: +SKIP

At the top, the formula contract and the orchestrator, one module a line (the rooms and their arrows:
docs/architecture.md):

* :mod:`.counting` :func:`count`: shapes, formulas, backward, the report
* :mod:`.options` :class:`~flopcount.options.CountOptions`, every setting of a count in one frozen record, checked
  when made
* :mod:`.calls` the checks of the Python API's arguments (a :class:`~flopcount.errors.UsageError` naming the argument)
* :mod:`.plans` the ledgers per rank of a parallel plan: the public entry points, their arguments checked
* :mod:`.registry` the one formula registry
* :mod:`.context` what a formula reads: a node's tensors and attributes
* :mod:`.cost` the frozen cost record
* :mod:`.saved` what an operator's backward keeps: the record a saved-for-backward rule returns
* :mod:`.conventions` counting conventions
* :mod:`.masks` executed attention's masks, which attention formulas consult
* :mod:`.errors` the exception hierarchy with exit codes, and :func:`~flopcount.errors.first_line`
* :mod:`.limits` the limits every stage shares (``MAX_ELEMENTS``: the most elements a tensor may have)
* :mod:`.version` the installed version (``__version__``)

The rooms, each a package whose ``__init__`` lists its modules, in the order their arrows run (each imports only
rooms above it in this list, and the contract):

* :mod:`.pipeline` the ONNX pipeline: loading, graph, validate, shapes, graph_masks, parameters, schema, progress
* :mod:`.reporting` the records a count hands back: report, modules, generation, moe, layers, tiled
* :mod:`.parallel` FLOPs per rank under a plan: plan, ranks, experts
* :mod:`.memory` memory from the graph: ledger, layers, ranks
* :mod:`.derived` counts made from other counts: extension (L layers from 1 and 2), symbolic (``--symbolic``)
* :mod:`.output` a report written out: render, html, files, docs

Every public name below is imported on first use (``import flopcount`` loads neither torch nor the measuring half).

Around it: :mod:`flopcount.operators` (formulas), :mod:`flopcount.frontends`, :mod:`flopcount.models`,
:mod:`flopcount.measure` (the measuring half), :mod:`flopcount.workloads` and :mod:`flopcount.cli`.
"""

def _checkout_subpackages() -> None:
    """In a checkout, three of the package's subpackages stand beside this folder (``operators/``, ``frontends/``,
    ``models/``: pyproject's package-dir maps them in); installed, they stand inside it. Where this folder is the
    checkout's, a finder placed first answers for exactly those three from the checkout, so ``import flopcount``
    from the checkout's root (which Python finds before an installed copy) is the whole package, whatever was
    installed and how, and never half of it from another copy."""
    import os
    import sys
    from importlib.machinery import PathFinder

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if os.path.isdir(os.path.join(here, "operators")) or not os.path.isfile(os.path.join(root, "operators", "__init__.py")):
        return
    names = {f"{__name__}.{sub}" for sub in ("operators", "frontends", "models")}

    class CheckoutFinder:
        @staticmethod
        def find_spec(fullname, path=None, target=None):
            return PathFinder.find_spec(fullname, [root]) if fullname in names else None

    sys.meta_path.insert(0, CheckoutFinder)


_checkout_subpackages()

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
    "parallel_ledger": "flopcount.plans",
    "memory_per_rank": "flopcount.plans",
    "generation_ledger": "flopcount.plans",
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
    "Generation": "flopcount.reporting.generation",
    "Memory": "flopcount.memory.ledger",
    "MemorySettings": "flopcount.memory.ledger",
    "ParallelPlan": "flopcount.parallel.plan",
    "Recompute": "flopcount.parallel.plan",
    "ModelInfo": "flopcount.reporting.report",
    "NodeCount": "flopcount.reporting.report",
    "OpTypeSummary": "flopcount.reporting.report",
    "Report": "flopcount.reporting.report",
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
    "generation_ledger",
    "memory_per_rank",
    "parallel_ledger",
]
