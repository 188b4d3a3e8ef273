"""Which graph nodes each executed node runs (onnxruntime's fusions and layout passes), the bytes crossing a group
of nodes, and whether a group is compute- or memory-bound against the machine's ceilings."""

from __future__ import annotations

from flopcount.reporting.report import NodeCount, node_bytes, tensor_bytes

from .records import NodeProfile, OpTypeProfile

__all__ = ["attribute", "bound_of", "by_op_type", "ceiling_dtype", "group_bytes"]

#: ONNX element type → the ceilings' dtype name.
_CEILING_DTYPE = {1: "fp32", 10: "fp16", 16: "bf16", 11: "fp64"}


_NCHWC = "_nchwc"
_REORDER = ("ReorderInput", "ReorderOutput")
_MOVES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Transpose"})  # compute nothing


def _absorbs(node) -> dict[str, int]:
    """What an executed node computes after its own output, by its attributes: an ``activation`` (onnxruntime's
    FusedConv, FusedGemm and NCHWc Conv) and, for a convolution with a fourth input, the sum of that input
    (Conv + Add fusion). Op type → how many such graph nodes it absorbs downstream."""
    out: dict[str, int] = {}
    for a in node.attribute:
        if a.name == "activation" and a.s:
            out[a.s.decode()] = 1
    if node.op_type in ("Conv", "FusedConv") and len(node.input) >= 4 and node.input[3]:
        out["Add"] = out.get("Add", 0) + 1
        out["Sum"] = out.get("Sum", 0) + 1
    return out


def attribute(graph_nodes, names: list[str], optimized_graph) -> dict[str, list[int]]:
    """Executed node name → the graph positions of the nodes it runs, for an optimised graph.

    A node belongs to the executed node that produces one of its outputs. A node fused away belongs, first, to the
    executed node that absorbed it downstream of its own output (a convolution's ``activation``, or the residual
    ``Add`` of a convolution that takes the sum as a fourth input) where that node owns the producer of the fused
    node's input; else to the owner of its first consumer that has one (a ``Transpose`` folded into the product
    it feeds). Nodes folded into constants belong to none. onnxruntime's NCHWc layout pass names each node it
    rewrites ``<tensor>_nchwc`` after the tensor it stands for, whose name its output no longer carries (a
    ``ReorderOutput`` may carry it instead): such a node counts as producing ``<tensor>``. A data-movement node
    the optimiser inserted (a node of no graph node's name: the Reshapes around the Gemm that MatMul + Add of a
    3-D input become) passes what it writes on to the node that computed its input, unless the graph node that
    wrote it moves data too (a Transpose the optimiser rebuilt under a new name)."""
    produced = {o: n.name for n in optimized_graph.node for o in n.output if o}
    known = set(names)
    inserted = {n.name: n.input[0] for n in optimized_graph.node
                if n.op_type in _MOVES and n.domain in ("", "ai.onnx") and n.input and n.name not in known}

    def computed_by(name: str) -> str:
        """Back from an inserted move through its input, to the node that computed what it moves."""
        for _ in range(len(inserted)):
            up = produced.get(inserted[name]) if name in inserted else None
            if up is None:
                break
            name = up
        return name
    layout = {n.name for n in optimized_graph.node if n.op_type in _REORDER}
    for n in optimized_graph.node:
        if not n.name.endswith(_NCHWC):
            continue
        stands_for = n.name[: -len(_NCHWC)]
        if produced.get(stands_for) in (None, *layout):  # a reorder back to NCHW only moves what this node computed
            produced[stands_for] = n.name
    capacity = {n.name: _absorbs(n) for n in optimized_graph.node}
    producer: dict[str, int] = {}
    consumers: dict[str, list[int]] = {}
    for i, n in enumerate(graph_nodes):
        for t in n.output:
            producer[t] = i
        for t in n.input:
            consumers.setdefault(t, []).append(i)
    owner: dict[int, str | None] = {}
    moved: dict[int, str] = {}  # nodes whose output only a reorder writes: theirs unless a computing node absorbed them
    for i, n in enumerate(graph_nodes):  # downstream absorption, in graph order: Conv → Add → Relu
        found = next((produced[o] for o in n.output if o in produced), None)
        if found in inserted and n.op_type not in _MOVES:  # a move of the optimiser's writes what n computed
            found = computed_by(found)
        if found in layout:
            moved[i], found = found, None
        if found is None:
            for t in n.input:
                up = owner.get(producer.get(t, -1))
                if up is not None and capacity[up].get(n.op_type, 0) > 0:
                    capacity[up][n.op_type] -= 1
                    found = up
                    break
        owner[i] = found
    for i in range(len(graph_nodes) - 1, -1, -1):  # the rest: with the first consumer that has an owner
        if owner[i] is not None:
            continue
        n = graph_nodes[i]
        for o in n.output:
            for j in consumers.get(o, ()):
                if j > i and owner.get(j):
                    owner[i] = owner[j]
                    if owner[i] in inserted and n.op_type not in _MOVES:  # a move merged with the optimiser's
                        owner[i] = computed_by(owner[i])
                    break
            if owner[i]:
                break
    for i, name in moved.items():
        if owner[i] is None:
            owner[i] = name
    out: dict[str, list[int]] = {}
    for i, name in sorted(owner.items()):
        if name is not None:
            out.setdefault(name, []).append(i)
    return out


