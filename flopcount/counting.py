"""The count: load → DAG → shapes → one registered formula per node → :class:`Report`.

Each stage returns a frozen record and changes nothing it was given: :class:`_Graph` (the model read, checked and
resolved), the gradient plan of a training count (:mod:`flopcount.pipeline.gradients`), :class:`_Forward` (the
counted nodes), :class:`_Trained` (the backward's figures) and the memory ledger; :func:`_report` assembles the
Report from them, once. The ledgers of a parallel plan are attached after (:func:`flopcount.plans.with_plan`)."""

from __future__ import annotations

import dataclasses
import fnmatch
import gc
import inspect
import logging
import os
import time
from math import prod
from operator import itemgetter
from types import MappingProxyType
from typing import Any, Collection, Mapping, NamedTuple, Sequence

import onnx
from onnx import ModelProto

from .context import FLOAT_TYPES, NodeContext, TensorInfo, is_long
from .conventions import Convention, get_convention
from .cost import ZERO, Bound, Breakdown, Cost
from .errors import FlopcountError, InvalidGraphError, ShapeError, UnsupportedOperatorError, UsageError
from .masks import executed_attention, score_products, values_structure
from .options import OPTIMIZERS, CountOptions
from .pipeline import graph as graph_mod
from .pipeline import progress, retained, validate
from .pipeline.graph import GraphIndex
from .pipeline.attributes import AttributeCache
from .pipeline.graph_masks import graph_masks
from .pipeline.loading import LoadedModel, copy_field, load, shortened
from .pipeline.parameters import BUFFER, PARAMETER, SHAPE_TYPES, Roles, classify, stored_tensors
from .pipeline.gradients import TrainingPlan, plan_gradients, training_plan
from .pipeline.shapes import Inference, Resolution, prepare, resolve
from .plans import with_plan
from .registry import canonical_domain, lookup, lookup_backward, lookup_shape
from .reporting.modules import ModuleScopes, scopes_of
from .reporting.report import (FORMULA, UNSUPPORTED, ZERO_COST, ModelInfo, NodeCount, OpTypeSummary, Report, op_key,
                               op_type_summaries, sum_costs)

log = logging.getLogger(__name__)



def count(model: str | os.PathLike | ModelProto | bytes | LoadedModel,
          input_shapes: Mapping[str, Sequence[int]] | None = None, **settings: Any) -> Report:
    """Count the FLOPs of an ONNX model without reading its weights.

    Every parameter but ``model`` is a setting of the count: the field of the same name of
    :class:`~flopcount.options.CountOptions`, described (with its type) and checked there (a
    :class:`~flopcount.errors.UsageError` naming the argument); ``count(model, **settings)`` is
    ``count_options(model, CountOptions(**settings))``. With ``parallel``, the report carries the ledgers per rank
    that ``flopcount --parallel`` prints (``report.parallel``, and ``report.memory`` per rank with ``memory``).

    Parameters
    ----------
    model : path, ``onnx.ModelProto``, serialized bytes or :class:`flopcount.pipeline.loading.LoadedModel`
        The model. External data files are never opened and may be absent. A ``LoadedModel`` (from
        :func:`flopcount.pipeline.loading.load_with_weights`) is counted without reading its file again, under its path.

    Returns
    -------
    Report

    Examples
    --------
    >>> from onnx import helper, TensorProto
    >>> g = helper.make_graph(
    ...     [helper.make_node("MatMul", ["a", "b"], ["c"])], "g",
    ...     [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
    ...      helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 5])],
    ...     [helper.make_tensor_value_info("c", TensorProto.FLOAT, None)])
    >>> report = count(helper.make_model(g))
    >>> report.total.flops, report.total.macs   # 2 * 2*3*5, 2*3*5
    (60, 30)
    """
    names = [f.name for f in dataclasses.fields(CountOptions)]
    unknown = [k for k in settings if k not in names]
    if unknown:
        raise TypeError(f"count() got an unexpected keyword argument {unknown[0]!r}; its settings: {', '.join(names)}")
    return count_options(model, CountOptions(input_shapes=input_shapes, **settings))


# the signature of count(), as help() and the docs show it: the fields of CountOptions, each a keyword
count.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    *(inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD if f.name == "input_shapes"
                        else inspect.Parameter.KEYWORD_ONLY, default=f.default)
      for f in dataclasses.fields(CountOptions))], return_annotation=Report)


def count_options(model: str | os.PathLike | ModelProto | bytes | LoadedModel, options: CountOptions) -> Report:
    """:func:`count` of ``model`` under the settings of ``options``."""
    import flopcount.operators  # noqa: F401  (fills the registry)

    # Counting allocates many long-lived small objects; the cyclic collector would rescan them over
    # and over (time growing faster than the graph). Nothing here creates reference cycles to free.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        report = _count(model, options)
    finally:
        if gc_was_enabled:
            gc.enable()
    return with_plan(report, options)  # the ledgers per rank of options.parallel (flopcount.plans)


