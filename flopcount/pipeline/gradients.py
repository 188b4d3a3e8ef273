"""Which tensors need a gradient in a training count: the gradient plan of a graph (or of a subgraph body), from
its trainable parameters through the differentiable inputs of each node (:mod:`flopcount.pipeline.schema`)."""

from __future__ import annotations

import dataclasses
from typing import Collection, Mapping

from ..context import FLOAT_TYPES
from ..registry import canonical_domain, straight_through
from .graph import GraphIndex
from .schema import differentiable_inputs

__all__ = ["TrainingPlan", "plan_gradients", "training_plan"]


@dataclasses.dataclass(frozen=True)
class TrainingPlan:
    grads: Mapping[int, tuple[bool, ...]]  # node index → which inputs need a gradient
    trainable: frozenset[str]  # initializers that are trained
    need: frozenset[str] = frozenset()  # tensors that need a gradient (subgraph bodies read these)
    float_inits: frozenset[str] = frozenset()  # floating-point initializers of the main graph


def training_plan(index: GraphIndex, tensors, opsets, parameters: frozenset[str]) -> TrainingPlan:
    """Which tensors need gradients: the trainable ``parameters`` fed to a differentiable input
    (see :mod:`flopcount.pipeline.parameters`) and everything computed from them through differentiable
    inputs. A node whose outputs are all integers or bools (ArgMax, NonMaxSuppression, comparisons)
    passes no gradient back, so it needs no backward and trains nothing, unless its backward is
    registered ``straight_through`` (fake quantization)."""
    float_inits = {n for n in parameters if (t := tensors.get(n)) is None or not t.elem_type or t.elem_type in FLOAT_TYPES}
    nodes = ((i, index.node_inputs[i], index.node_outputs[i], index.node_ops[i], index.captured.get(i, ()))
             for i in index.order)
    need: set[str] = set()
    grads, trainable = plan_gradients(nodes, float_inits, need, tensors, opsets)
    grads = reaching_outputs(index, grads, need)
    return TrainingPlan(grads, frozenset(trainable), frozenset(need), frozenset(float_inits))


def reaching_outputs(index: GraphIndex, grads: dict[int, tuple[bool, ...]],
                     need: Collection[str]) -> dict[int, tuple[bool, ...]]:
    """The nodes of ``grads`` whose backward runs: those with an output that a graph output is computed from
    through nodes whose backward runs and their inputs that need a gradient (walked from the graph's outputs back).
    A branch of which only integers are read on (the indices of a TopK whose values nothing reads, a router's
    group-limited mask) has its gradient graph freed by the framework as soon as its outputs die in the forward:
    what its backward would keep is never kept, and its backward never runs. ``grads`` itself when no output is
    reached at all (a graph whose outputs all are integers: nothing to walk from).

    >>> from flopcount.pipeline.graph import build_graph
    >>> import onnx.helper as h
    >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"]), h.make_node("TopK", ["x", "k"], ["v", "i"])], "g",
    ...                  [], [h.make_empty_tensor_value_info("y"), h.make_empty_tensor_value_info("i")])
    >>> reaching_outputs(build_graph(g, "g", ["x", "k"]), {0: (True,), 1: (True, False)}, {"x", "y", "v"})
    {0: (True,)}
    """
    reached = {name for name in index.outputs if name in need}
    kept: set[int] = set()
    for i in reversed(index.order):
        flags = grads.get(i)
        if flags is None or not any(out in reached for out in index.node_outputs[i] if out):
            continue
        kept.add(i)
        reached.update(name for name, ok in zip(index.node_inputs[i], flags) if ok)
        reached.update(index.captured.get(i, ()))
    return {i: flags for i, flags in grads.items() if i in kept} if kept else grads


def plan_gradients(nodes, float_inits, need: set[str], tensors, opsets) -> tuple[dict[int, tuple[bool, ...]], set[str]]:
    """The gradient plan of ``nodes`` (index, input names, output names, (domain, op_type), names
    read by its subgraphs from outside) in topological order: which inputs of each node need a
    gradient, and the initializers trained. ``need`` (tensors needing a gradient) is seeded by the
    caller and grows."""
    trainable: set[str] = set()
    grads: dict[int, tuple[bool, ...]] = {}
    for idx, inputs, outputs, (proto_domain, op_type), captured in nodes:
        floats = []
        for out in outputs:
            t = tensors.get(out)
            if out and (t is None or not t.elem_type or t.is_float or straight_through(proto_domain, op_type)):
                floats.append(out)
        if not floats:
            continue
        domain = canonical_domain(proto_domain)
        diff = differentiable_inputs(op_type, opsets.get(domain, 0), domain, len(inputs))
        flags = []
        for name, ok in zip(inputs, diff):
            if ok and name in float_inits:
                trainable.add(name)
                need.add(name)
            flags.append(bool(name) and ok and name in need)
        # weights an If/Loop/Scan body reads from outside (not node inputs) are trained through it
        reached = [n for n in captured if n in need or n in float_inits]
        trainable.update(n for n in reached if n in float_inits)
        need.update(reached)
        if any(flags) or reached:
            grads[idx] = tuple(flags) or (False,)  # non-empty: the node's backward is due
            need.update(floats)
    return grads, trainable
