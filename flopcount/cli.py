"""The ``flopcount`` command: ``main(argv) -> int``. Errors become one line on stderr and an exit code."""

from __future__ import annotations

import argparse
import logging
import sys

from .conventions import CONVENTIONS
from .errors import FlopcountError, UsageError
from .render import FORMATS, render
from .shapes import MAX_ELEMENTS, parse_dims

EXIT_INTERNAL = 1


class OutputError(FlopcountError):
    """The report cannot be written to ``-o FILE``."""

    exit_code = 8


#: Element types a ``--torch`` input may be given (``--input-shape input_ids=1x128:int64``): torch's dtype names.
TORCH_DTYPES = (
    "float32", "float", "float64", "double", "float16", "half", "bfloat16", "int64", "long", "int32", "int",
    "int16", "short", "int8", "uint8", "bool", "complex64", "complex128",
)


def _input_shape(text: str) -> tuple[str, tuple[int, ...], str | None]:
    name, sep, spec = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=DIMS such as input=8x3x224x224, got {text!r}")
    dims, colon, dtype = spec.partition(":")
    if colon and dtype not in TORCH_DTYPES:
        raise argparse.ArgumentTypeError(f"unknown element type {dtype!r} in {text!r}; one of: {', '.join(TORCH_DTYPES)}")
    try:
        return name, parse_dims(dims), dtype or None
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _InputShapes(argparse.Action):
    """``--input-shape NAME=DIMS[:DTYPE]``: appends ``(NAME, DIMS)`` to ``input_shape`` and records DTYPE in
    ``input_dtypes``."""

    def __call__(self, parser, namespace, values, option_string=None):
        name, dims, dtype = values
        namespace.input_shape = [*(namespace.input_shape or []), (name, dims)]
        if dtype is not None:
            namespace.input_dtypes = {**(getattr(namespace, "input_dtypes", None) or {}), name: dtype}


def _input_value(text: str) -> tuple[str, list[int]]:
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


def _loop_trips(text: str) -> tuple[str, int]:
    name, sep, n = text.rpartition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NODE=N such as decoder_loop=32, got {text!r}")
    return name, _positive(n)


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = 0
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    if v > MAX_ELEMENTS:
        raise argparse.ArgumentTypeError(f"must be at most 2**48 = {MAX_ELEMENTS}, got {text!r}")
    return v


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    p = argparse.ArgumentParser(
        prog="flopcount",
        description="Count the FLOPs of an ONNX model analytically, from its graph, without reading weights. "
        "Measuring subcommands: flopcount bench|profile|ceilings|roofline|crosscheck --help.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 usage, 3 unreadable model file, 4 invalid graph, "
        "5 unresolved or invalid shapes, 6 unsupported operators with --strict, 7 opset too new, 8 cannot write output, "
        "9 the --torch or --keras model cannot be exported, 10 a benchmark did not reach its target quality, "
        "11 a device, runtime or tool is missing, 12 a measurement cannot be made or read.",
    )
    p.add_argument("model", nargs="?",
                   help="path of an .onnx model (external weight files are never read and may be absent)")
    p.add_argument("--torch", metavar="MODULE:FACTORY",
                   help="instead of a model file, export the torch.nn.Module that FACTORY() returns (no weights "
                   "loaded; exports are cached in $FLOPCOUNT_CACHE or ~/.cache/flopcount); --input-shape gives "
                   "forward()'s inputs by parameter name, e.g. --torch mypkg.nets:make_net --input-shape "
                   "x=1x3x224x224, or input_ids=1x128:int64; the factory's arguments, as Python literals, may follow "
                   "it as a call: --torch 'torchvision.models:resnet50(weights=None)'")
    p.add_argument("--keras", metavar="MODULE:FACTORY",
                   help="instead of a model file, convert the keras.Model that FACTORY() returns with tf2onnx "
                   "(conversions are cached like --torch exports); --input-shape fixes or overrides the model's "
                   "input dims, NHWC for image models (default: its own shapes at batch 1), e.g. --keras "
                   "mypkg.nets:make_net --input-shape image=8x224x224x3; arguments as for --torch: "
                   "--keras 'keras.applications:MobileNetV3Small(weights=None)' (a factory that would load "
                   "weights by default is refused until weights=None is given)")
    p.add_argument("--input-shape", metavar="NAME=DIMS", action=_InputShapes, type=_input_shape, default=[],
                   help="fix the dims of an input, e.g. input=8x3x224x224 (repeatable); with --torch, NAME is a "
                   "parameter of forward() and a :DTYPE suffix gives its element type, e.g. input_ids=1x128:int64")
    p.set_defaults(input_dtypes={})
    p.add_argument("--trainable-input", metavar="NAME", action="append", default=[],
                   help="with --mode train: a floating-point input that is trained, not data (its gradient is "
                   "counted, and it is updated like a parameter); repeatable")
    p.add_argument("--trainable", metavar="PATTERN", action="append",
                   help="with --mode train: the weights that are trained, by name or shell pattern (e.g. "
                   "'decoder.*'; repeatable); the others are not trained (default: the framework's trainable "
                   "parameters with --torch/--keras, else every tensor the graph uses as a weight)")
    p.add_argument("--frozen", metavar="PATTERN", action="append",
                   help="with --mode train: weights that are not trained, by name or shell pattern (e.g. "
                   "'backbone.*'; repeatable): no weight gradient, no update, no backward below the first "
                   "trained layer")
    p.add_argument("--input-value", metavar="NAME=V1,V2", action="append", type=_input_value, default=[],
                   help="value of a small integer input that shapes depend on (axes, sizes), e.g. axes=1,2 (repeatable)")
    p.add_argument("--loop-trips", metavar="NODE=N", action="append", type=_loop_trips, default=[],
                   help="trip count of a Loop (or sequence length of a SequenceMap) the graph does not fix (repeatable)")
    p.add_argument("--batch", type=_positive, metavar="N",
                   help="set dim 0 of every input not given by --input-shape; per-sample figures divide by it")
    p.add_argument("--convention", choices=sorted(CONVENTIONS), default="default",
                   help="counting convention: default (1 MAC = 2 FLOPs), table3 (HPC AI500 V3.0 Table 3 literally), "
                        "aiperf (AIPerf's weighted costs), dense (products only, as torch.utils.flop_counter), macs (1 per MAC)")
    p.add_argument("--mode", choices=("inference", "train"), default="inference",
                   help="train: add the backward pass (gradients of inputs and trainable parameters)")
    p.add_argument("--optimizer", choices=("sgd", "momentum", "adam"),
                   help="with --mode train: also the optimizer step's FLOPs, reported apart")
    p.add_argument("--per-node", action="store_true", help="also list every node with its shapes and cost")
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument("--plot", metavar="FILE", help="also draw FLOPs by op type to FILE (.png, .svg or .pdf; needs "
                   "matplotlib)")
    p.add_argument("--strict", action="store_true", help="fail (exit 6) when any operator has no formula")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more diagnostics on stderr (-vv: debug)")
    p.add_argument("--version", action="version", version=f"flopcount {__version__}")
    return p


