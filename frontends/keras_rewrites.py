"""The rewrites of a tf2onnx graph that make a Keras model count as its PyTorch twin (see
:mod:`flopcount.frontends.keras`): the inference BatchNormalization and the LayerNormalization Keras computes from
their variables and moments written as the ONNX operators, a negation multiplied by a constant folded into it,
element-wise arithmetic by an identity element removed, constants nothing reads dropped, and the weights made
initializers of a file that is never written. Plain ONNX: nothing here imports TensorFlow."""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence
from typing import Any

import onnx

from flopcount.pipeline.graph import walk_graphs

__all__ = ["drop_identity_arithmetic", "drop_unread_constants", "fold_negations", "fuse_batch_norms",
           "fuse_layer_norms", "initializers_to_constants", "weights_to_initializers"]

log = logging.getLogger(__name__)


def _read_by_subgraphs(graph) -> set[str]:
    """Names the nodes of ``graph``'s subgraphs (If/Loop/Scan bodies, at any depth) read."""
    return {name for g in walk_graphs(graph) if g is not graph for node in g.node for name in node.input}


class _Patterns:
    """What the normalization rewrites look up in a converted graph: the producer and readers of each tensor, the
    constants the trace made (never the variables), inferred shapes, and the parameters they read."""

    def __init__(self, model: onnx.ModelProto, variables: set[str]) -> None:
        graph = model.graph
        self.graph, self.variables = graph, variables
        self.producer = {out: node for node in graph.node for out in node.output}
        self.readers: dict[str, list] = {}
        for node in graph.node:
            for name in node.input:
                self.readers.setdefault(name, []).append(node)
        for value in graph.output:
            self.readers.setdefault(value.name, []).append(None)
        for name in _read_by_subgraphs(graph):  # an If/Loop body reading an outer tensor: a reader outside
            self.readers.setdefault(name, []).append(None)
        self.constants = {t.name: t for t in graph.initializer if t.name not in variables}
        inferred = onnx.shape_inference.infer_shapes(model)
        self.shapes = {
            v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
            for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
            if v.type.tensor_type.HasField("shape")
        }

    def made(self, name: str, op_type: str):
        """The node of type ``op_type`` that writes ``name``; None if another kind of node or none does."""
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type else None

    @staticmethod
    def split(node, first) -> tuple[str, str] | None:
        """The two inputs of ``node``, the one ``first(name)`` accepts first; None when neither is accepted."""
        if node is None or len(node.input) != 2:
            return None
        a, b = node.input
        return (a, b) if first(a) else (b, a) if first(b) else None

    def constant(self, name: str):
        """The value of a constant the trace made (epsilon, reduction axes; never a variable), or None."""
        from onnx import numpy_helper

        return numpy_helper.to_array(self.constants[name]) if name in self.constants else None

    def parameter(self, name: str, rank: int) -> tuple[str, int, int, list] | None:
        """``(variable, channels, axis, reshape nodes)`` for a per-channel variable read as it is (along the last
        axis of a rank-``rank`` tensor) or through a ``Reshape`` to ``[1, .., C, .., 1]`` of that rank."""
        reshape = self.made(name, "Reshape")
        source = reshape.input[0] if reshape is not None else name
        dims = self.shapes.get(source) if source in self.variables else None
        if dims is None or len(dims) != 1 or not dims[0]:
            return None
        if reshape is None:
            return source, dims[0], rank - 1, []
        out = self.shapes.get(name)
        if out is None or len(out) != rank or sorted(out) != [1] * (rank - 1) + [dims[0]] or dims[0] == 1:
            return None
        return source, dims[0], out.index(dims[0]), [reshape]

    def internal(self, nodes: Sequence[Any], last) -> bool:
        """Whether every output of ``nodes`` but ``last``'s is read only by ``nodes``."""
        inside = {id(node) for node in nodes}
        return all(reader is not None and id(reader) in inside
                   for node in nodes if node is not last for reader in self.readers.get(node.output[0], []))

    def replace(self, fusions: Sequence[tuple[Any, Sequence[Any], Sequence[Any]]]) -> None:
        """Apply ``(last node, nodes removed, nodes written in last's place)`` rewrites, in place."""
        dropped = {id(node) for _, removed, _ in fusions for node in removed}
        written = {id(last): nodes for last, _, nodes in fusions}
        kept = []
        for node in self.graph.node:
            if id(node) in written:
                kept.extend(written[id(node)])
            elif id(node) not in dropped:
                kept.append(node)
        del self.graph.node[:]
        self.graph.node.extend(kept)


