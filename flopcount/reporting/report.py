"""The immutable result of a count. Rendering lives in :mod:`flopcount.output.render`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from operator import attrgetter
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

from ..conventions import Convention
from ..cost import Cost
from .modules import ModuleRow, ModuleScopes, module_rows
from .tiled import Tiled, weighted

if TYPE_CHECKING:  # annotations only: the context (numpy, onnx) is not needed to hold or read a report, nor the
    # records of what only some counts have (generation, experts, repeated layers)
    from ..context import TensorInfo
    from .generation import Generation
    from .layers import RepeatedLayers
    from .moe import MixtureOfExperts

# Node status values
FORMULA = "formula"
ZERO_COST = "zero-cost"
UNSUPPORTED = "unsupported"


class NodeCount(NamedTuple):
    index: int  # position in the graph's node list
    name: str
    op_type: str
    domain: str
    family: str  # operator family ("conv", "matmul", ...); "" when unsupported
    status: str  # FORMULA, ZERO_COST or UNSUPPORTED
    inputs: tuple[TensorInfo | None, ...]
    outputs: tuple[TensorInfo | None, ...]
    cost: Cost  # forward
    parts: tuple[tuple[str, Cost], ...] = ()  # named parts of ``cost`` (If branches, Loop body per trip)
    backward: Cost = Cost()  # training: the gradients this node computes
    bound: str = ""  # why ``cost`` is an upper bound (data-dependent work), "" when exact


#: Storage bits per element of the ONNX element types that are not a whole numpy dtype (sub-byte types); the
#: rest come from :func:`onnx.helper.tensor_dtype_to_np_dtype`. Strings have no fixed size (bytes unknown).
_SUB_BYTE_BITS = {name: 4 for name in ("INT4", "UINT4", "FLOAT4E2M1")}


#: :func:`element_bits` of each element type asked (a per-rank walk sizes millions of tensors of a few types).
_BITS: dict[int, int | None] = {}


def element_bits(elem_type: int) -> int | None:
    """Storage bits of one element of ONNX type ``elem_type``; None when unknown (0, strings); memoized.

    >>> element_bits(1), element_bits(10), element_bits(7)
    (32, 16, 64)
    """
    if elem_type in _BITS:
        return _BITS[elem_type]
    _BITS[elem_type] = bits = _element_bits(elem_type)
    return bits


def _element_bits(elem_type: int) -> int | None:
    import onnx

    if not elem_type or elem_type == onnx.TensorProto.STRING:
        return None
    name = onnx.TensorProto.DataType.Name(elem_type)
    if name in _SUB_BYTE_BITS:
        return _SUB_BYTE_BITS[name]
    try:
        import numpy as np

        return 8 * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return None


def tensor_bytes(t: TensorInfo | None) -> int | None:
    """Bytes a tensor occupies, from its static shape and dtype (sub-byte types rounded up to whole bytes);
    None when its shape or dtype is not known. A missing optional input (``None``) is 0 bytes."""
    if t is None:
        return 0
    bits = element_bits(t.elem_type)
    if bits is None or not t.is_static:
        return None
    n = 1
    for d in t.shape:
        n *= d
    return (n * bits + 7) // 8


class NodeBytes(NamedTuple):
    """Bytes one node reads (every input, initializers included: weights are read from memory like activations)
    and writes (every output), from shapes and dtypes. A lower bound of the traffic of a kernel that fits its
    operands in cache, and what the classic roofline's arithmetic intensity divides by."""

    read: int
    written: int

    @property
    def total(self) -> int:
        return self.read + self.written


def node_bytes(node: "NodeCount") -> NodeBytes | None:
    """:class:`NodeBytes` of ``node``, or None when a shape or dtype of one of its tensors is not known.

    >>> from flopcount.context import TensorInfo as T
    >>> n = NodeCount(0, "mm", "MatMul", "", "matmul", "formula", (T("a", 1, (2, 3)), T("b", 1, (3, 4))),
    ...               (T("y", 1, (2, 4)),), Cost())
    >>> node_bytes(n)  # 4·(2·3 + 3·4) read, 4·2·4 written
    NodeBytes(read=72, written=32)
    """
    read = [tensor_bytes(t) for t in node.inputs]
    written = [tensor_bytes(t) for t in node.outputs]
    if any(b is None for b in read + written):
        return None
    return NodeBytes(sum(read), sum(written))


class OpTypeSummary(NamedTuple):
    op_type: str
    domain: str
    family: str
    status: str
    nodes: int
    cost: Cost  # forward
    backward: Cost = Cost()

    @property
    def key(self) -> str:
        return op_key(self.domain, self.op_type)


def op_key(domain: str, op_type: str) -> str:
    """``"Conv"`` for the default domain, ``"com.microsoft:Gelu"`` for others."""
    return f"{domain}:{op_type}" if domain else op_type


