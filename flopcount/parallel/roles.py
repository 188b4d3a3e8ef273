"""The roles of a model's parts, read off its counted graph's dataflow (not its module names): the repeated layers,
in each a sequence mixer (Mamba, gated delta rule, short convolution), the attention's projections (column-parallel,
K/V, latent), its row-parallel projection and heads, the MLP's projections around its activation and its inner ops,
routers; outside the layers the token embedding, the position tables, the LM head (tied or not) and the loss.
:mod:`flopcount.parallel.layout` states the rules and builds its :class:`~flopcount.parallel.layout.Layout` from
what these functions find."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["FLOATS", "Found", "Graph", "MIXERS", "PRODUCTS", "Scoped", "elements", "index_in", "kv_heads",
           "layer_roles", "layers_of", "mixer_refused", "outside_roles", "stack_layer", "stack_prefix", "stacks_of",
           "tied_weights", "width"]

#: The operator families of products (a weight product reads a stored tensor, an activation product none).
PRODUCTS = ("matmul", "gemm", "conv", "einsum")
#: ONNX element types of stored weights: FLOAT, FLOAT16, DOUBLE, BFLOAT16.
FLOATS = frozenset({1, 10, 11, 16})
_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Cast", "Slice",
                    "Expand"})
_META = frozenset({"Shape", "Size"})
#: Ops of a cross-entropy over the vocabulary after the LM head: its vocab-parallel form all-reduces the logits'
#: maximum, the sum of their exponentials and the target's logit.
_CROSS_ENTROPY = frozenset({"Softmax", "LogSoftmax", "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"})
#: The kinds of sequence mixer :func:`layer_roles` tells apart, each with the words a refusal names it by.
MIXERS = {"mamba": "Mamba mixer (a selective scan over the sequence)",
          "delta": "gated delta rule mixer (linear attention: a recurrence over the sequence)",
          "short_conv": "short-convolution mixer (a gated causal convolution over the sequence)"}
#: Ops of a running state over the sequence (a chunked scan's cumulative decay, a loop).
_SCANS = frozenset({"CumSum", "Scan", "Loop"})
#: Ops of a norm's variance over the last axis (a Mamba 2 mixer's gated norm, in groups).
_VARIANCE = frozenset({"ReduceMean", "ReduceSumSquare"})
#: Ops of an L2 norm over the last axis (the gated delta rule's normalised queries and keys).
_L2 = frozenset({"ReduceSum", "ReduceSumSquare", "ReduceL2", "LpNormalization"})


def index_in(scope: str, prefix: str | None = None) -> tuple[str, int | None]:
    """(prefix, N) of the first indexed module ``prefix.N`` in a module path (``("", None)``: none)."""
    parts = scope.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            p = ".".join(parts[:i])
            if prefix is None or p == prefix:
                return p, int(part)
            return p, None
    return "", None


class Graph:
    """The report's nodes as a dataflow graph: producers, consumers and which tensors are weights."""

    def __init__(self, nodes: Sequence[Any], inputs: Sequence[Any]):
        self.nodes = nodes
        self.producer: dict[str, int] = {}  # the first node that makes a tensor
        self.producers: dict[str, list[int]] = {}  # every node that does (a stack extended by copies repeats names)
        self.consumers: dict[str, list[int]] = {}
        self.info: dict[str, Any] = {}
        for k, n in enumerate(nodes):
            for x in n.outputs:
                if x is not None and x.name:
                    self.producer.setdefault(x.name, k)
                    self.producers.setdefault(x.name, []).append(k)
            for x in n.inputs:
                if x is not None and x.name:
                    self.consumers.setdefault(x.name, []).append(k)
                    self.info.setdefault(x.name, x)
        model_inputs = {x.name for x in inputs}
        self.stored = {name for name, x in self.info.items() if name not in self.producer and
                       name not in model_inputs and x.elem_type in FLOATS}
        self.inputs = model_inputs
        self._weight: dict[str, str | None] = {}

    def next_maker(self, name: str, k: int) -> int:
        """The next node after ``k`` that makes ``name`` again (a stack extended by copies), else past the last."""
        return min((q for q in self.producers.get(name, ()) if q > k), default=len(self.nodes))

    def weight_root(self, name: str) -> str | None:
        """The stored tensor ``name`` is (or a view, slice or lookup of); None for an activation."""
        if name in self._weight:
            return self._weight[name]
        root, seen = name, 0
        while root not in self.stored and seen < 64:
            k = self.producer.get(root)
            n = self.nodes[k] if k is not None else None
            if n is None or n.op_type not in _VIEWS or not n.inputs or n.inputs[0] is None:
                root = None
                break
            root, seen = n.inputs[0].name, seen + 1
        out = root if root in self.stored else None
        self._weight[name] = out
        return out

    def on_weights(self, k: int) -> bool:
        """Whether node ``k`` works on stored tensors alone (a weight's view, Gemma's 1 + weight): no activation in."""
        n = self.nodes[k]
        if n.op_type in _VIEWS and n.inputs and n.inputs[0] is not None and self.weight_root(n.inputs[0].name):
            return True  # a view of a weight, whatever computes its shape (ViT's class token expanded to the batch)
        names = [x.name for x in n.inputs if x is not None and x.name]
        return bool(names) and any(self.weight_root(x) is not None for x in names) and all(
            self.weight_root(x) is not None or (x not in self.producers and x not in self.inputs) for x in names)

    def weights(self, k: int) -> list[tuple[int, str]]:
        """(input position, stored root) of node ``k``'s weight inputs."""
        return [(j, r) for j, x in enumerate(self.nodes[k].inputs)
                if x is not None and x.name and (r := self.weight_root(x.name)) is not None]

    def reach(self, starts: Sequence[str], inside, stop, forward: bool) -> tuple[set[int], set[int]]:
        """(nodes passed, stopping nodes met) from tensors ``starts``, through nodes ``inside`` accepts, stopping
        at nodes ``stop`` accepts; backward through producers or forward through consumers."""
        passed: set[int] = set()
        met: set[int] = set()
        todo = list(starts)
        while todo:
            name = todo.pop()
            nxt = self.consumers.get(name, ()) if forward else (
                self.producers.get(name, ()))
            for k in nxt:
                if k in passed or k in met or not inside(k):
                    continue
                if stop(k):
                    met.add(k)
                    continue
                passed.add(k)
                n = self.nodes[k]
                if n.op_type in _META:
                    continue
                todo.extend(x.name for x in (n.outputs if forward else n.inputs) if x is not None and x.name)
        return passed, met




