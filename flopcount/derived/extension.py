"""A model of L identical layers counted from exports of 1 and 2 of them: the count of L layers, extended exactly
(and, likewise, a stack that repeats a block of p layers after its first a: from a + p and a + 2p layers).

Exporting a large language model is the slow part of counting it (Llama-3-8B's 32 layers take tens of seconds to
trace), while its layers are copies of one another. When the frontend has shown that every layer of the stack is
the same computation (same class, same parameter shapes, same configuration: see
:func:`flopcount.frontends.hf.layer_stack`), the count is affine in L:

    C(L) = C(1) + (L − 1) · (C(2) − C(1))

for every figure of the report: FLOPs, MACs, transcendentals and integer operations of the forward and backward
passes, per operator type, parameters, buffers, and nodes per operator type.

The extended report is still made of nodes: those of the 2-layer graph, with the nodes of its second layer (the
nodes whose module scope is ``<path>.1``, and the nodes outside any layer that the 1-layer graph has no
counterpart for, such as a split of a stacked weight an exporter left without a scope) copied for layers
2 … L − 1 and named ``<node>@<path>.<k>``, their scopes renamed to ``<path>.<k>``. The copies are held once and
made when read (:class:`flopcount.reporting.tiled.Tiled`, the module parameters a :class:`flopcount.reporting.tiled.TiledMapping`), so a
report of 10**9 layers takes the memory of 2, and every sum over its nodes folds the block. That keeps per-node listings, module rows, MoE sums and the HTML report
consistent with the totals. It is made only when the second layer's nodes are exactly what the second layer added
(C(2) − C(1) per operator type, forward and backward, node counts included, and its parameters); otherwise
:func:`extend` says why, and the caller exports the whole model.

A count made with the memory ledger gets the ledger of L layers, not extended affinely (its peak is a maximum whose
place can move with L) but walked again on the 2-layer graph with the same copies, rewired
(:mod:`flopcount.memory.layers`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from ..cost import Cost
from ..reporting.generation import DecodePiece, Generation
from ..reporting.report import NodeCount, OpTypeSummary, Report, op_type_summaries
from ..reporting.tiled import Tiled, TiledMapping, check_listable

__all__ = ["NotExtendable", "extend", "extend_generation"]

class NotExtendable(Exception):
    """The 1- and 2-layer counts do not show what one more layer adds; the message says why."""


def extend(one: Report, two: Report, layers: int, path: str, *, first: int = 0, period: int = 1) -> Report:
    """The report of ``layers`` layers of the stack at ``path`` from the reports of its first ``first + period``
    (``one``) and ``first + 2·period`` layers (``two``), where after ``first`` layers the stack repeats a block of
    ``period`` layers (1 and 0: identical layers); or :class:`NotExtendable` with the reason."""
    blocks, rest = divmod(layers - first, period)
    if blocks < 2 or rest or first < 0:
        raise NotExtendable(f"{layers} layers are not {first} and whole blocks of {period}: nothing to extend")
    stack = _Stack(path, first, period, blocks - 2)
    inside = _second_block(one, two, stack)
    nodes, node_scopes, origin, params = _tiled(two, inside, stack)
    k = stack.copies
    forward, backward = _affine(one.forward, two.forward, k), _affine(one.backward, two.backward, k)
    by_op_type = op_type_summaries(nodes)
    _check_consistent(by_op_type, forward, backward)
    memory, generation = two.memory, two.generation
    if one.memory is not None or two.memory is not None:
        memory = _extended_memory(one, two, inside, nodes, origin, stack)
    if one.generation is not None and two.generation is not None:
        generation, memory = _extended_generation(forward, memory, one, two, layers, stack)
    return dataclasses.replace(  # the report of L layers, made once
        two,
        forward=forward,
        backward=backward,
        params=_affine_int(one.params, two.params, k),
        buffers=_affine_int(one.buffers, two.buffers, k),
        trainable_params=_affine_int(one.trainable_params, two.trainable_params, k),
        nodes=nodes,
        by_op_type=by_op_type,
        unsupported=MappingProxyType(_affine_counts(one.unsupported, two.unsupported, k)),
        backward_unsupported=MappingProxyType(_affine_counts(one.backward_unsupported, two.backward_unsupported, k)),
        optimizer=None if two.optimizer is None else (two.optimizer[0], _affine(one.optimizer[1], two.optimizer[1], k)),
        modules=dataclasses.replace(two.modules, nodes=node_scopes, params=params),
        timings=MappingProxyType({p: one.timings.get(p, 0.0) + t for p, t in two.timings.items()}),
        memory=memory,
        generation=generation,
    )


@dataclass(frozen=True)
class _Stack:
    """The repeated stack being extended: its module ``path``, the ``first`` layers before the repeated blocks of
    ``period`` layers, and the ``copies`` of the second block added to the 2-block graph."""

    path: str
    first: int
    period: int
    copies: int

    @property
    def second(self) -> list[str]:
        """The module paths of the second block's layers."""
        return [f"{self.path}.{i}" for i in range(self.first + self.period, self.first + 2 * self.period)]


