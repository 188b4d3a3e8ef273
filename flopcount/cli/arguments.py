"""Argument types, the count's flags and the model source that every ``flopcount`` command shares.

An argument type turns one command-line word into a value or raises :class:`argparse.ArgumentTypeError`
(argparse then prints one usage line and exits 2). The count's flags are declared once, in
:mod:`flopcount.options` (each setting's :class:`~flopcount.options.Flag`): :func:`add_options` adds those a command
takes, and :func:`options_from_args` reads them back by the field's name into a
:class:`~flopcount.options.CountOptions`, with the :class:`~flopcount.frontends.source.ModelSource` of the model a
command was given (an ``.onnx`` path, or ``--torch`` / ``--keras`` / ``--hf`` with ``--input-shape``:
:func:`add_model_source` declares it, :func:`model_source_problem` checks it, :func:`model_source` reads it back).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterable, Mapping

from flopcount.errors import UsageError

__all__ = [
    "READERS", "SOURCE_DEFAULTS", "TORCH_DTYPES", "InputShapes", "Pairs", "Parser", "add_model_source", "add_options",
    "add_verbosity", "check_model_source", "count_source", "generate_spec", "given_model", "input_shape", "input_value",
    "loop_trips", "model_source", "model_source_problem", "nonneg_int", "options_from_args", "positive",
    "positive_float", "positive_int", "size_hw", "torch_inputs",
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
    ints = [_integer(v) for v in values.split(",") if v.strip()]
    if None in ints:
        raise argparse.ArgumentTypeError(f"values must be integers joined by ',' (digits 0-9), got {values!r}")
    if any(not -(2**63) <= v < 2**63 for v in ints):
        raise argparse.ArgumentTypeError(f"values must fit in 64-bit integers, got {values!r}")
    return name, ints


def loop_trips(text: str) -> tuple[str, int]:
    """``NODE=N`` → ``(NODE, N)``, N a positive count."""
    name, sep, n = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NODE=N such as decoder_loop=32, got {text!r}")
    return name, positive(n)


def _integer(text: str) -> int | None:
    """The integer ``text`` spells in ASCII digits, else None (``int()`` reads other scripts' digits too)."""
    try:
        return int(text) if text.isascii() else None
    except ValueError:
        return None


def positive(text: str) -> int:
    """A positive count that may size a tensor (at most 2**48)."""
    from flopcount.pipeline.shapes import MAX_ELEMENTS

    v = _integer(text)
    if v is None or v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer (digits 0-9), got {text!r}")
    if v > MAX_ELEMENTS:
        raise argparse.ArgumentTypeError(f"must be at most 2**48 = {MAX_ELEMENTS}, got {text!r}")
    return v


def positive_int(text: str) -> int:
    """A positive count of runs, steps or samples (at most 1e9)."""
    v = _integer(text)
    if v is None or v <= 0 or v > 10**9:
        raise argparse.ArgumentTypeError(f"must be a positive integer (at most 1e9), got {text!r}")
    return v


def nonneg_int(text: str) -> int:
    """An integer from 0 to 1e9 (a seed, a number of warm-up steps)."""
    v = _integer(text)
    if v is None or v < 0 or v > 10**9:
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
    parts = [_integer(p) for p in text.lower().split("x")]
    if len(parts) != 2 or None in parts:
        raise argparse.ArgumentTypeError(f"expected HxW such as 224x224, got {text!r}")
    h, w = parts
    if h <= 0 or w <= 0:
        raise argparse.ArgumentTypeError(f"expected positive HxW, got {text!r}")
    return h, w


class Pairs(argparse.Action):
    """A repeatable ``NAME=VALUE`` flag whose reader gives ``(NAME, VALUE)``: gathered into a mapping (the last value
    of a name wins)."""

    def __call__(self, parser, namespace, values, option_string=None):
        name, value = values
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}), name: value})