def fuse_batch_norms(model: onnx.ModelProto, variables: set[str]) -> None:
    """Write, in place, each inference BatchNormalization as the ONNX ``BatchNormalization`` operator.

    Keras 3 computes an inference batch norm (``tf.nn.batch_normalization``) as ``y = x·inv + (beta − mean·inv)``
    with ``inv = gamma · 1/sqrt(var + eps)``; tf2onnx writes that as ``Add``, ``Sqrt``, ``Reciprocal`` and three
    ``Mul`` and a ``Sub`` on the per-channel variables, then a ``Mul`` and an ``Add`` on the activations (2 FLOPs
    per element, where ONNX's ``BatchNormalization``, which the PyTorch exporters write for the same layer, counts
    1). Where exactly that pattern reads four per-channel variables (``gamma``, ``beta``, moving mean and
    variance; as they are, or reshaped to broadcast along one axis, as Keras does for ``axis=3`` or
    ``axis=1``) and a constant epsilon, and its intermediate tensors feed nothing else, it is replaced by
    ``BatchNormalization(x, gamma, beta, mean, var, epsilon)``, which computes the same; where the channels are
    not on axis 1 (Keras's default is the last axis) two ``Transpose`` nodes (free) move them there and back.
    Anything else (training-mode batch statistics, ``center=False`` or ``scale=False``) stays as converted.
    """
    from onnx import helper

    view = _Patterns(model, variables)
    made, split, shapes = view.made, view.split, view.shapes
    fusions = []
    for add in model.graph.node:
        if add.op_type != "Add":
            continue
        pair = split(add, lambda n: made(n, "Mul") is not None)
        if pair is None or made(pair[1], "Sub") is None:
            continue
        xs, shift = made(pair[0], "Mul"), made(pair[1], "Sub")
        mean_inv = made(shift.input[1], "Mul")
        if mean_inv is None:
            continue
        found = split(xs, lambda n: made(n, "Mul") is not None and n in mean_inv.input)
        if found is None:
            continue
        inv, x = made(found[0], "Mul"), found[1]
        mean = mean_inv.input[1] if mean_inv.input[0] == inv.output[0] else mean_inv.input[0]
        found = split(inv, lambda n: made(n, "Reciprocal") is not None)
        if found is None:
            continue
        reciprocal, gamma = made(found[0], "Reciprocal"), found[1]
        sqrt = made(reciprocal.input[0], "Sqrt")
        var_eps = made(sqrt.input[0], "Add") if sqrt is not None else None
        found = split(var_eps, lambda n: n in view.constants)
        rank = len(shapes.get(x) or ())
        if found is None or rank < 2 or shapes.get(add.output[0]) != shapes.get(x):
            continue
        eps = view.constant(found[0])
        params = [view.parameter(name, rank) for name in (gamma, shift.input[0], mean, found[1])]
        if eps.size != 1 or None in params or len({(c, axis) for _, c, axis, _ in params}) != 1:
            continue
        channels, axis = params[0][1], params[0][2]
        if axis == 0 or shapes[x][axis] != channels:
            continue
        removed = [var_eps, sqrt, reciprocal, inv, mean_inv, shift, xs, add, *(n for *_, ns in params for n in ns)]
        if not view.internal(removed, add):
            continue
        names, epsilon, base = [name for name, *_ in params], float(eps.reshape(())), add.name or add.output[0]
        if axis == 1:
            fusions.append((add, removed, [helper.make_node("BatchNormalization", [x, *names], [add.output[0]],
                                                            name=base, epsilon=epsilon)]))
            continue
        to_first = [0, axis, *(i for i in range(1, rank) if i != axis)]
        back = sorted(range(rank), key=to_first.__getitem__)
        fusions.append((add, removed, [
            helper.make_node("Transpose", [x], [f"{base}/channels_first"], name=f"{base}/channels_first",
                             perm=to_first),
            helper.make_node("BatchNormalization", [f"{base}/channels_first", *names], [f"{base}/normalized"],
                             name=base, epsilon=epsilon),
            helper.make_node("Transpose", [f"{base}/normalized"], [add.output[0]], name=f"{base}/channels_back",
                             perm=back),
        ]))
    if fusions:
        view.replace(fusions)
        log.debug("wrote %d Keras batch norm(s) as ONNX BatchNormalization", len(fusions))


