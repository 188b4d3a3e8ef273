"""Shape resolution: :func:`resolve` runs inference, folding, other-domain shapes and bodies in rounds until
nothing new resolves, and returns a :class:`Resolution`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from onnx import ModelProto

from ...context import TensorInfo
from ...errors import first_line
from ..graph import GraphIndex
from .bodies import infer_bodies, loop_outputs
from .contrib import contrib_shapes
from .guarded import Inference, check_dims, guard_needed, infer
from .interpreter import LazyConstants, fold_constants, with_constants
from .tensors import collect, initializer_infos, static, value_info

log = logging.getLogger(__name__)

MAX_ROUNDS = 12


@dataclass(frozen=True)
class Resolution:
    tensors: Mapping[str, TensorInfo]
    values: Mapping[str, np.ndarray]  # small constants known without weights
    inputs: tuple[TensorInfo, ...]  # real graph inputs, after overrides
    rounds: int  # inference passes run
    inference_error: str  # what strict ONNX inference says about unresolved dims ("" if nothing)


# --------------------------------------------------------------------------------------------
def _unresolved(index: GraphIndex, tensors: Mapping[str, TensorInfo]) -> list[str]:
    """Node outputs whose shapes are not fully known."""
    get = tensors.get
    return [name for name in index.producer if (t := get(name)) is None or not t[3]]  # t[3]: is_static



def resolve(model: ModelProto, index: GraphIndex, where: str, first: "Inference | None" = None,
            loop_trips: Mapping[str, int] | None = None) -> Resolution:
    """Resolve every tensor's shape that can be resolved without weights (``model`` is weightless
    and prepared by :func:`prepare`). ``first``, when given, is the first inference, already started.
    ``loop_trips`` (node name to trip count, as ``count`` takes it) gives the length of those Loops' stacked
    outputs."""
    bodies = bool(index.bodies)
    guard = guard_needed(index)
    declared = index.initializer_types  # the top graph's initializers, as build_graph read them
    # While a child infers, what does not need its answer is made first: the initializers' infos, and the index of
    # the small constants that the count looks up when no shape needed folding (the usual case).
    early = first is not None and first.in_child
    infos = initializer_infos(None, declared) if early else None
    lazy = LazyConstants(model, index).indexed() if early else None
    tensors = first.collected(declared, infos) if first is not None else None  # the child's report
    if tensors is None:
        tensors = collect(infer(model, where, guard=guard), bodies,
                          initializer_infos(None, declared) if infos is None else infos)
    check_dims(tensors, model, where)
    values: dict[str, np.ndarray] = {}
    rounds = 1
    pending = _unresolved(index, tensors)
    kinds = set(index.node_ops)  # (domain, op_type) of the top graph's nodes, read once by build_graph
    contrib = any(domain not in ("", "ai.onnx") for domain, _ in kinds)
    for _ in range(MAX_ROUNDS):  # folding, then other-domain ops, until neither settles anything new
        folds = 1
        while pending and folds < MAX_ROUNDS:
            folds += 1
            new = fold_constants(model, index, tensors, values)
            if not new:
                break
            scratch = with_constants(model, index, values)
            rounds += 1
            found = collect(infer(scratch, where, guard=guard), bodies)
            check_dims(found, model, where)
            tensors = {**tensors, **{k: v for k, v in found.items() if v.is_static or k not in tensors}}
            pending = _unresolved(index, tensors)
        if not (pending and contrib):
            break
        before = len(pending)
        tensors = contrib_shapes(model, index, tensors, values, where)
        pending = _unresolved(index, tensors)
        if len(pending) == before:  # else what they settled may let shape subgraphs fold further
            break
    if not values and any(op_type == "If" for _, op_type in kinds):
        fold_constants(model, index, tensors, values)  # an If's condition computed from constants or given values
    if not values:
        values = lazy if lazy is not None else LazyConstants(model, index)  # each read on its first look-up
    if bodies:
        tensors = dict(tensors)
        infer_bodies(model, model.graph, tensors, values, where)
        while rounds < MAX_ROUNDS and (settled := loop_outputs(model.graph, tensors, values, loop_trips)):
            # ONNX leaves every Loop output shapeless; with them settled, infer what follows them
            tensors.update(settled)
            scratch = with_constants(model, index, values)
            scratch.graph.value_info.extend(value_info(name, t) for name, t in settled.items())
            rounds += 1
            found = collect(infer(scratch, where, guard=guard), bodies)
            check_dims(found, model, where)
            tensors.update((k, v) for k, v in found.items() if v.is_static and not static(tensors.get(k)))
            if not isinstance(values, dict):
                values = {}
            if fold_constants(model, index, tensors, values):  # a later Loop's trip count from this one's stacked length
                scratch = with_constants(model, index, values)
                rounds += 1
                found = collect(infer(scratch, where, guard=guard), bodies)
                check_dims(found, model, where)
                tensors.update((k, v) for k, v in found.items() if v.is_static and not static(tensors.get(k)))
            infer_bodies(model, model.graph, tensors, values, where)
        pending = _unresolved(index, tensors)
    error = ""
    if pending:
        try:
            infer(with_constants(model, index, values), where, strict=True, guard=guard)
        except Exception as e:
            error = first_line(e)
        log.debug("%d tensors keep unknown dims after %d rounds: %s", len(pending), rounds, pending[:10])
    inputs = tuple(tensors.get(n, TensorInfo(n)) for n in index.inputs)
    return Resolution(tensors, values, inputs, rounds, error)


