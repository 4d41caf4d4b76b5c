"""The job: how the five machines of an RL job move together (the product model).

Each machine's own moves come from its spec (``MachineSpec.compile(config).table``); this module
adds only what a single machine cannot know -- *couplings*: which job state allows an event
(an engine resumes only while the rollout manager generates), and which effect of one machine
fires an event of another (``start_monitor`` creates the monitor, ``recover_engine`` recovers
dead engines). The runtime controller (rollout/) and the explorer read the same couplings.

A product state is an immutable tuple; engines are a tuple of :class:`EngineView`. Ghost
variables -- an engine's process health, whether it holds the current weights, which memory
tags it has released, whether the engine lock is held -- exist so invariants can be stated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from lifecycle.config import LifecycleConfig
from lifecycle.machines import MACHINES
from lifecycle.spec import CompiledSpec, MachineSpec, Step

# Engine process health as the world knows it (the machines learn it only through events).
UP, DEAD, HUNG, DEAD_NOTIFIED, KILLING = "up", "dead", "hung", "dead-notified", "killing"

# Engine states, grouped by what the job may do with them.
LIVE = frozenset(
    {
        "PendingWeights",
        "LoadingWeights",
        "Serving",
        "Quiesced",
        "UpdatingWeights",
        "Offloaded",
        "WeightsOnly",
        "UpdatingWeightsKVReleased",
    }
)
OFFLOADED = frozenset({"Offloaded", "WeightsOnly", "UpdatingWeightsKVReleased"})
UPDATING_ROLLOUT = frozenset({"UpdatingWeights", "UpdatingWeightsKVReleased", "CatchingUp"})
UPDATING_ENGINE = frozenset({"LoadingWeights", "UpdatingWeights", "UpdatingWeightsKVReleased"})
BUSY_ROLLOUT = frozenset({"Generating", "Evaluating"})


class EngineView(NamedTuple):
    """One engine inside a product state: its machine state plus ghost facts."""

    state: str
    current: bool = False  # holds the committed weight version
    fresh: bool = False  # received the weight update now in flight
    proc: str = UP  # UP | DEAD | HUNG | DEAD_NOTIFIED | KILLING (we sent the kill)
    released: frozenset[str] = frozenset()  # memory tags released and not yet resumed


class Product(NamedTuple):
    """A product state of the whole job (hashable; engines sorted when used as a key)."""

    rollout: str
    trainer: str
    monitor: str
    fleet: str
    engines: tuple[EngineView, ...]
    lock: bool = False  # engine lock held
    pushed: bool = False  # the rollout side committed the trainer's update; the trainer has not acked
    dirty: bool = False  # a weight update failed and was not yet redone: engines disagree
    failed: str = ""  # non-empty: the run stopped fast with this reason
    faults: int = 0  # faults injected so far (the explorer bounds them)

    def key(self) -> Product:
        """The state as the explorer stores it: ghosts nothing can read any more are cleared,
        and identical engines, being interchangeable, are sorted (symmetry reduction)."""
        return self._replace(engines=tuple(sorted(_normal(e) for e in self.engines)))


# What the controller does to every engine as part of one rollout-manager operation:
# (before|after the manager's own move, engine trigger, engine states it applies to).
ENGINE_PLAN: dict[str, tuple[tuple[str, str, frozenset[str]], ...]] = {
    "servers_ready": (
        ("before", "begin_update", frozenset({"PendingWeights"})),
        ("before", "finish_update", frozenset({"LoadingWeights"})),
    ),
    "generate": (("after", "resume", frozenset({"Quiesced"})),),
    "eval": (("after", "resume", frozenset({"Quiesced"})),),
    "generate_done": (("before", "drain", frozenset({"Serving"})),),
    "eval_done": (("before", "drain", frozenset({"Serving"})),),
    "offload": (("after", "offload", frozenset({"Quiesced"})),),
    "onload_weights": (("after", "onload_weights", frozenset({"Offloaded"})),),
    "begin_update": (("after", "begin_update", frozenset({"Quiesced", "PendingWeights", "WeightsOnly"})),),
    "catch_up": (("after", "begin_update", frozenset({"PendingWeights"})),),
    "update_done": (("before", "finish_update", UPDATING_ENGINE),),
    "onload_kv": (("before", "onload_kv", frozenset({"WeightsOnly"})),),
    "update_failed": (("before", "abort_update", UPDATING_ENGINE),),
}

COMPOSITE_ENGINE_TRIGGERS = frozenset(t for plan in ENGINE_PLAN.values() for _, t, _ in plan)

# Environment events that always follow (a killed process exits; Ray reports a death).
WORLD_RESPONSES = frozenset({"env.exit", "env.ray_death"})


class Move(NamedTuple):
    """One fired machine event inside a product step."""

    machine: str
    instance: str
    trigger: str
    src: str
    dst: str
    effects: tuple[str, ...]


class Action(NamedTuple):
    """A product-level event: a controller decision or an environment fault."""

    name: str  # "rollout.generate", "engine.resume", "env.kill"
    engine: int | None = None
    env: bool = False  # fired by the world, not the controller

    @property
    def fault(self) -> bool:
        """A fault the world *may* inject (bounded by the explorer), not a response it always gives."""
        return self.env and self.name not in WORLD_RESPONSES

    def label(self) -> str:
        who = f"engine-{self.engine}" if self.engine is not None else self.name.split(".")[0]
        what = self.name.split(".", 1)[1]
        if self.name.startswith("env."):
            return {
                "kill": f"{who} process dies (SIGKILL)",
                "hang": f"{who} hangs (probes and requests stall)",
                "http_death": f"{who} HTTP server dies, actor alive",
                "ray_death": f"Ray reports {who} dead",
                "stale_probe": f"a stale failed probe of {who} returns",
                "give_up": f"{who} restart budget is spent",
                "exit": f"{who} process exits after the kill",
                "stop_cell": f"an operator stops {who}",
                "worker_crash": "a trainer worker crashes",
                "servers_failed": "rollout servers fail to start",
                "update_failed": "the weight update fails",
                "eval_unhealthy": "an eval engine is unhealthy",
                "version_mismatch": "eval engines load different versions",
            }.get(what, f"{who} {what}")
        return f"{who}.{what}"


class Transition(NamedTuple):
    """The result of one product step: the action, every machine move it caused, the next state."""

    action: Action
    moves: tuple[Move, ...]
    state: Product


# Spec names as the job calls its parts (the eval fleet's spec is "eval_fleet", its field "fleet").
PARTS = {"rollout": "rollout", "trainer": "trainer", "monitor": "monitor", "fleet": "eval_fleet", "engine": "engine"}


@dataclass
class Job:
    """The compiled machines of one config; ``initial()`` and ``successors()`` define the product.

    ``machines`` replaces specs by name (the mutation harness passes broken copies).
    """

    config: LifecycleConfig
    engines: int = 2
    machines: Mapping[str, MachineSpec] | None = None
    max_faults: int = 2

    def __post_init__(self) -> None:
        specs = {**MACHINES, **(self.machines or {})}
        self.c: dict[str, CompiledSpec] = {part: specs[name].compile(self.config) for part, name in PARTS.items()}
        self.p: dict[str, bool] = dict(self.c["engine"].values)

    def initial(self) -> Product:
        return Product("Init", "Init", "Init", "Init", tuple(EngineView("Init") for _ in range(self.engines)))

    def terminal(self, s: Product) -> bool:
        """The run is over: it failed fast (an error names who), or it was disposed."""
        return bool(s.failed) or s.rollout == "Disposed"

    def snapshot_ready(self, s: Product) -> bool:
        """``get_updatable_engines_and_lock`` may proceed: every engine still in play is quiesced.

        Recovered engines in PendingWeights belong to the snapshot: it is how they get weights.
        Engines still Starting/Unhealthy/Recovering make it wait (bounded, at runtime).
        """
        want = {"Quiesced", "PendingWeights"} if s.rollout == "Ready" else {"WeightsOnly", "PendingWeights", "Quiesced"}
        gone = {"Failed", "Disposed", "Stopped", "Init"}
        return all(e.state in want or e.state in gone for e in s.engines)

    def successors(self, s: Product) -> Iterator[Transition]:
        """Every product step from ``s``; at most ``max_faults`` faults per run are injected."""
        if self.terminal(s):
            return
        budget = s.faults < self.max_faults
        for t in self._all(s):
            if t.action.fault:
                if not budget:
                    continue
                t = Transition(t.action, t.moves, t.state._replace(faults=s.faults + 1))
            yield t

    def _all(self, s: Product) -> Iterator[Transition]:
        yield from self._rollout_actions(s)
        yield from self._trainer_actions(s)
        yield from self._monitor_actions(s)
        yield from self._fleet_actions(s)
        for i in range(len(s.engines)):
            yield from self._engine_actions(s, i)

    # -- firing: one spec step, then its cross-machine effects ---------------------------------
    def fire(self, s: Product, part: str, trigger: str, engine: int | None = None) -> tuple[Product, list[Move]]:
        moves: list[Move] = []
        return self._apply(s, part, trigger, engine, moves), moves

    def _apply(self, s: Product, part: str, trigger: str, engine: int | None, moves: list[Move]) -> Product:
        src = s.engines[engine].state if engine is not None else getattr(s, part)
        out = self.c[part].table.get((src, trigger))
        if not isinstance(out, Step):
            return s
        instance = f"engine-{engine}" if engine is not None else PARTS[part]
        moves.append(Move(PARTS[part], instance, trigger, src, out.dest, out.effects))
        s = self._engine_ghosts(s, engine, out) if engine is not None else s._replace(**{part: out.dest})  # type: ignore[arg-type]
        for effect in out.effects:
            s = self._couple(s, part, effect, engine, moves)
        return s

    def _engine_ghosts(self, s: Product, i: int, step: Step) -> Product:
        e = s.engines[i]
        released = set(e.released)
        current, fresh, proc = e.current, e.fresh, e.proc
        for effect in step.effects:
            if effect == "launch_engine":
                current, fresh, proc, released = False, False, UP, set()
            elif effect == "kill_engine" and proc not in (DEAD_NOTIFIED,):
                proc = KILLING
            elif effect == "release_weights":
                released.add("weights")
            elif effect == "release_kv_cache":
                released.add("kv_cache")
            elif effect == "resume_weights":
                released.discard("weights")
            elif effect == "resume_kv_cache":
                released.discard("kv_cache")
        if step.transition.trigger == "finish_update":
            fresh = True
        return _set_engine(s, i, EngineView(step.dest, current, fresh, proc, frozenset(released)))

    def _couple(self, s: Product, part: str, effect: str, engine: int | None, moves: list[Move]) -> Product:
        """Cross-machine effects: the one place where one machine's effect drives another."""
        if effect == "report_failure":
            who = f"engine-{engine}" if engine is not None else PARTS[part]
            return s._replace(failed=f"{who} failed")
        if part == "rollout":
            if effect == "start_servers":
                for i in range(len(s.engines)):
                    s = self._apply(s, "engine", "start", i, moves)
            elif effect == "start_monitor":
                s = self._apply(s, "monitor", "create", None, moves)
            elif effect == "start_eval_fleet":
                s = self._apply(s, "fleet", "create", None, moves)
            elif effect == "resume_monitor":
                s = self._apply(s, "monitor", "resume", None, moves)
            elif effect == "pause_monitor":
                s = self._apply(s, "monitor", "pause", None, moves)
            elif effect == "stop_monitor":
                s = self._apply(s, "monitor", "stop", None, moves)
            elif effect == "acquire_engine_lock":
                s = s._replace(lock=True, engines=tuple(e._replace(fresh=False) for e in s.engines))
            elif effect == "release_engine_lock":
                s = s._replace(lock=False)
        elif part == "trainer" and effect == "recover_engine":
            for i, e in enumerate(s.engines):
                if e.state == "Unhealthy":
                    s = self._apply(s, "engine", "recover", i, moves)
        return s

    def _go(
        self, s: Product, action: Action, part: str, trigger: str, engine: int | None = None
    ) -> Iterator[Transition]:
        nxt, moves = self.fire(s, part, trigger, engine)
        if moves:
            yield Transition(action, tuple(moves), nxt)

    # -- the controller's decisions ---------------------------------------------------------------
    def _rollout_actions(self, s: Product) -> Iterator[Transition]:
        r = s.rollout
        engines = s.engines
        trainer_idle = s.trainer in ("Init", "Allocated", "Initialized", "Ready", "Offloaded", "Failed")
        for trig in self.c["rollout"].enabled[r]:
            if trig in ("servers_failed", "update_failed", "dispose"):
                continue  # faults below; disposal ends a run and is exercised by the runtime tests
            if trig == "servers_ready" and not all(e.state == "PendingWeights" and e.proc == UP for e in engines):
                continue  # every engine up and answering; a faulty one is first detected and handled
            if trig in ("generate", "eval") and r == "Ready":
                if not trainer_idle or s.dirty or s.pushed:
                    continue
                if self.p["starts_servers"] and not any(e.state == "Quiesced" for e in engines):
                    continue
            if trig == "eval_done" and s.fleet not in ("Init", "Idle"):
                continue
            if trig == "offload" and s.trainer != "Ready":
                continue
            if trig == "onload_weights" and s.trainer == "Training":
                continue
            if trig == "begin_update" and not (
                s.trainer == "UpdatingWeights" and not s.pushed and self.snapshot_ready(s)
            ):
                continue
            if trig == "update_done" and any(e.state in UPDATING_ENGINE and e.proc != UP for e in engines):
                continue  # a faulty engine's update call hangs or fails: detection comes first
            if trig == "onload_kv" and s.trainer == "UpdatingWeights":
                continue
            if trig == "catch_up" and (
                s.trainer == "UpdatingWeights"
                or s.dirty
                or s.pushed
                or not any(e.state == "PendingWeights" for e in engines)
            ):
                continue
            yield from self._composite(s, trig)
        if r == "StartingServers":
            yield from self._go(s, Action("env.servers_failed", env=True), "rollout", "servers_failed")
        if r in UPDATING_ROLLOUT:
            for t in self._composite(s, "update_failed"):
                # engines that took the new weights are now ahead of the committed version
                # (a failed catch-up pushed nothing new: restarted engines fall back to PendingWeights)
                nxt = t.state._replace(
                    dirty=s.dirty or r != "CatchingUp",
                    engines=tuple(e._replace(current=e.current and not e.fresh, fresh=False) for e in t.state.engines),
                )
                yield Transition(Action("env.update_failed", env=True), t.moves, nxt)

    def _composite(self, s: Product, trig: str) -> Iterator[Transition]:
        """A rollout-manager operation together with the engine moves it performs (ENGINE_PLAN)."""
        moves: list[Move] = []
        plan = ENGINE_PLAN.get(trig, ())
        for when, engine_trig, states in plan:
            if when == "before":
                for i in range(len(s.engines)):
                    if s.engines[i].state in states:
                        s = self._apply(s, "engine", engine_trig, i, moves)
        n = len(moves)
        s = self._apply(s, "rollout", trig, None, moves)
        if len(moves) == n:
            return
        for when, engine_trig, states in plan:
            if when == "after":
                for i in range(len(s.engines)):
                    if s.engines[i].state in states:
                        s = self._apply(s, "engine", engine_trig, i, moves)
        catching_up = any(m.machine == "rollout" and m.src == "CatchingUp" for m in moves)
        if catching_up:  # restarted engines now hold the committed version; nothing new was pushed
            s = s._replace(engines=tuple(e._replace(current=e.current or e.fresh, fresh=False) for e in s.engines))
        elif trig in ("servers_ready", "update_done"):  # commit: what was pushed is now the served version
            s = s._replace(engines=tuple(e._replace(current=e.fresh, fresh=False) for e in s.engines))
            if trig == "update_done":
                s = s._replace(pushed=True, dirty=False)
        yield Transition(Action(f"rollout.{trig}"), tuple(moves), s)

    def _trainer_actions(self, s: Product) -> Iterator[Transition]:
        if not self.p["trains"]:
            return
        t = s.trainer
        for trig in self.c["trainer"].enabled[t]:
            if trig in ("worker_crashed", "dispose"):
                continue
            if trig == "train" and (
                s.rollout in BUSY_ROLLOUT or s.rollout in ("Init", "Constructed", "StartingServers") or s.pushed
            ):
                continue
            if trig == "update_done" and not s.pushed:
                continue
            if trig == "update_weights" and s.rollout not in ("Ready", "WeightsOnly"):
                continue
            if trig == "offload" and (s.rollout in OFFLOADED or s.rollout in BUSY_ROLLOUT):
                continue
            nxt, moves = self.fire(s, "trainer", trig)
            if trig == "update_done":
                nxt = nxt._replace(pushed=False)
            if moves:
                yield Transition(Action(f"trainer.{trig}"), tuple(moves), nxt)
        if t in ("Training", "UpdatingWeights", "Saving"):
            yield from self._go(s, Action("env.worker_crash", env=True), "trainer", "worker_crashed")

    def _monitor_actions(self, s: Product) -> Iterator[Transition]:
        m = s.monitor
        if m == "Running":
            yield from self._go(s, Action("monitor.probe"), "monitor", "probe")
        if m not in ("Running", "Paused"):
            return
        for i, e in enumerate(s.engines):
            if e.state not in LIVE:
                continue
            if m == "Running" and e.proc in (DEAD, HUNG):
                yield from self._about(s, Action("monitor.threshold_reached", engine=i), "threshold_reached", i)
            if m == "Paused" and e.proc == UP:
                # a probe sent before the pause fails late (the engine was busy offloading/updating)
                yield from self._about(s, Action("env.stale_probe", engine=i, env=True), "threshold_reached", i)

    def _about(
        self, s: Product, action: Action, trigger: str, i: int, base: Product | None = None
    ) -> Iterator[Transition]:
        """A monitor event about engine ``i``: its ``mark_engine_unhealthy`` marks that engine."""
        moves: list[Move] = []
        nxt = self._apply(base or s, "monitor", trigger, None, moves)
        if moves and "mark_engine_unhealthy" in moves[-1].effects:
            nxt = self._apply(nxt, "engine", "mark_unhealthy", i, moves)
        if moves:
            yield Transition(action, tuple(moves), nxt)

    def _fleet_actions(self, s: Product) -> Iterator[Transition]:
        f = s.fleet
        for trig in self.c["fleet"].enabled[f]:
            if trig in ("unhealthy", "version_mismatch", "dispose", "create"):
                continue
            if trig == "pin" and s.rollout != "Evaluating":
                continue
            yield from self._go(s, Action(f"eval_fleet.{trig}"), "fleet", trig)
        if f in ("Probing", "Restarting", "WaitingAlive"):
            yield from self._go(s, Action("env.eval_unhealthy", env=True), "fleet", "unhealthy")
        if f == "LoadingSnapshot":
            yield from self._go(s, Action("env.version_mismatch", env=True), "fleet", "version_mismatch")

    def _engine_actions(self, s: Product, i: int) -> Iterator[Transition]:
        e = s.engines[i]
        st = e.state
        for trig in self.c["engine"].enabled[st]:
            if trig in ("mark_unhealthy", "dispose", "give_up", "start_failed"):
                continue  # driven by couplings and faults
            if trig in ("stop", "start") and not (s.rollout == "Ready" and s.trainer != "UpdatingWeights"):
                continue  # single engines (a "cell") are stopped/started between steps
            if trig == "start" and st == "Init":
                continue  # first start comes from start_servers
            if trig == "confirm_dead" and e.proc != DEAD_NOTIFIED:
                continue
            if trig in COMPOSITE_ENGINE_TRIGGERS:
                continue  # done by the rollout manager's operations (ENGINE_PLAN)
            if trig == "ready" and e.proc != UP:
                continue
            if trig in ("recover", "restart") and s.rollout in UPDATING_ROLLOUT:
                continue
            # stopping a cell is an operator's request: bounded like a fault
            action = Action("env.stop_cell" if trig == "stop" else f"engine.{trig}", engine=i, env=trig == "stop")
            yield from self._go(s, action, "engine", trig, i)
        if st == "Recovering":
            yield from self._go(s, Action("env.give_up", engine=i, env=True), "engine", "give_up", i)
        if e.proc == UP and (st in LIVE or st == "Starting"):
            # SIGKILL (Ray sees the death) vs a hang or an HTTP-server death with a live actor
            # (only probes and failing requests can tell): the two detection paths.
            for fault, proc in (("kill", DEAD), ("hang", HUNG), ("http_death", HUNG)):
                yield Transition(
                    Action(f"env.{fault}", engine=i, env=True), (), _set_engine(s, i, e._replace(proc=proc))
                )
        if e.proc == DEAD:
            yield from self._death_notice(s, i)
        if e.proc == KILLING:  # the process exits after our kill; Ray reports it
            yield Transition(
                Action("env.exit", engine=i, env=True), (), _set_engine(s, i, e._replace(proc=DEAD_NOTIFIED))
            )
        if e.proc in (HUNG, DEAD) and st == "Starting":  # the bounded start-up health wait times out
            yield from self._go(s, Action("engine.start_failed", engine=i), "engine", "start_failed", i)
        # a request to a faulty engine times out or fails, and the controller marks it (bounded
        # waits); while the monitor runs during generate/eval, its probes detect it instead
        if (
            e.proc in (DEAD, HUNG)
            and st in LIVE
            and (
                s.rollout in UPDATING_ROLLOUT
                or s.rollout == "StartingServers"
                or (s.rollout in BUSY_ROLLOUT and s.monitor != "Running")
            )
        ):
            yield from self._go(s, Action("rollout.request_failed", engine=i), "engine", "mark_unhealthy", i)

    def _death_notice(self, s: Product, i: int) -> Iterator[Transition]:
        """Ray reports the actor/process death at once: to the monitor if one exists, else the controller."""
        e = s.engines[i]
        base = _set_engine(s, i, e._replace(proc=DEAD_NOTIFIED))
        action = Action("env.ray_death", engine=i, env=True)
        if e.state == "Starting":
            yield from self._go(base, action, "engine", "start_failed", i)
        elif e.state not in LIVE:
            yield Transition(action, (), base)
        elif s.monitor in ("Running", "Paused"):
            yield from self._about(s, action, "engine_died", i, base=base)
        else:
            yield from self._go(base, action, "engine", "mark_unhealthy", i)


def _normal(e: EngineView) -> EngineView:
    """Weight and memory ghosts matter only for live engines; a finished engine's process not at all."""
    if e.state in LIVE:
        return e
    proc = DEAD_NOTIFIED if e.state in ("Failed", "Disposed") else e.proc
    return EngineView(e.state, False, False, proc, frozenset())


def _set_engine(s: Product, i: int, e: EngineView) -> Product:
    return s._replace(engines=(*s.engines[:i], e, *s.engines[i + 1 :]))