def stack_prefix(scopes: Sequence[Sequence[str]]) -> str | None:
    """The prefix P of the repeated layers ``P.N``: the one whose indexed modules hold the most nodes."""
    counts: dict[str, int] = {}
    for sc in scopes:
        if sc:
            p, n = index_in(sc[-1])
            if n is not None:
                counts[p] = counts.get(p, 0) + 1
    return max(counts, key=lambda p: (counts[p], p)) if counts else None


def stacks_of(g: Graph, scopes: Sequence[Sequence[str]]) -> tuple[tuple[str, int], ...]:
    """The stacks of repeated layers, each as (prefix P of its modules ``P.N``, the index its layer 0 takes): those
    whose indexed modules hold attention (an activation product of two activations: an encoder-decoder's encoder and
    decoder), in the order of their first node, each numbered after the one before; else the one of
    :func:`stack_prefix`."""
    first: dict[str, int] = {}
    size: dict[str, int] = {}
    attended: set[str] = set()
    for k, sc in enumerate(scopes):
        p, n = index_in(sc[-1]) if sc else ("", None)
        if n is None:
            continue
        first.setdefault(p, k)
        size[p] = max(size.get(p, 0), n + 1)
        node = g.nodes[k]
        if node.family in PRODUCTS and not g.weights(k) and sum(x is not None for x in node.inputs) > 1:
            attended.add(p)
    if len(attended) < 2:
        prefix = stack_prefix(scopes)
        return ((prefix, 0),) if prefix is not None else ()
    out, offset = [], 0
    for p in sorted(attended, key=first.__getitem__):
        out.append((p, offset))
        offset += size[p]
    return tuple(out)


