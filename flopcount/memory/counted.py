"""The memory ledger of a counted graph (``--memory``): what the count hands the ledger (:class:`Counted`), the
saved-for-backward rules applied to the nodes whose backward runs, read as the kernels of the framework the graph
came from (:mod:`.kernels`; a 16-bit graph the TorchScript exporter's sdpa promoted to float32 read at torch's
types, :mod:`.promoted`), then the liveness walk (:func:`flopcount.memory.ledger.ledger`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from ..context import TensorInfo
from ..errors import UnsupportedOperatorError
from ..registry import lookup_saved
from ..reporting.report import NodeCount, op_key
from ..saved import Saved
from .experts import expert_gathers, gathered_stacks
from .ledger import Graph, Memory, MemorySettings, ledger

__all__ = ["Counted", "account", "saved_by_node"]


def _no_attributes(n: NodeCount) -> Mapping[str, Any] | None:
    return None


def _no_masks() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True)
class Counted:
    """What the ledger reads of a counted graph: its ``nodes`` in execution order, which inputs of each need a
    gradient (``grads``, by node index: the nodes whose backward runs), the tensors' types and shapes, each node's
    :class:`~flopcount.context.NodeContext` (``make_context(node, grad flags)``) and attributes for its
    saved-for-backward rule, the stored tensors by role (``roles``: ``params``, ``trainable``, ``buffers`` and
    ``stored`` tensor names), the graph's inputs and outputs, the recompute units (node index → unit), whether a
    missing rule is refused (``strict``, the message naming ``where``), the model's producer name (``producer``:
    whose kernels the graph is read as), every node's attributes (``layout_attributes``: Transpose's ``perm``
    and Gather's ``axis`` among them) and the masks of its attentions, evaluated (``masks()``: score product's
    node name → :class:`~flopcount.pipeline.graph_masks.GraphMask`, or why it is not structure)."""

    nodes: Sequence[NodeCount]
    grads: Mapping[int, tuple[bool, ...]]
    tensors: Mapping[str, TensorInfo]
    make_context: Callable
    attributes: Callable[[NodeCount], Mapping[str, Any] | None]
    roles: Mapping[str, frozenset[str]]
    inputs: Sequence[str]
    outputs: Sequence[str]
    units: Mapping[int, int]
    strict: bool
    where: str
    producer: str = ""
    layout_attributes: Callable[[NodeCount], Mapping[str, Any] | None] = _no_attributes
    masks: Callable[[], Mapping[str, Any]] = _no_masks


def account(c: Counted, *, mode: str, optimizer: str | None, settings: MemorySettings,
            kv_cache_bytes: int | None = None) -> Memory:
    """The memory ledger of the counted graph ``c``: the saved-for-backward rules applied to the nodes whose
    backward runs, read as the kernels of the framework the graph came from (``c.producer``: :mod:`.kernels`),
    then :func:`~flopcount.memory.ledger.ledger`."""
    from .cpu_norms import cpu_statistics
    from .kernels import framework_of, kernels
    from .promoted import retyped

    if framework_of(c.producer) == "torch":  # the TorchScript exporter's 16-bit sdpa promoted to float32: torch's types
        c = replace(c, **dict(zip(("nodes", "tensors"), retyped(c.nodes, c.tensors))))
    nodes, roles, units = c.nodes, c.roles, c.units
    stored = roles["stored"] | gathered_stacks(nodes, roles["params"])  # the parameters' own storage
    if mode == "train":
        saved, missing = saved_by_node(c)
    else:
        saved, missing = {}, {}
    k = kernels(nodes, saved, stored, framework_of(c.producer), settings.device, c.layout_attributes,
                c.masks)
    saved.update(k.saved)
    if settings.device == "cpu" and framework_of(c.producer) == "torch":  # 16-bit layer norms' statistics
        saved.update(cpu_statistics(nodes, saved))
    if settings.recompute.policy == "selective":  # a fused attention keeps no score matrix to make again
        dropped = {units[i] for i in k.fused if i in units}
        units = {i: u for i, u in units.items() if u not in dropped}
    elif settings.recompute.policy == "ops":  # a fused attention is one kernel, no op of a list is inside it
        units = {i: u for i, u in units.items() if i not in k.fused}
    g = Graph(nodes, c.grads if mode == "train" else {}, saved, c.tensors, roles["params"], roles["trainable"],
              roles["buffers"], stored, tuple(c.inputs), frozenset(c.outputs),
              units if mode == "train" else {}, expert_gathers(nodes, roles["params"]), k.views, k.copies)
    return ledger(g, mode, optimizer, settings, missing, kv_cache_bytes)


def saved_by_node(c: Counted) -> tuple[dict[int, Saved], dict[str, int]]:
    """Each node's :class:`Saved` (by node index) for the nodes whose backward runs, and the op keys without a rule."""
    saved: dict[int, Saved] = {}
    missing: dict[str, int] = {}
    for n in c.nodes:
        if n.index not in c.grads:
            continue
        rule = lookup_saved(n.domain, n.op_type)
        if rule is None:
            key = op_key(n.domain, n.op_type)
            missing[key] = missing.get(key, 0) + 1
            continue
        saved[n.index] = rule(c.make_context(n, c.grads[n.index]), **(c.attributes(n) or {}))
        for key, count in saved[n.index].missing:  # inside a control-flow body
            missing[key] = missing.get(key, 0) + count
    if c.strict and missing:
        raise UnsupportedOperatorError(
            f"{c.where}: no saved-for-backward rule for " + ", ".join(f"{k} ({v})" for k, v in sorted(missing.items()))
            + "; run without --strict for a lower bound of the activations"
        )
    return saved, dict(sorted(missing.items()))
