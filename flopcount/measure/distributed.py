"""``flopcount.measure.distributed``, the path the README and docs/cluster.md show: :mod:`flopcount.measure.harness.distributed`."""

from .harness.distributed import (CommCounter, DataParallel, Ranks, finish, gradient_bytes, init, launcher, ring_bytes,
                                  shard)

__all__ = ["CommCounter", "DataParallel", "Ranks", "finish", "gradient_bytes", "init", "launcher", "ring_bytes", "shard"]