def stack_layer(module: str, stacks: Sequence[tuple[str, int]]) -> int | None:
    """The layer (numbered over all ``stacks``) that a module path lies in; None outside them."""
    for prefix, offset in stacks:
        n = index_in(module, prefix)[1]
        if n is not None:
            return offset + n
    return None


def layers_of(g: Graph, scopes: Sequence[Sequence[str]], stacks: Sequence[tuple[str, int]]) -> list[int | None]:
    out: list[int | None] = []
    for k, sc in enumerate(scopes):
        if sc:
            out.append(stack_layer(sc[-1], stacks))
            continue
        made = [max((q for q in g.producers.get(x.name, ()) if q < k), default=None)
                for x in g.nodes[k].inputs if x is not None and x.name in g.producers]
        made = [q for q in made if q is not None]
        out.append(out[made[0]] if made else None)
    return out


def _block_own(sc: Sequence[str], blocks: set[str]) -> bool:
    """Whether a node is a MoE block's router or one of the block's own ops (the sum of shared and routed)."""
    return bool(sc) and any(sc[-1] == b or sc[-1] in (b + ".gate", b + ".shared_expert_gate") for b in blocks)


def width(x: Any, k: int = -1) -> int | None:
    shape = getattr(x, "shape", None)
    return shape[k] if shape and len(shape) >= abs(k) and isinstance(shape[k], int) else None


@dataclass
class Found:
    """What one layer's dataflow shows (filled by :func:`layer_roles`)."""

    heads: int = 0
    head_dim: int = 0
    kv_width: int = 0  # the K projection's output width (K and V fused: both)
    kv_fused: str = ""  # "qkv" (one projection), "kv" (K and V in one), "latent" (MLA: up from a latent)
    ffn: int = 0
    weight_type: int = 0
    unclassified: tuple[int, ...] = ()
    mixer: str = ""  # the layer's state-space or linear-attention mixer: one of MIXERS' keys ("": none)
    mixer_heads: int = 0  # a Mamba 2 mixer's heads and groups of B and C (0: a mixer without heads, Mamba 1's)
    mixer_groups: int = 0
    attentions: int = 0  # the layer's attention blocks (its context products: a decoder's self- and cross-attention)
    cross: int = 0  # the tokens (elements / width) cross-attention's K/V projections read from outside the layer
    latents: int = 0  # the elements multi-head latent attention's up projections and heads read (_latents)
    latent_parts: tuple[int, ...] = ()  # those elements by tensor, each gathered on its own (_latents)


@dataclass(frozen=True)
class Scoped:
    """The graph and what its nodes' module scopes tell :func:`layer_roles`: each node's ``scopes``, whether it is
    inside a block's routed experts (``expert``) and the routed MoE blocks' module paths (``blocks``)."""

    g: Graph
    scopes: Sequence[Sequence[str]]
    expert: Sequence[bool]
    blocks: set[str]


