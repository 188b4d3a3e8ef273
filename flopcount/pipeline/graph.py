"""ONNX graph → networkx DAG: nodes are operators (keyed by their index), edges are tensors.

Node attributes: ``proto`` (the NodeProto) and ``name`` (the node's name, or ``OpType_index``
where the model leaves it empty). Edge attribute ``tensors``: the names flowing along the edge.
:func:`build_graph` reads the graph once into a frozen :class:`GraphIndex` that the counting stages
(validation, shapes, parameters, counting, module scopes) receive; the DAG inside it serves graph algorithms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, repeat
from typing import TYPE_CHECKING, Iterable, NoReturn

import onnx

from ..errors import InvalidGraphError

if TYPE_CHECKING:
    import networkx as nx  # imported where a graph algorithm runs: a count without one never loads it


# Standard operators with subgraph attributes; nodes of other domains are inspected too.
SUBGRAPH_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})


@dataclass(frozen=True)
class GraphIndex:
    """What :func:`build_graph` reads from one graph, for every later stage; nodes are known by their index.
    :attr:`dag`, the networkx graph, is built when first read: only graph algorithms need it."""

    protos: Sequence[onnx.NodeProto]  #: per node: its proto (one wrapper, reused by every pass)
    names: Sequence[str]  #: per node: its name, or ``OpType_index`` where the model leaves it empty
    node_ops: Sequence[tuple[str, str]]  #: per node: ``(domain, op_type)`` as written
    node_inputs: Sequence[tuple[str, ...]]  #: per node: its input names, "" for an omitted optional one
    node_outputs: Sequence[tuple[str, ...]]  #: per node: its output names, "" for an omitted optional one
    producer: Mapping[str, int]  #: tensor → the index of the node that writes it
    inputs: tuple[str, ...]  #: the real graph inputs: declared inputs that are not initializers
    initializers: frozenset[str]  #: initializer names (dense and sparse)
    initializer_types: Mapping[str, tuple[int, tuple[int, ...]]]  #: dense initializer → (data type, dims), read once
    outputs: tuple[str, ...]  #: the graph's output names
    order: Sequence[int]  #: a topological order of the node indices
    bodies: Sequence[int]  #: indices of the nodes holding subgraphs (If, Loop, Scan ...)
    captured: Mapping[int, tuple[str, ...]]  #: node index → the outer tensors its subgraphs read (where they do)

    @cached_property
    def dag(self) -> nx.DiGraph:
        """Nodes ``0..n-1`` (attributes ``proto`` and ``name``), edges labelled with the tensors they carry
        (attribute ``tensors``, in the order the reader reads them): for graph algorithms."""
        return _dag(self.protos, self.names, self.node_inputs, self.captured, self.producer)


def walk_graphs(graph: onnx.GraphProto) -> Iterable[onnx.GraphProto]:
    """Yield ``graph`` and, recursively, every subgraph held in a node attribute (``If``, ``Loop``, ``Scan``)."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from walk_graphs(attribute.g)
            elif attribute.type == onnx.AttributeProto.GRAPHS:
                for subgraph in attribute.graphs:
                    yield from walk_graphs(subgraph)


def model_tensors(model: onnx.ModelProto) -> Iterable[onnx.TensorProto]:
    """Yield every tensor ``model`` holds: the initializers of its graph and subgraphs, and the tensors in node
    attributes (``Constant``'s ``value``, ...) of its graph, its model-local functions and their subgraphs."""
    graphs = list(walk_graphs(model.graph))
    for graph in graphs:
        yield from graph.initializer
    function_bodies = [
        body
        for function in model.functions
        for node in function.node
        for attribute in node.attribute
        for subgraph in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs)
        for body in walk_graphs(subgraph)
    ]
    node_lists = [g.node for g in graphs + function_bodies] + [function.node for function in model.functions]
    for node in (node for nodes in node_lists for node in nodes):
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors


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


