"""The attention masks a graph computes from positions (``--attention executed`` on a plain ONNX graph).

Exporters build causal and sliding-window masks from position ranges: a Range of query positions unsqueezed to a
column [S_q, 1], one of key positions to a row [1, T], comparisons between them (``j ≤ p``, ``p − w < j``, with a
cache length added), And/Or/Not, then ``Where(kept, 0, −inf)`` added to the scores before the Softmax (or the
scores selected by ``Where``). Where every ancestor of that mask is a constant, a resolved shape, a Range or an
input whose values are given (``input_values``), the mask is structure, and :func:`mask_rows` evaluates it.

Tensors of at most :data:`EVAL_LIMIT` elements are computed with numpy (the shape folder's operators,
:func:`flopcount.pipeline.shapes.evaluate_node`). The S_q × T mask itself is never built when larger: a number that
varies along both axes is held as ``q[i] + k[j]`` (a query column plus a key row), a boolean as the interval of keys
``[lo_i, hi_i)`` each query row keeps, and a number that is one of two values as the boolean that selects it. A
comparison of ``q[i] + k[j]`` with zero keeps, in row i, the keys where the key row is above or below ``−q[i]``: an
interval when the key row is monotone (a binary search per row). Time and memory stay O(S) per operator, so a mask
over 131072 positions is counted exactly in milliseconds. A mask of moderate size whose rows keep keys apart is
counted from its array; held by rows, it is not modelled (that attention counts full, and the report says why).

The same evaluation reads the ``attn_mask`` input of an ONNX Attention node. Where a mask reads the values given
for an ``attention_mask`` input that are right padding, a padded query runs nothing (as
:class:`~flopcount.masks.AttentionMask` counts padding, and ``--hf`` with it). The masks found are recognised as an
:class:`~flopcount.masks.AttentionMask` (causal, window, padding, packed segments) for the report where one keeps
exactly the same keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from math import prod

import numpy as np
import onnx

from ..masks import AttentionMask, ExecutedPairs, padding_lengths
from .shapes import evaluate_node

__all__ = ["EVAL_LIMIT", "MASKED", "GraphMask", "NotStructure", "graph_masks", "mask_array", "mask_rows",
           "recognise", "row_bounds"]

#: Most elements of a tensor of the mask's subgraph computed with numpy; a larger mask is held by its rows.
EVAL_LIMIT = 1 << 22
#: Most elements of any tensor computed with numpy (a Range of positions, a padding mask's values).
_ARRAY_LIMIT = 1 << 24
#: A mask value at or below this (−inf, the dtype's lowest, −1e4 of older exports) masks its score out.
MASKED = -1e4

_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Neg", "Cast", "Not", "And", "Or", "Where", "Equal",
                          "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Identity", "Expand", "Unsqueeze",
                          "Transpose"})


class NotStructure(Exception):
    """The mask cannot be evaluated from the graph's structure; ``data`` when it reads values not given."""

    def __init__(self, why: str, data: bool = False):
        super().__init__(why)
        self.why, self.data = why, data


class _Apart(NotStructure):
    """A concrete mask whose rows keep keys apart: not held by rows, but countable as an array."""


@dataclass(frozen=True)
class _Sum:
    """A number q[..., i, 0] + k[..., 0, j]: two arrays of the value's rank."""

    q: np.ndarray
    k: np.ndarray

    @property
    def constant(self) -> bool:
        return self.q.size == 1 and self.k.size == 1

    def scalar(self) -> float:
        return float(self.q.reshape(-1)[0] + self.k.reshape(-1)[0])


@dataclass(frozen=True)
class _Rows:
    """A boolean: row i keeps the keys [lo, hi) of ``t`` (arrays [..., S_q or 1, 1]; empty where hi ≤ lo)."""

    lo: np.ndarray
    hi: np.ndarray
    t: int

    def over(self, t: int) -> "_Rows":
        """The same boolean over ``t`` keys (broadcast from one key)."""
        if t == self.t:
            return self
        if self.t != 1:
            raise NotStructure(f"a mask of {self.t} keys broadcast to {t}")
        kept = self.hi > self.lo
        return _Rows(np.zeros_like(self.lo), np.where(kept, t, 0), t)

    def negate(self) -> "_Rows":
        lo, hi = np.maximum(self.lo, 0), np.minimum(self.hi, self.t)
        empty = hi <= lo
        if not (empty | (lo == 0) | (hi == self.t)).all():
            raise NotStructure("the complement of a band of keys (two intervals in a row)")
        new_lo = np.where(empty, 0, np.where(lo == 0, hi, 0))
        new_hi = np.where(empty, self.t, np.where(lo == 0, self.t, lo))
        return _Rows(new_lo, new_hi, self.t)