class _Flow:
    """One layer's dataflow: its weight products and activation products, traced within the layer."""

    def __init__(self, g: Graph, ks: list[int], roles: list[str]):
        self.g, self.inset = g, set(ks)
        products = [k for k in ks if g.nodes[k].family in PRODUCTS and not roles[k]]
        self.wprod = {k for k in products if g.weights(k)}
        self.aprod = {k for k in products if k not in self.wprod}

    def inside(self, k: int) -> bool:
        return k in self.inset

    def back(self, k: int, j: int) -> set[int]:
        """The products first met going back from node ``k``'s input ``j``."""
        x = self.g.nodes[k].inputs[j] if len(self.g.nodes[k].inputs) > j else None
        if x is None:
            return set()
        return self.g.reach([x.name], self.inside, lambda q: q in self.wprod or q in self.aprod, False)[1]

    def cached(self, k: int, j: int) -> bool:
        """Whether node ``k``'s input ``j`` is the graph's input (a decode step's cached keys or values), through
        the layer's nodes with no product on the way."""
        x = self.g.nodes[k].inputs[j] if len(self.g.nodes[k].inputs) > j else None
        if x is None:
            return False
        passed, met = self.g.reach([x.name], self.inside, lambda q: q in self.wprod or q in self.aprod, False)
        names = {x.name} | {y.name for q in passed for y in self.g.nodes[q].inputs if y is not None and y.name}
        return not met and bool(names & self.g.inputs)

    def activations(self, ks) -> list[str]:
        return [x.name for k in ks for x in self.g.nodes[k].inputs
                if x is not None and x.name and self.g.weight_root(x.name) is None]

    def upstream(self, cs: set[int]) -> set[int]:
        """The weight products first met going back from the activation inputs of ``cs``."""
        return self.g.reach(self.activations(cs), self.inside, lambda q: q in self.wprod, False)[1]

    def between(self, ends) -> set[int]:
        """The nodes going back from the activation inputs of ``ends`` to the weight products."""
        return self.g.reach(self.activations(ends), self.inside, lambda q: q in self.wprod, False)[0]

    def ahead(self, k: int, stop) -> set[int]:
        """The nodes ``stop`` accepts first met going forward from node ``k``'s outputs."""
        return self.g.reach([x.name for x in self.g.nodes[k].outputs if x is not None], self.inside, stop, True)[1]


def _short_conv(g: Graph, k: int) -> bool:
    """Whether node ``k`` is a depthwise 1-D convolution over the sequence: a Conv of a weight ``(C, 1, K)`` on an
    input of C channels ``(N, C, S)``."""
    n = g.nodes[k]
    if n.op_type != "Conv" or len(n.inputs) < 2:
        return False
    w, x = getattr(n.inputs[1], "shape", None), getattr(n.inputs[0], "shape", None)
    return bool(w) and len(w) == 3 and w[1] == 1 and bool(x) and len(x) == 3 and x[1] == w[0]


def _mixer_roles(g: Graph, ks: list[int], roles: list[str], found: Found) -> None:
    """Mark the layer's state-space or linear-attention mixer ``mixer`` and name its kind in ``found`` (see
    :mod:`flopcount.parallel.layout`'s rules)."""
    if not any(_short_conv(g, k) for k in ks):
        return
    flow = _Flow(g, ks, roles)
    convs = {k for k in flow.wprod if _short_conv(g, k)}
    ins = set().union(*(flow.back(c, 0) & flow.wprod for c in convs)) if convs else set()
    reads = flow.activations(sorted(ins)[:1])
    hidden = width(g.info.get(reads[0])) if reads else None
    if not hidden:
        return
    outs = set().union(*(flow.ahead(c, lambda q: q in flow.wprod and q not in convs and
                                    width(g.nodes[q].outputs[0]) == hidden) for c in convs))
    if not outs:
        return
    after = g.reach([x.name for k in ins for x in g.nodes[k].outputs if x is not None], flow.inside,
                    outs.__contains__, True)[0]
    passed, met = g.reach(flow.activations(sorted(outs)), flow.inside, lambda q: q in flow.wprod and q not in after,
                          False)
    mixer = passed | met | outs
    for k in mixer:
        roles[k] = "row" if k in outs else "mixer"
    first = set().union(*(g.reach([x.name for x in g.nodes[c].outputs if x is not None], mixer.__contains__,
                                  lambda q: g.nodes[q].family in PRODUCTS, True)[0] for c in convs))
    if any(g.nodes[k].op_type in _SCANS or (g.nodes[k].family in PRODUCTS and not g.weights(k)) for k in mixer):
        found.mixer = "delta" if any(g.nodes[k].op_type in _L2 for k in first) else "mamba"
    else:
        found.mixer = "short_conv"
    if found.mixer == "mamba":
        found.mixer_heads, found.mixer_groups = _mamba2_heads(g, mixer, ins, convs, outs)


