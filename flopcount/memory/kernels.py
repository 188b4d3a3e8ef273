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

Views stay views: torch's ``select`` (``x[:, 0]``, the CLS token) is a view of x, so a tensor keeping it keeps the
whole storage of x, where ONNX writes a Gather (a copy); and torch's ``reshape`` of an expanded tensor (the repeat
of K and V in grouped-query attention) copies, where the graph's Expand and Reshape are views.

On the CPU (``device="cpu"``), torch's dropout multiplies by a noise tensor in the input's type and keeps it (the
CUDA kernel keeps a bool mask, as the Dropout rule does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from math import prod
from types import MappingProxyType

from ..context import TensorInfo
from ..reporting.report import NodeCount
from ..saved import NOTHING, Saved, element_bytes

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


def _gelu_tanh() -> tuple:
    cube = ("Mul", "x", ("Mul", "x", "x"))
    inner = ("Mul", "c", ("Add", "x", ("Mul", "c", cube)))
    return ("Mul", "c", ("Mul", "x", ("Add", "c", ("Tanh", inner))))


#: torch's kernels as its TorchScript exporter writes them (``torch.onnx``'s symbolic functions), and what torch's
#: derivative formulas keep (``tools/autograd/derivatives.yaml``): gelu, silu, mish, softplus their input; rsqrt its
#: output.
PATTERNS: tuple[Pattern, ...] = (
    Pattern("gelu (tanh)", _gelu_tanh(), "x"),
    Pattern("gelu", ("Mul", ("Mul", "x", ("Add", ("Erf", ("Div", "x", "c")), "c")), "c"), "x"),
    Pattern("mish", ("Mul", "x", ("Tanh", ("Softplus", "x"))), "x"),
    Pattern("softplus (beta)", ("Div", ("Softplus", ("Mul", "x", "c")), "c"), "x"),
    Pattern("silu", ("Mul", "x", ("Sigmoid", "x")), "x"),
    Pattern("rsqrt", ("Div", "c", ("Sqrt", "x")), "y"),
    Pattern("rsqrt (reciprocal)", ("Reciprocal", ("Sqrt", "x")), "y"),
)


@dataclass(frozen=True)
class Kernels:
    """What :func:`kernels` finds: each node's :class:`Saved` as the kernel runs (the nodes it changes), the
    outputs that are views in the framework though the graph copies (``views``), the outputs of the graph's views
    that the framework copies (``copies``) and how many of each kernel it found (``found``)."""

    saved: Mapping[int, Saved] = field(default_factory=dict)
    views: frozenset[str] = frozenset()
    copies: frozenset[str] = frozenset()
    found: Mapping[str, int] = field(default_factory=dict)


def framework_of(producer: str) -> str | None:
    """The framework whose kernels a graph's producer name (``ModelProto.producer_name``) stands for, else None."""
    return FRAMEWORKS.get((producer or "").split(" ")[0])


class _Index:
    """Who makes and who reads each tensor of ``nodes``, and which tensors are scalar constants."""

    def __init__(self, nodes: Sequence[NodeCount], stored: frozenset[str]):
        self.producer: dict[str, NodeCount] = {}
        self.readers: dict[str, set[int]] = {}
        for n in nodes:
            for t in n.outputs:
                if t is not None and t.name:
                    self.producer[t.name] = n
            for t in n.inputs:
                if t is not None and t.name:
                    self.readers.setdefault(t.name, set()).add(n.index)
        self.stored = stored

    def scalar(self, t: TensorInfo) -> bool:
        made = self.producer.get(t.name)
        constant = t.name in self.stored or (made is not None and made.op_type == "Constant")
        return constant and t.shape is not None and all(d == 1 for d in t.shape)


def _match(ix: _Index, t: TensorInfo | None, expr, bound: dict, region: list) -> bool:
    """Whether tensor ``t`` is ``expr`` (binding ``x`` in ``bound``, the nodes matched appended to ``region``)."""
    if t is None or not t.name:
        return False
    if expr == "c":
        return ix.scalar(t)
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


def _views(nodes: Sequence[NodeCount], ix: _Index) -> tuple[frozenset[str], frozenset[str]]:
    """(outputs of Gathers of one index on an axis: torch's ``select``, a view; outputs of Reshapes of a tensor an
    Expand broadcast: torch's ``reshape`` copies a tensor whose strides are 0)."""
    views, copies = set(), set()
    for n in nodes:
        if n.domain not in ("", "ai.onnx") or not n.outputs or n.outputs[0] is None or not n.inputs:
            continue
        if n.op_type == "Gather" and len(n.inputs) == 2 and n.inputs[1] is not None and n.inputs[1].shape == () \
                and n.inputs[0] is not None and n.inputs[0].name not in ix.stored:
            views.add(n.outputs[0].name)
        elif n.op_type == "Reshape" and n.inputs[0] is not None:
            made = ix.producer.get(n.inputs[0].name)
            if made is not None and made.op_type == "Expand" and _grows(made):
                copies.add(n.outputs[0].name)
    return frozenset(views), frozenset(copies)


def _grows(n: NodeCount) -> bool:
    """Whether Expand ``n`` makes more elements than it reads (a broadcast, not a reshape to the same size)."""
    a, b = n.inputs[0], n.outputs[0]
    if a is None or b is None or not a.is_static or not b.is_static:
        return False
    return prod(b.shape) > prod(a.shape)


def _dropout_noise(n: NodeCount, s: Saved) -> Saved:
    """torch's dropout on the CPU: a noise tensor of the input's type and shape kept, in place of a bool mask."""
    y = n.outputs[0]
    numel = sum(b for what, b in s.extra if what.startswith("dropout mask"))
    noise = numel * element_bytes(y.elem_type) if y is not None else numel
    return s._replace(extra=tuple((w, b) for w, b in s.extra if not w.startswith("dropout mask"))
                      + (("dropout noise (input's type, the CPU kernel)", noise),))


def kernels(nodes: Sequence[NodeCount], saved: Mapping[int, Saved], stored: frozenset[str], framework: str | None,
            device: str = "cuda") -> Kernels:
    """What changes when ``nodes`` are read as ``framework``'s kernels (nothing when it is None: a plain ONNX
    file keeps what its nodes keep). ``saved``: each node's rule as written (the nodes whose backward runs);
    ``stored``: weights and constants; ``device``: where the step runs (CPU dropout keeps its float noise)."""
    if framework is None:
        return Kernels()
    ix = _Index(nodes, stored)
    out: dict[int, Saved] = {}
    claimed: set[int] = set()
    found: dict[str, int] = {}
    for root in reversed(nodes):  # the last node of a kernel first: an outer pattern before the ones inside it
        if root.index in claimed or not root.outputs or root.outputs[0] is None:
            continue
        for p in PATTERNS:
            bound: dict = {}
            region: list[NodeCount] = []
            if not _match(ix, root.outputs[0], p.expression, bound, region) or not _closed(ix, region, root):
                continue
            if any(n.index in claimed for n in region):
                continue
            kept = _kept(p, region, root, bound["x"], saved)
            if kept is not None:
                out.update(kept)
                claimed.update(n.index for n in region)
                found[p.name] = found.get(p.name, 0) + 1
            break
    if device == "cpu":
        for n in nodes:
            s = saved.get(n.index)
            if n.op_type == "Dropout" and s is not None and any(w.startswith("dropout mask") for w, _ in s.extra):
                out[n.index] = _dropout_noise(n, s)
    views, copies = _views(nodes, ix)
    return Kernels(MappingProxyType(out), views, copies, MappingProxyType(dict(sorted(found.items()))))
