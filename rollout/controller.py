"""InferenceController: the infrastructure half of the rollout manager -- its shell.

It owns the engine slots (rollout engines ``engine-i`` and the eval fleet's ``eval-i``), the health
monitor's probing and the launchers' death watchers, and carries out the commands the lifecycle core
gives for them: launch, kill, load weights, pause/continue generation, release/resume memory, probe.
It decides nothing: which engines start, which are recovered, which are in a weight update's snapshot,
when the monitor runs and what a death means are the core's rules (``lifecycle.decide.core``), run by the
job's :class:`~lifecycle.decide.runner.Runner`. What the controller knows of its own is data: the URLs, the
clients, which weights are committed, why an engine was last marked.

Its parts by concern: the death watchers (:mod:`rollout.watch`), the engines started outside the job
(:mod:`rollout.external`), the engines kept across drivers (:mod:`rollout.kept`), what a stopped run says
(:mod:`rollout.failures`), and each group's routing (:mod:`rollout.routing`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

from engines.backends import engine_backend
from engines.engine import Engine, EngineFailed, Timeouts
from engines.errors import EngineError
from engines.health import HealthMonitor
from engines.launcher import ExternalLauncher, Keepable, Launcher, LauncherFactory
from engines.ledger import EngineLedger
from lifecycle.decide.backends import capabilities
from lifecycle.decide.core import EVAL, ROLLOUT, Command, Fact, Failure, Move, Outcome, instance_name
from lifecycle.decide.events import DRAINED, GATEWAY_MEMBERS, HANDED_BACK, PROBE, ROUTED, EventLog, Worker
from lifecycle.decide.names import EngineStateName
from lifecycle.decide.runner import Runner
from rollout.external import ExternalEngines
from rollout.failures import ControllerError as ControllerError  # raised here, and named here by its callers
from rollout.failures import engine_failure, slot_of, start_failure
from rollout.kept import KeptEngines
from rollout.preempt import DrainingNodes, OnNotice, ReadDraining, ray_draining
from rollout.routing import LocalRouting, RouterRouting, Routing
from rollout.watch import DeathWatch

Weights = tuple[str, str]  # (checkpoint path, weight version)
DRAIN_TIMEOUT_S = 30.0  # --rollout-drain-timeout's default (K8s terminationGracePeriodSeconds, GCE Spot)
DRAIN_MARGIN_S = 3.0  # kept before a notice's deadline: the engine is stopped and its death confirmed in it


class InferenceController:
    def __init__(
        self,
        runner: Runner,
        *,
        launcher_factory: LauncherFactory | None = None,
        timeouts: Timeouts | None = None,
        seed: int = 0,
        router: bool = False,
        log_dir: str | None = None,
        engine_ledger: EngineLedger | None = None,
    ) -> None:
        self.runner = runner
        # --detach-engines: what outlives this driver, rewritten around every launch, death and transfer
        self.ledger = engine_ledger
        self.config = runner.config
        self.launcher_factory = launcher_factory
        self.timeouts = timeouts or Timeouts()
        self.seed = seed
        self.engines: list[Engine] = []  # rollout engines, in slot order (created when servers start)
        self.evals: list[Engine] = []  # the eval fleet's engines
        self.monitor = HealthMonitor(self.config, runner.report, seed=seed, log=runner.log)
        self.marked: dict[str, str] = {}  # instance -> the state it was in when it was marked Unhealthy
        self.gave_up: set[str] = set()  # engines whose restart budget ran out
        self.external = ExternalEngines(runner, self.engines)
        self.replacements = self.external.replacements  # external engine -> how often its process was replaced
        self.kept = KeptEngines(runner, engine_ledger, self._serve)
        self.deaths = DeathWatch(runner.report)  # a watcher per live process: its death is news at once
        self.drains: set[asyncio.Task[None]] = set()  # leaving engines' drains, beside the lanes
        self.notices: dict[str, tuple[int | None, float]] = {}  # instance -> (epoch, monotonic deadline) of a notice
        self.node_watch: DrainingNodes | None = None  # Ray's draining nodes, watched (watch_draining_nodes)
        # where each group's requests go: a real SMG gateway per group, or the same membership in-process
        self.routings: dict[str, Routing] = {}
        for group in (ROLLOUT, EVAL):
            if router:
                self.routings[group] = RouterRouting(
                    f"router-{group}",
                    on_death=self._router_died(group),
                    log_dir=log_dir,
                    log=runner.log,
                    backend=self.config.rollout_backend,
                    on_news=self.engine_unhealthy,  # names the generation published (a late verdict is fenced)
                    health_checks=self.config.gateway_health_check,  # SMG's verdict as news (README)
                    # a stream's requests may wait paused through an update: SMG must not cut them at the request bound
                    request_timeout=self.timeouts.kept() if self.config.fully_async else self.timeouts.request,
                )
            else:
                self.routings[group] = LocalRouting(f"local-{group}")
        runner.watch(self._on_move)
        runner.explain(self._explain)
        runner.provide(
            {
                "engine.launch_engine": self._launch,
                "engine.kill_engine": self._kill,
                "engine.adopt_engine": self._adopt,
                "engine.transfer_weights": self._load,
                "engine.continue_generation": lambda c: self.slot(c).continue_generation(),
                "engine.pause_generation": lambda c: self.slot(c).pause_generation(),
                "engine.release_weights": lambda c: self.slot(c).release("weights"),
                "engine.release_kv_cache": lambda c: self.slot(c).release("kv_cache"),
                "engine.resume_weights": lambda c: self.slot(c).resume("weights"),
                "engine.resume_kv_cache": lambda c: self.slot(c).resume("kv_cache"),
                "engine.route_traffic": self._route,
                "engine.stop_routing": lambda c: self.routings[self._group(c)].withdraw(self.slot(c)),
                "engine.hold_routing": lambda c: self.routings[self._group(c)].hold(self.slot(c)),
                "engine.hand_back_requests": self._hand_back,
                "engine.drain_requests": self._drain_beside,
                "rollout.read_gateway": self._read_gateway,
                "engine.probe_engine": self._probe,
                "engine.inject_ci_fault": self._inject_ci_fault,
                "monitor.start_monitor": self._start_monitor,
                "monitor.resume_monitor": self.monitor.resume,
                "monitor.pause_monitor": self.monitor.pause,
                "monitor.stop_monitor": self.monitor.stop,
            }
        )

    # -- views ----------------------
    @property
    def log(self) -> EventLog:
        return self.runner.log

    @property
    def committed(self) -> Weights | None:
        """The weights every current engine holds (the runner keeps them in step with the core)."""
        return self.runner.committed

    def states(self, group: str = ROLLOUT) -> dict[str, str]:
        return self.runner.states(group)

    def state_of(self, engine: Engine) -> EngineStateName:
        group, i = self._where(engine.id)
        return self.runner.state.group(group)[i].state

    def routable(self, group: str = ROLLOUT) -> list[Engine]:
        """Only Serving engines receive requests (invariant 4; the core's rule, read off its state)."""
        slots = self.engines if group == ROLLOUT else self.evals
        return [slots[i] for i in self.runner.core.routable(self.runner.state, group) if i < len(slots)]

    def engine(self, engine_id: str) -> Engine:
        group, i = self._where(engine_id)
        return (self.engines if group == ROLLOUT else self.evals)[i]

    _where = staticmethod(slot_of)

    @staticmethod
    def _group(cmd: Command) -> str:
        assert cmd.group is not None
        return cmd.group

    def routing(self, group: str = ROLLOUT) -> Routing:
        """The group's routing: its published engines (the Serving ones) and how requests reach them."""
        return self.routings[group]

    def _router_died(self, group: str) -> Callable[[str], Awaitable[None]]:
        async def report(reason: str) -> None:
            await self.runner.report(Outcome("router_died", group, reason=reason))

        return report

    def slot(self, cmd: Command) -> Engine:
        assert cmd.group is not None and cmd.engine is not None
        slots = self._slots(cmd.group)
        return slots[cmd.engine]

    def _slots(self, group: str) -> list[Engine]:
        """The engine slots of a group, made on first use (the core says how many)."""
        slots = self.engines if group == ROLLOUT else self.evals
        count = len(self.runner.state.group(group))
        if len(slots) < count:
            slots.extend(self.new_engine(instance_name(group, i)) for i in range(len(slots), count))
        return slots

    def new_engine(self, engine_id: str) -> Engine:
        """An engine slot as the config says (its launcher, timeouts and probe endpoint): a rollout slot of
        ``--rollout-external-engine-addrs`` attaches to its address, every other one is launched."""
        endpoint = str(self.config.rollout_health_check_endpoint).lstrip("/")
        url = self.external.url(engine_id)
        launcher: Launcher
        if url is not None:  # an external engine speaks --rollout-backend's API
            launcher = ExternalLauncher(engine_id, url, api=engine_backend(self.config.rollout_backend).api)
        elif self.launcher_factory is None:
            raise ControllerError("engines must start, but the rollout manager has no launcher factory")
        else:
            launcher = self.launcher_factory(engine_id)
        return Engine(
            engine_id,
            launcher,
            timeouts=self.timeouts,
            probe_endpoint=endpoint,
            external=url is not None,
            pause_mode=self.config.pause_generation_mode,
        )

    async def _hand_back(self, cmd: Command) -> Outcome:
        """``hand_back_requests``: the engine ends the requests it kept through a failed update (they come back as
        aborted, and the stream sends them again); the calls still open to it are cancelled too (a request frozen
        ``in_place`` on SGLang ends only when its caller goes). The engine stays paused and unrouted."""
        engine = self.slot(cmd)
        outcome = await engine.hand_back_requests()
        await self.routings[self._group(cmd)].withdraw(engine)  # out already (hold_routing): cancels what is open
        if self.log.enabled:
            self.log.emit(HANDED_BACK, instance=engine.id)
        return outcome

    def drain_bound(self, deadline_s: float | None = None) -> float:
        """Seconds a leaving engine's drain may take: ``--rollout-drain-timeout``, and never past a notice's
        deadline less :data:`DRAIN_MARGIN_S` (the engine must still be stopped and its death confirmed by then)."""
        bound = float(getattr(self.config, "rollout_drain_timeout", None) or DRAIN_TIMEOUT_S)
        if deadline_s is not None:
            bound = min(bound, deadline_s - DRAIN_MARGIN_S)
        return max(0.0, bound)

    async def drain_requests(
        self, cmd: Command, *, deadline_s: float | None = None, hand_back: bool = False, handed_back_later: bool = False
    ) -> Outcome:
        """``drain_requests`` carried out: the engine is out of its router already; wait (bounded by
        :meth:`drain_bound`) until the server's own running count reaches 0, polled where its backend row says
        (``Capabilities.running``). On a timeout, what is left is handed back here through ``hand_back_requests``'
        own path with ``hand_back``, or by the core's ``drained`` move with ``handed_back_later`` (a stream: the
        count is reported handed back either way). Logs ``engine.drained`` and returns the news ``drained`` about
        this process (its epoch), ``reason`` saying how it ended; ``deadline_s``: seconds left of a notice (by
        default the one :meth:`note_notice` kept for this process), None for a planned retire."""
        engine = self.slot(cmd)
        epoch = engine.epoch
        if deadline_s is None and cmd.instance in self.notices:
            noticed_epoch, at = self.notices[cmd.instance]
            if noticed_epoch == epoch:
                deadline_s = at - time.monotonic()
        row = capabilities(self.config.rollout_backend, self.config.rollout_device)
        drained = await engine.drain(row.running, self.drain_bound(deadline_s))
        handed = 0
        if drained.timed_out and hand_back:
            await self._hand_back(cmd)
        if drained.timed_out and (hand_back or handed_back_later):
            handed = max(drained.running, 0)
        if self.log.enabled:
            self.log.emit(
                DRAINED,
                instance=engine.id,
                epoch=epoch,
                running=drained.running,
                handed_back=handed,
                timed_out=drained.timed_out,
                seconds=drained.seconds,
            )
        reason = "" if not drained.timed_out else f"{drained.running} requests still running after {drained.seconds:g}s"
        if drained.error:
            reason += f" (the count could not be read: {drained.error})"
        return Outcome("drained", cmd.group, cmd.engine, reason, epoch=epoch)

    async def _drain_beside(self, cmd: Command) -> Outcome:
        """The effect's handler: the drain runs beside the lane (``done`` at once: the watching started) and its
        end is news (``drained``, fenced by the process's epoch like a death). Where this config hands requests
        back (a stream), the core's ``drained`` move does it."""
        later = ("engine", "hand_back_requests") in self.runner.core.commands()

        async def run() -> None:
            await self.runner.report(await self.drain_requests(cmd, handed_back_later=later))

        task = asyncio.create_task(run(), name=f"drain-{cmd.instance}")
        self.drains.add(task)
        task.add_done_callback(self.drains.discard)
        return Outcome("done")

    async def read_gateway(self) -> tuple[list[Fact], list[str]]:
        """``read_gateway``: each group's gateway (SMG) read whole -- ``GET /workers`` of the rollout and the eval
        router -- as one ``gateway.members`` fact per router that runs and answers (and why each other did not):
        every worker SMG lists, with the engine whose URL it is (None: a URL no slot of the group holds) and that
        process's epoch. It only reports (the monitor judges the list against the Serving engines): SMG is never
        repaired to hide a disagreement."""
        facts, errors = [], []
        for group, routing in self.routings.items():
            if not isinstance(routing, RouterRouting) or not routing.router.alive:
                continue  # in-process routing, or no gateway running: there is no list to read
            engines = self.engines if group == ROLLOUT else self.evals
            owners = {e.url.rstrip("/"): e for e in engines if e.url is not None}
            try:
                listed = await routing.router.workers()
            except EngineError as exc:
                errors.append(f"{routing.name}: {exc}")
                continue
            workers: list[Worker] = []
            for url in sorted(listed):
                worker, owner = listed[url], owners.get(url)
                workers.append(
                    Worker(
                        instance=None if owner is None else owner.id,
                        url=url,
                        epoch=None if owner is None else owner.epoch,
                        status=worker.status,
                        weight_version=worker.weight_version,
                    )
                )
            facts.append(Fact.of(GATEWAY_MEMBERS, router=routing.name, workers=workers))
        return facts, errors

    async def _read_gateway(self, cmd: Command) -> Outcome:
        facts, errors = await self.read_gateway()
        return Outcome("done", reason="; ".join(errors), facts=tuple(facts))

    def watch_draining_nodes(
        self, on_notice: OnNotice | None = None, *, interval: float | None = None, read: ReadDraining | None = None
    ) -> DrainingNodes:
        """Start polling Ray's draining nodes (every ``interval``, by default the probe interval): each rollout
        engine process on one is noticed once -- ``engine.preempt_notice`` (by ``ray``), its deadline kept for its
        drain (:meth:`note_notice`), then ``on_notice(group, index, epoch, deadline_s)`` (the lifecycle's news)."""

        async def noticed(group: str, index: int, epoch: int | None, deadline_s: float) -> None:
            self.note_notice(instance_name(group, index), epoch, deadline_s)
            if on_notice is not None:
                await on_notice(group, index, epoch, deadline_s)

        every = float(interval or self.config.rollout_health_check_interval or 5.0)
        watcher = DrainingNodes(self.engines, self.log, noticed, interval=every, read=read or ray_draining)
        watcher.start()
        self.node_watch = watcher
        return watcher

    def note_notice(self, instance: str, epoch: int | None, deadline_s: float) -> None:
        """A preemption notice for this process of the slot: its drain ends before the deadline."""
        self.notices[instance] = (epoch, time.monotonic() + deadline_s)

    def check(self) -> None:
        """Raise the failure the run must stop for, if it has stopped (any part's: see ``Runner.check_failed``)."""
        self.runner.check_failed()

    def _explain(self, failed: Failure) -> None:
        """An engine or a router stopped the run: name it, where it was and the fix."""
        if failed.machine == "router":
            raise ControllerError(f"{failed}. Fix: {failed.fix}")
        if failed.machine == "engine":
            raise self.engine_failure(failed.instance)
        if failed.machine == "rollout" and failed.state == "StartingServers" and not failed.reason:
            raise self.start_failure(failed)  # the servers did not start: name the engines that did not

    def start_failure(self, failed: Failure) -> ControllerError:
        return start_failure(self, failed)

    def engine_failure(self, instance: str) -> EngineFailed:
        return engine_failure(self, instance)

    # -- keeping data in step with the core's moves ----------------------
    def _on_move(self, move: Move) -> None:
        """Death watchers and the monitor cover exactly the live engines (the engine spec's ``live`` tag)."""
        if move.machine != "engine":
            return
        core = self.runner.core
        if move.dst in core.marked and move.src not in core.marked:
            self.marked[move.instance] = move.src
        if move.trigger == "give_up":
            self.gave_up.add(move.instance)
        if move.trigger == "detach":
            self.external.detached(move)
        if move.src in core.live and move.dst not in core.live:
            self.deaths.unwatch(move.instance)  # marked, or a death we are about to cause (stop, recover): not news
            self.monitor.remove_engine(self._where(move.instance))

    # -- the handlers of the engines' effects ----------------------
    async def _launch(self, cmd: Command) -> Outcome:
        await self.routings[self._group(cmd)].open()  # a group's gateway starts with its first engine
        engine = self.slot(cmd)
        if cmd.group is not None and cmd.engine is not None:  # the core counted this launch: a new generation
            engine.epoch = self.runner.epoch(cmd.group, cmd.engine)
        if isinstance(engine.launcher, Keepable):
            engine.launcher.epoch = engine.epoch
        outcome = await engine.launch()
        if outcome.name == "ready" and engine.external:
            twin = self.external.twin(engine)
            if twin is not None:
                engine.identity, engine.reason = None, twin  # not attached: it identifies no slot
                return Outcome("start_failed", reason=twin)
        if outcome.name == "ready":
            await self._keep(engine)
            self._serve(engine)
        return outcome

    async def check_external(self) -> None:
        """External engines read again: one replaced behind its address is news (see :class:`ExternalEngines`)."""
        await self.external.check()

    def replaced_since(self, seen: dict[str, int]) -> list[str]:
        return self.external.replaced_since(seen)

    def _serve(self, engine: Engine) -> None:
        """A process of this slot runs: its death is news, and a monitor (where one exists) probes it."""
        self.deaths.watch(engine)
        if self.runner.core.monitoring(self.runner.state):  # a monitor exists: it watches this one too
            self._monitor_add(engine)

    async def _keep(self, engine: Engine) -> None:
        await self.kept.record(engine)

    async def _adopt(self, cmd: Command) -> Outcome:
        """A slot the ledger names: reach its process and read what it serves (the core decides from that)."""
        return await self.kept.adopt(self.slot(cmd), cmd.instance)

    async def _start_monitor(self, cmd: Command) -> None:
        """The monitor was created (its spec's guard: monitors_rollout): it watches every engine up now."""
        await self.monitor.start(cmd)
        for engine in [*self.engines, *self.evals]:
            if engine.client is not None:
                self._monitor_add(engine)

    async def _kill(self, cmd: Command) -> Outcome:
        engine = self.slot(cmd)
        self.deaths.unwatch(engine.id)
        outcome = await engine.kill()
        if outcome.name == "dead":
            self.kept.forget(engine)
        return outcome

    async def _load(self, cmd: Command) -> Outcome:
        """The engine loads the weights the core's command names (committed, or the trainer's new ones) from
        their checkpoint; a broadcast member's receive is another command (the weight-update group's)."""
        weights = self.runner.weights(cmd)
        if weights is None:
            return Outcome("refused", reason="no weights to load: the job committed none yet")
        engine = self.slot(cmd)
        self.transferring(engine, True)
        outcome = await engine.load(*weights)
        self.transferring(engine, outcome.name != "loaded")
        return outcome

    def transferring(self, engine: Engine, flag: bool) -> None:
        """A transfer to ``engine`` begins (True), or ended without a whole new version (still True): a kept process
        that was receiving weights when its driver died is reloaded, whatever version it reports."""
        self.kept.transferring(engine, flag)

    async def _route(self, cmd: Command) -> Outcome:
        routing = self.routings[self._group(cmd)]
        outcome = await routing.publish(self.slot(cmd))
        if outcome.name != "done":
            return outcome
        return outcome._replace(facts=(Fact.of(ROUTED, instance=cmd.instance, router=routing.name), *outcome.facts))

    async def _probe(self, cmd: Command) -> Outcome:
        timeout = float(self.config.rollout_health_check_timeout or 30.0)
        sent = time.monotonic()
        outcome = await self.slot(cmd).probe(timeout)
        ok = "ok" if outcome.name == "probe_ok" else "failed"
        probe = Fact.of(
            PROBE, instance=cmd.instance, by="command", outcome=ok, seconds=round(time.monotonic() - sent, 6)
        )
        return outcome._replace(facts=(probe,))

    async def _inject_ci_fault(self, cmd: Command) -> None:
        """--ci-test: the engine's server is SIGKILLed; its watcher reports the death, recovery follows."""
        await self.slot(cmd).launcher.kill()

    # -- death watchers and the monitor's membership ----------------------
    def _monitor_add(self, engine: Engine) -> None:
        probe = self.external.probe(engine) if engine.external else engine.probe
        self.monitor.add_engine(self._where(engine.id), probe, engine.epoch)

    async def engine_unhealthy(self, engine_id: str, reason: str, epoch: int | None = None) -> None:
        """A request to the engine failed (the rollout or eval function saw it): the core marks it -- unless
        ``epoch`` (the ``Engine.epoch`` the request was sent to) names a process that was replaced since."""
        group, i = self._where(engine_id)
        await self.runner.report(Outcome("request_failed", group, i, reason, epoch=epoch))

    # -- faults (the loop's --inject and the tests) -----------------------------------------------------------------
    async def kill_engine(self, index: int, *, wait: float = 15.0) -> str:
        """SIGKILL an engine's server (a real death) and wait (bounded) until the lifecycle saw it."""
        engine = self.engines[index]
        await engine.launcher.kill()
        deadline = time.monotonic() + wait
        while self.state_of(engine) in self.runner.core.live:
            if time.monotonic() > deadline:
                raise ControllerError(f"{engine.id}: death not detected within {wait:g}s")
            await asyncio.sleep(0.02)
        return self.state_of(engine)

    # -- disposal ----------------------
    async def close(self) -> None:
        """Best-effort cleanup whatever the states: stop probing and watching, kill processes, close clients."""
        await self.monitor.stop()
        if self.node_watch is not None:
            with contextlib.suppress(Exception):  # a watcher that failed must not keep the router and engines alive
                await self.node_watch.stop()
        watchers = self.deaths.stop()
        for engine in [*self.engines, *self.evals]:
            with contextlib.suppress(Exception):
                await engine.close()
        for routing in self.routings.values():
            with contextlib.suppress(Exception):
                await routing.close()
        tasks = [*watchers, *self.external.tasks(), *self.drains]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
