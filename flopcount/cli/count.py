"""The counting command, ``flopcount MODEL``: count a model's FLOPs and render the report."""

from __future__ import annotations

import argparse

from flopcount.options import GROUPS
from flopcount.output.render import FORMATS, render

from .arguments import Parser, add_options, add_verbosity, count_source, generate_spec, positive_float, positive_int
from .console import write_output
from .predict import add_predict_arguments, prediction_of
from .symbolic import run_sweep, run_symbolic, start_sizes, sweep_values

__all__ = ["build_parser", "run"]


class _Version(argparse.Action):
    """``--version``: reads the package metadata only when asked (building the parser stays cheap)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from flopcount.version import __version__

        print(f"flopcount {__version__}")  # on stdout, as argparse's own version action
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    # --help lists the options in the groups of flopcount.options.GROUPS; parsing is the same as without them
    parser = Parser(
        prog="flopcount",
        description="Count the FLOPs of an ONNX model analytically, from its graph, without reading weights. "
        "Measuring subcommands: flopcount bench|profile|ceilings|roofline|crosscheck|calibrate|plan --help.",
        epilog="Exit codes: 0 ok, 1 internal error, 2 usage, 3 unreadable model file, 4 invalid graph, "
        "5 unresolved or invalid shapes, 6 unsupported operators with --strict, 7 opset too new, 8 cannot write output, "
        "9 the --torch or --keras model cannot be exported, 10 a benchmark did not reach its target quality, "
        "11 a device, runtime or tool is missing, 12 a measurement cannot be made or read, "
        "13 the --hf configuration cannot be read or built.",
    )
    groups = {key: parser.add_argument_group(title, text) for key, (title, text) in GROUPS.items()}
    p = groups["input"]
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
    p.add_argument("--hf", metavar="CONFIG",
                   help="a Hugging Face transformers model from its configuration: a config.json, a folder holding "
                   "one, or a Hub model id (only config.json is fetched); built on the meta device, no weights")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="with --hf: allow a configuration whose model code lives in its repository (runs that code)")
    add_options(parser, groups=groups)
    add_options(parser, ["memory.implementation", "memory.device", "memory.master_weights", "memory.device_memory"],
                groups=groups)
    p = groups["counting"]
    p.add_argument("--symbolic", nargs="?", const={}, type=start_sizes, metavar="NAME=START,...",
                   help="the count as exact formulas in the dims given as names (--input-shape input_ids=BxS) or left "
                   "as dim_param in the model; optionally the size each name is first counted at (default 2)")
    p.add_argument("--sweep", type=sweep_values, metavar="NAME=V1,V2,...",
                   help="count at each size of one named dim (the others at their --symbolic start, else 2); with "
                   "--plot FILE, a chart of FLOPs against it")
    p = groups["llm"]
    p.add_argument("--generate", metavar="P:N", type=generate_spec,
                   help="with --hf or --torch (a causal LM taking past_key_values): count generate() of N new tokens "
                   "after a P-token prompt, with a KV cache: the prefill (logits of the last position only), each "
                   "decode step and their sum, FLOPs per token and the KV cache's bytes; batch from --batch "
                   "(default 1); the table and totals are the prefill's; with --parallel, the prefill and decode FLOPs per "
                   "rank (docs/parallel.md), and with --memory the KV cache per rank")
    p.add_argument("--capacity-factor", type=positive_float, metavar="C",
                   help="with --hf, a mixture-of-experts model: the experts' capacity factor C (each expert takes at "
                   "most floor(C*T*k/E) of a block's T*k token-expert pairs); reports the most the routed experts "
                   "can then run beside the no-drop count, which the totals keep")
    p.add_argument("--repeated-layers", choices=("extend", "export"), default="extend",
                   help="with --hf: extend (default) counts a model of L >= 3 identical layers from exports of 1 and 2 "
                   "of them, extended exactly to L (seconds for an 8B model), where the layers are shown identical, "
                   "else exports the whole model; export always exports the whole model")
    add_predict_arguments(parser)
    p = groups["output"]
    p.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report to FILE instead of stdout")
    p.add_argument("--per-node", action="store_true", help="also list every node with its shapes and cost")
    p.add_argument("--by-module", action="store_true",
                   help="also a table of FLOPs, MACs and parameters per module, from the module scopes the exporter "
                   "wrote (PyTorch module paths, Keras layer names)")
    p.add_argument("--depth", type=positive_int, metavar="N",
                   help="depth of the module tree (implies --by-module; default 1: the model's children; in the "
                   "html report, as deep as fits)")
    p.add_argument("--plot", metavar="FILE", help="also draw FLOPs by op type (with --sweep: FLOPs by size) to FILE (.png, .svg or .pdf; needs "
                   "matplotlib)")
    add_verbosity(p)
    p.add_argument("--version", action=_Version, help="show the version and exit")
    parser.set_defaults(input_dtypes={}, takes_hf=True)  # the model source's other flags are declared above
    return parser


def run(args: argparse.Namespace) -> int:
    """Count the model of ``args`` and write its report; 0 on success."""
    if args.sweep:
        return run_sweep(args)
    if args.symbolic is not None:
        return run_symbolic(args)

    report = count_source(args)  # with the ledgers per rank of --parallel (the count attaches them)
    prediction = prediction_of(report, args)
    if args.plot:
        from flopcount.measure.profile.roofline import plot_op_types

        plot_op_types(report, args.plot)
    # --depth alone asks for the module rows too; the html page has them always, as deep as fits unless --depth
    by_module = args.depth if args.format == "html" else args.depth or (1 if args.by_module else None)
    write_output(render(report, args.format, args.per_node, by_module, prediction), args.output)
    return 0
