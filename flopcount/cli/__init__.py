"""The ``flopcount`` command line: ``main(argv) -> int``. All argument parsing of flopcount lives in this package;
errors become one line on stderr and an exit code (:mod:`.console`).

* :mod:`.arguments` argument types and the model source (path, ``--torch``, ``--keras``) every command shares
* :mod:`.console` logging, errors turned into exit codes, writing ``-o FILE``
* :mod:`.count` ``flopcount MODEL``: the counting command
* :mod:`.symbolic` its ``--symbolic`` formulas and ``--sweep`` tables
* :mod:`.bench` ``flopcount bench``: train a workload under the meter, repeat-run statistics
* :mod:`.profile` ``flopcount profile``: per-node onnxruntime time beside counted FLOPs and bytes
* :mod:`.ceilings` ``flopcount ceilings``: measure this machine's ceilings
* :mod:`.roofline` ``flopcount roofline``: HPC-AI and per-operator rooflines
* :mod:`.crosscheck` ``flopcount crosscheck``: the count beside Nsight Compute's counters or PyTorch's counter
* :mod:`.predict` ``--predict`` of the counting command, and ``flopcount calibrate``: measure this machine into a profile
* :mod:`.plan` ``flopcount plan``: every plan of a decoder on N devices, ranked by predicted throughput
* :mod:`.ncu_step` the program ``crosscheck`` runs under ncu (``python -m flopcount.measure.ncu_step``)
"""

from __future__ import annotations

import sys

from flopcount.errors import OutputError

from .arguments import TORCH_DTYPES, add_model_source, given_model, model_source
from .console import EXIT_INTERNAL, check_outputs, command_logging, exit_process, run_guarded, write_output
from .count import build_parser

__all__ = [
    "EXIT_INTERNAL", "SUBCOMMANDS", "TORCH_DTYPES", "OutputError", "add_model_source", "build_parser", "entry",
    "given_model", "main", "model_source", "run_guarded", "write_output",
]

#: Subcommands of the measuring half: name → module with ``build_parser() -> ArgumentParser`` and
#: ``run(args) -> int``. A first argument equal to one of these names selects it (a model file of that name is
#: given as ``./bench``); anything else is the counting command, exactly as before subcommands existed.
SUBCOMMANDS = {
    "bench": "flopcount.cli.bench",
    "profile": "flopcount.cli.profile",
    "ceilings": "flopcount.cli.ceilings",
    "roofline": "flopcount.cli.roofline",
    "crosscheck": "flopcount.cli.crosscheck",
    "calibrate": "flopcount.cli.predict",
    "plan": "flopcount.cli.plan",
}


def _subcommand(name: str, argv: list[str]) -> int:
    import importlib

    module = importlib.import_module(SUBCOMMANDS[name])
    parser = module.build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed its message (or --help)
        return int(e.code or 0)
    verbose = args.verbose  # every subcommand declares -v and -q (arguments.add_verbosity)
    with command_logging(verbose, args.quiet):
        return run_guarded(lambda: check_outputs(args) or module.run(args), verbose)


def main(argv: list[str] | None = None) -> int:
    from .arguments import check_model_source
    from .count import run

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _subcommand(argv[0], argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        check_model_source(parser, args)
    except SystemExit as e:  # argparse has printed its message (or --help/--version)
        return int(e.code or 0)
    with command_logging(args.verbose, args.quiet):
        return run_guarded(lambda: check_outputs(args) or run(args), args.verbose)


def entry() -> None:
    """The ``flopcount`` console script and ``python -m flopcount``: :func:`main` on ``sys.argv``, then the process
    ends with its code (:func:`flopcount.cli.console.exit_process`: without the interpreter's slow teardown), so
    that a count's working state is left for that end rather than freed as the count returns
    (:mod:`flopcount.pipeline.retained`). Only the counting command holds it: the measuring subcommands go on to run
    the model after counting it (onnxruntime, a training loop), where the count's state would only add to the peak."""
    if not (len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS):
        from flopcount.pipeline import retained

        retained.arm()
    exit_process(main())
