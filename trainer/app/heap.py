"""A job's collector policy: the start-up heap out of the cyclic garbage collector's reach, and fewer young
collections, while jobs run.

The driver holds ~420k objects after start-up at 1,024 engines (the imports, Ray, the engines' clients, the
machines, the trainer), all alive until the job ends. A fleet operation's requests allocate enough for the
collector to run full collections, each walking that whole heap: a fifth to two fifths of a second of a fleet
operation's CPU at N = 1,024. ``gc.freeze()`` puts it in the permanent generation that no collection walks; the
collect before it keeps start-up's garbage out of it. Undone when the last frozen job closes, so what the jobs
held is collectable again (a process that runs many jobs -- the tests -- does not keep it), unless the process
froze its own heap first: an embedder's freeze is its own policy, and unfreezing is all or none.

The young generation's threshold is raised too (:data:`YOUNG`, from CPython's 700): a fleet operation's in-flight
requests are alive until they answer, so every young collection during one walks them and frees almost nothing --
at 1,024 engines a weight update (four requests per engine) ran thousands of them, 0.2-0.8 s of its CPU
(benchmark P7, issue 45). With 20,000 the same update spends ~50 ms there. Young objects are few kilobytes each:
the most a young generation holds before it is collected grows by a few MB. Restored with the freeze, unless the
process set a threshold of its own first (it is the embedder's then, and left alone).
"""

from __future__ import annotations

import gc

YOUNG = 20_000  # allocations (net) between two young collections while a job runs
_frozen_jobs = 0  # jobs of this process that froze the heap and have not released it
_embedder_froze = False  # the process had frozen its own heap before the first of them: never unfreeze it
_threshold: tuple[int, int, int] | None = None  # the threshold before the first job raised it; None: not raised


def freeze() -> None:
    """One more job holds the heap frozen: collect start-up's garbage, then freeze what is left."""
    global _frozen_jobs, _embedder_froze, _threshold
    if not _frozen_jobs:
        _embedder_froze = gc.get_freeze_count() > 0
        young, middle, old = gc.get_threshold()
        if young < YOUNG:  # a process that raised it itself keeps its own
            _threshold = (young, middle, old)
            gc.set_threshold(YOUNG, middle, old)
    gc.collect()
    gc.freeze()
    _frozen_jobs += 1


def release() -> None:
    """A job that froze the heap ends: the last one unfreezes it (unless the embedder froze it first) and puts
    the threshold back."""
    global _frozen_jobs, _threshold
    _frozen_jobs -= 1
    if _frozen_jobs:
        return  # another job still runs
    if not _embedder_froze:
        gc.unfreeze()
    if _threshold is not None and gc.get_threshold()[0] == YOUNG:  # unless someone set another since
        gc.set_threshold(*_threshold)
    _threshold = None