#: The first opset of the default domain that has the ``LayerNormalization`` operator.
_LAYER_NORM_OPSET = 17


def fuse_layer_norms(model: onnx.ModelProto, variables: set[str]) -> None:
    """Write, in place, each Keras LayerNormalization as the ONNX ``LayerNormalization`` operator.

    Keras 3 computes a layer norm (``ops.layer_normalization``) from the moments of ``x`` over the normalized
    axes: ``inv = gamma · 1/sqrt(mean((x − mean)²) + eps)``, ``y = x·inv + (−mean·inv + beta)``. tf2onnx writes
    that as two ``ReduceMean``, a ``Sub`` and a ``Mul`` for the moments, ``Add``, ``Sqrt`` and ``Reciprocal`` per
    row, a ``Neg`` and three ``Mul`` and two ``Add`` (9 FLOPs per element and 4 per row, where ONNX's
    ``LayerNormalization``, which the PyTorch exporters write for the same layer, counts 1 per element). Where
    exactly that pattern normalizes the trailing axes of ``x`` with variables of the normalized shape (as they are,
    or reshaped to broadcast) and a constant epsilon, and its intermediate tensors feed nothing else, it is
    replaced by ``LayerNormalization(x, gamma, beta, axis, epsilon)``, which computes the same; the variables keep
    their names. Without ``beta`` (``center=False``) the operator's optional B is left out; without ``gamma``
    (``scale=False``) its Scale, which it requires, is ones, as the PyTorch exporter writes it for
    ``LayerNorm(elementwise_affine=False)``, made by a ``ConstantOfShape`` (free), so that they are no initializer,
    which the report would count as a buffer of the model.

    After a convolution tf2onnx computes the moments, one or both, in the convolution's NCHW layout, on the tensor
    that a ``Transpose`` turns into ``x``, and moves the per-row statistics between the layouts with ``Reshape``
    nodes; where the transpose keeps the order of the other axes, the statistics keep theirs, so that is the same
    computation, and it is fused too. Without gamma it computes the products in NCHW too, and moves them to the
    result's layout with a ``Transpose`` each (or, without beta either, the per-row ``−mean·inv`` with a
    ``Reshape``); ``LayerNormalization`` then reads ``x`` transposed to the result's layout (a ``Transpose``, free).
    Anything else stays as converted: axes other than the last ones (``axis=1`` of a sequence); ``rms_scaling``;
    the casts around a half-precision input; several axes without gamma after a convolution (their order differs
    between the layouts); moments shared by several layer norms of one tensor (tf2onnx computes them once); a
    model below opset 17, which has no ``LayerNormalization`` (raising its opset could change what other operators
    mean).
    """
    import numpy as np
    from onnx import helper, numpy_helper

    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < _LAYER_NORM_OPSET or not any(node.op_type == "ReduceMean" for node in model.graph.node):
        return
    view = _Patterns(model, variables)
    fusions, added, claimed = [], [], set()
    for add in model.graph.node:
        if add.op_type != "Add" or len(add.input) != 2:
            continue
        for scaled, shifted in (tuple(add.input), tuple(reversed(add.input))):
            found = _layer_norm(view, add, scaled, shifted)
            if found is not None:
                break
        if found is None or claimed & {id(node) for node in found.removed}:
            continue
        claimed |= {id(node) for node in found.removed}
        base = add.name or add.output[0]
        written, scale = [], found.gamma
        if scale is None:  # ones made by ConstantOfShape: no initializer, so no parameter or buffer
            scale = f"{base}/scale"
            added.append(numpy_helper.from_array(np.array(found.dims, np.int64), f"{scale}/shape"))
            written.append(helper.make_node("ConstantOfShape", [f"{scale}/shape"], [scale], name=scale,
                                            value=numpy_helper.from_array(np.ones(1, found.dtype))))
        x = found.x
        if found.perm is not None:  # x in the result's layout (free)
            x = f"{base}/x"
            written.append(helper.make_node("Transpose", [found.x], [x], name=x, perm=found.perm))
        inputs = [x, scale, *([found.beta] if found.beta is not None else [])]
        fusions.append((add, found.removed, [*written, helper.make_node(
            "LayerNormalization", inputs, [add.output[0]], name=base, axis=found.axis, epsilon=found.epsilon,
        )]))
    if fusions:
        view.replace(fusions)
        model.graph.initializer.extend(added)
        log.debug("wrote %d Keras layer norm(s) as ONNX LayerNormalization", len(fusions))


