"""The settings of a count in one frozen record, :class:`CountOptions` (the model they apply to:
:class:`flopcount.frontends.source.ModelSource`), and the one table that declares them.

Each setting is declared once, as a field of :class:`CountOptions` made by :func:`option`: its name (the keyword
of :func:`flopcount.count` and of the frontends), its type and default, its command-line flag (a :class:`Flag`:
the flag, the ``--help`` group, the help text, the reader of its words), and its check. From that declaration
:func:`flopcount.count` takes the keyword, the record checks the value when it is made (a
:class:`~flopcount.errors.UsageError` naming the argument, before any work), and the command line declares the
flag and reads it back by the field's name (:func:`flopcount.cli.arguments.add_options` and
``options_from_args``). A new setting is a field here and the code that reads it.

>>> CountOptions(batch=8, mode="train", optimizer="adam").optimizer
'adam'
>>> CountOptions(mode="training")
Traceback (most recent call last):
...
flopcount.errors.UsageError: unknown mode 'training'; choose one of: inference, train
>>> CountOptions(parallel="tp=2,pp=2", microbatches=4).parallel.microbatches
4
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Callable, Collection, Sequence

from .calls import MAX_ELEMENTS, CountArguments, check_count_arguments, described
from .errors import UsageError
from .parallel.plan import DEVICES, DISPATCHERS, IMPLEMENTATIONS, SCHEDULES

__all__ = ["ATTENTION_MODES", "GROUPS", "MEMORY_FLAGS", "MODES", "OPTIMIZERS", "CountOptions", "Flag", "flags", "option"]

MODES = ("inference", "train")
#: The named ``attention`` settings (a mask given is the third kind: :mod:`flopcount.masks`).
ATTENTION_MODES = ("full", "executed")
# FLOPs per trainable parameter of one update step; sqrt counted as one FLOP and one transcendental.
OPTIMIZERS: Mapping[str, tuple[int, int, str]] = MappingProxyType({
    "sgd": (2, 0, "w -= lr*g"),
    "momentum": (4, 0, "v = mu*v + g; w -= lr*v"),
    "adam": (14, 1, "m = b1*m + (1-b1)*g (3); v = b2*v + (1-b2)*g*g (4); bias corrections (2); "
                    "w -= lr*m_hat/(sqrt(v_hat)+eps) (5, one sqrt)"),
    "adamw": (16, 1, "Adam's 14 (one sqrt) and the decoupled weight decay w -= lr*wd*w (2)"),
})  # fmt: skip

#: The ``--help`` groups of the counting command, in their order: key → (title, description). A flag names its key.
GROUPS: Mapping[str, tuple[str, str]] = MappingProxyType({
    "input": ("input", "the model: an .onnx file, or a framework model exported without weights"),
    "shapes": ("shapes", "the dims and values that shapes depend on"),
    "counting": ("counting", "what is counted and how"),
    "llm": ("LLM", "language models: generation, mixtures of experts, stacks of identical layers"),
    "plan": ("parallel and memory", "the memory of a step, and the FLOPs, communication and memory per rank of a "
             "parallel plan (docs/memory.md, docs/parallel.md)"),
    "output": ("output", "what is written, and where"),
})


@dataclasses.dataclass(frozen=True)
class Flag:
    """How the command line spells a setting: ``flag`` (``--batch``) in the ``--help`` group ``group`` (a key of
    :data:`GROUPS`), with ``help``; ``reader`` names the function of :mod:`flopcount.cli.arguments` that reads one
    word (``READERS``; None: the word itself); ``action``, ``metavar`` and ``choices`` are argparse's (``action``
    ``"pairs"``: repeatable ``NAME=VALUE`` words gathered into a mapping; ``choices`` may be a function, called
    when the parser is built); ``dest`` is the name argparse stores it under (default: the field's); ``default``
    the value argparse starts from (None: the field's default, or nothing given)."""

    flag: str
    group: str
    help: str
    reader: str | None = None
    action: str | None = None
    metavar: str | None = None
    choices: Sequence[str] | Callable[[], Sequence[str]] | None = None
    dest: str | None = None
    default: Any = None

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"{self.flag}: unknown group {self.group!r}; one of {', '.join(GROUPS)}")


def option(default: Any = None, flag: Flag | None = None, check: Callable[[Any], None] | None = None) -> Any:
    """A field of :class:`CountOptions`: its default, where the command line takes it its :class:`Flag`, and its
    ``check`` (a function of the value given that raises :class:`~flopcount.errors.UsageError` naming it), which
    the record runs when it is made."""
    metadata = {**({"flag": flag} if flag is not None else {}), **({"check": check} if check is not None else {})}
    return dataclasses.field(default=default, metadata=metadata)


def _check_free_ops(free: Any) -> None:
    if isinstance(free, (str, bytes)) or not isinstance(free, Collection) or isinstance(free, Mapping) \
            or not all(isinstance(op, str) and op.strip(":") for op in free):
        raise UsageError(f"count: free_ops must be a list of operator types such as ['Marker', "
                         f"'com.example:Marker'], got {free!r}")


def _conventions() -> list[str]:
    from .conventions import CONVENTIONS

    return sorted(CONVENTIONS)


_WITH_PARALLEL = "with --parallel"


@dataclasses.dataclass(frozen=True)
class CountOptions:
    """Every setting of a count. Each is checked when the record is made.

    Attributes
    ----------
    input_shapes : mapping of input name to dims, optional
        Fixes dynamic (or overrides static) input dims, e.g. ``{"input": (8, 3, 224, 224)}``.
    batch : int, optional
        Sets dim 0 of every input not named in ``input_shapes``; also the divisor of ``per_sample``.
        Without it, the batch is dim 0 of the first input.
    input_values : mapping of input name to array, optional
        Values of small inputs that shapes depend on (reduction axes, Resize sizes), e.g.
        ``{"axes": [1, 2]}``; such inputs are treated as constants.
    loop_trips : mapping of node name to int, optional
        Trip counts of ``Loop`` nodes whose count is not a constant (and sequence lengths of
        ``SequenceMap`` nodes), e.g. ``{"generate_loop": 32}``. A name that is no such node of the graph is an
        error (the setting would do nothing).
    mode : ``"inference"`` or ``"train"``
        ``"train"`` adds the backward pass: per node, the gradients of the inputs that need one
        (inputs that depend on a trainable parameter, and the parameters themselves). The
        parameters are trained (see ``trainable``); buffers and constants are not.
    optimizer : ``"sgd"``, ``"momentum"``, ``"adam"`` or ``"adamw"``, optional
        With ``mode="train"``: also the optimizer update per step from the trainable parameter
        count, reported apart from the forward and backward totals.
    trainable_inputs : sequence of str, optional
        With ``mode="train"``: floating-point graph inputs that are trained like parameters rather than fed
        as data (an embedding or soft prompt passed in): their gradients are counted, and they count among the
        trainable parameters that the optimizer updates.
    trainable : collection of str, optional
        Names of the initializers (or ``Constant`` outputs) that are the framework's trainable
        parameters, e.g. from ``module.named_parameters()``. They are the parameters, and the only
        tensors trained; other weights are reported as buffers. ``None`` (the default): decided
        from the graph's structure (see :mod:`flopcount.pipeline.parameters`): tensors used as weights are parameters,
        BatchNormalization's running statistics are buffers, and folded constants (exponents, epsilons, rotary
        tables, masks) are neither. Entries may be shell-style patterns: ``["decoder.*", "*.bias"]``.
    frozen : collection of str, optional
        Names or shell-style patterns of parameters that are not trained (a frozen backbone in
        fine-tuning): no weight gradient, no optimizer update, and no input gradient through
        layers before the first trained one. Reported as buffers. Applied after ``trainable``.
    convention : ``"default"``, ``"table3"``, ... or a :class:`~flopcount.conventions.Convention`
        See :mod:`flopcount.conventions`.
    attention : ``"full"``, ``"executed"``, or an :class:`~flopcount.masks.AttentionMask` (or one per attention)
        ``"full"`` counts the whole score matrix, as the graph computes it. ``"executed"`` counts only the
        (query, key) pairs a masked kernel runs, for the masks whose structure the graph shows (the Attention
        operator's ``is_causal`` and windows; a mask built from position ranges, comparisons, a Trilu and the
        ``input_values`` given, see :mod:`flopcount.pipeline.graph_masks`); a mask that is data counts full, and
        ``report.attention`` says which. A mask given (a frontend reads it from the model's configuration) is
        executed-mode with that structure for the eager attentions, in graph order (see :mod:`flopcount.masks`).
    strict : bool
        Raise :class:`~flopcount.errors.UnsupportedOperatorError` when any operator has no formula.
    free_ops : collection of str
        Operator types the user knows cost nothing (a custom marker or debug op), as ``OP`` or ``DOMAIN:OP``
        (``"com.example:Marker"``): where no formula is registered for them they are counted as zero-cost
        instead of unsupported, so ``strict`` passes. An operator that has a formula keeps it.
    memory : bool or :class:`~flopcount.memory.ledger.MemorySettings`, optional
        Also the memory ledger (``report.memory``): weights, gradients, optimizer states and their step's
        temporaries, the activations the backward keeps and the peak of one step (see :mod:`flopcount.memory.ledger`).
        ``True``: the default settings. Kept as :class:`~flopcount.memory.ledger.MemorySettings` (None without it).
    recompute : ``"none"``, ``"full"``, ``"non-reentrant"``, ``"selective"``, operator types (``"Softmax,Gelu"``) \
or a :class:`~flopcount.parallel.plan.Recompute`, optional
        With ``mode="train"`` and ``memory`` or ``parallel``: what the backward recomputes instead of keeping
        (see :mod:`flopcount.parallel.plan`): ``full`` each layer's whole forward (Megatron, torch's reentrant
        checkpoint), ``non-reentrant`` the same up to its last saved tensor (torch's non-reentrant checkpoint).
        Kept as a :class:`~flopcount.parallel.plan.Recompute`; it is the memory ledger's policy too.
    parallel : plan text (``"tp=2,pp=4,dp=8,sp"``) or a :class:`~flopcount.parallel.plan.ParallelPlan`, optional
        Also the ledger per rank of the plan (``report.parallel``: FLOPs, redundant work, communication and the
        pipeline's bubble; with ``memory``, ``report.memory`` per rank), as ``flopcount --parallel`` gives it
        (docs/parallel.md). Kept as a :class:`~flopcount.parallel.plan.ParallelPlan`.
    microbatches : int, optional
        With ``parallel``: microbatches per optimizer step (default 1); sets the plan's.
    schedule : ``"gpipe"``, ``"1f1b"`` or ``"interleaved[:V]"``, optional
        With ``parallel``: the pipeline schedule (default ``1f1b``); sets the plan's.
    expert_load : path of a JSON file, or a :class:`~flopcount.parallel.experts.ExpertLoad`, optional
        With ``parallel`` on a mixture-of-experts model: tokens per routed expert (default: balanced). Read when
        the record is made; on a model without routed experts it is an error (it would do nothing).
    token_dispatcher : ``"alltoall"`` or ``"allgather"``, optional
        With ``parallel`` on a mixture-of-experts model: Megatron-Core's token dispatcher the ledgers run
        (``--moe-token-dispatcher-type``; see :mod:`flopcount.parallel.experts`); default: ``allgather`` under
        ep = 1, ``alltoall`` under ep > 1. Sets the plan's; on a model without routed experts it is an error.
    """

    input_shapes: Mapping[str, Sequence[int]] | None = option(None, Flag(
        "--input-shape", "shapes", "fix the dims of an input, e.g. input=8x3x224x224 (repeatable); with --torch, NAME "
        "is a parameter of forward() and a :DTYPE suffix gives its element type, e.g. input_ids=1x128:int64",
        reader="input_shape", action="input_shapes", metavar="NAME=DIMS", dest="input_shape", default=[]))
    batch: int | None = option(None, Flag(
        "--batch", "shapes", "set dim 0 of every input not given by --input-shape; per-sample figures divide by it",
        reader="positive", metavar="N"))
    convention: Any = option("default", Flag(
        "--convention", "counting", "counting convention: default (1 MAC = 2 FLOPs), table3 (HPC AI500 V3.0 Table 3 "
        "literally), aiperf (AIPerf's weighted costs), dense (products only, as torch.utils.flop_counter), macs "
        "(1 per MAC)", choices=_conventions))
    strict: bool = option(False, Flag(
        "--strict", "counting", "fail (exit 6) when any operator has no formula", action="store_true"))
    input_values: Mapping[str, Any] | None = option(None, Flag(
        "--input-value", "shapes", "value of a small integer input that shapes depend on (axes, sizes), e.g. "
        "axes=1,2 (repeatable)", reader="input_value", action="pairs", metavar="NAME=V1,V2"))
    loop_trips: Mapping[str, int] | None = option(None, Flag(
        "--loop-trips", "shapes", "trip count of a Loop (or sequence length of a SequenceMap) the graph does not fix "
        "(repeatable)", reader="loop_trips", action="pairs", metavar="NODE=N"))
    mode: str = option("inference", Flag(
        "--mode", "counting", "train: add the backward pass (gradients of inputs and trainable parameters)",
        choices=MODES))
    optimizer: str | None = option(None, Flag(
        "--optimizer", "counting", "with --mode train: also the optimizer step's FLOPs, reported apart (and its "
        "states and temporaries with --memory)", choices=tuple(OPTIMIZERS)))
    trainable_inputs: Sequence[str] | None = option(None, Flag(
        "--trainable-input", "counting", "with --mode train: a floating-point input that is trained, not data (its "
        "gradient is counted, and it is updated like a parameter); repeatable", action="append", metavar="NAME",
        dest="trainable_inputs"))
    trainable: Collection[str] | None = option(None, Flag(
        "--trainable", "counting", "with --mode train: the weights that are trained, by name or shell pattern (e.g. "
        "'decoder.*'; repeatable); the others are not trained (default: the framework's trainable parameters with "
        "--torch/--keras, else every tensor the graph uses as a weight)", action="append", metavar="PATTERN"))
    frozen: Collection[str] | None = option(None, Flag(
        "--frozen", "counting", "with --mode train: weights that are not trained, by name or shell pattern (e.g. "
        "'backbone.*'; repeatable): no weight gradient, no update, no backward below the first trained layer",
        action="append", metavar="PATTERN"))
    attention: Any = option("full", Flag(
        "--attention", "counting", "full (default): attention as the graph computes it, the whole score matrix "
        "masked afterwards; executed: only the (query, key) pairs a masked kernel runs, for the masks whose "
        "structure is known (the Attention op's is_causal and windows, a Trilu, or --hf's configuration: causal, "
        "sliding windows); a mask that is data counts full, and the report says which", choices=ATTENTION_MODES))
    memory: Any = option(None, Flag(
        "--memory", "plan", "also the memory of one step per rank: weights, gradients, optimizer states and the "
        "step's temporaries, the activations the backward keeps, the peak and its phase (KV cache with --generate); "
        "see docs/memory.md", action="store_true"))
    free_ops: Collection[str] = option((), Flag(
        "--free-op", "counting", "an operator type with no formula that costs nothing (a custom marker op), OP or "
        "DOMAIN:OP: counted as zero-cost, not unsupported (--strict then passes); repeatable", action="append",
        metavar="OP"), check=_check_free_ops)
    recompute: Any = option(None, Flag(
        "--recompute", "plan", "with --memory or --parallel, and --mode train: none (default), full (every "
        "numbered layer's whole forward again: Megatron, torch's reentrant checkpoint), non-reentrant (the same up "
        "to the layer's last saved tensor: torch's non-reentrant checkpoint), selective (the attention core), or "
        "operator types to recompute (OP,OP)",
        metavar="POLICY"))
    parallel: Any = option(None, Flag(
        "--parallel", "plan", "a parallel plan, tp=T,pp=P,cp=C,ep=E,dp=D[,sp[=torch|megatron]][,fsdp|zero1|zero2] "
        "(degrees left out are 1): FLOPs, redundant work and communication bytes per rank of a decoder, dense or MoE "
        "(docs/parallel.md; with --generate, the prefill and decode steps per rank), and with --memory the memory "
        "per rank", metavar="PLAN"))
    microbatches: int | None = option(None, Flag(
        "--microbatches", "plan", f"{_WITH_PARALLEL}: microbatches per optimizer step (default 1)",
        reader="positive_int", metavar="M"))
    schedule: str | None = option(None, Flag(
        "--schedule", "plan", f"{_WITH_PARALLEL}: the pipeline schedule, one of {', '.join(SCHEDULES)} "
        "(interleaved:V for V virtual stages per rank; default 1f1b)", metavar="NAME"))
    expert_load: Any = option(None, Flag(
        "--expert-load", "plan", "with --parallel ep=E on a mixture-of-experts model: JSON tokens per routed expert, "
        "one list for all MoE layers or one list per MoE layer (default: balanced); see docs/parallel.md",
        metavar="FILE"))
    token_dispatcher: str | None = option(None, Flag(
        "--token-dispatcher", "plan", "with --parallel on a mixture-of-experts model: Megatron-Core's token "
        "dispatcher, alltoall (tokens sent over the EP group) or allgather (tokens gathered over the T·E ranks of "
        "tp_ep); default allgather under ep=1, alltoall under ep>1; see docs/parallel.md",
        choices=DISPATCHERS))

    def __post_init__(self) -> None:
        checked = {f.name: getattr(self, f.name) for f in dataclasses.fields(CountArguments)}
        check_count_arguments(CountArguments(**checked))
        self._check_counting()
        self._check_given()
        self._normalize()
        if self.recompute is not None and self.recompute.policy != "none" and self.mode != "train":
            raise UsageError(f"--recompute {self.recompute}: recompute changes training only; give --mode train "
                             "(mode='train')")

    def _check_counting(self) -> None:
        from .conventions import get_convention

        get_convention(self.convention)
        if isinstance(self.attention, str) and self.attention not in ATTENTION_MODES:
            raise UsageError(f"unknown attention {self.attention!r}; choose one of: {', '.join(ATTENTION_MODES)}")
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise UsageError(f"unknown mode {self.mode!r}; choose one of: {', '.join(MODES)}")
        if self.optimizer is not None and (self.mode != "train" or self.optimizer not in OPTIMIZERS):
            raise UsageError(
                f"optimizer {self.optimizer!r}: give one of {', '.join(OPTIMIZERS)}, with mode='train' "
                "(--mode train)")
        bad_trips = {k: v for k, v in (self.loop_trips or {}).items()
                     if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_ELEMENTS}
        if bad_trips:
            raise UsageError(f"loop_trips must be non-negative integers of at most 2**48; got {bad_trips}")
        for field in dataclasses.fields(self):  # the checks declared with the fields
            if "check" in field.metadata:
                field.metadata["check"](getattr(self, field.name))

    def _normalize(self) -> None:
        """One spelling per setting, so that equal settings make equal records: no mapping or list left empty for
        None, lists as tuples, the memory, recompute and plan settings as their records."""
        for name in ("input_values", "loop_trips"):
            value = getattr(self, name)
            object.__setattr__(self, name, MappingProxyType(dict(value)) if value else None)
        if self.input_shapes is not None:
            object.__setattr__(self, "input_shapes", MappingProxyType(
                {k: tuple(v) if isinstance(v, list) else v for k, v in self.input_shapes.items()}))
        object.__setattr__(self, "trainable_inputs", tuple(self.trainable_inputs) if self.trainable_inputs else None)
        for name in ("trainable", "frozen"):
            value = getattr(self, name)
            object.__setattr__(self, name, tuple(value) if value is not None else None)
        object.__setattr__(self, "free_ops", tuple(dict.fromkeys(self.free_ops)))
        object.__setattr__(self, "recompute", _recompute(self.recompute))
        object.__setattr__(self, "memory", _memory(self.memory, self.recompute))
        object.__setattr__(self, "parallel", _plan(self.parallel, self.microbatches, self.schedule,
                                                   self.token_dispatcher))
        object.__setattr__(self, "expert_load", _expert_load(self.expert_load))

    def _check_given(self) -> None:
        """The settings of a plan given where they would do nothing are refused, naming them."""
        if self.parallel is None:
            for name in ("microbatches", "schedule", "expert_load", "token_dispatcher"):
                if getattr(self, name) is not None:
                    flag = "--" + name.replace("_", "-")
                    raise UsageError(f"{flag} needs --parallel ({name} describes a parallel plan: give parallel= "
                                     "too, or leave it out)")
        if self.recompute is not None and (self.memory is None or self.memory is False) and self.parallel is None:
            raise UsageError("--recompute needs --memory (the memory ledger) or --parallel (FLOPs per rank)")

    def keywords(self) -> dict[str, Any]:
        """The settings as the keywords of :func:`flopcount.count` (what a frontend passes on)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


def flags() -> dict[str, Flag]:
    """Field name → :class:`Flag` of every setting the command line takes, in the record's order; a flag's
    ``default`` is the field's where the flag gives none and the field's is one value (not a collection, which an
    ``append`` flag would extend)."""
    out = {}
    for field in dataclasses.fields(CountOptions):
        flag = field.metadata.get("flag")
        if flag is None:
            continue
        if flag.default is None and isinstance(field.default, (str, bool, int)):
            flag = dataclasses.replace(flag, default=field.default)
        out[field.name] = flag
    return out


#: The flags of :class:`~flopcount.memory.ledger.MemorySettings`' fields, by field name: the command line folds
#: them into ``memory`` (with ``--memory``; ``--master-weights`` without it is an error).
MEMORY_FLAGS: Mapping[str, Flag] = MappingProxyType({
    "implementation": Flag(
        "--optimizer-impl", "plan", "with --memory: how the optimizer step runs (its temporaries): single-tensor, "
        "foreach, fused; auto (default): what torch picks on --memory-device",
        choices=IMPLEMENTATIONS, dest="optimizer_impl", default="auto"),
    "device": Flag(
        "--memory-device", "plan", "with --memory: the device the step runs on, for --optimizer-impl auto (default "
        "cuda)", choices=DEVICES, dest="memory_device", default="cuda"),
    "master_weights": Flag(
        "--master-weights", "plan", "with --memory: the optimizer keeps an fp32 master copy of 16-bit weights and "
        "fp32 states (mixed precision as Megatron and DeepSpeed train)", action="store_true", default=False),
    "device_memory": Flag(
        "--device-memory", "plan", "with --memory: the memory of each device, a size (80GiB, 94GB, bytes) or a "
        "device of the peak table (H100: its datasheet's memory); the peak per rank is compared with it",
        reader="device_memory", metavar="SIZE|DEVICE", dest="device_memory"),
})


def _recompute(value: Any):
    if value is None:
        return None
    from .parallel.plan import Recompute, parse_recompute

    if not isinstance(value, (str, Recompute)):
        raise UsageError(f"count: recompute must be 'none', 'full', 'non-reentrant', 'selective', operator types "
                         f"('Softmax,Gelu') or a flopcount.Recompute, got {described(value)}")
    return parse_recompute(value)


def _memory(value: Any, recompute: Any):
    """``memory`` as :class:`~flopcount.memory.ledger.MemorySettings` (None without it), with ``recompute`` as its
    policy where given."""
    if value is None or value is False:
        return None
    from .memory.ledger import MemorySettings

    settings = MemorySettings.of(value)
    if recompute is None or settings.recompute == recompute:
        return settings
    if settings.recompute.policy != "none":
        raise UsageError(f"count: recompute={str(recompute)!r} and memory's recompute {str(settings.recompute)!r} "
                         "differ; give the policy once, as recompute=")
    return dataclasses.replace(settings, recompute=recompute)


def _plan(value: Any, microbatches: Any, schedule: Any, dispatcher: Any = None):
    """``parallel`` as a :class:`~flopcount.parallel.plan.ParallelPlan` (None without it), its microbatches,
    schedule and token dispatcher set from ``microbatches``, ``schedule`` and ``dispatcher`` where given."""
    from .parallel.plan import ParallelPlan, parse_parallel, parse_schedule

    if microbatches is not None and (isinstance(microbatches, bool) or not isinstance(microbatches, int)):
        raise UsageError(f"count: microbatches must be a positive int, got {described(microbatches)}")
    if schedule is not None and not isinstance(schedule, str):
        raise UsageError(f"count: schedule must be text such as '1f1b' or 'interleaved:2', got {described(schedule)}")
    if dispatcher is not None and (not isinstance(dispatcher, str) or dispatcher not in DISPATCHERS):
        raise UsageError(f"count: token_dispatcher must be one of {', '.join(map(repr, DISPATCHERS))} "
                         f"(--token-dispatcher), got {described(dispatcher)}")
    if value is None:
        return None
    if isinstance(value, str):
        plan = parse_parallel(value, 1 if microbatches is None else microbatches,
                              "1f1b" if schedule is None else schedule)
        return dataclasses.replace(plan, token_dispatcher=dispatcher) if dispatcher is not None else plan
    if not isinstance(value, ParallelPlan):
        raise UsageError(f"count: parallel must be a plan such as 'tp=2,pp=4,dp=8' or a flopcount.ParallelPlan, "
                         f"got {described(value)}")
    changes: dict[str, Any] = {}
    if microbatches is not None:
        changes["microbatches"] = microbatches
    if schedule is not None:
        changes["schedule"], changes["virtual_stages"] = parse_schedule(schedule)
    if dispatcher is not None:
        changes["token_dispatcher"] = dispatcher
    return dataclasses.replace(value, **changes) if changes else value


def _expert_load(value: Any):
    if value is None:
        return None
    from .parallel.experts import ExpertLoad, load_expert_load

    if isinstance(value, ExpertLoad):
        return value
    if not isinstance(value, (str, os.PathLike)):
        raise UsageError(f"count: expert_load must be the path of a JSON file of token counts per expert, or a "
                         f"flopcount.parallel.experts.ExpertLoad, got {described(value)}")
    return load_expert_load(value)
