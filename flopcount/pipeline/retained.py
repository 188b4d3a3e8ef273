"""Objects kept until the process ends, in a process that ends without freeing them.

The console entry point ends its process with ``os._exit`` (:func:`flopcount.cli.console.exit_process`): what is
still referenced then is never freed, one object at a time, by the interpreter's teardown. A count's working state
(the protobuf wrappers of every node, the DAG's lists, the resolved shapes, the report: millions of small objects at
100k nodes) is otherwise freed object by object as the functions holding it return, about 0.25 s of a 100k-node
count that buys nothing when the process ends right after. :func:`arm` (called by the console entry point alone) turns
:func:`keep` on; for every other caller :func:`keep` does nothing and the objects are freed as usual. Only the most
recent count's objects are held (a process that counts several models frees each earlier state when the next is kept),
so that holding them never adds more than one count's state to the peak memory.
"""

from __future__ import annotations

import gc

__all__ = ["arm", "keep"]

_held: list | None = None
_frozen = False  # whether keep has frozen the collector's view of the process


def arm() -> None:
    """From now on, :func:`keep` holds what it is given until the process ends."""
    global _held
    if _held is None:
        _held = []


def keep(*objects: object) -> None:
    """Hold ``objects`` (in place of those kept before) when :func:`arm` was called; otherwise nothing. Held, they
    and every other object alive now are moved out of the cyclic collector's reach (``gc.freeze``): the collections
    that the report's writing triggers then scan what it makes, not the count's millions of objects again (at 100k
    nodes each full collection would cost tens of milliseconds). In a process that counts again (``--sweep``,
    ``--symbolic``), what the earlier call froze is given back to the collector, the earlier state let go and one
    full collection run before the new state is frozen, so that what each count left in reference cycles is still
    freed."""
    global _frozen
    if _held is not None:
        if _frozen:
            gc.unfreeze()
            _held.clear()
            gc.collect()
        _held[:] = objects
        gc.freeze()
        _frozen = True
