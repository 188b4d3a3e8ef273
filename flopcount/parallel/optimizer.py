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

import re
from typing import Any

from ..options import OPTIMIZERS

__all__ = ["optimizer_elements", "optimizer_note", "parameter_rows"]

_IN_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
_EXPERT = re.compile(r"\.experts(?:\.|$)")


def _split(f: int, t: int, i: int) -> int:
    return f // t + (1 if i < f % t else 0)


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


def parameter_rows(report: Any, plan: Any, layers: int, chunks: int) -> dict[int, list[tuple[bool, str, int]]]:
    """The report's parameters by module, read once for every rank: stage → (a routed expert's, its leaf name, its
    elements) per module."""
    per_chunk = layers // (plan.pp * chunks)
    rows: dict[int, list[tuple[bool, str, int]]] = {}
    for module, n in report.modules.params.items():
        found = _IN_LAYER.search(module)
        leaf = module.rsplit(".", 1)[-1]
        s = int(found.group(1)) // per_chunk % plan.pp if found else (
            plan.pp - 1 if leaf in ("lm_head", "norm") else 0)
        rows.setdefault(s, []).append((bool(_EXPERT.search(module)), leaf, n))
    return rows


def optimizer_elements(rows: dict[int, list[tuple[bool, str, int]]], plan: Any, kv_heads: int, stage: int, tp: int,
                       dp: int, cp: int, ep_group: int, ep: int, column: tuple[str, ...], row: tuple[str, ...],
                       kv: tuple[str, ...]) -> tuple[int, int]:
    """(elements updated, of which redundant) on the rank at these coordinates (see the module's rules); ``rows``:
    :func:`parameter_rows`."""
    t, d_c = plan.tp, plan.dp * plan.cp
    shard = cp + plan.cp * dp  # the rank's place among the D·C data- and context-parallel ranks
    held = redundant = 0
    for expert, leaf, n in rows.get(stage, ()):
        copy = False
        if expert:
            x = _split(n, t * plan.ep, tp * plan.ep + ep)
            groups, place = d_c // plan.ep, ep_group
        else:
            groups, place = d_c, shard
            if leaf in column or leaf in row or leaf in ("embed_tokens", "lm_head"):
                x = _split(n, t, tp)
            elif leaf in kv and kv_heads < t:
                x, copy = _split(n, kv_heads, tp // (t // kv_heads)), tp % (t // kv_heads) != 0
            elif leaf in kv:
                x = _split(n, t, tp)
            else:
                x, copy = n, tp != 0
        if plan.zero_stage:  # zero1, zero2 and fsdp shard the optimizer states alike
            x = _split(x, groups, place)
        elif place != 0:
            copy = True
        held += x
        redundant += x if copy else 0
    return held, redundant