def _second_block(one: Report, two: Report, stack: _Stack) -> list[int]:
    """The positions of the 2-block graph's nodes that its second block adds, shown to add exactly what the 1- and
    2-block counts differ by (:class:`NotExtendable` otherwise)."""
    step = _Step.between(one, two)
    second = stack.second
    scopes = two.modules.nodes
    if len(scopes) != len(two.nodes) or two.modules.missing:
        raise NotExtendable("the smaller graphs have no module scopes to find their layers in")
    inside = [i for i, scope in enumerate(scopes) if any(_within(scope, m) for m in second)]
    if not inside:
        raise NotExtendable(f"the {stack.first + 2 * stack.period}-layer graph has no node in {second[0]}")
    inside = sorted(inside + _added_outside(one, two, stack.path, stack.first + stack.period,
                                            stack.first + 2 * stack.period))
    found = _Step.of([two.nodes[i] for i in inside], sum(_params_under(two.modules.params, m) for m in second))
    if found != step:
        raise NotExtendable(f"the nodes of {', '.join(second)} are not what that block adds "
                            f"({step.difference(found)})")
    return inside


def _tiled(two: Report, inside: list[int], stack: _Stack) -> tuple[Tiled, Tiled, Tiled, TiledMapping]:
    """The extended graph's nodes, their module scopes, each one's origin (position in ``two``, copy) and the
    parameters per module, each held once with the second block's copies made when read."""
    path, first, period, k = stack.path, stack.first, stack.period, stack.copies
    second, scopes = stack.second, two.modules.nodes
    renames: dict[tuple[str, int], str] = {}  # every pass over the tiled nodes asks the same few names again

    def moved(name: str, t: int) -> str:  # a name in the second block, in block 1 + t
        key = (name, t)
        found = renames.get(key)
        if found is None:
            found = name
            for i in range(first + period, first + 2 * period):
                renamed = _renamed(name, f"{path}.{i}", f"{path}.{i + t * period}")
                if renamed != name:
                    found = renamed
                    break
            renames[key] = found
        return found

    last = inside[-1]
    wheres = [next((m for m in second if _within(scopes[j], m)), None) for j in inside]

    def copied(node: NodeCount, j: int, t: int) -> NodeCount:
        where = moved(wheres[j], t) if wheres[j] is not None else f"{path}.{first + (t + 1) * period}"
        return node._replace(name=f"{node.name}@{where}")

    def placed(node: NodeCount, position: int) -> NodeCount:
        return node if node.index == position else node._replace(index=position)

    head, tail = range(last + 1), range(last + 1, len(two.nodes))
    scoped: dict[tuple[int, int], tuple[str, ...]] = {}
    nodes = Tiled([two.nodes[i] for i in head], [two.nodes[j] for j in inside], k, [two.nodes[i] for i in tail],
                  copied, placed)

    def scope_in(scope: tuple[str, ...], j: int, t: int) -> tuple[str, ...]:
        return scoped.get((j, t)) or scoped.setdefault((j, t), tuple(moved(s, t) for s in scope))

    node_scopes = Tiled([scopes[i] for i in head], [scopes[j] for j in inside], k, [scopes[i] for i in tail],
                        scope_in)
    origin = Tiled([(i, 0) for i in head], inside, k, [(i, 0) for i in tail], lambda j, _j, t: (j, t))
    params = TiledMapping(two.modules.params, {m: v for m, v in two.modules.params.items()
                                               if any(_within((m,), b) for b in second)}, k, moved)
    return nodes, node_scopes, origin, params


def _extended_memory(one: Report, two: Report, inside: list[int], nodes: Tiled, origin: Tiled, stack: _Stack):
    """The memory ledger of the extended graph (:func:`flopcount.memory.layers.extend_memory`), walked on the
    2-block graph with its second block copied."""
    from ..memory.layers import Copies, Unwired, extend_memory

    check_listable(nodes, "--memory", "nodes, which the ledger walks one by one,")
    path, first, period, k = stack.path, stack.first, stack.period, stack.copies
    scopes = two.modules.nodes
    first_block = [f"{path}.{i}" for i in range(first, first + period)]
    block0 = [i for i, scope in enumerate(scopes) if any(_within(scope, m) for m in first_block)]
    if block0:  # with the nodes outside any layer between it and the second block (as ``inside`` has its own)
        unscoped = [i for i in range(block0[0], inside[0])
                    if not any(s.startswith(path + ".") for s in scopes[i]) and i not in block0]
        block0 = sorted(block0 + unscoped)
    suffixes = [""] + [f"@{path}.{first + (t + 1) * period}" for t in range(1, k + 1)]
    try:
        return extend_memory(one, two, Copies(inside, block0, nodes, origin, suffixes, k))
    except Unwired as e:
        raise NotExtendable(str(e)) from None


