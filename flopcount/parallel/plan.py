"""How a training run is laid out: the parallel plan and the recompute policy, frozen records shared by the memory
ledger (:mod:`flopcount.memory.ledger`) and the per-rank FLOP ledger of parallel plans.

A plan is plain arithmetic on degrees; nothing here knows a model. The textual forms are the ones the command line
takes (``--parallel tp=2,pp=4,dp=8,sp,fsdp``, or ``zero1``/``zero2`` in place of ``fsdp``, ``--microbatches 16``,
``--schedule interleaved:2``, ``--recompute selective``); :func:`parse_parallel` and :func:`parse_recompute` read them and raise
:class:`~flopcount.errors.UsageError` (exit 2) naming the bad part.

>>> plan = parse_parallel("tp=2,pp=4,dp=8,sp", microbatches=16, schedule="1f1b")
>>> plan.world_size, plan.model_parallel_size
(64, 8)
>>> parse_recompute("selective").policy
'selective'
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, fields
from typing import Any

from ..errors import UsageError

__all__ = [
    "DEGREES", "DEVICES", "DISPATCHERS", "FLAGS", "IMPLEMENTATIONS", "RECOMPUTE_POLICIES", "SCHEDULES", "SHARDING", "SP_STYLES",
    "ParallelPlan", "Recompute", "parse_parallel",
    "MAX_RANKS", "MAX_SCHEDULE_STEPS", "check_recompute_ops", "parse_recompute", "parse_schedule",
]

#: The integer degrees of a plan: tensor, pipeline, context, expert and data parallel.
DEGREES = ("tp", "pp", "cp", "ep", "dp")
#: The switches of a plan: sequence parallelism (over the TP group), FSDP/ZeRO-3 sharding over the DP group, and
#: ZeRO stages 1 (optimizer states sharded) and 2 (optimizer states and gradients sharded) over the D·C ranks of the
#: data- and context-parallel group (Rajbhandari et al. 2020, P_os and P_os+g). At most one of fsdp, zero1, zero2.
FLAGS = ("sp", "fsdp", "zero1", "zero2")
#: How sequence parallelism's column-parallel products keep their gathered input for the backward (``sp=STYLE``;
#: ``sp`` alone is ``torch``): ``torch`` keeps the all-gathered tokens (A per product's input) until the weight's
#: gradient, as autograd does with a gather run before the product (torch's ``SequenceParallel`` and
#: ``ColwiseParallel``); ``megatron`` keeps only the rank's tokens (A/T) and all-gathers them again in the backward,
#: as Megatron-LM's ``ColumnParallelLinear`` under ``sequence_parallel`` does.
SP_STYLES = ("torch", "megatron")
#: Megatron-Core's token dispatchers of a mixture-of-experts layer the ledgers model (``--token-dispatcher``, its
#: ``--moe-token-dispatcher-type``): ``alltoall`` (``MoEAlltoAllTokenDispatcher``) and ``allgather``
#: (``MoEAllGatherTokenDispatcher``); a plan that names none runs ``allgather`` under ep = 1 and ``alltoall`` under
#: ep > 1 (:func:`flopcount.parallel.experts.dispatcher`).
DISPATCHERS = ("alltoall", "allgather")
#: The sharding switches, one at most per plan, and the ZeRO stage each is.
SHARDING = {"zero1": 1, "zero2": 2, "fsdp": 3}
#: Pipeline schedules; ``interleaved`` takes ``:v`` virtual stages per rank (default 2).
SCHEDULES = ("gpipe", "1f1b", "interleaved")
#: How an optimizer step may run (its temporaries differ), and the devices whose default torch picks for "auto".
IMPLEMENTATIONS = ("auto", "single-tensor", "foreach", "fused")
DEVICES = ("cuda", "cpu")
#: The named recompute policies; any other text is a comma-separated list of operator types to recompute.
RECOMPUTE_POLICIES = ("none", "full", "non-reentrant", "selective")
#: The most ranks a plan may have (tp·pp·cp·dp): the ledgers list every rank (one per rank in the JSON), which at
#: 2**16 = 65,536 ranks takes seconds; a larger plan is refused rather than left to run for minutes.
MAX_RANKS = 2**16
#: The most forward steps of one optimizer step's pipeline schedule, pp·v·M (2**18 = 262,144): the schedule is
#: simulated step by step.
MAX_SCHEDULE_STEPS = 2**18


def _ascii_int(text: str) -> int | None:
    """The integer ``text`` spells in ASCII digits (``int`` would read other scripts' digits too), else None."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


@dataclass(frozen=True)
class ParallelPlan:
    """A parallel layout of one training step. Degrees are at least 1; ``sp`` needs ``tp`` > 1; ``schedule`` and
    ``virtual_stages`` (interleaved only) matter with ``pp`` > 1; ``microbatches`` M is per optimizer step and,
    under pipelining, at least ``pp``; at most one of ``fsdp``, ``zero1`` and ``zero2`` (:attr:`zero_stage`);
    ``sp_style`` (one of :data:`SP_STYLES`) is how sp keeps a column-parallel product's gathered input, other than
    ``torch`` only with ``sp``; ``token_dispatcher`` (one of :data:`DISPATCHERS`, or None: allgather under ep = 1,
    alltoall under ep > 1) is how a mixture-of-experts layer sends its tokens to its experts."""

    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    sp: bool = False
    fsdp: bool = False
    zero1: bool = False
    zero2: bool = False
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    sp_style: str = "torch"
    token_dispatcher: str | None = None

    def __post_init__(self) -> None:
        for name in (*DEGREES, "microbatches", "virtual_stages"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"parallel plan: {name}={v!r} must be a positive integer")
        for name in FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise UsageError(f"parallel plan: {name}={getattr(self, name)!r} must be True or False")
        if self.tp * self.pp * self.cp * self.dp > MAX_RANKS or self.ep > MAX_RANKS:
            raise UsageError(f"parallel plan: {self.tp * self.pp * self.cp * self.dp:,} ranks (tp·pp·cp·dp) is above "
                             f"the limit of 2**16 = {MAX_RANKS:,}; give smaller degrees")
        steps = self.pp * self.virtual_stages * self.microbatches
        if self.microbatches > MAX_SCHEDULE_STEPS or self.pp > 1 and steps > MAX_SCHEDULE_STEPS:
            raise UsageError(f"parallel plan: {self.microbatches:,} microbatches on {self.pp} stages "
                             f"({self.virtual_stages} per rank) make {steps:,} forward steps per optimizer step, above "
                             f"the limit of 2**18 = {MAX_SCHEDULE_STEPS:,}; give fewer microbatches (--microbatches)")
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise UsageError(f"parallel plan: unknown schedule {self.schedule!r}; choose one of: "
                             f"{', '.join(SCHEDULES)} (interleaved:V for V virtual stages per rank)")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise UsageError(f"parallel plan: {self.virtual_stages} virtual stages need schedule 'interleaved', "
                             f"not {self.schedule!r}")
        if not isinstance(self.sp_style, str) or self.sp_style not in SP_STYLES:
            raise UsageError(f"parallel plan: unknown sp_style {self.sp_style!r}; choose one of: "
                             f"{', '.join(SP_STYLES)}")
        if self.sp_style != "torch" and not self.sp:
            raise UsageError(f"parallel plan: sp_style={self.sp_style!r} is how sp keeps its gathered inputs; give "
                             "sp=True with it")
        if self.token_dispatcher is not None and self.token_dispatcher not in DISPATCHERS:
            raise UsageError(f"parallel plan: unknown token_dispatcher {self.token_dispatcher!r}; choose one of: "
                             f"{', '.join(DISPATCHERS)}")
        if self.sp and self.tp == 1:
            raise UsageError("parallel plan: sp (sequence parallelism) splits over the tensor-parallel group; "
                             "give tp=T with T > 1")
        if self.fsdp and self.dp == 1:
            raise UsageError("parallel plan: fsdp shards over the data-parallel group; give dp=D with D > 1")
        sharding = [f for f in SHARDING if getattr(self, f)]
        if len(sharding) > 1:
            raise UsageError(f"parallel plan: {' and '.join(sharding)} are different shardings of the model "
                             f"states; give one of {', '.join(SHARDING)}")
        for f in ("zero1", "zero2"):
            if getattr(self, f) and self.dp * self.cp == 1:
                raise UsageError(f"parallel plan: {f} shards over the data- and context-parallel ranks; give "
                                 "dp=D or cp=C with D·C > 1")
        if self.pp > 1 and self.microbatches < self.pp:
            raise UsageError(f"parallel plan: {self.microbatches} microbatches cannot fill {self.pp} pipeline "
                             f"stages; give --microbatches M with M >= {self.pp}")

    @property
    def zero_stage(self) -> int:
        """What is sharded over the D·C data- and context-parallel ranks, as ZeRO's stages: 0 nothing, 1 the
        optimizer states (``zero1``), 2 and the gradients (``zero2``), 3 and the parameters (``fsdp``)."""
        return max((stage for f, stage in SHARDING.items() if getattr(self, f)), default=0)

    @property
    def world_size(self) -> int:
        """Ranks in all: tp·pp·cp·dp (expert parallelism reuses the data- and context-parallel ranks)."""
        return self.tp * self.pp * self.cp * self.dp

    @property
    def model_parallel_size(self) -> int:
        """Ranks that hold one copy of the model: tp·pp·cp."""
        return self.tp * self.pp * self.cp

    @property
    def is_single(self) -> bool:
        """Whether the plan is one rank holding everything."""
        return self.world_size == 1 and self.ep == 1

    def group_ranks(self, group: str, kv_heads: int | None = None) -> int:
        """The ranks of the group a collective of the per-rank ledger runs on (JSON ``communication[].group``):
        ``tp`` T; ``pp`` 2 (a send between neighbouring stages); ``embedding`` 2 (a tied embedding's copies on the
        first and last stage); ``cp`` C; ``ep`` E; ``dp`` D; ``dp_cp`` D·C; ``edp`` D·C/E (an expert's data-parallel
        copies); ``tp_ep`` T·E (the router's counts); ``etp`` T (expert tensor parallelism: the TP ranks that gather
        the pairs their MoE layers receive, under sp); ``tp_cp`` T·C (the auxiliary loss's); ``tp_kv`` T/K, the
        copies of a K/V head where the model's ``kv_heads`` K are fewer than T (else 1).

        >>> plan = ParallelPlan(tp=4, dp=4, ep=2)
        >>> tuple(plan.group_ranks(g, kv_heads=2) for g in ("tp", "edp", "tp_ep", "tp_kv"))
        (4, 2, 8, 2)
        """
        sizes = {"tp": self.tp, "pp": 2, "embedding": 2, "cp": self.cp, "ep": self.ep, "dp": self.dp,
                 "dp_cp": self.dp * self.cp, "edp": self.dp * self.cp // self.ep, "tp_ep": self.tp * self.ep,
                 "etp": self.tp, "tp_cp": self.tp * self.cp,
                 "tp_kv": self.tp // kv_heads if kv_heads and kv_heads < self.tp else 1}
        if group not in sizes:
            raise ValueError(f"no communication group {group!r}; the ledger's groups are {', '.join(sizes)}")
        return sizes[group]

    def group_stride(self, group: str, kv_heads: int | None = None) -> int:
        """The distance between the global rank ids of neighbouring members of a :meth:`group_ranks` group, in the
        rank order of :func:`flopcount.parallel.layout.rank_id` (tensor parallel fastest, then cp, dp, pp; the
        expert groups as Megatron lays them out, tp then ep then the expert data-parallel ranks): ``tp``, ``tp_ep``,
        ``etp``, ``tp_cp`` and ``tp_kv`` 1; ``cp``, ``dp_cp`` and ``ep`` T; ``dp`` T·C; ``edp`` T·E; ``pp`` T·C·D (the
        next stage); ``embedding`` T·C·D·(P − 1) (the first and the last stage).

        >>> plan = ParallelPlan(tp=8, pp=4, dp=2, microbatches=4)
        >>> tuple(plan.group_stride(g) for g in ("tp", "dp", "pp", "embedding"))
        (1, 8, 16, 48)
        """
        t, c, d, p = self.tp, self.cp, self.dp, self.pp
        strides = {"tp": 1, "tp_ep": 1, "etp": 1, "tp_cp": 1, "tp_kv": 1, "cp": t, "dp_cp": t, "ep": t, "dp": t * c,
                   "edp": t * self.ep, "pp": t * c * d, "embedding": t * c * d * max(p - 1, 1)}
        if group not in strides:
            raise ValueError(f"no communication group {group!r}; the ledger's groups are {', '.join(strides)}")
        return strides[group]

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def __str__(self) -> str:
        parts = [f"{d}={getattr(self, d)}" for d in DEGREES] + [
            f"sp={self.sp_style}" if f == "sp" and self.sp_style != "torch" else f for f in FLAGS if getattr(self, f)]
        schedule = self.schedule + (f":{self.virtual_stages}" if self.schedule == "interleaved" else "")
        dispatcher = f" token_dispatcher={self.token_dispatcher}" if self.token_dispatcher else ""
        return ",".join(parts) + f" microbatches={self.microbatches} schedule={schedule}{dispatcher}"


def parse_parallel(text: str, microbatches: int = 1, schedule: str = "1f1b") -> ParallelPlan:
    """The plan of ``--parallel tp=2,pp=4,dp=8,sp,fsdp`` with ``--microbatches`` and ``--schedule`` (``gpipe``,
    ``1f1b``, ``interleaved[:V]``). Degrees left out are 1; ``sp=STYLE`` names how sp keeps its gathered inputs
    (:data:`SP_STYLES`; ``sp`` is ``sp=torch``).

    >>> parse_parallel("dp=4,fsdp").fsdp
    True
    >>> parse_parallel("tp=2,sp=megatron").sp_style
    'megatron'
    >>> parse_parallel("dp=4,zero2").zero_stage
    2
    >>> parse_parallel("tp=0")
    Traceback (most recent call last):
    ...
    flopcount.errors.UsageError: --parallel: tp=0 must be a positive integer (digits 0-9)
    """
    if not isinstance(text, str) or not text.strip(" ,"):
        raise UsageError(f"--parallel: {text!r} is no plan; give degrees and switches such as tp=2,pp=4,dp=8,sp")
    values: dict[str, Any] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if key in values:
            raise UsageError(f"--parallel: {key} is given twice in {text!r}")
        if key in FLAGS and not eq:
            values[key] = True
        elif key == "sp":
            style = value.strip().lower()
            if style not in SP_STYLES:
                raise UsageError(f"--parallel: {part!r}: sp takes one of {', '.join(SP_STYLES)} (how a column-parallel "
                                 "product keeps its gathered input), or nothing (sp=torch)")
            values["sp"], values["sp_style"] = True, style
        elif key in DEGREES and eq:
            degree = _ascii_int(value)
            if degree is None or degree < 1:
                raise UsageError(f"--parallel: {key}={value} must be a positive integer (digits 0-9)")
            values[key] = degree
        else:
            raise UsageError(f"--parallel: {part!r} is not a degree or a switch; give "
                             f"{', '.join(d + '=N' for d in DEGREES)} and the switches {', '.join(FLAGS)} "
                             f"(sp={'|'.join(SP_STYLES)} naming how sp keeps its gathered inputs), "
                             "e.g. --parallel tp=2,pp=4,dp=8,sp")
    name, stages = parse_schedule(schedule)
    return ParallelPlan(**values, microbatches=microbatches, schedule=name, virtual_stages=stages)


def parse_schedule(text: str) -> tuple[str, int]:
    """``--schedule gpipe|1f1b|interleaved[:V]`` → ``(schedule, virtual stages per rank)``.

    >>> parse_schedule("interleaved:4"), parse_schedule("interleaved"), parse_schedule("1f1b")
    (('interleaved', 4), ('interleaved', 2), ('1f1b', 1))
    """
    if not isinstance(text, str):
        raise UsageError(f"--schedule: {text!r} is no schedule; choose one of: {', '.join(SCHEDULES)}")
    name, colon, virtual = text.partition(":")
    stages = _ascii_int(virtual) if colon else (2 if name == "interleaved" else 1)
    if colon and (name != "interleaved" or stages is None or stages < 1):
        raise UsageError(f"--schedule: {text!r}; choose one of: {', '.join(SCHEDULES)} "
                         "(interleaved:V for V >= 1 virtual stages per rank)")
    return name, stages


@dataclass(frozen=True)
class Recompute:
    """What the backward pass recomputes instead of keeping from the forward.

    ``policy`` is ``none`` (keep everything the backward needs), ``full`` (keep only each layer's input and run
    the layer's whole forward again in the backward, as Megatron's full recompute and
    ``torch.utils.checkpoint(..., use_reentrant=True)`` around every layer run it), ``non-reentrant`` (keep the
    same, and run the layer's forward again only until every tensor its backward saved is back, as
    ``torch.utils.checkpoint(..., use_reentrant=False)`` stops: a dense layer's down projection and the residual
    add after it do not run again),
    ``selective`` (recompute the attention core, the score products through softmax and dropout, as Korthikanti et
    al. 2022 propose; keep the rest) or ``ops``: recompute the operator types in ``ops`` and keep the rest (the
    policy of selective activation checkpointing).
    """

    policy: str = "none"
    ops: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.policy not in (*RECOMPUTE_POLICIES, "ops"):
            raise UsageError(f"recompute: unknown policy {self.policy!r}; choose one of: "
                             f"{', '.join(RECOMPUTE_POLICIES)}, or a list of operator types")
        if not isinstance(self.ops, (frozenset, set)) or not all(isinstance(op, str) for op in self.ops):
            raise UsageError(f"recompute: ops must be a set of operator types such as {{'Softmax'}}, got {self.ops!r}")
        object.__setattr__(self, "ops", frozenset(self.ops))
        if (self.policy == "ops") != bool(self.ops):
            raise UsageError("recompute: give operator types with the 'ops' policy, and only with it")

    def __str__(self) -> str:
        return ",".join(sorted(self.ops)) if self.policy == "ops" else self.policy


def check_recompute_ops(recompute: Recompute, op_types: Collection[str]) -> None:
    """:class:`~flopcount.errors.UsageError` (exit 2) for an ``ops`` policy that cannot be what was meant, given the
    operator types of the counted graph (``op_types``): one that names no type of the graph at all (it would
    recompute nothing, silently), or a name that is neither a type of the graph nor an ONNX operator (misspelt, in
    lower case, or ``DOMAIN:OP`` where the graph names the op type alone). A real operator type the graph lacks
    beside others it has is fine: a policy written for several models lists them all. The error lists the graph's
    types.

    >>> check_recompute_ops(parse_recompute("Softmax,Gelu"), {"MatMul", "Softmax"})
    >>> check_recompute_ops(parse_recompute("Softmax,Gleu"), {"MatMul", "Softmax"})
    Traceback (most recent call last):
    ...
    flopcount.errors.UsageError: --recompute Gleu,Softmax: Gleu is no ONNX operator type and no node of the graph's; \
its operator types: MatMul, Softmax; or a policy: none, full, non-reentrant, selective
    """
    if recompute.policy != "ops":
        return
    present = set(op_types)
    unknown = sorted(op for op in recompute.ops if op not in present and not _onnx_operator(op))
    listed = f"its operator types: {', '.join(sorted(present))}"
    if unknown:
        raise UsageError(f"--recompute {recompute}: {', '.join(unknown)} {'is' if len(unknown) == 1 else 'are'} no "
                         f"ONNX operator type and no node of the graph's; {listed}; or a policy: "
                         f"{', '.join(RECOMPUTE_POLICIES)}")
    if present.isdisjoint(recompute.ops):
        which = "that type" if len(recompute.ops) == 1 else "those types"
        raise UsageError(f"--recompute {recompute}: no node of the graph is of {which}, so nothing would be "
                         f"recomputed; {listed}")


def _onnx_operator(op_type: str) -> bool:
    """Whether ``op_type`` is an operator of one of ONNX's own domains (any opset)."""
    import onnx.defs

    return any(onnx.defs.has(op_type, domain) for domain in ("", "ai.onnx.ml", "ai.onnx.preview.training"))


def parse_recompute(text: str | Recompute | None) -> Recompute:
    """The policy of ``--recompute none|full|non-reentrant|selective|OP[,OP...]`` (operator types as ONNX names
    them, e.g. ``Softmax,Gelu``).

    >>> sorted(parse_recompute("Gelu,Softmax").ops)
    ['Gelu', 'Softmax']
    """
    if isinstance(text, Recompute):
        return text
    if text is None:
        return Recompute()
    if not isinstance(text, str):
        raise UsageError(f"--recompute: {text!r} is no policy; choose one of: {', '.join(RECOMPUTE_POLICIES)}, "
                         "operator types such as 'Softmax,Gelu', or a flopcount.Recompute")
    text = text.strip()
    if text.lower() in RECOMPUTE_POLICIES:
        return Recompute(text.lower())
    ops = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in ops if not p.replace("_", "").replace(":", "").replace(".", "").isalnum()]
    if not ops or bad:
        raise UsageError(f"--recompute: {text!r}; choose one of: {', '.join(RECOMPUTE_POLICIES)}, or operator "
                         "types to recompute, e.g. --recompute Softmax,Gelu")
    return Recompute("ops", frozenset(ops))