@dataclasses.dataclass(frozen=True)
class _LayerNorm:
    """A Keras layer norm found by :func:`_layer_norm`: what ``LayerNormalization`` reads, and the nodes it
    replaces."""

    x: str
    perm: list[int] | None  # of the Transpose to the result's layout, where the products are computed in another
    gamma: str | None
    beta: str | None
    axis: int
    epsilon: float
    dims: list[int]
    dtype: Any
    removed: list


def _layer_norm_output_moves(view: _Patterns, scaled: str, shifted: str):
    """The products may be computed in the layout of a convolution's output and moved to the result's layout: each
    by a Transpose, or the per-row −mean·inv (without gamma and beta) by Reshape nodes. ``(perm or None, the
    Transpose nodes, scaled and shifted before them)``, or None where the two moves disagree."""
    out_perm, out_moves = None, []
    transpose = view.made(scaled, "Transpose")
    if transpose is not None:
        out_perm = _perm(transpose)
        if out_perm is None:
            return None
        scaled = transpose.input[0]
        out_moves.append(transpose)
        moved = view.made(shifted, "Transpose")
        if moved is not None:
            if _perm(moved) != out_perm:
                return None
            shifted = moved.input[0]
            out_moves.append(moved)
    return out_perm, out_moves, scaled, shifted


@dataclasses.dataclass(frozen=True)
class _Moments:
    """The statistics of a Keras layer norm: the mean node, the variance node (``mean((x − mean)²)``), the
    ``x − mean`` node, ``1/sqrt(var + eps)`` (``rstd``), gamma (None when not scaled), eps, and every node they use."""

    mean: Any
    variance: Any
    diff: Any
    rstd: str
    gamma: str | None
    eps: Any
    nodes: tuple  # mean, diff, square, variance, plus_eps, sqrt, reciprocal, neg
    times_gamma: Any
    moves: tuple


def _layer_norm_moments(view: _Patterns, negated: str, inv: str) -> _Moments | None:
    """From ``−mean`` and ``inv`` (``1/sqrt(var + eps)``, times gamma when scaled) back to the moments, or None."""
    made = view.made
    # −mean, and the mean of the tensor the moments are computed on; the per-row statistics may pass through
    # Reshape nodes (moves between layouts) anywhere on their way
    moves: list = []
    neg = _through_reshapes(view, negated, "Neg", moves)
    mean = _through_reshapes(view, neg.input[0], "ReduceMean", moves) if neg is not None else None
    if mean is None:
        return None
    # inv: 1/sqrt(var + eps), times gamma when scaled
    times_gamma, gamma = made(inv, "Mul"), None
    rstd = inv
    if times_gamma is not None:
        found = view.split(times_gamma, lambda n: _through_reshapes(view, n, "Reciprocal", []) is not None)
        if found is None:
            return None
        rstd, gamma = found
    reciprocal = _through_reshapes(view, rstd, "Reciprocal", moves)
    sqrt = _through_reshapes(view, reciprocal.input[0], "Sqrt", moves) if reciprocal is not None else None
    plus_eps = _through_reshapes(view, sqrt.input[0], "Add", moves) if sqrt is not None else None
    found = view.split(plus_eps, lambda n: n in view.constants)
    if found is None:
        return None
    eps, variance = view.constant(found[0]), _through_reshapes(view, found[1], "ReduceMean", moves)
    # var = mean((x − mean)²)
    square = made(variance.input[0], "Mul") if variance is not None else None
    if square is None or len(square.input) != 2 or square.input[0] != square.input[1]:
        return None
    diff = made(square.input[0], "Sub")
    if diff is None or len(diff.input) != 2:
        return None
    centred = _through_reshapes(view, diff.input[1], "ReduceMean", moves)
    if centred is not mean or variance is mean:
        return None
    return _Moments(mean, variance, diff, rstd, gamma, eps,
                    (mean, diff, square, variance, plus_eps, sqrt, reciprocal, neg), times_gamma, tuple(moves))