def _extended_generation(forward: Cost, memory, one: Report, two: Report, layers: int, stack: _Stack):
    """The extended generation (its totals and its decode steps' reports) of the extended report whose forward pass
    is ``forward``, and its memory ledger ``memory`` (or None) with the KV cache after the last step."""
    generation = extend_generation(one.generation, two.generation, stack.copies, layers)
    if generation.prefill != forward:
        raise NotExtendable("the extended prefill is not the extended report's forward pass")
    generation = dataclasses.replace(generation, step_reports=_extend_steps(
        one.generation.step_reports, two.generation.step_reports, layers, stack.path, stack.first, stack.period))
    if memory is not None:  # the ledger of the prefill, with the extended cache after the last step
        kv = sum(generation.kv_cache_bytes.values())
        memory = dataclasses.replace(memory, ranks=tuple(dataclasses.replace(r, kv_cache_bytes=kv)
                                                         for r in memory.ranks))
    return generation, memory


def _extend_steps(one: Sequence, two: Sequence, layers: int, path: str, first: int, period: int) -> tuple:
    """The decode steps' reports ``(context, report)`` of the smaller models extended as their whole reports are, for
    the FLOPs per rank of generation; none where the smaller models' contexts differ or a step does not extend (the
    generation's totals stand either way; :mod:`flopcount.parallel.generation` then says the steps were not kept).
    The steps' memory ledgers are left out: the FLOPs per rank read none of them (the generation's memory is the
    prefill's ledger and the cache after the last step), and a step's graph, whose past keys and values come in one
    input per layer, is no stack the ledger's walk extends."""
    if not one or [c for c, _ in one] != [c for c, _ in two]:
        return ()
    one, two = ([(c, dataclasses.replace(r, memory=None)) for c, r in steps] for steps in (one, two))
    # a step's graph may be exported under a wrapper module: its stack is the scope that ends with ``path``
    second = f"{path}.{first + period}"
    found = {name for _, b in two for scopes in b.modules.nodes for name in scopes
             if name == second or name.endswith("." + second)}
    if len(found) != 1:
        return ()
    inner = found.pop()[: -len(f".{first + period}")]
    try:
        return tuple((c, extend(a, b, layers, inner, first=first, period=period)) for (c, a), (_, b) in zip(one, two))
    except NotExtendable:
        return ()


def _added_outside(one: Report, two: Report, path: str, small: int, large: int) -> list[int]:
    """The nodes of ``two`` (``large`` layers) outside its layers that ``one`` (``small`` layers) has no
    counterpart for outside its layers (an exporter may leave a layer's node without a scope, such as a split of a
    stacked weight): they come with each block. A counterpart has the same operator, costs and scope."""

    def signature(node: NodeCount, scope: tuple[str, ...]) -> tuple:
        return node.domain, node.op_type, node.cost, node.backward, scope

    def outside(scope, n: int) -> bool:
        return not any(_within(scope, f"{path}.{i}") for i in range(n))

    available = Counter(signature(n, sc) for n, sc in zip(one.nodes, one.modules.nodes) if outside(sc, small))
    added = []
    for i, (n, sc) in enumerate(zip(two.nodes, two.modules.nodes)):
        if not outside(sc, large):
            continue
        key = signature(n, sc)
        if available[key]:
            available[key] -= 1
        else:
            added.append(i)
    if +available:
        raise NotExtendable("the larger graph lacks nodes the smaller one has outside its layers")
    return added


def extend_generation(one: Generation, two: Generation, copies: int, layers: int) -> Generation:
    """The :class:`flopcount.reporting.generation.Generation` of a stack with ``copies`` more blocks than ``two``, from those of
    one and two blocks (``layers`` in all): the prefill, each decode piece's constant and per-position cost, and
    the KV cache's bytes, each affine in the blocks."""
    k = copies
    if (one.batch, one.prompt_tokens, one.new_tokens) != (two.batch, two.prompt_tokens, two.new_tokens):
        raise NotExtendable("the 1- and 2-layer generations are of different runs")
    if [(p.first, p.last) for p in one.pieces] != [(p.first, p.last) for p in two.pieces]:
        raise NotExtendable("the decode steps of the 1- and 2-layer models fall in different pieces")
    pieces = []
    for a, b in zip(one.pieces, two.pieces):
        if _minus(b.constant, a.constant) is None or _minus(b.per_position, a.per_position) is None:
            raise NotExtendable("a decode step costs less with 2 layers than with 1")
        pieces.append(DecodePiece(b.first, b.last, _affine(a.constant, b.constant, k),
                                  _affine(a.per_position, b.per_position, k)))
    if _minus(two.prefill, one.prefill) is None:
        raise NotExtendable("the prefill costs less with 2 layers than with 1")
    cache = _affine_counts(one.kv_cache_bytes, two.kv_cache_bytes, k)
    return Generation(two.batch, two.prompt_tokens, two.new_tokens, _affine(one.prefill, two.prefill, k),
                      tuple(pieces), cache, f"{two.method}; on the smaller models, extended to {layers} layers",
                      encoder_decoder=two.encoder_decoder)


