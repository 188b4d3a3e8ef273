"""Each command's ``--help`` offers only what the command has: every ``--flag`` a help text names is one of that
command's own flags (``bench --help`` once offered ``--recompute`` "with --memory", a flag bench does not have)."""

from __future__ import annotations

import importlib
import re

import pytest

from flopcount.cli import SUBCOMMANDS, build_parser

#: flags of other tools a help text names on purpose: crosscheck's --ncu-csv names ncu's own ``--page``
OTHER_TOOLS = {"crosscheck": {"--page"}}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _parsers():
    yield pytest.param("count", build_parser, id="count")
    for name, module in SUBCOMMANDS.items():
        yield pytest.param(name, importlib.import_module(module).build_parser, id=name)
    yield pytest.param("ncu_step", importlib.import_module("flopcount.cli.ncu_step").build_parser, id="ncu_step")


@pytest.mark.parametrize("name, make", list(_parsers()))
def test_help_names_only_the_commands_own_flags(name, make):
    parser = make()
    own = {flag for action in parser._actions for flag in action.option_strings}
    named = {(action.dest, flag) for action in parser._actions for flag in FLAG.findall(action.help or "")}
    foreign = {(dest, flag) for dest, flag in named if flag not in own | OTHER_TOOLS.get(name, set())}
    assert not foreign, f"flopcount {name} --help names flags it does not have: {sorted(foreign)}"


@pytest.mark.parametrize("command", ["count", "bench"])
def test_recompute_help_lists_every_policy(command):
    from flopcount.cli import bench
    from flopcount.parallel.plan import RECOMPUTE_POLICIES

    make = build_parser if command == "count" else bench.build_parser
    (recompute,) = [a for a in make()._actions if a.dest == "recompute"]
    named = re.findall(r"(?:^|[:,] )([a-z-]+) \(", recompute.help)
    assert set(RECOMPUTE_POLICIES) <= set(named) and "operator types" in recompute.help


def test_bench_recompute_is_the_plans():
    from flopcount.cli import bench

    (recompute,) = [a for a in bench.build_parser()._actions if a.dest == "recompute"]
    assert recompute.help.startswith("with --parallel:") and "--memory" not in recompute.help