#: The stages of a count as :mod:`flopcount.pipeline.progress` names them (keys of ``Report.timings``).
_PHASES = {"load": "reading the model", "graph": "building and checking the graph", "shapes": "inferring shapes",
           "count": "counting the nodes"}


class _Clock:
    """The seconds of each stage of one count (``Report.timings``), each reported as it ends."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase] = now - self._last
        self._last = now
        progress.done(_PHASES[phase], self.timings[phase])


@dataclasses.dataclass(frozen=True)
class _Graph:
    """The model read, checked and resolved: what the counting stages after it read (and never change)."""

    loaded: LoadedModel
    model: ModelProto  # the model counted (prepared: its input shapes set)
    shaped: ModelProto  # the model shape inference read (see _for_inference)
    where: str  # the model's name in messages
    index: GraphIndex
    opsets: Mapping[str, int]
    attributes_of: AttributeCache
    attributes: Sequence[Any]  # node index → its attributes
    roles: Roles
    scopes: ModuleScopes
    res: Resolution
    hint: str  # how to fix an unresolved shape (validate.fix_hint)


@dataclasses.dataclass(frozen=True)
class _Forward:
    """The forward stage's record: the counted nodes (in traversal order) and the operators without a formula."""

    nodes: tuple[NodeCount, ...]
    by_op_type: Mapping[str, OpTypeSummary]
    unsupported: Mapping[str, int]  # op key → nodes without a formula, subgraph bodies' included
    walk: "_Traversal"


@dataclasses.dataclass(frozen=True)
class _Trained:
    """The backward stage's record (``mode="train"``): its figures for the report."""

    plan: "TrainingPlan"
    backward: Cost
    backward_unsupported: Mapping[str, int]
    trainable_params: int
    optimizer: tuple[str, Cost] | None


def _count(model, options: CountOptions) -> Report:
    conv = get_convention(options.convention)
    memory = _memory_settings(options.memory)
    clock = _Clock()
    graph = _read(model, options, clock)
    plan = _training(graph, options)
    conv = _executed(conv, graph, options)
    forward = _forward(graph, conv, plan, options, memory is not None)
    trained = _trained(graph, plan, forward, options) if plan is not None else None
    ledger = _memory(memory, graph, forward, trained, options) if memory is not None else None
    clock.lap("count")
    report = _report(graph, conv, forward, trained, ledger, options, clock.timings)
    # in the console's process, left for its exit rather than freed object by object here (a no-op elsewhere)
    retained.keep(graph, forward, plan, report)
    return report


def _memory_settings(memory):
    """The memory settings of a count (``options.memory``: None, True or a record), checked: a plan is given to the
    count, never inside the settings."""
    if memory is None:
        return None
    from .memory.ledger import MemorySettings

    memory = MemorySettings.of(memory)
    if not memory.plan.is_single:
        raise UsageError(f"memory: the plan of MemorySettings ({memory.plan}) is not counted; give it as a "
                         "setting of the count, count(..., memory=True, parallel=plan), or split a one-rank "
                         "count with flopcount.memory_per_rank(report, plan)")
    return memory


def _read(model, options: CountOptions, clock: _Clock) -> _Graph:
    """Load ``model``, build and check its graph, and resolve its shapes (the stages load, graph and shapes)."""
    input_values, loop_trips = options.input_values, options.loop_trips
    loaded = load(model)
    m, where = loaded.model, loaded.path or "<model>"
    clock.lap("load")
    prepare(m, options.input_shapes, options.batch, where, input_values)
    shaped = _for_inference(m)
    inference = Inference(shaped, where)  # may run beside the DAG construction: see Inference
    try:
        index = graph_mod.build_graph(m.graph, where)
        opsets = _opsets(m)
        validate.check_graph(m, index, opsets, where)  # before any inference in this process
        _check_loop_trips(m.graph, index, loop_trips, where)
        attributes_of = AttributeCache(opsets, where, m.ir_version)
        attributes = attributes_of.of_graph(index)
        roles = _roles(m, opsets, options.trainable, frozenset(input_values or ()), where, options.frozen, index)
        # needs the graph and the roles only: made while the inference child (if any) is still at work
        scopes = _module_scopes(index, roles)
        clock.lap("graph")
        res = resolve(shaped, index, where, inference, loop_trips=loop_trips)
    finally:
        inference.close()
    validate.check_resolved(index, res.tensors, res.values, attributes, where)
    clock.lap("shapes")
    return _Graph(loaded, m, shaped, where, index, opsets, attributes_of, attributes, roles, scopes, res,
                  validate.fix_hint(res.inputs, res.inference_error))


