"""Argument types and the model source that every ``flopcount`` command shares.

An argument type turns one command-line word into a value or raises :class:`argparse.ArgumentTypeError`
(argparse then prints one usage line and exits 2). A command's model is an ``.onnx`` path, or ``--torch`` /
``--keras`` with ``--input-shape``: :func:`add_model_source` declares it, :func:`model_source_problem` checks it,
:func:`model_source` reads it back, :func:`count_torch` and :func:`count_keras` count it.
"""

from __future__ import annotations

import argparse
import re

from flopcount.errors import UsageError

__all__ = [
    "TORCH_DTYPES", "InputShapes", "add_count_options", "add_memory_arguments", "add_parallel_arguments", "add_model_source",
    "check_generation_flags", "check_model_source", "count_generate", "count_hf", "count_keras", "count_source", "count_torch", "generate_spec",
    "given_model", "input_shape", "input_value", "loop_trips", "model_source", "model_source_problem",
    "options_from_args", "nonneg_int",
    "memory_settings", "positive", "positive_float", "positive_int", "size_hw", "torch_inputs", "weights", "with_parallel",
]

#: Element types a ``--torch`` input may be given (``--input-shape input_ids=1x128:int64``): torch's dtype names.
TORCH_DTYPES = (
    "float32", "float", "float64", "double", "float16", "half", "bfloat16", "int64", "long", "int32", "int",
    "int16", "short", "int8", "uint8", "bool", "complex64", "complex128",
)


# ---------------------------------------------------------------------------------------------------------------
# argument types


def input_shape(text: str) -> tuple[str, tuple[int, ...], str | None]:
    """``NAME=DIMS[:DTYPE]`` → ``(NAME, DIMS, DTYPE or None)``."""
    name, sep, spec = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=DIMS such as input=8x3x224x224, got {text!r}")
    from flopcount.pipeline.shapes import parse_dims  # imported when a shape is parsed, not for --help

    dims, colon, dtype = spec.partition(":")
    if colon and dtype not in TORCH_DTYPES:
        raise argparse.ArgumentTypeError(f"unknown element type {dtype!r} in {text!r}; one of: {', '.join(TORCH_DTYPES)}")
    try:
        return name, parse_dims(dims), dtype or None
    except UsageError as e:
        if not re.search(r"[A-Za-z_]", dims):
            raise argparse.ArgumentTypeError(str(e)) from None
    try:  # dims given as names (input_ids=BxS): for --symbolic and --sweep, refused elsewhere
        from flopcount.derived.symbolic import parse_symbolic_dims

        return name, parse_symbolic_dims(dims), dtype or None
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class InputShapes(argparse.Action):
    """``--input-shape NAME=DIMS[:DTYPE]``: appends ``(NAME, DIMS)`` to ``input_shape`` and records DTYPE in
    ``input_dtypes``."""

    def __call__(self, parser, namespace, values, option_string=None):
        name, dims, dtype = values
        namespace.input_shape = [*(namespace.input_shape or []), (name, dims)]
        if dtype is not None:
            namespace.input_dtypes = {**(getattr(namespace, "input_dtypes", None) or {}), name: dtype}


def generate_spec(text: str) -> tuple[int, int]:
    """``P:N`` → ``(P, N)``, prompt tokens and new tokens, both at least 1."""
    from flopcount.reporting.generation import parse_generate

    try:
        return parse_generate(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("--generate: ").removeprefix("generate: ")) from None


def input_value(text: str) -> tuple[str, list[int]]:
    """``NAME=V1,V2,...`` → ``(NAME, [V1, V2, ...])``, 64-bit integers."""
    name, sep, values = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=V1,V2,... such as axes=1,2, got {text!r}")
    try:
        ints = [int(v) for v in values.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"values must be integers joined by ',', got {values!r}") from None
    if any(not -(2**63) <= v < 2**63 for v in ints):
        raise argparse.ArgumentTypeError(f"values must fit in 64-bit integers, got {values!r}")
    return name, ints


def loop_trips(text: str) -> tuple[str, int]:
    """``NODE=N`` → ``(NODE, N)``, N a positive count."""
    name, sep, n = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NODE=N such as decoder_loop=32, got {text!r}")
    return name, positive(n)


