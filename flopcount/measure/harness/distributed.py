"""Scale-out under torch.distributed: joining the launcher's process group, data parallelism with measured
gradient communication, and the sharded epoch order.

flopcount writes no distribution of its own: ranks are started by ``torchrun`` or SLURM's ``srun``, talk through
torch.distributed (NCCL on GPUs, gloo on CPUs), and a model is replicated with ``DistributedDataParallel``.

Sketch::

    from flopcount.measure.harness import distributed
    ranks = distributed.init("cuda")          # RANK/WORLD_SIZE from torchrun, SLURM_PROCID/... from srun
    dp = distributed.DataParallel()
    model = dp.wrap(net.to(ranks.device))     # DDP, with a hook that counts the gradient bytes it all-reduces
    order = dp.sampler(len(train_set), seed=0)  # epoch -> this rank's indices of a seeded shuffle
    meter.communication = dp.counter          # the run's ``communication`` figures, COI included

**Communication, measured**: :class:`CommCounter` is a DDP communication hook that adds the bytes of every gradient
bucket it hands to the all-reduce (the default hook's all-reduce, unchanged) and counts a step at each step's last
bucket. It runs where DDP already runs its hook, so it adds no synchronisation. Beside it, the closed form of a
ring all-reduce: each rank sends 2·(R−1)/R × the gradient bytes (R ranks sharing the gradients). The
communication operation intensity is COI = training FLOPs of a rank's step / bytes that rank all-reduces per step.
"""

from __future__ import annotations

import datetime
import inspect
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from flopcount.errors import DeviceError, MeasurementError, UsageError, import_framework

from .ranks import running_dist

__all__ = ["COLLECTIVE_SHARE", "CommCounter", "DEFAULT_TIMEOUT_S", "DataParallel", "Ranks", "finish", "gradient_bytes",
           "current", "init", "launcher", "peer_failure", "ring_bytes", "shard", "silent_ranks"]