@dataclass(frozen=True)
class _Select:
    """``yes`` where ``rows`` keeps, else ``no`` (a Where of two constants, a cast boolean)."""

    rows: _Rows
    yes: float
    no: float


def _lift(x, shape: tuple[int, ...]):
    """A concrete array as a value of the broadcast ``shape`` [..., S_q, T]: numbers as q + k, booleans as rows."""
    if not isinstance(x, np.ndarray):
        return x
    r = len(shape)
    x = x.reshape((1,) * (r - x.ndim) + x.shape)
    t = shape[-1]
    if x.dtype == np.bool_:
        if x.shape[-1] == 1:
            return _Rows(np.zeros(x.shape, np.int64), np.where(x, t, 0).astype(np.int64), t)
        return _rows_of(x, t)
    zero = np.zeros((1,) * r, dtype=x.dtype)
    if x.shape[-1] == 1:
        return _Sum(x, zero)
    if x.shape[-2] == 1:
        return _Sum(zero, x)
    raise NotStructure("a number that varies along both the queries and the keys")


def _rows_of(kept: np.ndarray, t: int) -> _Rows:
    """The interval of true entries of each row of a concrete boolean [..., S_q, T]."""
    kept = np.broadcast_to(kept, kept.shape[:-1] + (t,))
    count = kept.sum(axis=-1, keepdims=True)
    first = np.argmax(kept, axis=-1)[..., None]
    last = t - np.argmax(kept[..., ::-1], axis=-1)[..., None]
    some = count > 0
    if (some & (last - first != count)).any():
        raise _Apart("a mask row that keeps keys apart (not one interval)")
    return _Rows(np.where(some, first, 0).astype(np.int64), np.where(some, last, 0).astype(np.int64), t)


def _and(a: _Rows, b: _Rows) -> _Rows:
    return _Rows(np.maximum(a.lo, b.lo), np.minimum(a.hi, b.hi), a.t)


def _or(a: _Rows, b: _Rows) -> _Rows:
    ea, eb = a.hi <= a.lo, b.hi <= b.lo
    if not (ea | eb | ((a.lo <= b.hi) & (b.lo <= a.hi))).all():
        raise NotStructure("the union of two bands of keys apart")
    lo = np.where(ea, b.lo, np.where(eb, a.lo, np.minimum(a.lo, b.lo)))
    hi = np.where(ea, b.hi, np.where(eb, a.hi, np.maximum(a.hi, b.hi)))
    return _Rows(lo, hi, a.t)


def _constant_rows(keep: bool, like: np.ndarray, t: int) -> _Rows:
    return _Rows(np.zeros_like(like), np.full_like(like, t if keep else 0), t)


_COMPARE = {"Less": np.less, "LessOrEqual": np.less_equal, "Greater": np.greater, "GreaterOrEqual": np.greater_equal,
            "Equal": np.equal}
_FLIP = {"Less": "Greater", "LessOrEqual": "GreaterOrEqual", "Greater": "Less", "GreaterOrEqual": "LessOrEqual",
         "Equal": "Equal"}


def _compare(op: str, a, b, t: int):
    """``a op b`` for numbers held as q + k or as a two-valued select."""
    if isinstance(a, _Select) or isinstance(b, _Select):
        sel, other = (a, b) if isinstance(a, _Select) else (b, a)
        if not isinstance(other, _Sum) or not other.constant:
            raise NotStructure("a comparison of a mask with a varying number")
        c = other.scalar()
        fn = _COMPARE[op] if sel is a else _COMPARE[_FLIP[op]]
        yes, no = bool(fn(sel.yes, c)), bool(fn(sel.no, c))
        if yes == no:
            return _constant_rows(yes, sel.rows.lo, t)
        return sel.rows.over(t) if yes else sel.rows.over(t).negate()
    if not isinstance(a, _Sum) or not isinstance(b, _Sum):
        raise NotStructure(f"{op} of booleans")
    q, k = a.q - b.q, a.k - b.k  # a op b ⟺ k[j] op −q[i]
    return _threshold(op, k, -q, t)


