"""EvalFleet: dedicated eval engines (``--eval-num-gpus``) pinned to one weight snapshot per eval.

Driven by the ``eval_fleet`` machine (``lifecycle.machines.EVAL_FLEET``). ``pin(path, version)`` walks
Probing -> Restarting -> WaitingAlive -> LoadingSnapshot -> Pinned, and every step that cannot
succeed ends in a typed skip (``SkippedUnhealthy`` / ``SkippedPinViolation``) instead of an exception:
an eval that cannot run on one agreed snapshot is skipped with a reason, never run on a mix.

Who watches the eval engines between evals (``eval_fleet_self_probes``):

* rollout FT off (no rollout monitor exists): the fleet probes its own engines at the start of
  every pin (``Probing``: one concurrent ``/health_generate`` round, per-probe timeout
  ``--rollout-health-check-timeout``); a failed probe marks the engine ``Unhealthy``;
* rollout FT on: the controller adds the eval engines to the rollout health monitor (which runs
  during generate/eval), and its verdicts reach :meth:`EvalFleet.engine_unhealthy`; pin does not probe.

In both cases a process death reported by the launcher (Ray/the OS: ``alive()`` is false) is
acted on at pin time -- that is a death report, not a probe. Restarting is the fleet's own:
``stop`` (death confirmed) then ``start`` on the engine machine, bounded by the engine's restart
budget (``--engine-max-restarts``) -- it never goes through rollout FT's ``recover``.

The spec has no ``unhealthy`` edge out of ``LoadingSnapshot``: an engine whose load *fails* (HTTP
error, death mid-load) does not hold the requested version, so it is reported as ``pin_violation``
(the detail says "load failed") and is marked Unhealthy, so the next pin restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from engines.engine import Engine, EngineFailed, Timeouts
from engines.errors import EngineError
from engines.launcher import LauncherFactory
from lifecycle.config import LifecycleConfig
from lifecycle.errors import LifecycleError
from lifecycle.events import EventLog
from lifecycle.ledger import EffectLedger
from lifecycle.machines import ENGINE, EVAL_FLEET
from lifecycle.runtime import LifecycleMachine

SkipReason = Literal["unhealthy", "pin_violation"]
EngineHook = Callable[[Engine], None]

# engine states an eval engine may be marked Unhealthy from: the engine spec's mark_unhealthy sources
_MARKABLE = frozenset(s for t in ENGINE.transitions if t.trigger == "mark_unhealthy" for s in t.source)
_LOADABLE = frozenset({"PendingWeights", "Quiesced"})  # an alive eval engine, ready for begin_update
_NEEDS_RESTART = frozenset({"Init", "Unhealthy", "Stopped"})


class EvalFleetError(LifecycleError):
    """The fleet was asked for something its machine does not allow (e.g. pin before create)."""


@dataclass(frozen=True)
class PinResult:
    """The outcome of one pin: ``Pinned`` (``ok``), or a skip with its typed reason and the detail."""

    state: str
    weight_version: str
    reason: SkipReason | None = None
    detail: str = ""
    versions: dict[str, str | None] = field(default_factory=dict)  # /model_info per engine (what was checked)
    restarted: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.state == "Pinned"


class EvalFleet:
    """The eval engines ``eval-0``, ``eval-1``, ... and the ``eval_fleet`` machine that moves them."""

    def __init__(
        self,
        config: LifecycleConfig,
        launcher_factory: LauncherFactory,
        *,
        log: EventLog | None = None,
        ledger: EffectLedger | None = None,
        timeouts: Timeouts | None = None,
        alive_timeout: float = 60.0,
        watch: EngineHook | None = None,
        unwatch: EngineHook | None = None,
    ) -> None:
        self.config = config
        self.launcher_factory = launcher_factory
        self.log = log
        self.ledger = ledger
        self.timeouts = timeouts or Timeouts()
        self.alive_timeout = alive_timeout
        self._watch = watch  # e.g. the controller adds the engine to the rollout monitor
        self._unwatch = unwatch
        self.machine = LifecycleMachine(EVAL_FLEET, config, "eval_fleet", log=log, ledger=ledger)
        self.engines: list[Engine] = []
        self.pinned: tuple[str, str] | None = None  # (path, version) while Pinned
        self.last: PinResult | None = None

    # -- views -------------------------------------------------------------------------------------
    @property
    def state(self) -> str:
        return self.machine.state

    @property
    def ids(self) -> frozenset[str]:
        return frozenset(e.id for e in self.engines)

    def states(self) -> dict[str, str]:
        return {e.id: e.state for e in self.engines}

    def routable(self) -> list[Engine]:
        """Eval traffic goes only to Serving eval engines, and only while the fleet is Pinned."""
        if self.state != "Pinned":
            return []
        return [e for e in self.engines if e.routable]

    def engine(self, engine_id: str) -> Engine:
        for e in self.engines:
            if e.id == engine_id:
                return e
        raise KeyError(engine_id)

    # -- create ------------------------------------------------------------------------------------
    async def create(self) -> bool:
        """Init -> Idle (only when ``eval_fleet_enabled``), then launch every eval engine.

        A start that fails leaves that engine Unhealthy: the next pin restarts it (or skips).
        """
        result = self.machine.fire("create")
        if not result.ok:
            return False
        self.engines = [
            Engine(
                f"eval-{i}",
                self.config,
                self.launcher_factory(f"eval-{i}"),
                log=self.log,
                ledger=self.ledger,
                timeouts=self.timeouts,
            )
            for i in range(self.config.num_eval_engines)
        ]
        await asyncio.gather(*(e.start() for e in self.engines), return_exceptions=True)
        for engine in self.engines:
            if engine.state == "PendingWeights" and self._watch is not None:
                self._watch(engine)
        return True

    # -- pin ---------------------------------------------------------------------------------------
    async def pin(self, path: str, version: str) -> PinResult:
        """Probe (only if nobody else does), restart, wait alive (bounded), load, check versions; or skip."""
        result = self.machine.fire("pin")
        if not result.ok:
            raise EvalFleetError(f"eval fleet: pin blocked by {', '.join(result.blocked_by)}")
        if self.state == "Probing":
            await self._probe()
            self.machine.fire("probed")
        try:
            restarted = await self._restart_dead()
        except (EngineFailed, EngineError, TimeoutError) as exc:
            return self._skip("unhealthy", version, f"restart failed: {exc}")
        self.machine.fire("restarted")
        silent = await self._wait_alive()
        if silent:
            return self._skip("unhealthy", version, f"not alive within {self.alive_timeout:g}s: {', '.join(silent)}")
        self.machine.fire("alive")
        versions, problems = await self._load(path, version)
        if problems:
            return self._skip("pin_violation", version, "; ".join(problems), versions, restarted)
        self.machine.fire("loaded")
        for engine in self.engines:  # Quiesced -> Serving: eval requests are served only now
            await engine.resume()
        self.pinned = (path, version)
        self.last = PinResult("Pinned", version, versions=versions, restarted=restarted)
        return self.last

    def _skip(
        self,
        reason: SkipReason,
        version: str,
        detail: str,
        versions: dict[str, str | None] | None = None,
        restarted: tuple[str, ...] = (),
    ) -> PinResult:
        self.machine.fire("unhealthy" if reason == "unhealthy" else "version_mismatch")
        self.last = PinResult(self.state, version, reason, detail, versions or {}, restarted)
        return self.last

    async def _probe(self) -> None:
        """One concurrent probe round (only when ``eval_fleet_self_probes``); failures mark Unhealthy."""
        timeout = float(self.config.rollout_health_check_timeout or 30.0)

        async def one(engine: Engine) -> None:
            if engine.state not in _MARKABLE:
                return
            if engine.client is None:
                await self.engine_unhealthy(engine.id, "no server process")
                return
            try:
                await asyncio.wait_for(engine.client.health_generate(timeout=timeout), timeout)
            except (TimeoutError, EngineError) as exc:
                await self.engine_unhealthy(engine.id, f"probe failed: {type(exc).__name__}: {exc}")

        await asyncio.gather(*(one(e) for e in self.engines))

    async def _restart_dead(self) -> tuple[str, ...]:
        """Restart engines that are dead (launcher reports it) or marked Unhealthy: stop, then start."""
        for engine in self.engines:
            if engine.state in _MARKABLE and not await asyncio.to_thread(engine.launcher.alive):
                await self.engine_unhealthy(engine.id, "process died (reported by the launcher)")
        for engine in self.engines:
            if engine.state == "Failed":
                raise EngineFailed(engine.id, "Failed", engine.reason or "failed")
        todo = [e for e in self.engines if e.state in _NEEDS_RESTART]
        outcomes = await asyncio.gather(*(self._restart(e) for e in todo), return_exceptions=True)
        for outcome in outcomes:  # every restart has finished (or failed) before the first error is raised
            if isinstance(outcome, BaseException):
                raise outcome
        return tuple(e.id for e in todo)

    async def _restart(self, engine: Engine) -> None:
        if engine.state != "Init":
            delay = engine.budget.next_delay()
            if delay is None:
                raise EngineFailed(
                    engine.id,
                    engine.state,
                    f"{engine.reason}; restart budget spent ({engine.budget.max_restarts} restarts within "
                    f"{engine.budget.window:g}s: --engine-max-restarts / --engine-restart-window)",
                )
            if self._unwatch is not None:
                self._unwatch(engine)
            if engine.state == "Unhealthy":
                await engine.stop()  # Stopping -> Stopped only once the death is confirmed
            await asyncio.sleep(delay)
        await engine.start()  # -> PendingWeights (raises EngineFailed, engine Unhealthy, if it does not come up)
        if self._watch is not None:
            self._watch(engine)

    async def _wait_alive(self) -> list[str]:
        """Until every eval engine answers /health_generate, bounded by ``alive_timeout``; the silent ones."""
        deadline = time.monotonic() + self.alive_timeout
        gone = [e.id for e in self.engines if e.state not in _LOADABLE]
        if gone:  # dead or failed after the restart step: no answer can come without another restart
            return gone
        waiting = list(self.engines)
        while waiting:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            answered = await asyncio.gather(*(self._answers(e, remaining) for e in waiting))
            waiting = [e for e, ok in zip(waiting, answered, strict=True) if not ok]
            if waiting:
                await asyncio.sleep(min(0.1, max(deadline - time.monotonic(), 0)))
        for engine in waiting:  # out of play until the next pin restarts it
            await self.engine_unhealthy(engine.id, f"no answer within {self.alive_timeout:g}s while pinning")
        return [e.id for e in waiting]

    @staticmethod
    async def _answers(engine: Engine, remaining: float) -> bool:
        if engine.state not in _LOADABLE or engine.client is None:
            return False
        timeout = max(min(remaining, 5.0), 0.01)
        try:
            await asyncio.wait_for(engine.client.health_generate(timeout=timeout), timeout)
        except (TimeoutError, EngineError):
            return False
        return True

    async def _load(self, path: str, version: str) -> tuple[dict[str, str | None], list[str]]:
        """Load ``path`` on every eval engine, then check every ``/model_info``: all or nothing."""
        outcomes = await asyncio.gather(*(e.load_weights(path, version) for e in self.engines), return_exceptions=True)
        problems = [
            f"{e.id}: load failed: {o}" for e, o in zip(self.engines, outcomes, strict=True) if isinstance(o, Exception)
        ]
        versions = await self._versions()
        problems += [
            f"{engine_id} holds weight version {got!r}, expected {version!r}"
            for engine_id, got in versions.items()
            if got != version and not any(p.startswith(f"{engine_id}: ") for p in problems)
        ]
        return versions, problems

    async def _versions(self) -> dict[str, str | None]:
        """What every eval engine's /model_info reports now (None when it does not answer)."""

        async def one(engine: Engine) -> str | None:
            if engine.client is None:
                return None
            try:
                return (await engine.client.model_info(timeout=self.timeouts.request)).weight_version
            except EngineError:
                return None

        got = await asyncio.gather(*(one(e) for e in self.engines))
        return dict(zip((e.id for e in self.engines), got, strict=True))

    # -- release / faults ----------------------------------------------------------------------------
    async def release(self) -> None:
        """Pinned/Skipped* -> Idle; pinned engines leave routing (Serving -> Quiesced)."""
        for engine in self.engines:
            if engine.state == "Serving":
                try:
                    await engine.drain()
                except (EngineError, EngineFailed) as exc:
                    await self.engine_unhealthy(engine.id, f"drain failed: {exc}")
        self.pinned = None
        if self.machine.can("release"):
            self.machine.fire("release")

    async def engine_unhealthy(self, engine_id: str, reason: str) -> None:
        """A probe, the rollout monitor or a failed request says so: out of routing until restarted."""
        engine = self.engine(engine_id)
        if engine.state in _MARKABLE:
            await engine.mark_unhealthy(reason)

    # -- disposal ------------------------------------------------------------------------------------
    async def dispose(self) -> None:
        """Idle -> Disposed; every eval engine stopped (death confirmed) and released."""
        if self.machine.can("release"):
            await self.release()
        for engine in self.engines:
            if self._unwatch is not None:
                self._unwatch(engine)
            with contextlib.suppress(EngineFailed, EngineError, LifecycleError):
                if engine.state not in ("Failed", "Disposed"):
                    await engine.dispose()
        if self.machine.can("dispose"):
            self.machine.fire("dispose")
        await self.close()

    async def close(self) -> None:
        """Best-effort cleanup whatever the states: kill processes, close clients, shut launchers."""
        for engine in self.engines:
            with contextlib.suppress(Exception):
                await engine.launcher.kill()
            if engine.client is not None:
                await engine.client.close()
            engine.launcher.shutdown()
