"""Preemption notices from Ray: a node being drained (a cloud's notice, ``ray drain-node``, a SIGTERMed raylet)
becomes one notice per engine on it, with the node's deadline.

Ray Serve watches the same signal (``get_draining_nodes``, polled) and migrates the replicas on such a node; here
the watcher only reports: each engine process on a draining node is noticed once (per slot and epoch), logged
``engine.preempt_notice`` (``by="ray"``) and handed to ``on_notice`` -- the lifecycle decides what a notice means
(withdraw, drain within the deadline, replace). Every poll is bounded: one GCS call, and one node lookup per
engine process the first time a node drains.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from engines.engine import Engine
from engines.launcher import Placed
from lifecycle.decide.core import ROLLOUT
from lifecycle.decide.events import PREEMPT_NOTICE, EventLog

# (group, slot index, epoch, seconds to the deadline): what the core's preempt_notice news carries
OnNotice = Callable[[str, int, int | None, float], Awaitable[None]]
ReadDraining = Callable[[], dict[str, float | None]]  # node id -> seconds to its deadline (None: no deadline)
LOOKUP_TIMEOUT = 10.0  # one engine's node lookup
NO_DEADLINE_S = 33.0  # a drain with no deadline: the default drain bound plus its margin


def ray_draining() -> dict[str, float | None]:
    from engines.actor import draining_nodes  # imports Ray: only where engines run in Ray actors

    return draining_nodes()


class DrainingNodes:
    """Polls the draining nodes and notices the rollout engines on them (``engines``: the slots, read each poll)."""

    def __init__(
        self,
        engines: list[Engine],
        log: EventLog,
        on_notice: OnNotice | None = None,
        *,
        interval: float = 5.0,
        read: ReadDraining = ray_draining,
        group: str = ROLLOUT,
    ) -> None:
        self.engines = engines
        self.log = log
        self.on_notice = on_notice
        self.interval = interval
        self.read = read
        self.group = group
        self.noticed: set[tuple[str, int | None]] = set()  # (engine, epoch): one notice per process
        self._nodes: dict[tuple[str, int | None], str | None] = {}  # where each process runs (looked up once)
        self._task: asyncio.Task[None] | None = None

    async def poll(self) -> list[tuple[str, int | None, float]]:
        """One look: the notices it gave, as (engine, epoch, seconds to the deadline)."""
        draining = await asyncio.wait_for(asyncio.to_thread(self.read), LOOKUP_TIMEOUT)
        if not draining:
            return []
        given = []
        for index, engine in enumerate(list(self.engines)):
            key = (engine.id, engine.epoch)
            if key in self.noticed or not isinstance(engine.launcher, Placed):
                continue
            if key not in self._nodes:
                try:
                    self._nodes[key] = await asyncio.wait_for(engine.launcher.node_id(), LOOKUP_TIMEOUT)
                except Exception:  # slow, or a process starting or going (its actor's error): asked again next poll
                    continue
            node = self._nodes[key]
            if node is None or node not in draining:
                continue
            left = draining[node]
            deadline_s = round(NO_DEADLINE_S if left is None else left, 3)
            self.noticed.add(key)
            if self.log.enabled:
                self.log.emit(PREEMPT_NOTICE, instance=engine.id, epoch=engine.epoch, deadline_s=deadline_s, by="ray")
            given.append((engine.id, engine.epoch, deadline_s))
            if self.on_notice is not None:
                await self.on_notice(self.group, index, engine.epoch, deadline_s)
        return given

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="draining-nodes")

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await self.poll()
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