def group_bytes(nodes: list[NodeCount]) -> int | None:
    """Bytes crossing the boundary of a group of nodes: tensors read from outside it and tensors it writes that
    are used outside it (or are graph outputs: all outputs of its last node are counted)."""
    if len(nodes) == 1:
        b = node_bytes(nodes[0])
        return None if b is None else b.total
    inside_out = {t.name: t for n in nodes for t in n.outputs if t is not None}
    inside_in = {t.name for n in nodes for t in n.inputs if t is not None}
    total = 0
    seen: set[str] = set()
    for n in nodes:
        for t in n.inputs:
            if t is not None and t.name not in inside_out and t.name not in seen:
                b = tensor_bytes(t)
                if b is None:
                    return None
                total += b
                seen.add(t.name)
    for name, t in inside_out.items():
        if name not in inside_in or t in nodes[-1].outputs:
            b = tensor_bytes(t)
            if b is None:
                return None
            total += b
    return total


def ceiling_dtype(nodes: list[NodeCount]) -> str:
    for n in nodes:
        for t in n.outputs:
            if t is not None and t.elem_type in _CEILING_DTYPE:
                return _CEILING_DTYPE[t.elem_type]
    return "fp32"


def bound_of(flops: int, nbytes: int | None, dtype: str, ceilings) -> str | None:
    """``"memory"`` when the intensity ``flops / nbytes`` is below the ridge point (compute ceiling of ``dtype``,
    else fp32, over the memory bandwidth), ``"compute"`` at or above it; None when either is unknown."""
    if not nbytes or ceilings is None or ceilings.memory_bandwidth is None:
        return None
    peak = ceilings.compute(dtype) or ceilings.compute("fp32")
    if peak is None:
        return None
    return "memory" if flops / nbytes < peak.value / ceilings.memory_bandwidth.value else "compute"


def by_op_type(rows: list[NodeProfile], ceilings) -> dict[str, OpTypeProfile]:
    acc: dict[str, list[NodeProfile]] = {}
    for r in rows:
        acc.setdefault(r.op_type, []).append(r)
    out = {}
    for op, rs in acc.items():
        # bytes of the graph nodes these executed nodes run; one that runs none (a Reshape the optimiser inserted)
        # adds no counted work, rather than making the sum unknown
        counted = [r for r in rs if r.covers]
        nbytes = None if not counted or any(r.bytes is None for r in counted) else sum(r.bytes for r in counted)
        flops = sum(r.flops for r in rs)
        out[op] = OpTypeProfile(op, len(rs), flops, nbytes, sum(r.time_s or 0.0 for r in rs),
                                bound_of(flops, nbytes, rs[0].dtype, ceilings))
    return dict(sorted(out.items(), key=lambda kv: -kv[1].time_s))