def add_model_source(p: argparse.ArgumentParser, model_help: str) -> None:
    """A subcommand's model: an .onnx path, or ``--torch``/``--keras`` with ``--input-shape`` as for counting (read
    back with :func:`model_source`)."""
    p.add_argument("model", nargs="?", help=model_help)
    p.add_argument("--torch", metavar="MODULE:FACTORY",
                   help="instead of a model file, the PyTorch module FACTORY() returns, exported as for counting")
    p.add_argument("--keras", metavar="MODULE:FACTORY",
                   help="instead of a model file, the keras.Model FACTORY() returns, converted as for counting")
    p.add_argument("--input-shape", metavar="NAME=DIMS", action=_InputShapes, type=_input_shape, default=[],
                   help="fix the dims of an input, e.g. input=8x3x224x224 (repeatable); with --torch, NAME is a "
                   "parameter of forward() and a :DTYPE suffix gives its element type")
    p.set_defaults(input_dtypes={})


def given_model(args: argparse.Namespace) -> bool:
    return any(getattr(args, k, None) is not None for k in ("model", "torch", "keras"))


def model_source(args: argparse.Namespace):
    """``(model, input_shapes)`` of a subcommand: the path and its ``--input-shape`` dims, or the weightless ONNX
    export of ``--torch``/``--keras`` (its dims fixed by the export) and no dims."""
    problem = _model_source_problem(args)
    if problem:
        raise UsageError(problem)
    if args.torch is not None:
        from .frontends.torch import load_factory, to_onnx

        inputs = {name: (dims, args.input_dtypes[name]) if name in args.input_dtypes else dims
                  for name, dims in args.input_shape}
        return to_onnx(load_factory(args.torch), inputs), {}
    if args.keras is not None:
        from .frontends.keras import load_factory, to_onnx

        return to_onnx(load_factory(args.keras), dict(args.input_shape) or None, batch=getattr(args, "batch", None)), {}
    return args.model, dict(args.input_shape)