def positive(text: str) -> int:
    """A positive count that may size a tensor (at most 2**48)."""
    from flopcount.pipeline.shapes import MAX_ELEMENTS

    try:
        v = int(text)
    except ValueError:
        v = 0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    if v > MAX_ELEMENTS:
        raise argparse.ArgumentTypeError(f"must be at most 2**48 = {MAX_ELEMENTS}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    """A positive count of runs, steps or samples (at most 1e9)."""
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v <= 0 or v > 10**9:
        raise argparse.ArgumentTypeError(f"must be a positive integer (at most 1e9), got {text!r}")
    return v


def nonneg_int(text: str) -> int:
    """An integer from 0 to 1e9 (a seed, a number of warm-up steps)."""
    try:
        v = int(text)
    except ValueError:
        v = -1
    if v < 0 or v > 10**9:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return v


def positive_float(text: str) -> float:
    """A finite positive number (a rate, a quality, a peak)."""
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if not v > 0 or v == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return v


def size_hw(text: str) -> tuple[int, int]:
    """``HxW`` → ``(H, W)``, both positive."""
    parts = text.lower().split("x")
    try:
        h, w = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected HxW such as 224x224, got {text!r}") from None
    if h <= 0 or w <= 0:
        raise argparse.ArgumentTypeError(f"expected positive HxW, got {text!r}")
    return h, w


# ---------------------------------------------------------------------------------------------------------------
# the model source


def add_model_source(p: argparse.ArgumentParser, model_help: str) -> None:
    """A subcommand's model: an .onnx path, or ``--torch``/``--keras`` with ``--input-shape`` as for counting (read
    back with :func:`model_source`), listed by ``--help`` under "model source"."""
    source = p.add_argument_group("model source")
    source.add_argument("model", nargs="?", help=model_help)
    source.add_argument("--torch", metavar="MODULE:FACTORY",
                        help="instead of a model file, the PyTorch module FACTORY() returns, exported as for counting")
    source.add_argument("--keras", metavar="MODULE:FACTORY",
                        help="instead of a model file, the keras.Model FACTORY() returns, converted as for counting")
    source.add_argument("--input-shape", metavar="NAME=DIMS", action=InputShapes, type=input_shape, default=[],
                        help="fix the dims of an input, e.g. input=8x3x224x224 (repeatable); with --torch, NAME is a "
                        "parameter of forward() and a :DTYPE suffix gives its element type")
    p.set_defaults(input_dtypes={})


def given_model(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) is not None for k in ("model", "torch", "keras"))


def torch_inputs(args: argparse.Namespace, batch: int | None = None) -> dict:
    """``--input-shape`` of a ``--torch`` module by forward() parameter name: dims, or ``(dims, dtype)`` where a
    :DTYPE was given; ``batch`` (when given) replaces dim 0 of each."""
    inputs = {}
    for name, dims in args.input_shape:
        dims = dims if batch is None else (batch, *dims[1:])
        inputs[name] = (dims, args.input_dtypes[name]) if name in args.input_dtypes else dims
    return inputs


def model_source(args: argparse.Namespace):
    """``(model, input_shapes)`` of a subcommand: the path and its ``--input-shape`` dims, or the weightless ONNX
    export of ``--torch``/``--keras``/``--hf`` (its dims fixed by the export) and no dims."""
    source, options = options_from_args(args)
    return source.to_onnx(options.batch), dict(options.input_shapes or {})


def options_from_args(args: argparse.Namespace):
    """The :class:`~flopcount.frontends.source.ModelSource` and :class:`~flopcount.options.CountOptions` of a command's
    arguments, built once (a subcommand without a counting flag gets its default): a problem of
    :func:`model_source_problem` or of a setting is a :class:`UsageError` naming it."""
    import dataclasses

    from flopcount.frontends.source import ModelSource
    from flopcount.options import CountOptions

    problem = model_source_problem(args)
    if problem:
        raise UsageError(problem)
    kind = next((k for k in ("torch", "keras", "hf") if getattr(args, k, None) is not None), "onnx")
    shapes = dict(args.input_shape)
    source = ModelSource(kind, args.model if kind == "onnx" else getattr(args, kind),
                         inputs={"onnx": None, "keras": shapes}.get(kind, torch_inputs(args)),
                         trust_remote_code=getattr(args, "trust_remote_code", False),
                         capacity_factor=getattr(args, "capacity_factor", None),
                         repeated_layers=getattr(args, "repeated_layers", "extend"),
                         generate=getattr(args, "generate", None))
    named = any(isinstance(d, str) for dims in shapes.values() for d in dims)  # --symbolic/--sweep fill them in
    settings = dict(input_shapes=shapes if kind == "onnx" and not named else None, batch=getattr(args, "batch", None),
                    convention=getattr(args, "convention", "default"), strict=getattr(args, "strict", False),
                    input_values=dict(getattr(args, "input_value", ())), loop_trips=dict(getattr(args, "loop_trips", ())),
                    mode=getattr(args, "mode", "inference"), optimizer=getattr(args, "optimizer", None),
                    trainable_inputs=getattr(args, "trainable_input", None), attention=getattr(args, "attention", "full"),
                    **weights(args), **memory_settings(args))
    for field in dataclasses.fields(CountOptions):  # the settings whose flag the record itself declares
        if "flag" in field.metadata and getattr(args, field.name, None) is not None:
            settings[field.name] = getattr(args, field.name)
    return source, CountOptions(**settings)


def add_count_options(p) -> None:
    """The flags that :class:`~flopcount.options.CountOptions` declares on its fields (``metadata["flag"]``), in
    argument group ``p``; :func:`options_from_args` reads them back by the field's name."""
    import dataclasses

    from flopcount.options import CountOptions

    for field in dataclasses.fields(CountOptions):
        if "flag" in field.metadata:
            keywords = {k: v for k, v in field.metadata.items() if k != "flag"}
            p.add_argument(field.metadata["flag"], dest=field.name, **keywords)


