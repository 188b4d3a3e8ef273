"""FLOPs per module: the module scopes an exporter wrote into a graph, and the per-module rows of a report.

A node's **scope** is the chain of modules whose ``forward`` ran it, outermost first, each named by its full
path as the framework names it (PyTorch ``named_modules()`` paths: ``("layer1", "layer1.0",
"layer1.0.conv1")``; Keras layer names). Where the scopes come from, in this order:

* node metadata ``pkg.torch.onnx.name_scopes`` (the torch.export-based exporter writes it on every node:
  ``['', 'layer1', 'layer1.0', 'layer1.0.conv1', 'conv2d']``, the root module first and the node's own name
  last);
* node names that carry a path, as the TorchScript exporter writes them (``/layer1/layer1.0/conv1/Conv``: each
  segment a module, relative to its parent or already full, the last the operator) and tf2onnx and
  paddle2onnx-style names (``model/conv2d/Conv2D``: a prefix that every node shares names the model itself and
  is dropped).

A graph whose nodes carry neither has no scopes, and :attr:`ModuleScopes.missing` says so; scopes are never
invented. The TorchScript exporter names the second call of a module ``fc_1``: such a segment is read as a
call of ``fc`` when ``fc`` owns parameters by name and ``fc_1`` owns none.

**Rows.** :func:`module_rows` forms one row per module down to a depth, with the forward and backward work
of every node in the module or below it (backward work belongs to the module of the forward node it
differentiates) and the parameters stored in it or below it. A module called several times sums its calls;
a parameter is counted once, in the module that owns it (by its name, ``layer1.0.conv1.weight``, or else by
the scope of the node that first reads it). Rows partition the work exactly: the depth-1 rows, together
with a row for the work outside any module, sum to the totals, and a module's children sum to the module,
where a module that has work of its own beside its listed children shows it as a ``(own)`` child row.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from ..cost import Cost
from ..errors import UsageError
from .tiled import Tiled, TiledMapping, check_listable, distinct

__all__ = ["ModuleRow", "ModuleScopes", "OUTSIDE", "OWN", "module_rows", "scopes_of"]

#: Name of the row that holds the work outside any module (graph inputs' casts, a loss, the root's own code).
OUTSIDE = "(outside any module)"
#: Suffix of the row that holds a module's own work beside its listed children.
OWN = " (own)"

_METADATA_KEY = "pkg.torch.onnx.name_scopes"
#: The scope torch.export gives nodes that ran outside every module (made by a metadata hook): no module.
_NO_MODULE = "_empty_nn_module_stack_from_metadata_hook"
_REPEAT = re.compile(r"^(.+)_(\d+)$")
_ZERO = Cost()

Scope = tuple[str, ...]


@dataclass(frozen=True)
class ModuleScopes:
    """The module scopes of a counted graph.

    ``nodes`` holds each counted node's scope, aligned with :attr:`flopcount.reporting.report.Report.nodes` (``()``:
    outside any module); ``params`` the parameter elements each module owns itself (not its children's);
    ``source`` where the scopes were read (``"metadata"``, ``"names"``), and ``missing`` why a graph has none
    ("" when it has); ``parameters`` the names of the stored tensors that are parameters
    (:mod:`flopcount.pipeline.parameters`' rule; buffers and constants are not).
    """

    nodes: tuple[Scope, ...] = ()
    params: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    source: str = ""
    missing: str = "the graph was counted without its node names"
    parameters: frozenset[str] = frozenset()


class ModuleRow(NamedTuple):
    """One module's share of a count: its work and parameters, children included."""

    module: str  # full path ("layer1.0.conv1"), OUTSIDE, or "<parent> (own)"
    depth: int  # 1 for the root's children
    parent: str  # "" at depth 1
    forward: Cost
    backward: Cost
    params: int

    @property
    def total(self) -> Cost:
        return self.forward + self.backward

    @property
    def flops(self) -> int:
        return self.total.flops

    @property
    def macs(self) -> int:
        return self.total.macs


def _full_paths(segments: Sequence[str]) -> Scope:
    """Segments that each name a module relative to the previous one, or already in full, as full paths.

    >>> _full_paths(["layer1", "layer1.0", "conv1"])
    ('layer1', 'layer1.0', 'layer1.0.conv1')
    >>> _full_paths(["model", "layers.0", "self_attn"])
    ('model', 'model.layers.0', 'model.layers.0.self_attn')
    """
    out: list[str] = []
    for s in segments:
        if not s:
            continue
        if out and not s.startswith(out[-1] + "."):
            s = f"{out[-1]}.{s}"
        out.append(s)
    return tuple(out)


def _metadata_scope(value: str) -> Scope | None:
    """The module chain of a ``pkg.torch.onnx.name_scopes`` value (root and node name dropped).

    >>> _metadata_scope("['', 'layer1', 'layer1.0', 'layer1.0.conv1', 'conv2d']")
    ('layer1', 'layer1.0', 'layer1.0.conv1')
    >>> _metadata_scope("['', 'add']")
    ()
    >>> _metadata_scope("['', '_empty_nn_module_stack_from_metadata_hook', 'arange']")
    ()
    """
    try:
        names = ast.literal_eval(value)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names) or not names:
        return None
    return tuple(n for n in names[:-1] if n and n != _NO_MODULE)


def _name_segments(name: str) -> tuple[bool, Sequence[str]] | None:
    """(TorchScript style, module segments) of a node name that carries a path; None when it has none."""
    if "/" not in name:
        return None
    parts = name.split("/")
    torchscript = parts[0] == ""
    return torchscript, [p for p in parts[:-1] if p]


def scopes_of(names: Sequence[str], metadata: Sequence[Mapping[str, str] | None] | None,
              parameters: Mapping[str, int], first_reader: Callable[[], Mapping[str, int]]) -> ModuleScopes:
    """The scopes of a graph's nodes, from their ``names`` and ``metadata`` (one mapping or None per node,
    in graph order; None: no node has any), and which module owns each parameter (``parameters``: name →
    elements; ``first_reader()``: parameter name → index of the first node that reads it, asked for only where
    some node has a scope and some parameter is not placed by its name)."""
    chains: list[Scope | None] = [None] * len(names)
    source = ""
    for i, meta in enumerate(metadata or ()):
        if meta and _METADATA_KEY in meta:
            chains[i] = _metadata_scope(meta[_METADATA_KEY])
    if any(c is not None for c in chains):
        source = "metadata"
    else:
        split = [_name_segments(n) for n in names]
        scoped = [s for s in split if s is not None]
        if scoped:
            source = "names"
            plain = [segs for ts, segs in scoped if not ts]
            drop = len(_common_prefix(plain)) if plain and len(plain) == len(scoped) else 0
            for i, s in enumerate(split):
                if s is not None:
                    chains[i] = _full_paths(s[1][drop:] if not s[0] else s[1])
    if not any(chains):  # no node ran inside a module (a root-level "/Relu" names no module)
        source = ""
    if not source:
        total = sum(parameters.values())
        return ModuleScopes(nodes=((),) * len(names), params=MappingProxyType({"": total} if total else {}),
                            parameters=frozenset(parameters), missing=(
            "the graph has no module scopes (its nodes carry neither pkg.torch.onnx.name_scopes metadata nor "
            "path names such as /layer1/conv1/Conv); export it with module names to see them"))
    owners_by_name = _owners_by_name(parameters, chains)
    if source == "names":
        chains = _merge_repeat_calls(chains, owners_by_name)
    interned: dict[Scope, Scope] = {}
    nodes = tuple(interned.setdefault(c, c) if c else () for c in chains)
    params: dict[str, int] = {}
    readers: Mapping[str, int] | None = None
    for name, size in parameters.items():
        owner = owners_by_name.get(name)
        if owner is None:
            if readers is None:
                readers = first_reader()
            reader = readers.get(name)
            chain = nodes[reader] if reader is not None else ()
            owner = chain[-1] if chain else ""
        params[owner] = params.get(owner, 0) + size
    return ModuleScopes(nodes=nodes, params=MappingProxyType(params), source=source, missing="",
                        parameters=frozenset(parameters))


def _common_prefix(chains: Iterable[Sequence[str]]) -> Sequence[str]:
    chains = list(chains)
    first = chains[0]
    n = 0
    while n < len(first) and all(len(c) > n and c[n] == first[n] for c in chains):
        n += 1
    return first[:n]


def _owners_by_name(parameters: Mapping[str, int], chains: Sequence[Scope | None]) -> dict[str, str]:
    """Parameter name → the module its name places it in (``layer1.0.conv1.weight`` → ``layer1.0.conv1``),
    where that module is in some node's scope (or, for the TorchScript exporter, is a call-suffix-free name)."""
    known = {m for c in chains if c for m in c}
    out = {}
    for name in parameters:
        for sep in (".", "/"):  # PyTorch names parameters layer1.0.conv1.weight, Keras block1/c1/kernel
            head, found, _ = name.rpartition(sep)
            if found and (head in known
                          or any(m.startswith(head + sep) or _REPEAT.sub(r"\1", m) == head for m in known)):
                out[name] = head
                break
    return out


def _merge_repeat_calls(chains: list[Scope | None], owners: Mapping[str, str]) -> list[Scope | None]:
    """TorchScript names the k-th further call of module ``fc`` ``fc_k``: read it as ``fc`` where ``fc`` owns
    parameters by name and ``fc_k`` owns none (a module really named ``fc_1`` keeps its name)."""
    owning = set(owners.values())
    owning_prefixes = {m.rsplit(".", i)[0] for m in owning for i in range(m.count(".") + 1)}

    def fix(m: str) -> str:
        match = _REPEAT.match(m)
        if match and m not in owning_prefixes and match.group(1) in owning_prefixes:
            return match.group(1)
        return m

    memo: dict[Scope, Scope] = {}
    out: list[Scope | None] = []
    for c in chains:
        if c:
            fixed = memo.get(c)
            if fixed is None:
                fixed = memo[c] = tuple(_refix(c, fix))
            c = fixed
        out.append(c)
    return out


def _refix(chain: Scope, fix) -> list[str]:
    """The chain with each full path's call suffix removed, parents fixed before children."""
    out: list[str] = []
    for m in chain:
        if out:
            tail = m[len(chain[len(out) - 1]) + 1:]
            m = f"{out[-1]}.{tail}"
        out.append(fix(m))
    return out


def _folded(nodes: Sequence, chains: Sequence, depth: int) -> bool:
    """Whether the rows of a repeated stack (:class:`flopcount.reporting.tiled.Tiled`) down to ``depth`` are summed from its
    block once: its copies' chains cut at ``depth`` are the block's (no row names a layer of the stack). Where
    they are not, each copy is read, and above the listing limit that is a :class:`UsageError`."""
    if not (isinstance(nodes, Tiled) and isinstance(chains, Tiled)) or not chains.copies:
        return False
    if all(a[:depth] == b[:depth] for a, b in zip(chains.block, chains.copy(1))):
        return True
    check_listable(nodes, f"--depth {depth}", "nodes, a row for each layer's modules,")
    return False


def _rows_of(nodes: Sequence, chains: Sequence, folded: bool):
    """``(position, node, chain, times)`` of every node, a folded stack's block once with ``times`` its copies."""
    if not folded:
        for k, (node, chain) in enumerate(zip(nodes, chains)):
            yield k, node, chain, 1
        return
    h, b = len(chains.head), len(chains.block)
    for k, (node, chain) in enumerate(zip(nodes.head, chains.head)):
        yield k, node, chain, 1
    for j, (node, chain) in enumerate(zip(nodes.copy(1), chains.copy(1))):
        yield h + j, node, chain, nodes.copies
    for j, (node, chain) in enumerate(zip(nodes.tail, chains.tail)):
        yield h + b * chains.copies + j, node, chain, 1


def _params_of(params: Mapping[str, int]):
    """``(owner, size, times)`` of a folded stack's parameters: its copies' owners stand in the block's."""
    if not isinstance(params, TiledMapping):
        for owner, size in params.items():
            yield owner, size, 1
        return
    for owner, size in params.base.items():
        yield owner, size, 1
    for owner, size in params.block.items():
        yield owner, size, params.copies


def module_rows(nodes: Sequence, scopes: ModuleScopes, depth: int = 1) -> tuple[ModuleRow, ...]:
    """The per-module rows of a report's ``nodes`` (see the module docstring), modules in the order the
    graph first runs them, each followed by its children, down to ``depth``."""
    if depth < 1:
        raise UsageError(f"depth: must be 1 or more, not {depth}")
    forward: dict[Scope, Cost] = {}
    backward: dict[Scope, Cost] = {}
    first: dict[Scope, int] = {}  # where each module first runs: its first node that does work, else its first node
    folded = _folded(nodes, scopes.nodes, depth)
    for k, node, chain, times in _rows_of(nodes, scopes.nodes, folded):
        key = chain[:depth]
        working = node.cost != _ZERO
        at = first.get(key)
        if at is None or (working and at < 0):
            first[key] = k if working else -(k + 1) if at is None else at
        forward[key] = forward.get(key, _ZERO) + (node.cost if times == 1 else node.cost * times)
        backward[key] = backward.get(key, _ZERO) + (node.backward if times == 1 else node.backward * times)
    # a module without work is placed by its first node (weight layout nodes may come long before the work)
    order = sorted(first, key=lambda key: first[key] if first[key] >= 0 else -first[key] - 1)
    # every listed module, and the chains that end in it (its own work, or its whole subtree at the cut)
    tree: dict[Scope, list[Scope]] = {(): []}
    for key in order:
        for k in range(1, len(key) + 1):
            if key[:k] not in tree:
                tree[key[:k]] = []
                tree[key[:k - 1]].append(key[:k])
    chain_of: dict[str, Scope] = {}  # every module in a scope → its chain
    for chain in distinct(scopes.nodes) if folded else set(scopes.nodes):
        for k in range(1, len(chain) + 1):
            chain_of.setdefault(chain[k - 1], chain[:k])
    params_own: dict[Scope, int] = {}
    params = scopes.params
    for owner, size, times in (_params_of(params) if folded else ((o, v, 1) for o, v in params.items())):
        chain = chain_of.get(owner, ())[:depth]
        params_own[chain] = params_own.get(chain, 0) + size * times

    rows: list[ModuleRow] = []

    def subtree(chain: Scope) -> tuple[Cost, Cost, int]:
        f, b, p = forward.get(chain, _ZERO), backward.get(chain, _ZERO), params_own.get(chain, 0)
        for child in tree[chain]:
            cf, cb, cp = subtree(child)
            f, b, p = f + cf, b + cb, p + cp
        return f, b, p

    def emit(chain: Scope) -> None:
        f, b, p = subtree(chain)
        rows.append(ModuleRow(chain[-1], len(chain), chain[-2] if len(chain) > 1 else "", f, b, p))
        children = tree[chain]
        if not children:
            return
        own_f, own_b, own_p = forward.get(chain, _ZERO), backward.get(chain, _ZERO), params_own.get(chain, 0)
        for child in children:
            emit(child)
        if own_f != _ZERO or own_b != _ZERO or own_p:
            rows.append(ModuleRow(chain[-1] + OWN, len(chain) + 1, chain[-1], own_f, own_b, own_p))

    for top in tree[()]:
        emit(top)
    outside_f, outside_b, outside_p = forward.get((), _ZERO), backward.get((), _ZERO), params_own.get((), 0)
    if outside_f != _ZERO or outside_b != _ZERO or outside_p or not rows:
        rows.append(ModuleRow(OUTSIDE, 1, "", outside_f, outside_b, outside_p))
    return tuple(rows)
