"""Which stored tensors of a graph are parameters, buffers or constants, from how the graph uses them.

An exported graph stores three kinds of tensors side by side, all as initializers (or ``Constant``
nodes): the model's **parameters** (what a framework's ``parameters()`` yields and training updates),
its **buffers** (state that is not trained: BatchNormalization's running mean and variance) and
**constants** the exporter folded (rotary cos/sin tables, ``Pow`` exponents, epsilons, GELU
coefficients, mask fill values, folded attention masks and position biases). Their bytes cannot tell
them apart, and flopcount never reads them anyway: the role comes from the positions that consume the
tensor, looking through operators that only move, reshape or convert data (``Transpose``,
``Reshape``, ``Slice``, ``Expand``, ``Cast``, ``DequantizeLinear`` ...). Per use:

* an input the ONNX schema calls non-differentiable (shapes, axes, indices): no role;
* a position the op's backward registration declares a buffer (BatchNormalization's mean and
  variance, rotary caches): **buffer**, unless it is a scalar (a ratio: constant);
* the exponent of ``Pow``, the values ``Where`` selects between, and a single value broadcast
  (``Expand``, ``Tile``) into a tensor (a fill): **constant**;
* an operand of an element-wise op (``Add``, ``Mul``, ``Sub``, ``Div``, activations): a
  **constant** when it is a single value (epsilons, GELU coefficients, attention scales) but one
  added to a product's output (the bias of a ``Linear(d, 1)`` head: a **parameter**), when it
  is a ``Mul``/``Div`` factor that varies along more than one axis (rotary cos/sin tables, fixed
  windows), or an ``Add``/``Sub`` term over several axes added to attention scores (its sum feeds a
  ``Softmax``: a mask or a folded position bias); otherwise a **parameter** (a bias, a normalization
  or layer scale varying along one axis, a learned position embedding added to activations);
* any other differentiable input (Conv, Gemm and MatMul operands, normalization scale and bias,
  recurrent weights, Gather's embedding table, PRelu's slope, Concat's learned tokens): **parameter**.

A tensor is a parameter when any use says so, else a buffer when any use says so, else a constant.
``Constant`` nodes follow the same rule in graphs that keep no weights in initializers (Paddle2ONNX,
spox, jax2tf store weights that way); where initializers hold the weights, a ``Constant`` is a
literal of the forward code (a grid, a range, anchors, a scale vector), never a parameter (unless
named in ``trainable=``).
Frameworks know better: :func:`flopcount.count`'s ``trainable=`` names the parameters outright (the
PyTorch frontend passes the module's ``named_parameters()``), and the rule then only sorts the rest.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from math import prod
from operator import itemgetter
from collections.abc import Collection, Mapping, Sequence

import onnx
from onnx import ModelProto, TensorProto

from ..registry import buffer_inputs, canonical_domain, lookup, quantized_data
from .graph import GraphIndex
from .schema import differentiable_inputs

PARAMETER, BUFFER, CONSTANT = "parameter", "buffer", "constant"

# Initializer types that hold shapes and indices rather than weights.
SHAPE_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL, TensorProto.STRING})

# Operators through which a stored tensor reaches its real consumer unchanged in meaning: input 0 is
# moved, re-laid out, converted or (de)quantized; the other inputs are shapes, axes and scales.
_PASS_THROUGH = frozenset({
    "Identity", "Cast", "CastLike", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Expand",
    "Slice", "Split", "Tile", "DequantizeLinear", "Optional", "OptionalGetElement",
})  # fmt: skip
_MS_PASS_THROUGH = frozenset({"DequantizeLinear"})  # com.microsoft's DequantizeLinear, as ONNX's
_BROADCAST = frozenset({"Expand", "Tile"})
# Element types of quantized weights, and the element-wise ops that dequantize them when a graph spells
# dequantization out (Cast → Sub zero point → Mul scale): op → the positions that carry the data.
QUANTIZED_TYPES = frozenset(getattr(TensorProto, t) for t in ("INT8", "UINT8", "INT16", "UINT16", "INT4", "UINT4")
                            if hasattr(TensorProto, t))
_INTEGER_PRODUCTS = frozenset({"MatMulInteger", "ConvInteger"})
_DEQUANTIZING = {"Sub": frozenset({0}), "Div": frozenset({0}), "Mul": frozenset({0, 1})}
_SOFTMAX = frozenset({"Softmax", "LogSoftmax"})
# Fused ops whose input (position) is a term added to attention scores before their softmax.
_SCORE_BIAS = {("com.microsoft", "BiasSoftmax"): 1}
_ADDITIVE = frozenset({"Add", "Sub"})
_SCALING = frozenset({"Mul", "Div"})


@dataclass(frozen=True)
class Roles:
    """Role of every stored tensor that is not shape-like: name → :data:`PARAMETER`,
    :data:`BUFFER` or :data:`CONSTANT`; ``sizes`` gives their element counts (from dims)."""

    roles: Mapping[str, str]
    sizes: Mapping[str, int]

    def names(self, role: str) -> frozenset[str]:
        return frozenset(n for n, r in self.roles.items() if r == role)

    def total(self, role: str) -> int:
        return sum(self.sizes[n] for n, r in self.roles.items() if r == role)


def stored_tensors(graph: onnx.GraphProto, index: GraphIndex | None = None) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Name → (elem_type, dims) of a graph's initializers and ``Constant`` node tensors (dims read
    from the protos, never the data). ``index``: ``graph`` as :func:`flopcount.pipeline.graph.build_graph` read it,
    whose initializer dims and node ops are not read from the protos again."""
    if index is None:
        out = {t.name: (t.data_type, tuple(t.dims[:])) for t in graph.initializer}
        constants = (node for node in graph.node if node.op_type == "Constant")
    else:
        out = dict(index.initializer_types)
        constants = (index.protos[i] for i, (_, op) in enumerate(index.node_ops) if op == "Constant")
    for sp in graph.sparse_initializer:
        out[sp.values.name] = (sp.values.data_type, tuple(sp.dims))
    for node in constants:
        if node.domain in ("", "ai.onnx") and len(node.output) == 1:
            for a in node.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    out[node.output[0]] = (a.t.data_type, tuple(a.t.dims))
                elif a.name == "sparse_value":
                    out[node.output[0]] = (a.sparse_tensor.values.data_type, tuple(a.sparse_tensor.dims))
                elif a.name in ("value_float", "value_floats"):
                    n = 1 if a.name == "value_float" else len(a.floats)
                    out[node.output[0]] = (TensorProto.FLOAT, () if a.name == "value_float" else (n,))
    return out