class Parser(argparse.ArgumentParser):
    """Every command's parser: a bad word is one line, ``flopcount: error: ...`` and where ``--help`` says the rest,
    exit 2 (argparse's own usage block would run to 20 lines)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"flopcount: error: {' '.join(message.split())} (see {self.prog} --help)\n")


# ---------------------------------------------------------------------------------------------------------------
# the count's flags, from their one declaration in flopcount.options


#: The readers a :class:`~flopcount.options.Flag` names: one command-line word → its value.
def device_memory(text: str) -> int:
    """``--device-memory``: a size (``80GiB``, ``94GB``, bytes) or a device of the peak table, in bytes."""
    from flopcount.errors import UsageError
    from flopcount.measure.machine.devices import gpu_entry, memory_of
    from flopcount.memory.sizes import parse_size

    try:
        return parse_size(text, "--device-memory")
    except UsageError as error:
        found = memory_of(text)
        if found is not None:
            return found
        if gpu_entry(text) is not None:
            raise argparse.ArgumentTypeError(f"{text!r} is sold with more than one memory size: give its size "
                                             "(80GiB) or the name with it (A100-80GB)") from None
        raise argparse.ArgumentTypeError(f"{error}; or a device of the peak table with a known memory such as H100, "
                                         "H200, B200 or MI300X (docs/memory.md)") from None


READERS = {"positive": positive, "device_memory": device_memory, "positive_int": positive_int, "positive_float": positive_float,
           "input_shape": input_shape, "input_value": input_value, "loop_trips": loop_trips}
_ACTIONS = {"input_shapes": InputShapes, "pairs": Pairs}


def add_verbosity(container) -> None:
    """``-v``/``--verbose`` (more diagnostics on stderr; ``-vv`` debug) and ``-q``/``--quiet`` (no progress lines,
    bars or warnings on stderr; errors are still shown), one or the other: every command's flags of what it says
    on stderr (:func:`flopcount.cli.console.command_logging` reads them)."""
    chatter = container.add_mutually_exclusive_group()
    chatter.add_argument("-v", "--verbose", action="count", default=0, help="more diagnostics on stderr (-vv: debug)")
    chatter.add_argument("-q", "--quiet", action="store_true",
                         help="no progress lines, bars or warnings on stderr; errors are still shown")


def add_options(container, names: Iterable[str] | None = None, groups: Mapping[str, object] | None = None,
                help: Mapping[str, str] | None = None) -> None:
    """Add the flags of the settings ``names`` (fields of :class:`~flopcount.options.CountOptions`, or of
    :class:`~flopcount.memory.ledger.MemorySettings` as ``memory.NAME``; all the record's flags when None) to
    ``container`` (a parser or group), or to the argument group of each flag's group key in ``groups``; ``help``
    replaces a flag's help text by name (a command that gives the setting another meaning)."""
    from flopcount.options import MEMORY_FLAGS, flags

    declared = {**flags(), **{f"memory.{k}": v for k, v in MEMORY_FLAGS.items()}}
    for name in (names if names is not None else list(flags())):
        flag = declared[name]
        keywords = {"dest": flag.dest or name.removeprefix("memory."),
                    "help": (help or {}).get(name, flag.help)}
        if flag.action is not None:
            keywords["action"] = _ACTIONS.get(flag.action, flag.action)
        if flag.reader is not None:
            keywords["type"] = READERS[flag.reader]
        if flag.metavar is not None:
            keywords["metavar"] = flag.metavar
        if flag.choices is not None:
            keywords["choices"] = flag.choices() if callable(flag.choices) else flag.choices
        keywords["default"] = flag.default
        target = groups[flag.group] if groups is not None else container
        target.add_argument(flag.flag, **keywords)


def _settings(args: argparse.Namespace) -> dict:
    """The settings of :class:`~flopcount.options.CountOptions` a command's flags gave, by field name (a setting
    whose flag the command does not declare keeps the record's default)."""
    from flopcount.options import MEMORY_FLAGS, flags

    values = vars(args)  # argparse's record of the flags, by name (None: not given)
    settings = {name: values[flag.dest or name] for name, flag in flags().items()
                if values.get(flag.dest or name) is not None and name != "input_shapes"}  # shapes: options_from_args
    memory = {k: values[f.dest or k] for k, f in MEMORY_FLAGS.items() if (f.dest or k) in values}
    if settings.get("memory"):
        from flopcount.memory.ledger import MemorySettings  # only here: a count without --memory needs no ledger

        settings["memory"] = MemorySettings(**memory)
    elif memory.get("master_weights") or memory.get("device_memory") is not None:
        raise UsageError(f"--{'master-weights' if memory.get('master_weights') else 'device-memory'} needs --memory")
    return settings


# ---------------------------------------------------------------------------------------------------------------
# the model source

#: The model source's flags that only the counting command declares, and their values for the commands that don't.
SOURCE_DEFAULTS = {"hf": None, "trust_remote_code": False, "capacity_factor": None, "repeated_layers": "extend",
                   "generate": None, "symbolic": None, "sweep": None, "input_dtypes": {}, "takes_hf": False}


def add_model_source(p: argparse.ArgumentParser, model_help: str) -> None:
    """A subcommand's model: an .onnx path, or ``--torch``/``--keras`` with ``--input-shape`` as for counting (read
    back with :func:`model_source`), listed by ``--help`` under "model source"."""
    source = p.add_argument_group("model source")
    source.add_argument("model", nargs="?", help=model_help)
    source.add_argument("--torch", metavar="MODULE:FACTORY",
                        help="instead of a model file, the PyTorch module FACTORY() returns, exported as for counting")
    source.add_argument("--keras", metavar="MODULE:FACTORY",
                        help="instead of a model file, the keras.Model FACTORY() returns, converted as for counting")
    add_options(source, ["input_shapes"])
    p.set_defaults(**SOURCE_DEFAULTS)


def given_model(args: argparse.Namespace) -> bool:
    return any(value is not None for value in (args.model, args.torch, args.keras, args.hf))


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
    arguments, built once (a setting whose flag the command does not declare gets its default): a problem of
    :func:`model_source_problem` or of a setting is a :class:`UsageError` naming it."""
    from flopcount.frontends.source import ModelSource
    from flopcount.options import CountOptions

    problem = model_source_problem(args)
    if problem:
        raise UsageError(problem)
    given = {"torch": args.torch, "keras": args.keras, "hf": args.hf}
    kind = next((k for k, v in given.items() if v is not None), "onnx")
    shapes = dict(args.input_shape)
    source = ModelSource(kind, args.model if kind == "onnx" else given[kind],
                         inputs={"onnx": None, "keras": shapes}.get(kind, torch_inputs(args)),
                         trust_remote_code=args.trust_remote_code, capacity_factor=args.capacity_factor,
                         repeated_layers=args.repeated_layers, generate=args.generate)
    named = any(isinstance(d, str) for dims in shapes.values() for d in dims)  # --symbolic/--sweep fill them in
    settings = _settings(args)
    options = CountOptions(input_shapes=shapes if kind == "onnx" and not named else None, **settings)
    if args.generate is not None:
        from flopcount.plans import check_generation_plan

        check_generation_plan(options)  # before the count
    return source, options


def model_source_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the model a command was given, or None: exactly one of a model path, ``--torch`` and
    ``--keras``; ``--torch`` needs ``--input-shape``; a :DTYPE suffix only with ``--torch``."""
    hf = args.hf
    given = [text for text, value in ((repr(args.model), args.model), (f"--torch {args.torch}", args.torch),
                                      (f"--keras {args.keras}", args.keras), (f"--hf {hf}", hf)) if value is not None]
    if len(given) > 1:
        if hf is not None:
            return f"give one model: a path, --torch, --keras or --hf, not both (got {' and '.join(given)})"
        return f"give a model path, --torch or --keras, not both (got {' and '.join(given)})"
    if not given:
        return ("give the path of an .onnx model, or --torch MODULE:FACTORY, --keras MODULE:FACTORY or --hf CONFIG"
                if args.takes_hf else
                "give the path of an .onnx model, or --torch MODULE:FACTORY, or --keras MODULE:FACTORY")
    if args.capacity_factor is not None and hf is None:
        return "--capacity-factor is for a mixture-of-experts model given with --hf CONFIG"
    generate = args.generate
    if generate is not None and hf is None and args.torch is None:
        return "--generate is for a causal LM given with --hf CONFIG or --torch MODULE:FACTORY"
    if generate is not None and args.mode == "train":
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
    if named and args.symbolic is None and not args.sweep:
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


def count_source(args: argparse.Namespace):
    """The report of the model of ``args`` under its settings (:func:`options_from_args`), with the ledgers per rank
    of its plan (the count attaches them: :func:`flopcount.plans.with_plan`)."""
    source, options = options_from_args(args)
    return source.count(options)
