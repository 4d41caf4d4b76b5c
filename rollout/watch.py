"""Death watchers: one per live engine process, so a death is news at once, not at the next probe.

Each watcher waits on its launcher's ``watch`` (a blocking waitpid, a Ray actor's death, a fleet's long poll)
and reports ``died`` naming the process it watched (its ``Engine.epoch``: a late report about a replaced process
is fenced by the core). A death the lifecycle causes itself -- a stop, a recovery's kill -- is unwatched first, so
it is not reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from engines.engine import Engine
from lifecycle.decide.core import Outcome
from rollout.failures import slot_of


class DeathWatch:
    def __init__(self, report: Callable[[Outcome], Awaitable[None]]) -> None:
        self.report = report
        self._watch_gen: dict[str, int] = {}  # engine -> the generation of its watch (a new one ends the old)
        self.watchers: dict[str, asyncio.Task[None]] = {}

    def watch(self, engine: Engine) -> None:
        gen = self._watch_gen.get(engine.id, 0) + 1
        self._watch_gen[engine.id] = gen
        group, i = slot_of(engine.id)
        epoch = engine.epoch  # the process watched: its death report names it (a late one is fenced by the core)

        async def run() -> None:
            reason = await engine.launcher.watch()
            if self._watch_gen.get(engine.id) != gen:
                return  # a death we caused (recovery, stop): not news
            await self.report(Outcome("died", group, i, f"process died: {reason}", epoch=epoch))

        old = self.watchers.get(engine.id)
        if old is not None and not old.done() and old is not asyncio.current_task():
            old.cancel()  # an external engine's watcher never ends by itself
        self.watchers[engine.id] = asyncio.create_task(run(), name=f"watch-{engine.id}")

    def unwatch(self, engine_id: str) -> None:
        """Its next death is one the lifecycle causes: not news."""
        self._watch_gen[engine_id] = self._watch_gen.get(engine_id, 0) + 1

    def stop(self) -> list[asyncio.Task[None]]:
        """No death is news any more (the controller closes); the watchers, to cancel."""
        for engine_id in list(self._watch_gen):
            self.unwatch(engine_id)
        tasks = list(self.watchers.values())
        self.watchers.clear()
        return tasks