def model_source_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the model a command was given, or None: exactly one of a model path, ``--torch`` and
    ``--keras``; ``--torch`` needs ``--input-shape``; a :DTYPE suffix only with ``--torch``."""
    hf = getattr(args, "hf", None)
    given = [text for text, value in ((repr(args.model), args.model), (f"--torch {args.torch}", args.torch),
                                      (f"--keras {args.keras}", args.keras), (f"--hf {hf}", hf)) if value is not None]
    if len(given) > 1:
        if hf is not None:
            return f"give one model: a path, --torch, --keras or --hf, not both (got {' and '.join(given)})"
        return f"give a model path, --torch or --keras, not both (got {' and '.join(given)})"
    if not given:
        return ("give the path of an .onnx model, or --torch MODULE:FACTORY, --keras MODULE:FACTORY or --hf CONFIG"
                if hasattr(args, "hf") else
                "give the path of an .onnx model, or --torch MODULE:FACTORY, or --keras MODULE:FACTORY")
    if getattr(args, "capacity_factor", None) is not None and hf is None:
        return "--capacity-factor is for a mixture-of-experts model given with --hf CONFIG"
    generate = getattr(args, "generate", None)
    if generate is not None and hf is None and args.torch is None:
        return "--generate is for a causal LM given with --hf CONFIG or --torch MODULE:FACTORY"
    if generate is not None and getattr(args, "mode", "inference") == "train":
        return "--generate counts inference; leave out --mode train"
    if generate is not None:
        names = [name for name, _ in args.input_shape if name != "input_ids"]
        if names:
            return (f"--generate feeds input_ids only (batch from --batch or --input-shape input_ids=BxS); "
                    f"leave out --input-shape {', '.join(names)}")
        return None
    if hf is not None and not args.input_shape:
        return "--hf needs the shape of each forward() input, by name: --input-shape input_ids=1x2048 (repeatable)"
    names = [name for name, _ in args.input_shape]
    named = [f"{name}={'x'.join(map(str, dims))}" for name, dims in args.input_shape
             if any(isinstance(d, str) for d in dims)]
    if named and getattr(args, "symbolic", None) is None and not getattr(args, "sweep", None):
        return (f"--input-shape {named[0]}: a dim given as a name is for a formula (--symbolic) or a list of sizes "
                "(--sweep NAME=V1,V2,...); otherwise give every dim as a positive integer")
    if args.keras is not None and len(set(names)) != len(names):
        return f"--keras: each --input-shape names one model input; got {', '.join(names)}"
    if args.torch is not None and not args.input_shape:
        return "--torch needs the shape of each forward() input, by name: --input-shape NAME=DIMS[:DTYPE] (repeatable)"
    if args.torch is not None and len(set(names)) != len(names):
        return f"--torch: each --input-shape names one forward() input; got {', '.join(names)}"
    if args.torch is None and hf is None and args.input_dtypes:
        given = ", ".join(f"{name}=...:{dtype}" for name, dtype in args.input_dtypes.items())
        return (f"--input-shape {given}: a :DTYPE suffix is for --torch inputs; "
                f"{'a Keras model' if args.keras else 'an ONNX model'} declares its input types, give NAME=DIMS")
    return None


def check_model_source(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A problem of :func:`model_source_problem` as a usage error of ``parser`` (one line, exit 2)."""
    problem = model_source_problem(args)
    if problem:
        parser.error(problem)