def _mamba2_heads(g: Graph, mixer: set[int], ins: set[int], convs: set[int], outs: set[int]) -> tuple[int, int]:
    """(heads, groups of B and C) of a Mamba 2 mixer (see :mod:`flopcount.parallel.layout`'s rules); (0, 0) for a
    mixer without heads (Mamba 1's: its in-projection as wide as z and the convolved x)."""
    reads = [x for x in g.nodes[min(outs)].inputs if x is not None and x.name and g.weight_root(x.name) is None]
    inner = width(reads[0]) if reads else None  # the out-projection's input: z's width, d_inner
    channels = sum(width(g.nodes[c].inputs[1], 0) or 0 for c in convs)
    heads = sum(width(g.nodes[k].outputs[0]) or 0 for k in ins) - (inner or 0) - channels
    if not inner or heads <= 0 or inner % heads:
        return 0, 0
    groups = 1  # the gated norm's groups: the variance over the last axis of (..., groups, inner / groups)
    for k in mixer:
        x = g.nodes[k].inputs[0] if g.nodes[k].op_type in _VARIANCE and g.nodes[k].inputs else None
        shape = getattr(x, "shape", None)
        if shape and len(shape) >= 2 and isinstance(shape[-1], int) and isinstance(shape[-2], int) \
                and shape[-1] * shape[-2] == inner:
            groups = shape[-2]
    return (heads, groups) if (channels - inner) % (2 * groups) == 0 else (0, 0)


def _attention_roles(flow: _Flow, roles: list[str], found: Found, products: list[int]) -> set[int]:
    """Mark the layer's attention projections (see the module's rules); ``products`` gets its score and context
    products; the weight products it placed."""
    nodes, wprod = flow.g.nodes, flow.wprod
    q_src: set[int] = set()
    k_src: set[int] = set()
    v_src: set[int] = set()
    contexts = []
    for a in sorted(flow.aprod):
        m0, m1 = flow.back(a, 0), flow.back(a, 1)
        kv = m1 & wprod or flow.cached(a, 1)  # K or V projected in the layer, or read from the cache alone
        if m0 & flow.aprod and kv:
            contexts.append(a)
            v_src |= m1 & wprod
        elif m0 & wprod and kv:
            products.append(a)
            q_src |= m0 & wprod
            k_src |= m1 & wprod
            found.cross += _cross_tokens(flow, m0 & wprod, m1 & wprod)
            if not found.heads:
                found.heads, found.head_dim = width(nodes[a].inputs[0], -3) or 0, width(nodes[a].inputs[0]) or 0
    products.extend(contexts)
    found.attentions = len(contexts)
    cand = q_src | k_src | v_src
    rows = set()  # the row-parallel projections: no latent (a cross-attention's Q reads the self-attention's)
    for a in contexts:
        rows |= flow.ahead(a, lambda q: q in wprod)
    latent, todo = set(), flow.upstream(cand) - rows
    while todo - latent:
        latent |= todo
        todo = flow.upstream(todo) - rows
    cand -= latent
    for c in cand:
        roles[c] = "column" if c in q_src else "kv"
    kv_proj = sorted(c for c in cand if c not in q_src)
    fused = sorted(c for c in cand if c in q_src and c in (k_src | v_src))
    if fused:
        found.kv_fused, found.kv_width = "qkv", width(nodes[fused[0]].outputs[0]) or 0
    elif kv_proj:
        feeds_both = [c for c in kv_proj if c in k_src and c in v_src]
        found.kv_fused = "latent" if any(c in flow.upstream({p}) for p in kv_proj for c in latent) else (
            "kv" if feeds_both else "")
        found.kv_width = width(nodes[(feeds_both or [c for c in kv_proj if c in k_src] or kv_proj)[0]].outputs[0]) or 0
    for c in latent:
        roles[c] = "latent"
    for r in rows:
        roles[r] = "row"
    for k in sorted(flow.between(rows)):
        if not roles[k]:
            roles[k] = _head_role(nodes[k], found.heads, kv_heads(found))
    return cand | latent | rows