def op_type_summaries(nodes: Iterable[NodeCount]) -> Mapping[str, OpTypeSummary]:
    """One :class:`OpTypeSummary` per operator key of ``nodes``, by FLOPs (forward and backward), largest first
    (a repeated stack's block summed once and multiplied: :func:`flopcount.reporting.tiled.weighted`)."""
    plain: dict[tuple[str, str], list[NodeCount]] = {}
    if not isinstance(nodes, Tiled):  # each node once: grouped by its (domain, op_type) read in C
        for kind, n in zip(map(_KIND, nodes), nodes):
            group = plain.get(kind)
            if group is None:
                plain[kind] = [n]
            else:
                group.append(n)
    if plain and len({op_key(*kind) for kind in plain}) == len(plain):  # summed column by column
        summed = {op_key(*k): (len(g), sum_costs(map(_COST, g)), sum_costs(map(_BACKWARD, g))) for k, g in plain.items()}
        firsts = {op_key(*k): g[0] for k, g in plain.items()}
    else:  # a repeated stack (or two kinds under one key): node by node, with the times each is counted
        groups: dict[str, list[tuple[NodeCount, int]]] = {}
        for n, times in weighted(nodes):
            groups.setdefault(op_key(n.domain, n.op_type), []).append((n, times))
        summed = {k: (sum(t for _, t in g), _weighted_sum(g, "cost"), _weighted_sum(g, "backward"))
                  for k, g in groups.items()}
        firsts = {k: g[0][0] for k, g in groups.items()}
    summaries = sorted(
        (OpTypeSummary(first.op_type, first.domain, first.family, first.status, *summed[k])
         for k, first in firsts.items()),
        key=lambda s: (-(s.cost.flops + s.backward.flops), -s.cost.int_ops, s.key),
    )
    return MappingProxyType({s.key: s for s in summaries})


_KIND, _COST, _BACKWARD = attrgetter("domain", "op_type"), attrgetter("cost"), attrgetter("backward")


def _weighted_sum(group: list[tuple[NodeCount, int]], field: str) -> Cost:
    if all(t == 1 for _, t in group):
        return sum_costs(getattr(n, field) for n, _ in group)
    return sum_costs(Cost(*(v * t for v in getattr(n, field))) for n, t in group)


def sum_costs(costs: Iterable[Cost]) -> Cost:
    """Field-wise sum of many costs (faster than adding them one by one)."""
    columns = tuple(zip(*costs))
    return Cost(*map(sum, columns)) if columns else Cost()


@dataclass(frozen=True)
class ModelInfo:
    path: str | None
    graph_name: str
    ir_version: int
    opsets: Mapping[str, int]  # domain ("" = ai.onnx) → version
    producer: str
    inputs: tuple[TensorInfo, ...]  # real inputs, resolved shapes
    outputs: tuple[TensorInfo, ...]


@dataclass(frozen=True)
class Report:
    """FLOP count of one model.

    ``forward`` is the inference pass over the whole batch; in training mode (``mode == "train"``)
    ``backward`` holds the gradient computation and ``total`` is their sum (in inference mode
    ``total`` is ``forward``). ``per_sample`` divides ``total`` by ``batch``. ``params`` counts
    elements of initializers and ``Constant`` tensors that are parameters, from their dims, without
    reading data; ``trainable_params`` those that are trained.
    ``optimizer``, when asked for, is the update step's cost, kept apart from ``total``.
    ``params`` counts the parameters (weights a framework trains), ``buffers`` the stored state
    that is not trained (BatchNormalization's running statistics); folded constants are in neither
    (see :mod:`flopcount.pipeline.parameters`).
    """

    model: ModelInfo
    convention: Convention
    batch: int
    forward: Cost
    params: int
    nodes: Sequence[NodeCount]  # a tuple; a repeated stack extended to L layers holds them as a flopcount.reporting.tiled.Tiled
    by_op_type: Mapping[str, OpTypeSummary]  # ordered by FLOPs, largest first
    unsupported: Mapping[str, int]  # op key → node count
    timings: Mapping[str, float] = field(default_factory=dict, compare=False)  # seconds per phase; not in JSON
    mode: str = "inference"
    backward: Cost = Cost()
    backward_unsupported: Mapping[str, int] = field(default_factory=dict)  # formula ops without a backward formula
    trainable_params: int = 0
    optimizer: tuple[str, Cost] | None = None
    buffers: int = 0
    modules: ModuleScopes = field(default_factory=ModuleScopes, compare=False)  # see by_module
    generation: "Generation | None" = None  # --generate: prefill and decode (flopcount.reporting.generation)
    moe: "MixtureOfExperts | None" = None  # mixture-of-experts layers (flopcount.reporting.moe), --hf only
    attention: str = "full"  # --attention: "full", or "executed: " and the masks used (flopcount.masks)
    layers: "RepeatedLayers | None" = None  # --hf: how the stack of layers was counted (flopcount.reporting.layers)
    memory: "Any | None" = None  # --memory: the memory ledger per rank (flopcount.memory.ledger.Memory)
    parallel: "Any | None" = None  # --parallel: FLOPs per rank (flopcount.parallel.ranks.ParallelLedger)
    notes: tuple[str, ...] = ()  # facts about how the count was made that change no figure's meaning (one line each)

    def by_module(self, depth: int = 1) -> tuple[ModuleRow, ...]:
        """FLOPs, MACs and parameters per module down to ``depth`` (1: the model's children), from the module
        scopes its exporter wrote (:mod:`flopcount.reporting.modules`); ``modules.missing`` says why a graph has none,
        and then the one row holds everything."""
        return module_rows(self.nodes, self.modules, depth)

    @property
    def total(self) -> Cost:
        return self.forward + self.backward

    @property
    def upper_bounds(self) -> Mapping[str, tuple[int, str]]:
        """op key → (nodes, why) for the nodes whose count is an upper bound of data-dependent work."""
        out: dict[str, tuple[int, str]] = {}
        for n, times in weighted(self.nodes):
            if n.bound:
                key = op_key(n.domain, n.op_type)
                k, why = out.get(key, (0, n.bound))
                out[key] = (k + times, why)
        return out

    @property
    def per_sample(self) -> Cost | None:
        """``total`` divided by ``batch``; None when the batch is 0 (an empty first input: no sample
        to count per)."""
        return self.total.per(self.batch) if self.batch else None

    @property
    def flops(self) -> int:
        return self.total.flops

    @property
    def macs(self) -> int:
        return self.total.macs