@dataclass(frozen=True)
class Ranks:
    """Where this process stands: its rank among ``world_size``, its rank on its node, the backend and the device."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    backend: str | None  # None without torch.distributed
    launcher: str  # "torchrun", "srun", "existing" (the caller initialised the group) or "none"
    device: str


def _torch():
    try:
        return import_framework("torch")
    except ModuleNotFoundError:
        raise DeviceError("distributed training runs on PyTorch, which is not installed: pip install torch") from None


def launcher() -> str | None:
    """``"torchrun"`` when torchrun (or torch.distributed's env:// convention) set RANK and WORLD_SIZE, ``"srun"``
    inside a SLURM step of more than one task, else None."""
    env = os.environ
    if env.get("RANK", "").isdigit() and env.get("WORLD_SIZE", "").isdigit():
        return "torchrun"
    if env.get("SLURM_PROCID", "").isdigit() and int(env.get("SLURM_NTASKS", "1") or 1) > 1:
        return "srun"
    return None


def _slurm_tasks_on_node() -> int | None:
    """This node's task count from SLURM_TASKS_PER_NODE (``4(x2),3``) and SLURM_NODEID."""
    text, node = os.environ.get("SLURM_TASKS_PER_NODE", ""), os.environ.get("SLURM_NODEID", "")
    if not text or not node.isdigit():
        return None
    counts: list[int] = []
    for part in text.split(","):
        n, _, rep = part.partition("(x")
        try:
            counts += [int(n)] * (int(rep.rstrip(")")) if rep else 1)
        except ValueError:
            return None
    return counts[int(node)] if int(node) < len(counts) else None


def _from_srun() -> None:
    """Translate srun's variables into torch.distributed's env:// ones (RANK, WORLD_SIZE, LOCAL_RANK ...)."""
    env = os.environ
    if not env.get("MASTER_ADDR"):
        raise UsageError("srun: MASTER_ADDR is not set; export it in the sbatch script, e.g. "
                         "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1) "
                         "(see docs/cluster.md)")
    env.setdefault("MASTER_PORT", "29500")
    env["RANK"] = env["SLURM_PROCID"]
    env["WORLD_SIZE"] = env["SLURM_NTASKS"]
    env.setdefault("LOCAL_RANK", env.get("SLURM_LOCALID", "0"))
    per_node = _slurm_tasks_on_node()
    if per_node:
        env.setdefault("LOCAL_WORLD_SIZE", str(per_node))


#: Default of ``timeout_s``: how long a rank waits for a peer that stopped answering, in all (``--timeout``).
DEFAULT_TIMEOUT_S = 600.0
#: The share of ``timeout_s`` a collective waits; the rest is the roll call that names the silent ranks.
COLLECTIVE_SHARE = 2 / 3


def init(device: str = "cpu", backend: str | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> Ranks:
    """Join the process group the launcher describes (idempotent), or report one rank when nothing launched ranks.

    ``device`` is ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` is taken as ``"cuda"``): on CUDA, rank ``LOCAL_RANK`` of a
    node takes GPU ``LOCAL_RANK`` and the backend is NCCL; on the CPU the backend is gloo. ``timeout_s`` bounds how
    long a rank waits for a peer that hung or died: its collectives time out after :data:`COLLECTIVE_SHARE` of it,
    and :func:`peer_failure`'s roll call takes the rest (None: torch's own default)."""
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool)
                                      and 0 < timeout_s < float("inf")):
        raise UsageError(f"distributed.init: timeout_s must be a finite number of seconds > 0, got {timeout_s!r}")
    torch = _torch()
    cuda = str(device).startswith("cuda")
    dist = torch.distributed
    if not dist.is_available():
        raise DeviceError("this PyTorch build has no torch.distributed; install a build with it")
    env = os.environ
    if dist.is_initialized():
        how = "existing"
    else:
        how = launcher() or "none"
        if how == "none":
            return Ranks(0, 1, 0, 1, None, "none", str(device))
        if how == "srun":
            _from_srun()
    local = int(env.get("LOCAL_RANK", "0") or 0)
    dev = "cpu"
    if cuda:
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {device}: torch sees no CUDA device on this rank (LOCAL_RANK={local}); "
                              "use --device cpu (gloo)")
        count = torch.cuda.device_count()
        if count == 1:
            index = 0  # the launcher bound one GPU to this rank (srun --gpus-per-task=1, CUDA_VISIBLE_DEVICES)
        elif local < count:
            index = local
        else:
            raise DeviceError(f"LOCAL_RANK={local} but this rank sees {count} CUDA devices: launch at most {count} "
                              "ranks per node (torchrun --nproc_per_node, srun --ntasks-per-node)")
        dev = f"cuda:{index}"
        torch.cuda.set_device(index)
    if not dist.is_initialized():
        backend = backend or ("nccl" if cuda else "gloo")
        kw: dict[str, Any] = {"device_id": torch.device(dev)} if cuda else {}
        if timeout_s is not None and "timeout" in inspect.signature(dist.init_process_group).parameters:
            kw["timeout"] = datetime.timedelta(seconds=timeout_s * COLLECTIVE_SHARE)
        try:
            dist.init_process_group(backend=backend, init_method="env://", **kw)
        except RuntimeError as e:  # torch's DistStoreError/DistNetworkError: a rank that never joined
            from flopcount.errors import first_line

            raise MeasurementError(f"rank {env.get('RANK')}: the {backend} process group of {env.get('WORLD_SIZE')} "
                                   f"ranks did not form ({first_line(e, 200)}); check that every rank was started "
                                   "and can reach MASTER_ADDR:MASTER_PORT") from None
    per_node = env.get("LOCAL_WORLD_SIZE", "")
    world = dist.get_world_size()
    return Ranks(dist.get_rank(), world, local, int(per_node) if per_node.isdigit() else world,
                 dist.get_backend(), how, dev)


def silent_ranks(rank: int, world: int, wait_s: float) -> list[int] | None:
    """A roll call through the launcher's rendezvous store (``MASTER_ADDR:MASTER_PORT``, where torchrun's agent or
    rank 0 keeps it): this rank checks in and waits up to ``wait_s`` seconds for the others. Returns the ranks
    that did not check in (``[]``: every rank is alive), or None when the store itself cannot be reached."""
    import time

    dist = _torch().distributed
    env = os.environ
    prefix = f"flopcount/roll-call/{env.get('TORCHELASTIC_RUN_ID', '')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
    wait = datetime.timedelta(seconds=max(wait_s, 0.5))
    try:
        store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=wait)
        store.set(f"{prefix}{rank}", "alive")
        deadline = time.monotonic() + wait_s
        while True:
            missing = [r for r in range(world) if not store.check([f"{prefix}{r}"])]
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(0.05)
    except (RuntimeError, KeyError, ValueError, OSError):  # torch's DistError is a RuntimeError
        return None