def _training(graph: _Graph, options: CountOptions) -> "TrainingPlan | None":
    """Which nodes need a backward (``mode="train"``), or None in inference."""
    m, res = graph.model, graph.res
    trained_inputs = _trainable_inputs(m, res.tensors, options.trainable_inputs, options.mode, graph.where)
    if options.mode != "train":
        return None
    return training_plan(graph.index, res.tensors, graph.opsets, graph.roles.names(PARAMETER) | trained_inputs)


def _executed(conv: Convention, graph: _Graph, options: CountOptions) -> Convention:
    """``conv`` with the attention masks that run (``options.attention``: "executed", or the masks given)."""
    attention, given_mask = options.attention, None
    if not isinstance(attention, str):
        attention, given_mask = "executed", attention
    if attention != "executed":
        return conv
    index, res, input_values = graph.index, graph.res, options.input_values
    protos, names = index.protos, index.names
    padding, segments = values_structure(input_values, res.tensors, graph.where) if given_mask is not None else (None, None)
    evaluated = None if given_mask is not None else graph_masks(
        protos, names, score_products(protos, names), res.tensors, res.values,
        frozenset(i.name for i in graph.model.graph.input), frozenset(input_values or ()))
    return dataclasses.replace(conv, executed=executed_attention(protos, given_mask, names, padding, segments, evaluated))


def _forward(graph: _Graph, conv: Convention, plan: "TrainingPlan | None", options: CountOptions,
             memory: bool) -> _Forward:
    """Every node counted by its formula (and its backward under ``plan``), the operators the user declared free
    (``options.free_ops``) made zero-cost; checked under ``options.strict``. ``memory``: whether the memory ledger
    will read subgraph bodies' saved tensors, which need the main graph's stored tensors."""
    index, res, where = graph.index, graph.res, graph.where
    stored = frozenset(stored_tensors(graph.model.graph)) if memory else frozenset()
    walk = _Traversal(graph, conv, options.loop_trips or {}, plan, stored)
    grads = plan.grads if plan is not None else {}
    protos, names, attributes = index.protos, index.names, graph.attributes
    node_inputs, node_outputs, node_ops = index.node_inputs, index.node_outputs, index.node_ops
    nodes = []
    for i in index.order:
        try:
            nodes.append(walk.node(protos[i], i, names[i], attributes[i], grads.get(i, ()),
                                   (node_inputs[i], node_outputs[i], node_ops[i])))
        except ShapeError as e:
            raise _shapeless_source(index, i, res.tensors, where) or e from None
    nested = walk.nested_unsupported
    if options.free_ops:  # unsupported operators the user declared free: zero-cost
        free = frozenset(options.free_ops)
        nodes = [n._replace(status=ZERO_COST) if n.status == UNSUPPORTED and (
            n.op_type in free or op_key(n.domain, n.op_type) in free) else n for n in nodes]
        nested = {k: v for k, v in nested.items() if k not in free and k.rpartition(":")[2] not in free}
    by_op_type = op_type_summaries(nodes)
    return _Forward(tuple(nodes), by_op_type, _unsupported(by_op_type, nested, options.strict, where), walk)


def _unsupported(by_op_type: Mapping[str, OpTypeSummary], nested: Mapping[str, int], strict: bool,
                 where: str) -> Mapping[str, int]:
    """op key → nodes without a formula, from the summaries per operator and, ``nested``, inside subgraph bodies;
    refused when ``strict``."""
    unsupported = {s.key: s.nodes for s in by_op_type.values() if s.status == UNSUPPORTED}
    for key, n in nested.items():  # operators without a formula inside If/Loop/Scan bodies
        unsupported[key] = unsupported.get(key, 0) + n
    if unsupported:
        log.info("%s: no formula for %s", where, ", ".join(f"{k} ({v})" for k, v in unsupported.items()))
    if strict and unsupported:
        raise UnsupportedOperatorError(
            f"{where}: no formula for {len(unsupported)} operator type(s): "
            + ", ".join(f"{k} ({v} node{'s' if v > 1 else ''})" for k, v in sorted(unsupported.items()))
            + "; run without --strict to count the rest, or file an issue for them"
        )
    return MappingProxyType(unsupported)


