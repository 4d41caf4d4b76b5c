"""InferenceController: the infrastructure half of the rollout manager.

It owns the engine slots (server groups), the health monitor, the engine lock, offload/onload and
the death watchers, and moves them only as the shared ``rollout`` machine allows:

* every rollout-manager operation is a :func:`_op`: the engine verbs ``ENGINE_PLAN`` lists *before*
  the manager's own move, the move itself (which may be blocked by a predicate: then nothing else
  happens), its effects (create/resume/pause/stop the monitor, the engine lock), then the engine
  verbs listed *after* it -- the same couplings the product model (``lifecycle.job``) explores;
* monitors are created only when the move's effects include ``start_monitor``, and resumed or
  paused only through ``resume_monitor``/``pause_monitor`` effects;
* a weight update waits (bounded) for ``Job.snapshot_ready``'s rule, takes one snapshot, and
  releases the engine lock on every exit;
* an engine's death is seen from its launcher (``watch()``), not at the next probe; with a monitor
  it goes through ``monitor.engine_died``, otherwise the controller marks it itself. Without rollout
  FT the engine then fails (``Engine.recover`` refuses) and the run stops with its reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence

from engines.engine import Engine, EngineFailed, Timeouts
from engines.errors import EngineError
from engines.health import HealthMonitor, create_monitor
from engines.launcher import LauncherFactory
from lifecycle.config import LifecycleConfig
from lifecycle.errors import LifecycleError
from lifecycle.events import EventLog
from lifecycle.job import ENGINE_PLAN
from lifecycle.ledger import EffectLedger
from lifecycle.predicates import rollout_ft
from lifecycle.runtime import FireResult, LifecycleMachine
from rollout.eval_fleet import EvalFleet

GONE = frozenset({"Failed", "Disposed", "Stopped", "Init"})


class ControllerError(LifecycleError):
    """The rollout side cannot go on (no routable engine, an engine failed without FT, a bounded wait ran out)."""


class InferenceController:
    def __init__(
        self,
        config: LifecycleConfig,
        machine: LifecycleMachine,
        *,
        launcher_factory: LauncherFactory | None = None,
        log: EventLog | None = None,
        ledger: EffectLedger | None = None,
        timeouts: Timeouts | None = None,
        group: str = "rollout",
        seed: int = 0,
        snapshot_timeout: float = 60.0,
    ) -> None:
        self.config = config
        self.machine = machine
        self.launcher_factory = launcher_factory
        self.log = log
        self.ledger = ledger
        self.timeouts = timeouts or Timeouts()
        self.group = group
        self.seed = seed
        self.snapshot_timeout = snapshot_timeout
        self.engines: list[Engine] = []
        self.monitor: HealthMonitor | None = None
        self.lock = asyncio.Lock()
        self.weights: tuple[str, str] | None = None  # (path, version) every current engine holds
        self.failures: list[EngineFailed] = []
        self.ci_armed = False
        self._watch_gen: dict[str, int] = {}
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._closing = False
        self.eval_fleet: EvalFleet | None = None  # only when servers_ready says start_eval_fleet
        self.eval_alive_timeout = 60.0  # the eval fleet's bounded wait for its engines at pin

    # -- views -----------------------------------------------------------------------------------
    def states(self) -> dict[str, str]:
        return {e.id: e.state for e in self.engines}

    def routable(self) -> list[Engine]:
        """Only Serving engines receive generate requests (invariant 4)."""
        return [e for e in self.engines if e.routable]

    def check(self) -> None:
        """Raise the first engine failure the run must stop for."""
        if self.failures:
            raise self.failures[0]

    # -- the composite operation (ENGINE_PLAN) -----------------------------------------------------
    async def _op(self, trigger: str, *, weights: tuple[str, str] | None = None) -> FireResult:
        plan = ENGINE_PLAN.get(trigger, ())
        for when, engine_trigger, states in plan:
            if when == "before":
                await self._engines_do(engine_trigger, states, weights)
        result = self.machine.fire(trigger)
        if not result.ok:
            return result
        await self._effects(result)
        for when, engine_trigger, states in plan:
            if when == "after":
                await self._engines_do(engine_trigger, states, weights)
        return result

    async def _engines_do(self, trigger: str, states: frozenset[str], weights: tuple[str, str] | None) -> None:
        for engine in [e for e in self.engines if e.state in states]:  # in slot order: a deterministic event log
            await self._engine_do(engine, trigger, weights)

    async def _engine_do(self, engine: Engine, trigger: str, weights: tuple[str, str] | None) -> None:
        try:
            if trigger == "begin_update":
                if weights is None:
                    raise ControllerError(f"{engine.id}: begin_update without weights")
                await engine.load_weights(*weights)  # begin_update ... finish_update on the engine
            elif trigger == "finish_update":
                pass  # load_weights already finished it (an engine still updating here failed: handled there)
            elif trigger == "abort_update":
                await engine.abort_update()
            else:
                await getattr(engine, trigger)()  # resume, drain, offload, onload_weights, onload_kv
        except (EngineError, EngineFailed) as exc:
            await self.engine_unhealthy(engine.id, f"{trigger} failed: {exc}")

    async def _effects(self, result: FireResult) -> None:
        for effect in result.effects:
            if effect == "start_monitor":
                self.monitor = await create_monitor(
                    self.config, self.group, self.engine_unhealthy, log=self.log, ledger=self.ledger, seed=self.seed
                )
                if self.monitor is not None:
                    for engine in self.engines:
                        self._monitor_add(engine)
            elif effect == "resume_monitor" and self.monitor is not None and self.monitor.state == "Paused":
                await self.monitor.resume()
            elif effect == "pause_monitor" and self.monitor is not None and self.monitor.state == "Running":
                # "monitors off" on entry to the move: a no-op when already paused (as in lifecycle.job)
                await self.monitor.pause()
            elif effect == "stop_monitor" and self.monitor is not None:
                await self.monitor.stop()
            elif effect == "arm_ci_fault_injection":
                self.ci_armed = True
            elif effect == "start_eval_fleet":
                await self._start_eval_fleet()
            elif effect == "stop_servers":
                await self._stop_engines()

    # -- servers --------------------------------------------------------------------------------------
    async def start_servers(self, weights: tuple[str, str]) -> bool:
        """start_servers (or skip_servers when the predicate says no), then servers_ready with ``weights``."""
        result = self.machine.fire("start_servers")
        if not result.ok:
            self.machine.fire("skip_servers")
            return False
        if self.launcher_factory is None:
            raise ControllerError("start_servers: no launcher factory")
        count = self.config.num_rollout_engines  # read only when servers start (never in replay)
        self.engines = [
            Engine(
                f"engine-{i}",
                self.config,
                self.launcher_factory(f"engine-{i}"),
                log=self.log,
                ledger=self.ledger,
                timeouts=self.timeouts,
            )
            for i in range(count)
        ]
        # launched concurrently, confirmed in slot order: the event log is the same in every run
        outcomes = await asyncio.gather(*(e.start(confirm=False) for e in self.engines), return_exceptions=True)
        for engine, outcome in zip(self.engines, outcomes, strict=True):
            if not isinstance(outcome, BaseException):
                engine.confirm_ready()
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            self.machine.fire("servers_failed")
            raise ControllerError(f"rollout servers failed to start: {errors[0]}")
        for engine in self.engines:
            self._watch(engine)
        await self._op("servers_ready", weights=weights)
        self.weights = weights
        return True

    def _monitor_add(self, engine: Engine) -> None:
        if self.monitor is None:
            return

        liveness_only = self.config.rollout_health_check_endpoint == "health"

        async def probe(timeout: float) -> None:
            if engine.client is None:
                raise ControllerError(f"{engine.id}: no client")
            if liveness_only:  # --rollout-health-check-endpoint health: cheaper, but misses a wedged scheduler
                await engine.client.health(timeout=timeout)
            else:
                await engine.client.health_generate(timeout=timeout)

        self.monitor.add_engine(engine.id, probe)

    def _watch(self, engine: Engine) -> None:
        gen = self._watch_gen.get(engine.id, 0) + 1
        self._watch_gen[engine.id] = gen
        watch = engine.launcher.watch

        async def run() -> None:
            reason = await watch()
            if self._closing or self._watch_gen.get(engine.id) != gen:
                return  # a death we caused (recovery, stop): not news
            await self.engine_died(engine.id, str(reason))

        self._watchers[engine.id] = asyncio.create_task(run(), name=f"watch-{engine.id}")

    def _unwatch(self, engine: Engine) -> None:
        self._watch_gen[engine.id] = self._watch_gen.get(engine.id, 0) + 1

    def engine(self, engine_id: str) -> Engine:
        for e in self.engines:
            if e.id == engine_id:
                return e
        raise KeyError(engine_id)

    async def engine_died(self, engine_id: str, reason: str) -> None:
        """The launcher saw the process exit: through the monitor when there is one, else directly."""
        if self.monitor is not None and self.monitor.state in ("Paused", "Running"):
            await self.monitor.engine_died(engine_id, reason)
        else:
            await self.engine_unhealthy(engine_id, f"process died: {reason}")

    async def engine_unhealthy(self, engine_id: str, reason: str) -> None:
        """Out of routing at once; without rollout FT the engine fails and the run will stop."""
        if self.eval_fleet is not None and engine_id in self.eval_fleet.ids:
            await self.eval_fleet.engine_unhealthy(engine_id, reason)  # the fleet restarts it at its next pin
            return
        engine = self.engine(engine_id)
        await engine.mark_unhealthy(reason)
        if engine.state == "Unhealthy" and not rollout_ft(self.config):
            self._unwatch(engine)
            try:
                await engine.recover()  # refuses (guard rollout_ft) and fires fail: Failed, with the reason
            except EngineFailed as exc:
                self.failures.append(exc)

    async def recover_unhealthy(self) -> list[str]:
        """Recover every Unhealthy engine (only reached via the trainer's recover_engine effect)."""
        recovered = []
        for engine in [e for e in self.engines if e.state == "Unhealthy"]:
            self._unwatch(engine)
            if self.monitor is not None:
                self.monitor.remove_engine(engine.id)
            failure = await self._recover_within_budget(engine)
            if failure is not None:
                self.failures.append(failure)
                continue
            self._watch(engine)
            self._monitor_add(engine)
            recovered.append(engine.id)
        return recovered

    @staticmethod
    async def _recover_within_budget(engine: Engine) -> EngineFailed | None:
        """Restart until it starts; a relaunch that fails to start (start_failed: Unhealthy again) is
        retried -- each try spends the restart budget, which ends in Failed -- instead of leaving an
        Unhealthy engine that the next weight update's snapshot would wait on."""
        while True:
            try:
                await engine.recover()
                return None
            except EngineFailed as exc:
                if engine.state != "Unhealthy":
                    return exc

    # -- single engines (an operator's stop/start) ------------------------------------------------------
    async def stop_engine(self, engine_id: str) -> None:
        """Take one engine out for good: out of routing, killed, ``Stopped`` once its death is confirmed.

        Under the engine lock, so it never cuts into a weight-update snapshot; unwatched first, so the
        death we cause is not reported as a fault (and never recovered).
        """
        engine = self.engine(engine_id)
        async with self.lock:
            self._unwatch(engine)
            if self.monitor is not None:
                self.monitor.remove_engine(engine.id)
            await engine.stop()

    async def start_engine(self, engine_id: str) -> None:
        """Start a stopped engine again; it waits in ``PendingWeights`` until ``catch_up`` loads the weights."""
        engine = self.engine(engine_id)
        async with self.lock:
            await engine.start()
            self._watch(engine)
            self._monitor_add(engine)

    # -- generate boundaries ----------------------------------------------------------------------------
    async def begin_generate(self) -> FireResult:
        return await self._op("generate")

    async def end_generate(self) -> FireResult:
        return await self._op("generate_done")

    # -- eval ---------------------------------------------------------------------------------------------
    async def _start_eval_fleet(self) -> None:
        """The ``start_eval_fleet`` effect: the dedicated eval engines, with the rollout launcher factory.

        With rollout FT the rollout monitor also probes the eval engines (``eval_fleet_self_probes`` is
        false, so the fleet does not); its verdicts reach the fleet through :meth:`engine_unhealthy`.
        """
        if self.launcher_factory is None:
            raise ControllerError("start_eval_fleet: no launcher factory")
        monitor = self.monitor

        def unwatch(engine: Engine) -> None:
            if monitor is not None:
                monitor.remove_engine(engine.id)

        self.eval_fleet = EvalFleet(
            self.config,
            self.launcher_factory,
            log=self.log,
            ledger=self.ledger,
            timeouts=self.timeouts,
            alive_timeout=self.eval_alive_timeout,
            watch=self._monitor_add,
            unwatch=unwatch,
        )
        await self.eval_fleet.create()

    async def begin_eval(self) -> FireResult:
        return await self._op("eval")

    async def end_eval(self) -> FireResult:
        return await self._op("eval_done")

    # -- memory -------------------------------------------------------------------------------------------
    async def offload(self) -> FireResult | None:
        return None if self.machine.state == "Replay" else await self._op("offload")

    async def onload_weights(self) -> FireResult | None:
        if self.machine.state != "Offloaded":
            return None
        return await self._op("onload_weights")

    async def onload_kv(self) -> FireResult | None:
        if self.machine.state != "WeightsOnly":
            return None
        return await self._op("onload_kv")

    # -- weights --------------------------------------------------------------------------------------------
    def snapshot_ready(self) -> bool:
        """``Job.snapshot_ready``: every engine still in play is quiesced (or waits for weights)."""
        if self.machine.state == "Ready":
            want = {"Quiesced", "PendingWeights"}
        else:
            want = {"WeightsOnly", "PendingWeights", "Quiesced"}
        return all(e.state in want or e.state in GONE for e in self.engines)

    async def get_updatable_engines_and_lock(self) -> list[Engine]:
        """Wait (bounded) for the snapshot rule, take the engine lock, fire begin_update: one snapshot."""
        deadline = time.monotonic() + self.snapshot_timeout
        while not self.snapshot_ready():
            if time.monotonic() > deadline:
                raise ControllerError(
                    f"weight update: engines not updatable after {self.snapshot_timeout:g}s: {self.states()}"
                )
            await asyncio.sleep(0.05)
        await self.lock.acquire()
        result = self.machine.fire("begin_update")
        if not result.ok:
            self.lock.release()
            return []
        await self._effects(result)
        return [e for e in self.engines if e.state in ("Quiesced", "PendingWeights", "WeightsOnly")]

    async def update_weights(self, path: str, version: str) -> list[str]:
        """Push one weights file to one snapshot of engines under the engine lock (monitors paused)."""
        if not self.engines or self.machine.state not in ("Ready", "WeightsOnly"):
            return []
        snapshot = await self.get_updatable_engines_and_lock()
        if not self.lock.locked():
            return []
        try:
            for engine in snapshot:
                await self._engine_do(engine, "begin_update", (path, version))
            await self._op("update_done")
            self.weights = (path, version)
        except BaseException:
            if self.machine.state in ("UpdatingWeights", "UpdatingWeightsKVReleased"):
                await self._op("update_failed")
            raise
        finally:
            self.lock.release()
        return [e.id for e in snapshot if e.weight_version == version]

    async def catch_up(self) -> list[str]:
        """Restarted engines (PendingWeights) receive the committed weights before they serve."""
        pending = [e for e in self.engines if e.state == "PendingWeights"]
        if not pending or self.weights is None or self.machine.state != "Ready":
            return []
        async with self.lock:
            result = await self._op("catch_up", weights=self.weights)
            if not result.ok:
                return []
            try:
                await self._op("update_done")
            except BaseException:
                if self.machine.state == "CatchingUp":
                    await self._op("update_failed")
                raise
        return [e.id for e in pending if e.state == "Quiesced"]

    # -- faults (the loop's --inject) -------------------------------------------------------------------
    async def kill_engine(self, index: int, *, wait: float = 15.0) -> str:
        """SIGKILL an engine's server (a real death) and wait (bounded) until the lifecycle saw it."""
        engine = self.engines[index]
        await engine.launcher.kill()
        deadline = time.monotonic() + wait
        while engine.state not in ("Unhealthy", "Failed", "Recovering"):
            if time.monotonic() > deadline:
                raise ControllerError(f"{engine.id}: death not detected within {wait:g}s")
            await asyncio.sleep(0.02)
        return engine.state

    # -- disposal ---------------------------------------------------------------------------------------
    async def _stop_engines(self) -> None:
        self._closing = True
        if self.eval_fleet is not None:
            await self.eval_fleet.dispose()
        for engine in self.engines:
            self._unwatch(engine)
            try:
                if engine.state not in ("Failed", "Disposed"):
                    await engine.dispose()
            except (EngineFailed, EngineError, LifecycleError):
                pass
        await self.close()

    async def close(self) -> None:
        """Best-effort cleanup whatever the states: kill processes, stop watchers, close clients."""
        self._closing = True
        if self.eval_fleet is not None:
            await self.eval_fleet.close()
        for engine in self.engines:
            with contextlib.suppress(Exception):
                await engine.launcher.kill()
            if engine.client is not None:
                await engine.client.close()
            engine.launcher.shutdown()
        if self.monitor is not None and self.monitor.state in ("Paused", "Running"):
            await self.monitor.stop()
        tasks: Sequence[asyncio.Task[None]] = list(self._watchers.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watchers.clear()
