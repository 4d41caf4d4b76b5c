"""The rollout health monitor's probing: the I/O behind the ``monitor`` machine.

Kubernetes separates startup, readiness and liveness; Ray Serve gives health checks a period,
a timeout, a failure threshold and jitter. This is the liveness part, and only its mechanics:

* probes run **concurrently** across engines (a round takes about one probe latency, not N);
* each engine's consecutive failures are counted; at ``--rollout-health-check-failure-threshold``
  the monitor reports ``threshold_reached``, below it ``probe_failed``;
* every result is tagged with the resume *epoch* it was sent in; one that comes back after a pause
  (an older epoch) is reported as ``stale_result``.

What a verdict *means* -- mark the engine, count it, or discard it because the monitor is paused --
is the core's (``lifecycle.decide.core``) decision through the ``monitor`` spec; whether a monitor exists at
all is the spec's ``monitors_rollout`` guard. The handlers here are bound to the monitor's effects
(``start_monitor``, ``resume_monitor``, ``pause_monitor``, ``stop_monitor``).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import Command, Outcome, instance_name
from lifecycle.decide.events import PROBE, EventLog

Probe = Callable[[float], Awaitable[Outcome]]  # called with the per-probe timeout: probe_ok or probe_failed
Report = Callable[[Outcome], Awaitable[None]]
Slot = tuple[str, int]  # (group, index)


@dataclass
class EngineHealth:
    """What the monitor knows about one engine."""

    probe: Probe
    added_at: float
    failures: int = 0
    last_error: str = ""
    probes: int = 0
    epoch: int | None = None  # the generation of the process it probes: every verdict names it (the core fences)


class HealthMonitor:
    """The probing of one server group; its verdicts go to ``report`` (the runner)."""

    def __init__(
        self,
        config: LifecycleConfig,
        report: Report,
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        log: EventLog | None = None,
    ) -> None:
        """``clock`` and ``sleep`` are one time source (tests pass a fake one and drive every round exactly)."""
        self.config = config
        self.log = log  # every probe result, and whether it was acted on (metrics, the live invariant monitor)
        self._report = report
        self._engines: dict[Slot, EngineHealth] = {}
        self._rng = random.Random(seed)
        self._clock = clock
        self._sleep = sleep
        self._epoch = 0
        self._running = False
        self._loops: set[asyncio.Task[None]] = set()  # probe loops still running (a paused one ends after its sleep)

    # -- membership ----------------------------------------------------------------------------------
    def add_engine(self, slot: Slot, probe: Probe, epoch: int | None = None) -> None:
        """Watch an engine (its process of generation ``epoch``); its startup grace
        (--rollout-health-check-first-wait) starts now."""
        self._engines[slot] = EngineHealth(probe, self._clock(), epoch=epoch)

    def remove_engine(self, slot: Slot) -> None:
        self._engines.pop(slot, None)

    def health(self, slot: Slot) -> EngineHealth:
        return self._engines[slot]

    @property
    def running(self) -> bool:
        """Probe rounds are being sent (resumed and not paused or stopped since)."""
        return self._running

    @property
    def members(self) -> tuple[Slot, ...]:
        return tuple(self._engines)

    # -- the handlers of the monitor's effects ------------------------------------------------------------
    async def start(self, cmd: Command) -> None:
        """``start_monitor``: the monitor exists, paused; probes wait for a resume."""

    async def resume(self, cmd: Command) -> None:
        """``resume_monitor``: probing starts (a generate or eval boundary)."""
        self._epoch += 1
        self._running = True
        task = asyncio.create_task(self._run(self._epoch), name="health-monitor")
        self._loops.add(task)
        task.add_done_callback(self._loops.discard)

    async def pause(self, cmd: Command) -> None:
        """``pause_monitor``: no new probes; results of probes still out will be reported as stale."""
        self._epoch += 1
        self._running = False

    async def stop(self, cmd: Command | None = None) -> None:
        """``stop_monitor``: every probe loop ends, also those a pause left to finish their sleep."""
        self._epoch += 1
        self._running = False
        loops = list(self._loops)
        for task in loops:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)

    # -- probing -----------------------------------------------------------------------------------------------
    def _period(self) -> float:
        jitter = self.config.rollout_health_check_jitter
        return self.config.rollout_health_check_interval * (1 + self._rng.uniform(-jitter, jitter))

    async def _run(self, epoch: int) -> None:
        while epoch == self._epoch and self._running:
            await self.probe_round(epoch)
            if epoch != self._epoch:
                return
            await self._sleep(self._period())

    async def probe_round(self, epoch: int | None = None) -> None:
        """Probe every engine past its startup grace, concurrently; one ``probe`` report per round."""
        epoch = self._epoch if epoch is None else epoch
        now = self._clock()
        grace = self.config.rollout_health_check_first_wait
        due = [(slot, h) for slot, h in self._engines.items() if now - h.added_at >= grace]
        if not due:
            return
        await self._report(Outcome("probe"))
        await asyncio.gather(*(self._probe_one(slot, h, epoch) for slot, h in due))

    async def _probe_one(self, slot: Slot, h: EngineHealth, epoch: int) -> None:
        timeout = float(self.config.rollout_health_check_timeout or 0)
        sent = self._clock()
        try:
            result = await asyncio.wait_for(h.probe(timeout), timeout)
        except TimeoutError:
            result = Outcome("probe_failed", reason=f"no answer within {timeout:g}s")
        h.probes += 1
        group, index = slot
        seconds = round(self._clock() - sent, 6)
        if self._engines.get(slot) is not h:
            return  # removed while the probe was out (marked, stopped, restarted)
        if epoch != self._epoch or not self._running:  # the monitor was paused while this probe was out
            self._logged(slot, result, seconds, stale=True)
            if result.name != "probe_ok":
                await self._report(Outcome("stale_result", group, index, result.reason, epoch=h.epoch))
            return
        self._logged(slot, result, seconds, stale=False)
        if result.name == "probe_ok":
            h.failures = 0
            return
        h.failures += 1
        h.last_error = result.reason
        if h.failures < self.config.rollout_health_check_failure_threshold:
            await self._report(Outcome("probe_failed", group, index, result.reason, epoch=h.epoch))
            return
        self._engines.pop(slot, None)
        reason = f"{h.failures} consecutive failed probes, last: {result.reason}"
        await self._report(Outcome("threshold_reached", group, index, reason, epoch=h.epoch))

    def _logged(self, slot: Slot, result: Outcome, seconds: float, *, stale: bool) -> None:
        if self.log is not None and self.log.enabled:
            outcome = "ok" if result.name == "probe_ok" else "failed"
            instance = instance_name(*slot)
            self.log.emit(PROBE, instance=instance, by="monitor", outcome=outcome, seconds=seconds, stale=stale)