def _threshold(op: str, k: np.ndarray, c: np.ndarray, t: int) -> _Rows:
    """Per row i, the keys j with ``k[..., j] op c[..., i]``: an interval when k is monotone along the keys."""
    shape = np.broadcast_shapes(k.shape[:-2], c.shape[:-2])
    k = np.broadcast_to(k, shape + k.shape[-2:])
    c = np.broadcast_to(c, shape + c.shape[-2:])
    s_q = c.shape[-2]
    lo = np.zeros(shape + (s_q, 1), np.int64)
    hi = np.zeros(shape + (s_q, 1), np.int64)
    for idx in np.ndindex(*shape):
        row = np.broadcast_to(k[idx][0], (t,))
        bound = c[idx][:, 0]
        diffs = np.diff(row)
        if (diffs >= 0).all():
            fn, keys, cut = op, row, bound
        elif (diffs <= 0).all():  # k[j] op c ⟺ −k[j] flipped-op −c, −k increasing
            fn, keys, cut = _FLIP[op], -row, -bound
        else:
            raise NotStructure("a comparison with key values that are not monotone")
        left, right = np.searchsorted(keys, cut, "left"), np.searchsorted(keys, cut, "right")
        lo[idx][:, 0], hi[idx][:, 0] = {
            "Less": (0, left), "LessOrEqual": (0, right), "Greater": (right, t), "GreaterOrEqual": (left, t),
            "Equal": (left, right)}[fn]
    return _Rows(lo, hi, t)


def _arith(op: str, a, b):
    if isinstance(a, _Sum) and isinstance(b, _Sum):
        if op in ("Add", "Sub"):
            sign = 1 if op == "Add" else -1
            return _Sum(a.q + sign * b.q, a.k + sign * b.k)
        if b.constant or a.constant:
            (x, c) = (a, b.scalar()) if b.constant else (b, a.scalar())
            if op == "Mul":
                return _Sum(x.q * c, x.k * c)
            if op == "Div" and x is a and not np.issubdtype(x.q.dtype, np.integer):
                return _Sum(x.q / c, x.k / c)
        raise NotStructure(f"{op} of two numbers that vary along the queries and the keys")
    if isinstance(a, _Select) and isinstance(b, _Select):
        if op == "Add" and max(a.yes, b.yes) > MASKED >= max(a.no, b.no) and a.yes == 0 == b.yes:
            return _Select(_and(a.rows, b.rows), 0.0, min(a.no, b.no))  # two additive masks
        raise NotStructure(f"{op} of two masks")
    sel, other = (a, b) if isinstance(a, _Select) else (b, a)
    if not isinstance(sel, _Select) or not isinstance(other, _Sum) or not other.constant:
        raise NotStructure(f"{op} of a mask and a varying number (a bias)")
    c = other.scalar()
    fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op]
    with np.errstate(all="ignore"):
        if sel is a:
            return _Select(sel.rows, float(fn(sel.yes, c)), float(fn(sel.no, c)))
        return _Select(sel.rows, float(fn(c, sel.yes)), float(fn(c, sel.no)))


def _map_arrays(value, fn):
    if isinstance(value, _Sum):
        return _Sum(fn(value.q), fn(value.k))
    if isinstance(value, _Rows):
        return _Rows(fn(value.lo), fn(value.hi), value.t)
    return _Select(_map_arrays(value.rows, fn), value.yes, value.no)


def _symbolic(node: onnx.NodeProto, args: list, shape: tuple[int, ...]):
    """``node`` on values of which one at least is held by its rows or as q + k; ``shape`` its output's shape."""
    handler = _SYMBOLIC.get(node.op_type)
    if handler is None:
        raise NotStructure(f"{node.op_type} on the S_q × T mask")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return handler(node.op_type, args, attrs, shape)


def _identity(op, args, attrs, shape):
    x = args[0]
    return x.over(shape[-1]) if isinstance(x, _Rows) else _map_arrays(x, lambda a: a)


def _unsqueeze(op, args, attrs, shape):
    axes = attrs.get("axes") if len(args) < 2 or args[1] is None else [int(a) for a in np.reshape(args[1], -1)]
    axes = sorted(a % len(shape) for a in axes)
    if any(a >= len(shape) - 2 for a in axes):
        raise NotStructure("an Unsqueeze among the query and key axes of the mask")
    return _map_arrays(args[0], lambda x: np.expand_dims(x, tuple(axes)))


