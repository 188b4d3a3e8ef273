"""Kernels, not decompositions: what a framework's kernel keeps for its backward, where its exporter wrote the
kernel as several ONNX nodes.

The memory ledger's saved-for-backward rules (:mod:`flopcount.saved`) are the ONNX operators' own: applied node by
node, a graph's decomposition of one kernel keeps what its parts would keep if they ran one by one. torch runs the
kernel: ``F.gelu`` keeps its input x, where the TorchScript exporter's ``x·½·(1 + erf(x/√2))`` keeps x/√2 and
1 + erf besides. For a graph that came from torch (the model's producer is ``pytorch``: ``--torch``, ``--hf``,
:func:`flopcount.from_torch`), :func:`kernels` recognises the exporter's patterns and keeps what the kernel keeps
(its derivative formula's saved tensors); a graph from anything else keeps what its own nodes keep, as written.

Each pattern is an expression over the one tensor the kernel reads (``x``) and scalar constants (``c``: a Constant
node's output or a stored tensor of one element), exactly as the exporter's symbolic function writes it; a node
inside it whose output anything outside the pattern reads breaks the match (the program then needs that tensor,
as the graph does). The table :data:`PATTERNS` is the rule: name, expression, what the kernel keeps (its input
``x`` or its output ``y``). ``x·sigmoid(x)`` written by hand in Python exports exactly as ``F.silu`` does and is
read as the kernel; transformers' ``gelu_new`` (a Python formula with ``torch.pow``) is not a kernel and does not
match (the exporter writes ``Pow``, where ``F.gelu(approximate="tanh")`` gives ``x·(x·x)``).

Views stay views, copies stay copies: the walk follows the strides torch's tensors have (:class:`_Layout`). A select
(``x[:, 0]``, the CLS token; ONNX writes a Gather) is a view, so a tensor keeping it keeps the whole storage of x; a
reshape is a view where torch's ``view`` would succeed and a copy where not (the repeat of K and V in grouped-query
attention); torch's ``matmul`` keeps a contiguous copy of a batched operand it cannot fold into three dims, and
its two-operand ``einsum`` (one ``bmm``, :func:`_einsum_groups`) a copy of each operand it cannot read as a view.

The exporters' ``scaled_dot_product_attention`` (Q and Kᵀ each scaled by √scale, their product, softmax, the
product with V) is torch's fused kernel where torch runs one (CUDA; the CPU without dropout): Q, K and V as it
reads them, its output, a float32 log-sum-exp per query row and the mask it is handed, where the program hands it
one (:mod:`.handed_masks`); on the CPU with dropout its math path, which keeps
what the graph's nodes keep, and the dropout's noise. On the CPU (``device="cpu"``) torch's dropout multiplies by
a noise tensor in the input's type and keeps it (the CUDA kernel keeps a bool mask, as the Dropout rule does); a
reduced ``nll_loss`` keeps its total weight, a scalar.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from types import MappingProxyType

from ..context import TensorInfo
from ..reporting.report import NodeCount
from ..saved import NOTHING, Saved, element_bytes
from .cuda_sdpa import EFFICIENT, FLASH, MATH, SEED_OFFSET, SdpaCall, cuda_kernel, lse_bytes, padded_head
from .handed_masks import handed, kept_mask
from .math_sdpa import upcast

__all__ = ["PATTERNS", "FRAMEWORKS", "Kernels", "Pattern", "framework_of", "kernels"]

#: The model producers whose graphs are read as their framework's kernels: producer name → framework.
FRAMEWORKS: Mapping[str, str] = MappingProxyType({"pytorch": "torch"})

#: Ops whose two operands may come in either order in a pattern.
_COMMUTATIVE = frozenset({"Mul", "Add"})


@dataclass(frozen=True)
class Pattern:
    """One kernel as its exporter writes it: ``expression`` a nested tuple ``(op, operand, ...)`` whose leaves are
    ``"x"`` (the kernel's input) and ``"c"`` (a scalar constant); ``keeps``: ``"x"`` or ``"y"`` (the output)."""

    name: str
    expression: tuple
    keeps: str
    widens: bool = False  #: the root is a Cast to a wider type (a softmax asked for in float32, not one cast down)


def _gelu_tanh() -> tuple:
    cube = ("Mul", "x", ("Mul", "x", "x"))
    inner = ("Mul", "c", ("Add", "x", ("Mul", "c", cube)))
    return ("Mul", "c", ("Mul", "x", ("Add", "c", ("Tanh", inner))))


#: torch's kernels as its exporters write them (the TorchScript exporter's symbolic functions, the dynamo exporter's
#: decompositions where they differ: it writes Gelu and Mish as one node), and what torch's
#: derivative formulas keep (``tools/autograd/derivatives.yaml``): gelu, silu, mish, softplus their input; rsqrt and
#: softmax their output (a softmax asked for in float32 keeps the float32 output, which the graph makes by a Cast).
PATTERNS: tuple[Pattern, ...] = (
    Pattern("gelu (tanh)", _gelu_tanh(), "x"),
    Pattern("gelu", ("Mul", ("Mul", "x", ("Add", ("Erf", ("Div", "x", "c")), "c")), "c"), "x"),
    # the dynamo exporter's gelu below opset 20 (its torchlib decomposition): x·(½·(1 + erf(x/√2))), and the tanh
    # form with x³ as Pow; transformers' gelu_new multiplies ½·x first, runs as separate kernels and does not match
    Pattern("gelu (decomposed)", ("Mul", "x", ("Mul", "c", ("Add", ("Erf", ("Div", "x", "c")), "c"))), "x"),
    Pattern("gelu (tanh, decomposed)", ("Mul", "x", ("Mul", "c", ("Add", ("Tanh", ("Mul", "c", ("Add", "x", (
        "Mul", "c", ("Pow", "x", "c"))))), "c"))), "x"),
    Pattern("mish", ("Mul", "x", ("Tanh", ("Softplus", "x"))), "x"),
    Pattern("softplus (beta)", ("Div", ("Softplus", ("Mul", "x", "c")), "c"), "x"),
    # the dynamo exporter's softplus(beta, threshold): x where x·β > threshold, else softplus(x·β)/β
    Pattern("softplus (beta, threshold)", ("Where", ("Greater", ("Mul", "x", "c"), "c"), "x",
                                           ("Div", ("Softplus", ("Mul", "x", "c")), "c")), "x"),
    # the same with β = 1, its product and quotient by β folded away by the exporter's optimizer
    Pattern("softplus (threshold)", ("Where", ("Greater", "x", "c"), "x", ("Softplus", "x")), "x"),
    Pattern("silu", ("Mul", "x", ("Sigmoid", "x")), "x"),
    Pattern("rsqrt", ("Div", "c", ("Sqrt", "x")), "y"),
    Pattern("rsqrt (reciprocal)", ("Reciprocal", ("Sqrt", "x")), "y"),
    # softmax(x, dtype=float32) of a 16-bit x, as the dynamo exporter writes it: the softmax, then the cast
    Pattern("softmax (cast)", ("Cast", ("Softmax", "x")), "y", widens=True),
)


@dataclass(frozen=True)
class Kernels:
    """What :func:`kernels` finds: each node's :class:`Saved` as the kernel runs (the nodes it changes), the
    outputs that are views in the framework though the graph copies (``views``), the outputs of the graph's views
    that the framework copies (``copies``), the nodes of fused attention kernels (``fused``) and how many of each
    kernel it found (``found``)."""

    saved: Mapping[int, Saved] = field(default_factory=dict)
    #: the nodes of attentions run as one fused kernel: nothing of theirs is made again under selective recompute
    fused: frozenset[int] = frozenset()
    views: frozenset[str] = frozenset()
    copies: frozenset[str] = frozenset()
    found: Mapping[str, int] = field(default_factory=dict)


def framework_of(producer: str) -> str | None:
    """The framework whose kernels a graph's producer name (``ModelProto.producer_name``) stands for, else None."""
    return FRAMEWORKS.get((producer or "").split(" ")[0])


class _Index:
    """Who makes and who reads each tensor of ``nodes``; ``stored``: weights and constants. A CastLike reads its
    second operand's type alone (onnxscript's functions cast their constants so), not its data."""

    def __init__(self, nodes: Sequence[NodeCount], stored: frozenset[str]):
        self.producer: dict[str, NodeCount] = {}
        self.readers: dict[str, set[int]] = {}
        for n in nodes:
            for t in n.outputs:
                if t is not None and t.name:
                    self.producer[t.name] = n
            for t in n.inputs[:1] if n.op_type == "CastLike" else n.inputs:
                if t is not None and t.name:
                    self.readers.setdefault(t.name, set()).add(n.index)
        self.stored = stored


def _match(ix: _Index, t: TensorInfo | None, expr, bound: dict, region: list) -> bool:
    """Whether tensor ``t`` is ``expr`` (binding ``x`` in ``bound``, the nodes matched appended to ``region``)."""
    if t is None or not t.name:
        return False
    if expr == "c":
        return _constant(ix, t)
    if expr == "x":
        return bound.setdefault("x", t.name) == t.name
    n = ix.producer.get(t.name)
    op, operands = expr[0], expr[1:]
    if n is None or n.op_type != op or n.domain not in ("", "ai.onnx") or len(n.inputs) != len(operands):
        return False
    orders = [operands, operands[::-1]] if op in _COMMUTATIVE and len(operands) == 2 else [operands]
    for order in orders:
        b, r = dict(bound), list(region)
        if all(_match(ix, i, e, b, r) for i, e in zip(n.inputs, order)):
            bound.clear()
            bound.update(b)
            region[:] = [*r, n]
            return True
    return False


def _closed(ix: _Index, region: Sequence[NodeCount], root: NodeCount) -> bool:
    """Whether nothing outside ``region`` reads what its nodes other than ``root`` make."""
    inside = {n.index for n in region}
    return all(ix.readers.get(t.name, set()) <= inside for n in region if n is not root
               for t in n.outputs if t is not None and t.name)


def _widens(n: NodeCount) -> bool:
    """Whether node ``n`` writes wider elements than it reads (a Cast from 16 to 32 bits)."""
    a, y = n.inputs[0], n.outputs[0]
    return a is not None and y is not None and element_bytes(y.elem_type, 0) > element_bytes(a.elem_type, 0)


def _kept(p: Pattern, region: Sequence[NodeCount], root: NodeCount, x: str, saved: Mapping[int, Saved]
          ) -> dict[int, Saved] | None:
    """Each node of ``region`` whose backward runs → what it keeps once the kernel's kept tensor is given to one of
    them (the first that reads x, or the root for y); None when none of their backwards runs."""
    running = [n for n in region if n.index in saved]
    if not running:
        return None
    out = {n.index: NOTHING for n in running}
    if p.keeps == "y":
        if root.index not in saved:
            return None
        out[root.index] = Saved(outputs=(0,))
        return out
    holder = next((n for n in sorted(running, key=lambda n: n.index)
                   if any(t is not None and t.name == x for t in n.inputs)), None)
    if holder is None:
        return None
    out[holder.index] = Saved(inputs=(next(i for i, t in enumerate(holder.inputs) if t is not None and t.name == x),))
    return out


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def _dense_like(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...]:
    """The strides of a new dense tensor of ``shape`` laid out in the order of ``strides`` (the largest stride
    outermost, ties in dim order), as torch's TensorIterator and its empty_like allocate an output."""
    out, step = [0] * len(shape), 1
    for k in reversed(sorted(range(len(shape)), key=lambda k: -strides[k])):
        out[k] = step
        step *= shape[k]
    return tuple(out)


def _broadcast(shape: Sequence[int], strides: Sequence[int], out: Sequence[int]) -> tuple[int, ...]:
    """The strides of a tensor of ``shape`` and ``strides`` expanded to ``out``: broadcast dims stride 0."""
    lead = len(out) - len(shape)
    return tuple(0 if k < lead or (shape[k - lead] == 1 and d != 1) else strides[k - lead] for k, d in enumerate(out))


def view_strides(shape: Sequence[int], strides: Sequence[int], new: Sequence[int]) -> tuple[int, ...] | None:
    """The strides of ``new`` as a view of a tensor of ``shape`` and ``strides``, or None where no view can be
    (torch's ``reshape`` then copies): each run of dims that is contiguous within itself may be split or merged,
    as torch's ``computeStride`` decides ``view``.

    >>> view_strides((2, 3, 4), (12, 4, 1), (6, 4)), view_strides((2, 3, 4), (4, 8, 1), (6, 4))
    ((4, 1), None)
    """
    if not shape:
        return _contiguous(new)
    out = [0] * len(new)
    view_d, base, tensor_numel, view_numel = len(new) - 1, strides[-1], 1, 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * base):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                out[view_d] = view_numel * base
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                base, tensor_numel, view_numel = strides[d - 1], 1, 1
    return tuple(out) if view_d == -1 else None


