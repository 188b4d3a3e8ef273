"""Executed attention (``--attention executed``): the (query, key) pairs a masked attention kernel runs.

``full`` attention (the default) counts what the graph computes: the whole S_q × T score matrix, masked afterwards.
A kernel that skips masked blocks (FlashAttention's causal and varlen paths, sliding-window kernels) runs only the
pairs the mask keeps. :class:`AttentionMask` describes that mask's *structure*; :meth:`AttentionMask.pairs` counts
its true entries exactly.

Conventions: S_q queries over T keys (T = P + S_q with P cached positions); queries are the last S_q positions,
*bottom-right aligned*: query i (0 ≤ i < S_q) sits at position p = T − S_q + i. A query at position p keeps key j
when all of these hold:

* causal: j ≤ p;
* sliding window of w: p − w < j (w keys at most, itself included);
* padding (right-padded sequences of valid lengths n_b): j < n_b and p < n_b (a padded query runs nothing);
* packed sequences (segments of lengths L_1, L_2 … laid end to end, positions reset at each start): j is in p's
  segment.

Counting is O(S_q) per call, vectorised, with no S_q × T matrix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import logging

import numpy as np

__all__ = ["AttentionMask", "ExecutedAttention", "ExecutedPairs", "executed_attention",
           "executed_entries", "executed_reduction", "packed_segments", "padding_lengths", "score_products", "values_structure"]

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ExecutedPairs:
    """Score entries a kernel computes over a batch and one head: ``pairs`` entries in ``rows`` non-empty rows."""

    pairs: int
    rows: int


@dataclass(frozen=True)
class AttentionMask:
    """The structure of an attention mask (see the module's docstring). ``lengths``: valid length per sequence
    (padding; one per batch element); ``segments``: packed sequence lengths (the same for every batch element);
    ``source`` says where the structure was found (the graph, the model's configuration)."""

    causal: bool = False
    window: int | None = None
    lengths: tuple[int, ...] = ()
    segments: tuple[int, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"a sliding window keeps at least one key, got {self.window}")
        if any(n < 0 for n in self.lengths) or any(n < 1 for n in self.segments):
            raise ValueError("padding lengths must be >= 0 and packed segments >= 1")

    @property
    def structured(self) -> bool:
        """Whether the mask drops any pair by its structure (a plain full mask does not)."""
        return self.causal or self.window is not None or bool(self.lengths) or bool(self.segments)

    def describe(self) -> str:
        parts = (["causal"] if self.causal else ["bidirectional"] if not self.window else []) + ([f"sliding window {self.window}"] if self.window else [])
        if self.lengths:
            parts.append("padding (lengths " + ", ".join(map(str, self.lengths)) + ")")
        if self.segments:
            parts.append("packed sequences (" + ", ".join(map(str, self.segments)) + ")")
        text = " + ".join(parts) or "no mask"
        return f"{text}, from {self.source}" if self.source else text

    def pairs(self, batch: int, s_q: int, t: int) -> ExecutedPairs:
        """The (query, key) pairs kept for ``batch`` sequences of S_q queries over T keys, summed over the batch.

        >>> AttentionMask(causal=True).pairs(1, 5, 5)   # 5·6/2
        ExecutedPairs(pairs=15, rows=5)
        >>> AttentionMask(causal=True).pairs(2, 2, 7)   # queries at positions 5 and 6: 6 + 7 keys, per sequence
        ExecutedPairs(pairs=26, rows=4)
        """
        low, high = self.bounds(batch, s_q, t)
        kept = np.maximum(high - low, 0)
        return ExecutedPairs(int(kept.sum()), int(np.count_nonzero(kept)))

    def bounds(self, batch: int, s_q: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """The keys each query keeps, ``[low, high)`` per sequence and query (two [batch, S_q] arrays; a row that
        keeps nothing has high ≤ low)."""
        if self.lengths and len(self.lengths) != batch:
            raise ValueError(f"the padding mask gives {len(self.lengths)} lengths for a batch of {batch}")
        if self.segments and sum(self.segments) != t:
            raise ValueError(f"packed segments of {sum(self.segments)} positions over {t} keys")
        p = np.arange(t - s_q, t, dtype=np.int64)  # positions of the queries
        low = np.zeros(s_q, dtype=np.int64)
        high = np.full(s_q, t, dtype=np.int64)
        if self.causal:
            high = np.minimum(high, p + 1)
        if self.window is not None:
            low = np.maximum(low, p - self.window + 1)
        if self.segments:
            ends = np.cumsum(np.asarray(self.segments, dtype=np.int64))
            seg = np.searchsorted(ends, p, side="right")
            starts = ends - np.asarray(self.segments, dtype=np.int64)
            low, high = np.maximum(low, starts[seg]), np.minimum(high, ends[seg])
        n = np.asarray(self.lengths or (t,) * batch, dtype=np.int64)[:, None]
        high = np.where(p < n, np.minimum(high, n), 0)
        return np.broadcast_to(low, high.shape).copy(), high


#: Largest B·S_q·T of a mask drawn entry by entry to count the sums of a gradient into a broadcast input.
REDUCTION_LIMIT = 2**24


def executed_reduction(executed: "ExecutedAttention | None", name: str, shape, input_shape) -> int | None:
    """The additions that sum the kept score entries' gradient into an input of shape ``input_shape`` that the
    node ``name`` (on an eager attention's path, output ``shape`` [B, …heads, S_q, T]) broadcasts over the scores
    (a learned position bias): every kept entry is added into the input's position it came from, so the count is
    the kept entries less the positions that receive at least one. None where :func:`executed_entries` is None, or
    the mask's entries cannot be drawn (a mask evaluated from the graph that is not one interval per row, read
    along T; a score matrix over :data:`REDUCTION_LIMIT` entries per head): the caller counts what the graph
    computes.

    >>> ex = ExecutedAttention({"add": ("path", 0)}, (AttentionMask(causal=True),))
    >>> executed_reduction(ex, "add", (1, 2, 3, 3), (3, 3))   # 2 heads × 6 kept into 6 positions: 12 − 6
    6
    """
    kept = executed_entries(executed, name, shape)
    if kept is None or input_shape is None or len(input_shape) > len(shape):
        return None
    mask = executed.mask(executed.role(name)[1])
    structure = mask if isinstance(mask, AttentionMask) else getattr(mask, "structure", None)
    b, s_q, t = shape[0], shape[-2], shape[-1]
    x = (1,) * (len(shape) - len(input_shape)) + tuple(input_shape)
    heads_x = int(np.prod(x[1:-2], dtype=np.int64))
    if structure is None or b * s_q * t > REDUCTION_LIMIT:
        return None
    try:
        low, high = structure.bounds(b, s_q, t)
    except ValueError:
        return None
    j = np.arange(t)
    dense = (j[None, None, :] >= low[:, :, None]) & (j[None, None, :] < high[:, :, None])  # [B, S_q, T]
    axes = tuple(a for a, d in zip((0, 1, 2), (x[0], x[-2], x[-1])) if d == 1)
    hit = np.count_nonzero(dense.any(axis=axes)) if axes else np.count_nonzero(dense)
    return kept.pairs - heads_x * int(hit)


#: Ops between the score product and its Softmax (scaling, masking, softcap, casts), and between the Softmax and
#: the product with V (casts, dropout).
_TO_SOFTMAX = frozenset({"Mul", "Div", "Add", "Sub", "Where", "Cast", "Tanh", "Identity"})
_FROM_SOFTMAX = frozenset({"Cast", "Dropout", "Identity", "Where"})


def score_products(protos, names=None) -> dict[str, tuple[str, int]]:
    """The nodes of eager attention: node name → (role, the attention's index in graph order). Roles:
    ``"scores"`` for the MatMul Q·Kᵀ, ``"values"`` for the MatMul probs·V, ``"softmax"`` for the Softmax between
    them, ``"path"`` for the element-wise nodes on the way (scale, mask add or select, softcap, casts, dropout),
    which run over the score matrix. A Softmax whose input comes from a MatMul through scaling and masking ops
    (:data:`_TO_SOFTMAX`) marks that MatMul; the MatMul that takes the Softmax's output (through casts or
    dropout) as its first input is the product with V."""
    producer, consumers = {}, {}
    name_of = {id(p): n for p, n in zip(protos, names)} if names is not None else {}
    for node in protos:
        for o in node.output:
            producer[o] = node
        for i in node.input:
            consumers.setdefault(i, []).append(node)
    found: dict[str, tuple[str, int]] = {}
    index = 0
    for node in protos:
        if node.op_type != "Softmax" or node.domain not in ("", "ai.onnx"):
            continue
        before: list = []
        after: list = []
        scores = _back_to_matmul(producer, node.input[0], before)
        values = _forward_to_matmul(consumers, node.output[0], after)
        if scores is None or values is None:
            continue
        found[name_of.get(id(scores), scores.name)] = ("scores", index)
        found[name_of.get(id(values), values.name)] = ("values", index)
        found[name_of.get(id(node), node.name)] = ("softmax", index)
        for step in before + after:
            found.setdefault(name_of.get(id(step), step.name), ("path", index))
        index += 1
    return found


def _back_to_matmul(producer, tensor, path: list):
    """The MatMul whose scores reach ``tensor`` through :data:`_TO_SOFTMAX` ops (appended to ``path``), or None."""
    for _ in range(16):
        node = producer.get(tensor)
        if node is None:
            return None
        if node.op_type == "MatMul":
            return node
        if node.op_type not in _TO_SOFTMAX:
            return None
        path.append(node)
        # the scores run through the first input that comes from a MatMul chain; a mask or scale is the other
        tensor = next((i for i in node.input if i and _reaches_matmul(producer, i)), None)
        if tensor is None:
            return None
    return None


def _reaches_matmul(producer, tensor, depth: int = 16) -> bool:
    for _ in range(depth):
        node = producer.get(tensor)
        if node is None:
            return False
        if node.op_type == "MatMul":
            return True
        if node.op_type not in _TO_SOFTMAX or not node.input:
            return False
        tensor = node.input[0] if node.op_type != "Where" else node.input[1]
    return False


def _forward_to_matmul(consumers, tensor, path: list):
    """The MatMul that reads ``tensor`` (the probabilities) as its first input through :data:`_FROM_SOFTMAX` ops
    (appended to ``path``), or None."""
    for _ in range(8):
        # a guard of fully masked rows (Where(IsNaN(p), 0, p)) reads the probabilities beside the path
        users = [u for u in consumers.get(tensor, []) if u.op_type not in ("IsNaN", "Shape")]
        if len(users) != 1:
            return None
        (node,) = users
        if node.op_type == "MatMul":
            return node if node.input[0] == tensor else None
        if node.op_type not in _FROM_SOFTMAX:
            return None
        path.append(node)
        tensor = node.output[0]
    return None


def executed_entries(executed: "ExecutedAttention | None", name: str, shape) -> ExecutedPairs | None:
    """The entries (over the batch and every head) and non-empty rows of the score matrix that a masked kernel
    computes, for the node ``name`` of output ``shape`` [B, …heads, S_q, T] on an eager attention's path
    (``"softmax"`` or ``"path"``: the scale, the mask's add, the softcap, the Softmax, dropout) under
    ``--attention executed`` with a structured mask; None for any other node, under ``--attention full``, or where
    the mask is not known (then the node counts every entry, as the graph computes it).

    >>> ex = ExecutedAttention({"sm": ("softmax", 0)}, (AttentionMask(causal=True),))
    >>> executed_entries(ex, "sm", (1, 2, 4, 4))   # 2 heads · 4·5/2 pairs, 2 heads · 4 rows
    ExecutedPairs(pairs=20, rows=8)
    """
    role = executed.role(name) if executed is not None else None
    if role is None or role[0] not in ("softmax", "path") or shape is None or len(shape) < 3:
        return None
    mask = executed.mask(role[1])
    if mask is None or not mask.structured:
        return None
    b, s_q, t = shape[0], shape[-2], shape[-1]
    heads = int(np.prod(shape[1:-2], dtype=np.int64))
    kept = mask.pairs(b, s_q, t)
    return ExecutedPairs(heads * kept.pairs, heads * kept.rows)


def _has_trilu(producer, tensor, depth: int = 24) -> bool:
    """Whether a lower-triangular Trilu (upper=0) or an upper one built to be subtracted lies among ``tensor``'s
    ancestors (a breadth-limited search)."""
    stack, seen = [(tensor, 0)], set()
    while stack:
        t, d = stack.pop()
        node = producer.get(t)
        if node is None or id(node) in seen or d > depth:
            continue
        seen.add(id(node))
        if node.op_type == "Trilu":
            return True
        stack.extend((i, d + 1) for i in node.input if i)
    return False


@dataclass(frozen=True)
class ExecutedAttention:
    """``--attention executed`` for one graph: the eager score products (:func:`score_products`), the mask of each
    attention in graph order (``masks``; one mask for all when it has one entry, none when the structure is not
    known) and what the report says (``note``)."""

    score_nodes: Mapping[str, tuple[str, int]]
    masks: tuple[AttentionMask | None, ...] = ()
    note: str = ""
    operators: Mapping[str, Any] = field(default_factory=dict)  # Attention node → the mask of its attn_mask

    def operator_mask(self, name: str):
        """The mask evaluated from the ``attn_mask`` input of the Attention node ``name``, or None."""
        return self.operators.get(name)

    def mask(self, index: int) -> AttentionMask | None:
        if not self.masks:
            return None
        return self.masks[index] if index < len(self.masks) else self.masks[-1]

    def role(self, name: str) -> tuple[str, int | str] | None:
        """``("scores" | "values", index)`` for an eager product, ``("operator", name)`` for an Attention node with
        a mask evaluated from its ``attn_mask`` (counts of equal shapes may differ by their masks), else None."""
        found = self.score_nodes.get(name)
        if found is None and name in self.operators:
            return ("operator", name)
        return found


def padding_lengths(values, shape=None) -> tuple[int, ...] | None:
    """Valid lengths of a right-padded 0/1 ``attention_mask`` [B, T] (each row ones, then zeros; flat values
    take ``shape``); None for any other mask (left padding, holes, another rank): its structure is not modelled.

    >>> padding_lengths([[1, 1, 1, 0], [1, 1, 1, 1]])
    (3, 4)
    >>> padding_lengths([1, 1, 0, 1], (2, 2)) is None  # a hole in the second row
    True
    """
    a = np.asarray(values)
    if shape is not None and a.size == int(np.prod(shape)):
        a = a.reshape(shape)
    if a.ndim != 2 or not np.isin(a, (0, 1)).all():
        return None
    lengths = a.sum(axis=1).astype(np.int64)
    if (a != (np.arange(a.shape[1]) < lengths[:, None])).any():
        return None
    return tuple(int(n) for n in lengths)


def packed_segments(position_ids, shape=None) -> tuple[int, ...] | None:
    """The segment lengths of packed sequences from their ``position_ids`` [B, T] (positions that restart at 0 at
    each sequence: 0 1 2 0 1 0 1 2 → 3, 2, 3; every row alike); None when they do not restart or rows differ.

    >>> packed_segments([[0, 1, 2, 0, 1, 0, 1, 2]])
    (3, 2, 3)
    >>> packed_segments([[0, 1, 2, 3]]) is None  # one sequence: nothing packed
    True
    """
    a = np.asarray(position_ids)
    if shape is not None and a.size == int(np.prod(shape)):
        a = a.reshape(shape)
    if a.ndim == 1:
        a = a[None]
    if a.ndim != 2 or a.shape[1] == 0 or (a != a[:1]).any():
        return None
    row = a[0].astype(np.int64)
    starts = np.flatnonzero(row == 0)
    if len(starts) < 2 or starts[0] != 0:
        return None
    lengths = np.diff(np.append(starts, len(row)))
    expected = np.concatenate([np.arange(n) for n in lengths])
    if (row != expected).any():
        return None
    return tuple(int(n) for n in lengths)


def values_structure(input_values, tensors, where: str = "<model>"):
    """``(padding lengths, packed segments)`` from the values given for the ``attention_mask`` and
    ``position_ids`` inputs (``input_values``; shapes from ``tensors``, name → TensorInfo); None for each not
    given or not of that form (a warning says so)."""
    found = []
    for name, read in (("attention_mask", padding_lengths), ("position_ids", packed_segments)):
        if name not in (input_values or {}):
            found.append(None)
            continue
        known = tensors.get(name)
        structure = read(input_values[name], known.shape if known is not None else None)
        if structure is None and name == "attention_mask":
            log.warning("%s: attention_mask's values are not right padding (ones, then zeros): counted as no padding",
                        where)
        found.append(structure)
    return tuple(found)


def executed_attention(protos, given=None, names=None, padding: tuple[int, ...] | None = None,
                       segments: tuple[int, ...] | None = None, evaluated=None) -> ExecutedAttention:
    """The :class:`ExecutedAttention` of a graph: ``given`` (an :class:`AttentionMask`, or one per attention in
    graph order, from the model's configuration) or else the structure the graph shows: ``evaluated``, the masks
    :func:`flopcount.pipeline.graph_masks.graph_masks` evaluated from the graph (ranges, comparisons, a Trilu, the values of
    inputs given), where an attention has none of those a Trilu among its mask's ancestors is causal. A mask that
    reads an input whose values are not given is data: that attention counts full. The ONNX Attention operator reads
    its own ``is_causal`` and windows."""
    nodes = score_products(protos, names)
    if given is not None:
        masks = (given,) if isinstance(given, AttentionMask) else tuple(given)
        if padding is not None:  # the attention_mask's values: padding on top of the configuration's structure
            masks = tuple(None if m is None else replace(m, lengths=padding, source=f"{m.source} and the "
                                                         "attention_mask values") for m in masks)
        if segments is not None:  # position_ids that restart: packed sequences
            masks = tuple(None if m is None else replace(m, segments=segments, source=f"{m.source} and the "
                                                         "position_ids values") for m in masks)
        kinds = sorted({m.describe() for m in masks if m is not None})
        return ExecutedAttention(nodes, masks, "; ".join(kinds) or "no structured mask")
    found, operators = evaluated if evaluated is not None else ([None] * len(nodes), {})
    if not nodes and not operators:
        return ExecutedAttention(nodes, (), "no eager attention products in the graph")
    producer = {o: n for n in protos for o in n.output}
    consumers: dict[str, list] = {}
    for n in protos:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    by_name = {name: n for n, name in zip(protos, names)} if names is not None else {n.name: n for n in protos}
    masks, why = [], []
    scores = [name for name, (role, _) in sorted(nodes.items(), key=lambda kv: kv[1][1]) if role == "scores"]
    for name, mask in zip(scores, found):
        if mask is not None and not isinstance(mask, Exception):
            masks.append(mask)
            continue
        if any(_has_trilu(producer, t) for t in _mask_inputs(consumers, by_name[name])):
            masks.append(AttentionMask(causal=True, source="a Trilu in the graph"))
            continue
        masks.append(None)
        data = mask is None or getattr(mask, "data", False)
        why.append((data, str(mask) if mask is not None else "an attention_mask input or computed values"))
    known = [m for m in masks if m is not None]
    ops_known = [m for m in operators.values() if m is not None and not isinstance(m, Exception)]
    kinds = sorted({m.describe() for m in known + ops_known})
    notes = [f"{'; '.join(kinds)} ({len(known) + len(ops_known)} attentions)"] if known or ops_known else []
    for e in operators.values():
        if isinstance(e, Exception):
            why.append((getattr(e, "data", False), str(e)))
    total = len(masks) + len(operators)
    for data, what in ((True, "is data, not structure"), (False, "was not evaluated")):
        reasons = sorted({r for d, r in why if d == data})
        if reasons:
            count = sum(d == data for d, _ in why)
            notes.append(f"the mask of {count} of {total} attentions {what} ({'; '.join(reasons)}): counted full")
    note = "; ".join(notes) or "the Attention nodes' own attributes"
    return ExecutedAttention(nodes, tuple(masks), note, {k: v for k, v in operators.items()
                                                         if v is not None and not isinstance(v, Exception)})


def _mask_inputs(consumers, matmul) -> list[str]:
    """The tensors added or selected into the scores between ``matmul`` and its Softmax (the mask, the bias)."""
    out = []
    tensor = matmul.output[0]
    for _ in range(16):
        users = consumers.get(tensor, [])
        if len(users) != 1 or users[0].op_type == "Softmax":
            break
        node = users[0]
        out += [i for i in node.input if i and i != tensor]
        tensor = node.output[0]
    return out
