"""Tensor parallelism's collectives on one rank of a pipeline stage as the calls it makes: each call's kind, bytes,
count per optimizer step and phase. The ledger's TP bytes (:mod:`flopcount.parallel.ranks`, whose module states the
rules) are these calls' sums, and the step-time predictor reads the calls (:mod:`flopcount.measure.predict_report`).

Per layer of the stage (``M`` times a step), with A_n = b·s_n·h·e of that layer's stream:

* a call of A_n after each of the layer's blocks (its row-parallel reduction: ``all_reduce``, or ``reduce_scatter``
  under sp) in the forward, and its gradient's (none, or ``all_gather``) in the backward;
* a call into each column-parallel input (none in the forward without sp, ``all_gather`` with it; its gradient's
  ``all_reduce`` or ``reduce_scatter`` in the backward): A_n a block, a cross-attention's K/V input of the other
  stack's tokens, and in a layer of multi-head latent attention, in place of its attention's A_n, one call per
  latent (:class:`~flopcount.parallel.roles.Found` ``latent_parts``: the q latent, the kv latent and the shared
  rotary key, each b·s·width·e);
* a recompute's rerun: the forward's calls again, in the backward, less the layer's last reduction under
  ``non-reentrant`` (none where the layer ends in an MoE block the all-to-all dispatcher runs under tp, sp and ep:
  no TP block, :class:`~flopcount.parallel.layout.Layout` ``dispatched``).

Once per microbatch: each token-embedding lookup (forward; an encoder-decoder's two, a call each), the LM head's
input (gathered in the forward under sp) and its gradient (backward), sp's gathered inputs gathered again in the
backward under ``sp=megatron`` (one call each), the loss's three ``all_reduce`` of b·s·4 (forward). Once a step
(phase ``step``): sp weights' partial gradients, one ``all_reduce`` of them all (Megatron flattens them into one
buffer).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, NamedTuple

__all__ = ["Call", "tp_calls"]


class Call(NamedTuple):
    """``count`` calls a step of ``bytes`` each, of one ``kind``, in ``phase``: ``forward``, ``backward`` (a
    recompute's rerun too) or ``step`` (once a step)."""

    kind: str
    bytes: int
    count: int
    phase: str


def _layer_calls(layout: Any, kind: tuple) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A layer's (row-parallel reductions' bytes, column-parallel inputs' bytes) per microbatch; ``kind``: its
    (stream's tokens, blocks, cross-attention's tokens, latents' elements by tensor) in a sequence."""
    d, cp = layout.dims, layout.plan.cp
    seq, blocks, cross, parts = kind
    a = d.batch * (seq // cp) * d.hidden * d.act_bytes
    latents = tuple(d.batch * (p // cp) * d.act_bytes for p in parts)
    other = (d.batch * (cross // cp) * d.hidden * d.act_bytes,) if cross else ()
    return (a,) * blocks, (a,) * (blocks - (1 if latents else 0)) + other + latents


def tp_calls(layout: Any, stage: int, train: bool, has_loss: bool, skipped: tuple[int, int, int] | None,
             sequence_bytes: int) -> tuple[Call, ...]:
    """The calls of one TP rank of pipeline rank ``stage`` (T > 1) per optimizer step (the module's rules);
    ``skipped``: of a recompute's rerun, the reductions per layer it does not run again (all_reduce without sp;
    all_gather and reduce_scatter with it; None: no rerun); ``sequence_bytes``: sp weights' partial gradients."""
    plan, d = layout.plan, layout.dims
    m, sp = plan.microbatches, plan.sp
    out: dict[tuple[str, int, str], int] = {}

    def add(kind: str, sizes, phase: str, times: int = 1) -> None:
        for x in sizes:
            if x and times:
                out[(kind, x, phase)] = out.get((kind, x, phase), 0) + times

    row, col = ("reduce_scatter", "all_gather") if sp else ("all_reduce", "all_reduce")
    parts = layout.latent_parts or ((),) * len(layout.blocks)
    dispatched = layout.dispatched or (False,) * len(layout.blocks)
    kinds = Counter((layout.seqs[n], layout.blocks[n], layout.cross[n], parts[n], dispatched[n])
                    for n in layout.stage_layers(stage))
    for kind, k in kinds.items():  # the layers alike once (a plan search asks for many plans)
        rows, cols = _layer_calls(layout, kind[:4])
        add(row, rows, "forward", k)
        if sp:
            add(col, cols, "forward", k)
        if train:
            add(row, cols, "backward", k)
            if sp:  # the reductions' gradients: gathered under sp, none without
                add(col, rows, "backward", k)
        if skipped is not None:  # the rerun: the forward's calls again, but the last ``skipped`` reductions
            kept = (skipped[2], skipped[1]) if sp else (skipped[0], 0)
            kept = (0, kept[1]) if kind[4] else kept  # a dispatched MoE block last: no TP reduction skipped
            add(row, rows[kept[0]:], "backward", k)
            if sp:
                add(col, cols[kept[1]:], "backward", k)
    first, last = stage == 0, stage == plan.pp - 1
    e_ = tuple(d.batch * (n // plan.cp) * d.hidden * d.act_bytes for n in layout.lookups)  # a call each
    o_ = d.batch * (layout.out_seq // plan.cp) * d.hidden * d.act_bytes
    # the vocab-parallel embedding's lookup and LM head (none in a ViT: its patch embedding and classifier run whole
    # on every rank, with no collective around them)
    embeds, head = first and "embedding" in layout.roles, last and "vocab" in layout.roles
    if sp:
        summed = embeds and layout.lookups_added  # all-reduced, positions added, the rank's tokens kept
        add("all_gather", (o_ if last else 0,), "forward")
        add("all_gather", e_ if first and train else (), "backward")
        add("all_gather", layout.sp_regathered(stage) if train else (), "backward")  # sp=megatron's
        add("reduce_scatter", (o_ if head and train else 0,), "backward")
        add("reduce_scatter", e_ if embeds and not summed else (), "forward")
        add("all_reduce", e_ if summed else (), "forward")
    else:
        add("all_reduce", e_ if embeds else (), "forward")
        add("all_reduce", (o_ if head and train else 0,), "backward")
    if last and has_loss:  # the vocab-parallel loss's max, sum and target logit
        add("all_reduce", (d.batch * (layout.out_seq // plan.cp) * 4,), "forward", 3)
    order = ("all_gather", "reduce_scatter", "all_reduce")  # as the ledger lists them
    calls = sorted((Call(k, x, c * m, phase) for (k, x, phase), c in out.items()), key=lambda c: order.index(c.kind))
    if sp and train and sequence_bytes:  # the sequence-parallel weights' partial gradients, once a step
        calls.append(Call("all_reduce", sequence_bytes, 1, "step"))
    return tuple(calls)