#: torch's ``nll_loss`` (under ``cross_entropy`` too) keeps the total weight of a reduced loss, a scalar.
_LOSSES = frozenset({"SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"})
_SAME_STRIDES = frozenset({"Slice", "Split", "Identity"})
_RESHAPES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})


#: Elementwise ops, whose output torch lays out in the order of its first operand of the output's shape.
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Cast", "Sigmoid", "Tanh", "Relu", "Erf", "Exp", "Sqrt",
                          "Reciprocal", "Pow", "Abs", "Sin", "Cos"})


class _Layout:
    """The strides torch's tensors have, followed through the graph's views: a select (a Gather of one index) is a
    view that drops its axis; Slice and Split keep their input's strides (unit steps); Transpose permutes them;
    Expand gives broadcast dims stride 0; a reshape is a view where :func:`view_strides` finds one and a copy
    (``copies``) where not; an elementwise op makes a dense tensor in the order of its first operand of its shape
    (TensorIterator's rule: a rotary embedding of a transposed Q stays transposed); ``like`` (output → tensor): a
    fused attention's output, laid out as its Q (the CPU flash kernel's output follows Q's layout); a constant Pad
    of a channels-last tensor is channels-last; an Einsum's output is laid out as its ``bmm`` product; every other
    node makes a contiguous tensor (Concat among them: a partial rotary's ``cat`` makes Q contiguous)."""

    def __init__(self, nodes: Sequence[NodeCount], ix: _Index, attributes, like: Mapping[str, TensorInfo] = {}):
        self.strides: dict[str, tuple[int, ...]] = {}
        self.like = like
        self.views: set[str] = set()
        self.copies: set[str] = set()
        for n in nodes:
            if n.domain in ("", "ai.onnx") and n.outputs and n.outputs[0] is not None and n.inputs \
                    and n.inputs[0] is not None:
                self._node(n, ix, attributes(n) or {})

    def of(self, t: TensorInfo) -> tuple[int, ...] | None:
        if not t.is_static:
            return None
        return self.strides.get(t.name) or _contiguous(t.shape)

    def _node(self, n: NodeCount, ix: _Index, attrs: Mapping) -> None:
        a, y = n.inputs[0], n.outputs[0]
        src = self.of(a)
        if src is None or not y.is_static:
            return
        if y.name in self.like:
            q = self.of(self.like[y.name])
            if q is not None and len(q) == len(y.shape):
                self.strides[y.name] = _dense_like(y.shape, q)
        elif n.op_type == "Gather" and len(n.inputs) == 2 and n.inputs[1] is not None and n.inputs[1].shape == () \
                and a.name not in ix.stored and a.is_float:
            axis = int(attrs.get("axis", 0)) % len(a.shape)
            self.views.add(y.name)
            self.strides[y.name] = src[:axis] + src[axis + 1:]
        elif n.op_type in _SAME_STRIDES or (n.op_type == "Cast" and a.elem_type == y.elem_type):
            for t in n.outputs:
                if t is not None and t.is_static and len(t.shape) == len(src):
                    self.strides[t.name] = src
        elif n.op_type == "Transpose":
            perm = [int(p) for p in attrs.get("perm", range(len(src) - 1, -1, -1))]
            self.strides[y.name] = tuple(src[p] for p in perm)
        elif n.op_type == "Expand":
            self.strides[y.name] = _broadcast(a.shape, src, y.shape)
        elif n.op_type in _RESHAPES:
            got = view_strides(a.shape, src, y.shape)
            if got is None:
                self.copies.add(y.name)
            else:
                self.strides[y.name] = got
        elif n.op_type == "Pad" and _mode(attrs) == "constant" and _channels_last(a.shape, src):
            order = (1, *range(len(src) - 1, 1, -1), 0)  # C, then W, H (D), N: innermost first
            strides, step = [0] * len(src), 1
            for d in order:
                strides[d], step = step, step * y.shape[d]
            self.strides[y.name] = tuple(strides)
        elif n.op_type == "Einsum" and (groups := _einsum_groups(n, attrs)) is not None:
            _, out, sizes, (lro, lo, _, ro), _ = groups  # bmm's [lro, lo, ro] product, viewed in the output's order
            step, strides = 1, {}
            for c in reversed((*lro, *lo, *ro)):
                strides[c], step = step, step * sizes[c]
            self.strides[y.name] = tuple(strides[c] for c in out)
        elif n.op_type in _ELEMENTWISE:
            full = next((t for t in n.inputs if t is not None and t.is_static and t.shape == y.shape), None)
            order = self.of(full) if full is not None else None
            if order is not None:
                self.strides[y.name] = _dense_like(y.shape, order)

    def matmul_copies(self, n: NodeCount) -> dict[int, int]:
        """Operand position → elements of the contiguous copy torch's ``matmul`` makes of it and keeps (its
        batched product reads each operand as ``[batch, rows, cols]``, a 3-D input folded into rows for a 2-D
        other; an operand that is no view of that shape is copied), for a MatMul of static shapes."""
        if len(n.inputs) != 2 or any(t is None or not t.is_static for t in (*n.inputs, n.outputs[0])):
            return {}
        a, b = n.inputs
        if len(a.shape) < 2 or len(b.shape) < 2 or (len(a.shape) == 2 and len(b.shape) == 2):
            return {}
        out: dict[int, int] = {}
        if len(b.shape) == 2:  # folded: [.., n, k] as [rows, k]
            if view_strides(a.shape, self.of(a), (prod(a.shape[:-1]), a.shape[-1])) is None:
                out[0] = prod(a.shape)
            return out
        batch = n.outputs[0].shape[:-2]
        for i, t in enumerate((a, b)):
            if len(t.shape) < 3:
                continue
            expanded = tuple(batch) + tuple(t.shape[-2:])
            if view_strides(expanded, _broadcast(t.shape, self.of(t), expanded),
                            (prod(batch), *t.shape[-2:])) is None:
                out[i] = prod(expanded)
        return out


    def einsum_copies(self, n: NodeCount, attrs: Mapping) -> dict[int, int]:
        """Operand position → elements of the contiguous copy torch's two-operand ``einsum`` makes of it and keeps:
        its ``bmm`` reads the left operand as ``[lro, lo, summed]`` and the right as ``[lro, summed, ro]``
        (:func:`_einsum_groups`); an operand whose strides allow no such view is copied."""
        groups = _einsum_groups(n, attrs)
        if groups is None:
            return {}
        terms, _, sizes, (lro, lo, summed, ro), sides = groups
        out: dict[int, int] = {}
        for i, group in zip(sides, ((lro, lo, summed), (lro, summed, ro))):
            t, shape, strides = terms[i], n.inputs[i].shape, self.of(n.inputs[i])
            dims = [t.index(c) for g in group for c in g if c in t and shape[t.index(c)] != 1]
            folded = tuple(prod(sizes[c] for c in g) for g in group)
            if view_strides(tuple(shape[d] for d in dims), tuple(strides[d] for d in dims), folded) is None:
                out[i] = prod(shape)
        return out


