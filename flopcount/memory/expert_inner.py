"""The routed experts' nodes that carry an expert's inner dimension (its MLP width), which TP splits as it splits the
experts' weights: what a rank's walk (:mod:`.ranks`) sizes at 1/T under ep and tp."""

from __future__ import annotations

from .ledger import VIEWS, Graph

__all__ = ["expert_inner"]


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