def _trained(graph: _Graph, plan: "TrainingPlan", forward: _Forward, options: CountOptions) -> _Trained:
    """The backward's figures of a training count; refused under ``options.strict`` when a node has no backward
    formula."""
    tensors, optimizer = graph.res.tensors, options.optimizer
    trainable = sum(prod(tensors[n].shape) for n in plan.trainable if tensors.get(n) is not None)
    backward_unsupported = MappingProxyType(dict(sorted(forward.walk.backward_unsupported.items())))
    if options.strict and backward_unsupported:
        raise UnsupportedOperatorError(
            f"{graph.where}: no backward formula for "
            + ", ".join(f"{k} ({v})" for k, v in backward_unsupported.items())
            + "; run without --strict to count the rest"
        )
    return _Trained(plan, sum_costs(n.backward for n in forward.nodes), backward_unsupported, trainable,
                    (optimizer, optimizer_cost(optimizer, trainable)) if optimizer else None)


def _memory(settings, graph: _Graph, forward: _Forward, trained: _Trained | None, options: CountOptions):
    """The memory ledger of the counted nodes (:func:`flopcount.memory.counted.account`)."""
    from .memory.counted import Counted, account
    from .memory.units import attention_cores, recompute_units

    index, res, m, walk = graph.index, graph.res, graph.model, forward.walk
    conv, opsets, attributes = walk.convention, graph.opsets, graph.attributes
    grads = trained.plan.grads if trained is not None else None

    def context(n: NodeCount, flags: tuple[bool, ...]) -> NodeContext:
        return NodeContext(n.name, n.op_type, n.domain, opsets.get(n.domain, 0), n.inputs, n.outputs, conv,
                           res.values.get, trips=walk.loop_trips.get(n.name), grads=flags,
                           saved_subgraph=walk.subgraph_saved)

    units = recompute_units(settings.recompute, forward.nodes, graph.scopes.nodes, lambda: attention_cores(index),
                            grads)
    names = {"params": graph.roles.names(PARAMETER), "trainable": trained.plan.trainable if trained else frozenset(),
             "buffers": graph.roles.names(BUFFER), "stored": walk.stored}

    def masks() -> dict:  # each attention's mask, evaluated: whether the program hands its fused kernel a mask
        found = score_products(index.protos, index.names)
        eager, _ = graph_masks(index.protos, index.names, found, res.tensors, res.values,
                               frozenset(i.name for i in m.graph.input), frozenset(options.input_values or ()))
        return dict(zip(sorted((n for n, (role, _) in found.items() if role == "scores"), key=lambda n: found[n][1]),
                        eager))

    counted = Counted(forward.nodes, grads=grads or {}, tensors=res.tensors, make_context=context,
                      attributes=lambda n: attributes[n.index], roles=names, inputs=[t.name for t in res.inputs],
                      outputs=[o.name for o in m.graph.output], units=units, strict=options.strict,
                      where=graph.where, producer=m.producer_name, masks=masks,
                      layout_attributes=lambda n: {a.name: onnx.helper.get_attribute_value(a)
                                                   for a in index.protos[n.index].attribute})
    return account(counted, mode="train" if trained is not None else "inference", optimizer=options.optimizer,
                   settings=settings)


def _module_scopes(index: GraphIndex, roles: Roles) -> ModuleScopes:
    """The module scope of every counted node (in traversal order) and the owner of every parameter."""
    order, protos, names, inputs = index.order, index.protos, index.names, index.node_inputs
    params = {n: roles.sizes[n] for n in roles.names(PARAMETER)}

    def first_reader() -> dict[str, int]:  # asked for only where some node has a scope
        found: dict[str, int] = {}
        for k, i in enumerate(order):
            for name in inputs[i]:
                if name in params and name not in found:
                    found[name] = k
        return found

    metadata = [protos[i].metadata_props for i in order]
    metadata = [{p.key: p.value for p in props} if props else None for props in metadata] if any(metadata) else None
    return scopes_of([names[i] for i in order], metadata, params, first_reader)


def optimizer_cost(name: str, params: int) -> Cost:
    flops, trans, _ = OPTIMIZERS[name]
    return Cost(flops=flops * params, transcendentals=trans * params)


def _trainable_inputs(m: ModelProto, tensors, names, mode: str, where: str) -> frozenset[str]:
    """The graph inputs ``trainable_inputs`` names, checked: floating-point inputs of the main graph."""
    if isinstance(names, str):
        names = [names]
    names = list(names or ())
    if not names:
        return frozenset()
    if mode != "train":
        raise UsageError(f"{where}: trainable_inputs ({', '.join(names)}) need mode='train' (--mode train)")
    initializers = {t.name for t in m.graph.initializer}
    floats = [i.name for i in m.graph.input if i.name not in initializers
              and i.type.tensor_type.elem_type in FLOAT_TYPES]
    bad = [n for n in names if n not in floats]
    if bad:
        raise UsageError(
            f"{where}: {', '.join(map(repr, bad))} is not a floating-point input of the graph; trainable inputs "
            f"can be: {', '.join(floats) or 'none'}"
        )
    return frozenset(names)