@dataclasses.dataclass(frozen=True)
class _Products:
    """The two products a Keras layer norm adds (found by :func:`_layer_norm_products`): ``x·inv`` (``times_x``) and
    ``−mean·inv`` (``times_mean``, plus ``beta`` in ``plus_beta`` when centered), the tensors they read (``x``,
    ``inv``, ``negated`` = ``−mean``), and their moves: the Transpose to the result's layout (``out_perm``,
    ``out_moves``) and the Reshape nodes between ``times_mean`` and the shift it reads (``shifted_read``)."""

    times_x: Any
    times_mean: Any
    plus_beta: Any
    beta: str | None
    x: str
    inv: str
    negated: str
    out_perm: list[int] | None
    out_moves: list
    shifted_read: str
    shifted_moves: list


def _layer_norm_products(view: _Patterns, scaled: str, shifted: str) -> _Products | None:
    """The products ``scaled + shifted`` adds, ``x·inv`` and ``−mean·inv`` (plus ``beta`` when centered), or None."""
    made = view.made
    moved = _layer_norm_output_moves(view, scaled, shifted)
    if moved is None:
        return None
    out_perm, out_moves, scaled, shifted = moved
    shifted_read, shifted_moves = shifted, []
    times_x = made(scaled, "Mul")
    plus_beta = made(shifted, "Add")
    beta = None
    if plus_beta is not None:
        found = view.split(plus_beta, lambda n: made(n, "Mul") is not None)
        if found is None:
            return None
        times_mean, beta = made(found[0], "Mul"), found[1]
    else:
        times_mean = _through_reshapes(view, shifted, "Mul", shifted_moves)
    if times_x is None or times_mean is None or len(times_x.input) != 2 or len(times_mean.input) != 2:
        return None
    if out_perm is not None and len(out_moves) == 1 and not shifted_moves:
        return None  # the product moved to the result's layout, the shift not
    shared = [name for name in times_x.input if name in times_mean.input]
    if len(shared) != 1 or times_x.input[0] == times_x.input[1] or times_mean.input[0] == times_mean.input[1]:
        return None
    inv = shared[0]
    x = next(name for name in times_x.input if name != inv)
    negated = next(name for name in times_mean.input if name != inv)
    return _Products(times_x, times_mean, plus_beta, beta, x, inv, negated, out_perm, out_moves, shifted_read,
                     shifted_moves)


@dataclasses.dataclass(frozen=True)
class _Axes:
    """The axes a Keras layer norm normalizes (found by :func:`_layer_norm_axes`): ``x``'s static shape, the
    normalized axes as axes of ``x``, and the shape of each moment's input with its reduced axes set to 1."""

    x_shape: list[int]
    axes: list[int]
    reduced: dict[str, list[int]]


def _layer_norm_axes(view: _Patterns, x: str, moments: _Moments) -> _Axes | None:
    """The axes both moments reduce, as axes of ``x``, or None where they differ or reorder the per-row statistics.

    The layouts of the moments: x, and the tensor a Transpose turned into x (a convolution's NCHW output), on which
    tf2onnx may compute either moment. Both reduce the same axes of x; where the transpose keeps the order of the
    other axes, the per-row statistics keep theirs, so Reshape nodes move them from one layout to another."""
    shapes = view.shapes
    x_shape = shapes.get(x)
    if not x_shape or None in x_shape:
        return None
    rank = len(x_shape)
    layouts = {x: list(range(rank))}
    transpose = view.made(x, "Transpose")
    if transpose is not None and _perm(transpose) is not None and len(_perm(transpose)) == rank:
        layouts[transpose.input[0]] = _perm(transpose)
    normalized, reduced = [], {}
    for node, tensor in ((moments.mean, moments.mean.input[0]), (moments.variance, moments.diff.input[0])):
        perm, axes, shape = layouts.get(tensor), _reduce_axes(view, node), shapes.get(tensor)
        if perm is None or axes is None or shape is None or [shape[p] for p in perm] != x_shape:
            return None
        normalized.append(sorted(perm.index(a) for a in axes))  # as axes of x
        reduced[tensor] = [1 if i in axes else d for i, d in enumerate(shape)]
    axes = normalized[0]
    rows = [i for i in range(rank) if i not in axes]
    if normalized[1] != axes or any(_reorders([perm[i] for i in rows]) for tensor, perm in layouts.items()
                                    if tensor in reduced):
        return None
    return _Axes(x_shape, axes, reduced)