def _cross_tokens(flow: _Flow, q: set[int], k: set[int]) -> int:
    """The tokens (elements / width) of what the K projections ``k`` read from outside the layer and the Q
    projections ``q`` do not: a cross-attention's other stream (an encoder's output); 0 for self-attention."""
    g, theirs = flow.g, set(flow.activations(sorted(q)))
    out = 0
    for name in dict.fromkeys(flow.activations(sorted(k))):
        info = g.info.get(name)
        if name not in theirs and g.producer.get(name) not in flow.inset and width(info):
            out += elements(info) // width(info)
    return out


def _mlp_roles(flow: _Flow, roles: list[str], found: Found, rest: set[int]) -> None:
    """Mark the MLP's projections among the weight products ``rest`` and its inner ops (see the module's rules)."""
    reach = {c: flow.ahead(c, lambda q: q in flow.wprod or q in flow.aprod) & rest for c in rest}
    rows = set().union(*reach.values()) if reach else set()
    cols = {c for c, r in reach.items() if r}
    found.unclassified = tuple(sorted((rest - rows - cols) | (rows & cols)))
    for c in sorted(cols - rows):
        roles[c] = "column"
        found.ffn = found.ffn or (width(flow.g.nodes[c].outputs[0]) or 0)
    for c in rows - cols:
        roles[c] = "row"
    for k in flow.between(rows - cols):
        if not roles[k]:
            roles[k] = "inner"


#: The ops by which a MoE router's scores pick each token's experts: top-k, or the top-1 of an argmax (Switch).
_PICKS = ("TopK", "ArgMax")


def layer_roles(at: Scoped, ks: list[int], roles: list[str], attention: dict, layer: int) -> Found:
    """Fill ``roles`` for the nodes ``ks`` of one layer (see the module's rules); what it found."""
    g, scopes, expert, blocks = at.g, at.scopes, at.expert, at.blocks
    found = Found()
    for k in ks:
        if expert[k]:
            roles[k] = "expert"
        elif _block_own(scopes[k], blocks):
            roles[k] = "router"
    _mixer_roles(g, ks, roles, found)
    flow = _Flow(g, ks, roles)
    routers = {c for c in flow.wprod if any(g.nodes[q].op_type in _PICKS for q in flow.ahead(
        c, lambda q: q in flow.wprod or g.nodes[q].op_type in _PICKS))}  # a MoE router: its scores pick experts
    for c in routers:
        roles[c] = "router"
    # a node in the module of one projection takes its role (a row projection's outputs: per-token work), before
    # the heads and inner ops between the projections are marked
    marked = {k: roles[k] for k in ks}
    products: list[int] = []
    placed = _attention_roles(flow, roles, found, products)
    _mlp_roles(flow, roles, found, flow.wprod - placed - routers)
    attention[layer] = products
    weights = sorted(placed) + sorted(flow.wprod)
    if weights:
        found.weight_type = g.info[g.weights(weights[0])[0][1]].elem_type
    by_module: dict[str, set[str]] = {}
    for c in flow.wprod:
        if roles[c] and scopes[c]:
            by_module.setdefault(scopes[c][-1], set()).add(roles[c])
    for k in ks:
        own = by_module.get(scopes[k][-1]) if scopes[k] and not marked[k] and k not in flow.wprod else None
        if own and len(own) == 1:
            role = next(iter(own))
            roles[k] = "row_out" if role == "row" else role
    for k in ks:
        if not roles[k]:
            roles[k] = "sequence"
    found.latent_parts = _latents(g, ks, roles) if found.kv_fused == "latent" else ()
    found.latents = sum(found.latent_parts)
    return found