def subgraphs(graph: onnx.GraphProto, nodes: Sequence[onnx.NodeProto] | None = None) -> list[onnx.GraphProto]:
    """The bodies of ``graph``'s If, Loop, Scan (any graph attribute), nested ones included, outermost first;
    ``nodes``: those of its nodes that may hold bodies, where known (None: all)."""
    out = []
    for node in graph.node if nodes is None else nodes:
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                out.append(sub)
                out.extend(subgraphs(sub))
    return out


def classify(
    model: ModelProto,
    opsets: Mapping[str, int],
    given: Collection[str] = (),
    excluded: Collection[str] = (),
    index: GraphIndex | None = None,
) -> Roles:
    """Roles of the main graph's stored tensors (see the module docstring). ``given`` names tensors
    known to be parameters; ``excluded`` (inputs whose values the user gave) get no role.
    ``index``: the main graph as :func:`flopcount.pipeline.graph.build_graph` read it, so that its node lists are not read
    from the protos again (None: they are read here)."""
    if index is None:
        protos = list(model.graph.node)
        node_ops = [(n.domain, n.op_type) for n in protos]
        node_inputs, node_outputs = [tuple(n.input[:]) for n in protos], [tuple(n.output[:]) for n in protos]
        bodies: Sequence[int] = range(len(protos))  # any node may hold a subgraph
    else:
        protos, node_ops, bodies = index.protos, index.node_ops, index.bodies
        node_inputs, node_outputs = index.node_inputs, index.node_outputs
    inner = subgraphs(model.graph, [protos[k] for k in bodies])  # weights stored in If/Loop/Scan bodies are weights too
    every = stored_tensors(model.graph, index)
    for g in inner:
        every.update(stored_tensors(g))
    stored = _candidates(every, node_ops, node_inputs, excluded)
    quantized = {n for n, (t, _) in stored.items() if t in QUANTIZED_TYPES}
    consumers = _consumers(stored, quantized, protos, node_ops, node_inputs, node_outputs, bodies)
    dequantizing = _dequantizing(quantized, consumers, every) if quantized else {}
    rules = _RoleRules(opsets, consumers, dequantizing, _rescaled(node_ops, node_inputs, node_outputs),
                       _products(node_ops, node_outputs))
    initializers = set(index.initializers) if index is not None else {t.name for t in model.graph.initializer} | {
        sp.values.name for sp in model.graph.sparse_initializer}
    initializers.update(t.name for g in inner for t in g.initializer)
    initializers.update(sp.values.name for g in inner for sp in g.sparse_initializer)
    roles = {name: rules.role_of(name, dims, False) for name, (_, dims) in stored.items() if name in initializers}
    # A graph that keeps its weights in initializers writes the literals of the forward code (grids,
    # ranges, anchors, scale vectors) as Constant nodes: never parameters. A graph without weight
    # initializers (Paddle2ONNX, spox, jax2tf) stores its weights as Constant nodes: the rule applies.
    literal = PARAMETER in roles.values()
    for name, (_, dims) in stored.items():
        if name not in initializers:
            roles[name] = rules.role_of(name, dims, literal)
    for name in given:
        if name in stored:
            roles[name] = PARAMETER
    return Roles(roles, {n: prod(d) for n, (_, d) in stored.items()})