def _layer_norm_out_perm(view: _Patterns, add, products: _Products, moments: _Moments,
                         found: _Axes) -> list[int] | None:
    """The permutation of ``x`` that is the result's layout (the normalized axes last, in the order they have in
    ``x``), or None where it is not, or where a tensor between ``x`` and ``add`` has another shape than the fused
    computation's."""
    shapes, x_shape, axes, reduced = view.shapes, found.x_shape, found.axes, found.reduced
    mean, diff = moments.mean, moments.diff
    rank = len(x_shape)
    out_perm = products.out_perm or list(range(rank))
    axis = rank - len(axes)
    out_axes = [i for i in range(rank) if out_perm[i] in axes]
    if len(out_perm) != rank or out_axes != list(range(axis, rank)) or _reorders([out_perm[i] for i in out_axes]):
        return None
    out_shape = [x_shape[p] for p in out_perm]
    row = [1 if i in axes else d for i, d in enumerate(x_shape)]
    if (shapes.get(mean.output[0]) != reduced[mean.input[0]] or shapes.get(diff.input[1]) != reduced[diff.input[0]]
            or shapes.get(products.negated) != row or shapes.get(moments.rstd) != row
            or shapes.get(products.times_x.output[0]) != x_shape or shapes.get(add.output[0]) != out_shape):
        return None
    if products.shifted_moves and (shapes.get(products.times_mean.output[0]) != row or _reorders(out_perm[:axis])
                                   or shapes.get(products.shifted_read) != out_shape[:axis] + [1] * (rank - axis)):
        return None
    return out_perm


def _layer_norm(view: _Patterns, add, scaled: str, shifted: str) -> _LayerNorm | None:
    """The Keras layer norm whose output ``add`` writes as ``scaled + shifted`` (``x·inv`` and ``−mean·inv``,
    plus ``beta`` when centered), or None."""
    products = _layer_norm_products(view, scaled, shifted)
    if products is None:
        return None
    moments = _layer_norm_moments(view, products.negated, products.inv)
    if moments is None:
        return None
    found = _layer_norm_axes(view, products.x, moments)
    if found is None:
        return None
    out_perm = _layer_norm_out_perm(view, add, products, moments, found)
    if out_perm is None:
        return None
    x_shape, axes, eps = found.x_shape, found.axes, moments.eps
    rank = len(x_shape)
    dims = [x_shape[i] for i in axes]
    broadcast = [d if i in axes else 1 for i, d in enumerate(x_shape)]
    parameters = []
    for name in (moments.gamma, products.beta):
        parameter = _normalized_parameter(view, name, dims, broadcast) if name is not None else (None, [])
        if parameter is None:
            return None
        parameters.append(parameter)
    (gamma, gamma_moves), (beta, beta_moves) = parameters
    if eps is None or eps.size != 1 or eps.dtype.kind != "f":
        return None
    removed = list({id(node): node for node in (
        *moments.nodes, products.times_x, products.times_mean, moments.times_gamma, products.plus_beta,
        *moments.moves, *gamma_moves, *beta_moves, *products.out_moves, *products.shifted_moves, add)
        if node is not None}.values())
    if not view.internal(removed, add):
        return None
    perm = None if out_perm == list(range(rank)) else out_perm
    return _LayerNorm(products.x, perm, gamma, beta, -len(axes), float(eps.reshape(())), dims,
                      eps.dtype, removed)


def _perm(transpose) -> list[int] | None:
    """The ``perm`` of a ``Transpose`` node, or None where it has none (reversing the dims)."""
    return next((list(a.ints) for a in transpose.attribute if a.name == "perm"), None)


def _reorders(axes: Sequence[int]) -> bool:
    """Whether ``axes`` are out of increasing order."""
    return list(axes) != sorted(axes)


def _through_reshapes(view: _Patterns, name: str, op_type: str, moves: list):
    """The node of type ``op_type`` that writes ``name``, directly or through ``Reshape`` nodes (appended to
    ``moves``); None when another kind of node writes it."""
    passed = []
    node = view.producer.get(name)
    while node is not None and node.op_type == "Reshape" and op_type != "Reshape":
        passed.append(node)
        node = view.producer.get(node.input[0])
    if node is None or node.op_type != op_type:
        return None
    moves.extend(passed)
    return node


