"""A job's collector policy: the start-up heap out of the cyclic garbage collector's reach while jobs run.

The driver holds ~420k objects after start-up at 1,024 engines (the imports, Ray, the engines' clients, the
machines, the trainer), all alive until the job ends. A fleet operation's requests allocate enough for the
collector to run full collections, each walking that whole heap: a fifth to two fifths of a second of a fleet
operation's CPU at N = 1,024. ``gc.freeze()`` puts it in the permanent generation that no collection walks; the
collect before it keeps start-up's garbage out of it. Undone when the last frozen job closes, so what the jobs
held is collectable again (a process that runs many jobs -- the tests -- does not keep it), unless the process
froze its own heap first: an embedder's freeze is its own policy, and unfreezing is all or none.
"""

from __future__ import annotations

import gc

_frozen_jobs = 0  # jobs of this process that froze the heap and have not released it
_embedder_froze = False  # the process had frozen its own heap before the first of them: never unfreeze it


def freeze() -> None:
    """One more job holds the heap frozen: collect start-up's garbage, then freeze what is left."""
    global _frozen_jobs, _embedder_froze
    if not _frozen_jobs:
        _embedder_froze = gc.get_freeze_count() > 0
    gc.collect()
    gc.freeze()
    _frozen_jobs += 1


def release() -> None:
    """A job that froze the heap ends: the last one unfreezes it (unless the embedder froze it first)."""
    global _frozen_jobs
    _frozen_jobs -= 1
    if not _frozen_jobs and not _embedder_froze:  # another job still runs, or the embedder froze: stays
        gc.unfreeze()