def _transpose(op, args, attrs, shape):
    perm = list(attrs.get("perm", range(len(shape) - 1, -1, -1)))
    if perm[-2:] != [len(shape) - 2, len(shape) - 1]:
        raise NotStructure("a Transpose of the query and key axes of the mask")
    return _map_arrays(args[0], lambda x: np.transpose(x, perm))


def _cast(op, args, attrs, shape):
    t = shape[-1]
    to = onnx.helper.tensor_dtype_to_np_dtype(attrs["to"])
    x = _lift(args[0], shape)
    if to == np.bool_:
        if isinstance(x, _Rows):
            return x
        return _compare("Equal", x, _Sum(np.zeros((1,) * len(shape)), np.zeros((1,) * len(shape))), t).negate()
    if isinstance(x, _Rows):
        return _Select(x.over(t), 1.0, 0.0)
    if isinstance(x, _Select):
        return _Select(x.rows, float(np.asarray(x.yes).astype(to)), float(np.asarray(x.no).astype(to)))
    if np.issubdtype(to, np.integer) and not all(np.array_equal(v, np.round(v)) for v in (x.q, x.k)):
        raise NotStructure("a cast to integers of fractional positions")
    return _Sum(x.q.astype(to), x.k.astype(to))


def _not(op, args, attrs, shape):
    return _lift(args[0], shape).over(shape[-1]).negate()


def _logic(op, args, attrs, shape):
    a, b = (_lift(v, shape).over(shape[-1]) for v in args)
    return _and(a, b) if op == "And" else _or(a, b)


def _comparison(op, args, attrs, shape):
    a, b = (_lift(v, shape) for v in args)
    return _compare(op, a, b, shape[-1])


def _arithmetic(op, args, attrs, shape):
    a, b = (_lift(v, shape) for v in args)
    return _arith(op, a, b)


def _neg(op, args, attrs, shape):
    minus_one = _Sum(np.full((1,) * len(shape), -1), np.zeros((1,) * len(shape), int))
    return _arith("Mul", _lift(args[0], shape), minus_one)


def _where(op, args, attrs, shape):
    t = shape[-1]
    cond, yes, no = (_lift(v, shape) for v in args)
    if isinstance(cond, _Rows) and all(isinstance(v, _Sum) and v.constant for v in (yes, no)):
        return _Select(cond.over(t), yes.scalar(), no.scalar())
    if isinstance(cond, _Rows) and all(isinstance(v, _Rows) for v in (yes, no)):
        c = cond.over(t)
        return _or(_and(c, yes.over(t)), _and(c.negate(), no.over(t)))
    raise NotStructure("a Where between varying numbers")


#: The operators a mask held by its rows or as q + k passes through, each ``(op, args, attrs, shape) -> value``.
_SYMBOLIC = {
    "Identity": _identity, "Expand": _identity, "Unsqueeze": _unsqueeze, "Transpose": _transpose, "Cast": _cast,
    "Not": _not, "And": _logic, "Or": _logic, "Neg": _neg, "Where": _where,
    **{op: _comparison for op in _COMPARE}, **{op: _arithmetic for op in ("Add", "Sub", "Mul", "Div")},
}