def _latents(g: Graph, ks: Sequence[int], roles: Sequence[str]) -> tuple[int, ...]:
    """Elements of what a multi-head latent attention's up projections and heads read, made over the sequence (the
    rank's tokens under sp), by tensor: its latent products' outputs (the q latent, the kv latent with the shared
    rotary key, or each part of it where a Split alone reads it: the kv latent and the rotary key, each gathered on
    its own; their norms keep the width) and a hidden input that one of its column-parallel projections reads as
    well (DeepSeek-V2-Lite's Q projection, without a q latent), each once; ``ks``: one layer's nodes."""
    ks = set(ks)
    out = []
    for k in sorted(ks):
        for x in g.nodes[k].outputs[:1] if roles[k] == "latent" and g.nodes[k].family in PRODUCTS else ():
            readers = g.consumers.get(x.name, ()) if x is not None else ()
            split = len(readers) == 1 and g.nodes[readers[0]].op_type == "Split"
            out.extend(g.nodes[readers[0]].outputs if split else (x,))
    for k in ks:
        if roles[k] == "latent" and g.nodes[k].family in PRODUCTS:
            for x in g.nodes[k].inputs[:1]:
                readers = g.consumers.get(x.name, ()) if x is not None else ()
                if any(roles[q] in ("column", "kv") and g.nodes[q].family in PRODUCTS for q in readers):
                    out.append(x)
    return tuple(elements(g.info.get(x.name, x)) for x in {x.name: x for x in out if x is not None}.values())


def kv_heads(found: Found) -> int:
    """K/V heads from the K projection's width (see the module's rules); 0 where it does not give whole heads."""
    h, d, w = found.heads, found.head_dim, found.kv_width
    if not h or not d:
        return 0
    if found.kv_fused == "latent":
        return h  # multi-head latent attention: K and V up-projected per query head
    if found.kv_fused == "qkv":
        per, rest = divmod(w, d)
        return (per - h) // 2 if not rest and per > h and (per - h) % 2 == 0 else 0
    per, rest = divmod(w, 2 * d if found.kv_fused == "kv" else d)
    return per if not rest else 0


def _head_role(n: Any, heads: int, kv: int) -> str:
    x = n.inputs[0] if n.inputs else None
    shape = getattr(x, "shape", None)
    if shape and len(shape) >= 4 and isinstance(shape[1], int):
        if heads > 1 and shape[1] == 1:
            return "shared_head"
        if kv and kv != heads and shape[1] == kv:
            return "kv_heads"
    return "heads"