def _candidates(every: Mapping[str, tuple[int, tuple[int, ...]]], node_ops, node_inputs,
                excluded: Collection[str]) -> dict[str, tuple[int, tuple[int, ...]]]:
    """The stored tensors that may be weights: not shapes or indices, and not ``excluded``."""
    # int32 tensors are shapes and indices, except a quantized product's bias (QLinearConv's B, or one
    # that DequantizeLinear turns into a float bias in QDQ graphs)
    data_of = {kind: data for kind in set(node_ops) if (data := quantized_data(*kind))}  # looked up once per kind
    int_data = {inputs[p] for kind, inputs in zip(node_ops, node_inputs) if (data := data_of.get(kind))
                for p in range(len(inputs)) if p in data} if data_of else set()
    int_data.update(inputs[0] for (_, op), inputs in zip(node_ops, node_inputs) if op == "DequantizeLinear" and inputs)
    return {n: v for n, v in every.items()
            if (v[0] not in SHAPE_TYPES or v[0] == TensorProto.INT32 and n in int_data) and n not in excluded}


def _consumers(stored: Mapping, quantized: set[str], protos, node_ops, node_inputs, node_outputs,
               bodies: Sequence[int]) -> dict[str, list]:
    """Tensor name → its ``(node, input position)`` uses, in the main graph and (as protos) in subgraphs."""
    # only these consumers are looked up: of stored tensors, of what pass-through ops make of them, of
    # sums (whether a stored term of a sum is added to attention scores: _feeds_softmax) and, in graphs
    # holding integer weights, of what may dequantize them
    through = _PASS_THROUGH | _ADDITIVE | (_DEQUANTIZING.keys() if quantized else frozenset())
    wanted = set(stored).union(*(outs for (_, op), outs in zip(node_ops, node_outputs) if op in through))
    uses: defaultdict[str, list] = defaultdict(list)  # no list made per use, as setdefault would
    disjoint = wanted.isdisjoint
    for (domain, op), inputs, outputs in zip(node_ops, node_inputs, node_outputs):
        if disjoint(inputs):
            continue
        view = _NodeView((domain, op, inputs, outputs))
        i = 0
        for name in inputs:
            if name in wanted:
                uses[name].append((view, i))
            i += 1
    consumers: dict[str, list] = dict(uses)
    for k in bodies:  # subgraph consumers, as protos
        for a in protos[k].attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                _index(sub, consumers)
    return consumers


_SOFTMAX_CHECK = "softmax?"  # the role depends on where the node's output goes


