"""MFU per rank under a parallel plan, and the conventions other tools log, from the same run.

Plain arithmetic on the per-rank ledger (:func:`flopcount.parallel.ranks.ledger`, as its ``as_dict()``), every rank's
median step time (gathered once, when the result is formed) and the peak of one device. One meter step is one
optimizer step (all M microbatches of the plan).

**Rank order** (Megatron's): the tensor-parallel index varies fastest, then context, then data parallel, then the pipeline
stage: ``rank = tp + T·(cp + C·(dp + D·pp))``; the ``torch.distributed`` rank of each process is read against it.

**Per rank** r with median step time t_r and peak F (FLOP/s of one device):

* ``mfu`` = model_flops_r / t_r / F (the work the algorithm needs on that rank);
* ``hfu`` = hardware_flops_r / t_r / F (what it runs: replicated work and recompute included);
* the slowest rank has the longest median step time; ``imbalance`` = its step time / the mean over ranks.

**Conventions**, with W the whole model's FLOPs of one microbatch of b samples of s tokens (counted once, before
any split), M microbatches, world size N = tp·pp·cp·dp and t the slowest rank's step time (a synchronous step
ends with its slowest rank):

* ``megatron``: FLOP/s per GPU = W·M·dp / (N·t) (whole-model FLOPs of the global batch, divided by world size);
* ``torchtitan``: FLOP/s per device = W·M / (tp·pp·cp · t) (FLOPs of one data-parallel rank's batch, counted
  before sharding, divided by the non-data-parallel size);
* ``maxtext``: FLOP/s per device = B_dev · s · (W / (b·s)) / t, with the per-device batch B_dev = b·M·dp / N
  (per-device batch times FLOPs per token).

Each is also divided by F as that tool's MFU; MaxText's needs the tokens of a sample (s), known for a decoder the
ledger recognises and None otherwise.

**Data parallel on any model**: a plan with tp = pp = cp = ep = 1 needs no rule that splits a layer, since every
rank runs the whole model on its own microbatches: :func:`data_parallel_ledger` gives each rank W·M (plus one
forward pass per microbatch under ``full`` recompute) for a model the decoder rules do not recognise (the CNNs of
``flopcount bench``). A figure that cannot be formed is None with its reason under
``unavailable``.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from flopcount.errors import UsageError

__all__ = ["MESH_DIMS", "RANK_ORDER", "check_plan_world", "checked_plan", "data_parallel_ledger",
           "full_recompute_flops", "plan_from_mesh", "rank_figures"]

RANK_ORDER = "tp fastest, then cp, then dp, then pp (Megatron's): rank = tp + T*(cp + C*(dp + D*pp))"

#: A device mesh's dimension name → the degree of the plan it gives, in the plan's rank order (slowest first).
#: ``dp_replicate`` and ``dp_shard`` (HSDP's two data-parallel dims) multiply into ``dp``; a ``dp_shard`` or
#: ``fsdp`` dim of size above 1 means the parameters are sharded (``fsdp``).
MESH_DIMS = {"pp": "pp", "dp": "dp", "dp_replicate": "dp", "dp_shard": "dp", "fsdp": "dp", "cp": "cp", "tp": "tp"}


def plan_from_mesh(mesh, *, microbatches: int = 1, schedule: str = "1f1b", sp: bool = False):
    """The :class:`~flopcount.parallel.plan.ParallelPlan` a ``torch.distributed`` device mesh lays out: each named
    dimension (:data:`MESH_DIMS`) gives its degree, read from the mesh itself (``mesh_dim_names`` and its
    ``shape``). The dimensions must stand in the plan's rank order (:data:`RANK_ORDER`: pp, dp, cp, tp from the
    slowest), so that a process's rank in the mesh is its rank in the plan. What a mesh does not hold is given
    here: the microbatches and schedule of a pipeline, and ``sp``. Expert parallelism runs over dp·cp in these
    plans and is not a mesh dimension: give it in a plan string (``"dp=8,ep=8"``).

    A :class:`UsageError` names a dimension without a name, an unknown one, or dimensions out of order."""
    from flopcount.parallel.plan import ParallelPlan

    names = getattr(mesh, "mesh_dim_names", None)
    if not names:
        raise UsageError("Meter: plan= got a device mesh without dimension names; make it with "
                         "init_device_mesh(..., mesh_dim_names=('dp', 'tp')) so each size can be read as a degree")
    sizes = [int(n) for n in mesh.shape]
    order = list(MESH_DIMS)
    degrees = {"tp": 1, "pp": 1, "cp": 1, "dp": 1}
    sharded = False
    last = -1
    for name, size in zip(names, sizes):
        if name not in MESH_DIMS:
            hint = " (expert parallelism is laid over dp*cp here: give plan='dp=D,ep=E')" if name == "ep" else ""
            raise UsageError(f"Meter: plan= mesh dimension {name!r} is not one flopcount reads{hint}; name the "
                             f"dimensions among {', '.join(MESH_DIMS)}")
        if order.index(name) < last:
            raise UsageError(f"Meter: plan= mesh dimensions {tuple(names)} are not in the plan's rank order ("
                             f"{RANK_ORDER}); make the mesh with its dimensions in that order")
        last = order.index(name)
        degrees[MESH_DIMS[name]] *= size
        sharded = sharded or (name in ("dp_shard", "fsdp") and size > 1)
    return ParallelPlan(**degrees, sp=sp, fsdp=sharded, microbatches=microbatches, schedule=schedule)


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def checked_plan(plan, recompute, flops_per_sample):
    """The ``plan=`` argument as a :class:`~flopcount.parallel.plan.ParallelPlan` and the ledger's recompute policy, or
    (None, None) without a plan; a :class:`UsageError` naming ``plan`` when it cannot be used."""
    if plan is None:
        return None, None
    from flopcount.parallel.plan import ParallelPlan, parse_parallel, parse_recompute

    if isinstance(plan, str):
        plan = parse_parallel(plan)
    elif hasattr(plan, "mesh_dim_names"):
        plan = plan_from_mesh(plan)
    elif not isinstance(plan, ParallelPlan):
        raise UsageError(f"Meter: plan must be a flopcount.ParallelPlan, a string such as 'tp=2,dp=2' or a "
                         f"torch.distributed DeviceMesh with named dimensions, got "
                         f"{type(plan).__name__} {plan!r:.60}")
    if flops_per_sample is not None:
        raise UsageError("Meter: plan= needs a counted model (report= or model= with example_inputs=) to split its "
                         "FLOPs over the ranks; flops_per_sample= gives one number, not the model's nodes")
    policy = recompute if isinstance(recompute, str) else None
    if recompute is not None and not isinstance(recompute, str):
        raise UsageError("Meter: with plan=, recompute must be a policy (none, full, non-reentrant, selective or "
                         f"operator types such as 'Softmax,Gelu'), not FLOPs per sample ({recompute!r})")
    return plan, parse_recompute(policy)


def check_plan_world(plan, world_size: int) -> None:
    """A :class:`UsageError` naming both sizes when ``plan`` is not laid out over ``world_size`` ranks."""
    if plan.world_size != world_size:
        raise UsageError(f"Meter: plan {plan} has {plan.world_size} ranks (tp*pp*cp*dp) but the process group has "
                         f"{world_size}; give a plan whose degrees multiply to the world size")


def data_parallel_ledger(report: Any, plan: Any, recompute: Any) -> dict[str, Any]:
    """The ledger (as :meth:`flopcount.parallel.ranks.ParallelLedger.as_dict` shapes it) of a data-parallel plan on any
    counted model: each rank runs the whole model on M microbatches; ``full`` recompute adds one forward pass per
    microbatch. Another recompute policy needs the layer rules: a :class:`~flopcount.errors.UsageError`."""
    if plan.tp * plan.pp * plan.cp * plan.ep != 1:
        raise UsageError(f"plan {plan}: only a data-parallel plan applies to a model the decoder rules do not know")
    train = report.mode == "train"
    whole = report.forward.flops + (report.backward.flops if train else 0)  # the nodes' sum, without reading them
    policy = str(recompute)
    if policy not in ("none", "full"):
        raise UsageError(f"recompute={policy!r}: on a model the decoder rules do not know, a data-parallel plan "
                         "takes recompute none or full")
    again = report.forward.flops if policy == "full" and train else 0
    m = plan.microbatches
    ranks = [{"rank": r, "coords": {"tp": 0, "pp": 0, "cp": 0, "ep": 0, "dp": r}, "stage": 0,
              "model_flops": m * whole, "hardware_flops": m * (whole + again), "redundant_flops": 0,
              "recompute_flops": m * again} for r in range(plan.dp)]
    return {"plan": plan.as_dict(), "recompute": policy, "mode": report.mode, "whole_flops_per_microbatch": whole,
            "dims": {"batch": report.batch, "seq": None}, "bubble_fraction": 0.0, "slowest_rank": 0,
            "imbalance": 1.0, "ranks": ranks,
            "rules": "data parallel: every rank runs the whole model on its own microbatches"}


def full_recompute_flops(report: Any) -> float | None:
    """FLOPs per sample that ``recompute="full"`` reruns as the per-rank ledger counts it (each layer's whole
    forward, as Megatron's full recompute and torch's reentrant checkpoint run it), or None where the ledger's
    rules do not recognise the model (HFU then takes PaLM's one extra forward per sample)."""
    from flopcount.parallel.plan import ParallelPlan, parse_recompute
    from flopcount.parallel.ranks import ledger

    try:
        one = ledger(report, ParallelPlan(), parse_recompute("full"))
    except UsageError:
        return None
    return one.ranks[0].recompute_flops / report.batch


def rank_figures(led: Mapping[str, Any], per_rank: Sequence[Mapping[str, Any]], peak: float | None,
                 peak_source: str | None) -> dict[str, Any]:
    """The ``parallel`` figures of a run: ``led`` the ledger's ``as_dict()``, ``per_rank`` every rank's gathered
    local figures (``rank``, ``step_time_s``), ``peak`` one device's FLOP/s (None, ``peak_source`` saying why)."""
    unavailable: dict[str, str] = {}
    times = {r["rank"]: r.get("step_time_s") for r in per_rank}
    rows = []
    for r in led["ranks"]:
        t = times.get(r["rank"])
        rows.append({"rank": r["rank"], "coords": dict(r["coords"]), "stage": r["stage"],
                     "model_flops": r["model_flops"], "hardware_flops": r["hardware_flops"],
                     "redundant_flops": r["redundant_flops"], "recompute_flops": r["recompute_flops"],
                     "step_time_s": t, "mfu": _ratio(_ratio(r["model_flops"], t), peak),
                     "hfu": _ratio(_ratio(r["hardware_flops"], t), peak)})
    if peak is None:
        unavailable["mfu"] = unavailable["hfu"] = f"no peak: {peak_source}"
    elif any(row["step_time_s"] is None for row in rows):
        missing = [row["rank"] for row in rows if row["step_time_s"] is None]
        unavailable["mfu"] = unavailable["hfu"] = (f"rank(s) {', '.join(map(str, missing))} timed no step after "
                                                   "the warm-up")
    timed = [row for row in rows if row["step_time_s"]]
    slowest = max(timed, key=lambda row: (row["step_time_s"], -row["rank"])) if len(timed) == len(rows) else None
    t = slowest["step_time_s"] if slowest else None
    if slowest is None:
        unavailable["slowest_rank"] = unavailable["imbalance"] = "a rank timed no step after the warm-up"
    plan, dims, w = led["plan"], led["dims"], led["whole_flops_per_microbatch"]
    m, dp = plan["microbatches"], plan["dp"]
    world = plan["tp"] * plan["pp"] * plan["cp"] * dp
    non_dp = plan["tp"] * plan["pp"] * plan["cp"]
    b, s = dims["batch"], dims.get("seq")
    per_token = w / (b * s) if s else None
    device_batch = b * m * dp / world
    rates = {"megatron": _ratio(w * m * dp, world * t) if t else None,
             "torchtitan": _ratio(w * m, non_dp * t) if t else None,
             "maxtext": _ratio(device_batch * s * per_token, t) if t and s else None}
    formulas = {"megatron": "W*M*dp / (world_size * t): whole-model FLOPs of the global batch per GPU",
                "torchtitan": "W*M / (tp*pp*cp * t): one data-parallel rank's whole-model FLOPs over the "
                              "non-data-parallel size",
                "maxtext": "per_device_batch * seq * flops_per_token / t, per_device_batch = b*M*dp / world_size"}
    conventions = {}
    for name, rate in rates.items():
        why = None if rate is not None else "no step time (a rank timed no step after the warm-up)"
        if name == "maxtext" and not s:
            why = ("no tokens per sample: the model is not a decoder the ledger recognises, so MaxText's FLOPs per "
                   "token cannot be formed")
        mfu = _ratio(rate, peak)
        if rate is not None and mfu is None:
            why = f"no peak: {peak_source}"
        conventions[name] = {"flops_per_s_per_device": rate, "mfu": mfu, "formula": formulas[name],
                             "unavailable": why}
    conventions["maxtext"]["per_device_batch"] = device_batch
    conventions["maxtext"]["flops_per_token"] = per_token
    mean = statistics.fmean(row["step_time_s"] for row in timed) if slowest else None
    return {"plan": dict(plan), "recompute": led["recompute"], "rank_order": RANK_ORDER,
            "whole_flops_per_microbatch": w, "peak_flops": peak, "peak_source": peak_source,
            "step_time_s": t, "ranks": rows,
            "slowest_rank": slowest["rank"] if slowest else None,
            "imbalance": _ratio(t, mean) if slowest else None,
            "imbalance_how": "the slowest rank's median step time / the mean over ranks",
            "ledger": {"slowest_rank": led["slowest_rank"], "imbalance": led["imbalance"],
                       "bubble_fraction": led["bubble_fraction"]},
            "conventions": conventions, "unavailable": unavailable}