def build_graph(graph: onnx.GraphProto, where: str, outer: Iterable[str] = ()) -> GraphIndex:
    """Build the DAG of ``graph`` and its :class:`GraphIndex`, and check it: every input produced once, outputs
    unique, no cycle.

    ``outer`` names tensors visible from enclosing graphs (for subgraph bodies).
    """
    protos = list(graph.node)  # one wrapper per node, reused by every later pass
    initializer_types = {t.name: (t.data_type, tuple(t.dims[:])) for t in graph.initializer}
    initializers = {*initializer_types, *(t.values.name for t in graph.sparse_initializer)}
    declared_inputs = [i.name for i in graph.input]
    available = set(outer) | initializers | set(declared_inputs)

    # Every node's input and output names, read from protobuf once; later passes use these tuples. A repeated field
    # is copied by slicing it (one call into protobuf, about a third of the time of iterating it).
    node_inputs = [tuple(n.input[:]) for n in protos]
    node_outputs = [tuple(n.output[:]) for n in protos]
    node_ops = [(n.domain, n.op_type) for n in protos]

    # Checked in bulk; the node-by-node search for the culprit runs only when a check fails.
    producer = {out: idx for idx, outs in enumerate(node_outputs) for out in outs}
    written = sum(map(len, node_outputs)) - sum(outs.count("") for outs in node_outputs)
    producer.pop("", None)  # omitted optional outputs
    if len(producer) != written or not producer.keys().isdisjoint(initializers.union(declared_inputs)):
        writes = [(out, idx) for idx, outs in enumerate(node_outputs) for out in outs if out]
        _explain_bad_write(protos, writes, initializers, set(declared_inputs), where)

    outputs = tuple(o.name for o in graph.output)
    names = [n.name or f"{n.op_type}_{i}" for i, n in enumerate(protos)]  # node_label, inlined

    bodies = []  # nodes with subgraph attributes
    captured: dict[int, tuple[str, ...]] = {}  # node → outer tensors its subgraphs read
    reads: list = node_inputs.copy()
    for idx, (domain, op_type) in enumerate(node_ops):
        if op_type in SUBGRAPH_OPS or domain not in ("", "ai.onnx"):
            node = protos[idx]
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                bodies.append(idx)
            outer_reads = subgraph_outer_names(node)
            if outer_reads:
                captured[idx] = tuple(sorted(outer_reads))
                reads[idx] = [*reads[idx], *captured[idx]]
    # Where each read tensor comes from: a producing node's index, or -1 (graph input, initializer, outer
    # scope, or "" for an omitted optional input). A node reading only from earlier nodes keeps the order.
    source = dict.fromkeys(available, -1)
    source[""] = -1
    source.update(producer)
    # Every read looked up (none may be missing) and compared with the index of the node reading it, in one pass of
    # C-level iterators over the flattened reads: no Python frame per node.
    readers = chain.from_iterable(map(repeat, range(len(reads)), map(len, reads)))
    try:
        in_order = all(map(int.__lt__, map(source.__getitem__, chain.from_iterable(reads)), readers))
        if not in_order:  # all() stopped at the first read out of order: the rest are looked up still
            set(map(source.__getitem__, chain.from_iterable(reads)))
    except KeyError:
        _explain_missing_input(protos, reads, source, where)

    for name in outputs:
        if name not in producer and name not in available:
            raise InvalidGraphError(
                f"{where}: graph output {name!r} is produced by no node and is not an input; "
                "the graph is incomplete"
            )

    order = list(range(len(protos)))
    index = GraphIndex(
        protos=protos, names=names, node_ops=node_ops, node_inputs=node_inputs, node_outputs=node_outputs,
        producer=producer, inputs=tuple(n for n in declared_inputs if n not in initializers),
        initializers=frozenset(initializers), initializer_types=initializer_types, outputs=outputs, order=order, bodies=bodies,
        captured=captured,
    )
    if not in_order:
        order[:] = _topological_order(index.dag, where)
    return index


def _explain_missing_input(protos, reads, source, where) -> NoReturn:
    """Raise the error for the first node that reads a tensor nothing provides (not in ``source``)."""
    for idx, names_read in enumerate(reads):
        for name in names_read:
            if name not in source:
                node = protos[idx]
                raise InvalidGraphError(
                    f"{where}: node {node_label(node, idx)!r} ({node.op_type}) reads tensor {name!r}, "
                    "which no node produces and which is neither a graph input nor an initializer; "
                    "the graph is incomplete: re-export it or add the missing input"
                )
    raise AssertionError("called without a missing input")


def _dag(protos, names, node_inputs, captured, producer) -> nx.DiGraph:
    """The networkx DAG of a graph read by :func:`build_graph`."""
    # The adjacency is built as plain dicts and handed to networkx in one step: adding 100k nodes
    # and edges one by one through add_nodes_from/add_edges_from costs more than everything else here.
    succ: dict[int, dict[int, dict]] = {i: {} for i in range(len(protos))}
    pred: dict[int, dict[int, dict]] = {i: {} for i in range(len(protos))}
    get = producer.get
    for idx, names_read in enumerate(node_inputs):
        incoming = pred[idx]
        for name in (*names_read, *captured[idx]) if idx in captured else names_read:
            src = get(name)
            if src is None:
                continue
            data = incoming.get(src)
            if data is None:
                incoming[src] = succ[src][idx] = {"tensors": [name]}
            else:
                data["tensors"].append(name)
    import networkx as nx

    dag = nx.DiGraph()
    _fill(dag, ({"proto": p, "name": n} for p, n in zip(protos, names)), succ, pred)
    return dag


def _explain_bad_write(protos, writes, initializers, declared_inputs, where) -> NoReturn:
    """Raise the error for the first tensor written twice, or written over an initializer or input."""
    first: dict[str, int] = {}
    for out, idx in writes:
        node = protos[idx]
        if out in first:
            other = protos[first[out]]
            raise InvalidGraphError(
                f"{where}: tensor {out!r} is produced twice, by node {node_label(other, first[out])!r} "
                f"({other.op_type}) and node {node_label(node, idx)!r} ({node.op_type}); output names "
                "must be unique: rename one and re-export"
            )
        if out in initializers or out in declared_inputs:
            kind = "initializer" if out in initializers else "graph input"
            raise InvalidGraphError(
                f"{where}: node {node_label(node, idx)!r} ({node.op_type}) writes tensor {out!r}, "
                f"which is already a {kind}; output names must be unique"
            )
        first[out] = idx
    raise AssertionError("called without a bad write")


def _fill(dag: nx.DiGraph, node_data: Iterable[dict], succ: dict, pred: dict) -> None:
    """Give an empty DiGraph nodes ``0..n-1`` with ``node_data`` and the adjacency ``succ``/``pred``
    (``succ[u][v] is pred[v][u]``, the edge's attribute dict), as networkx stores them itself."""
    assert not dag._node, "only an empty graph can be filled"
    dag._node.update(enumerate(node_data))
    dag._succ.update(succ)
    dag._pred.update(pred)


def _topological_order(dag: nx.DiGraph, where: str) -> list[int]:
    import networkx as nx

    try:
        return list(nx.topological_sort(dag))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(dag)
        names = " -> ".join(repr(dag.nodes[u]["name"]) for u, _ in cycle)
        raise InvalidGraphError(
            f"{where}: the graph has a cycle ({names} -> {dag.nodes[cycle[0][0]]['name']!r}); "
            "ONNX graphs must be acyclic (use Loop for recurrence)"
        ) from None