def count_torch(args: argparse.Namespace):
    """Export the module of ``--torch`` (in training mode with ``--mode train``) and count it."""
    return count_source(args)


def count_hf(args: argparse.Namespace):
    """Build the transformers model of ``--hf`` on the meta device and count it."""
    return count_source(args)


def count_generate(args: argparse.Namespace):
    """Count ``generate()`` of ``--generate P:N`` for the causal LM of ``--hf`` or ``--torch``."""
    return count_source(args)


def count_keras(args: argparse.Namespace):
    """Convert the model of ``--keras`` (in training mode with ``--mode train``) and count it."""
    return count_source(args)


def count_source(args: argparse.Namespace):
    """The report of the model of ``args`` under its settings (:func:`options_from_args`)."""
    source, options = options_from_args(args)
    return source.count(options)


def weights(args: argparse.Namespace) -> dict:
    """``trainable=`` and ``frozen=`` of count() from ``--trainable`` and ``--frozen`` (absent when not given)."""
    return {k: v for k in ("trainable", "frozen") if (v := getattr(args, k, None))}


def add_memory_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of the memory ledger and of the run's layout (``flopcount MODEL --memory ...``)."""
    from flopcount.parallel.plan import DEVICES, IMPLEMENTATIONS

    p.add_argument("--memory", action="store_true",
                   help="also the memory of one step per rank: weights, gradients, optimizer states and the step's "
                   "temporaries, the activations the backward keeps, the peak and its phase (KV cache with "
                   "--generate); see docs/memory.md")
    p.add_argument("--optimizer-impl", choices=IMPLEMENTATIONS, default="auto",
                   help="with --memory: how the optimizer step runs (its temporaries): single-tensor, foreach, fused; "
                   "auto (default): what torch picks on --memory-device")
    p.add_argument("--memory-device", choices=DEVICES, default="cuda",
                   help="with --memory: the device the step runs on, for --optimizer-impl auto (default cuda)")
    p.add_argument("--master-weights", action="store_true",
                   help="with --memory: the optimizer keeps an fp32 master copy of 16-bit weights and fp32 states "
                   "(mixed precision as Megatron and DeepSpeed train)")
    add_parallel_arguments(p)


def add_parallel_arguments(p: argparse.ArgumentParser, parallel_help: str | None = None) -> None:
    """The flags of a parallel plan and its recompute policy (``flopcount MODEL --parallel``, ``flopcount bench
    --parallel``, which says what the plan gives with ``parallel_help``)."""
    from flopcount.parallel.plan import SCHEDULES

    p.add_argument("--recompute", metavar="POLICY", default=None,
                   help="with --memory or --parallel, and --mode train: none (default), full (checkpoint every "
                   "numbered layer), selective (recompute the attention core), or operator types to recompute (OP,OP)")
    p.add_argument("--parallel", metavar="PLAN",
                   help=parallel_help or "a parallel plan, tp=T,pp=P,cp=C,ep=E,dp=D[,sp][,fsdp|zero1|zero2] (degrees left out "
                   "are 1): FLOPs, redundant work and communication bytes per rank of a decoder, dense or MoE "
                   "(docs/parallel.md; with --generate, the prefill and decode steps per rank), and with --memory the memory per rank")
    if parallel_help is None:  # the count's flags (bench's plans are data-parallel: no experts to load)
        p.add_argument("--expert-load", metavar="FILE", default=None,
                       help="with --parallel ep=E on a mixture-of-experts model: JSON tokens per routed expert, one "
                       "list for all MoE layers or one list per MoE layer (default: balanced); see docs/parallel.md")
    p.add_argument("--microbatches", type=positive_int, default=1, metavar="M",
                   help="with --parallel: microbatches per optimizer step (default 1)")
    p.add_argument("--schedule", default="1f1b", metavar="NAME",
                   help=f"with --parallel: the pipeline schedule, one of {', '.join(SCHEDULES)} (interleaved:V for V "
                   "virtual stages per rank; default 1f1b)")