def peer_failure(error: BaseException, ranks: Ranks, timeout_s: float,
                 option: str = "--timeout") -> MeasurementError | None:
    """What a collective's ``error`` means on a run of several ranks: when a roll call (:func:`silent_ranks`,
    the rest of ``timeout_s`` after the collective's share) finds ranks that do not answer, a one-line
    :class:`MeasurementError` naming them; None where every rank answers (the error is not a peer's: re-raise it)."""
    if ranks.world_size <= 1 or ranks.backend is None or not isinstance(error, RuntimeError):
        return None
    missing = silent_ranks(ranks.rank, ranks.world_size, timeout_s * (1 - COLLECTIVE_SHARE))
    if missing == []:
        return None
    from flopcount.errors import first_line

    who = ("the rendezvous store at {}:{} (a launcher or rank 0) did not answer".format(
           os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")) if missing is None else
           f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} stopped answering")
    return MeasurementError(f"rank {ranks.rank}: {who} (hung or dead) within {option} {timeout_s:g} s; this rank "
                            f"ends too ({ranks.backend}: {first_line(error, 160)})")


def current() -> Ranks | None:
    """This process's place in the initialised process group (None without one); ``launcher`` is "existing"."""
    dist = running_dist()
    if dist is None:
        return None
    return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0") or 0),
                 dist.get_world_size(), dist.get_backend(), "existing", "")


def finish(ranks: Ranks) -> None:
    """Leave the process group :func:`init` joined (nothing when the caller had initialised it)."""
    dist = running_dist()
    if dist is not None and ranks.launcher in ("torchrun", "srun"):
        dist.destroy_process_group()


def gradient_bytes(model) -> int:
    """Bytes of the gradients DDP averages: Σ numel × element size over the parameters that require a gradient
    (shapes and dtypes only; no weight is read)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def ring_bytes(payload: float, ranks: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``payload`` bytes over ``ranks`` ranks: 2·(R−1)/R × payload
    (a reduce-scatter and an all-gather, R−1 chunks of payload/R each).

    >>> ring_bytes(1000, 4)
    1500.0
    """
    return 2 * (ranks - 1) / ranks * payload


class CommCounter:
    """State of the DDP communication hook that counts the gradient bytes a rank all-reduces.

    The meter turns it into the run's ``communication`` figures (:meth:`figures`) when its result is formed."""

    def __init__(self, group=None, ranks: int = 1, gradient_bytes: int = 0, backend: str | None = None) -> None:
        self.group = group
        self.ranks = ranks
        self.gradient_bytes = gradient_bytes
        self.backend = backend
        self.bytes = 0
        self.buckets = 0
        self.steps = 0

    @staticmethod
    def hook(state: "CommCounter", bucket):
        """DDP's default all-reduce of ``bucket``, after adding its bytes to ``state``."""
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        buf = bucket.buffer()
        state.bytes += buf.numel() * buf.element_size()
        state.buckets += 1
        if bucket.is_last():
            state.steps += 1
        return allreduce_hook(state.group, bucket)

    def figures(self, flops_per_sample: float | None, samples: int, steps: int) -> dict[str, Any]:
        """``bytes_per_step`` (measured), ``bytes_per_step_ring`` (closed form), bytes per sample and COI."""
        unavailable: dict[str, str] = {}
        R = self.ranks
        ring = ring_bytes(self.gradient_bytes, R) if R > 0 else None
        if R <= 1:
            measured = 0.0  # a model trained on one rank all-reduces nothing (DDP is not used)
            how = "one rank per model: no gradient all-reduce"
        elif self.steps:
            measured = self.bytes / self.steps
            how = (f"measured: DDP communication hook, bytes of the gradient buckets handed to all-reduce, "
                   f"{self.bytes} bytes over {self.steps} steps ({self.buckets} buckets)")
        else:
            measured = None
            unavailable["bytes_per_step"] = "the communication hook saw no backward pass"
            how = ""
        samples_per_step = samples / steps if steps else None
        flops_per_step = (flops_per_sample * samples_per_step
                          if flops_per_sample is not None and samples_per_step is not None else None)
        # over the whole run (steps under no_sync() accumulate gradients without an all-reduce)
        coi = flops_per_sample * samples / self.bytes if flops_per_sample is not None and self.bytes else None
        coi_ring = flops_per_step / ring if flops_per_step is not None and ring else None
        if coi is None:
            unavailable["coi"] = ("no bytes communicated (one rank per model)" if measured == 0 else
                                  unavailable.get("bytes_per_step", "no FLOPs per sample"))
        if coi_ring is None:
            unavailable["coi_ring"] = "no bytes communicated (one rank per model)" if ring == 0 else "no FLOPs"
        return {
            "backend": self.backend, "ranks": R,
            "bytes_per_step": measured,
            "bytes_per_step_ring": ring,
            "gradient_bytes": self.gradient_bytes,
            "buckets_per_step": self.buckets / self.steps if self.steps else None,
            "hooked_steps": self.steps,
            "bytes_per_sample": (self.bytes / samples if R > 1 and samples else 0.0 if R <= 1 else None),
            "flops_per_step": flops_per_step,
            "coi": coi, "coi_ring": coi_ring,
            "how": {"bytes_per_step": how,
                    "bytes_per_step_ring": f"closed form: 2 x (R - 1) / R x gradient bytes, R = {R} ranks per model",
                    "coi": "this rank's training FLOPs (C x samples) / the bytes it all-reduced, over the run (= "
                           "flops_per_step / bytes_per_step when every step all-reduces); coi_ring: flops_per_step / "
                           "bytes_per_step_ring"},
            "unavailable": unavailable,
        }


