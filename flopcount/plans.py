"""The ledgers of a parallel plan from a counted report: the public entry points, each argument checked at the call
(a :class:`~flopcount.errors.UsageError` naming it), and :func:`with_plan`, the one step that gives a count its
ledgers per rank (:func:`flopcount.counting.count_options` calls it; the frontends that make one report from several
counts call it on the report they make).

:func:`parallel_ledger` (FLOPs, redundant work, communication and bubble per rank: :mod:`flopcount.parallel.ranks`),
:func:`memory_per_rank` (the memory ledger per rank: :mod:`flopcount.memory.ranks`) and :func:`generation_ledger`
(FLOPs per rank of ``generate()``: :mod:`flopcount.parallel.generation`) take a plan as text (read as ``--parallel``
reads it, with one microbatch and the 1f1b schedule) or as a :class:`~flopcount.parallel.plan.ParallelPlan`, a
recompute policy as text or a :class:`~flopcount.parallel.plan.Recompute`, and an expert load as the path of its
JSON file or an :class:`~flopcount.parallel.experts.ExpertLoad`.

>>> parallel_ledger("report", "tp=2")
Traceback (most recent call last):
...
flopcount.errors.UsageError: parallel_ledger: report must be a flopcount.Report, got 'report' (str)
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .calls import described
from .errors import UsageError

__all__ = ["check_generation_plan", "generation_ledger", "memory_per_rank", "parallel_ledger", "with_plan",
           "without_plan"]


def _report(caller: str, report: Any):
    from .reporting.report import Report

    if not isinstance(report, Report):
        raise UsageError(f"{caller}: report must be a flopcount.Report, got {described(report)}")
    return report


def _plan(caller: str, plan: Any):
    from .parallel.plan import ParallelPlan, parse_parallel

    if isinstance(plan, str):
        return parse_parallel(plan)
    if not isinstance(plan, ParallelPlan):
        raise UsageError(f"{caller}: plan must be text such as 'tp=2,pp=4' or a flopcount.ParallelPlan, got "
                         f"{described(plan)}")
    return plan


def _load(caller: str, expert_load: Any):
    from .options import CountOptions

    try:  # the record's one check of an expert load
        return CountOptions(parallel="dp=1", expert_load=expert_load).expert_load
    except UsageError as e:
        raise UsageError(f"{caller}: {str(e).removeprefix('count: ')}") from None


def parallel_ledger(report: Any, plan: Any, recompute: Any = None, expert_load: Any = None):
    """The per-rank FLOP ledger of ``report`` (a count of one microbatch) under ``plan``
    (:func:`flopcount.parallel.ranks.ledger`): what ``count(..., parallel=plan)`` puts in ``report.parallel``."""
    from .parallel.plan import parse_recompute
    from .parallel.ranks import ledger

    report, plan = _report("parallel_ledger", report), _plan("parallel_ledger", plan)
    if recompute is not None and not isinstance(recompute, str):
        from .parallel.plan import Recompute

        if not isinstance(recompute, Recompute):
            raise UsageError(f"parallel_ledger: recompute must be text such as 'full' or a flopcount.Recompute, got "
                             f"{described(recompute)}")
    return ledger(report, plan, parse_recompute(recompute), _load("parallel_ledger", expert_load))


def memory_per_rank(report: Any, plan: Any, expert_load: Any = None):
    """The memory ledger of ``report`` (counted with ``memory=True``) per rank of ``plan``
    (:func:`flopcount.memory.ranks.per_rank`): what ``count(..., memory=True, parallel=plan)`` puts in
    ``report.memory``."""
    from .memory.ranks import per_rank

    report, plan = _report("memory_per_rank", report), _plan("memory_per_rank", plan)
    if report.memory is None:
        raise UsageError("memory_per_rank: the report has no memory ledger; count it with memory=True (--memory)")
    return per_rank(report, plan, _load("memory_per_rank", expert_load))


def generation_ledger(report: Any, plan: Any, expert_load: Any = None):
    """The per-rank FLOPs of a count of ``generate()`` (``report.generation``: the prefill and decode steps) under
    ``plan`` (:func:`flopcount.parallel.generation.generation_ledger`)."""
    from .parallel import generation

    report, plan = _report("generation_ledger", report), _plan("generation_ledger", plan)
    if report.generation is None:
        raise UsageError("generation_ledger: the report is no count of generate(); count it with generate=(P, N) "
                         "(--generate P:N)")
    return generation.generation_ledger(report, plan, _load("generation_ledger", expert_load))


def with_plan(report: Any, options: Any):
    """``report`` with the ledgers of ``options.parallel`` (a :class:`~flopcount.options.CountOptions`):
    ``report.parallel`` (FLOPs per rank, of the prefill and decode steps for a count of ``generate()``) and, where
    ``report.memory`` is given and the plan has more than one rank, the memory per rank. Unchanged without a plan.
    Python's cyclic collector is paused meanwhile (the ledgers make no reference cycles, and a full collection set
    off by their objects would rescan every object of the export:
    :func:`flopcount.memory.ledger.without_cyclic_gc`)."""
    if options.parallel is None:
        return report
    from .memory.ledger import without_cyclic_gc

    return without_cyclic_gc(_with_plan)(report, options)


def without_plan(options: Any):
    """``options`` without its plan (the recompute policy stays in the memory settings): for the counts a frontend
    makes one report from (the 1- and 2-layer exports of an extended stack, a prefill and its decode steps), whose
    report then takes the plan's ledgers once, through :func:`with_plan`."""
    if options.parallel is None and options.recompute is None:
        return options
    return dataclasses.replace(options, parallel=None, microbatches=None, schedule=None, expert_load=None,
                               token_dispatcher=None, recompute=None)


def check_generation_plan(options: Any, encoder_decoder: bool = False) -> None:
    """Refuse the settings of a plan that a count of ``generate()`` does not take: recompute (training only) and
    the plan's parts not modelled (:func:`flopcount.parallel.generation.check_plan`; ``encoder_decoder``: of an
    encoder-decoder's generation)."""
    from .parallel.generation import check_plan

    if options.recompute is not None and options.recompute.policy != "none":
        raise UsageError(f"--recompute {options.recompute}: recompute changes training only; leave it out with "
                         "--generate")
    if options.parallel is not None:
        check_plan(options.parallel, encoder_decoder)


def _with_plan(report, options):
    from .parallel.generation import generation_ledger as per_step
    from .parallel.ranks import ledger

    plan, load = options.parallel, options.expert_load
    if report.generation is not None:
        check_generation_plan(options)
        parallel = per_step(report, plan, load)
    else:
        parallel = ledger(report, plan, options.recompute, load)
    if load is not None and parallel.expert_load is None:
        raise UsageError(f"--expert-load {load.source}: the model has no routed experts (no mixture-of-experts "
                         "layer), so a load would change nothing; leave it out")
    if plan.token_dispatcher is not None and parallel.expert_load is None:
        raise UsageError(f"--token-dispatcher {plan.token_dispatcher}: the model has no routed experts (no "
                         "mixture-of-experts layer), so no tokens are dispatched; leave it out")
    memory = report.memory
    if memory is not None and not plan.is_single:
        from .memory.ranks import per_rank

        memory = per_rank(report, plan, load)  # (reads the one-rank ledger and the nodes, never report.parallel)
    return dataclasses.replace(report, parallel=parallel, memory=memory)
