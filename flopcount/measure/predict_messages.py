"""The collectives a plan's rank runs in a step, as the predictor's :class:`~.predict.Message` records: the ledger's
calls and bytes of each group (tensor, pipeline, data, expert and context parallel), one message per kind of call,
with how many times a step it runs and over how many ranks (the rules are in ``docs/predict.md``)."""

from __future__ import annotations

import dataclasses

from typing import Any

from .predict import BUCKET_BYTES, FIRST_BUCKET_BYTES, Message

__all__ = ["rank_messages"]


def rank_messages(r: Any, led: Any) -> tuple[Message, ...]:
    """The rank's collectives as messages (the predictor's rules)."""
    from flopcount.parallel.experts import dispatcher

    plan, d = led.plan, led.dims
    m, train = plan.microbatches, led.mode == "train"
    out = []
    first, last = r.stage == 0, r.stage == plan.pp - 1
    v = plan.virtual_stages if plan.schedule == "interleaved" and plan.pp > 1 else 1
    for c in r.communication:
        n = plan.group_ranks(c.group, d.get("kv_heads"))
        if c.group == "tp":  # the ledger's calls (flopcount.parallel.calls_tp), whose bytes sum to its total
            out.extend(Message(c.kind, "tp", x.bytes, x.count, n, x.phase) for x in c.calls)
        elif c.group == "pp":  # the ledger's bytes over its messages (an encoder-decoder's differ: their mean)
            fwd_calls, bwd_calls = m * (v - last), (m * (v - first) if train else 0)
            msg = c.bytes // (fwd_calls + bwd_calls) if c.bytes % (fwd_calls + bwd_calls) == 0 else \
                c.bytes / (fwd_calls + bwd_calls)
            out.append(Message("send_recv", "pp", msg, fwd_calls, 2, "send_forward"))
            if bwd_calls:
                out.append(Message("send_recv", "pp", msg, bwd_calls, 2, "send_backward"))
        elif c.group in ("tp_kv", "embedding"):  # a copy's gradients summed with the others', once a step
            out.append(Message(c.kind, c.group, c.bytes, 1, n, "step"))
        elif c.group in ("dp", "dp_cp", "edp") and c.kind == "all_reduce":
            first = min(c.bytes, FIRST_BUCKET_BYTES)
            out.append(Message("all_reduce", c.group, first, 1, n, "dp"))
            full, rest = divmod(c.bytes - first, BUCKET_BYTES)
            if full:
                out.append(Message("all_reduce", c.group, BUCKET_BYTES, full, n, "dp"))
            if rest:
                out.append(Message("all_reduce", c.group, rest, 1, n, "dp"))
        elif c.group in ("dp", "dp_cp") and plan.fsdp and c.kind in ("all_gather", "reduce_scatter"):
            # FSDP2's calls: each layer's parameters gathered before its forward and again before its backward, the
            # root's once, every microbatch; each layer's gradients and the root's reduce-scattered every microbatch
            layers = max(d.get("layers", 0) // (plan.pp * v), 1) * v  # the rank's layers (its chunks')
            calls = m * (2 * layers + 1 if c.kind == "all_gather" and train else layers + 1)
            out.append(Message(c.kind, c.group, c.bytes / calls, calls, n, "step", framework_bytes=c.bytes / calls))
        elif c.group in ("dp", "dp_cp", "edp"):
            out.append(Message(c.kind, c.group, c.bytes, 1, n, "step"))
        elif c.group == "tp_ep" and dispatcher(plan) == "allgather":  # the all-gather dispatcher's calls
            out.extend(_gathered_messages(c, led, n, v))
        elif c.group in ("ep", "tp_ep", "etp"):
            out.extend(_expert_messages(c, r, led, n, v))
        else:  # cp's K/V and tp_cp's router counts
            out.extend(_context_messages(c, r, led, n, v))
    strides = {g: plan.group_stride(g) for g in {x.group for x in out}}
    return tuple(dataclasses.replace(x, stride=strides[x.group]) for x in out)


def _expert_messages(c: Any, r: Any, led: Any, n: int, v: int) -> list[Message]:
    """The calls of the rank's MoE layers (the rules of :mod:`flopcount.parallel.experts`): before each dispatch an
    ``all_gather`` of the router's counts (``tp_ep``: a call of :func:`~flopcount.parallel.experts.counts_gathered`
    bytes each, so the calls are the ledger's bytes over that); each dispatch two ``all_to_all`` (``ep``: the tokens
    and their probabilities) and each combine one: three calls a dispatch, and three again a layer and microbatch in
    the backward, each call the average of the ledger's bytes over them. Under tp, sp and ep (group ``etp``) each
    dispatch two ``all_gather`` (the pairs received and their probabilities) and each combine one ``reduce_scatter``
    (the outputs), and in the backward a layer and microbatch one ``all_gather`` and two ``reduce_scatter``. The
    forward's L·M dispatches (L the MoE layers of the rank's chunks) are exposed in the forward; the backward's calls
    and a recompute's rerun (the dispatches past L·M, each with a combine) in the backward."""
    from flopcount.parallel.experts import counts_gathered

    plan, d, m = led.plan, led.dims, led.plan.microbatches
    each = counts_gathered(plan, d["experts"])
    gathers = sum(x.bytes for x in r.communication if x.group == "tp_ep" and x.kind == "all_gather") / each
    layers = min(m * max(d["moe_layers"] // (plan.pp * v), 1) * v, gathers)  # the forward's dispatches a step
    if c.group == "tp_ep":
        return [Message(c.kind, c.group, each, calls, n, phase)
                for calls, phase in ((layers, "forward"), (gathers - layers, "backward")) if calls > 0]
    back = layers if led.mode == "train" else 0
    if c.group == "etp":  # this kind's calls in a layer's forward (dispatch and combine) and in its backward
        fwd, bwd = (2, 1) if c.kind == "all_gather" else (1, 2)
        calls = {"forward": fwd * layers, "backward": fwd * (gathers - layers) + bwd * back}
    else:
        calls = {"forward": 3 * layers, "backward": 3 * (gathers - layers) + 3 * back}
    per = c.bytes / sum(calls.values())
    return [Message(c.kind, c.group, per, k, n, phase) for phase, k in calls.items() if k > 0]


def _gathered_messages(c: Any, led: Any, n: int, v: int) -> list[Message]:
    """The calls of the all-gather dispatcher over ``tp_ep`` (the rules of :mod:`flopcount.parallel.experts`, each
    call's bytes :func:`~flopcount.parallel.experts.allgather_calls`'): before each MoE layer's dispatch an
    ``all_gather`` of the routing map, one of the probabilities and, under ep > 1, one of the hidden states; under
    ep > 1 a ``reduce_scatter`` of the outputs in each combine; the first L·M of each (L the MoE layers of the
    rank's chunks) in the forward, a recompute's rerun past them in the backward; in the backward a layer and
    microbatch the gradients' calls, reversed (a ``reduce_scatter`` of the probabilities' and the hidden states', an
    ``all_gather`` of the outputs')."""
    from flopcount.parallel.experts import allgather_calls

    plan, d = led.plan, led.dims
    calls = allgather_calls(plan, d["batch"] * (d["seq"] // plan.cp), d["experts"], d["hidden"],
                            d["activation_bytes"], d["prob_bytes"])
    layers = plan.microbatches * max(d["moe_layers"] // (plan.pp * v), 1) * v
    back = layers if led.mode == "train" else 0
    passes, grads = (calls.dispatch, calls.combine_grad) if c.kind == "all_gather" else \
        (calls.combine, calls.dispatch_grad)
    runs = (c.bytes - back * sum(grads)) / sum(passes) if passes else 0  # the forward's and the reruns'
    out = []
    for size in passes:
        out += [Message(c.kind, c.group, size, k, n, phase)
                for k, phase in ((min(layers, runs), "forward"), (runs - min(layers, runs), "backward")) if k > 0]
    return out + [Message(c.kind, c.group, size, back, n, "backward") for size in grads if back]


def _context_messages(c: Any, r: Any, led: Any, n: int, v: int) -> list[Message]:
    """The calls of context parallelism (the rules of :mod:`flopcount.parallel.experts`): in each attention layer's
    forward an ``all_gather`` of its K and V (group ``cp``), and in its backward a ``reduce_scatter`` of their
    gradients, the same bytes a call, so a call is the ledger's ``reduce_scatter`` bytes over the forward's L·M
    layers (L the layers of the rank's chunks) and the gathers are the ledger's ``all_gather`` bytes over that: the
    first L·M exposed in the forward, those of a recompute's rerun past them in the backward. Without a backward
    (inference) the L·M gathers are the ledger's bytes over them. The auxiliary loss's counts (``tp_cp``): an
    ``all_reduce`` of R·8 bytes (:data:`~flopcount.parallel.experts.COUNT_BYTES`) per MoE layer and pass that
    records it, the first L·M (L the MoE layers of the rank's chunks) in the forward, a rerun's in the backward
    (all of them under ``full``, whose forward records none)."""
    from flopcount.parallel.experts import COUNT_BYTES

    plan, d, m = led.plan, led.dims, led.plan.microbatches
    if c.group == "tp_cp":  # under full recompute recorded only in the rerun (the forward runs without grad)
        each = d["experts"] * COUNT_BYTES
        layers = 0 if led.recompute.policy == "full" else m * max(d["moe_layers"] // (plan.pp * v), 1) * v
    else:
        layers = m * max(d.get("layers", 0) // (plan.pp * v), 1) * v
        scattered = sum(x.bytes for x in r.communication if x.group == "cp" and x.kind == "reduce_scatter")
        each = scattered / layers if scattered else c.bytes / layers
    calls = round(c.bytes / each) if each else 0
    if c.kind == "reduce_scatter":
        return [Message(c.kind, c.group, each, calls, n, "backward")] if calls else []
    return [Message(c.kind, c.group, each, k, n, phase)
            for k, phase in ((min(layers, calls), "forward"), (calls - min(layers, calls), "backward")) if k > 0]