@dataclass(frozen=True)
class _Step:
    """What one layer adds: per operator key (nodes, forward, backward), and parameters."""

    ops: Mapping[str, tuple[int, Cost, Cost]]
    params: int

    @classmethod
    def between(cls, one: Report, two: Report) -> "_Step":
        ops = {}
        for key in set(one.by_op_type) | set(two.by_op_type):
            a, b = one.by_op_type.get(key), two.by_op_type.get(key)
            diff = (_nodes(b) - _nodes(a), _minus(_cost(b), _cost(a)), _minus(_backward(b), _backward(a)))
            if diff[0] < 0 or diff[1] is None or diff[2] is None:
                raise NotExtendable(f"{key} does less work with 2 layers than with 1")
            if diff != (0, Cost(), Cost()):
                ops[key] = diff
        if two.params < one.params:
            raise NotExtendable("the 2-layer model has fewer parameters than the 1-layer one")
        return cls(ops, two.params - one.params)

    @classmethod
    def of(cls, nodes: Sequence[NodeCount], params: int) -> "_Step":
        ops = {}
        for key, s in op_type_summaries(nodes).items():
            ops[key] = (s.nodes, s.cost, s.backward)
        return cls(ops, params)

    def difference(self, other: "_Step") -> str:
        if self.params != other.params:
            return f"it adds {self.params:,} parameters, the layer's modules hold {other.params:,}"
        for key in sorted(set(self.ops) | set(other.ops)):
            if self.ops.get(key) != other.ops.get(key):
                a, b = self.ops.get(key, (0, Cost(), Cost())), other.ops.get(key, (0, Cost(), Cost()))
                return f"{key}: it adds {a[0]} nodes of {a[1].flops:,} FLOPs, the layer holds {b[0]} of {b[1].flops:,}"
        return "no difference"


def _nodes(s: OpTypeSummary | None) -> int:
    return s.nodes if s is not None else 0


def _cost(s: OpTypeSummary | None) -> Cost:
    return s.cost if s is not None else Cost()


def _backward(s: OpTypeSummary | None) -> Cost:
    return s.backward if s is not None else Cost()


def _minus(b: Cost, a: Cost) -> Cost | None:
    """``b − a`` field by field, or None where a field would be negative."""
    fields = [y - x for x, y in zip(a, b)]
    return None if any(isinstance(v, int) and v < 0 for v in fields) else Cost(*fields)


def _affine(a: Cost, b: Cost, k: int) -> Cost:
    """``b + k·(b − a)``: the 2-layer figure and k more layers."""
    return Cost(*(y + k * (y - x) for x, y in zip(a, b)))


def _affine_int(a: int, b: int, k: int) -> int:
    return b + k * (b - a)


def _affine_counts(a: Mapping[str, int], b: Mapping[str, int], k: int) -> dict[str, int]:
    out = {key: _affine_int(a.get(key, 0), b.get(key, 0), k) for key in sorted(set(a) | set(b))}
    if any(b.get(key, 0) < a.get(key, 0) for key in out):
        raise NotExtendable("a figure per operator or per type is smaller with 2 layers than with 1")
    return {key: v for key, v in out.items() if v}


def _within(scope: Iterable[str], module: str) -> bool:
    prefix = module + "."
    return any(s == module or s.startswith(prefix) for s in scope)


def _renamed(name: str, old: str, new: str) -> str:
    if name == old:
        return new
    if name.startswith(old + "."):
        return new + name[len(old):]
    return name


def _params_under(params: Mapping[str, int], module: str) -> int:
    return sum(v for m, v in params.items() if _within((m,), module))


def _check_consistent(by_op_type: Mapping[str, OpTypeSummary], forward: Cost, backward: Cost) -> None:
    """The nodes of the extended report (``by_op_type``) sum to its extended figures (a guard: :func:`extend`
    builds both)."""
    if (sum((s.cost for s in by_op_type.values()), Cost()) != forward
            or sum((s.backward for s in by_op_type.values()), Cost()) != backward):
        raise NotExtendable("the copied nodes do not sum to the extended totals")
