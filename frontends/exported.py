"""What the count of an exported module takes from the module, as a plain record (:class:`Exported`), and the count
made from it (:func:`count_exported`).

A count of a framework module is its weightless export counted under options that the module completes: the inputs
it trains, its trainable parameters by initializer name, and the parameters its traced forward never reads.
:func:`flopcount.frontends.torch.count_module` reads these from the module once; the record holds them as plain
values (JSON-able), so that a count served from the export cache (:mod:`flopcount.frontends.hf_cache`) is the same
count without the module, and without importing torch. Importing this module needs only onnx.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import onnx

if TYPE_CHECKING:
    from flopcount.options import CountOptions
    from flopcount.reporting.report import Report

__all__ = ["GIVEN", "Exported", "count_exported", "onnx_type"]

#: ``Exported.trainable`` where the caller's options name the trainable parameters (they stay as given).
GIVEN = "given"


@dataclasses.dataclass(frozen=True)
class Exported:
    """What a count of one export takes from its module.

    Attributes
    ----------
    key : str or None
        The export cache key of the export (:func:`flopcount.frontends.torch_cache.fingerprint`), None where no
        cache was used or the export has no sound key.
    signature : list
        The graph inputs' names, shapes and element types, as the cache entry records them.
    trainable_inputs : list of str or None
        The inputs counted as trained (``CountOptions.trainable_inputs`` of the count).
    trainable : list of str, None or :data:`GIVEN`
        The initializers that are the module's trainable parameters (None: the graph's structure decides); GIVEN
        where the options named them.
    unread : tuple of (name, elements, ONNX element type, shape)
        The trainable parameters the traced forward never reads.
    frozen : tuple of (name, elements)
        The module's parameters that take no gradient (``requires_grad`` off: Whisper's sinusoidal position
        embedding), by the name of the initializer that holds them.
    """

    key: str | None
    signature: list
    trainable_inputs: list[str] | None
    trainable: list[str] | None | str
    unread: tuple[tuple[str, int, int, tuple[int, ...]], ...] = ()
    frozen: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> Exported:
        """The record :meth:`as_dict` wrote (TypeError or ValueError where ``document`` is not one)."""
        names = lambda v: None if v is None else [str(n) for n in v]  # noqa: E731
        trainable = document["trainable"]
        return cls(
            key=document["key"] if document["key"] is None else str(document["key"]),
            signature=list(document["signature"]),
            trainable_inputs=names(document["trainable_inputs"]),
            trainable=trainable if trainable == GIVEN else names(trainable),
            unread=tuple((str(n), int(k), int(t), tuple(int(d) for d in dims))
                         for n, k, t, dims in document["unread"]),
            frozen=tuple((str(n), int(k)) for n, k in document["frozen"]),
        )


def count_exported(model: onnx.ModelProto, exported: Exported, options: CountOptions) -> Report:
    """``model`` (the export ``exported`` describes) counted under ``options`` completed by the record."""
    from flopcount.counting import count_options

    options = dataclasses.replace(options, trainable_inputs=exported.trainable_inputs)
    if exported.trainable != GIVEN:
        options = dataclasses.replace(options, trainable=exported.trainable)
    return _with_untrained(count_options(model, options), exported.unread, _frozen(model, exported.frozen))


def _frozen(model: onnx.ModelProto, frozen: tuple[tuple[str, int], ...]) -> tuple[tuple, ...]:
    """Each frozen parameter's initializer as (name, elements, ONNX element type, shape, whether the count holds it
    as a buffer): the graph's rule calls it a parameter, which the count, told the trained ones, makes a buffer
    (Whisper's position table, added to activations); else the rule called it a constant, counted nowhere."""
    if not frozen:
        return ()
    from flopcount.pipeline.parameters import PARAMETER, classify
    from flopcount.registry import canonical_domain

    roles = classify(model, {canonical_domain(o.domain): o.version for o in model.opset_import}).roles
    stored = {t.name: t for t in model.graph.initializer}
    return tuple((name, n, stored[name].data_type, tuple(stored[name].dims), roles.get(name) == PARAMETER)
                 for name, n in frozen)


def _with_untrained(report: Report, unread: tuple[tuple[str, int, int, tuple[int, ...]], ...],
                    frozen: tuple[tuple, ...]) -> Report:
    """``report`` with the module's parameters that get no gradient counted in its parameters (not in the trained
    ones) and named in its notes: those the traced forward never reads added, and the frozen ones the graph holds
    (:func:`_frozen`) moved from the buffers where the count holds them there; its memory ledger holds them as
    parameters too (:func:`flopcount.memory.ledger.with_params`), as torch's ``parameters()`` (and MemTracker) has
    them."""
    if not unread and not frozen:
        return report
    from flopcount.context import TensorInfo

    listed = lambda items: ", ".join(f"{item[0]} ({item[1]:,})" for item in items)  # noqa: E731
    notes = ((f"parameters the traced forward never reads, counted in the parameters without gradients: "
              f"{listed(unread)}",) if unread else ()) + \
        ((f"frozen parameters (no gradient), counted in the parameters, not the buffers: {listed(frozen)}",)
         if frozen else ())
    report = dataclasses.replace(report, params=report.params + sum(item[1] for item in (*unread, *frozen)),
                                 buffers=report.buffers - sum(item[1] for item in frozen if item[4]),
                                 notes=(*report.notes, *notes))
    if report.memory is None:
        return report
    from flopcount.memory.ledger import with_params

    held = [TensorInfo(item[0], item[2], item[3]) for item in (*unread, *frozen)]
    return dataclasses.replace(report, memory=with_params(report.memory, held))


def onnx_type(dtype) -> int:
    """The ONNX element type of a torch dtype (``torch.float32`` → FLOAT), 0 when ONNX has no such name."""
    name = str(dtype).rsplit(".", 1)[-1]
    return int(getattr(onnx.TensorProto, {"float32": "FLOAT", "float64": "DOUBLE"}.get(name, name.upper()), 0))