def _mode(attrs: Mapping) -> str:
    """A Pad's mode (``constant`` unless its attributes say otherwise)."""
    mode = attrs.get("mode", b"constant")
    return mode.decode() if isinstance(mode, bytes) else str(mode)


def _channels_last(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether torch reads a 4-D (5-D) tensor of ``shape`` and ``strides`` as channels-last (its
    ``suggest_memory_format``, ``is_channels_last_strides_2d``/``_3d``): the strides grow from C through W, H (D) to
    N, a size-1 dim not widening the next bound, C's stride not 0, N's not equal to C's."""
    if len(shape) not in (4, 5) or len(strides) != len(shape) or strides[1] == 0:
        return False
    least = 0
    for d in (1, *range(len(shape) - 1, 1, -1), 0):
        if shape[d] == 0 or strides[d] < least or (d == 0 and least == strides[1]):
            return False
        least = strides[d] * (shape[d] if shape[d] > 1 else 1)
    return True


def _einsum_groups(n: NodeCount, attrs: Mapping) -> tuple | None:
    """How torch's ``einsum`` runs an Einsum of two operands as one ``bmm`` (``sumproduct_pair``): (the operands'
    terms, the output's, each letter's size, the letters in its four groups, the operands' positions as its left
    and right), or None where it runs otherwise or the equation is not plain (one-operand sums first, a product
    without a sum, an ellipsis, a repeated letter, an implicit output: the node is kept as written).

    The groups: ``lro`` the output's letters of size ≠ 1 in both operands, ``lo`` those in the left only, ``ro``
    the output's others, each in the output's order, and ``summed`` the contracted letters, capitals first, then
    in alphabetical order (torch's order of labels); a contracted letter of size 1 in both is one more ``ro`` dim,
    after the output's. torch swaps the operands (and ``lo`` with ``ro``) where every ``ro`` dim comes before every
    ``lo`` dim, so that the product is laid out as the output."""
    eq = attrs.get("equation", b"")
    eq = (eq.decode() if isinstance(eq, bytes) else str(eq)).replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if not arrow or "." in eq or len(terms) != 2 or len(n.inputs) != 2 or n.outputs[0] is None \
            or any(t is None or not t.is_static for t in n.inputs) or any(len(set(t)) != len(t) for t in terms) \
            or any(len(t) != len(i.shape) for t, i in zip(terms, n.inputs)):
        return None
    size = [dict(zip(t, i.shape)) for t, i in zip(terms, n.inputs)]
    sizes = {c: max(s.get(c, 1) for s in size) for c in (*terms[0], *terms[1])}
    contracted = sorted({c for c in terms[0] + terms[1] if c not in out}, key=lambda c: (c.islower(), c))
    summed = tuple(c for c in contracted if sizes[c] != 1)
    if not summed or any(size[0].get(c, 1) == 1 or size[1].get(c, 1) == 1 for c in summed):
        return None  # a product without a sum (torch multiplies), or a letter summed in one operand first
    lro = tuple(c for c in out if size[0].get(c, 1) != 1 and size[1].get(c, 1) != 1)
    lo = tuple(c for c in out if size[0].get(c, 1) != 1 and c not in lro)
    ro = tuple(c for c in out if c not in lro and c not in lo)
    if lo and ro and len(summed) == len(contracted) and out.index(ro[-1]) < out.index(lo[0]):
        return terms, out, sizes, (lro, ro, summed, lo), (1, 0)
    return terms, out, sizes, (lro, lo, summed, ro), (0, 1)


def _matmul_copy(n: NodeCount, s: Saved, copies: Mapping[int, int], what: str = "torch's matmul") -> Saved:
    """``s`` with each operand torch's ``matmul`` (or ``what``) copies kept as that copy (its own storage, made by
    the product)."""
    kept = [i for i in s.inputs if i in copies]
    if not kept:
        return s
    extra = tuple((f"operand {i} copied contiguous by {what}",
                   copies[i] * element_bytes(n.inputs[i].elem_type)) for i in kept)
    return s._replace(inputs=tuple(i for i in s.inputs if i not in copies), extra=s.extra + extra)


#: Ops between an attention's score product and its product with V in the exporters' ``scaled_dot_product_attention``:
#: the mask added (a boolean one as Where), the softmax, the NaN guard of a boolean mask, dropout, casts.
_ATTENTION_CHAIN = frozenset({"Add", "Softmax", "IsNaN", "Where", "Dropout", "Cast"})


def _constant(ix: _Index, t: TensorInfo | None, depth: int = 8) -> bool:
    """Whether ``t`` is a scalar constant: stored, a Constant node's output, or computed from those and the shapes
    of static tensors alone (sdpa's scale: the square root of a constant, cast; the TorchScript exporter's
    ``1/√d`` of Q's last dim sliced from its Shape, a number in torch)."""
    if t is None or not t.name or t.shape is None:
        return False
    made = ix.producer.get(t.name)
    if made is not None and made.op_type == "Shape":
        return bool(made.inputs) and made.inputs[0] is not None and made.inputs[0].is_static
    if any(d != 1 for d in t.shape):
        return False
    if made is None or made.op_type == "Constant":
        return made is not None or t.name in ix.stored
    if made.op_type == "CastLike":  # a constant cast to another tensor's type (onnxscript's functions)
        return depth > 0 and bool(made.inputs) and _constant(ix, made.inputs[0], depth - 1)
    return depth > 0 and made.op_type in ("Sqrt", "Cast", "Reciprocal", "Div", "Mul", "Slice", "Gather") and \
        all(_constant(ix, i, depth - 1) for i in made.inputs if i is not None)


def _scaled(ix: _Index, t: TensorInfo | None) -> tuple[NodeCount, int] | None:
    """(the Mul, the position of the tensor it scales) where ``t`` is a tensor times a constant scalar."""
    n = ix.producer.get(t.name) if t is not None else None
    if n is None or n.op_type != "Mul" or len(n.inputs) != 2:
        return None
    for i in (0, 1):
        if _constant(ix, n.inputs[1 - i]) and not _constant(ix, n.inputs[i]):
            return n, i
    return None


@dataclass(frozen=True)
class _Attention:
    """One ``scaled_dot_product_attention`` as the exporters write it: Q and Kᵀ each scaled by √scale (``q``,
    ``k``: the Muls and the positions of what they scale), their product, the chain to the product with V
    (``chain``), and that product (``out``)."""

    q: tuple[NodeCount, int]
    k: tuple[NodeCount, int]
    scores: NodeCount
    chain: tuple[NodeCount, ...]
    out: NodeCount

    @property
    def nodes(self) -> tuple[NodeCount, ...]:
        return (self.q[0], self.k[0], self.scores, *self.chain, self.out)


def _attention(ix: _Index, scores: NodeCount, by_index: Mapping[int, NodeCount]) -> _Attention | None:
    """The attention whose score product is ``scores``, or None: both operands scaled by a constant (the
    exporters' symbolic scales Q and Kᵀ by √scale apart, where eager attention scales the scores), a chain of
    :data:`_ATTENTION_CHAIN` that nothing else reads, ending at a MatMul that reads it as its first operand."""
    q, k = _scaled(ix, scores.inputs[0]), _scaled(ix, scores.inputs[1])
    if q is None or k is None or scores.outputs[0] is None:
        return None
    chain, frontier, out = [], [scores.outputs[0].name], None
    while frontier:
        name = frontier.pop()
        for r in sorted(ix.readers.get(name, ())):
            n = by_index[r]
            if n.op_type == "MatMul" and n.inputs[0] is not None and n.inputs[0].name == name and out in (None, n):
                out = n
            elif n.op_type in _ATTENTION_CHAIN and n not in chain and len(chain) < 8:
                chain.append(n)
                frontier.extend(t.name for t in n.outputs if t is not None and t.name)
            elif n.op_type not in _ATTENTION_CHAIN:
                return None
    if out is None or not any(n.op_type == "Softmax" for n in chain):
        return None
    return _Attention(q, k, scores, tuple(chain), out)


def _repeated(ix: _Index, t: TensorInfo, copies: frozenset[str]) -> tuple[NodeCount, TensorInfo] | None:
    """(the Expand, what it reads) where ``t`` (through views) is a reshape that copies an expanded tensor: K or V
    repeated for grouped-query attention, which torch's kernel reads unrepeated (``enable_gqa``)."""
    seen = 0
    while t is not None and seen < 8:
        n = ix.producer.get(t.name)
        if n is None or not n.inputs:
            return None
        if n.op_type == "Reshape" and t.name in copies:
            e = ix.producer.get(n.inputs[0].name) if n.inputs[0] is not None else None
            return (e, e.inputs[0]) if e is not None and e.op_type == "Expand" and e.inputs[0] is not None else None
        if n.op_type not in ("Reshape", "Transpose", "Unsqueeze", "Squeeze", "Identity"):
            return None
        t, seen = n.inputs[0], seen + 1
    return None


def _fused(a: _Attention, ix: _Index, saved: Mapping[int, Saved], copies: frozenset[str], masked: bool,
           kernel: str | None = None) -> dict[int, Saved]:
    """What a fused attention kernel keeps, given to the region's nodes: Q, K and V as it reads them (K and V
    before a grouped-query repeat, kept by the Expand that reads them; repeated where the kernel is ``masked``,
    and the mask: :mod:`.handed_masks`), its output and a float32 log-sum-exp per query row (``B·heads·S_q``);
    on CUDA (``kernel``: :mod:`.cuda_sdpa`) its log-sum-exp, philox seed and offset, and flash's padded heads."""
    out = {n.index: NOTHING for n in a.nodes if n.index in saved}
    if masked:
        out.update(kept_mask(a.chain, a.scores.outputs[0].name, saved, ix.stored, kernel == EFFICIENT))
    y = a.out.outputs[0]
    head = y.shape[-1] if y is not None and y.is_static else 0
    pad = kernel == FLASH and head % 8 != 0
    for mul, i in (a.q, a.k, (a.out, 1)):
        rep = None if masked else _repeated(ix, mul.inputs[i], copies)
        node, j = (rep[0], 0) if rep is not None and rep[0].index in saved else (mul, i)
        if node.index in out or node is not mul:
            out[node.index] = _padded(node.inputs[j], head) if pad else Saved(inputs=(j,))
    lse = lse_bytes(kernel or FLASH, y.shape[:-1]) if head else 0
    extra = (("log-sum-exp (float32) of the fused attention kernel", lse),) + \
        ((("philox seed and offset of the fused attention kernel", SEED_OFFSET),) if kernel else ())
    if pad:
        extra += _padded(y, head, padded_head(head) - head).extra
    if a.out.index in saved:
        s = out.get(a.out.index, NOTHING)
        out[a.out.index] = Saved(inputs=s.inputs, outputs=(0,), extra=s.extra + extra)
    return out


def _padded(t: TensorInfo, head: int, width: int = 0) -> Saved:
    """A copy of Q, K or V (or its output's padding, ``width`` columns) at flash's head size (torch pads the head
    size to a multiple of 8 before the kernel, ``pad_last_dim``)."""
    numel = prod(t.shape) // head if t.is_static and head else 0
    return Saved(extra=(("Q, K or V padded to flash's head size (a copy)",
                         numel * (width or padded_head(head)) * element_bytes(t.elem_type)),))


def _attentions(nodes: Sequence[NodeCount], ix: _Index, saved: Mapping[int, Saved], device: str
                ) -> tuple[list[_Attention], list[_Attention]]:
    """The exported ``scaled_dot_product_attention`` regions that torch runs as a fused kernel (all of them on
    CUDA: flash and memory-efficient attention draw their dropout again in the backward; those without dropout on
    the CPU), and those it runs on its math path (with dropout on the CPU; K or V broadcast over Q's heads)."""
    by_index = {n.index: n for n in nodes}
    fused, math = [], []
    for n in nodes:
        if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and len(n.inputs) == 2 and n.index in saved:
            a = _attention(ix, n, by_index)
            if a is not None:
                dropped = any(c.op_type == "Dropout" for c in a.chain)
                (math if (dropped and device == "cpu") or _broadcast_heads(a) else fused).append(a)
    return fused, math


def _broadcast_heads(a: _Attention) -> bool:
    """Whether the attention's products broadcast K or V over Q's heads (multi-query K and V of one head handed to
    sdpa as they are, without ``enable_gqa``): torch's fused kernels need as many heads in K and V as in Q, or a
    grouped-query call (which the exporters write as a repeat), so torch runs its math path."""
    q, k, v = a.scores.inputs[0], a.scores.inputs[1], a.out.inputs[1]
    if any(t is None or not t.is_static or len(t.shape) < 3 for t in (q, k, v)):
        return False
    return k.shape[-3] != q.shape[-3] or v.shape[-3] != q.shape[-3]


def _cuda(a: _Attention, ix: _Index, masked: bool) -> str:
    """The kernel torch's CUDA dispatcher runs for the attention (:func:`.cuda_sdpa.cuda_kernel`): K and V are
    grouped where the program hands them unrepeated (no mask: the exporter's repeat of them, a copy)."""
    q, v = a.scores.inputs[0], a.out.inputs[1]
    if q is None or v is None or not q.shape or not v.shape:
        return MATH
    grouped = not masked and any(_repeated(ix, t, frozenset(ix.producer)) for t in (a.k[0].inputs[a.k[1]], v))
    return cuda_kernel(SdpaCall(q.elem_type, q.shape[-1], q.shape[-1], v.shape[-1], masked, grouped))


def _math(a: _Attention, saved: Mapping[int, Saved], device: str = "cpu") -> dict[int, Saved]:
    """sdpa's math path (``aten._scaled_dot_product_attention_math``): the products keep what the graph's MatMuls
    keep (the scaled Q and Kᵀ, the probabilities and V, each as torch's ``matmul`` reads it: a K or V broadcast
    over Q's heads is copied); the scale is a number, which the products with Q and Kᵀ do not keep. With dropout
    torch multiplies the probabilities by a float noise tensor, kept, and the product with V keeps the result. Its
    softmax is ``_safe_softmax``, which keeps its output alone: the graph's NaN guard (IsNaN, Where: see
    :func:`_nan_guard`) and the mask added before it (a float mask, a boolean one as Where) keep nothing."""
    out = {m.index: NOTHING for m, _ in (a.q, a.k) if m.index in saved}
    for c in a.chain:
        y = c.outputs[0] if c.outputs else None
        if c.op_type == "Dropout" and device != "cpu":
            continue  # CUDA's native_dropout keeps a bool mask, as the Dropout rule does
        if c.op_type == "Dropout" and c.index in saved and y is not None and y.is_static:
            noise = prod(y.shape) * element_bytes(y.elem_type)
            out[c.index] = Saved(extra=(("dropout noise (input's type, the CPU kernel)", noise),))
        elif c.op_type != "Softmax" and c.index in saved:
            out[c.index] = NOTHING
    return out


def _nan_guard(a: _Attention) -> set[str]:
    """The outputs of the NaN guard the exporters write after the softmax (``Where(IsNaN(p), 0, p)``): on sdpa's
    math path torch runs ``_safe_softmax``, one kernel whose output is the softmax's own, so the guard's tensors are
    that storage (the walk reads them as views: its IsNaN of the softmax, its Where of the IsNaN)."""
    nan = {c.outputs[0].name for c in a.chain if c.op_type == "IsNaN" and c.outputs and c.outputs[0] is not None}
    return nan | {c.outputs[0].name for c in a.chain if c.op_type == "Where" and c.inputs and c.inputs[0] is not None
                  and c.inputs[0].name in nan and c.outputs and c.outputs[0] is not None}


def _dropout_noise(n: NodeCount, s: Saved) -> Saved:
    """torch's dropout on the CPU: a noise tensor of the input's type and shape kept, in place of a bool mask."""
    y = n.outputs[0]
    numel = sum(b for what, b in s.extra if what.startswith("dropout mask"))
    noise = numel * element_bytes(y.elem_type) if y is not None else numel
    return s._replace(extra=tuple((w, b) for w, b in s.extra if not w.startswith("dropout mask"))
                      + (("dropout noise (input's type, the CPU kernel)", noise),))


def _pointwise(nodes: Sequence[NodeCount], ix: _Index, saved: Mapping[int, Saved]
               ) -> tuple[dict[int, Saved], dict[str, int]]:
    """What the nodes of each :data:`PATTERNS` kernel keep, and how many of each kernel there are."""
    out: dict[int, Saved] = {}
    claimed: set[int] = set()
    found: dict[str, int] = {}
    for root in reversed(nodes):  # the last node of a kernel first: an outer pattern before the ones inside it
        if root.index in claimed or not root.outputs or root.outputs[0] is None:
            continue
        for p in PATTERNS:
            bound: dict = {}
            region: list[NodeCount] = []
            if not _match(ix, root.outputs[0], p.expression, bound, region) or not _closed(ix, region, root) \
                    or (p.widens and not _widens(root)):
                continue
            if any(n.index in claimed for n in region):
                continue
            kept = _kept(p, region, root, bound["x"], saved)
            if kept is not None:
                out.update(kept)
                claimed.update(n.index for n in region)
                found[p.name] = found.get(p.name, 0) + 1
            break
    return out, found


#: Ops through which a slice write's positions reach its ScatterND (the dynamo exporter's ``slice_scatter``).
_POSITION_VIEWS = frozenset({"Unsqueeze", "Slice", "Reshape", "Squeeze", "Cast"})


def _slice_writes(nodes: Sequence[NodeCount], ix: _Index, saved: Mapping[int, Saved]) -> dict[int, Saved]:
    """A slice assignment (``x[..., a:b] = y``) is a copy into a view of x in torch, whose backward keeps nothing
    (its bounds are numbers); the dynamo exporter writes it as a ScatterND whose indices are the slice's positions,
    a Range of constants and static shapes (sliced, unsqueezed). Such a ScatterND keeps nothing."""
    out = {}
    for n in nodes:
        if n.op_type != "ScatterND" or n.index not in saved or len(n.inputs) < 3 or n.inputs[1] is None:
            continue
        made, seen = ix.producer.get(n.inputs[1].name), 0
        while made is not None and made.op_type in _POSITION_VIEWS and made.inputs and seen < 8:
            made, seen = (ix.producer.get(made.inputs[0].name) if made.inputs[0] is not None else None), seen + 1
        if made is not None and made.op_type == "Range" and all(_constant(ix, i) for i in made.inputs):
            out[n.index] = NOTHING
    return out


#: The exporters' writes into a slice or an element of a tensor (``x[..., i, :i] = y``, ``x[idx] = y``): one node
#: whose output is its data input written, which torch writes in place.
_WRITES = frozenset({"ScatterND", "ScatterElements"})
#: Views of a tensor as the walk reads them (:data:`flopcount.memory.ledger.VIEWS`, without Expand: an expanded
#: tensor is read whole).
_VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Slice", "Split"})


def _written_over(nodes: Sequence[NodeCount], ix: _Index, saved: Mapping[int, Saved], views: set[str],
                  copies: set[str]) -> set[str]:
    """The kept views of a tensor that is written in place afterwards: copies in torch. A write into a slice of x
    (``x[..., i, :i] = y``) is in place in torch, where the exporter writes a Scatter whose data input is x as it
    was; a view of that x which a backward keeps cannot be a view in the program that ran (autograd refuses a saved
    tensor whose storage was written after it was saved), so the program copied it (``x[..., i, :i].clone()``, a
    copy the exporter drops): it keeps its own elements, not x's storage. ``views``, ``copies``: the layout's
    (:class:`_Layout`), updated; returns the names made copies."""
    written = {n.inputs[0].name for n in nodes if n.op_type in _WRITES and n.domain in ("", "ai.onnx") and n.inputs
               and n.inputs[0] is not None}
    made: set[str] = set()
    if not written:
        return made
    for n in nodes:
        s = saved.get(n.index)
        if s is None:
            continue
        kept = [n.inputs[i] for i in s.inputs if i < len(n.inputs)] + [n.outputs[i] for i in s.outputs
                                                                         if i < len(n.outputs)]
        for t in kept:
            if t is None or not t.name or not _is_view(ix, t, views, copies):
                continue
            seen, chain = t, 0
            while _is_view(ix, seen, views, copies) and chain < 64:
                seen, chain = ix.producer[seen.name].inputs[0], chain + 1
                if seen is None or seen.name in written:
                    break
            if seen is not None and seen.name in written:
                made.add(t.name)
    views.difference_update(made)
    copies.update(made)
    return made


def _is_view(ix: _Index, t: TensorInfo, views: set[str], copies: set[str]) -> bool:
    """Whether ``t`` is a view of its producer's first input in torch (see :class:`_Layout`)."""
    n = ix.producer.get(t.name)
    if n is None or not n.inputs or n.inputs[0] is None or n.domain not in ("", "ai.onnx"):
        return False
    return t.name in views or (n.op_type in _VIEW_OPS and t.name not in copies)


def _losses(nodes: Sequence[NodeCount], saved: Mapping[int, Saved], out: Mapping[int, Saved], attributes
            ) -> dict[int, Saved]:
    """A reduced loss keeps its total weight besides (a scalar of the input's type), as torch's ``nll_loss``."""
    changed = {}
    for n in nodes:
        if n.op_type in _LOSSES and n.index in saved and n.inputs and n.inputs[0] is not None:
            reduction = (attributes(n) or {}).get("reduction", b"mean")
            if (reduction.decode() if isinstance(reduction, bytes) else reduction) != "none":
                s = out.get(n.index, saved[n.index])
                changed[n.index] = s._replace(extra=s.extra + (("total weight (torch's nll_loss)",
                                                                element_bytes(n.inputs[0].elem_type)),))
    return changed


def kernels(nodes: Sequence[NodeCount], saved: Mapping[int, Saved], stored: frozenset[str], framework: str | None,
            device: str = "cuda", attributes=lambda n: None, masks=dict) -> Kernels:
    """What changes when ``nodes`` are read as ``framework``'s kernels (nothing when it is None: a plain ONNX
    file keeps what its nodes keep). ``saved``: each node's rule as written (the nodes whose backward runs);
    ``stored``: weights and constants; ``device``: where the step runs (CPU dropout keeps its float noise);
    ``attributes(node)``: a node's attributes (Transpose's ``perm``, Gather's ``axis``); ``masks()``: the
    attentions' masks evaluated, by score product (:func:`.handed_masks.handed`; a mask not there is not handed)."""
    if framework is None:
        return Kernels()
    ix = _Index(nodes, stored)
    out, found = _pointwise(nodes, ix, saved)
    fused, math = _attentions(nodes, ix, saved, device)
    evaluated = masks() if fused else {}
    chosen = {a.out.index: _cuda(a, ix, a.scores.name in evaluated and handed(evaluated[a.scores.name]))
              for a in fused} if device == "cuda" else {}
    math += [a for a in fused if chosen.get(a.out.index) == MATH]
    fused = [a for a in fused if chosen.get(a.out.index) != MATH]
    inside = {n.index for a in fused for n in a.nodes}
    guards: set[str] = set()
    for a in math:
        out.update(_math(a, saved, device))
        guards.update(_nan_guard(a))
    if device == "cpu":
        for n in nodes:
            s = saved.get(n.index)
            if n.op_type == "Dropout" and s is not None and any(w.startswith("dropout mask") for w, _ in s.extra):
                out[n.index] = _dropout_noise(n, s)
    out.update(_slice_writes(nodes, ix, saved))
    out.update(_losses(nodes, saved, out, attributes))
    # a fused kernel writes its output in Q's layout ([B, S, heads, d] transposed where Q is so)
    layout = _Layout(nodes, ix, attributes, {a.out.outputs[0].name: a.q[0].inputs[a.q[1]] for a in fused
                                             if a.out.outputs[0] is not None and a.out.outputs[0].is_static})
    if made := _written_over(nodes, ix, saved, layout.views, layout.copies):
        found["a kept view of a tensor written after (a copy)"] = len(made)
    for a in fused:
        masked = a.scores.name in evaluated and handed(evaluated[a.scores.name])
        out.update(_fused(a, ix, saved, frozenset(layout.copies), masked, chosen.get(a.out.index)))
    if fused:
        found["scaled dot-product attention (fused)"] = len(fused)
    for n in nodes:
        if n.op_type == "MatMul" and n.domain in ("", "ai.onnx") and n.index in saved and n.index not in inside:
            copied = _matmul_copy(n, out.get(n.index, saved[n.index]), layout.matmul_copies(n))
            if copied != saved[n.index]:
                out[n.index] = copied
        elif n.op_type == "Einsum" and n.domain in ("", "ai.onnx") and n.index in saved:
            copied = _matmul_copy(n, out.get(n.index, saved[n.index]), layout.einsum_copies(n, attributes(n) or {}),
                                  "torch's einsum")
            if copied != saved[n.index]:
                out[n.index] = copied
    out.update(upcast([a.nodes for a in math], out, saved))  # 16-bit: the math path runs in float32
    return Kernels(MappingProxyType(out), frozenset(inside), frozenset(layout.views | guards),
                   frozenset(layout.copies), MappingProxyType(dict(sorted(found.items()))))
