"""What an operator's backward keeps from its forward: the record a saved-for-backward rule returns.

A rule (registered with :func:`flopcount.registry.saves` beside the operator's backward formula) is a pure function
``rule(ctx, **attributes) -> Saved`` of a node's shapes, dtypes, attributes and of which inputs need a gradient
(``ctx.needs_grad(i)``). It names the input and output positions the backward reads, and the smaller statistics the
forward computes only for the backward (LayerNorm's mean and reciprocal standard deviation, a dropout mask kept as
bools, max pooling's indices), in bytes. Stored tensors among them (weights, constants) are not activations; the
memory ledger (:mod:`flopcount.memory.ledger`) counts each tensor once however many nodes keep it.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["NOTHING", "BodySaved", "Saved", "element_bytes", "keeps"]

#: Bytes of the statistics kept in float32 (the accumulation type of every framework's normalization kernels).
STAT_BYTES = 4
#: Bytes of one element of a mask kept as bools (torch's dropout mask) and of an int64 index (max pooling).
BOOL_BYTES = 1
INDEX_BYTES = 8


class Saved(NamedTuple):
    """The tensors and statistics a node's backward keeps.

    >>> Saved(inputs=(0,), extra=(("mask", 12),)).extra_bytes
    12
    """

    inputs: tuple[int, ...] = ()  # input positions kept (an omitted optional input is skipped)
    outputs: tuple[int, ...] = ()  # output positions kept
    extra: tuple[tuple[str, int], ...] = ()  # (what, bytes) of statistics the forward computes for the backward
    missing: tuple[tuple[str, int], ...] = ()  # (op key, nodes) without a rule inside a body (control flow)
    unsized: tuple[str, ...] = ()  # tensors kept inside a body whose size is unknown (counted as 0)

    @property
    def extra_bytes(self) -> int:
        return sum(b for _, b in self.extra)


class BodySaved(NamedTuple):
    """What one run of a control-flow body (an If branch, a Loop, Scan or SequenceMap body) keeps for its
    backward, by where the kept tensors live: ``made`` bytes of tensors its own nodes make (a new set each
    run), ``extra`` bytes of its nodes' statistics (each run), ``formal`` the names of its formal inputs it keeps
    (a loop-carried value, a scan slice), ``outer`` bytes of activations of enclosing graphs it keeps (once, not
    per run), ``outputs`` its graph outputs whose storage it keeps, ``missing`` (op key, nodes) of its operators without a rule, ``unsized`` kept tensors of unknown
    size (counted as 0)."""

    made: int = 0
    extra: int = 0
    formal: frozenset[str] = frozenset()
    outer: int = 0
    outputs: frozenset[str] = frozenset()  # the names of its graph outputs whose storage it keeps
    missing: tuple[tuple[str, int], ...] = ()
    unsized: tuple[str, ...] = ()


#: The rule of an operator whose backward needs only shapes (Add, Reshape, Concat, ReduceSum ...).
NOTHING = Saved()


def keeps(*inputs: int, outputs: tuple[int, ...] = ()) -> Saved:
    """``Saved(inputs, outputs)``: shorthand for rules that keep whole tensors."""
    return Saved(tuple(inputs), tuple(outputs))


def element_bytes(elem_type: int, default: int = 4) -> int:
    """Bytes of one element of ONNX type ``elem_type`` (``default`` when unknown or not a whole byte).

    >>> element_bytes(10), element_bytes(7)
    (2, 8)
    """
    import numpy as np
    from onnx import helper

    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return default
