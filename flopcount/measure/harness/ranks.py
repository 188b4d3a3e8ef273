"""Which rank this process is under torch.distributed, and the figures of every rank gathered once.

torch is never imported for the question: without it (or without an initialised process group) this is rank 0 of 1.
"""

from __future__ import annotations

import sys
from typing import Any, Mapping

__all__ = ["gather_ranks", "is_writer", "running_dist"]


def running_dist():
    """torch.distributed when this process is one of its initialised ranks, else None (torch is not imported for
    the question)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = torch.distributed
    return dist if dist.is_available() and dist.is_initialized() else None


def is_writer() -> bool:
    """True on rank 0 of torch.distributed, and without it: only rank 0 writes files and prints."""
    dist = running_dist()
    return dist is None or dist.get_rank() == 0


def gather_ranks(local: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every rank's ``local`` figures, gathered once (``all_gather_object``) under torch.distributed."""
    dist = running_dist()
    if dist is None:
        return [dict(local, rank=0)]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, dict(local, rank=dist.get_rank()))
    return out
