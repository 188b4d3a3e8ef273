"""What a rank's walk (:mod:`.ranks`) finds once in a graph, whatever the plan: the routed experts' nodes that carry
an expert's inner dimension (its MLP width), which TP splits as it splits the experts' weights, the K and V each
layer's attention reads whole under cp, and the storage a view's output shares."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .ledger import VIEWS, Graph

__all__ = ["GatheredKV", "expert_inner", "gathered_kv", "storage_root"]


_PRODUCTS = frozenset({"MatMul", "Gemm", "Einsum"})


def expert_inner(g: Graph, scopes, expert, layer_of) -> frozenset[int]:
    """The routed experts' nodes whose outputs carry an expert's inner dimension (its MLP width), which TP splits as
    it splits the experts' weights (gate and up column-parallel, down row-parallel, as the FLOPs ledger does): per
    MoE layer, the nodes from the products that read an expert weight first (gate/up) down to, not including, the
    products that read one last (down), found by the graph's dataflow, not by names or sizes (a node the exporter
    left without a module scope, such as the Split of the fused gate/up output, is followed too). The tokens' vectors
    going in, the weights' slices and the down products' outputs (whole, partial sums, on every TP rank) are not."""
    producer = {x.name: k for k, n in enumerate(g.nodes) for x in n.outputs if x is not None and x.name}
    consumers: dict[str, list[int]] = {}
    for k, n in enumerate(g.nodes):
        for x in n.inputs:
            if x is not None and x.name:
                consumers.setdefault(x.name, []).append(k)

    def weight(name: str) -> bool:
        """Whether ``name`` is an expert weight, or a view or per-token gather of one."""
        seen = 0
        while name not in g.stored and seen < 64:
            k = producer.get(name)
            if k is None:
                return False
            n = g.nodes[k]
            if not (n.op_type in VIEWS or name in g.gathers) or not n.inputs or n.inputs[0] is None:
                return False
            name, seen = n.inputs[0].name, seen + 1
        return name in g.stored

    groups: dict[int | None, list[int]] = {}
    for k, sc in enumerate(scopes[:len(g.nodes)]):
        if expert[k]:
            groups.setdefault(layer_of[k], []).append(k)
    inner: set[int] = set()
    for members in groups.values():
        group = set(members)
        products = [k for k in members if g.nodes[k].op_type in _PRODUCTS and g.nodes[k].domain == "" and
                    any(x is not None and weight(x.name) for x in g.nodes[k].inputs)]

        def downstream(starts: list[int]) -> set[int]:
            out, todo = set(starts), list(starts)
            while todo:
                for y in g.nodes[todo.pop()].outputs:
                    for c in consumers.get(y.name, ()) if y is not None else ():
                        if (c in group or not scopes[c]) and c not in out:
                            out.add(c)
                            todo.append(c)
            return out

        after = {k: downstream([k]) - {k} for k in products}
        last = [k for k in products if not any(j in after[k] for j in products)]
        first = [k for k in products if k not in last]
        if not first or not last:
            continue
        below = downstream(first)
        above: set[int] = set()
        todo = [x.name for k in last for x in g.nodes[k].inputs if x is not None and not weight(x.name)]
        while todo:
            k = producer.get(todo.pop())
            if k is not None and (k in group or not scopes[k]) and k not in above:
                above.add(k)
                todo.extend(x.name for x in g.nodes[k].inputs if x is not None and x.name)
        inner |= (below & above) - set(last)
    return frozenset(inner)


def storage_root(producer: Mapping[str, Any], name: str, g: Graph) -> str:
    """The storage a view's output shares: back through the views, as the ledger's walk roots them (a view the graph
    writes as a copy, ``g.copies``, is a storage of its own; a copy the framework makes a view, ``g.views``, is not)."""
    while name in producer:
        n = producer[name]
        if n.domain != "" or not n.inputs or n.inputs[0] is None or not (
                (n.op_type in VIEWS and name not in g.copies) or name in g.views):
            break
        name = n.inputs[0].name
    return name


#: What stands between the K and V a layer's attention kernel receives and its score and ·V products: views, copies
#: of views (the grouped-query repeat) and the scale, each reading the whole gathered sequence under cp
_KV_CHAIN = VIEWS | {"Mul", "Div"}


@dataclass(frozen=True)
class GatheredKV:
    """Under cp, the tensors of K and V each layer's attention reads whole (name → layer), and per layer the storages
    among them that the ledger keeps."""

    names: Mapping[str, int]
    kept: Mapping[int, frozenset[str]]


def gathered_kv(g: Graph, layout: Any) -> GatheredKV:
    """Under cp, the tensors of K and V that each layer's attention reads whole (name → layer: back from the second
    operand of its score product and of its product with V through :data:`_KV_CHAIN`, to the K after its rotary
    and the V as projected; :attr:`flopcount.parallel.layout.Layout.attention`), and per layer the storages among
    them that the ledger keeps for the backward (what the attention kernel keeps of them: the fused kernel K and V
    before their grouped-query repeat, an eager one the repeated and scaled copies its products read)."""
    producer = {x.name: n for n in g.nodes for x in n.outputs if x is not None and x.name}
    kept = {n.inputs[i].name for n in g.nodes if n.index in g.saved for i in g.saved[n.index].inputs
            if i < len(n.inputs) and n.inputs[i] is not None} | \
           {n.outputs[j].name for n in g.nodes if n.index in g.saved for j in g.saved[n.index].outputs
            if j < len(n.outputs) and n.outputs[j] is not None}
    kept_roots = {storage_root(producer, name, g) for name in kept}
    out: dict[str, int] = {}
    roots: dict[int, set[str]] = {}
    for layer, ks in layout.attention.items():
        for k in ks:
            x = g.nodes[k].inputs[1] if len(g.nodes[k].inputs) > 1 else None
            name = x.name if x is not None else ""
            while name:
                out[name] = layer
                root = storage_root(producer, name, g)
                if root in kept_roots:
                    roots.setdefault(layer, set()).add(root)
                n = producer.get(name)
                if n is None or n.domain != "" or n.op_type not in _KV_CHAIN or not n.inputs or n.inputs[0] is None:
                    break
                name = n.inputs[0].name
    return GatheredKV(out, {layer: frozenset(r) for layer, r in roots.items()})