def outside_roles(g: Graph, layer: Sequence[int | None], roles: list[str],
                   hidden: int) -> tuple[set[int], bool, int, frozenset[str]]:
    """Fill ``roles`` for the nodes outside the layers (see the module's rules); (the nodes after the layers,
    whether a loss follows the LM head, the vocabulary, the stored tensors the embedding and head share)."""
    nodes = g.nodes
    outside = [k for k in range(len(nodes)) if layer[k] is None]
    out_set = set(outside)
    tail = g.reach([x.name for k, n in enumerate(nodes) if layer[k] is not None for x in n.outputs
                    if x is not None and x.name], out_set.__contains__, lambda q: False, True)[0]
    embeds = []
    for k in outside:
        n = nodes[k]
        if n.op_type == "Gather" and k not in tail and len(n.inputs) > 1 and n.inputs[0] is not None and \
                n.inputs[1] is not None and n.inputs[0].name in g.stored:
            passed, _ = g.reach([n.inputs[1].name], out_set.__contains__, lambda q: False, False)
            names = {x.name for q in passed for x in nodes[q].inputs if x is not None} | {n.inputs[1].name}
            if names & g.inputs:
                embeds.append(k)
    token = max(embeds, key=lambda k: (width(nodes[k].inputs[0], 0) or 0, -k)) if embeds else None
    vocab = (width(nodes[token].inputs[0], 0) or 0) if token is not None else 0
    # the token lookups on that table (an encoder-decoder's encoder and decoder share it)
    table = nodes[token].inputs[0].name if token is not None else None
    tokens = {k for k in embeds if nodes[k].inputs[0].name == table}
    lookups = {k for k in outside if k not in tail and nodes[k].op_type == "Gather" and nodes[k].inputs and
               nodes[k].inputs[0] is not None and nodes[k].inputs[0].name in g.stored}
    starts = [x.name for k in lookups for x in nodes[k].outputs if x is not None] + sorted(
        x for x in g.inputs if g.info.get(x) is not None and g.info[x].elem_type in FLOATS)
    stream = lookups | g.reach(starts, lambda q: q in out_set and q not in tail, lambda q: False, True)[0]
    head = next((k for k in sorted(tail) if nodes[k].family in PRODUCTS and g.weights(k) and (
        width(nodes[k].outputs[0]) == vocab if vocab else (width(nodes[k].outputs[0]) or 0) > hidden)), None)
    if head is not None and not vocab:
        vocab = width(nodes[head].outputs[0]) or 0
    after_head = g.reach([x.name for x in nodes[head].outputs if x is not None], tail.__contains__,
                         lambda q: False, True)[0] if head is not None else set()
    kept = set()  # after a replicated product of the tail (a pooler, a classifier)
    for k in sorted(tail):
        if k != head and k not in after_head and nodes[k].family in PRODUCTS and g.weights(k):
            kept |= {k} | g.reach([x.name for x in nodes[k].outputs if x is not None], tail.__contains__,
                                  lambda q: False, True)[0]
    has_loss = False
    for k in outside:
        n = nodes[k]
        if k in tokens:
            roles[k] = "embedding"
        elif k in tail:
            if k == head:
                roles[k] = "vocab"
            elif k in after_head:
                roles[k] = "vocab" if any(width(x) == vocab for x in n.inputs if x is not None) else "replicated"
                has_loss = has_loss or n.op_type in _CROSS_ENTROPY
            else:
                roles[k] = "replicated" if k in kept else "sequence"
        else:
            roles[k] = "replicated" if k in stream else "positions"
    return tail, has_loss, vocab, tied_weights(g, token, head)


def tied_weights(g: Graph, token: int | None, head: int | None) -> frozenset[str]:
    """The stored tensors the token embedding and the LM head both read (none when they are not tied)."""
    if token is None or head is None:
        return frozenset()
    return frozenset({r for _, r in g.weights(token)} & {r for _, r in g.weights(head)})


def elements(x: Any) -> int:
    n = 1
    for s in getattr(x, "shape", None) or ():
        n *= s if isinstance(s, int) else 0
    return n


def mixer_refused(plan: Any, layer: int, found: Found) -> str:
    """The one line refusing a plan that would split layer ``layer``'s mixer (see the module's rules)."""
    kind = found.mixer
    if plan.cp > 1:
        why = ("each token reads the tokens before it, which lie on another rank" if kind == "short_conv" else
               "its state runs from each token to the next, and no framework splits the scan itself over the "
               "sequence (Megatron's MambaContextParallel swaps to a split of the heads by all-to-all instead, "
               "which the ledger does not model)")
        return f"--parallel cp={plan.cp}: layer {layer}'s {MIXERS[kind]} cannot be split over the sequence: {why}; " \
               "give cp=1"
    if kind == "mamba" and found.mixer_heads:
        how = (f"Megatron's MambaMixer splits its {found.mixer_heads} heads and its {found.mixer_groups} "
               f"group{'s' if found.mixer_groups > 1 else ''} of B and C over TP, and tp must divide both; give "
               + ("tp=1" if math.gcd(found.mixer_heads, found.mixer_groups) == 1 else
                  f"tp={math.gcd(found.mixer_heads, found.mixer_groups)} or a divisor of it"))
        return f"--parallel tp={plan.tp}: layer {layer}'s {MIXERS[kind]} is not split over TP: {how}"
    how = ("it has no heads to split (Mamba 1's selective scan runs per channel), and no framework's tensor-parallel "
           "rule for it is modeled" if kind == "mamba" else "no tensor-parallel rule for it is modeled")
    return f"--parallel tp={plan.tp}: layer {layer}'s {MIXERS[kind]} is not split over TP: {how}; give tp=1"
