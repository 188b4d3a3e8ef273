"""ONNX graph → networkx DAG: nodes are operators (keyed by their index), edges are tensors.

Node attributes: ``proto`` (the NodeProto) and ``name`` (the node's name, or ``OpType_index``
where the model leaves it empty). Edge attribute ``tensors``: the names flowing along the edge.
Graph attributes: ``producer`` (tensor → node index), ``inputs`` (real graph inputs: declared
inputs that are not initializers), ``initializers``, ``outputs``, ``order`` (a topological order
of the node indices) and ``bodies`` (indices of nodes with subgraphs: If, Loop, Scan ...).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import networkx as nx
import onnx

from .errors import InvalidGraphError


# Standard operators with subgraph attributes; nodes of other domains are inspected too.
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def node_label(proto: onnx.NodeProto, index: int) -> str:
    return proto.name or f"{proto.op_type}_{index}"


def subgraph_outer_names(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from enclosing scopes."""
    names: set[str] = set()
    for a in node.attribute:
        graphs = [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)
        for g in graphs:
            defined = {i.name for i in g.input} | {t.name for t in g.initializer}
            defined |= {t.values.name for t in g.sparse_initializer}
            for n in g.node:
                for name in list(n.input) + sorted(subgraph_outer_names(n)):
                    if name and name not in defined:
                        names.add(name)
                defined.update(n.output)
    return names


def build_graph(graph: onnx.GraphProto, where: str, outer: Iterable[str] = ()) -> nx.DiGraph:
    """Build the DAG of ``graph`` and check it: every input produced once, outputs unique, no cycle.

    ``outer`` names tensors visible from enclosing graphs (for subgraph bodies).
    """
    initializers = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    declared_inputs = [i.name for i in graph.input]
    available = set(outer) | initializers | set(declared_inputs)

    producer: dict[str, int] = {}
    for idx, node in enumerate(graph.node):
        for out in node.output:
            if not out:
                continue
            if out in producer:
                other = graph.node[producer[out]]
                raise InvalidGraphError(
                    f"{where}: tensor {out!r} is produced twice, by node {node_label(other, producer[out])!r} "
                    f"({other.op_type}) and node {node_label(node, idx)!r} ({node.op_type}); output names "
                    "must be unique: rename one and re-export"
                )
            if out in initializers or out in declared_inputs:
                kind = "initializer" if out in initializers else "graph input"
                raise InvalidGraphError(
                    f"{where}: node {node_label(node, idx)!r} ({node.op_type}) writes tensor {out!r}, "
                    f"which is already a {kind}; output names must be unique"
                )
            producer[out] = idx

    dag = nx.DiGraph(
        producer=producer,
        inputs=tuple(n for n in declared_inputs if n not in initializers),
        initializers=frozenset(initializers),
        outputs=tuple(o.name for o in graph.output),
    )
    protos = list(graph.node)  # one wrapper per node, reused by every later pass
    names = [node_label(n, i) for i, n in enumerate(protos)]
    dag.graph["protos"], dag.graph["names"] = protos, names
    dag.add_nodes_from((i, {"proto": n, "name": names[i]}) for i, n in enumerate(protos))

    edges: dict[tuple[int, int], list[str]] = defaultdict(list)
    in_order = True
    bodies = []  # nodes with subgraph attributes
    for idx, node in enumerate(protos):
        reads = node.input
        if node.op_type in SUBGRAPH_OPS or node.domain not in ("", "ai.onnx"):
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                bodies.append(idx)
            outer_reads = subgraph_outer_names(node)
            if outer_reads:
                reads = [*reads, *sorted(outer_reads)]
        for name in reads:
            if not name:
                continue  # an omitted optional input
            src = producer.get(name)
            if src is None:
                if name not in available:
                    raise InvalidGraphError(
                        f"{where}: node {node_label(node, idx)!r} ({node.op_type}) reads tensor {name!r}, "
                        "which no node produces and which is neither a graph input nor an initializer; "
                        "the graph is incomplete: re-export it or add the missing input"
                    )
                continue
            edges[(src, idx)].append(name)
            in_order = in_order and src < idx
    dag.add_edges_from((u, v, {"tensors": t}) for (u, v), t in edges.items())

    for name in dag.graph["outputs"]:
        if name not in producer and name not in available:
            raise InvalidGraphError(
                f"{where}: graph output {name!r} is produced by no node and is not an input; "
                "the graph is incomplete"
            )

    dag.graph["bodies"] = bodies
    dag.graph["order"] = list(range(len(graph.node))) if in_order else _topological_order(dag, where)
    return dag


def _topological_order(dag: nx.DiGraph, where: str) -> list[int]:
    try:
        return list(nx.topological_sort(dag))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(dag)
        names = " -> ".join(repr(dag.nodes[u]["name"]) for u, _ in cycle)
        raise InvalidGraphError(
            f"{where}: the graph has a cycle ({names} -> {dag.nodes[cycle[0][0]]['name']!r}); "
            "ONNX graphs must be acyclic (use Loop for recurrence)"
        ) from None