_TYPE = itemgetter(slice(1, 3))  # a TensorInfo's (elem_type, shape)
_make = tuple.__new__


class _TensorTable(dict):
    """Tensor name → :class:`TensorInfo`; a name without an entry reads as an info without type or
    shape, and the empty name of an omitted optional input as None. Lookups stay in C
    (``map(table.__getitem__, names)``)."""

    __slots__ = ()

    def __missing__(self, name: str) -> TensorInfo | None:
        return TensorInfo(name) if name else None


class _Op(NamedTuple):
    """What the traversal needs per (domain, op_type), looked up once per count."""

    domain: str  # canonical
    op_type: str
    rule: Any  # registry Rule or None
    status: str
    family: str
    backward: Any  # backward formula or None


class _Traversal:
    """Applies the registry to nodes; bodies of If/Loop/Scan recurse through :meth:`graph`."""

    def __init__(self, graph: _Graph, convention: Convention, loop_trips: Mapping[str, int],
                 training: "TrainingPlan | None" = None, stored: frozenset[str] = frozenset()):
        self.tensors = _TensorTable(graph.res.tensors)
        self._table = self.tensors.__getitem__
        self.values, self.convention = graph.res.values, convention
        self._executed = convention.executed
        self.opsets, self.hint, self.where, self.loop_trips = graph.opsets, graph.hint, graph.where, loop_trips
        self.attributes_of: AttributeCache = graph.attributes_of
        self.nested_unsupported: dict[str, int] = {}
        self.backward_unsupported: dict[str, int] = {}
        self._ops: dict[tuple[str, str], _Op] = {}
        self._memo: dict[tuple, tuple] = {}  # see node()
        self._looked = False  # whether the running formula read a value or a subgraph
        self.stored = stored  # the main graph's stored tensors (see subgraph_saved()): given for the memory ledger
        # training: what the scopes around the body being counted know (tensors needing a gradient,
        # floating-point initializers); the main graph's first
        self._scopes: list[tuple[frozenset[str], frozenset[str]]] = (
            [(training.need, training.float_inits)] if training is not None else [])

    def _value(self, name: str):
        self._looked = True
        return self.values.get(name)

    def _subgraph(self, g: onnx.GraphProto) -> Cost:
        cost = self.graph(g)
        self._looked = True  # after: the body's own nodes reset it
        return cost

    def _op(self, proto_domain: str, op_type: str) -> _Op:
        domain = canonical_domain(proto_domain)
        rule = lookup(domain, op_type)
        if rule is None:
            op = _Op(domain, op_type, None, UNSUPPORTED, "", None)
        else:
            op = _Op(domain, op_type, rule, ZERO_COST if rule.zero_cost else FORMULA, rule.family, lookup_backward(domain, op_type))
        self._ops[(proto_domain, op_type)] = op
        return op

    def node(self, proto: onnx.NodeProto, idx: int, name: str, attrs: Mapping[str, Any] | None,
             grads: tuple[bool, ...] = (), read: tuple | None = None) -> NodeCount:
        """The count of one node; ``grads``: in training, which inputs need a gradient; ``read``: what was
        already read of ``proto`` (its input names, output names and (domain, op_type)), or None."""
        if read is None:
            inputs, outputs, kind = proto.input, proto.output, (proto.domain, proto.op_type)
        else:
            inputs, outputs, kind = read
        op_type = kind[1]
        op = self._ops.get(kind) or self._op(*kind)
        table = self._table
        ins = tuple(map(table, inputs))
        outs = tuple(map(table, outputs))
        status, family = op.status, op.family
        parts: tuple = ()
        bound = ""
        ctx = None
        cost = ZERO
        if status == FORMULA:
            trips = self.loop_trips.get(name)
            # Nodes of one op with equal attributes, tensor types and shapes cost the same, unless
            # the formula read a constant's value or a subgraph (or a trip count was given).
            key = known = None
            if trips is None and None not in ins and None not in outs:
                key = (op_type, op.domain, id(attrs), grads, *map(_TYPE, ins), None, *map(_TYPE, outs),
                       self._executed and self._executed.role(name))
                known = self._memo.get(key)
            if known is not None:
                cost, bound, parts = known
            else:
                self._looked = False
                ctx = self._context(name, op, ins, outs, trips, grads)
                cost = _apply(op.rule.fn, ctx, attrs or {}, self.where)
                if type(cost) is not Cost:
                    if isinstance(cost, Bound):
                        cost, bound = cost.total, cost.why
                    if isinstance(cost, Breakdown):
                        cost, parts = cost.total, cost.parts
                cost = self.convention.apply(family, cost)
                if key is not None and not self._looked:
                    self._memo[key] = (cost, bound, parts)
        back = ZERO
        if grads and op.rule is not None:
            if op.backward is not None:
                if ctx is None:
                    ctx = self._context(name, op, ins, outs, self.loop_trips.get(name), grads)
                if attrs is None:
                    attrs = self.attributes_of(proto, name, force=True)
                back = self.convention.apply(family, _apply(op.backward, ctx, attrs or {}, self.where))
            elif status == FORMULA:
                key = op_key(op.domain, op_type)
                self.backward_unsupported[key] = self.backward_unsupported.get(key, 0) + 1
        if ctx is not None and (min(cost) < 0 or min(back) < 0):  # a formula term such as (n − 1) met an empty axis
            raise ShapeError(
                f"{self.where}: node {name!r} ({op_type}): its {'backward ' if min(cost) >= 0 else ''}formula gives a negative "
                f"count for inputs {', '.join(t.shape_text() for t in ins if t is not None) or '(none)'} (an empty "
                "tensor?); counts are never negative: please report it with the model"
            )
        # NodeCount(...) made as its tuple, without the Python call of a named tuple's __new__
        return _make(NodeCount, (idx, name, op_type, op.domain, family, status, ins, outs, cost, parts, back, bound))

    def _context(self, name, op: _Op, ins, outs, trips, grads) -> NodeContext:
        return NodeContext(
            name, op.op_type, op.domain, self.opsets.get(op.domain, 0), ins, outs, self.convention,
            self._value, self.hint, self._subgraph, trips, grads, self._subgraph_backward,
        )

    def _body_plan(self, g: onnx.GraphProto, seeds: Sequence[str], carried: Sequence[tuple[str, str]]):
        """(node gradients, names needing one, floating-point initializers) of one run of a subgraph whose formal
        inputs ``seeds`` need a gradient (besides what it reads from enclosing scopes). ``carried`` pairs a body
        output with the body input it becomes in the next iteration (Loop, Scan states): when the output needs a
        gradient, so does the input."""
        outer_need, outer_inits = self._scopes[-1] if self._scopes else (frozenset(), frozenset())
        float_inits = set(outer_inits) | {t.name for t in g.initializer if t.data_type in FLOAT_TYPES}
        nodes = []
        for i, proto in enumerate(g.node):
            captured = ()
            if proto.op_type in graph_mod.SUBGRAPH_OPS or proto.domain not in ("", "ai.onnx"):
                captured = tuple(sorted(graph_mod.subgraph_outer_names(proto)))
            nodes.append((i, tuple(proto.input), tuple(proto.output), (proto.domain, proto.op_type), captured))
        start = set(seeds)
        for _ in range(len(carried) + 1):  # a carried gradient can reach one more input per pass
            need = set(outer_need) | start
            grads, _trainable = plan_gradients(nodes, float_inits, need, self.tensors, self.opsets)
            more = {into for out, into in carried if out in need and into not in start}
            if not more:
                break
            start |= more
        return grads, frozenset(need), frozenset(float_inits)

    def _subgraph_backward(self, g: onnx.GraphProto, seeds: Sequence[str], carried: Sequence[tuple[str, str]] = ()) -> Cost:
        """Backward cost of one run of a subgraph (its gradients planned by :meth:`_body_plan`)."""
        grads, need, float_inits = self._body_plan(g, seeds, carried)
        self._scopes.append((need, float_inits))
        try:
            total = ZERO
            for i, proto in enumerate(g.node):
                if i in grads:
                    name = graph_mod.node_label(proto, i)
                    total = total + self.node(proto, i, name, self.attributes_of(proto, name), grads[i]).backward
            return total
        finally:
            self._scopes.pop()

    def subgraph_saved(self, g: onnx.GraphProto, seeds: Sequence[str], carried: Sequence[tuple[str, str]] = ()):
        """What one run of a subgraph keeps for its backward (:func:`flopcount.memory.bodies.body_saved`), its
        gradients planned by :meth:`_body_plan` as its backward's are."""
        from .memory.bodies import body_saved

        grads, need, float_inits = self._body_plan(g, seeds, carried)
        self._scopes.append((need, float_inits))
        try:
            run = []
            for i, proto in enumerate(g.node):
                if i in grads:
                    name = graph_mod.node_label(proto, i)
                    attrs = self.attributes_of(proto, name, force=True) or {}
                    n = self.node(proto, i, name, attrs, grads[i])
                    op = self._ops.get((proto.domain, proto.op_type)) or self._op(proto.domain, proto.op_type)
                    ctx = self._context(name, op, n.inputs, n.outputs, self.loop_trips.get(name), grads[i])
                    run.append((n, ctx._replace(saved_subgraph=self.subgraph_saved), attrs))
            return body_saved(g, run, self.tensors, float_inits | self.stored, self.where)
        finally:
            self._scopes.pop()

    def graph(self, g: onnx.GraphProto) -> Cost:
        """Total cost of one run of a subgraph (its nodes are in topological order, as ONNX requires)."""
        total = ZERO
        for i, proto in enumerate(g.node):
            name = graph_mod.node_label(proto, i)
            n = self.node(proto, i, name, self.attributes_of(proto, name))
            if n.status == UNSUPPORTED:
                key = op_key(n.domain, n.op_type)
                self.nested_unsupported[key] = self.nested_unsupported.get(key, 0) + 1
            total = total + n.cost
        return total


