"""The optimizer step's FLOPs per rank under a parallel plan: each rank updates the parameter elements it holds,
once per optimizer step (not per microbatch), at the per-element cost the whole-model count uses for
``--optimizer`` (:data:`flopcount.options.OPTIMIZERS`: sgd 2, momentum 4, adam 14, adamw 16 FLOPs an element).

Which elements a rank holds follows the FLOPs ledger's rules (:mod:`flopcount.parallel.ranks`), read off the
report's parameters by module:

* **stage**: a layer's parameters on the pipeline rank of its chunk; the final ``norm`` and ``lm_head`` on the
  last stage; the embedding (and any other parameter outside the layers) on stage 0;
* **TP**: column- and row-parallel projections, the vocab-parallel embedding and LM head split 1/T; the K/V
  projections split over the K/V heads, 1/min(T, kv): with kv < T each head is copied on T/kv ranks, the first
  rank of each copy group counting it as its own and the others as redundant; every other parameter (norms,
  routers, MLA's latent projections) is whole on every TP rank, TP rank 0's copy its own, the others redundant;
* **EP**: a routed expert's parameters split 1/(T·E) over the TP and EP ranks (R/E experts on each EP rank);
* **DP and CP**: with the optimizer states sharded (``zero1``, ``zero2`` or ``fsdp``: ZeRO's stages 1, 2 and 3,
  Rajbhandari et al. 2020), each rank updates 1/(D·C) of its part (a routed expert's, 1/(D·C/E): the expert
  data-parallel group), so nothing is repeated over DP: under ``zero1`` and ``zero2`` the rank holds the whole
  parameters and (``zero1``) the whole gradients, but steps only its shard of the optimizer states and gathers the
  others' updated parameters after the step; without sharding every data- and context-parallel replica runs the
  same update on the same parameters, and the replicas after the first (dp = cp = 0; for experts, EP group 0)
  count it as redundant.

A split that does not divide a parameter's elements gives the remainder to the first ranks, one each, so the sum
over ranks of ``optimizer_flops`` − ``optimizer_redundant_flops`` is the whole model's optimizer FLOPs exactly.
Without ``--optimizer`` (or in inference) the figures are null, with the reason in the ledger's
``optimizer_note``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..options import OPTIMIZERS
from .layout import split

__all__ = ["RankCoords", "module_kinds", "optimizer_elements", "optimizer_note", "per_element"]


@dataclass(frozen=True)
class RankCoords:
    """A rank's coordinates: its pipeline ``stage``, its TP, DP and CP ranks, its EP group and its EP rank."""

    stage: int
    tp: int
    dp: int
    cp: int
    ep_group: int
    ep: int


def optimizer_note(report: Any) -> str | None:
    """Why the optimizer step's FLOPs per rank are null for ``report``, or None when they can be given."""
    if getattr(report, "mode", None) != "train" or getattr(report, "optimizer", None) is None:
        return "no optimizer step: count with mode train and --optimizer sgd|momentum|adam|adamw"
    if sum(report.modules.params.values()) != report.trainable_params:
        return (f"{report.trainable_params:,} of the {sum(report.modules.params.values()):,} parameters are "
                "trainable; the optimizer's share per rank needs every parameter trainable")
    return None


def per_element(report: Any) -> int:
    """FLOPs of the report's optimizer per parameter element (the whole-model count's formula)."""
    return OPTIMIZERS[report.optimizer[0]][0]


def optimizer_elements(rows: Mapping[int, Sequence[tuple[str, Any, int]]], layout: Any,
                       at: RankCoords) -> tuple[int, int]:
    """(elements updated, of which redundant) on the rank at coordinates ``at`` (see the module's rules); ``rows``:
    :meth:`flopcount.parallel.layout.Layout.stage_params`."""
    stage, tp, dp, cp, ep_group, ep = at.stage, at.tp, at.dp, at.cp, at.ep_group, at.ep
    plan = layout.plan
    d_c = plan.dp * plan.cp
    shard = cp + plan.cp * dp  # the rank's place among the D·C data- and context-parallel ranks
    held = redundant = 0
    sharded = plan.zero_stage  # zero1, zero2 and fsdp shard the optimizer states alike
    for (share, n, _), times in module_kinds(rows.get(stage, ()), layout):
        if share.role == "expert":
            x, copy = split(n, plan.tp * plan.ep, tp * plan.ep + ep), 0
            groups, place = d_c // plan.ep, ep_group
        else:
            x, copy = layout.elements(share, n, tp)
            groups, place = d_c, shard
        if sharded:
            own, copy = split(x - copy, groups, place), split(copy, groups, place)
            x = own + copy
        elif place != 0:
            copy = x
        held += x * times
        redundant += copy * times
    return held, redundant


#: The last stages' modules counted by :func:`module_kinds` (each list by identity, held, with what it read).
_kinds: list[tuple] = []


def module_kinds(rows: Sequence[tuple[str, Any, int]], layout: Any) -> tuple[tuple[tuple[Any, int, bool], int], ...]:
    """Each (share, elements, whether in the repeated layers: :meth:`~flopcount.parallel.layout.Layout.layered`) of
    a stage's modules ``rows`` (:meth:`~flopcount.parallel.layout.Layout.stage_params`) with the number of modules
    of it, in the order first met: the layers' modules are alike, and a rank's elements of them are the sum over
    them (of integers, the same in any order) of what it holds of each."""
    asked = (layout.dims.layers, layout.stacks)
    for held, was, found in _kinds:
        if held is rows and was == asked:
            return found
    counts: dict[tuple[Any, int, bool], int] = {}
    for module, share, n in rows:
        kind = (share, n, layout.layered(module))
        counts[kind] = counts.get(kind, 0) + 1
    found = tuple(counts.items())
    _kinds[:] = [*_kinds[-15:], (rows, asked, found)]
    return found
