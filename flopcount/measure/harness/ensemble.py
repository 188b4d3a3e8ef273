"""HPC AI500 V3.0 bagging ensembles: M base models, each trained on its own bootstrap sample of the training set,
each on its own process group of P ranks (M × P ranks in all), their predictions averaged.

Sketch::

    from flopcount.measure.harness import distributed, ensemble
    ranks = distributed.init("cuda")                     # torchrun --nproc_per_node=M*P (or srun)
    ens = ensemble.Ensemble(models=M)                    # the M process groups; this rank's model and group
    torch.manual_seed(ens.seed(0))                       # base models start from different initialisations
    model = ens.wrap(net.to(ranks.device))               # DDP over the model's P ranks (counting hook)
    order = ens.sampler(len(train_set), seed=0)          # epoch -> this rank's shard of the model's bootstrap sample
    meter.communication, meter.ensemble = ens.counter, ens
    ...your loop...; base, together = ens.evaluate(probs, labels)   # probs on the whole evaluation set
    meter.quality(together)                              # VFLOPS on the ensemble's quality

**Layout**: base model m owns the contiguous ranks m·P … m·P + P − 1, so with P dividing the GPUs of a node a
model's gradient all-reduce stays inside the node (NVLink), and only the ensemble's averaged prediction, once per
evaluation, crosses nodes. **Bootstrap**: model m's sample is ``numpy.random.default_rng([seed, m]).integers(0, n,
n)`` (n draws with replacement, about 1 − 1/e ≈ 63.2% of the samples distinct for large n); every epoch visits that
sample in a seeded order (``default_rng([seed, m, epoch])``), sharded over the model's ranks. **Figures**: FLOPS is
the sum over base models (Σ over all ranks of N_r × C), APC = M × P × batch × C per iteration (batch per rank), and
VFLOPS uses the ensemble's quality.
"""

from __future__ import annotations

from typing import Any, Mapping

from flopcount.errors import UsageError

from .distributed import DataParallel
from .ranks import running_dist

__all__ = ["Ensemble", "bootstrap", "for_bench", "layout"]


def layout(world_size: int, models: int) -> list[tuple[int, ...]]:
    """The ranks of each base model: M contiguous blocks of P = world_size / M ranks.

    >>> layout(4, 2)
    [(0, 1), (2, 3)]
    """
    if models < 1:
        raise UsageError(f"--ensemble {models}: the number of base models must be at least 1")
    if world_size % models:
        raise UsageError(f"--ensemble {models}: {world_size} rank(s) do not split into {models} base models of "
                         f"equal size; launch M x P ranks, a multiple of {models}")
    per = world_size // models
    return [tuple(range(m * per, (m + 1) * per)) for m in range(models)]


def bootstrap(n: int, seed: int, model: int):
    """Model ``model``'s bootstrap sample: n indices of ``range(n)`` drawn with replacement, seeded by
    ``(seed, model)`` (numpy's SeedSequence), the same on every rank and every run with that seed."""
    import numpy as np

    return np.random.default_rng([seed, model]).integers(0, n, size=n)


class Ensemble(DataParallel):
    """M base models on M process groups of P ranks each (collective: every rank constructs it, in the same order
    relative to other group creation). ``models=1`` is plain data parallelism over all ranks."""

    def __init__(self, models: int) -> None:
        dist = running_dist()
        world = dist.get_world_size() if dist else 1
        if models > 1 and dist is None:
            raise UsageError(f"--ensemble {models} trains each base model on its own ranks: launch {models} x P "
                             f"ranks, e.g. torchrun --nproc_per_node={models} -m flopcount bench ... "
                             f"--ensemble {models}")
        blocks = layout(world, models)
        super().__init__()
        self.models = models
        self.layout = blocks
        if dist is not None:
            for m, ranks in enumerate(blocks):
                group = dist.new_group(list(ranks)) if models > 1 else None
                if self.rank in ranks:
                    self.group, self.model_index, self.model_ranks = group, m, ranks

    def seed(self, seed: int) -> int:
        """The initialisation seed of this rank's base model (distinct per model, the same on its ranks)."""
        if self.models == 1:
            return seed
        import numpy as np

        return int(np.random.SeedSequence([seed, self.model_index]).generate_state(1)[0])

    def bootstrap(self, n: int, seed: int):
        """This rank's model's bootstrap sample (:func:`bootstrap`)."""
        key = (n, seed)
        if key not in self._bootstrap:
            self._bootstrap[key] = bootstrap(n, seed, self.model_index)
        return self._bootstrap[key]

    def epoch_order(self, n: int, seed: int, epoch: int):
        """A model's epoch: its bootstrap sample in a seeded order (a plain shuffle for a single model)."""
        if self.models == 1:
            return super().epoch_order(n, seed, epoch)
        import numpy as np

        sample = self.bootstrap(n, seed)
        return sample[np.random.default_rng([seed, self.model_index, epoch]).permutation(n)]

    def figures(self, run: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The run's ``ensemble`` figures, from the meter's gathered ``run`` figures (``per_rank``,
        ``flops_per_sample``, ``batch``) and one gather of the base models' qualities."""
        if self.models == 1:
            return None
        import numpy as np

        mine = {"rank": self.rank, "model": self.model_index,
                "quality": self.base_qualities[-1] if self.base_qualities else None,
                "qualities": list(self.base_qualities),
                "bootstrap": {f"{n}:{seed}": int(np.unique(s).size) for (n, seed), s in self._bootstrap.items()}}
        dist = self._dist
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine)
        by_rank = {g["rank"]: g for g in gathered}
        rates = {r["rank"]: r.get("samples_per_s") for r in run["per_rank"]}
        C = run.get("flops_per_sample")
        per_model = []
        for m, ranks in enumerate(self.layout):
            lead = by_rank[ranks[0]]
            sps = [rates.get(r) for r in ranks]
            total = sum(sps) if all(v is not None for v in sps) else None
            unique = {key: {"samples": int(key.split(":")[0]), "unique": u,
                            "unique_fraction": u / int(key.split(":")[0])} for key, u in lead["bootstrap"].items()}
            per_model.append({"model": m, "ranks": list(ranks), "quality": lead["quality"],
                              "qualities": lead["qualities"], "samples_per_s": total,
                              "flops": total * C if total is not None and C is not None else None,
                              "bootstrap": list(unique.values())})
        flops = [p["flops"] for p in per_model]
        batch = run.get("batch")
        P = self.ranks_per_model
        return {
            "models": self.models, "ranks_per_model": P, "layout": [list(r) for r in self.layout],
            "base_models": per_model,
            "flops": sum(flops) if all(f is not None for f in flops) else None,
            "apc": self.models * P * batch * C if batch and C is not None else None,
            "quality": run.get("quality"),
            "how": {"flops": "sum over base models of their ranks' samples/s x C",
                    "apc": "HPC AI500 V3.0 FLOPs per iteration: M x P x batch per rank x C",
                    "quality": "accuracy of the base models' averaged class probabilities (the run's quality; "
                               "VFLOPS uses it)",
                    "bootstrap": "n draws with replacement from the training set, numpy default_rng([seed, model])"},
        }


def for_bench(workload: str, models: int, world_size: int) -> DataParallel | None:
    """The layer ``flopcount bench`` trains under: None in one process, data parallelism over the ranks, or an
    ensemble of ``models`` base models (``--ensemble``)."""
    if models > 1 and workload != "digits":
        raise UsageError(f"--ensemble applies to digits, whose base models have a real test accuracy to average; "
                         f"{workload} trains on synthetic data")
    if world_size == 1 and models == 1:
        return None
    return Ensemble(models)