def _apply(fn, ctx: NodeContext, attrs: Mapping[str, Any], where: str) -> Cost:
    try:
        return fn(ctx, **attrs)
    except FlopcountError as e:
        if str(e).startswith(f"{where}: "):  # raised inside a nested body, already located
            raise
        raise type(e)(f"{where}: {e}") from None
    except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as e:
        raise InvalidGraphError(
            f"{where}: node {ctx.name!r} ({ctx.op_type}): its inputs or attributes do not fit the operator "
            f"({type(e).__name__}: {e}); check the node against the ONNX spec"
        ) from None


#: The operators whose trip count (or sequence length) ``loop_trips`` gives.
_LOOPS = frozenset({"Loop", "SequenceMap"})


def _check_loop_trips(graph: onnx.GraphProto, index: GraphIndex, loop_trips, where: str) -> None:
    """A :class:`UsageError` for a ``loop_trips`` name that is no Loop or SequenceMap node of the graph (or of a
    body in it): the setting would do nothing."""
    if not loop_trips:
        return
    loops = {index.names[k] for k, (_, op) in enumerate(index.node_ops) if op in _LOOPS}
    bodies = list(graph_mod.walk_graphs(graph))[1:]
    loops |= {n.name for g in bodies for n in g.node if n.op_type in _LOOPS}
    unknown = sorted(set(loop_trips) - loops)
    if unknown:
        named = f"its Loop and SequenceMap nodes: {', '.join(sorted(loops))}" if loops else \
            "it has no Loop or SequenceMap node"
        raise UsageError(f"{where}: --loop-trips {unknown[0]}=...: no Loop or SequenceMap node of the graph is named "
                         f"{unknown[0]!r}, so the trip count would change nothing; {named}")