@dataclass
class _Evaluator:
    """Values of a graph's tensors, each computed once (shared by the attentions of one graph)."""

    producer: Mapping[str, onnx.NodeProto]
    tensors: Mapping
    values: Mapping[str, np.ndarray]
    inputs: frozenset
    limit: int = EVAL_LIMIT
    memo: dict = field(default_factory=dict)

    def ancestors(self, name: str) -> set[str]:
        """The leaf tensors ``name`` is computed from (constants, inputs; not through Shape), and ``"Trilu"`` when
        a Trilu lies on the way."""
        found, stack, seen = set(), [name], set()
        while stack:
            t = stack.pop()
            if t in seen:
                continue
            seen.add(t)
            node = self.producer.get(t)
            if node is None:
                found.add(t)
                continue
            if node.op_type == "Trilu":
                found.add("Trilu")
            if node.op_type not in ("Shape", "Size"):
                stack.extend(i for i in node.input if i)
        return found

    def __call__(self, name: str):
        stack = [name]
        while stack:
            top = stack[-1]
            if top in self.memo:
                stack.pop()
                continue
            if top in self.values:
                self.memo[top] = np.asarray(self.values[top])
                stack.pop()
                continue
            node = self.producer.get(top)
            if node is None:
                if top in self.inputs:
                    raise NotStructure(f"it reads the input {top!r}, whose values are not given", data=True)
                raise NotStructure(f"it reads {top!r}, whose values are not loaded (a large initializer)", data=True)
            needed = [] if node.op_type in ("Shape", "Size") else [i for i in node.input if i and i not in self.memo]
            if needed:
                if len(stack) > 100_000:
                    raise NotStructure("its subgraph is too deep")
                stack.extend(needed)
                continue
            stack.pop()
            self._run(node)
        value = self.memo[name]
        if isinstance(value, NotStructure):
            raise value
        return value

    def _run(self, node: onnx.NodeProto) -> None:
        args = [self.memo.get(i) if i else None for i in node.input] if node.op_type not in ("Shape", "Size") else []
        failed = next((a for a in args if isinstance(a, NotStructure)), None)
        try:
            if failed is not None:
                raise failed
            outs = self._outputs(node, args)
        except NotStructure as e:
            outs = [e] * len(node.output)
        except (ValueError, TypeError, IndexError, KeyError, ArithmeticError) as e:  # values a kernel would refuse
            why = NotStructure(f"its {node.op_type} node {node.name!r} could not be evaluated ({e})")
            outs = [why] * len(node.output)
        self.memo.update(zip(node.output, outs))

    def _outputs(self, node: onnx.NodeProto, args: list) -> list:
        if node.domain not in ("", "ai.onnx"):
            raise NotStructure(f"it runs {node.domain}.{node.op_type}")
        known = self.tensors.get(node.output[0]) if node.output else None
        shape = tuple(known.shape) if known is not None and known.is_static else None
        lazy = any(a is not None and not isinstance(a, np.ndarray) for a in args)
        big = shape is not None and len(shape) >= 2 and min(shape[-2:]) > 1 and prod(shape) > self.limit
        if lazy or big:
            if node.op_type not in _ELEMENTWISE or shape is None or len(node.output) != 1:
                raise NotStructure(f"{node.op_type} on the S_q × T mask")
            return [_symbolic(node, args, shape)]
        feeds = {i: a for i, a in zip(node.input, args) if i}
        outs = evaluate_node(node, self.tensors, feeds, _ARRAY_LIMIT)
        if outs is None:
            raise NotStructure(f"its {node.op_type} node {node.name!r} could not be evaluated")
        return [np.asarray(o) for o in outs]


@dataclass(frozen=True)
class GraphMask:
    """A mask the graph computes, evaluated: row i of sequence b keeps ``kept[b, i]`` keys (b over 1, or over the
    batch, for S_q queries over ``t`` keys); ``structure`` the :class:`AttentionMask` it equals, where one does
    (for the report), and ``source`` where it was found."""

    kept: np.ndarray = field(compare=False)
    t: int
    structure: AttentionMask | None = None
    source: str = "the graph"

    structured = True

    def pairs(self, batch: int, s_q: int, t: int) -> ExecutedPairs:
        """The kept pairs over ``batch`` sequences; for scores of another size than the mask's (a product the mask
        does not reach as evaluated), those of its structure, else all."""
        b, rows = self.kept.shape
        if (rows, self.t) != (s_q, t) or b not in (1, batch):
            try:
                if self.structure is not None:
                    return self.structure.pairs(batch, s_q, t)
            except ValueError:
                pass
            return ExecutedPairs(batch * s_q * t, batch * s_q)
        times = batch if b == 1 else 1
        return ExecutedPairs(times * int(self.kept.sum()), times * int(np.count_nonzero(self.kept)))

    def describe(self) -> str:
        if self.structure is not None:
            return self.structure.describe()
        b, rows = self.kept.shape
        return (f"a mask keeping {int(self.kept.sum())} of {b * rows * self.t} (query, key) pairs, evaluated from "
                f"{self.source}")