def _reduce_axes(view: _Patterns, node) -> list[int] | None:
    """The sorted non-negative axes a ``ReduceMean`` that keeps its dims reduces (attribute before opset 18, a
    constant input from 18), or None (another kind of reduction, or axes that are not constants)."""
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    rank = len(view.shapes.get(node.input[0]) or ())
    if attributes.get("keepdims", 1) != 1 or not rank:
        return None
    axes = attributes.get("axes")
    if axes is None and len(node.input) > 1:
        constant = view.constant(node.input[1])
        axes = None if constant is None else [int(a) for a in constant.reshape(-1)]
    if not axes:
        return None
    axes = sorted({a % rank for a in axes if -rank <= a < rank})
    return axes if len(axes) == len(set(axes)) and axes else None


def _normalized_parameter(view: _Patterns, name: str, dims: list[int],
                          broadcast: list[int]) -> tuple[str, list] | None:
    """``(variable, reshape nodes)`` for a variable of shape ``dims`` (the normalized dims) read as it is or through
    a ``Reshape``, with the shape ``broadcast`` (the normalized dims in place, 1 elsewhere) or its trailing dims
    after leading 1s; None otherwise."""
    reshape = view.made(name, "Reshape")
    source = reshape.input[0] if reshape is not None else name
    read = view.shapes.get(name)
    if source not in view.variables or view.shapes.get(source) != dims or read is None:
        return None
    leading = len(broadcast) - len(read)
    if leading < 0 or read != broadcast[leading:] or any(d != 1 for d in broadcast[:leading]):
        return None
    return source, [reshape] if reshape is not None else []


def fold_negations(model: onnx.ModelProto, variables: set[str]) -> None:
    """Fold, in place, a ``Neg`` whose only reader multiplies it by a constant the trace made into that constant:
    ``(−x)·c`` is ``x·(−c)``. Keras's exact ``gelu`` computes ``erfc(−x·(1/√2))``; the ``Neg`` is arithmetic on a
    constant that a converter folds (the PyTorch exporter writes ``x/√2``), so the count does not depend on it.
    A variable (a weight) is never folded."""
    from onnx import numpy_helper

    view = _Patterns(model, variables)
    graph = model.graph
    folded, added = set(), []
    for node in graph.node:
        if node.op_type != "Mul":
            continue
        pair = view.split(node, lambda n: view.made(n, "Neg") is not None)
        if pair is None or pair[1] not in view.constants:
            continue
        neg, constant = view.made(pair[0], "Neg"), view.constant(pair[1])
        if constant.dtype.kind != "f" or any(r is not node for r in view.readers.get(neg.output[0], [])):
            continue
        negated = f"{pair[1]}/negated"
        if negated not in view.constants and all(t.name != negated for t in added):
            added.append(numpy_helper.from_array(-constant, negated))
        node.input[list(node.input).index(pair[0])] = neg.input[0]
        node.input[list(node.input).index(pair[1])] = negated
        folded.add(id(neg))
    if folded:
        graph.initializer.extend(added)
        kept = [node for node in graph.node if id(node) not in folded]
        del graph.node[:]
        graph.node.extend(kept)
        log.debug("folded %d negation(s) into constants", len(folded))


#: Element-wise ops whose constant operand can be the identity element.
_IDENTITY_ELEMENT = {"Mul": 1.0, "Add": 0.0, "Sub": 0.0, "Div": 1.0}