def _model_source_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the model a command was given, or None: exactly one of a model path, ``--torch`` and
    ``--keras``; ``--torch`` needs ``--input-shape``; a :DTYPE suffix only with ``--torch``."""
    given = [text for text, value in ((repr(args.model), args.model), (f"--torch {args.torch}", args.torch),
                                      (f"--keras {args.keras}", args.keras)) if value is not None]
    if len(given) > 1:
        return f"give a model path, --torch or --keras, not both (got {' and '.join(given)})"
    if not given:
        return "give the path of an .onnx model, or --torch MODULE:FACTORY, or --keras MODULE:FACTORY"
    names = [name for name, _ in args.input_shape]
    if args.keras is not None and len(set(names)) != len(names):
        return f"--keras: each --input-shape names one model input; got {', '.join(names)}"
    if args.torch is not None and not args.input_shape:
        return "--torch needs the shape of each forward() input, by name: --input-shape NAME=DIMS[:DTYPE] (repeatable)"
    if args.torch is not None and len(set(names)) != len(names):
        return f"--torch: each --input-shape names one forward() input; got {', '.join(names)}"
    if args.torch is None and args.input_dtypes:
        given = ", ".join(f"{name}=...:{dtype}" for name, dtype in args.input_dtypes.items())
        return (f"--input-shape {given}: a :DTYPE suffix is for --torch inputs; "
                f"{'a Keras model' if args.keras else 'an ONNX model'} declares its input types, give NAME=DIMS")
    return None


def _check_model_source(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    problem = _model_source_problem(args)
    if problem:
        parser.error(problem)


def _count_torch(args: argparse.Namespace):
    """Export the module of ``--torch`` (in training mode with ``--mode train``) and count it."""
    from .frontends.torch import from_torch, load_factory

    module = load_factory(args.torch)
    inputs = {name: (dims, args.input_dtypes[name]) if name in args.input_dtypes else dims
              for name, dims in args.input_shape}
    return from_torch(module, inputs, training=args.mode == "train", trainable_inputs=args.trainable_input,
                      batch=args.batch, convention=args.convention, strict=args.strict,
                      input_values=dict(args.input_value), loop_trips=dict(args.loop_trips),
                      mode=args.mode, optimizer=args.optimizer, **_weights(args))


def _count_keras(args: argparse.Namespace):
    """Convert the model of ``--keras`` (in training mode with ``--mode train``) and count it."""
    from .frontends.keras import from_keras, load_factory

    model = load_factory(args.keras)
    return from_keras(model, dict(args.input_shape) or None, training=args.mode == "train", batch=args.batch,
                      convention=args.convention, strict=args.strict, input_values=dict(args.input_value),
                      loop_trips=dict(args.loop_trips), mode=args.mode, optimizer=args.optimizer,
                      **({"trainable_inputs": args.trainable_input} if args.trainable_input else {}), **_weights(args))


def _weights(args: argparse.Namespace) -> dict:
    """``trainable=`` and ``frozen=`` of count() from ``--trainable`` and ``--frozen`` (absent when not given)."""
    return {k: v for k in ("trainable", "frozen") if (v := getattr(args, k, None))}


#: Subcommands of the measuring half: name → module with ``build_parser() -> ArgumentParser`` and
#: ``run(args) -> int``. A first argument equal to one of these names selects it (a model file of that name is
#: given as ``./bench``); anything else is the counting command, exactly as before subcommands existed.
SUBCOMMANDS = {
    "bench": "flopcount.measure.bench_cli",
    "profile": "flopcount.measure.profile_cli",
    "ceilings": "flopcount.measure.ceilings_cli",
    "roofline": "flopcount.measure.roofline_cli",
    "crosscheck": "flopcount.measure.crosscheck_cli",
}


def _setup_logging(verbose: int) -> None:
    logging.basicConfig(
        level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)],
        format="flopcount: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )


def run_guarded(action, verbose: int) -> int:
    """Run ``action() -> int`` turning flopcount's errors into one line on stderr and their exit codes, and any
    other exception into one "internal error" line (the traceback with ``-vv``). Shared by every subcommand."""
    try:
        return action()
    except FlopcountError as e:
        print(f"flopcount: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("flopcount: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a bug of ours: one line, not a traceback
        if verbose >= 2:
            raise
        print(
            f"flopcount: internal error: {type(e).__name__}: {e}. Please report it with the model "
            "(rerun with -vv for the traceback).",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


def write_output(text: str, path: str | None) -> None:
    """Write ``text`` to ``path`` (stdout when None); an unwritable path is an :class:`OutputError`."""
    if not path:
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise OutputError(f"{path}: cannot write the report ({e.strerror})") from None


def _subcommand(name: str, argv: list[str]) -> int:
    import importlib

    module = importlib.import_module(SUBCOMMANDS[name])
    parser = module.build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed its message (or --help)
        return int(e.code or 0)
    verbose = getattr(args, "verbose", 0)
    _setup_logging(verbose)
    return run_guarded(lambda: module.run(args), verbose)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        _check_model_source(parser, args)
    except SystemExit as e:  # argparse has printed its message (or --help/--version)
        return int(e.code or 0)
    _setup_logging(args.verbose)

    def count_and_render() -> int:
        from .counting import count

        shapes = dict(args.input_shape)
        if args.torch:
            report = _count_torch(args)
        elif args.keras:
            report = _count_keras(args)
        else:
            report = count(args.model, input_shapes=shapes, batch=args.batch, convention=args.convention,
                           strict=args.strict, input_values=dict(args.input_value),
                           loop_trips=dict(args.loop_trips), mode=args.mode, optimizer=args.optimizer,
                           trainable_inputs=args.trainable_input, **_weights(args))
        if args.plot:
            from .measure.roofline import plot_op_types

            plot_op_types(report, args.plot)
        write_output(render(report, args.format, args.per_node), args.output)
        return 0

    return run_guarded(count_and_render, args.verbose)