class _RoleRules:
    """The role each use of a stored tensor gives it, from the operator, the input position and the tensor's
    dims; what a use gives is cached per key, as most uses repeat."""

    def __init__(self, opsets: Mapping[str, int], consumers: Mapping, dequantizing: Mapping[int, frozenset[int]],
                 rescaled: frozenset[str], products: frozenset[str] = frozenset()):
        self.opsets, self.consumers, self.dequantizing, self.rescaled = opsets, consumers, dequantizing, rescaled
        self.products = products
        self.static: dict[tuple, str | None] = {}
        self.shapes: dict[tuple[int, ...], tuple[bool, bool]] = {}  # dims → (single value, varies along several axes)

    def static_role(self, node, pos: int, single: bool, several_axes: bool, spread: bool) -> str | None:
        """The role a use gives, from the operator, the position and the tensor's dims alone."""
        domain = canonical_domain(node.domain)
        op = node.op_type
        data = quantized_data(domain, op)
        if data is not None:  # a quantized operand or bias is a parameter; its scale and zero point are not
            return (CONSTANT if single else PARAMETER) if pos in data else None
        if pos in buffer_inputs(domain, op):
            return CONSTANT if single else BUFFER
        if not differentiable_inputs(op, self.opsets.get(domain, 0), domain, len(node.input))[pos]:
            return None
        if op == "Pow" and pos == 1 or op == "Where":
            return CONSTANT
        if op == "PRelu":
            return PARAMETER
        if _SCORE_BIAS.get((domain, op)) == pos and several_axes:
            return CONSTANT  # as Add into Softmax below
        if spread and single:
            return CONSTANT  # one value broadcast into a tensor: a fill (a mask's ones, a padding value)
        rule = lookup(domain, op)
        if rule is not None and rule.family == "elementwise":
            if single:
                return CONSTANT
            if not several_axes:
                return PARAMETER
            if op in _SCALING:
                return CONSTANT
            if op in _ADDITIVE:
                return _SOFTMAX_CHECK
            return PARAMETER
        return PARAMETER

    def use_role(self, node, pos: int, single: bool, several_axes: bool, spread: bool) -> str | None:
        if id(node) in self.dequantizing:
            return None  # the scale or zero point of a spelled-out dequantization
        if node.op_type == "Mul" and not self.rescaled.isdisjoint(node.input):
            return None  # a weight's scale, multiplying a dynamic scale or an integer product
        key = (node.domain, node.op_type, len(node.input), pos, single, several_axes, spread)
        static = self.static
        role = static.get(key, static)
        if role is static:
            role = static[key] = self.static_role(node, pos, single, several_axes, spread)
        if role is _SOFTMAX_CHECK:
            return CONSTANT if _feeds_softmax(node, self.consumers) else PARAMETER
        if role == CONSTANT and single and not spread and node.op_type == "Add" and node.domain in ("", "ai.onnx") \
                and any(j != pos and name in self.products for j, name in enumerate(node.input)):
            return PARAMETER  # the one-element bias of a product with one output (a Linear(d, 1) head)
        return role

    def role_of(self, name: str, dims: tuple[int, ...], literal: bool) -> str:
        shape = self.shapes.get(dims)  # most weights share their dims with others
        if shape is None:
            shape = self.shapes[dims] = (prod(dims) <= 1, sum(d > 1 for d in dims) > 1)
        single, several_axes = shape
        direct = self.consumers.get(name, ())
        if len(direct) == 1 and not self.dequantizing and not _passes(direct[0][0]):  # one use, as most weights have
            node, pos = direct[0]
            role = self.use_role(node, pos, single, several_axes, False)
            return CONSTANT if role is None or role == PARAMETER and literal else role
        found: set[str] = set()
        for node, pos, spread in _uses(name, self.consumers, self.dequantizing):
            role = self.use_role(node, pos, single, several_axes, spread)
            if role == PARAMETER and literal:
                role = CONSTANT
            if role is not None:
                found.add(role)
        return PARAMETER if PARAMETER in found else BUFFER if BUFFER in found else CONSTANT


class _NodeView(tuple):
    """What the parameter rule reads of a node (domain, op type, input and output names), from the lists the DAG
    already holds rather than the protobuf message: ``_NodeView((domain, op_type, inputs, outputs))``, a tuple made
    without a Python call, read by name."""

    __slots__ = ()
    domain = property(itemgetter(0))
    op_type = property(itemgetter(1))
    input = property(itemgetter(2))
    output = property(itemgetter(3))