def _opsets(m: ModelProto) -> dict[str, int]:
    return {canonical_domain(i.domain): i.version for i in m.opset_import}


def _shapeless_source(index: GraphIndex, failed: int, tensors: Mapping[str, TensorInfo], where: str) -> ShapeError | None:
    """The error to give when node ``failed`` cannot be counted for want of a shape that an operator unknown
    to every shape inference left out: the first such node upstream (or ``failed`` itself), an operator
    whose inputs are known and whose outputs are not. None when there is none (the usual message applies)."""
    import networkx as nx  # only here, on an error's path

    order = {k: n for n, k in enumerate(index.order)}
    ops, node_inputs, node_outputs = index.node_ops, index.node_inputs, index.node_outputs
    known = lambda name: not name or (tensors.get(name) is not None and tensors[name].is_static)  # noqa: E731
    for k in sorted(nx.ancestors(index.dag, failed) | {failed}, key=order.__getitem__):
        domain, op_type = ops[k]
        if onnx.defs.has(op_type, domain) or not all(map(known, node_inputs[k])):
            continue
        unknown = [o for o in node_outputs[k] if not known(o)]
        if unknown:
            name, downstream = index.names[k], index.names[failed]
            after = "" if k == failed else f"; node {downstream!r} ({ops[failed][1]}) after it cannot be counted"
            why = ("its shape function cannot tell its output shapes from its inputs and attributes"
                   if lookup_shape(domain, op_type) else "no shape inference knows this operator")
            return ShapeError(
                f"{where}: node {name!r} ({op_type}, domain {domain or 'ai.onnx'}): {why}, so the shape of its output "
                f"{unknown[0]!r} is unknown{after}. Give its output shapes in "
                "the model's value_info (onnxruntime.tools.symbolic_shape_infer writes them for the operators it knows)"
            )
    return None


#: Tree ensembles of ``ai.onnx.ml``: their shape inference reads the labels and target counts, never the node lists.
_TREE_ENSEMBLES = frozenset({"TreeEnsembleClassifier", "TreeEnsembleRegressor", "TreeEnsemble"})


