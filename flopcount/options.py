"""The settings of a count in one frozen record, :class:`CountOptions` (the model they apply to:
:class:`flopcount.frontends.source.ModelSource`).

A record checks itself when it is made (a :class:`~flopcount.errors.UsageError` naming the argument, before any
work); :func:`flopcount.count` builds one from its keywords, the command line builds one from its flags
(``options_from_args`` in :mod:`flopcount.cli.arguments`), and a frontend adjusts one with
:func:`dataclasses.replace`. A new setting is a field here (with ``metadata["flag"]`` the command line declares
and reads it) and the code that reads it.

>>> CountOptions(batch=8, mode="train", optimizer="adam").optimizer
'adam'
>>> CountOptions(mode="training")
Traceback (most recent call last):
...
flopcount.errors.UsageError: unknown mode 'training'; choose one of: inference, train
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Collection, Sequence

from .calls import MAX_ELEMENTS, check_count_arguments
from .errors import UsageError

__all__ = ["MODES", "OPTIMIZERS", "CountOptions"]

MODES = ("inference", "train")
# FLOPs per trainable parameter of one update step; sqrt counted as one FLOP and one transcendental.
OPTIMIZERS: Mapping[str, tuple[int, int, str]] = MappingProxyType({
    "sgd": (2, 0, "w -= lr*g"),
    "momentum": (4, 0, "v = mu*v + g; w -= lr*v"),
    "adam": (14, 1, "m = b1*m + (1-b1)*g (3); v = b2*v + (1-b2)*g*g (4); bias corrections (2); "
                    "w -= lr*m_hat/(sqrt(v_hat)+eps) (5, one sqrt)"),
    "adamw": (16, 1, "Adam's 14 (one sqrt) and the decoupled weight decay w -= lr*wd*w (2)"),
})  # fmt: skip


def _flag(flag: str, help: str, **argparse_keywords: Any) -> dict:
    """The ``metadata`` of a field that the command line declares as ``flag`` and reads back by the field's name."""
    return {"flag": flag, "help": help, **argparse_keywords}