def _index(graph: onnx.GraphProto, consumers: dict) -> None:
    """Consumers of every name, in ``graph`` and its subgraphs (names are unique across scopes)."""
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name:
                consumers.setdefault(name, []).append((node, i))
        for a in node.attribute:
            for sub in [a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs:
                _index(sub, consumers)


def _passes(node) -> bool:
    """Whether ``node`` only moves, converts or dequantizes its input 0."""
    if node.domain in ("", "ai.onnx"):
        return node.op_type in _PASS_THROUGH
    return node.domain == "com.microsoft" and node.op_type in _MS_PASS_THROUGH


def _dequantizing(quantized: set[str], consumers: Mapping, fixed: Collection[str]) -> dict[int, frozenset[int]]:
    """The element-wise nodes (by id) that dequantize stored integer tensors (``quantized``) where a graph
    spells it out, Cast → Sub (zero point) → Mul (scale), each with the input positions that carry the
    data: a weight reaches its product through them, and their other inputs are scales and zero points,
    stored tensors themselves (in ``fixed``, or cast from one). A Mul whose other operand is computed (an
    integer mask applied to activations) dequantizes nothing."""
    found: dict[int, frozenset[int]] = {}
    todo, seen = list(quantized), set(quantized)
    fixed_cast = {o for n in fixed for node, pos in consumers.get(n, ()) if pos == 0 and _passes(node)
                  for o in node.output}
    while todo:
        current = todo.pop()
        for node, pos in consumers.get(current, ()):
            if _passes(node):
                nxt = node.output if pos == 0 else ()
            elif (node.domain in ("", "ai.onnx") and pos in _DEQUANTIZING.get(node.op_type, ())
                  and all(not n or n in fixed or n in fixed_cast or n in seen
                          for j, n in enumerate(node.input) if j != pos)):
                found[id(node)] = found.get(id(node), frozenset()) | {pos}
                nxt = node.output
            else:
                continue
            for o in nxt:
                if o and o not in seen:
                    seen.add(o)
                    todo.append(o)
    return found


#: Products whose output a learned bias is added to.
_BIASED_PRODUCTS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})


def _products(node_ops, node_outputs) -> frozenset[str]:
    """The outputs of the default domain's products (:data:`_BIASED_PRODUCTS`): a single value added to one is a
    learned bias (of a head with one output), not a literal of the forward code."""
    return frozenset(outs[0] for (domain, op), outs in zip(node_ops, node_outputs)
                     if op in _BIASED_PRODUCTS and domain in ("", "ai.onnx") and outs)


def _rescaled(node_ops, node_inputs, node_outputs) -> frozenset[str]:
    """Tensors that a weight's (per-channel) scale multiplies in dynamically quantized graphs: the scales
    DynamicQuantizeLinear computes, and integer products (MatMulInteger, ConvInteger) cast to float."""
    products = {outs[0] for (_, op), outs in zip(node_ops, node_outputs) if op in _INTEGER_PRODUCTS and outs}
    if not products:
        return frozenset()
    out = {outs[1] for (_, op), outs in zip(node_ops, node_outputs) if op == "DynamicQuantizeLinear" and len(outs) > 1}
    out.update(outs[0] for (_, op), ins, outs in zip(node_ops, node_inputs, node_outputs)
               if op == "Cast" and ins and ins[0] in products)
    return frozenset(out)


def _uses(name: str, consumers: Mapping, dequantizing: Mapping[int, frozenset[int]] = {}) -> list[tuple[onnx.NodeProto, int, bool]]:
    """The (node, input position, broadcast on the way) triples that consume ``name``, seen through
    pass-through ops and through the ``dequantizing`` nodes at their data positions."""
    out, seen, todo = [], {name}, [(name, False)]
    while todo:
        current, spread = todo.pop()
        for node, pos in consumers.get(current, ()):
            through = dequantizing.get(id(node)) if dequantizing else None
            if through is not None and pos in through:
                for o in node.output:
                    if o and o not in seen:
                        seen.add(o)
                        todo.append((o, spread))
                continue
            if _passes(node):
                if pos == 0:
                    for o in node.output:
                        if o and o not in seen:
                            seen.add(o)
                            todo.append((o, spread or node.op_type in _BROADCAST))
                continue  # shapes, axes, quantization scales of a pass-through op
            out.append((node, pos, spread))
    return out


def _feeds_softmax(node: onnx.NodeProto, consumers: Mapping, depth: int = 4) -> bool:
    """Whether ``node``'s output is a Softmax's input, directly or through pass-through ops
    (attention scores: what is added to them is a mask or a position bias)."""
    frontier = [o for o in node.output if o]
    for _ in range(depth):
        nxt = []
        for name in frontier:
            for user, _pos in consumers.get(name, ()):
                if user.op_type in _SOFTMAX:
                    return True
                if user.op_type in _PASS_THROUGH:
                    nxt.extend(o for o in user.output if o)
        frontier = nxt
    return False
