"""The lifecycle layer's own time, shared by P3 (``bench_loop``) and P7 (``bench_fleet``).

Why a module of its own: both goals are about the layer's CPU alone -- the core's decision and the record --
not the process around it (Ray, aiohttp, the garbage collector); the two benchmarks must time the same parts
the same way, so the two figures of ``docs/measured.md`` mean the same thing.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from structlog.contextvars import get_contextvars


class GcClock:
    """CPU time spent in the cyclic garbage collector (``gc.callbacks``), to take out of the layer's calls.

    Why: a full collection of this process (torch, Ray, aiohttp: millions of objects) takes ~50-100 ms and
    runs inside whichever call's allocation trips the threshold; landing in a layer call once, it adds
    ~10 ms to that run's every step -- the whole process's garbage, not the layer's cost. It is printed apart.
    """

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0
        self._start = (0.0, 0.0)
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = (time.thread_time(), time.perf_counter())
        else:
            self.cpu += time.thread_time() - self._start[0]
            self.wall += time.perf_counter() - self._start[1]


GC = GcClock()


class Timer:
    """Time spent inside the outermost calls of the lifecycle layer (:func:`timed_layer`): wall and this
    thread's CPU.

    CPU time (``time.thread_time``) is the layer's own cost: it does not count the moments the OS
    runs another process (a busy 2-core machine preempts often). Wall time counts them: an upper
    bound. The layer's calls are synchronous, so its CPU time is its own, not other coroutines'.
    """

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu = 0.0
        self.events = 0
        self.depth = 0
        self.by_machine: dict[str, list[float]] = {}  # part -> [cpu seconds, calls]
        self.inner: dict[str, list[float]] = {}  # a part timed inside an outermost call (Core.step) -> [cpu s, calls]
        self.scrapes = 0
        self.gc = 0.0  # CPU seconds of garbage collections that ran inside the timed calls (taken out)

    def add(self, machine: str, seconds: float, cpu: float) -> None:
        self.seconds += seconds
        self.cpu += cpu
        self.events += 1
        entry = self.by_machine.setdefault(machine, [0.0, 0])
        entry[0] += cpu
        entry[1] += 1

    def add_inner(self, name: str, cpu: float) -> None:
        entry = self.inner.setdefault(name, [0.0, 0])
        entry[0] += cpu
        entry[1] += 1

    def core_cpu(self) -> float:
        """CPU seconds in ``Core.step``, outermost or inside a burst."""
        return self.by_machine.get("Core.step", [0.0])[0] + self.inner.get("Core.step", [0.0])[0]


@contextmanager
def timed_layer(timer: Timer, every_call: bool = False) -> Iterator[None]:
    """Time every outermost call of the lifecycle layer: the runner's bursts (``_step``: news or an operation;
    ``_completed``: the results of its commands -- the decision, the record and the burst's one write, in one
    call), and, where they are called on their own, ``Core.step`` (the decision), the runner's
    ``_apply``/``_record`` (the moves replayed on ``transitions`` machines, the event log, the ledger) and
    the ends of bursts (``EventLog.flush``: the held JSONL lines written; the batch's start, which holds
    them). All are synchronous: thread CPU time inside them is their own. ``Core.step`` inside a burst is
    timed too (:attr:`Timer.inner`): the core's share, which a compiled core changes.

    By default a call counts only while a step is bound in structlog's context (the loop's steps, not its
    start-up and shutdown); ``every_call`` counts every call -- a fleet operation runs outside a step, and the
    caller takes the difference around it."""
    from lifecycle.decide.core import Core
    from lifecycle.decide.events import EventLog, LogBatch
    from lifecycle.decide.runner import Runner

    step: Callable[..., Any] = Core.step
    burst: Callable[..., Any] = Runner._step
    completed: Callable[..., Any] = Runner._completed
    apply: Callable[..., Any] = Runner._apply
    record: Callable[..., Any] = Runner._record
    flush: Callable[..., Any] = EventLog.flush
    enter: Callable[..., Any] = LogBatch.__enter__

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if timer.depth:
                if name != "Core.step":
                    return fn(*args, **kwargs)
                c, gc_cpu = time.thread_time(), GC.cpu
                try:
                    return fn(*args, **kwargs)
                finally:
                    timer.add_inner(name, time.thread_time() - c - (GC.cpu - gc_cpu))
            if not (every_call or "step" in get_contextvars()):
                return fn(*args, **kwargs)
            timer.depth += 1
            t, c, gc_wall, gc_cpu = time.perf_counter(), time.thread_time(), GC.wall, GC.cpu
            try:
                return fn(*args, **kwargs)
            finally:
                collected = GC.cpu - gc_cpu
                timer.gc += collected
                timer.add(name, time.perf_counter() - t - (GC.wall - gc_wall), time.thread_time() - c - collected)
                timer.depth -= 1

        return timed

    Core.step = wrap("Core.step", step)  # type: ignore[method-assign]
    Runner._step = wrap("Runner._step", burst)  # type: ignore[method-assign]
    Runner._completed = wrap("Runner._completed", completed)  # type: ignore[method-assign]
    Runner._apply = wrap("Runner._apply", apply)  # type: ignore[method-assign]
    Runner._record = wrap("Runner._record", record)  # type: ignore[method-assign]
    EventLog.flush = wrap("EventLog.flush", flush)  # type: ignore[method-assign]
    LogBatch.__enter__ = wrap("EventLog.batch", enter)  # type: ignore[method-assign]
    try:
        yield
    finally:
        Core.step, Runner._apply, Runner._record = step, apply, record  # type: ignore[method-assign]
        Runner._step, Runner._completed = burst, completed  # type: ignore[method-assign]
        EventLog.flush, LogBatch.__enter__ = flush, enter  # type: ignore[method-assign]
