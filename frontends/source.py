"""The model a count reads, :class:`ModelSource`: an ONNX model or a framework model exported without weights, with
the one dispatch from it to the frontend that exports and counts it under a
:class:`~flopcount.options.CountOptions`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from flopcount.errors import UsageError
from flopcount.options import CountOptions

__all__ = ["NOT_FOR_GENERATION", "ModelSource"]

#: The settings a count of ``generate()`` leaves at their defaults: it is inference, of the prompt's ``input_ids``
#: at the prompt's batch; every other setting (a new one too) applies to it.
NOT_FOR_GENERATION = MappingProxyType({"input_shapes": None, "batch": None, "mode": "inference", "optimizer": None,
                                       "trainable_inputs": None, "trainable": None, "frozen": None})


@dataclasses.dataclass(frozen=True)
class ModelSource:
    """The model a count reads: an ONNX model (a path, its bytes, a ``ModelProto`` or a loaded model), or a
    framework model exported without weights (``kind`` ``"torch"`` or ``"keras"``: ``model`` is
    ``MODULE:FACTORY``; ``"hf"``: a configuration). :meth:`count` and :meth:`to_onnx` are the one dispatch on it.

    Attributes
    ----------
    kind : ``"onnx"``, ``"torch"``, ``"keras"`` or ``"hf"``
    model : the ONNX model, or the text naming the framework model
    inputs : mapping, optional
        A framework model's inputs by name: dims, or ``(dims, dtype)`` (``--input-shape`` with ``--torch``/``--hf``).
    trust_remote_code, capacity_factor, repeated_layers :
        For ``--hf`` (see :func:`frontends.hf.from_hf`).
    generate : ``(P, N)``, optional
        Count ``generate()`` of N new tokens after a P-token prompt (``--hf`` or ``--torch``).
    """

    kind: str
    model: Any
    inputs: Mapping[str, Any] | None = None
    trust_remote_code: bool = False
    capacity_factor: float | None = None
    repeated_layers: str = "extend"
    generate: tuple[int, int] | None = None

    KINDS = ("onnx", "torch", "keras", "hf")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise UsageError(f"unknown model source {self.kind!r}; choose one of: {', '.join(self.KINDS)}")
        if self.kind != "onnx" and not isinstance(self.model, (str, os.PathLike)) and self.kind != "hf":
            raise UsageError(f"--{self.kind} takes MODULE:FACTORY, got {self.model!r}")

    def _factory(self):
        if self.kind == "torch":
            from flopcount.frontends.torch import load_factory
        else:
            from flopcount.frontends.keras import load_factory
        return load_factory(self.model)

    def count(self, options: CountOptions):
        """The :class:`~flopcount.reporting.report.Report` of this model under ``options``."""
        if self.generate is not None:
            ids = (self.inputs or {}).get("input_ids")
            ids = ids[0] if ids is not None and len(ids) == 2 and isinstance(ids[1], str) else ids  # (dims, dtype)
            batch = options.batch or (ids[0] if ids is not None else 1)
            options = dataclasses.replace(options, **NOT_FOR_GENERATION)
            if self.kind == "hf":
                from flopcount.frontends.hf import count_config

                return count_config(self.model, None, dataclasses.replace(options, batch=batch),
                                    trust_remote_code=self.trust_remote_code, generate=self.generate,
                                    capacity_factor=self.capacity_factor, repeated_layers=self.repeated_layers)
            from flopcount.frontends.generate import count_generation

            return count_generation(self._factory(), self.generate, options, batch=batch)
        if self.kind != "onnx":  # a framework model's inputs fix its shapes
            options = dataclasses.replace(options, input_shapes=None)
        if self.kind == "torch":
            from flopcount.frontends.torch import count_module

            return count_module(self._factory(), dict(self.inputs or {}), options)
        if self.kind == "hf":
            from flopcount.frontends.hf import count_config

            return count_config(self.model, dict(self.inputs or {}), options, trust_remote_code=self.trust_remote_code,
                                capacity_factor=self.capacity_factor, repeated_layers=self.repeated_layers)
        if self.kind == "keras":
            from flopcount.frontends.keras import count_model

            return count_model(self._factory(), dict(self.inputs or {}) or None, options)
        from flopcount.counting import count_options

        return count_options(self.model, options)

    def to_onnx(self, batch: int | None = None):
        """The ONNX model of this source: itself, or the weightless export of the framework model (its dims fixed
        by the export; ``batch`` sets a Keras model's)."""
        if self.kind == "torch":
            from flopcount.frontends.torch import to_onnx

            return to_onnx(self._factory(), dict(self.inputs or {}))
        if self.kind == "keras":
            from flopcount.frontends.keras import to_onnx

            return to_onnx(self._factory(), dict(self.inputs or {}) or None, batch=batch)
        if self.kind == "hf":
            from flopcount.frontends.hf import hf_inputs, load_model
            from flopcount.frontends.torch import to_onnx

            model = load_model(self.model, trust_remote_code=self.trust_remote_code)
            return to_onnx(model, hf_inputs(model, dict(self.inputs or {})))
        return self.model