def shard(order, rank: int, size: int):
    """Rank ``rank``'s part of ``order`` among ``size`` ranks, every rank the same length (the order is padded
    by repeating it from its beginning to a multiple of ``size``, as torch's DistributedSampler does), so every rank runs the
    same number of steps.

    >>> shard(range(5), 1, 2).tolist()
    [1, 3, 0]
    """
    import numpy as np

    order = np.asarray(order)
    total = -(-len(order) // size) * size
    return np.resize(order, total)[rank::size]  # np.resize repeats the order from its beginning


class DataParallel:
    """One model replicated on the ranks of ``group`` (default: every rank), DDP averaging its gradients.

    Without torch.distributed (one process) it is a no-op layer: :meth:`wrap` returns the model, :meth:`sampler`
    gives the whole shuffled epoch and :meth:`evaluate` the local accuracy."""

    models = 1

    def __init__(self, group=None) -> None:
        dist = running_dist()
        self._dist = dist
        self.world_size = dist.get_world_size() if dist else 1
        self.rank = dist.get_rank() if dist else 0
        self.group = group
        self.model_index = 0
        self.model_ranks: tuple[int, ...] = tuple(range(self.world_size))
        self.counter: CommCounter | None = None
        self.base_qualities: list[float] = []
        self._bootstrap: dict[tuple[int, int], Any] = {}

    @property
    def ranks_per_model(self) -> int:
        return len(self.model_ranks)

    @property
    def group_rank(self) -> int:
        """This rank's place among its model's ranks."""
        return self.model_ranks.index(self.rank)

    def seed(self, seed: int) -> int:
        """The initialisation seed of this rank's model: ``seed`` itself for a single model."""
        return seed

    def wrap(self, model, **ddp_kw):
        """``model`` in DistributedDataParallel over the model's ranks, with the counting hook; ``model`` itself
        when the model has one rank. ``self.counter`` holds the counts either way."""
        backend = self._dist.get_backend() if self._dist else None
        self.base_qualities, self._bootstrap = [], {}  # a new run
        self.counter = CommCounter(self.group, self.ranks_per_model, gradient_bytes(model), backend)
        if self.ranks_per_model <= 1:
            return model
        from torch.nn.parallel import DistributedDataParallel

        device = next(model.parameters()).device
        if device.type == "cuda":
            ddp_kw.setdefault("device_ids", [device.index])
        ddp = DistributedDataParallel(model, process_group=self.group, **ddp_kw)
        ddp.register_comm_hook(self.counter, CommCounter.hook)
        return ddp

    def epoch_order(self, n: int, seed: int, epoch: int):
        """The model's whole epoch: a seeded permutation of ``range(n)`` (the same on all its ranks)."""
        import numpy as np

        return np.random.default_rng([seed, epoch]).permutation(n)

    def sampler(self, n: int, seed: int) -> Callable[[int], Any]:
        """``epoch -> index tensor``: this rank's shard of the model's epoch order."""
        torch = _torch()

        def order(epoch: int):
            return torch.from_numpy(shard(self.epoch_order(n, seed, epoch), self.group_rank, self.ranks_per_model))

        return order

    def average_predictions(self, probs):
        """The mean of the models' predictions (``probs``: this rank's model's class probabilities on the whole
        evaluation set, the same set on every rank), the same tensor on every rank. One rank per model contributes
        (its first), so the mean is over models, not over replicas."""
        if self._dist is None:
            return probs
        torch = _torch()
        out = probs.detach().clone() if self.group_rank == 0 else torch.zeros_like(probs)
        self._dist.all_reduce(out)
        return out / self.models

    def evaluate(self, probs, labels) -> tuple[float, float]:
        """(this model's accuracy, the accuracy of the models' averaged predictions); the model's accuracy is also
        kept for the report."""
        base = (probs.argmax(1) == labels).sum().item() / len(labels)
        avg = self.average_predictions(probs)
        together = (avg.argmax(1) == labels).sum().item() / len(labels)
        self.base_qualities.append(base)
        return base, together

    def figures(self, run: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The run's ``ensemble`` figures: none for a single model."""
        return None