def _for_inference(model: ModelProto) -> ModelProto:
    """``model``, or a copy for shape resolution whose top-level tree ensembles hold one value of each long node
    list (:func:`~flopcount.pipeline.loading.shortened`; class labels kept): ONNX's inference serializes the model it is
    given and parses what it infers, two more copies of a 200 MB ensemble."""
    g = model.graph
    heavy = [i for i, n in enumerate(g.node) if n.op_type in _TREE_ENSEMBLES and n.domain == "ai.onnx.ml"
             and any(map(is_long, n.attribute))]
    if not heavy:
        return model
    light = ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            copy_field(light, field, value)
    for field, value in g.ListFields():
        if field.name != "node":
            copy_field(light.graph, field, value)
    at = set(heavy)
    for i, node in enumerate(g.node):
        if i in at:
            light.graph.node.append(shortened(node, keep=("classlabels_int64s", "classlabels_strings")))
        else:
            light.graph.node.add().CopyFrom(node)
    return light


def _names_matching(entries: Collection[str] | None, names: Collection[str], what: str, where: str) -> frozenset[str]:
    """The names among ``names`` that ``entries`` give: each entry is a name or a shell-style pattern
    (``encoder.*``, ``*.bias``); an entry that matches nothing is an error naming it."""
    if entries is None:
        return frozenset()
    if isinstance(entries, str) or not isinstance(entries, Collection):
        raise UsageError(f"{what} must be a collection of initializer names or patterns, not {type(entries).__name__}")
    found: set[str] = set()
    unknown = []
    for entry in entries:
        hits = [n for n in names if n == entry or fnmatch.fnmatchcase(n, entry)]
        if not hits:
            unknown.append(entry)
        found.update(hits)
    if unknown:
        shown = ", ".join(map(repr, unknown[:5])) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise UsageError(
            f"{where}: {what} {shown} {'matches' if len(unknown) == 1 else 'match'} no floating-point initializer "
            "or Constant of the main graph; give the names (or shell patterns such as 'encoder.*') of the exported "
            "weights"
        )
    return frozenset(found)


def _roles(m: ModelProto, opsets, trainable: Collection[str] | None, given: frozenset, where: str,
           frozen: Collection[str] | None = None, index: GraphIndex | None = None) -> Roles:
    """Parameters, buffers and constants of the main graph. ``trainable`` (names or patterns), when given,
    are the parameters, all trained; the graph's rule sorts the rest, and what it would call a parameter
    is then a buffer (a frozen weight, Keras' moving statistics). ``frozen`` (names or patterns) are
    parameters that are not trained: buffers too. Inputs whose values the user gave (``given``) have no
    role."""
    if trainable is None and not frozen:
        return classify(m, opsets, (), given, index)
    stored = [n for n, v in stored_tensors(m.graph).items() if v[0] not in SHAPE_TYPES and n not in given]
    named = _names_matching(trainable, stored, "trainable", where)
    cold = _names_matching(frozen, stored, "frozen", where)
    roles = classify(m, opsets, named, given, index)  # a Constant named trainable is a parameter
    if trainable is None and not cold:
        return roles
    if trainable is None:
        named = frozenset(n for n, r in roles.roles.items() if r == PARAMETER)
    named -= cold
    # the framework's other weights (frozen ones, Keras' moving statistics) are state it does not train
    return Roles({n: PARAMETER if n in named else BUFFER if r == PARAMETER else r for n, r in roles.roles.items()},
                 roles.sizes)


def _report(graph: _Graph, conv: Convention, forward: _Forward, trained: _Trained | None, memory,
            options: CountOptions, timings: Mapping[str, float]) -> Report:
    """The immutable report of the count, made once from the stages' records."""
    m, res, roles, batch = graph.model, graph.res, graph.roles, options.batch
    if batch is None:  # 0 for an empty first input: per-sample figures are then None
        batch = next((t.shape[0] for t in res.inputs if t.shape and isinstance(t.shape[0], int)), 1)
    info = ModelInfo(
        path=graph.loaded.path,
        graph_name=m.graph.name,
        ir_version=m.ir_version,
        opsets=MappingProxyType(dict(graph.opsets)),
        producer=" ".join(x for x in (m.producer_name, m.producer_version) if x),
        inputs=res.inputs,
        outputs=tuple(res.tensors.get(o.name, TensorInfo(o.name)) for o in m.graph.output),
    )
    training = {} if trained is None else dict(
        mode="train", backward=trained.backward, backward_unsupported=trained.backward_unsupported,
        trainable_params=trained.trainable_params, optimizer=trained.optimizer)
    return Report(
        model=info,
        convention=conv,
        batch=batch,
        forward=sum_costs(n.cost for n in forward.nodes),
        params=roles.total(PARAMETER),
        buffers=roles.total(BUFFER),
        nodes=forward.nodes,
        by_op_type=forward.by_op_type,
        unsupported=forward.unsupported,
        modules=graph.scopes,
        attention="full" if conv.executed is None else f"executed: {conv.executed.note}",
        memory=memory,
        timings=MappingProxyType(timings),
        **training,
    )
