"""One engine slot: the ``engine`` machine driving a real server process through a launcher.

Every action is *first* a machine transition (so an illegal or blocked step raises or reports
before anything happens) and *then* the real work; the work's outcome fires the next event.
``Stopping -> Stopped`` only once the process is confirmed dead; recovery is allowed only by
``rollout_ft`` and spends the restart budget (capped backoff), ending in ``Failed``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from engines.client import EngineClient
from engines.errors import EngineError
from engines.launcher import Launcher
from engines.protocol import PauseMode
from engines.restart import RestartBudget
from lifecycle.config import LifecycleConfig
from lifecycle.errors import LifecycleError
from lifecycle.events import EventLog, bind_context
from lifecycle.ledger import EffectLedger
from lifecycle.machines import ENGINE
from lifecycle.runtime import FireResult, LifecycleMachine


class EngineFailed(LifecycleError):
    """The engine cannot serve, and the lifecycle will not (or may no longer) recover it."""

    def __init__(self, engine_id: str, state: str, reason: str) -> None:
        self.engine_id, self.state, self.reason = engine_id, state, reason
        super().__init__(f"engine {engine_id} failed in state {state}: {reason}")


@dataclass
class Timeouts:
    """Every wait is bounded; each timeout becomes a transition (start_failed, mark_unhealthy)."""

    startup: float = 60.0
    request: float = 30.0
    death: float = 10.0


class Engine:
    """An engine slot. Methods are the controller's verbs; ``machine.state`` is the truth."""

    def __init__(
        self,
        engine_id: str,
        config: LifecycleConfig,
        launcher: Launcher,
        *,
        api_key: str | None = None,
        ledger: EffectLedger | None = None,
        log: EventLog | None = None,
        timeouts: Timeouts | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.id = engine_id
        self.config = config
        self.launcher = launcher
        self.api_key = api_key
        self.machine = LifecycleMachine(ENGINE, config, engine_id, ledger=ledger, log=log)
        self.budget = RestartBudget.from_config(config, clock)
        self.timeouts = timeouts or Timeouts()
        self.client: EngineClient | None = None
        self.url: str | None = None
        self.weight_version: str | None = None
        self.reason = ""

    @property
    def state(self) -> str:
        return self.machine.state

    @property
    def routable(self) -> bool:
        """Only Serving engines receive generate requests (invariant 4)."""
        return self.machine.state == "Serving"

    def _fire(self, trigger: str) -> FireResult:
        return self.machine.fire(trigger)

    def _require(self, client: EngineClient | None) -> EngineClient:
        if client is None:
            raise EngineFailed(self.id, self.state, "no server process")
        return client

    # -- start ---------------------------------------------------------------------------------
    async def start(self, *, confirm: bool = True) -> None:
        """Init/Stopped -> Starting -> PendingWeights (alive, not routable until it has weights).

        ``confirm=False`` stops at a healthy ``Starting``: a controller launching many engines at once
        then calls :meth:`confirm_ready` in slot order, so the event log does not depend on which
        process happened to answer first.
        """
        self._fire("start")
        await self._launch(confirm=confirm)

    def confirm_ready(self) -> None:
        """Starting (process healthy) -> PendingWeights."""
        self._fire("ready")

    async def _launch(self, *, confirm: bool = True) -> None:
        try:
            self.url = await asyncio.wait_for(self.launcher.launch(), self.timeouts.startup)
            if self.client is not None:
                await self.client.close()
            self.client = EngineClient(self.url, engine_id=self.id, api_key=self.api_key, timeout=self.timeouts.request)
            await self._wait_healthy()
        except (TimeoutError, EngineError, OSError) as exc:
            self.reason = f"did not start: {exc}"
            self._fire("start_failed")
            raise EngineFailed(self.id, "Starting", self.reason) from exc
        self.weight_version = None
        if confirm:
            self._fire("ready")

    async def _wait_healthy(self) -> None:
        """Poll /health_generate until it answers (bounded by the startup timeout), then flush the cache."""
        client = self._require(self.client)
        deadline = time.monotonic() + self.timeouts.startup
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                await client.health_generate(timeout=min(5.0, self.timeouts.request))
                await client.flush_cache()
                return
            except EngineError as exc:
                last = exc
                await asyncio.sleep(0.1)
        raise TimeoutError(f"/health_generate did not answer within {self.timeouts.startup:g}s ({last})")

    # -- weights -----------------------------------------------------------------------------------
    async def load_weights(self, path: str, version: str) -> None:
        """PendingWeights/Quiesced/WeightsOnly -> (Loading|Updating)Weights -> ...; checks the version."""
        self._fire("begin_update")
        client = self._require(self.client)
        try:
            await client.update_weights_from_disk(path, weight_version=version)
            info = await client.model_info()
            got = info.weight_version
            if got != version:
                raise EngineFailed(self.id, self.state, f"loaded weight version {got!r}, expected {version!r}")
        except EngineError as exc:
            self.reason = f"weight update failed: {exc}"
            await self.mark_unhealthy(self.reason)
            raise
        except EngineFailed:
            self._fire("abort_update")
            raise
        self.weight_version = version
        self._fire("finish_update")

    async def abort_update(self) -> None:
        self._fire("abort_update")

    # -- traffic -----------------------------------------------------------------------------------
    async def resume(self) -> None:
        """Quiesced -> Serving: routable again."""
        self._fire("resume")
        await self._require(self.client).continue_generation()

    async def drain(self, mode: PauseMode = "retract") -> None:
        """Serving -> Quiesced: out of routing, in-flight generation paused."""
        self._fire("drain")
        await self._require(self.client).pause_generation(mode=mode)

    # -- memory --------------------------------------------------------------------------------------
    async def offload(self) -> None:
        self._fire("offload")
        await self._require(self.client).release_memory_occupation(["weights", "kv_cache"])

    async def onload_weights(self) -> None:
        self._fire("onload_weights")
        await self._require(self.client).resume_memory_occupation(["weights"])

    async def onload_kv(self) -> None:
        self._fire("onload_kv")
        await self._require(self.client).resume_memory_occupation(["kv_cache"])

    # -- faults and recovery ---------------------------------------------------------------------------
    async def mark_unhealthy(self, reason: str) -> None:
        """A probe threshold, a failed request or a death report: out of routing at once."""
        if self.state in ("Unhealthy", "Recovering", "Stopping", "Stopped", "Failed", "Disposed", "Init"):
            return
        self.reason = f"{reason} (while {self.state})"
        with bind_context(reason=self.reason):  # the cause travels with the transition event
            self._fire("mark_unhealthy")

    async def recover(self) -> None:
        """Unhealthy -> Recovering -> Starting -> PendingWeights, within the restart budget.

        Without rollout FT the guard blocks: the engine goes to Failed and the error says why.
        """
        result = self._fire("recover")
        if not result.ok:
            self._fire("fail")
            raise EngineFailed(
                self.id,
                "Unhealthy",
                f"{self.reason or 'unhealthy'}; not recovered: rollout fault tolerance is off "
                f"(blocked by {', '.join(result.blocked_by)}; use --use-fault-tolerance --ft-components rollout)",
            )
        await self.launcher.kill()
        await self.launcher.wait_dead(self.timeouts.death)
        delay = self.budget.next_delay()
        if delay is None:
            self._fire("give_up")
            raise EngineFailed(
                self.id,
                "Recovering",
                f"{self.reason}; restart budget spent ({self.budget.max_restarts} restarts within "
                f"{self.budget.window:g}s: --engine-max-restarts / --engine-restart-window)",
            )
        await asyncio.sleep(delay)
        self._fire("restart")
        await self._launch()

    # -- stop ----------------------------------------------------------------------------------------------
    async def stop(self) -> None:
        """-> Stopping, kill, and Stopped only once the process is confirmed dead."""
        self._fire("stop")
        await self.launcher.kill()
        if not await self.launcher.wait_dead(self.timeouts.death):
            raise EngineFailed(self.id, "Stopping", f"process still alive {self.timeouts.death:g}s after SIGKILL")
        self._fire("confirm_dead")
        if self.client is not None:
            await self.client.close()
            self.client = None

    async def dispose(self) -> None:
        if self.state not in ("Init", "Stopped"):
            await self.stop()
        self._fire("dispose")
