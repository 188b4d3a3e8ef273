"""What one run of a control-flow body (an If branch, a Loop, Scan or SequenceMap body) keeps for its backward: its
nodes' saved-for-backward rules applied, each kept tensor counted once by its storage (a view's output is its
input's), sorted by where it lives (:class:`flopcount.saved.BodySaved`). The traversal of the count plans the body's
gradients and builds its nodes' contexts (:meth:`flopcount.counting._Traversal.subgraph_saved`); this is the
arithmetic on top."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import FlopcountError, InvalidGraphError
from ..registry import lookup_saved
from ..reporting.report import op_key, tensor_bytes
from ..saved import BodySaved
from .ledger import VIEWS

__all__ = ["body_saved"]


def body_saved(g: Any, run: Sequence[tuple[Any, Any, Mapping[str, Any]]], tensors: Mapping[str, Any],
               stored: frozenset[str], where: str) -> BodySaved:
    """The :class:`~flopcount.saved.BodySaved` of one run of the subgraph ``g`` whose nodes with a backward are
    ``run`` (their :class:`~flopcount.reporting.report.NodeCount`, context and attributes, in order); ``tensors``:
    name → :class:`~flopcount.context.TensorInfo`; ``stored``: weights and constants (no activations)."""
    made = {o for proto in g.node for o in proto.output if o}
    formal = {vi.name for vi in g.input}
    root: dict[str, str] = {}
    for proto in g.node:
        view = proto.op_type in VIEWS and proto.domain in ("", "ai.onnx") and proto.input and proto.input[0]
        for o in proto.output:
            if o:
                root[o] = root.get(proto.input[0], proto.input[0]) if view else o
    kept: set[str] = set()
    extra, missing = 0, {}
    for n, ctx, attrs in run:
        rule = lookup_saved(n.domain, n.op_type)
        if rule is None:
            key = op_key(n.domain, n.op_type)
            missing[key] = missing.get(key, 0) + 1
            continue
        try:
            s = rule(ctx, **attrs)
        except FlopcountError:
            raise
        except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as e:
            raise InvalidGraphError(f"{where}: node {n.name!r} ({n.op_type}) in a body: its inputs or attributes do "
                                    f"not fit the operator ({type(e).__name__}: {e}); check the node against the "
                                    "ONNX spec") from None
        extra += s.extra_bytes
        for key, count in s.missing:
            missing[key] = missing.get(key, 0) + count
        for positions, ts in ((s.inputs, n.inputs), (s.outputs, n.outputs)):
            for k in positions:
                if k < len(ts) and ts[k] is not None and ts[k].name:
                    kept.add(root.get(ts[k].name, ts[k].name))
    kept -= stored | {t.name for t in g.initializer}
    sizes = {x: tensor_bytes(tensors[x]) if tensors[x] is not None else None for x in kept}
    return BodySaved(sum(b or 0 for x, b in sizes.items() if x in made), extra,
                     frozenset(x for x in kept if x in formal),
                     sum(b or 0 for x, b in sizes.items() if x not in made and x not in formal),
                     frozenset(o.name for o in g.output if root.get(o.name, o.name) in kept),
                     tuple(sorted(missing.items())), tuple(sorted(x for x, b in sizes.items() if b is None)))
