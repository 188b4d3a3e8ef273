"""How a model's stack of identical layers was counted: extended from exports of 1 and 2 layers, or exported whole
(see :mod:`flopcount.derived.extension` and :func:`flopcount.frontends.hf.layer_stack`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EXPORTED", "EXTENDED", "RepeatedLayers"]

#: :attr:`RepeatedLayers.method` when the count was extended from 1- and 2-layer exports.
EXTENDED = "extended"
#: :attr:`RepeatedLayers.method` when the whole model was exported.
EXPORTED = "exported"


@dataclass(frozen=True)
class RepeatedLayers:
    """How a model's stack of layers was counted.

    ``path`` names the stack (``model.layers``), ``layers`` its length L; ``method`` is :data:`EXTENDED` (counted
    from exports of 1 and 2 layers, every figure extended to L) or :data:`EXPORTED` (the whole model exported), and
    ``reason`` says why, in a sentence.
    """

    path: str
    layers: int
    method: str
    reason: str

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "layers": self.layers, "method": self.method, "reason": self.reason}