def mask_rows(value, scores_shape: tuple[int, ...]) -> _Rows | None:
    """The kept keys of each score row from a mask value added to the scores (``value``: a concrete array or a held
    one): a boolean keeps its true entries, a number its entries above :data:`MASKED`. None for a number held as
    q + k (a bias, such as relative positions)."""
    t = scores_shape[-1]
    shape = tuple(scores_shape)
    if isinstance(value, np.ndarray):
        if value.ndim > len(shape):
            raise NotStructure(f"a mask of shape {list(value.shape)} for scores of {list(shape)}")
        return _lift(value if value.dtype == np.bool_ else value > MASKED, shape)
    if isinstance(value, _Sum):
        return None
    if isinstance(value, _Select):
        yes, no = value.yes > MASKED, value.no > MASKED
        if yes == no:
            return _constant_rows(yes, value.rows.lo, t)
        return value.rows.over(t) if yes else value.rows.over(t).negate()
    return value.over(t)


def row_bounds(rows: _Rows, scores_shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """``(first key, keys kept)`` per (sequence, query): two [B or 1, S_q] arrays, the same for every head (else
    :class:`NotStructure`)."""
    r, s_q = len(scores_shape), scores_shape[-2]
    lo = np.maximum(rows.lo, 0)
    kept = np.maximum(np.minimum(rows.hi, rows.t) - lo, 0)
    out = []
    for x in np.broadcast_arrays(np.where(kept > 0, lo, 0), kept):
        if x.ndim > r:
            raise NotStructure(f"a mask of rank {x.ndim} for scores of rank {r}")
        x = x.reshape((1,) * (r - x.ndim) + x.shape)[..., 0]  # [B?, heads..., S_q]
        x = np.broadcast_to(x, x.shape[:-1] + (s_q,)).reshape(x.shape[0] if r >= 3 else 1, -1, s_q)
        if (x != x[:, :1]).any():
            raise NotStructure("a mask that differs between heads")
        out.append(np.ascontiguousarray(x[:, 0]))
    return out[0], out[1]


def recognise(lo: np.ndarray, kept: np.ndarray, t: int) -> AttentionMask | None:
    """The :class:`AttentionMask` (causal, window, padding, packed segments) that keeps exactly ``kept`` keys from
    ``lo`` on in each row ([B or 1, S_q] arrays over ``t`` keys); None when none does."""
    b, s_q = kept.shape
    some = kept > 0
    if not some.any():
        return None
    p = np.arange(t - s_q, t)
    widths = np.where(some, p - lo + 1, 0)
    windows = [None, int(widths.max())] if (lo[some] > 0).any() and widths.max() > 0 else [None]
    ends = np.where(some, lo + kept, 0).max(axis=1)
    lengths = [(), tuple(int(n) for n in ends)] if (ends < t).any() else [()]
    starts = np.unique(lo[0][some[0]])
    segments = [()]
    if len(starts) > 1 and starts[0] == 0:
        segments.append(tuple(int(n) for n in np.diff(np.append(starts, t))))
    for causal in (False, True):
        for window in windows:
            for n in lengths:
                for seg in segments:
                    try:
                        mask = AttentionMask(causal=causal, window=window, lengths=n, segments=seg)
                        low, high = mask.bounds(b, s_q, t)
                    except ValueError:
                        continue
                    k = np.maximum(high - low, 0)
                    if np.array_equal(k, kept) and np.array_equal(np.where(k > 0, low, 0), lo):
                        return mask
    return None


def _mask_terms(consumers: Mapping[str, list], matmul: onnx.NodeProto) -> list[tuple[str, str, str | None]]:
    """How each mask meets the scores between ``matmul`` and its Softmax: ``("add", mask, None)`` (also
    ``"sub"``), or ``("keep", condition, fill)`` for ``Where(condition, scores, fill)`` (``"drop"`` when the
    scores are the third input)."""
    terms = []
    tensor = matmul.output[0]
    for _ in range(16):
        users = [u for u in consumers.get(tensor, []) if u.op_type not in ("Shape", "Size")]
        if len(users) != 1 or users[0].op_type == "Softmax":
            break
        node = users[0]
        ins = list(node.input)
        if node.op_type == "Add":
            terms += [("add", i, None) for i in ins if i and i != tensor]
        elif node.op_type == "Sub" and ins[0] == tensor:
            terms.append(("sub", ins[1], None))
        elif node.op_type == "Where" and len(ins) == 3:
            if ins[1] == tensor:
                terms.append(("keep", ins[0], ins[2]))
            elif ins[2] == tensor:
                terms.append(("drop", ins[0], ins[1]))
        tensor = node.output[0]
    return terms


def _negated(value):
    if isinstance(value, np.ndarray):
        return -value
    if isinstance(value, _Select):
        return _Select(value.rows, -value.yes, -value.no)
    if isinstance(value, _Sum):
        return value
    raise NotStructure("a boolean subtracted from the scores")


def _term_rows(ev: "_Evaluator", how: str, tensor: str, fill: str | None, shape: tuple[int, ...], dense: bool = False):
    """The keys one mask term keeps: held by rows, or (``dense``) as a boolean array broadcastable to ``shape``;
    None for a term that masks nothing."""
    read = mask_array if dense else mask_rows
    if how in ("add", "sub"):
        value = ev(tensor)
        return read(value if how == "add" else _negated(value), shape)
    filled = ev(fill)
    if not isinstance(filled, np.ndarray) or not (filled <= MASKED).all():
        return None  # a select of finite values: not a mask
    cond = ev(tensor)
    rows = read(cond.astype(bool) if isinstance(cond, np.ndarray) else cond, shape)
    if rows is None or how == "keep":
        return rows
    return ~rows if dense else rows.negate()


def mask_array(value, scores_shape: tuple[int, ...]) -> np.ndarray | None:
    """:func:`mask_rows` as a boolean array broadcastable to ``scores_shape`` (for a mask of moderate size whose
    rows keep keys apart)."""
    t = scores_shape[-1]
    if isinstance(value, np.ndarray):
        return value if value.dtype == np.bool_ else value > MASKED
    if isinstance(value, _Sum):
        return None
    rows = value.rows if isinstance(value, _Select) else value
    rows = rows.over(t)
    j = np.arange(t)
    kept = (j >= rows.lo) & (j < rows.hi)
    if isinstance(value, _Select):
        return np.where(kept, value.yes > MASKED, value.no > MASKED)
    return kept


def _dense_counts(kept: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Keys kept per (sequence, query), [B or 1, S_q], from a boolean array broadcastable to the scores."""
    r = len(shape)
    if kept.ndim > r:
        raise NotStructure(f"a mask of rank {kept.ndim} for scores of rank {r}")
    kept = kept.reshape((1,) * (r - kept.ndim) + kept.shape)
    counts = np.broadcast_to(kept, kept.shape[:-1] + (shape[-1],)).sum(axis=-1)
    counts = np.broadcast_to(counts, counts.shape[:-1] + (shape[-2],)).reshape(counts.shape[0] if r >= 3 else 1, -1,
                                                                              shape[-2])
    if (counts != counts[:, :1]).any():
        raise NotStructure("a mask that differs between heads")
    return np.ascontiguousarray(counts[:, 0]).astype(np.int64)


def _without_padded_queries(lo: np.ndarray, kept: np.ndarray, attention_mask, t: int):
    """A padded query runs nothing (as :class:`AttentionMask` counts padding): where the given ``attention_mask``
    is right padding of valid lengths n_b over the T keys, the rows of queries at positions p ≥ n_b keep no key."""
    lengths = None if attention_mask is None else padding_lengths(attention_mask)
    if lengths is None or kept.shape[0] not in (1, len(lengths)) or np.asarray(attention_mask).shape[-1] != t:
        return lo, kept
    s_q = kept.shape[1]
    p = np.arange(t - s_q, t)
    running = p[None, :] < np.asarray(lengths)[:, None]
    kept = np.where(running, kept, 0)
    return np.where(running, lo, 0), kept


def graph_masks(protos, names, nodes: Mapping[str, tuple[str, int]], tensors: Mapping, values: Mapping,
                inputs: frozenset, given: frozenset = frozenset()):
    """The masks of a graph's attentions: ``(eager, operators)``. ``eager``: the mask of each eager attention
    (``nodes``: :func:`flopcount.masks.score_products`), in graph order; ``operators``: node name → the mask of each
    ONNX Attention node with an ``attn_mask`` input (a boolean keeps its true entries, a number its entries above
    :data:`MASKED`). Each a :class:`GraphMask`, or a :class:`NotStructure` saying why there is none. ``inputs``: the
    graph's inputs (their values unknown); ``given``: the inputs whose values were given (named in the report where
    a mask reads them)."""
    producer = {o: n for n in protos for o in n.output}
    consumers: dict[str, list] = {}
    for n in protos:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    names = list(names) if names is not None else [n.name for n in protos]
    by_name = dict(zip(names, protos))
    ev = _Evaluator(producer, tensors, values, inputs, EVAL_LIMIT)
    eager = []
    for name, (role, _) in sorted(nodes.items(), key=lambda kv: kv[1][1]):
        if role != "scores":
            continue
        matmul = by_name[name]
        known = tensors.get(matmul.output[0])
        try:
            if known is None or not known.is_static or len(known.shape) < 2:
                raise NotStructure("the scores' shape is not known")
            shape = tuple(known.shape)
            terms = _mask_terms(consumers, matmul)
            rows = None
            try:
                for how, tensor, fill in terms:
                    r = _term_rows(ev, how, tensor, fill, shape)
                    if r is not None:
                        rows = r if rows is None else _and(rows, r)
            except _Apart:  # rows that keep keys apart: counted from the array where it is of moderate size
                eager.append(_dense_mask(ev, terms, shape, given))
                continue
            if rows is None:
                eager.append(GraphMask(np.full((1, shape[-2]), shape[-1], np.int64), shape[-1],
                                       AttentionMask(source="the graph (no mask)"), "the graph (no mask)"))
                continue
            eager.append(_graph_mask(ev, *row_bounds(rows, shape), shape, [t for _, t, _ in terms], given))
        except NotStructure as e:
            eager.append(e)
        except (ValueError, TypeError, IndexError, ArithmeticError) as e:
            eager.append(NotStructure(f"its mask could not be evaluated ({e})"))
    operators = {}
    for name, node in zip(names, protos):
        if (node.op_type != "Attention" or node.domain not in ("", "ai.onnx") or len(node.input) < 4
                or not node.input[3]):
            continue
        q, m = tensors.get(node.input[0]), tensors.get(node.input[3])
        try:
            if q is None or m is None or not q.is_static or not m.is_static or len(m.shape) < 2:
                raise NotStructure("the attention's shapes are not known")
            b, s_q = q.shape[0], q.shape[2] if len(q.shape) == 4 else q.shape[1]
            shape = (b, 1, s_q, m.shape[-1])  # the scores, per head
            rows = mask_rows(ev(node.input[3]), shape)
            operators[name] = (None if rows is None else
                               _graph_mask(ev, *row_bounds(rows, shape), shape, [node.input[3]], given))
        except NotStructure as e:
            operators[name] = e
        except (ValueError, TypeError, IndexError, ArithmeticError) as e:
            operators[name] = NotStructure(f"its attn_mask could not be evaluated ({e})")
    return eager, operators


def _dense_mask(ev: "_Evaluator", terms, shape, given: frozenset) -> GraphMask:
    if prod(shape[-2:]) > _ARRAY_LIMIT:
        raise NotStructure("a mask row that keeps keys apart (not one interval), over too many entries to count")
    kept = None
    for how, tensor, fill in terms:
        k = _term_rows(ev, how, tensor, fill, shape, dense=True)
        if k is not None:
            kept = k if kept is None else kept & k
    counts = _dense_counts(kept, shape)
    return _graph_mask(ev, np.zeros_like(counts), counts, shape, [t for _, t, _ in terms], given, recognised=False)


def _graph_mask(ev: "_Evaluator", lo: np.ndarray, kept: np.ndarray, shape, tensors, given: frozenset,
                recognised: bool = True) -> GraphMask:
    """The :class:`GraphMask` of rows that keep ``kept`` keys from ``lo`` on ([B or 1, S_q] arrays), computed from
    ``tensors`` (the given values are the evaluator's)."""
    read = set().union(*(ev.ancestors(t) for t in tensors))
    if "attention_mask" in read & given:
        lo, kept = _without_padded_queries(lo, kept, ev.values.get("attention_mask"), shape[-1])
    source = "a Trilu in the graph" if "Trilu" in read else "position comparisons in the graph"
    used = sorted(read & given)
    if used:
        source += " and the " + ", ".join(used) + " values"
    structure = recognise(lo, kept, shape[-1]) if recognised else None
    return GraphMask(kept, shape[-1], None if structure is None else
                     AttentionMask(structure.causal, structure.window, structure.lengths, structure.segments, source),
                     source)