def drop_identity_arithmetic(model: onnx.ModelProto, variables: set[str]) -> None:
    """Remove, in place, element-wise arithmetic by a constant identity element (``1.0·x``, ``x + 0``, ``x − 0``,
    ``x / 1``) that Keras traces: the ``beta`` of ``swish``/``silu`` (``x·sigmoid(1.0·x)``), a ``Rescaling``
    offset of 0. They compute nothing; the PyTorch exporters do not write them for the same layers, and
    tf2onnx removes them itself where it folds constants, so whether they appear would depend on the path.

    Only a constant the trace made (never a variable: a weight that happens to be 1 is computed with) whose every
    element is the identity, on the side that does not change the result (``0 − x`` is not ``x``), and whose
    shape does not broadcast the other operand to a larger result, is removed; its output is renamed to the
    operand's name downstream.
    """
    from onnx import numpy_helper

    graph = model.graph
    constants = {t.name: t for t in graph.initializer if t.name not in variables}
    outputs = {v.name for v in graph.output} | _read_by_subgraphs(graph)
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value if d.HasField("dim_value") else None for d in v.type.tensor_type.shape.dim]
              for v in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output)
              if v.type.tensor_type.HasField("shape")}
    renamed: dict[str, str] = {}
    kept = []
    for node in graph.node:
        identity = _IDENTITY_ELEMENT.get(node.op_type)
        sides = (1,) if node.op_type in ("Sub", "Div") else (0, 1)
        operand = None
        if identity is not None and len(node.input) == 2 and node.output[0] not in outputs:
            for side in sides:
                name = node.input[side]
                tensor = numpy_helper.to_array(constants[name]) if name in constants else None
                if tensor is None or tensor.dtype.kind != "f" or not tensor.size or not (tensor == identity).all():
                    continue
                other = node.input[1 - side]
                if shapes.get(other) is not None and shapes.get(other) == shapes.get(node.output[0]):
                    operand = other
                    break
        if operand is None:
            kept.append(node)
            continue
        renamed[node.output[0]] = renamed.get(operand, operand)
    if not renamed:
        return
    for node in kept:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    del graph.node[:]
    graph.node.extend(kept)
    log.debug("dropped %d element-wise operation(s) by a constant 1 or 0", len(renamed))


def drop_unread_constants(model: onnx.ModelProto, variables: set[str]) -> None:
    """Remove, in place, the top-level initializers that are not variables and that no node reads any more (the
    epsilon of a fused batch norm, a dropped identity element)."""
    read = {name for graph in walk_graphs(model.graph) for node in graph.node for name in node.input}
    read |= {v.name for v in model.graph.output}
    kept = [t for t in model.graph.initializer if t.name in variables or t.name in read]
    if len(kept) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)


def initializers_to_constants(model: onnx.ModelProto) -> None:
    """Turn, in place, the initializers tf2onnx wrote (the constants of the traced function: BatchNormalization's
    epsilon, Dropout's rate, reshape targets) into ``Constant`` nodes, so that the initializers of the final graph
    are the model's variables (and, from :func:`~flopcount.frontends.export.make_weightless`, constants of 1 KiB or
    more): flopcount counts initializers as parameters."""
    for graph in walk_graphs(model.graph):
        constants = [onnx.helper.make_node("Constant", [], [tensor.name], name=tensor.name, value=tensor)
                     for tensor in graph.initializer]
        if not constants:
            continue
        nodes = [*constants, *graph.node]
        del graph.initializer[:]
        del graph.node[:]
        graph.node.extend(nodes)


def weights_to_initializers(model: onnx.ModelProto, variables: Sequence[Any], names: Sequence[str],
                             location: str) -> None:
    """Make the graph inputs of the variables initializers, in place: of :data:`~flopcount.frontends.export.
    SIZE_THRESHOLD` bytes or more, references to ``location`` laid out after the tensors already there; smaller
    ones with their values. Floating-point variables the graph does not read are kept (they are parameters: in a
    training graph, BatchNormalization's moving statistics); other unread ones (random-generator states) dropped."""
    from . import export as ex
    from onnx import helper, numpy_helper

    graph = model.graph
    declared = {value.name: value for value in graph.input}
    read = {name for g in walk_graphs(graph) for node in g.node for name in node.input}
    offset = 0
    for g in walk_graphs(graph):
        for tensor in g.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                entries = {entry.key: int(entry.value) for entry in tensor.external_data if entry.key != "location"}
                offset = max(offset, entries.get("offset", 0) + entries.get("length", 0))
    floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    kept_inputs = [value for value in graph.input if value.name not in set(names)]
    for variable, name in zip(variables, names):
        value = declared.get(name)
        if value is None:
            continue
        elem_type = value.type.tensor_type.elem_type
        if name not in read and elem_type not in floats:
            continue
        dims = [int(d) for d in variable.shape]
        np_dtype = helper.tensor_dtype_to_np_dtype(elem_type)
        nbytes = math.prod(dims) * np_dtype.itemsize
        if nbytes >= ex.SIZE_THRESHOLD:
            tensor = onnx.TensorProto(name=name, data_type=elem_type, dims=dims)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, entry_value in (("location", location), ("offset", offset), ("length", nbytes)):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(entry_value)
            offset += nbytes
        else:
            tensor = numpy_helper.from_array(variable.numpy().astype(np_dtype).reshape(dims), name)
        graph.initializer.append(tensor)
    del graph.input[:]
    graph.input.extend(kept_inputs)
