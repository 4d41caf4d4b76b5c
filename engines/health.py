"""The rollout health monitor of one server group, driven by the ``monitor`` machine.

Kubernetes separates startup, readiness and liveness; Ray Serve gives health checks a period,
a timeout, a failure threshold and jitter. This monitor does the same for inference engines:

* probes run **concurrently** across engines (a round takes about one probe latency, not N);
* a probe result is acted on only if the monitor is still running *in the same resume epoch*
  when it returns -- a result that comes back after a pause is discarded (``discard_probe_result``);
* a process death reported by Ray/the OS is acted on at once (``engine_died``), paused or not,
  instead of waiting for the next probe round;
* it exists only when ``monitors_rollout``; it is paused at creation, and the rollout manager
  resumes it only at generate/eval boundaries.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lifecycle.config import LifecycleConfig
from lifecycle.events import EventLog
from lifecycle.ledger import EffectLedger
from lifecycle.machines import MONITOR
from lifecycle.predicates import monitors_rollout
from lifecycle.runtime import AsyncLifecycleMachine, FireResult

Probe = Callable[[float], Awaitable[object]]  # called with the per-probe timeout; raises on failure
OnUnhealthy = Callable[[str, str], Awaitable[None] | None]  # (engine id, reason)


@dataclass
class EngineHealth:
    """What the monitor knows about one engine."""

    probe: Probe
    added_at: float
    failures: int = 0
    last_error: str = ""
    probes: int = 0


class HealthMonitor:
    """One per server group. Use :func:`create_monitor`, which honours ``monitors_rollout``."""

    def __init__(
        self,
        config: LifecycleConfig,
        group: str,
        on_unhealthy: OnUnhealthy,
        *,
        ledger: EffectLedger | None = None,
        log: EventLog | None = None,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.group = group
        self.machine = AsyncLifecycleMachine(MONITOR, config, f"monitor-{group}", ledger=ledger, log=log)
        self._on_unhealthy = on_unhealthy
        self._engines: dict[str, EngineHealth] = {}
        self._rng = random.Random(seed)
        self._clock = clock
        self._lock = asyncio.Lock()  # one machine event at a time, even with concurrent probes
        self._epoch = 0
        self._task: asyncio.Task[None] | None = None
        self._loops: set[asyncio.Task[None]] = set()  # probe loops still running (a paused one ends after its sleep)
        self.discarded = 0  # probe failures that came back after a pause

    # -- membership ----------------------------------------------------------------------------
    def add_engine(self, engine_id: str, probe: Probe) -> None:
        """Watch an engine; its startup grace (--rollout-health-check-first-wait) starts now."""
        self._engines[engine_id] = EngineHealth(probe, self._clock())

    def remove_engine(self, engine_id: str) -> None:
        self._engines.pop(engine_id, None)

    def health(self, engine_id: str) -> EngineHealth:
        return self._engines[engine_id]

    @property
    def state(self) -> str:
        return self.machine.state

    # -- lifecycle -------------------------------------------------------------------------------
    async def _fire(self, trigger: str) -> FireResult:
        async with self._lock:
            return await self.machine.fire(trigger)

    async def create(self) -> FireResult:
        return await self._fire("create")

    async def resume(self) -> None:
        """Start probing (generate/eval boundary)."""
        result = await self._fire("resume")
        if result.ok:
            self._epoch += 1
            self._task = asyncio.create_task(self._run(self._epoch), name=f"monitor-{self.group}")
            self._loops.add(self._task)
            self._task.add_done_callback(self._loops.discard)

    async def pause(self) -> None:
        """Stop probing; results of probes still in flight will be discarded."""
        self._epoch += 1
        await self._fire("pause")
        self._task = None  # the loop sees the epoch change and ends after its current round

    async def stop(self) -> None:
        self._epoch += 1
        self._task = None
        if self.machine.state in ("Paused", "Running"):
            await self._fire("stop")
        elif self.machine.state == "Init":
            await self._fire("dispose")
        # every probe loop, also those a pause left to finish their sleep: none outlives the monitor
        loops = list(self._loops)
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)

    async def engine_died(self, engine_id: str, reason: str) -> None:
        """Ray/the OS reported the engine's death: mark it now, whether probing or paused."""
        result = await self._fire("engine_died")
        if "mark_engine_unhealthy" in result.effects:
            self._engines.pop(engine_id, None)
            await self._call_unhealthy(engine_id, f"process died: {reason}")

    # -- probing -----------------------------------------------------------------------------------
    def _period(self) -> float:
        jitter = self.config.rollout_health_check_jitter
        return self.config.rollout_health_check_interval * (1 + self._rng.uniform(-jitter, jitter))

    async def _run(self, epoch: int) -> None:
        while epoch == self._epoch and self.machine.state == "Running":
            await self.probe_round(epoch)
            if epoch != self._epoch:
                return
            await asyncio.sleep(self._period())

    async def probe_round(self, epoch: int | None = None) -> None:
        """Probe every engine past its startup grace, concurrently; one ``probe`` event per round."""
        epoch = self._epoch if epoch is None else epoch
        now = self._clock()
        grace = self.config.rollout_health_check_first_wait
        due = [(eid, h) for eid, h in self._engines.items() if now - h.added_at >= grace]
        if not due:
            return
        result = await self._fire("probe")
        if not result.ok:
            return
        await asyncio.gather(*(self._probe_one(eid, h, epoch) for eid, h in due))

    async def _probe_one(self, engine_id: str, h: EngineHealth, epoch: int) -> None:
        timeout = float(self.config.rollout_health_check_timeout or 0)
        error = ""
        try:
            await asyncio.wait_for(h.probe(timeout), timeout)
        except TimeoutError:
            error = f"no answer within {timeout:g}s"
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        h.probes += 1
        async with self._lock:
            current = epoch == self._epoch and self.machine.state == "Running"
            if not error:
                if current:
                    h.failures = 0
                return
            if not current:  # the monitor was paused while this probe was out: drop the result
                self.discarded += 1
                await self.machine.fire("probe_failed")
                return
            h.failures += 1
            h.last_error = error
            if h.failures < self.config.rollout_health_check_failure_threshold:
                await self.machine.fire("probe_failed")
                return
            result = await self.machine.fire("threshold_reached")
        if "mark_engine_unhealthy" in result.effects:
            self._engines.pop(engine_id, None)
            await self._call_unhealthy(engine_id, f"{h.failures} consecutive failed probes, last: {error}")

    async def _call_unhealthy(self, engine_id: str, reason: str) -> None:
        value = self._on_unhealthy(engine_id, reason)
        if inspect.isawaitable(value):
            await value


async def create_monitor(
    config: LifecycleConfig, group: str, on_unhealthy: OnUnhealthy, **kwargs: object
) -> HealthMonitor | None:
    """A paused monitor when ``monitors_rollout``; None otherwise (train-only FT, no FT, no servers)."""
    if not monitors_rollout(config):
        return None
    monitor = HealthMonitor(config, group, on_unhealthy, **kwargs)  # type: ignore[arg-type]
    result = await monitor.create()
    assert result.ok, result
    return monitor
