"""``flopcount plan``: every plan of a decoder on N devices that fits their memory, ranked by predicted throughput.

The plans tried are :mod:`flopcount.measure.plan_space`'s. The model is counted for training once per microbatch
size and recompute policy, with its memory ledger (whose graph keeps what the policy recomputes); each plan is
then

1. **checked**: a plan the model cannot split (a degree that does not divide the heads, the layers, the
   vocabulary ..., a recompute policy the model has nothing for) is dropped and counted by the reason the per-rank
   ledgers give;
2. **fitted**: its largest per-rank peak (:func:`flopcount.memory.ranks.per_rank`, the walk of each stage's nodes
   at the rank's shares) against the device's memory; a plan over it is dropped and counted ("over memory");
3. **predicted** (:mod:`flopcount.measure.predict` on its per-rank ledger, :func:`flopcount.parallel.ranks.ledger`).

Plans are ranked by tokens per second (plans of different global batches compare by throughput), ties by MFU.

What is shared between plans, exactly:

* a layout's chunks, modules' shares and FSDP padding (plans of the same tp, ep, pp, chunks and FSDP D·C, each
  checked itself: :func:`flopcount.parallel.layout.layout_of`; the gathered inputs under sp once per count), a
  tensor's share on a rank (plans of the same tp, sp, cp, ep, FSDP shards and EP load) and a stage's walk structure
  (its nodes', with the trained tensors its optimizer steps in the graph's order:
  :class:`flopcount.memory.ledger.OnRank`), in :mod:`flopcount.memory.ranks`, where a stage's tensors are placed in
  the walk's order by their place among its stored, made and received ones and its nodes that keep statistics are
  listed (both once per stage's nodes), a stored share's bytes are found once per its key (the walks' FSDP and ZeRO-2
  units read them too), a share's shape and bytes once per shape, element type, divisor and multiplier, and a node's
  statistics at a share once per saved record, multiplier and divisor, whatever the tensor's name or layer (a
  stack's layers hold a few);
* a stage's memory walk reads the plan's tp, sp, cp, ep, pp and interleaving (which nodes a rank runs, at what
  shares), the sharding and the D·C ranks it shards over, whether more than one microbatch accumulates gradients,
  the recompute policy and the microbatch size; not dp without sharding, the schedule's name (1f1b and gpipe run
  the same chunks) or M. One walk per such key serves every plan that shares it: a plan's rank peak is the walk's
  with the other in-flight microbatches' activations held for its own schedule
  (:func:`flopcount.parallel.layout.in_flight`), as the per-rank ledger adds them;
* a stage's graph at a rank's shares reads the stage's nodes, whether it is the first, the shares of what it makes
  and receives (tp, sp, cp, ep, the EP rank's load) and of the stored tensors (tp, ep, FSDP shards): it is built once
  for the walks that share these, with its ZeRO shards and units, and its forward and backward walked from no bytes
  alive are kept beside it (per ZeRO-2 gradient shards, the backward per accumulation): a walk of another key on it
  (another ZeRO start, M) is the kept one moved by its start (:class:`flopcount.memory.tape.Replayed`); the forward,
  which reads only the storages the stage makes and receives, is shared by its graphs of other stored shares (fsdp)
  too, unless a view of a stored tensor is a storage of its own;
* a plan's data- and context-parallel replicas run the same work (the ledger lists them with equal figures), so
  without expert parallelism the FLOPs ledger lists data-parallel rank 0's ranks alone and the prediction reads
  them, each node's seconds once per distinct share; only its point (the best repeats: step, tokens per second,
  MFU) is predicted, which is all the ranking reads;
* a prediction's work is found once per what it reads: a node's share on a TP rank once per the node's FLOPs, rule
  and first stage (the layers' nodes alike: :func:`flopcount.parallel.ranks.node_shares`), a node's work once per
  its facts and share, a chunk's works one tuple per content (the TP ranks of an even split, the stages of equal
  layers, the plans of the same node shares: other dp, sharding, M or schedule's name), timed once, its nodes'
  seconds summed in their order (:mod:`flopcount.measure.predict_report`), under cp a node's work at 1/C of the
  sequence once per work and C (a chunk's layers hold the same works); a rank's optimizer elements and a
  stage's parameter groups summed once per kind of module (:func:`flopcount.parallel.optimizer.module_kinds`;
  integers: in any order) and a rank's optimizer tensors once per stage and optimizer FLOPs. A plan's FLOPs ledger
  is made without its pipeline schedule simulated in FLOPs, which the search does not read (the point simulates its
  own, of the predicted seconds): :func:`flopcount.parallel.ranks.ledger`'s ``schedule=False``, whose record says so
  by None; the nodes inside a routed MoE block (the ledger's reruns under the all-gather dispatcher read them) are
  found once per count's scopes (:func:`flopcount.parallel.experts.block_ends`). The figures are those of the plan
  predicted alone, to the bit;
* the memory walks and the floors check a plan as its FLOPs ledger checks it, and read the dims, without building
  the ledger's node shares (:func:`flopcount.parallel.ranks.plan_dims`): the shares are built for the plans
  predicted, once per node shares and recompute policy, not for the floors of each policy; the operator types an
  ``ops`` recompute policy is checked against are found once per count's node list, a plan's MoE layers from the
  layout's experts' flags without a loop over the nodes;
* a ``zero1`` plan, and a ``zero2`` plan of M > 1, walks as its plan without ZeRO does but from a start larger by
  the difference of its optimizer states and gradients (:func:`flopcount.memory.ranks.stage_states`), with zero2's
  bucket held: its peak is that walk's so moved, where that walk's peak is not at the optimizer step (whose
  temporaries the shards make smaller);
* a plan whose key is not walked yet has a floor first (the most a rank holds in parameters, optimizer states and
  accumulated gradients at the walk's own shares, :func:`flopcount.memory.ranks.stage_states`, which its peak adds
  to; with the activations each rank keeps at the end of a microbatch's forward, its in-flight microbatches' held
  besides, once a plan of the same kept activations is walked: they read tp, sp, cp, ep, pp, the chunks, the
  recompute policy, the microbatch size and the FSDP shards, not dp, ZeRO or M): a floor over the device's memory and above the least peak over memory its process found before it (with
  its place in the answer's order, ties to the first) drops the plan over memory without its walks; it can be
  neither a plan that fits nor a smaller ``smallest`` (the first plan of the least peak is kept, as without the
  floor);
* the recompute policies' counts share their node lists, and their memory graphs one node list, tensors, saved
  records and gradients' flags (``flopcount plan``'s counts do: :func:`flopcount.cli.plan.reports`), so the plans
  of the same node shares are walked policy after policy, reading the same layouts, and the walks' memos of the
  policies' graphs share what reads none of their recompute units (:data:`flopcount.memory.rank_memo.SHARED`):
  each stage's nodes, its tensors at a rank's shares with their bytes and its gathered K and V (kept up to 16
  times the graph's tensors: a node shares' stages at every cp and FSDP shards, policy after policy), the stored
  tensors' and the ZeRO shares, the statistics at a share and the stages' states of the floors (by the count's
  optimizer, its step and master weights too); a stage's graph, its walk structure and its replays read the units
  and are each policy's own; the groups of such plans are shared
  out to worker processes (``jobs``), each keeping its memos from group to group, and the answer is the same
  whatever their number; Python's cyclic collector is paused through each group (its full collections rescanned
  the counts' and the memos' objects), and what lived before the search and what each group leaves (the memos) is
  frozen out of its reach (``gc.freeze``) until the search returns: between groups it has little to scan.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable

from flopcount.errors import FlopcountError, UsageError
from flopcount.memory.ledger import without_cyclic_gc

from .plan_space import Choice, SpaceSettings, choices, reason

__all__ = ["Candidate", "OVER_MEMORY", "Search", "check_report", "search"]

#: The dropped count of the plans whose largest per-rank peak exceeds the device's memory.
OVER_MEMORY = "over memory (the largest per-rank peak exceeds --device-memory)"


@dataclass(frozen=True)
class Candidate:
    """One plan and its figures: its step, throughput and MFU predicted, its largest per-rank peak (bytes) and the
    device memory left beside it, its step's model FLOPs (all ranks) and the busiest rank's hardware FLOPs."""

    parallel: str  # as --parallel reads it
    schedule: str  # "-" without a pipeline
    microbatch_size: int
    microbatches: int
    recompute: str
    step_seconds: float | None
    tokens_per_second: float | None
    mfu: float | None
    peak_bytes: int
    headroom_bytes: int | None
    model_flops: int | None = None
    hardware_flops: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def command(self) -> str:
        """The flags that count this plan alone."""
        out = f"--parallel {self.parallel} --microbatches {self.microbatches} --recompute {self.recompute}"
        return out + (f" --schedule {self.schedule}" if self.schedule != "-" else "")


@dataclass(frozen=True)
class Search:
    """The plans that fit (ranked), the plans dropped (counted by reason), the plan of the least peak among those
    over memory (``smallest``; None when none was over) and the plans tried."""

    plans: list[Candidate]
    dropped: Counter
    smallest: Candidate | None
    tried: int


class _Walks:
    """Per-rank memory peaks of plans, one walk per key shared by the plans (see the module)."""

    def __init__(self, report_of: Callable[[int, str], Any]):
        self.report_of = report_of
        self.walked: dict[tuple, Any] = {}
        self.states: dict[tuple, list] = {}
        self.kept: dict[tuple, list[tuple[int, int]]] = {}  # (stage, kept activations) per rank, by kept_key
        # the least peak over memory these walks found: (peak, the plan's place in the answer, the plan)
        self.least: tuple[int, int, Candidate] | None = None

    @staticmethod
    def key(c: Choice) -> tuple:
        p = c.plan
        v = p.virtual_stages if p.schedule == "interleaved" else 1
        shards = p.dp * p.cp if p.zero_stage else 0
        return (c.size, c.recompute, p.tp, p.sp, p.cp, p.ep, p.pp, v, p.zero_stage, shards, p.microbatches > 1,
                p.microbatches % p.pp == 0 if v > 1 else True)

    @staticmethod
    def kept_key(c: Choice) -> tuple:
        """What a plan's ranks' kept activations (one microbatch's, at the end of its forward) read: not dp without
        FSDP, the sharding's states and gradients, or M."""
        p = c.plan
        v = p.virtual_stages if p.schedule == "interleaved" else 1
        return c.size, c.recompute, p.tp, p.sp, p.cp, p.ep, p.pp, v, p.dp * p.cp if p.fsdp else 0

    def floor(self, c: Choice) -> int | None:
        """A lower bound of ``c``'s largest per-rank peak without a walk, the refusals raised; None when its key is
        walked (its peak is known). Its ranks' parameters, optimizer states and accumulated gradients
        (:func:`flopcount.memory.ranks.stage_states`), held throughout the walk, and where a plan of the same
        kept activations was walked, those too: all alive at the end of the forward, each other microbatch's in
        flight held besides, as the per-rank ledger adds them."""
        from flopcount.parallel.layout import in_flight

        if self.key(c) in self.walked:
            return None
        base = [s.params + s.states + s.grads for s in self._states(c)]
        kept = self.kept.get(self.kept_key(c), ())
        return max([*base, *(base[s] + act + int(act * (in_flight(c.plan, s) - 1)) for s, act in kept)])

    def peak(self, c: Choice) -> int:
        """The largest per-rank peak of ``c``'s plan; the per-rank ledgers' refusal raised."""
        from flopcount.parallel.layout import in_flight

        found = self._shared(c) or self._walk(c)
        if isinstance(found, Exception):
            raise found
        walked_plan, ranks, _ = found
        return max(peak - int(act * (in_flight(walked_plan, s) - 1)) + int(act * (in_flight(c.plan, s) - 1))
                   for s, peak, act, _ in ranks)

    def _states(self, c: Choice) -> list:
        """``c``'s stages' states (they read nothing its key does not), refused as its walk would be."""
        from flopcount.memory.ranks import stage_states
        from flopcount.parallel.layout import layout_of

        k = self.key(c)
        if k not in self.states:
            layout_of(self.report_of(c.size, "none"), c.plan)  # refused by the layout first, as by the walk
            self.states[k] = stage_states(self.report_of(c.size, c.recompute), c.plan)
        return self.states[k]

    def _walk(self, c: Choice) -> Any:
        """``c``'s key's walk: (the plan walked, (stage, peak, activations, peak phase) per rank, its stages'
        states or None), or the refusal."""
        from flopcount.memory.ranks import per_rank
        from flopcount.parallel.layout import layout_of

        k = self.key(c)
        if k not in self.walked:
            try:  # what the model cannot split is refused by the layout before a policy's own count is made
                layout_of(self.report_of(c.size, "none"), c.plan)
                mem = per_rank(self.report_of(c.size, c.recompute), c.plan)
                self.kept.setdefault(self.kept_key(c), [(r.stage, r.activations_bytes) for r in mem.ranks])
                self.walked[k] = (c.plan, [(r.stage, r.peak_bytes, r.activations_bytes, r.peak_phase)
                                           for r in mem.ranks], None)
            except FlopcountError as e:
                self.walked[k] = e
        return self.walked[k]

    def _shared(self, c: Choice) -> Any:
        """A ``zero1`` plan's, or a ``zero2`` plan's of M > 1, walk found from its plan without ZeRO's: the same
        walk (the parameters whole, gradients accumulated from the start or whole) from a start larger by its
        optimizer states' and gradients' difference, with zero2's bucket held, where that walk's peak is not at
        the optimizer step (whose temporaries the shards change); None where not."""
        p = c.plan
        if not p.zero_stage or p.fsdp or (p.zero2 and p.microbatches == 1) or self.key(c) in self.walked:
            return None
        whole = Choice(dataclasses.replace(p, zero1=False, zero2=False), c.recompute, c.size)
        found = self._walk(whole)
        if isinstance(found, Exception) or any(phase == "optimizer step" for *_, phase in found[1]):
            return None
        if found[2] is None:
            found = self.walked[self.key(whole)] = (*found[:2], self._states(whole))
        plan, ranks, before = found
        mine = self._states(c)
        shifted = [(s, peak + mine[s].states - before[s].states + mine[s].grads - before[s].grads + mine[s].bucket,
                    act, phase) for s, peak, act, phase in ranks]
        self.walked[self.key(c)] = (plan, shifted, mine)
        return self.walked[self.key(c)]


def _predicted(report: Any, c: Choice, profile: Any) -> tuple[tuple[int, int], tuple]:
    """((the step's model FLOPs, all ranks; the busiest rank's hardware FLOPs), (step seconds, tokens per second,
    MFU) predicted) of ``c``. Without expert parallelism (where an EP rank is drawn from the data-parallel ranks)
    the data-parallel replicas run the same FLOPs and collectives: the ledger lists those of data-parallel rank 0
    (:func:`flopcount.parallel.ranks.ledger`'s ``replicas``), the prediction reads them, and the model FLOPs are
    theirs D times. Only the point is predicted (:func:`flopcount.measure.predict.predict_point`)."""
    from flopcount.parallel.plan import parse_recompute
    from flopcount.parallel.ranks import ledger

    from .predict import predict_point, work_of

    led = ledger(report, c.plan, parse_recompute(c.recompute), replicas=c.plan.ep > 1, schedule=False)
    times = 1 if c.plan.ep > 1 else c.plan.dp
    flops = (times * sum(r.model_flops for r in led.ranks), max(r.hardware_flops for r in led.ranks))
    return flops, predict_point(work_of(dataclasses.replace(report, parallel=led)), profile)


def search(report_of: Callable[[int, str], Any], profile: Any, space: SpaceSettings,
           device_memory: int | None, sample: int | None = None, jobs: int = 1) -> Search:
    """Every plan of ``space`` checked, fitted to ``device_memory`` bytes (None: not fitted) and predicted on
    ``profile``, ranked (see the module). ``report_of(size, recompute)``: the training count of one microbatch of
    ``size`` sequences with its memory ledger under that recompute policy. ``sample``: only so many plans or a few
    more, whole groups of the same node shares drawn at random, as a benchmark times a search too long to run
    whole. ``jobs``: worker processes the groups of plans of the same node shares are shared out to (forked, where
    the platform forks; the answer is the same whatever the number)."""
    tried, dropped = choices(space)
    if sample is not None and sample < len(tried):
        tried, dropped = _sampled(tried, sample), Counter()
    total = len(tried) + sum(dropped.values())
    # each plan's place in the order of the answer (ties of throughput, and the least peak, go to the first);
    # the plans of the same node shares, each recompute policy in turn, walked one after another: the ledgers keep
    # the last shares asked, and the layouts read no policy
    tried.sort(key=_shares)
    groups: dict[tuple, list[int]] = {}
    for i, c in sorted(enumerate(tried), key=lambda x: _walked_order(x[1])):
        groups.setdefault(_walked_order(c)[:-1], []).append(i)
    parts = [_Part(ix) for ix in groups.values()]
    found: list[tuple[int, Candidate]] = []
    least: tuple[int, int, Candidate] | None = None
    for part in _frozen_run(_Job(report_of, profile, tried, device_memory), parts, jobs):
        found += part.found
        dropped += part.dropped
        if part.least is not None and (least is None or part.least[:2] < least[:2]):
            least = part.least
    found.sort(key=lambda x: (-(x[1].tokens_per_second or 0.0), -(x[1].mfu or 0.0), x[1].parallel,
                              x[1].microbatches, x[0]))
    return Search([x for _, x in found], dropped, None if least is None else least[2], total)


@dataclass(frozen=True)
class _Job:
    """What every part of a search reads: the counts, the profile, the plans (in the answer's order) and the memory;
    whether what a part leaves is frozen (:func:`_frozen_run`)."""

    report_of: Callable[[int, str], Any]
    profile: Any
    tried: list[Choice]
    device_memory: int | None
    freeze: bool = True


@dataclass(frozen=True)
class _Part:
    """The places (in the answer's order) of one group of plans of the same node shares, in the order walked."""

    places: list[int]


@dataclass(frozen=True)
class _Done:
    """A part searched: its plans that fit (each with its place), its dropped counts and the least peak over memory
    its process found so far (peak, place, plan), None when none was over."""

    found: list[tuple[int, Candidate]]
    dropped: Counter
    least: tuple[int, int, Candidate] | None


#: The search the forked workers run parts of (set before they fork; each has its own ledgers' memos).
_forked: list[Any] = []


def _frozen_run(job: _Job, parts: list[_Part], jobs: int) -> list[_Done]:
    """:func:`_run_parts` with the objects made before it (the counts', the libraries') out of the cyclic
    collector's reach (``gc.freeze``) until it returns, and after each part what the part made (the walks' memos,
    kept for the next parts): they live on, and each collection the collector would run between parts would scan
    them all again. Reference counting frees what the parts drop; what only the collector frees (reference cycles)
    is collected after the search (``gc.unfreeze``: what was frozen is the collector's again). Where the caller has
    frozen objects of its own, nothing is frozen (unfreezing would give the collector theirs too)."""
    import gc

    if gc.get_freeze_count():
        return _run_parts(dataclasses.replace(job, freeze=False), parts, jobs)
    gc.freeze()
    try:
        return _run_parts(job, parts, jobs)
    finally:
        gc.unfreeze()


def _run_parts(job: _Job, parts: list[_Part], jobs: int) -> list[_Done]:
    """Each part searched, in worker processes when ``jobs`` > 1 and the platform forks (else here), their walks'
    memos kept from part to part in each; the counts made here first, so that each worker has them."""
    import multiprocessing

    if jobs <= 1 or len(parts) <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        walks = _Walks(job.report_of)
        return [_frozen_part(job, part, walks) for part in parts]
    for size, recompute in dict.fromkeys((c.size, c.recompute) for c in job.tried):
        try:
            job.report_of(size, recompute)
        except FlopcountError:  # refused per plan in the part, as without workers
            pass
    _forked[:] = [job, None]
    try:
        with multiprocessing.get_context("fork").Pool(min(jobs, len(parts))) as pool:
            return list(pool.imap(_forked_part, parts))
    finally:
        _forked.clear()


def _forked_part(part: _Part) -> _Done:
    """``part`` of the search a worker was forked with, its walks' memos kept for its next part."""
    job, walks = _forked
    if walks is None:
        walks = _forked[1] = _Walks(job.report_of)
    return _frozen_part(job, part, walks)


def _frozen_part(job: _Job, part: _Part, walks: _Walks) -> _Done:
    """:func:`_search_part`, and what it left alive frozen before the collector runs again (see
    :func:`_frozen_run`)."""
    import gc

    was_enabled = gc.isenabled()
    gc.disable()
    try:
        done = _search_part(job, part, walks)
        if job.freeze:
            gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
    return done


@without_cyclic_gc
def _search_part(job: _Job, part: _Part, walks: _Walks) -> _Done:
    """The plans of ``part`` checked, fitted and predicted (see :func:`search`). A plan whose floor is over memory
    and above the least peak over memory found before it by ``walks`` (this process's, kept from part to part) is
    dropped unwalked: it can be neither a plan that fits nor the least peak of the whole search. Python's cyclic
    collector is paused through the part (as through a walk): each full collection would rescan the counts' and
    the memos' millions of objects; it runs again between parts."""
    found: list[tuple[int, Candidate]] = []
    dropped: Counter = Counter()
    for i in part.places:
        c = job.tried[i]
        p = c.plan
        least = walks.least
        try:
            # over memory by its floor alone, and not below the least peak over memory found before it: not walked
            floor = walks.floor(c) if job.device_memory is not None and least is not None else None
            if floor is not None and floor > job.device_memory and (floor, i) > least[:2]:
                dropped[OVER_MEMORY] += 1
                continue
            peak = walks.peak(c)
        except FlopcountError as e:
            dropped[reason(e)] += 1
            continue
        if job.device_memory is not None and peak > job.device_memory:
            dropped[OVER_MEMORY] += 1
            if least is None or (peak, i) < least[:2]:
                walks.least = (peak, i, Candidate(c.text, c.schedule, c.size, p.microbatches, c.recompute, None,
                                                  None, None, peak, None))
            continue
        try:
            flops, pred = _predicted(job.report_of(c.size, c.recompute), c, job.profile)
        except FlopcountError as e:
            dropped[reason(e)] += 1
            continue
        found.append((i, Candidate(c.text, c.schedule, c.size, p.microbatches, c.recompute, *pred, peak,
                                   None if job.device_memory is None else job.device_memory - peak, *flops)))
    return _Done(found, dropped, walks.least)


def _shares(c: Choice) -> tuple:
    """What a plan's node shares read: the search's answer lists plans in this order (ties to the first)."""
    return c.size, c.recompute, c.plan.tp, c.plan.sp, c.plan.pp, c.plan.virtual_stages


def _walked_order(c: Choice) -> tuple:
    """The order the search walks plans in: those of the same node shares one after another, each recompute policy
    in turn (the counts of the policies share their node lists, and so their layouts)."""
    return c.size, c.plan.tp, c.plan.sp, c.plan.pp, c.plan.virtual_stages, c.recompute


def _sampled(tried: list[Choice], sample: int) -> list[Choice]:
    """At least ``sample`` plans: every plan of groups of the same node shares drawn at random (seeded), whole, so
    that what the search shares between plans is shared as in the whole search."""
    import random

    groups: dict[tuple, list[Choice]] = {}
    for c in tried:
        groups.setdefault(_shares(c), []).append(c)
    keys = list(groups)
    random.Random(0).shuffle(keys)
    out: list[Choice] = []
    for k in keys:
        if len(out) >= sample:
            break
        out += groups[k]
    return out


def check_report(report: Any) -> None:
    """:class:`UsageError` for a count the search cannot take: not of training."""
    if report.mode != "train":
        raise UsageError("plan: the model must be counted for training (--mode train)")
