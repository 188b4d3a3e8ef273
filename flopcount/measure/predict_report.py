"""A counted report read into the plain numbers :mod:`flopcount.measure.predict` divides: each rank's nodes per
model chunk (its shares of the ledger, :func:`flopcount.parallel.ranks.node_shares`), its collectives as messages
of known sizes, its FLOPs, its optimizer's bytes and the tokens of a step. The rules are the predictor's module's."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from flopcount.errors import UsageError

from .predict import (GEMM_FAMILIES, OPTIMIZER_TRAFFIC, REDUCTION_FAMILIES, NodeWork, RankWork, Work,
                      backward_kernels)
from .predict_messages import rank_messages

__all__ = ["node_works", "report_work"]

_INTEGER_TYPES = (2, 3, 4, 5, 6, 7, 12, 13)  # ONNX uint8, int8, uint16, int16, int32, int64, uint32, uint64


def _kind(node: Any, params: frozenset[str]) -> str:
    """A product of two activations over a batch of matrices (both inputs of rank 3 or more, neither a parameter
    in ``params``: an eager attention's Q·Kᵀ and probs·V) and a fused attention operator are ``attention``; a
    Dropout is ``dropout`` (its forward at the dropout rate, its FLOPs counted only in training); a softmax and a
    log-softmax are ``softmax``; a softmax cross-entropy loss (a log-softmax of its scores, then the picked ones) is
    ``cross_entropy``."""
    if node.family == "attention" or node.family in GEMM_FAMILIES and len(node.inputs) == 2 and all(
            t is not None and t.name not in params and len(t.shape or ()) >= 3 for t in node.inputs):
        return "attention"
    if node.family in GEMM_FAMILIES:
        return "gemm"
    if node.family == "conv":
        return "conv"
    if node.op_type == "Dropout" and not node.domain:
        return "dropout"
    if node.op_type in ("Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss") and node.domain in ("", "ai.onnx"):
        return "cross_entropy" if node.op_type == "SoftmaxCrossEntropyLoss" else "softmax"
    return "reduction" if node.family in REDUCTION_FAMILIES else "elementwise"


def _matrices(node: Any) -> float:
    """The batch of matrices a product multiplies (the output's dims before the last two), 1 when not known; 1 for
    a product whose second operand is a matrix (a weight [k, n]): the framework folds the first's batch into its
    rows, one [b·m, k] × [k, n] product (torch's ``linear`` and ``matmul`` of a 3-D input and a 2-D weight)."""
    out = node.outputs[0] if node.outputs else None
    shape = getattr(out, "shape", None)
    if node.family not in GEMM_FAMILIES or not shape or len(shape) < 3 or not all(isinstance(d, int) for d in shape):
        return 1.0
    second = node.inputs[1] if len(node.inputs) > 1 else None
    if node.family != "attention" and second is not None and second.shape is not None and len(second.shape) == 2:
        return 1.0
    n = 1
    for d in shape[:-2]:
        n *= d
    return float(n)


def _node_work(known: tuple, fwd: float, bwd: float, again: float) -> NodeWork:
    """A node's work on a rank that runs ``fwd``, ``bwd`` and ``again`` of its FLOPs; ``known``: its
    :func:`_node_facts`."""
    kind, whole, total, matrices, kernels, kept = known
    frac = (fwd or bwd) / whole if whole else 1.0
    return NodeWork(kind, float(fwd), total * frac, float(bwd), float(again),
                    max(1.0, matrices * frac) if matrices > 1 else 1.0, kernels if bwd else 0, kept * frac)


def _node_facts(node: Any, params: frozenset[str], gathered: Any,
                stored: Callable[[str], Any] | None = None) -> tuple[str, int, int, float, float, int]:
    """(kind, whole FLOPs, bytes, matrices, backward kernels, bytes a split of the sequence leaves whole: its
    parameters' and their views' (``stored`` tells one by its name; without it, its gathered experts' alone), and
    under an attention its inputs after the queries, the K and V gathered whole) of a node (``params``: the
    model's parameter names; ``gathered``: :func:`_gathered`): what its share on any rank is scaled from. Experts' weights gathered per
    token are run as the framework runs them, a grouped product over the resident weights: the gather and its views
    are no work (nor their backward's sum into the weight's gradient, which the grouped product's own reduction
    over the tokens makes); a product reading them reads the parameter once, as E products of its tokens (E the
    parameter's leading dimension, the experts)."""
    from flopcount.reporting.report import node_bytes, tensor_bytes

    out = node.outputs[0].name if node.outputs and node.outputs[0] is not None else ""
    if out in gathered.tensors:
        return "elementwise", 0, 0, 1.0, 0, 0
    b = node_bytes(node)
    total, matrices = (b.total if b else 0), _matrices(node)
    read = {t.name: t for t in node.inputs if t is not None and t.name in gathered.tensors}
    for t in read.values():
        weight = gathered.info.get(gathered.tensors[t.name][0])
        total -= tensor_bytes(t) or 0
        if weight is not None:
            total += tensor_bytes(weight) or 0
            matrices = float(weight.shape[0]) if weight.shape and isinstance(weight.shape[0], int) else matrices
    kind = "gemm" if read and node.family in GEMM_FAMILIES else _kind(node, params)  # weights, not activations
    kept = sum(tensor_bytes(gathered.info.get(gathered.tensors[t.name][0], t)) or 0 if t.name in read
               else tensor_bytes(t) or 0
               for i, t in enumerate(node.inputs) if t is not None
               and (t.name in read or kind == "attention" and i > 0 or stored is not None and stored(t.name)))
    return (kind, node.cost.flops or node.backward.flops, total, matrices,
            backward_kernels(node.cost.macs, node.backward.macs, node.backward.flops), min(kept, total))


@dataclass(frozen=True)
class _Gathered:
    """The tensors of experts' weights gathered per token (and their views) of a report, each with its parameter
    (:func:`~flopcount.memory.experts.gathered_experts`), and ``info``: each such parameter's tensor."""

    tensors: Mapping[str, tuple]
    info: Mapping[str, Any]


#: The last report's nodes (by identity) and their :class:`_Gathered`: a plan search reads the same nodes per plan.
_last_gathered: list[tuple] = []


def _gathered(report: Any) -> _Gathered:
    """The report's :class:`_Gathered`, found once per node list."""
    from flopcount.memory.experts import gathered_experts

    if _last_gathered and _last_gathered[0][0] is report.nodes and _last_gathered[0][1] is report.modules.parameters:
        return _last_gathered[1]
    tensors = gathered_experts(report.nodes, report.modules.parameters)
    info: dict[str, Any] = {}
    wanted = {p for p, _ in tensors.values()}
    for n in report.nodes if wanted else ():
        for t in n.inputs:
            if t is not None and t.name in wanted:
                info.setdefault(t.name, t)
    found = _Gathered(tensors, info)
    _last_gathered[:] = [(report.nodes, report.modules.parameters), found]
    return found


def node_works(report: Any) -> tuple[tuple[Any, NodeWork], ...]:
    """Each node of ``report`` with work on one rank beside its :class:`~flopcount.measure.predict.NodeWork`, in the
    report's order: what a one-rank prediction times. Work: FLOPs, or backward FLOPs in training; data a node
    without FLOPs moves and the gradient sums of its outputs (:func:`extra_works`)."""
    train = report.mode == "train"
    gathered = _gathered(report)
    extra, original = extra_works(report)
    out = []
    for n in report.nodes:
        bwd = n.backward.flops if train else 0
        more = extra.get(original(n.index))
        if n.cost.flops or bwd:
            w = _node_work(_node_facts(n, report.modules.parameters, gathered), n.cost.flops, bwd, 0)
            w = replace(w, sums=more.sums, sum_bytes=more.sum_bytes) if more is not None else w
        else:
            w = more
        if w is not None:
            out.append((n, w))
    return tuple(out)


#: The last report's nodes (by identity, with their parameters and mode) and their :func:`extra_works`.
_last_extra: list[tuple] = []


def extra_works(report: Any) -> tuple[Mapping[int, NodeWork], Callable[[int], int]]:
    """(each node's work beyond its FLOPs, by its index in the exported graph; a node's position → that index): the
    data a node without FLOPs moves (:func:`_moved`) and, in training, the gradient sums of its outputs
    (:func:`_gradient_sums`), one work without FLOPs; a copy of a repeated stack's layer
    (:class:`~flopcount.reporting.tiled.Tiled`) has its original's. Found once per node list."""
    key = (report.nodes, report.modules.parameters, report.mode)
    if _last_extra and all(a is b for a, b in zip(_last_extra[0][0], key)):
        return _last_extra[0][1]
    train = report.mode == "train"
    gathered = _gathered(report)
    need, sums = _gradient_sums(report) if train else (frozenset(), {})
    nodes, original = report.nodes, _original_index(report.nodes)
    extra = {}
    for n in (*nodes.head, *nodes.tail) if _tiled(nodes) else nodes:
        w = None if n.cost.flops or (train and n.backward.flops) else _moved(n, need, gathered)
        if n.index in sums:
            count, each = sums[n.index]
            w = replace(w or NodeWork("elementwise", 0.0, 0.0), sums=float(count), sum_bytes=each)
        if w is not None:
            extra[n.index] = w
    _last_extra[:] = [(key, (extra, original))]
    return extra, original


def _tiled(nodes: Any) -> bool:
    from flopcount.reporting.tiled import Tiled

    return bool(isinstance(nodes, Tiled) and nodes.copies and nodes.block)


def _original_index(nodes: Any) -> Callable[[int], int]:
    """A node's position in ``nodes`` → its index in the exported graph: a copy of a repeated stack's layer
    (:class:`~flopcount.reporting.tiled.Tiled`, its tensors under its original's names) its block node's, the
    tail's its own."""
    if not _tiled(nodes):
        return lambda p: p
    h, end = len(nodes.head), len(nodes) - len(nodes.tail)

    def index(p: int) -> int:
        j = nodes.block_position(p)
        return nodes.block[j].index if j is not None else p if p < h else nodes.tail[p - end].index

    return index


def _moved(node: Any, need: frozenset[str], gathered: _Gathered) -> NodeWork | None:
    """The work of a node without FLOPs, None where it has none: a view (:data:`~flopcount.memory.ledger.VIEWS`:
    reshapes, transposes, slices, expands), a read of a shape, a node without a floating-point output (shape and
    index arithmetic, done in Python by the framework; a mask's comparisons) and a gather of experts' weights
    (``gathered``, :func:`_node_facts`) move nothing forward; any other node of the standard domain with an input (a
    concatenation, a copy, a cast, a gather of rows) writes its outputs and reads as many bytes (twice its outputs'
    bytes, timed as an elementwise node's: a gather reads the rows it writes, not its whole table). In training
    (``need``: the tensors that need a gradient), a slice of a tensor that needs one writes that tensor's gradient
    whole: zeros over its bytes, then the slice's gradient read and written in (the input's bytes and twice the
    output's); the other views' and a concatenation's gradients are views of their output's gradient."""
    from flopcount.memory.ledger import VIEWS
    from flopcount.reporting.report import node_bytes, tensor_bytes

    if node.domain not in ("", "ai.onnx") or node.op_type in ("Shape", "Size") or not node.inputs \
            or node.inputs[0] is None or not node.outputs or node.outputs[0] is None \
            or node.outputs[0].name in gathered.tensors or not any(t is not None and t.is_float for t in node.outputs):
        return None
    if node.op_type not in VIEWS:
        b = node_bytes(node)
        return NodeWork("elementwise", 0.0, 2.0 * b.written) if b is not None and b.written else None
    if node.op_type == "Slice" and node.inputs[0].name in need:
        whole, part = tensor_bytes(node.inputs[0]), tensor_bytes(node.outputs[0])
        if whole and part is not None:
            return NodeWork("elementwise", 0.0, 0.0, backward_kernels=1, moved_bytes=float(whole + 2 * part))
    return None


def _gradient_sums(report: Any) -> tuple[frozenset[str], dict[int, tuple[int, float]]]:
    """(the tensors that need a gradient: the model's parameters and every floating-point output of a node that
    reads one; a node's index in the exported graph → (gradient additions, bytes of each)): a tensor that needs a
    gradient read by k > 1 nodes whose outputs need one (an input read twice by a node counts twice) has its k
    gradients added in the backward, k - 1 additions of two reads and a write of its bytes, counted at its producer
    (at its first reader where no node makes it: a parameter)."""
    from flopcount.reporting.report import tensor_bytes

    nodes = report.nodes
    need = set(report.modules.parameters)
    readers: dict[str, list[int]] = {}
    made: dict[str, int] = {}
    infos: dict[str, Any] = {}
    for n in (*nodes.head, *nodes.tail) if _tiled(nodes) else nodes:
        ins = [t for t in n.inputs if t is not None and t.is_float and t.name in need]
        outs = [t.name for t in n.outputs if t is not None and t.is_float]
        if ins and outs:
            need.update(outs)
            for t in ins:
                readers.setdefault(t.name, []).append(n.index)
                infos[t.name] = t
        made.update((t.name, n.index) for t in n.outputs if t is not None)
    sums: dict[int, tuple[int, float]] = {}
    for name, read in readers.items():
        size = tensor_bytes(infos[name]) if len(read) > 1 else None
        if size:
            at, extra = made.get(name, read[0]), len(read) - 1
            count, each = sums.get(at, (0, 0.0))
            sums[at] = (count + extra, (each * count + 3.0 * size * extra) / (count + extra))
    return frozenset(need), sums


def _one_rank(report: Any) -> Work:
    train = report.mode == "train"
    nodes = [w for _, w in node_works(report)]
    opt = 0.0
    notes = []
    if train and report.optimizer is not None and report.optimizer[0] in OPTIMIZER_TRAFFIC:
        opt = report.trainable_params * 4 * OPTIMIZER_TRAFFIC[report.optimizer[0]]
        notes.append("optimizer bytes (its traffic, where the profile has no timing of it) at 4 bytes a parameter "
                     "element (fp32)")
    ints = [t for t in report.model.inputs if t.elem_type in _INTEGER_TYPES and t.is_static]
    tokens, note = None, None
    if ints:
        tokens = 1.0
        for d in ints[0].shape:
            tokens *= d
    else:
        note = "no integer (token) input"
    total = report.total.flops
    name = report.optimizer[0] if train and report.optimizer is not None else None
    tensors = _module_tensors(report)
    held = tuple((tensors(m), float(n)) for m, n in report.modules.params.items() if n) if name else ()
    rank = RankWork(0, 0, 0, {0: tuple(nodes)}, (), float(total), float(total), opt, name, held)
    return Work((rank,), {"microbatches": 1, "pp": 1, "virtual": 1, "schedule": "1f1b"}, tokens, note, tuple(notes))


def _module_tensors(report: Any) -> Any:
    """The parameter tensors of a module (by its path): its parameters' names (``module.leaf``) counted; a layer
    of a stack extended past the exported ones (``--hf`` extend) has its first layer's count; a module of
    parameter elements with no name found, one."""
    counts: dict[str, int] = {}
    for name in report.modules.parameters:
        module = name.rpartition(".")[0]
        counts[module] = counts.get(module, 0) + 1
    path = report.layers.path + "." if report.layers is not None and report.layers.path else None

    def tensors(module: str) -> int:
        if module in counts:
            return counts[module]
        if path and module.startswith(path):
            rest = module[len(path):].partition(".")[2]
            return counts.get(path + "0" + ("." + rest if rest else ""), 1)
        return 1

    return tensors


def _optimizer_tensors(r: Any, report: Any,
                       tensors: Callable[[int], tuple[list[tuple[int, int]], int]]) -> tuple[tuple[float, float], ...]:
    """(tensors, elements) of each module of the rank's stage: the module's elements scaled by the rank's share
    of its stage's parameter elements (its optimizer elements over the stage's: the tensor-parallel split and the
    sharding), its tensors whole (a shard of a tensor is one tensor to the optimizer). ``tensors``: a stage's
    (tensors, elements) per module and its elements (:func:`_stage_tensors`). Found once per stage and optimizer
    FLOPs of the stages asked (:func:`_stage_tensors`' memo): the ranks of a stage, and the plans of the same
    stages, mostly hold the same share."""
    from flopcount.parallel.optimizer import per_element

    if r.optimizer_flops is None:
        return ()
    held = _last_tensors[2] if _last_tensors and _last_tensors[1] is tensors else {}
    key = (r.stage, r.optimizer_flops)
    found = held.get(key)
    if found is None:
        rows, stage = tensors(r.stage)
        frac = r.optimizer_flops / per_element(report) / stage if stage else 0.0
        found = held[key] = tuple((t, n * frac) for t, n in rows if n * frac > 0)
    return found


#: The last stages' parameters asked of :func:`_stage_tensors` (by identity, with the report's parameter names and
#: optimizer), its answer, and the ranks' optimizer tensors found of them (:func:`_optimizer_tensors`).
_last_tensors: list[Any] = []


def _stage_tensors(stages: Any, report: Any) -> Callable[[int], tuple[list[tuple[int, int]], int]]:
    """A stage's (tensors (:func:`_module_tensors`), elements) per module of the plan's
    :meth:`~flopcount.parallel.layout.Layout.stage_params` ``stages``, and its elements, found once per stage: each
    rank of a stage reads them again, and so do the plans of the same stages (the last asked)."""
    key = (stages, report.modules.parameters, report.layers.path if report.layers is not None else None,
           report.optimizer)
    if _last_tensors and _last_tensors[0][0] is stages and _last_tensors[0][1] is key[1] \
            and _last_tensors[0][2:] == key[2:]:
        return _last_tensors[1]
    tensors = _module_tensors(report)
    found: dict[int, tuple[list[tuple[int, int]], int]] = {}

    def once(stage: int) -> tuple[list[tuple[int, int]], int]:
        got = found.get(stage)
        if got is None:
            rows = stages.get(stage, [])
            got = found[stage] = ([(tensors(m), n) for m, _, n in rows], sum(n for _, _, n in rows))
        return got

    _last_tensors[:] = [key, once, {}]
    return once


def _optimizer_bytes(r: Any, led: Any, report: Any) -> float:
    if r.optimizer_flops is None or led.optimizer not in OPTIMIZER_TRAFFIC:
        return 0.0
    from flopcount.parallel.optimizer import per_element

    return r.optimizer_flops / per_element(report) * led.dims["param_bytes"] * OPTIMIZER_TRAFFIC[led.optimizer]


#: The last shares read into work and their work: a plan search reads the same shares (by identity) for plans that
#: differ only in what the shares do not read (dp, cp, M, the sharding).
_last_places: list[tuple] = []


#: The last node list's (with its parameter names and gathered experts, by identity) :func:`_node_facts` found, by
#: node, those facts by value, the works made of them (by the facts and by the node), and the chunks' tuples made of
#: those works (by the works): the plans of a search read the same nodes at other shares.
_last_facts: list[Any] = []


def _originals(nodes: Any) -> tuple[Callable[[int], int], Callable[[int], Any]]:
    """(the key of node ``k``'s facts, the node of a key) of ``nodes``: a renamed copy of a repeated stack's layer
    past the exported ones (:class:`~flopcount.reporting.tiled.Tiled`) has its block node's key (negative) and
    facts, any other node its index. :func:`_node_facts` reads no name but to ask whether a tensor is a parameter
    or a gathered expert weight, which a copy's tensors (its original's names) are where its original's are; the
    copy is not made."""
    if not _tiled(nodes):
        return (lambda k: k), nodes.__getitem__

    def key(k: int) -> int:
        j = nodes.block_position(k)
        return k if j is None else -1 - j

    return key, (lambda k: nodes.block[-1 - k] if k < 0 else nodes[k])


def _places(nodes: Any, shares: Any, params: frozenset[str], gathered: Any,
            inputs: Any = ()) -> dict[tuple[int, int], dict[int, tuple[NodeWork, ...]]]:
    """Each (stage, TP rank)'s work per chunk: its shares of the nodes (``gathered``: :func:`_gathered`; ``inputs``:
    the graph's, which are not weights). A chunk
    whose works are another's (the same objects in the same order: the TP ranks of an even split, the middle stages
    of equal layers, a plan of other shares with the same chunk) is that chunk's tuple, which the predictor times
    once (:func:`flopcount.measure.predict._chunk_seconds`)."""
    if _last_places and _last_places[0][0] is nodes and _last_places[0][1] is shares:
        return _last_places[1]
    if not (_last_facts and _last_facts[0][0] is nodes and _last_facts[0][1] is params
            and _last_facts[0][2] is gathered):
        from flopcount.parallel.roles import Graph

        _last_facts[:] = [(nodes, params, gathered), {}, {}, {}, {}, {}, Graph(list(nodes), inputs).weight_root]
    # each node's facts, one object for equal facts (the layers' nodes), each work made once for its facts and
    # FLOPs (a layer's node at its share on a rank is another layer's), found again by the node's key and FLOPs;
    # and each chunk's tuple once for its works
    facts: dict[int, tuple] = _last_facts[1]
    equal: dict[tuple, tuple] = _last_facts[2]
    works: dict[tuple, NodeWork] = _last_facts[3]
    by_node: dict[tuple, NodeWork] = _last_facts[4]
    chunk_of: dict[tuple, tuple[NodeWork, ...]] = _last_facts[5]
    key, node = _originals(nodes)
    lists: dict[tuple[int, int, int], list[NodeWork]] = {}  # by (stage, TP rank, chunk), in the order first seen
    for index, stage, tp, _, _, _, fwd, bwd, again, chunk in shares:
        k = key(index)
        asked = (k, fwd, bwd, again)
        work = by_node.get(asked)
        if work is None:
            known = facts.get(k)
            if known is None:
                known = _node_facts(node(k), params, gathered, _last_facts[6])
                known = facts[k] = equal.setdefault(known, known)
            same = (id(known), fwd, bwd, again)
            work = works.get(same)
            if work is None:
                work = works[same] = _node_work(known, fwd, bwd, again)
            by_node[asked] = work
        place = (stage, tp, chunk)
        found = lists.get(place)
        if found is None:
            found = lists[place] = []
        found.append(work)
    by_place: dict[tuple[int, int], dict[int, tuple[NodeWork, ...]]] = {}
    for (stage, tp, chunk), ws in lists.items():
        ids = tuple(map(id, ws))  # the works are held (``works``): equal ids, the same works
        one = chunk_of.get(ids)
        if one is None:
            if len(chunk_of) >= 2048:
                chunk_of.clear()
            one = chunk_of[ids] = tuple(ws)
        by_place.setdefault((stage, tp), {})[chunk] = one
    _last_places[:] = [(nodes, shares), by_place]
    return by_place


#: Each chunk's added works (:func:`_added`) by the node list (held), mode, tp, sp, pp and chunks (the layout's parts
#: they read); each chunk's tuple with them by the identities of the place's tuple (held) and the added one.
_added_by_plan: dict[tuple, tuple[Any, Mapping[int, tuple[NodeWork, ...]]]] = {}
_extended: dict[tuple[int, int], tuple] = {}


def _with_extra(by_place: Mapping[tuple[int, int], Mapping[int, tuple]], report: Any, layout: Any
                ) -> Mapping[tuple[int, int], Mapping[int, tuple]]:
    """Each place's chunks (:func:`_places`) with the work beyond FLOPs of the nodes each chunk runs
    (:func:`extra_works`: data moved without FLOPs, gradient sums) after its shares, on every TP rank of the stage
    at the rank's share of the node's outputs (:meth:`~flopcount.parallel.layout.Layout.activation_divisor`: 1/T
    for a node split over TP, whole for one replicated, 1/T under sp for a node on the sequence); a routed
    expert's at its balanced load. The same tuple for the same chunk and plan's shares, which the predictor times
    once (the plans of a search that differ in dp, cp, M or the sharding alone)."""
    from flopcount.parallel.layout import chunks_of

    plan = layout.plan
    key = (id(report.nodes), report.mode, plan.tp, plan.sp, plan.pp, chunks_of(plan))
    hit = _added_by_plan.get(key)
    if hit is None or hit[0] is not report.nodes:
        if len(_added_by_plan) > 256:
            _added_by_plan.clear()
        hit = _added_by_plan[key] = (report.nodes, _added(report, layout))
    added = hit[1]
    if not added:
        return by_place
    out: dict[tuple[int, int], dict[int, tuple]] = {}
    for place, chunks in by_place.items():
        mine = out[place] = {}
        for c, works in chunks.items():
            more = added.get(c, ())
            found = _extended.get((id(works), id(more)))
            if found is None or found[0] is not works or found[1] is not more:
                if len(_extended) > 4096:
                    _extended.clear()
                found = _extended[(id(works), id(more))] = (works, more, (*works, *more))
            mine[c] = found[2]
    return out


def _added(report: Any, layout: Any) -> Mapping[int, tuple[NodeWork, ...]]:
    """Each chunk's works beyond FLOPs (:func:`_with_extra`), in the nodes' order."""
    extra, original = extra_works(report)
    added: dict[int, list[NodeWork]] = {}
    divided: dict[tuple[int, int], NodeWork] = {}
    for p in (range(len(report.nodes)) if extra else ()):
        w = extra.get(original(p))
        if w is None:
            continue
        div = layout.activation_divisor(p)
        share = divided.get((original(p), div))
        if share is None:
            share = divided[(original(p), div)] = _divided(w, div)
        for c in layout.chunks[p]:
            added.setdefault(c, []).append(share)
    return {c: tuple(ws) for c, ws in added.items()}


def _divided(w: NodeWork, div: int) -> NodeWork:
    """``w`` on one of ``div`` ranks that split its tensors."""
    return w if div == 1 else replace(w, bytes=w.bytes / div, moved_bytes=w.moved_bytes / div,
                                      sum_bytes=w.sum_bytes / div)


#: The last shares (by identity) and, per (stage, TP rank) and chunk, the places of its experts' works in the
#: chunk's tuple (:func:`_places`' order: the shares' own) with their layer.
_last_experts: list[tuple] = []


def _loaded(report: Any, shares: Any, led: Any) -> Callable[[Mapping[int, tuple], Any], Mapping[int, tuple]]:
    """A rank's chunks (its place's, :func:`_places`) with each routed expert's work at the rank's share of the
    load: under ep, the nodes of rule ``expert`` of MoE layer l scaled by E·f_r,l (f_r,l the ledger's share of the
    layer's pairs for the rank's experts, its ``expert_shares`` with ``--expert-load``; balanced, f = 1/E, which
    leaves them the rank's own tokens' pairs), their weights read whole (:func:`_scaled`); a grouped product over
    the experts' gathered weights (:func:`_node_facts`) runs the rank's R/E experts alone: its matrices and the
    weight bytes it reads 1/E of the parameter's. The same chunks for ranks of the same place and EP rank (one
    tuple each, which the predictor times once)."""
    from flopcount.parallel.layout import layout_of

    if led.plan.ep == 1:
        return lambda chunks, r: chunks
    if not (_last_experts and _last_experts[0][0] is shares):
        layer = layout_of(report, led.plan).layer
        gathered, (key, node) = _gathered(report), _originals(report.nodes)
        found: dict[tuple[int, int], dict[int, list[tuple[int, int, bool]]]] = {}
        sizes: dict[tuple[int, int, int], int] = {}
        for x in shares:
            at = (x.stage, x.tp, x.chunk)
            k = sizes[at] = sizes.get(at, -1) + 1
            if x.rule == "expert":
                grouped = any(t is not None and t.name in gathered.tensors for t in node(key(x.index)).inputs)
                found.setdefault((x.stage, x.tp), {}).setdefault(x.chunk, []).append((k, layer[x.index], grouped))
        _last_experts[:] = [(shares,), found]
    experts, e = _last_experts[1], led.plan.ep
    made: dict[tuple, Mapping[int, tuple]] = {}

    def load(layer: int, rank: int) -> float:  # E·f_r,l: 1 balanced
        if not led.expert_shares:
            return 1.0
        num, den = led.expert_shares[layer][rank]
        return e * num / den

    def chunks_of(chunks: Mapping[int, tuple], r: Any) -> Mapping[int, tuple]:
        place = (r.stage, r.coords["tp"])
        key = (place, r.coords["ep"])
        if key not in made:
            out = dict(chunks)
            for c, at in experts.get(place, {}).items():
                factors = tuple((load(layer, r.coords["ep"]), e if grouped else 1) for _, layer, grouped in at)
                out[c] = _scaled_chunk(out[c], tuple(k for k, _, _ in at), factors)
            made[key] = out
        return made[key]

    return chunks_of


#: Chunks already scaled by the load (:func:`_scaled_chunk`), by the identity of the place's chunk (held, so that
#: the identity is not reused) and the factors: the plans of a search with the same shares and load get the same
#: tuples, which the predictor times once.
_scaled_chunks: dict[tuple[int, tuple, tuple], tuple] = {}


def _scaled_chunk(works: tuple, at: tuple[int, ...], factors: tuple[tuple[float, int], ...]) -> tuple:
    """``works`` with the work at each place of ``at`` scaled by its (factor, experts' split) (:func:`_scaled`)."""
    key = (id(works), at, factors)
    hit = _scaled_chunks.get(key)
    if hit is not None and hit[0] is works:
        return hit[1]
    out = list(works)
    for k, (f, split) in zip(at, factors):
        out[k] = _scaled(out[k], f, split)
    if len(_scaled_chunks) > 4096:
        _scaled_chunks.clear()
    _scaled_chunks[key] = (works, tuple(out))
    return _scaled_chunks[key][1]


def _scaled(w: NodeWork, f: float, split: int = 1) -> NodeWork:
    """``w`` run over ``f`` times its tokens: its FLOPs and the bytes of its activations times ``f``, the bytes of
    its weights (``whole_bytes``: an expert's weights are read once whatever its load) 1/``split`` (a grouped
    product's share of the experts, whose matrices are 1/``split`` too), unscaled by the load."""
    whole = w.whole_bytes / split
    return replace(w, flops=w.flops * f, bytes=(w.bytes - w.whole_bytes) * f + whole,
                   backward_flops=w.backward_flops * f, recompute_flops=w.recompute_flops * f,
                   matrices=max(1.0, w.matrices / split), whole_bytes=whole, moved_bytes=w.moved_bytes * f,
                   sum_bytes=w.sum_bytes * f)


#: Chunks split over the sequence (:func:`_split_context`), by the identity of the place's chunk (held) and C; and
#: their works, by the identity of the work (held) and C (a chunk's layers hold the same works).
_context_chunks: dict[tuple[int, int], tuple] = {}
_context_works: dict[tuple[int, int], tuple] = {}


def _split_context(chunks: Mapping[int, tuple], cp: int) -> Mapping[int, tuple]:
    """A rank's chunks under context parallelism of ``cp`` ranks: each node's FLOPs (forward, backward, a
    recompute's) 1/C (the ledger's split, :func:`flopcount.parallel.experts.cp_split`, here unrounded), its bytes
    1/C but for its ``whole_bytes`` (parameters, the gathered K and V an attention reads), its matrices as many
    (each 1/C of the rows). The same tuple for the same chunk, which the predictor times once, and the same work
    for the same work."""
    if cp == 1:
        return chunks
    out = {}
    for c, works in chunks.items():
        hit = _context_chunks.get((id(works), cp))
        if hit is None or hit[0] is not works:
            if len(_context_chunks) > 4096:
                _context_chunks.clear()
            hit = _context_chunks[(id(works), cp)] = (works, tuple(_split_work(w, cp) for w in works))
        out[c] = hit[1]
    return out


def _split_work(w: Any, cp: int) -> Any:
    """A node's work at 1/C of the sequence (:func:`_split_context`), once per work and C."""
    hit = _context_works.get((id(w), cp))
    if hit is None or hit[0] is not w:
        if len(_context_works) > 1 << 16:
            _context_works.clear()
        hit = _context_works[(id(w), cp)] = (w, replace(
            w, flops=w.flops / cp, bytes=(w.bytes - w.whole_bytes) / cp + w.whole_bytes,
            backward_flops=w.backward_flops / cp, recompute_flops=w.recompute_flops / cp,
            moved_bytes=w.moved_bytes / cp, sum_bytes=w.sum_bytes / cp))
    return hit[1]


def _ledger_work(report: Any) -> Work:
    from flopcount.parallel.layout import layout_of
    from flopcount.parallel.ranks import node_shares

    led = report.parallel
    plan = led.plan
    shares = node_shares(report, plan, led.recompute)
    by_place = _places(report.nodes, shares, report.modules.parameters, _gathered(report), report.model.inputs)
    by_place = _with_extra(by_place, report, layout_of(report, plan))
    loaded = _loaded(report, shares, led)
    stepped = any(r.optimizer_flops is not None for r in led.ranks)  # each rank's optimizer step reads these
    stages = layout_of(report, plan).stage_params(report.modules.params) if stepped else {}
    tensors = _stage_tensors(stages, report)
    ranks = []
    for r in led.ranks:
        chunks = loaded(_split_context(by_place.get((r.stage, r.coords["tp"]), {}), plan.cp), r)
        ranks.append(RankWork(r.rank, r.stage, r.coords["tp"], chunks, rank_messages(r, led), float(r.model_flops),
                              float(r.hardware_flops), _optimizer_bytes(r, led, report),
                              led.optimizer if r.optimizer_flops is not None else None,
                              _optimizer_tensors(r, report, tensors)))
    d = led.dims
    notes = []
    if plan.cp > 1 or plan.ep > 1:
        notes.append("cp and ep: each rank's nodes are its stage's shares at 1/C of the sequence (the parameters and "
                     "the gathered K and V read whole), its experts' at its share of the load; cp's collectives a "
                     "call per layer, ep's a call per dispatch, its probabilities and the combine, exposed")
    v = plan.virtual_stages if plan.schedule == "interleaved" and plan.pp > 1 else 1
    return Work(tuple(ranks), {"microbatches": plan.microbatches, "pp": plan.pp, "virtual": v,
                               "schedule": plan.schedule, "world": plan.tp * plan.pp * plan.cp * plan.dp},
                float(d["batch"] * d["seq"] * plan.microbatches * plan.dp), None, tuple(notes))


def report_work(report: Any) -> Work:
    """The :class:`~flopcount.measure.predict.Work` of ``report``: its per-rank ledger's ranks, or one rank."""
    if report.generation is not None:
        raise UsageError("--predict: a --generate count is not predicted yet; predict a training or inference count")
    work = _ledger_work(report) if report.parallel is not None else _one_rank(report)
    opt = report.optimizer[0] if report.optimizer is not None else None
    if report.mode == "train" and opt not in OPTIMIZER_TRAFFIC:
        why = "no optimizer counted (count with --optimizer)" if opt is None else f"no traffic rule for {opt}"
        work = replace(work, notes=(*work.notes, f"the optimizer step is left out: {why}"))
    return work