def with_parallel(report, args: argparse.Namespace):
    """``report`` with its per-rank FLOP ledger (:mod:`flopcount.parallel.ranks`) when ``--parallel`` is given, from the
    same plan and recompute flags as the memory ledger's, and its memory ledger per rank
    (:mod:`flopcount.memory.ranks`) with ``--memory``. Python's cyclic collector is paused meanwhile (the ledgers
    make no reference cycles, and a full collection set off by their objects would rescan every object of the
    export: :func:`flopcount.memory.ledger.without_cyclic_gc`)."""
    if not getattr(args, "parallel", None):
        return report
    from flopcount.memory.ledger import without_cyclic_gc

    return without_cyclic_gc(_with_plan)(report, args)


def _with_plan(report, args: argparse.Namespace):
    import dataclasses

    from flopcount.parallel.experts import load_expert_load
    from flopcount.parallel.plan import parse_parallel, parse_recompute
    from flopcount.parallel.ranks import ledger

    plan = parse_parallel(args.parallel, args.microbatches, args.schedule)
    if getattr(args, "generate", None) is not None:
        check_generation_flags(args)
    load = load_expert_load(getattr(args, "expert_load", None))
    if getattr(args, "generate", None) is None:
        report = dataclasses.replace(report, parallel=ledger(report, plan, parse_recompute(args.recompute), load))
    else:  # the prefill and decode steps per rank (flopcount.parallel.generation)
        from flopcount.parallel.generation import generation_ledger

        report = dataclasses.replace(report, parallel=generation_ledger(report, plan, load))
    if report.memory is not None and not plan.is_single:
        from flopcount.memory.ranks import per_rank

        report = dataclasses.replace(report, memory=per_rank(report, plan, load))
    return report


def check_generation_flags(args: argparse.Namespace) -> None:
    """Exit 2 for the flags of ``--generate --parallel`` that generation does not take: the plan's parts not modelled
    (:func:`flopcount.parallel.generation.check_plan`) and ``--recompute``."""
    from flopcount.errors import UsageError
    from flopcount.parallel.generation import check_plan
    from flopcount.parallel.plan import parse_parallel, parse_recompute

    if parse_recompute(getattr(args, "recompute", None)).policy != "none":
        raise UsageError(f"--recompute {args.recompute}: recompute changes training only; leave it out with "
                         "--generate")
    check_plan(parse_parallel(args.parallel, getattr(args, "microbatches", 1), getattr(args, "schedule", "1f1b")))


def memory_settings(args: argparse.Namespace) -> dict:
    """``memory=`` of count() from the memory flags: absent without ``--memory``; the plan and recompute policy
    are checked either way (exit 2 naming the bad part). The count's ledger is one rank's; :func:`with_parallel`
    splits it per rank of the plan."""
    from flopcount.errors import UsageError
    from flopcount.parallel.plan import ParallelPlan, parse_parallel, parse_recompute

    plan = parse_parallel(args.parallel, getattr(args, "microbatches", 1), getattr(args, "schedule", "1f1b")) \
        if getattr(args, "parallel", None) else ParallelPlan()
    recompute = parse_recompute(getattr(args, "recompute", None))
    if getattr(args, "parallel", None) and getattr(args, "generate", None) is not None:
        check_generation_flags(args)  # before the count
    if not getattr(args, "memory", False):
        if getattr(args, "master_weights", False):
            raise UsageError("--master-weights needs --memory")
        if getattr(args, "expert_load", None) and not getattr(args, "parallel", None):
            raise UsageError("--expert-load needs --parallel (FLOPs per rank under expert parallelism)")
        if getattr(args, "recompute", None) and not getattr(args, "parallel", None):
            raise UsageError("--recompute needs --memory (the memory ledger) or --parallel (FLOPs per rank)")
        return {}
    if recompute.policy != "none" and args.mode != "train":
        raise UsageError(f"--recompute {recompute}: recompute changes training only; give --mode train")
    from flopcount.memory.ledger import MemorySettings  # only here: a count without --memory needs no ledger

    MemorySettings(plan=plan)  # cp and ep: exit 2 naming the flag
    return {"memory": MemorySettings(implementation=args.optimizer_impl, device=args.memory_device,
                                     master_weights=args.master_weights, recompute=recompute)}