@dataclasses.dataclass(frozen=True)
class CountOptions:
    """Every setting of a count. Each is checked when the record is made.

    Attributes
    ----------
    input_shapes : mapping of input name to dims, optional
        Fixes dynamic (or overrides static) input dims, e.g. ``{"input": (8, 3, 224, 224)}``.
    batch : int, optional
        Sets dim 0 of every input not named in ``input_shapes``; also the divisor of ``per_sample``.
        Without it, the batch is dim 0 of the first input.
    convention : ``"default"``, ``"table3"``, ... or a :class:`~flopcount.conventions.Convention`
        See :mod:`flopcount.conventions`.
    strict : bool
        Raise :class:`~flopcount.errors.UnsupportedOperatorError` when any operator has no formula.
    input_values : mapping of input name to array, optional
        Values of small inputs that shapes depend on (reduction axes, Resize sizes), e.g.
        ``{"axes": [1, 2]}``; such inputs are treated as constants.
    loop_trips : mapping of node name to int, optional
        Trip counts of ``Loop`` nodes whose count is not a constant (and sequence lengths of
        ``SequenceMap`` nodes), e.g. ``{"generate_loop": 32}``.
    mode : ``"inference"`` or ``"train"``
        ``"train"`` adds the backward pass: per node, the gradients of the inputs that need one
        (inputs that depend on a trainable parameter, and the parameters themselves). The
        parameters are trained (see ``trainable``); buffers and constants are not.
    optimizer : ``"sgd"``, ``"momentum"``, ``"adam"`` or ``"adamw"``, optional
        With ``mode="train"``: also the optimizer update per step from the trainable parameter
        count, reported apart from the forward and backward totals.
    trainable_inputs : sequence of str, optional
        With ``mode="train"``: floating-point graph inputs that are trained like parameters rather than fed
        as data (an embedding or soft prompt passed in): their gradients are counted, and they count among the
        trainable parameters that the optimizer updates.
    trainable : collection of str, optional
        Names of the initializers (or ``Constant`` outputs) that are the framework's trainable
        parameters, e.g. from ``module.named_parameters()``. They are the parameters, and the only
        tensors trained; other weights are reported as buffers. ``None`` (the default): decided
        from the graph's structure (see :mod:`flopcount.pipeline.parameters`): tensors used as weights are parameters,
        BatchNormalization's running statistics are buffers, and folded constants (exponents, epsilons, rotary
        tables, masks) are neither. Entries may be shell-style patterns: ``["decoder.*", "*.bias"]``.
    frozen : collection of str, optional
        Names or shell-style patterns of parameters that are not trained (a frozen backbone in
        fine-tuning): no weight gradient, no optimizer update, and no input gradient through
        layers before the first trained one. Reported as buffers. Applied after ``trainable``.
    attention : ``"full"``, ``"executed"``, or an :class:`~flopcount.masks.AttentionMask` (or one per attention)
        ``"full"`` counts the whole score matrix, as the graph computes it. ``"executed"`` counts only the
        (query, key) pairs a masked kernel runs, for the masks whose structure the graph shows (the Attention
        operator's ``is_causal`` and windows; a mask built from position ranges, comparisons, a Trilu and the
        ``input_values`` given, see :mod:`flopcount.pipeline.graph_masks`); a mask that is data counts full, and
        ``report.attention`` says which. A mask given (a frontend reads it from the model's configuration) is
        executed-mode with that structure for the eager attentions, in graph order (see :mod:`flopcount.masks`).
    memory : bool or :class:`~flopcount.memory.ledger.MemorySettings`, optional
        Also the memory ledger (``report.memory``): weights, gradients, optimizer states and their step's
        temporaries, the activations the backward keeps and the peak of one step (see :mod:`flopcount.memory.ledger`).
        ``True``: the default settings.
    free_ops : collection of str
        Operator types the user knows cost nothing (a custom marker or debug op), as ``OP`` or ``DOMAIN:OP``
        (``"com.example:Marker"``): where no formula is registered for them they are counted as zero-cost
        instead of unsupported, so ``strict`` passes. An operator that has a formula keeps it.
    """

    input_shapes: Mapping[str, Sequence[int]] | None = None
    batch: int | None = None
    convention: Any = "default"
    strict: bool = False
    input_values: Mapping[str, Any] | None = None
    loop_trips: Mapping[str, int] | None = None
    mode: str = "inference"
    optimizer: str | None = None
    trainable_inputs: Sequence[str] | None = None
    trainable: Collection[str] | None = None
    frozen: Collection[str] | None = None
    attention: Any = "full"
    memory: Any = None
    free_ops: Collection[str] = dataclasses.field(default=(), metadata=_flag(
        "--free-op", "an operator type with no formula that costs nothing (a custom marker op), OP or DOMAIN:OP: "
        "counted as zero-cost, not unsupported (--strict then passes); repeatable", metavar="OP", action="append"))

    def __post_init__(self) -> None:
        check_count_arguments(input_shapes=self.input_shapes, batch=self.batch, strict=self.strict,
                              input_values=self.input_values, loop_trips=self.loop_trips,
                              trainable_inputs=self.trainable_inputs, trainable=self.trainable, frozen=self.frozen)
        from .conventions import get_convention
        from .masks import ATTENTION_MODES

        get_convention(self.convention)
        if self.memory is not None and self.memory is not False:
            from .memory.ledger import MemorySettings

            MemorySettings.of(self.memory)
        if isinstance(self.attention, str) and self.attention not in ATTENTION_MODES:
            raise UsageError(f"unknown attention {self.attention!r}; choose one of: {', '.join(ATTENTION_MODES)}")
        if self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}; choose one of: {', '.join(MODES)}")
        if self.optimizer is not None and (self.mode != "train" or self.optimizer not in OPTIMIZERS):
            raise UsageError(
                f"optimizer {self.optimizer!r}: give one of {', '.join(OPTIMIZERS)}, with mode='train' "
                "(--mode train)")
        bad_trips = {k: v for k, v in (self.loop_trips or {}).items()
                     if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_ELEMENTS}
        if bad_trips:
            raise UsageError(f"loop_trips must be non-negative integers of at most 2**48; got {bad_trips}")
        free = self.free_ops
        if isinstance(free, (str, bytes)) or not isinstance(free, Collection) or isinstance(free, Mapping) \
                or not all(isinstance(op, str) and op.strip(":") for op in free):
            raise UsageError(f"count: free_ops must be a list of operator types such as ['Marker', "
                             f"'com.example:Marker'], got {free!r}")
        # one spelling per setting, so that equal settings make equal records: no mapping or list left empty
        # for None, lists as tuples
        for name in ("input_values", "loop_trips"):
            value = getattr(self, name)
            object.__setattr__(self, name, MappingProxyType(dict(value)) if value else None)
        if self.input_shapes is not None:
            object.__setattr__(self, "input_shapes", MappingProxyType(
                {k: tuple(v) if isinstance(v, list) else v for k, v in self.input_shapes.items()}))
        object.__setattr__(self, "trainable_inputs", tuple(self.trainable_inputs) if self.trainable_inputs else None)
        for name in ("trainable", "frozen"):
            value = getattr(self, name)
            object.__setattr__(self, name, tuple(value) if value is not None else None)
        object.__setattr__(self, "free_ops", tuple(dict.fromkeys(free)))
        if self.memory is False:
            object.__setattr__(self, "memory", None)

    def keywords(self) -> dict[str, Any]:
        """The settings as the keywords of :func:`flopcount.count` (what a frontend passes on)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
