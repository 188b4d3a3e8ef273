"""Memory per rank, from the graph: weights, gradients, optimizer states and their step's temporaries, the
activations the backward keeps, and the peak of one step from a liveness walk in the graph's execution order.

The walk (:func:`ledger`) is plain arithmetic on the counted nodes: each node's outputs are allocated when it runs
and freed after their last reader, unless a backward keeps them (the operator's saved-for-backward rule,
:mod:`flopcount.saved`); kept tensors are freed when the last node keeping them has run its backward. Views
(Reshape, Transpose, Squeeze, Slice ...) share their input's storage, and a storage is counted once however many
nodes keep it. A training step is modelled at steady state, as ``zero_grad(set_to_none=True); forward; backward;
step`` runs it: the optimizer states exist throughout, gradients from the backward on. Weights, constants and the
graph's inputs are alive throughout; the graph's outputs from their node to the end of the step.

**Experts' weights gathered per token** (:mod:`.experts`) are views of the experts' parameters: no storage; a
backward that keeps them keeps the weight, and a gradient that reaches them is the parameter's own, once.

Not modelled: the workspaces inside a kernel (a backward's own temporaries), allocator rounding and caching (the
CPU allocator rounds nothing; CUDA's caching allocator rounds to 512 bytes and keeps freed blocks).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from ..context import TensorInfo
from ..errors import UsageError
from ..parallel.plan import DEVICES, IMPLEMENTATIONS, ParallelPlan, Recompute, parse_recompute
from ..reporting.report import NodeCount, element_bits, tensor_bytes
from ..saved import Saved
from .sizes import parse_size
from .tape import Tape, Walk

__all__ = [
    "IMPLEMENTATIONS", "INPUTS", "OPTIMIZER_STATES", "Graph", "Memory", "MemorySettings", "OnRank", "RankMemory", "ledger",
    "held_bytes", "module_activations", "optimizer_bytes", "Shards", "with_params", "without_cyclic_gc",
]


def without_cyclic_gc(fn: Callable) -> Callable:
    """``fn`` run with Python's cyclic collector paused (as :func:`flopcount.count` runs a count). The walks build
    tens of thousands of small objects that make no reference cycles; after an ``--hf`` count the process also holds
    the millions of objects of torch, transformers and the exports, and each full collection the walks' allocations
    set off rescans all of them (about 1 s of a Llama-3-70B ledger on 2 cores). Nothing is left uncollected:
    reference counting frees what the walks drop, and the collector runs again after."""

    @functools.wraps(fn)
    def paused(*args, **kwargs):
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was_enabled:
                gc.enable()

    return paused


#: Tensors of optimizer state per parameter element: SGD none, momentum its buffer, Adam and AdamW two moments.
OPTIMIZER_STATES: Mapping[str, int] = MappingProxyType({"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2})
#: How an optimizer step runs: one parameter at a time, one multi-tensor kernel per operation over all parameters
#: (``foreach``), or one fused kernel; ``auto`` is what torch picks on ``device``: foreach on CUDA, single-tensor on
#: the CPU.
#: Ops whose output is a view of their first input in the frameworks (no new storage).
VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Transpose", "Expand", "Slice", "Split"})
PHASES = ("forward", "backward", "optimizer step")
_STEP_COUNTER_BYTES = 4  # torch keeps Adam's step per parameter as a float32 scalar tensor


@dataclass(frozen=True)
class MemorySettings:
    """What the memory ledger models: the optimizer (from the count's ``optimizer``) and how its step runs
    (``implementation`` on ``device``), an fp32 master copy of 16-bit weights (``master_weights``, mixed precision
    as Megatron and DeepSpeed keep it; the optimizer states are then fp32 too), the recompute policy, the
    parallel plan, and the memory of each device (``device_memory``: bytes, or text such as ``"80GiB"``; None when
    not given), which the peaks are compared with."""

    implementation: str = "auto"
    device: str = "cuda"
    master_weights: bool = False
    recompute: Recompute = field(default_factory=Recompute)
    plan: ParallelPlan = field(default_factory=ParallelPlan)
    device_memory: int | None = None

    def __post_init__(self) -> None:
        if self.implementation not in IMPLEMENTATIONS:
            raise UsageError(f"optimizer implementation {self.implementation!r}: choose one of "
                             f"{', '.join(IMPLEMENTATIONS)}")
        if self.device not in DEVICES:
            raise UsageError(f"memory device {self.device!r}: choose one of {', '.join(DEVICES)}")
        if not isinstance(self.master_weights, bool):
            raise UsageError(f"memory settings: master_weights must be True or False, got {self.master_weights!r}")
        if not isinstance(self.plan, ParallelPlan):
            raise UsageError(f"memory settings: plan must be a flopcount.ParallelPlan, got {self.plan!r}")
        object.__setattr__(self, "recompute", parse_recompute(self.recompute))
        if self.device_memory is not None:
            object.__setattr__(self, "device_memory", parse_size(self.device_memory, "memory settings: device_memory"))

    @classmethod
    def of(cls, memory: Any) -> "MemorySettings":
        """``count(memory=...)``: True (the defaults) or settings."""
        if memory is True:
            return cls()
        if not isinstance(memory, MemorySettings):
            raise UsageError(f"memory must be True or a flopcount.MemorySettings, not {type(memory).__name__}")
        return memory

    @property
    def resolved_implementation(self) -> str:
        if self.implementation != "auto":
            return self.implementation
        return "foreach" if self.device == "cuda" else "single-tensor"


@dataclass(frozen=True)
class Shards:
    """A rank's shares of the model states where they are smaller than its parameters: the gradients it keeps
    (``grads``, parameter name → the share's tensor; ZeRO stage 2), the tensors its optimizer steps
    (``optimizer``; stages 1 and 2) and Adam's step counters it keeps (``counters``; one per tensor if None)."""

    grads: Mapping[str, TensorInfo] = field(default_factory=dict)
    optimizer: Mapping[str, TensorInfo] = field(default_factory=dict)
    counters: int | None = None


@dataclass(frozen=True)
class OnRank:
    """What a rank's walk (:mod:`.ranks`) adds to the graph's own: ``held``, bytes alive throughout the walk beyond
    the graph's own (other microbatches' kept activations, an all-gather buffer); ``accumulated``, the gradients
    exist from the start (a microbatch after the first of a step); ``shards``, the rank's shares of the gradients
    and optimizer states where they are smaller than the parameters' (ZeRO's stages 1 and 2); ``structure``, a dict
    the caller keeps per graph structure, in which the walk leaves what it finds of it (the storage roots, who keeps
    what, the trained tensors in the tensors' order) for the next walk of a graph of the same nodes, gradients,
    saved-for-backward records, recompute units, stored and trained tensors and tensors' names in the same order,
    sized otherwise (None: found anew); ``sizes``, a dict the caller keeps per graph (the same
    :class:`Graph`, its tensors sized alike) and gradients' shards, in which the walk leaves the tensors' bytes and
    its replays from no bytes alive (:class:`.tape.Replayed`, with the unsized names they read) and the bytes of
    the parameters, buffers, inputs and gradients with the trained tensors for the next walk of them, whose start
    alone differs (None: walked anew); ``forward``, such a dict for the forward alone, kept
    per graph whose forward reads the same sizes (None: ``sizes``)."""

    held: int = 0
    accumulated: bool = False
    shards: Shards = field(default_factory=Shards)
    structure: dict | None = None
    sizes: dict | None = None
    forward: dict | None = None


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds. ``optimizer_bytes``: states, the master copy and step counters;
    ``optimizer_temp_bytes``: what the step allocates on top while it runs; ``activations_bytes``: what the
    backward keeps at the end of the forward (``statistics_bytes`` of it are statistics, not whole tensors);
    ``peak_bytes`` and ``peak_phase``: the most the step holds at once, and where; ``kv_cache_bytes``: the KV cache
    after generation (``--generate``), else None."""

    params_bytes: int
    buffers_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    optimizer_temp_bytes: int
    inputs_bytes: int
    activations_bytes: int
    statistics_bytes: int
    peak_bytes: int
    peak_phase: str
    peak_node: str
    kv_cache_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Memory:
    """The memory ledger of a count: one :class:`RankMemory` per rank (one without a plan), the settings, the
    operators whose saved-for-backward rule is missing (``missing``: op key → nodes; the activations are then a
    lower bound) and what could not be sized (``unsized``: tensors whose shape or type is unknown)."""

    mode: str
    optimizer: str | None
    implementation: str | None
    recompute: str
    master_weights: bool
    ranks: tuple[RankMemory, ...]
    missing: Mapping[str, int] = field(default_factory=dict)
    unsized: tuple[str, ...] = ()
    kept_by_node: Mapping[int, int] = field(default_factory=dict, compare=False)  # see module_activations
    #: What the walk read and how (kept so that :func:`flopcount.derived.extension.extend` can walk a longer stack).
    graph: "Graph | None" = field(default=None, compare=False, repr=False)
    settings: "MemorySettings | None" = field(default=None, compare=False, repr=False)

    @property
    def lower_bound(self) -> bool:
        return bool(self.missing or self.unsized)

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode, "optimizer": self.optimizer, "implementation": self.implementation,
            "recompute": self.recompute, "master_weights": self.master_weights,
            "lower_bound": self.lower_bound, "missing_saved_rules": dict(self.missing),
            "unsized_tensors": list(self.unsized), "device_memory_bytes": self.device_memory,
            "ranks": [{**r.as_dict(), "headroom_bytes": self.headroom(r)} for r in self.ranks],
        }

    @property
    def device_memory(self) -> int | None:
        """The memory of each device (``--device-memory``) in bytes, None when not given."""
        return None if self.settings is None else self.settings.device_memory

    def headroom(self, rank: RankMemory) -> int | None:
        """The device's memory less what ``rank`` holds at most (its peak, and with ``--generate`` the KV cache
        beside it); negative when over; None without a device memory."""
        device = self.device_memory
        return None if device is None else device - held_bytes(rank)


def held_bytes(rank: RankMemory) -> int:
    """The most ``rank`` holds at once, which its device must hold: its peak, and with ``--generate`` the KV cache
    after the last step beside it (the prefill runs without a cache: the sum bounds the two phases from above)."""
    return rank.peak_bytes + (rank.kv_cache_bytes or 0)


def optimizer_bytes(optimizer: str | None, tensors: Sequence[TensorInfo], settings: MemorySettings,
                    counters: int | None = None) -> tuple[int, int]:
    """(states, step temporaries) in bytes of ``optimizer`` over the trainable ``tensors`` (``counters``: Adam's
    step counters, one per tensor if None; fewer where the rank steps a share of the tensors, as ZeRO's shards).

    States: SGD none; momentum one buffer per parameter; Adam and AdamW two moments and a float32 step counter per
    parameter tensor; in the parameter's type, or float32 with ``master_weights`` (which adds the float32 copy of
    weights stored in fewer bits). Temporaries of the step, beyond the states (weight decay 0 for SGD and Adam):
    Adam's and AdamW's single-tensor step makes ``sqrt(v)`` and ``sqrt(v)/c`` of one parameter at a time while the
    previous parameter's quotient is still held (its loop variable is rebound only by the new one): the most of
    the previous tensor plus twice the current one, in the order the step visits them (``tensors``' order, the
    module's parameter order); the foreach step ``sqrt(v)`` of every parameter at once (once all of them), the
    fused step nothing; SGD's updates are in place.

    >>> t = [TensorInfo("w", 1, (4, 8)), TensorInfo("b", 1, (8,))]
    >>> optimizer_bytes("adam", t, MemorySettings(device="cpu"))  # 2·4·40 + 2·4, 2·4·32 (the first, w, twice)
    (328, 256)
    >>> optimizer_bytes("adam", t[::-1], MemorySettings(device="cpu"))[1]  # b's quotient held, then w twice: 4·(8 + 64)
    288
    """
    if optimizer is None:
        return 0, 0
    if optimizer not in OPTIMIZER_STATES:
        raise UsageError(f"optimizer {optimizer!r}: the memory ledger models {', '.join(OPTIMIZER_STATES)}")
    numels = [_numel(t) for t in tensors]
    state_bits = [32 if settings.master_weights else element_bits(t.elem_type) or 32 for t in tensors]
    one_copy = [(n * b + 7) // 8 for n, b in zip(numels, state_bits)]
    states = OPTIMIZER_STATES[optimizer] * sum(one_copy)
    if settings.master_weights:
        states += sum(4 * n for n, t in zip(numels, tensors) if element_bits(t.elem_type) != 32)
    temps = 0
    if optimizer in ("adam", "adamw"):
        states += _STEP_COUNTER_BYTES * (len(tensors) if counters is None else counters)
        impl = settings.resolved_implementation
        single = max((2 * b + (one_copy[i - 1] if i else 0) for i, b in enumerate(one_copy)), default=0)
        temps = {"single-tensor": single, "foreach": sum(one_copy), "fused": 0}[impl]
    return states, temps


def _numel(t: TensorInfo) -> int:
    n = 1
    for d in t.shape or ():
        n *= d
    return n


@dataclass(frozen=True)
class Graph:
    """What the walk reads of a counted graph: the nodes in execution order, which inputs of each need a gradient
    (the nodes whose backward runs), what each keeps, the tensors' types and shapes, the stored tensors by role,
    the graph's inputs and outputs, and the recompute units (node index → unit)."""

    nodes: Sequence[NodeCount]
    grads: Mapping[int, tuple[bool, ...]]
    saved: Mapping[int, Saved]
    tensors: Mapping[str, TensorInfo]
    params: frozenset[str]
    trainable: frozenset[str]
    buffers: frozenset[str]
    stored: frozenset[str]
    inputs: tuple[str, ...]
    outputs: frozenset[str]
    units: Mapping[int, int] = field(default_factory=dict)
    #: outputs of the nodes that gather experts' weight slices per token (:func:`.experts.expert_gathers`)
    gathers: frozenset[str] = frozenset()
    #: outputs that are views in the framework the graph came from though the graph copies (torch's select), and
    #: outputs of the graph's views that it copies (a reshape of an expanded tensor): :mod:`.kernels`
    views: frozenset[str] = frozenset()
    copies: frozenset[str] = frozenset()


def _identity(n: NodeCount, g: Graph) -> bool:
    """Whether ``n`` returns its input itself, as the frameworks run it: a Dropout that keeps no mask (inference,
    or a ratio of 0), a Cast to the type its input has."""
    if n.op_type == "Dropout":
        return not (n.index in g.saved and g.saved[n.index].extra)
    if n.op_type in ("Cast", "CastLike") and n.inputs and n.outputs and n.inputs[0] is not None:
        return n.outputs[0] is not None and n.inputs[0].elem_type == n.outputs[0].elem_type != 0
    return False


class _Storages:
    """Storage roots of tensor names (views share their input's) and their bytes."""

    def __init__(self, g: Graph, unsized: set[str], structure: dict | None = None, sizes: dict | None = None):
        self.g, self.unsized = g, unsized
        self._bytes: dict[str, int] = {} if sizes is None else sizes.setdefault("bytes", {})  # None: unsized
        if structure is not None and "roots" in structure:  # the same graph structure walked before
            self.root, self.gathered = structure["roots"]
            return
        self.root: dict[str, str] = {}
        #: names that are a parameter's expert slices gathered per token, or views of them (see the module's text)
        self.gathered: set[str] = set()
        self._find_roots()
        if structure is not None:
            structure["roots"] = (self.root, self.gathered)

    def _find_roots(self) -> None:
        g = self.g
        for n in g.nodes:
            ins = [i for i in (t.name if t is not None else "" for t in n.inputs)]
            out = n.outputs[0].name if n.outputs and n.outputs[0] is not None else ""
            gather = out in g.gathers
            view = (((n.op_type in VIEWS or _identity(n, g)) and out not in g.copies) or gather or out in g.views) \
                and n.domain == "" and ins and ins[0]
            for t in n.outputs:
                if t is not None and t.name:
                    self.root[t.name] = self.root.get(ins[0], ins[0]) if view else t.name
                    if view and (gather or ins[0] in self.gathered):
                        self.gathered.add(t.name)
            if gather:
                self.gathered.add(ins[0])  # a view of the parameter that the gather reads (its transpose)
            elif out in g.stored and ins:  # a stack of parameters (:mod:`.experts`): each one's gradient its own
                self.gathered.update((out, *ins))

    def of(self, name: str) -> str:
        return self.root.get(name, name)

    @property
    def known(self) -> Mapping[str, int | None]:
        """The bytes :meth:`nbytes` has found or was handed, by name (None: to be found again)."""
        return self._bytes

    def nbytes(self, name: str) -> int:
        """``name``'s bytes, 0 for one of unknown size, which each read adds to ``unsized``."""
        b = self._bytes.get(name)
        if b is None:
            b = tensor_bytes(self.g.tensors.get(name) or TensorInfo(name))
            if b is None:
                self.unsized.add(name)
                return 0
            self._bytes[name] = b
        return b


def ledger(g: Graph, mode: str, optimizer: str | None, settings: MemorySettings, missing: Mapping[str, int],
           kv_cache_bytes: int | None = None, on_rank: OnRank | None = None) -> Memory:
    """The :class:`Memory` of one step of ``g`` (see the module's docstring); ``on_rank``: what a rank's walk adds
    to the graph's own (:class:`OnRank`; nothing if None)."""
    unsized: set[str] = set()
    structure = on_rank.structure if on_rank is not None else None
    memo = on_rank.sizes if on_rank is not None else None
    st = _Storages(g, unsized, structure, memo)
    size = st.nbytes
    training = mode == "train"
    on_rank = on_rank or OnRank()
    held, accumulated, shards = on_rank.held, on_rank.accumulated, on_rank.shards

    def grad_size(name: str) -> int:
        return (tensor_bytes(shards.grads[name]) or 0) if name in shards.grads else size(name)

    found = structure if structure is not None else {}  # what the walk finds of the structure, kept there
    names = found.get("trained") or found.setdefault("trained", _trained_names(g))
    # they read the sizes and the gradients' shards alone: found once per such memo (see OnRank)
    params, buffers, inputs, trained, grads = _replayed(memo, ("held", training), st,
                                                        lambda: _held(g, size, grad_size, training, names))
    stepped = [shards.optimizer.get(t.name, t) for t in trained] if shards.optimizer else trained
    states, temps = optimizer_bytes(optimizer, stepped, settings, shards.counters) if training else (0, 0)
    w = Walk(live=params + buffers + inputs + states + held + (grads if accumulated else 0))
    whole = settings.recompute.policy == "full"
    holds = found.get(("holds", whole, training)) or \
        found.setdefault(("holds", whole, training), _holds(g, st, whole) if training else _Holds())
    steps = found.get(("forward", whole, training)) or \
        found.setdefault(("forward", whole, training), _forward_steps(g, st, holds))
    kept_by: dict[int, int] = {}
    extra = memo.get("extra") if memo is not None else None
    if extra is None:
        extra = {k: s.extra_bytes for k, s in g.saved.items()}
        if memo is not None:
            memo["extra"] = extra
    ahead = on_rank.forward if on_rank.forward is not None else memo
    forward = _replayed(ahead, ("forward", whole, training), st, lambda: _forward(g, st, steps, extra))
    forward[0].apply(w)
    activations, statistics, kept = forward[1:]
    kept_by.update(kept)
    if training:
        unsized.update(x for s in g.saved.values() for x in s.unsized)  # kept inside a control-flow body
        tape = found.get(("backward", whole, accumulated)) or \
            found.setdefault(("backward", whole, accumulated), _backward(g, st, holds, accumulated))
        _replayed(memo, ("backward", whole, accumulated), st,
                  lambda: (tape.replayed(size, grad_size, extra, st.known),))[0].apply(w)
        w.live += temps
        w.mark("optimizer step", "")
    rank = RankMemory(params, buffers, grads, states, temps if optimizer else 0, inputs, activations, statistics,
                      w.peak, w.phase, w.node, kv_cache_bytes)
    return Memory(mode, optimizer if training else None,
                  settings.resolved_implementation if training and optimizer else None,
                  str(settings.recompute) if training else "none", settings.master_weights, (rank,),
                  MappingProxyType(dict(missing) if training else {}), tuple(sorted(unsized)),
                  MappingProxyType(kept_by), g, settings)


def _trained_names(g: Graph) -> list[str]:
    """``g``'s trained tensors in its tensors' order (its weights in the module's parameter order: the
    optimizer's), then any it lacks, sorted."""
    return [n for n in g.tensors if n in g.trainable] + sorted(g.trainable - g.tensors.keys())


def _held(g: Graph, size: Callable[[str], int], grad_size: Callable[[str], int], training: bool,
          names: list[str]) -> tuple:
    """(parameters', buffers' and inputs' bytes, the trained tensors, their gradients' bytes in training) of
    ``g`` at these sizes: the trained tensors (``names``: :func:`_trained_names`) as ``g`` holds them."""
    trained = [g.tensors.get(n) or TensorInfo(n) for n in names]
    return (sum(size(n) for n in g.params), sum(size(n) for n in g.buffers), sum(size(n) for n in g.inputs), trained,
            sum(grad_size(t.name) for t in trained) if training else 0)


@dataclass
class _Holds:
    """Who keeps which storage for the backward: ``holders`` root → node indices whose backward reads it;
    ``recomputed`` root → the unit that makes it again in the backward; ``unit_inputs`` unit → the roots its
    checkpoint keeps; ``first``/``last`` unit → its first and last node whose backward runs (forward order);
    ``unit_outputs`` unit → the roots it hands on, which a rerun of its whole forward (``full``) makes anew."""

    holders: dict[str, set[int]] = field(default_factory=dict)
    recomputed: dict[str, int] = field(default_factory=dict)
    unit_inputs: dict[int, set[str]] = field(default_factory=dict)
    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)
    unit_outputs: dict[int, set[str]] = field(default_factory=dict)


#: Ops whose operands after the first are shapes, axes or bounds: numbers in the framework, not tensors a checkpoint
#: keeps.
_SHAPE_OPERANDS = frozenset({"Reshape", "Expand", "Unsqueeze", "Squeeze", "Slice", "Tile", "Pad"})


def _holds(g: Graph, st: _Storages, whole: bool) -> _Holds:
    """Who keeps what (:class:`_Holds`); ``whole``: each unit's rerun runs its whole forward (``full``)."""
    h = _Holds()
    of = st.root.get  # st.of, called as of(name, name)
    producer_unit: dict[str, int | None] = {}
    sizes: set[str] = set()  # a shape's sizes: numbers in the framework, not tensors a checkpoint keeps
    ends = {u: pos for pos, n in enumerate(g.nodes) if (u := g.units.get(n.index)) is not None}
    for pos, n in enumerate(g.nodes):
        u = g.units.get(n.index)
        if whole:  # what a unit made and a later unit, or a node after it, reads: the unit's output
            for t in n.inputs:
                made = producer_unit.get(of(t.name, t.name)) if t is not None and t.name else None
                if made is not None and made != u and (u is not None or pos > ends[made]):
                    h.unit_outputs.setdefault(made, set()).add(of(t.name, t.name))
        for t in n.outputs:
            if t is not None and t.name and of(t.name, t.name) == t.name:
                producer_unit[t.name] = u
                if n.op_type in ("Shape", "Size"):
                    sizes.add(t.name)
        if u is not None:
            if n.index in g.grads:  # the backward reaches the unit at these nodes only
                h.first.setdefault(u, n.index)
                h.last[u] = n.index
            for i, t in enumerate(n.inputs):
                if t is not None and t.name and of(t.name, t.name) not in g.stored and \
                        not (i and n.op_type in _SHAPE_OPERANDS):
                    r = of(t.name, t.name)
                    if producer_unit.get(r) != u and r not in sizes:
                        h.unit_inputs.setdefault(u, set()).add(r)
        s = g.saved.get(n.index)
        if s is None:
            continue
        for i in s.inputs:
            if i < len(n.inputs) and n.inputs[i] is not None and n.inputs[i].name:
                h.holders.setdefault(st.of(n.inputs[i].name), set()).add(n.index)
        for o in s.outputs:
            if o < len(n.outputs) and n.outputs[o] is not None and n.outputs[o].name:
                h.holders.setdefault(st.of(n.outputs[o].name), set()).add(n.index)
    for name in g.outputs if whole else ():
        if producer_unit.get(st.of(name)) is not None:
            h.unit_outputs.setdefault(producer_unit[st.of(name)], set()).add(st.of(name))
    for root in list(h.holders):
        if root in g.stored:
            del h.holders[root]  # weights and constants are no activations
            continue
        u = producer_unit.get(root)
        if u is not None and all(g.units.get(k) == u for k in h.holders[root]) and root not in h.unit_inputs.get(u, ()):
            h.recomputed[root] = u
    return h


def _forward_steps(g: Graph, st: _Storages, h: _Holds) -> tuple[Tape, list[tuple[str, int]]]:
    """The forward walk, recorded apart from the sizes (:class:`.tape.Tape`): each node's outputs allocated with its
    statistics, marked, then its statistics freed if its unit makes them again in the backward and the storages
    freed that nothing reads or keeps any more; and the storages kept for the backward at its end with the node
    that made each (-1: a graph input)."""
    of = st.root.get  # st.of, called as of(name, name)
    last_use: dict[str, int] = {}
    for pos, n in enumerate(g.nodes):
        for t in n.inputs:
            if t is not None and t.name:
                last_use[of(t.name, t.name)] = pos
    held = {r for r in h.holders if r not in h.recomputed}.union(*h.unit_inputs.values())
    persistent = g.stored | {of(n, n) for n in g.inputs} | {of(n, n) for n in g.outputs}
    allocated: set[str] = set()
    w = Tape("forward")
    for pos, n in enumerate(g.nodes):
        made = tuple(t.name for t in n.outputs
                     if t is not None and t.name and of(t.name, t.name) == t.name and t.name not in g.stored)
        allocated.update(made)
        names = [t.name for t in (*n.inputs, *n.outputs) if t is not None and t.name]
        freed = tuple(r for r in {of(x, x) for x in names}
                      if r in allocated and last_use.get(r, -1) <= pos and r not in held and r not in persistent)
        allocated.difference_update(freed)
        for name in made:
            w.add(name)
        if n.index in g.saved:
            w.extra(n.index)
        w.mark(n.name)
        if n.index in g.saved and n.index in g.units:
            w.extra(n.index, -1)  # recomputed in the backward
        for r in freed:
            w.add(r, -1)
    w.mark(None)
    producer = {t.name: n.index for n in g.nodes for t in n.outputs if t is not None and t.name}
    return w, [(r, producer.get(r, -1)) for r in held - g.stored]


def _replayed(memo: dict | None, key: tuple, st: _Storages, walked: Callable[[], tuple]) -> tuple:
    """``walked()`` (a replay from no bytes alive and what else it finds at these sizes), kept in ``memo`` under
    ``key`` for the next walk of the same sizes (see :class:`OnRank`); the names of unknown size it reads are
    added to ``st.unsized`` each time, as a walk anew adds them."""
    if memo is None:
        return walked()
    found = memo.get(key)
    if found is None:
        outer, st.unsized = st.unsized, set()
        try:
            found = memo[key] = (walked(), frozenset(st.unsized))
        finally:
            st.unsized = outer
    st.unsized.update(found[1])
    return found[0]


def _forward(g: Graph, st: _Storages, steps: tuple, extra: Mapping[int, int]) -> tuple:
    """The forward (:func:`_forward_steps`) at these sizes (``extra``: node index → its statistics' bytes): its
    walk from no bytes alive (:class:`.tape.Replayed`), the bytes kept for the backward at its end (whole tensors
    and statistics together), the statistics among them, and the bytes kept per node index: a tensor under the
    node that made it (-1: a graph input), statistics under the node that keeps them."""
    tape, kept_at_end = steps
    replayed = tape.replayed(st.nbytes, st.nbytes, extra, st.known)
    kept_by: dict[int, int] = {}
    statistics = 0
    for n in g.nodes:
        if n.index not in g.units and extra.get(n.index):
            statistics += extra[n.index]
            kept_by[n.index] = kept_by.get(n.index, 0) + extra[n.index]
    kept = 0
    for r, k in kept_at_end:
        kept += st.nbytes(r)
        kept_by[k] = kept_by.get(k, 0) + st.nbytes(r)
    return replayed, kept + statistics, statistics, kept_by


def _backward(g: Graph, st: _Storages, h: _Holds, accumulated: bool) -> Tape:
    """The backward walk in reverse execution order, recorded apart from the sizes (:class:`.tape.Tape`): each
    node's input gradients are allocated, then its output gradients, its statistics and what only it kept are
    freed, and then the gradients it gives are added into those other consumers made (:func:`_add_into`): torch's
    engine releases a node's saved tensors (``release_variables``) as soon as its backward returns, before it adds
    the node's outputs into the next nodes' input buffers; a checkpointed unit makes its kept tensors again when its backward starts and releases its inputs when
    it ends. ``accumulated``: the parameters' gradients exist from the start."""
    w = Tape("backward")
    param_grads = set(g.trainable) if accumulated else set()
    persistent = g.stored | {st.of(n) for n in g.inputs} | {st.of(n) for n in g.outputs}
    pending = {r: len(k) for r, k in h.holders.items()}  # holders whose backward has not run
    kept_by: dict[int, list[str]] = {}
    for r, ks in h.holders.items():
        for k in ks:
            kept_by.setdefault(k, []).append(r)
    unit_holds: dict[str, int] = {}  # root → checkpointed units still keeping it
    for rs in h.unit_inputs.values():
        for r in rs:
            unit_holds[r] = unit_holds.get(r, 0) + 1
    remade: dict[int, list[str]] = {}
    for r, u in h.recomputed.items():
        remade.setdefault(u, []).append(r)
    unit_extra: dict[int, list[int]] = {}
    for k in g.saved:
        if k in g.units:
            unit_extra.setdefault(g.units[k], []).append(k)
    alive = {r for r in h.holders if r not in h.recomputed}.union(*h.unit_inputs.values())
    for r in sorted(r for rs in h.unit_outputs.values() for r in rs):
        w.term("bytes", r)  # sized whether or not the unit's backward runs
    grad_of, held = _seed_gradients(g, w)

    def release(r: str) -> None:
        if r in alive and not pending.get(r) and not unit_holds.get(r) and r not in persistent:
            alive.discard(r)
            w.add(r, -1)

    for n in reversed(g.nodes):
        if n.index not in g.grads:
            continue
        u = g.units.get(n.index)
        if u is not None and h.last.get(u) == n.index:  # the checkpoint runs the unit's forward again
            for r in remade.get(u, ()):
                if r not in alive:
                    alive.add(r)
                    w.add(r)
            for k in unit_extra.get(u, ()):
                w.extra(k)
            for r in h.unit_outputs.get(u, ()):  # a whole rerun makes the outputs anew too
                w.add(r)
        sums = _input_grads(g, st, n, w, grad_of, param_grads)
        w.mark(n.name)
        for t in n.outputs:
            if t is not None and t.name in grad_of and grad_of[t.name] not in held:
                w.add(grad_of.pop(t.name), -1)
        if n.index in g.saved:  # released before its gradients are added in (see the docstring)
            w.extra(n.index, -1)
        for r in kept_by.get(n.index, ()):
            pending[r] -= 1
            release(r)
        _add_into(w, sums, n.name)
        if u is not None and h.first.get(u) == n.index:
            for r in h.unit_outputs.get(u, ()):
                w.add(r, -1)
            for r in h.unit_inputs.get(u, ()):
                unit_holds[r] -= 1
                release(r)
    for r in held:
        w.add(r, -1)
    w.mark(None)
    return w


def _seed_gradients(g: Graph, w: Tape) -> tuple[dict[str, str], set[str]]:
    """The seed gradients of the graph's outputs that need one, allocated: (a gradient alive → the name whose bytes
    it has, the scalar outputs' seeds, which torch.autograd.backward holds until the backward returns)."""
    grad_of: dict[str, str] = {}
    held = set()
    for n in g.nodes:
        for t in n.outputs:
            if n.index in g.grads and t is not None and t.name in g.outputs and t.is_float:
                grad_of[t.name] = t.name
                w.add(t.name)
                if t.shape is not None and not any(d != 1 for d in t.shape):
                    held.add(t.name)
    return grad_of, held


def _add_into(w: Tape, sums: list[tuple[str, str, bool]], name: str) -> None:
    """torch's engine adds each gradient given into the one made before (:func:`_input_grads`), out of place: the
    two and their sum alive at once at node ``name``'s second mark (the node's own saved tensors released by then),
    then the two freed."""
    if not sums:
        return
    for into, given, counted in sums:
        if not counted:
            w.add(given)
        w.add(into)
    w.mark(name)
    for into, given, _counted in sums:
        w.add(into, -1)
        w.add(given, -1)


def _input_grads(g: Graph, st: _Storages, n: NodeCount, w: Tape, grad_of: dict[str, str],
                 param_grads: set[str]) -> list[tuple[str, str, bool]]:
    """Allocate the gradients node ``n``'s backward produces: a parameter's once, kept to the step; an activation's
    once, however many consumers add to it; a view's input gradient is its output gradient, viewed. Return the
    gradients to add into one another consumer made before, each (the bytes' name of that one, of the one given,
    whether the one given is on the walk already): torch's engine adds them after the node's backward has returned
    (its output gradients freed) as ``old + new``, a third tensor, then frees the two. The one given is a new
    tensor made by the node's backward (alive at its mark), the output's gradient itself where the backward passes
    it on (:func:`_passes_gradient`: freed with the output's gradients, so counted again), or a view's output
    gradient, viewed."""
    flags = g.grads[n.index]
    sums = []
    for i, t in enumerate(n.inputs):
        if i >= len(flags) or not flags[i] or t is None or not t.name:
            continue
        if t.name in g.trainable or (t.name in st.gathered and st.of(t.name) in g.trainable):
            p = st.of(t.name)  # an expert gather's slices: the gradient is the parameter's own
            if p not in param_grads:
                param_grads.add(p)
                w.grad(p)
        elif t.name in st.gathered:  # slices of a parameter that is not trained: no gradient
            continue
        elif n.op_type in VIEWS and n.op_type != "Split" and i == 0 and n.outputs and n.outputs[0] is not None \
                and n.outputs[0].name in grad_of:
            viewed = grad_of.pop(n.outputs[0].name)
            if t.name in grad_of:  # added into the gradient another consumer made
                sums.append((grad_of[t.name], viewed, True))
            else:
                grad_of[t.name] = viewed
        elif t.name not in grad_of:
            grad_of[t.name] = t.name
            w.add(t.name)
        elif _passes_gradient(n, i):
            sums.append((grad_of[t.name], t.name, False))
        else:
            sums.append((grad_of[t.name], t.name, True))
            w.add(t.name)
    return sums


def _passes_gradient(n: NodeCount, i: int) -> bool:
    """Whether input ``i``'s gradient from ``n``'s backward is the output's gradient itself (no new tensor): an
    Add's input of the output's shape, a Sub's first (torch's add and sub backward return the gradient as given)."""
    if n.domain != "" or not n.outputs or n.outputs[0] is None or (n.op_type, i) not in (("Add", 0), ("Add", 1),
                                                                                       ("Sub", 0)):
        return False
    t = n.inputs[i]
    return t is not None and t.shape is not None and tuple(t.shape) == tuple(n.outputs[0].shape or ())


def with_params(memory: Memory, tensors: Sequence[TensorInfo]) -> Memory:
    """``memory`` with a module's weights that take no gradient counted in its parameters: one the graph never reads
    (a module's parameter the traced forward does not use, such as DINOv2's ``mask_token``) added, a frozen one the
    graph holds as a buffer (Whisper's sinusoidal position embedding) moved from the buffers. They are held
    throughout the step like every weight, without a gradient or optimizer states (the backward never reaches
    them, and torch's optimizers make states only for parameters with a gradient). The walk runs again on the
    graph with them, so the peak includes them."""
    g = memory.graph
    if not tensors or g is None or memory.settings is None or len(memory.ranks) != 1:
        return memory
    names = {t.name for t in tensors}
    g = dataclasses.replace(g, tensors={**g.tensors, **{t.name: t for t in tensors}},
                            params=g.params | names, buffers=g.buffers - names)
    return ledger(g, memory.mode, memory.optimizer, memory.settings, memory.missing, memory.ranks[0].kv_cache_bytes)


#: The row of :func:`module_activations` that holds the graph's inputs kept for the backward.
INPUTS = "(graph inputs)"


def module_activations(memory: Memory, nodes: Sequence[NodeCount], scopes: Sequence[tuple[str, ...]],
                       depth: int = 1) -> tuple[tuple[str, int], ...]:
    """The activations kept for the backward per module down to ``depth`` (1: the model's children), in the order
    the graph first runs them: a tensor in the module whose node made it, statistics in the module whose node keeps
    them, the graph's inputs in the row :data:`INPUTS`, the rest in ``modules.OUTSIDE``. The rows sum to
    ``activations_bytes``."""
    from ..reporting.modules import OUTSIDE

    if depth < 1:
        raise UsageError(f"depth: must be 1 or more, not {depth}")
    position = {n.index: k for k, n in enumerate(nodes)}
    rows: dict[str, int] = {}
    for idx in sorted(memory.kept_by_node, key=lambda i: position.get(i, -1)):
        chain = scopes[position[idx]][:depth] if idx >= 0 and scopes and idx in position else ()
        key = INPUTS if idx < 0 else chain[-1] if chain else OUTSIDE
        rows[key] = rows.get(key, 0) + memory.kept_by_node[idx]
    return tuple(rows.items())
