"""Model-based test: the real rollout manager and trainer group against the product model.

A hypothesis ``RuleBasedStateMachine`` drives a real :class:`RolloutManager` (real CPU engine
processes over HTTP on 127.0.0.1) and a real :class:`TrainerGroup` (Ray actors) through the loop's
actions -- generate, offload, train, onload weights, update weights, onload KV, SIGKILL an engine,
crash a trainer worker -- and applies the same action to the product model (``lifecycle.job.Job``):
every model step must be one ``Job.successors`` offers (the runtime never does what the model
forbids). After every action it compares

* the machine moves: the runtime's event log of the action and the model's moves, as multisets
  (machine, instance, trigger, src, dst, effects; the monitor's own probe moves excluded);
* the states of every machine (rollout, trainer, monitor, each engine) and the engine lock;
* the engines' memory residency and weight version as the *engines themselves* report them
  (``/server_info``) with the model's ghosts;

and checks ``lifecycle.invariants`` on the observed state (state invariants, from the real
engines' answers) and on every runtime move (step invariants, against the state the event log
had reached), also in the middle of generation (a spy inside the rollout function).

Engines and trainer workers cost seconds to start, so one *world* (manager + trainer + the model's
state) is built per config and carried across hypothesis examples: an example continues where the
previous one stopped, and a world is rebuilt only after the run stopped (a fault without FT) or a
check failed. Because the world persists, a failing sequence cannot be replayed from scratch:
shrinking is off and the failure report prints the steps as run.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from lifecycle.config import LifecycleConfig
from lifecycle.events import TRANSITION, EventLog, MemorySink
from lifecycle.invariants import check_state, check_step
from lifecycle.job import DEAD, DEAD_NOTIFIED, LIVE, UP, Action, EngineView, Job, Move, Product, Transition
from lifecycle.ledger import EffectLedger

pytest.importorskip("ray")
pytest.importorskip("torch")

from engines.engine import EngineFailed
from engines.launcher import launcher_factory
from rollout.controller import InferenceController
from rollout.executor import RolloutManager
from rollout.task import PatternTask
from trainer.group import TrainerFailed, TrainerGroup
from trainer.workers import WorkerCrashed

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

T = TypeVar("T")

# probes fast enough to run during a generate, slow enough never to time out on a busy 2-core box
COMMON: dict[str, Any] = {
    "rollout_health_check_interval": 5.0,
    "rollout_health_check_timeout": 5.0,
    "rollout_health_check_first_wait": 0.0,
    "engine_restart_backoff": 0.05,
    # the world persists across examples, so kills add up; running out of restarts is the model's
    # environment move env.give_up, which this test does not choose: the budget must never run out here
    "engine_max_restarts": 10_000,
}
MONITOR_NOISE = frozenset({"probe", "probe_failed"})  # the monitor's own rounds: the model takes them separately


@dataclass(frozen=True)
class Case:
    name: str
    flags: dict[str, Any]
    engines: int
    workers: int = 1

    def config(self) -> LifecycleConfig:
        return LifecycleConfig.from_mapping({**COMMON, **self.flags, "rollout_num_gpus": self.engines})


CASES = (
    Case("no-ft", {}, engines=1),
    Case("train-ft-offload", {"use_fault_tolerance": True, "ft_components": ["train"], "offload_rollout": True}, 1),
    Case("rollout-ft", {"use_fault_tolerance": True, "ft_components": ["rollout"]}, engines=2),
    Case(
        "both-ft-offload",
        {"use_fault_tolerance": True, "ft_components": ["train", "rollout"], "offload_rollout": True},
        engines=2,
    ),
)
CASE = {c.name: c for c in CASES}


class Divergence(AssertionError):
    """The runtime and the product model disagree (or the runtime broke an invariant)."""


def _norm_instance(machine: str, instance: str) -> str:
    return "monitor" if machine == "monitor" else instance


class World:
    """One real job and the model's prediction of it, moved in lockstep one loop action at a time."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.config = case.config()
        self.job = Job(self.config, engines=case.engines, max_faults=10**6)
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory(prefix=f"loop-model-{case.name}-")
        self.sink = MemorySink()
        self.log = EventLog([self.sink])
        self.ledger = EffectLedger()
        task = PatternTask(prompts_per_step=2, group_size=2, response_len=4, seed=0)
        self.trainer = TrainerGroup(self.config, self.tmp.name, workers=case.workers, log=self.log, ledger=self.ledger)
        self.manager = RolloutManager(
            self.config, task, launcher_factory=launcher_factory("local"), log=self.log, ledger=self.ledger
        )
        self.model = self.job.initial()
        self.failed = ""  # why the runtime stopped (an engine or the trainer failed)
        self.stop_checked = False
        self.poisoned = False
        self.samples: list[dict[str, Any]] | None = None
        self.trained = False
        self.crashed: int | None = None
        self.rollout_id = 0
        self.actions = 0
        self.mid_problems: list[str] = []
        self.history: list[str] = []

    # -- running ----------------------------------------------------------------------------------
    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)  # type: ignore[arg-type]

    def build(self) -> None:
        async def start() -> None:
            weights = await self.trainer.start()
            await self.manager.init(weights)

        plan = ["trainer.allocate", "trainer.initialize", "trainer.ready", "rollout.init", "rollout.start_servers"]
        plan += [("engine.ready", i) for i in range(self.case.engines)]  # type: ignore[misc]
        plan += ["rollout.servers_ready"]
        self.act("build", start(), plan)
        self._spy()

    def _spy(self) -> None:
        """Check the observed state *during* generation too: only Serving engines route, with current weights."""
        executor = self.manager.executor
        inner = executor.rollout_fn
        assert inner is not None

        async def spied(rollout_id: int, controller: InferenceController) -> list[dict[str, Any]]:
            seen = await self.observe()
            self.mid_problems += [f"{name}: {p}" for name, p in check_state(self.job, seen)]
            committed = controller.weights[1] if controller.weights else None
            for e in controller.routable():
                assert e.client is not None
                info = await e.client.server_info()
                if info.weight_version != committed:
                    self.mid_problems.append(f"{e.id} routable with version {info.weight_version}, not {committed}")
            return await inner(rollout_id, controller)

        executor.rollout_fn = spied

    def close(self) -> None:
        async def stop() -> None:
            with contextlib.suppress(Exception):
                await self.manager.dispose()
            with contextlib.suppress(Exception):
                await self.trainer.dispose()

        with contextlib.suppress(Exception):
            self.run(stop())
        pending = asyncio.all_tasks(self.loop)  # e.g. a paused monitor's round sleeping out its period
        for task in pending:
            task.cancel()
        with contextlib.suppress(Exception):
            self.run(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()
        self.tmp.cleanup()

    @property
    def terminal(self) -> bool:
        return bool(self.model.failed)

    # -- the model side -------------------------------------------------------------------------------
    def take(self, s: Product, name: str, engine: int | None, out: list[Transition]) -> Product:
        """Take the model step ``name`` -- it must be one the model offers in ``s``."""
        for t in self.job.successors(s):
            if t.action.name == name and t.action.engine == engine:
                out.append(t)
                return t.state
        offered = sorted(
            {f"{t.action.name}{'' if t.action.engine is None else t.action.engine}" for t in self.job.successors(s)}
        )
        self.poisoned = True
        raise Divergence(f"the model does not allow {name} (engine {engine}) in {s}; it offers {offered}")

    # -- observing the runtime ---------------------------------------------------------------------------
    async def observe(self) -> Product:
        """The product state as the runtime machines and the engines themselves report it."""
        c = self.manager.controller
        committed = c.weights[1] if c.weights else None
        views = []
        for e in c.engines:
            proc = UP if e.launcher.alive() else DEAD_NOTIFIED
            released: frozenset[str] = frozenset()
            current = False
            if e.state in LIVE and proc == UP and e.client is not None:
                info = await e.client.server_info()
                mem = info.engine_memory()
                assert mem is not None
                released = frozenset(
                    tag
                    for tag, resident in (("weights", mem.weights_resident), ("kv_cache", mem.kv_cache_resident))
                    if not resident
                )
                current = info.weight_version == committed
            views.append(EngineView(e.state, current, False, proc, released))
        monitor = c.monitor.state if c.monitor is not None else "Init"
        fleet = getattr(c, "fleet", None)
        return Product(
            rollout=self.manager.state,
            trainer=self.trainer.state,
            monitor=monitor,
            fleet=fleet.state if fleet is not None and hasattr(fleet, "state") else "Init",
            engines=tuple(views),
            lock=c.lock.locked(),
            failed=self.failed or (str(c.failures[0]) if c.failures else ""),  # the run stops at the next check()
        )

    def moves(self, start: int) -> list[Move]:
        out = []
        for ev in self.sink[start:]:
            if ev.get("event") != TRANSITION or ev["machine"] not in ("rollout", "trainer", "monitor", "engine"):
                continue
            if ev["machine"] == "engine" and not str(ev["instance"]).startswith("engine-"):
                continue  # eval-fleet engines are not part of this model
            machine = ev["machine"]
            out.append(
                Move(
                    machine,
                    _norm_instance(machine, ev["instance"]),
                    ev["trigger"],
                    ev["src"],
                    ev["dst"],
                    tuple(ev.get("effects") or ()),
                )
            )
        return out

    def replay_steps(self, before: Product, moves: list[Move], action: Action) -> list[str]:
        """Step invariants on every runtime move, against the state the event log had reached."""
        problems = []
        s = before
        for m in moves:
            nxt = _apply_move(s, m)
            problems += [
                f"{name}: {p} (at {m.instance}.{m.trigger})"
                for name, p in check_step(self.job, Transition(action, (m,), nxt), s, with_state=False)
            ]
            s = nxt
        return problems

    # -- one loop action, on both sides, then the comparison --------------------------------------------------
    def act(
        self,
        label: str,
        work: Awaitable[Any],
        plan: list[Any] | Callable[[Product], list[Any]],
        *,
        killed: int | None = None,
        expect: type[BaseException] | tuple[type[BaseException], ...] = (),
    ) -> Any:
        self.history.append(label)
        self.actions += 1
        STATS[self.case.name][label.split("(")[0]] += 1
        # the model first: the action's model steps, each one the model must offer
        model_steps: list[Transition] = []
        s = self.model
        if callable(plan):
            plan = plan(s)
        for item in plan:
            name, engine = (item, None) if isinstance(item, str) else item
            s = self.take(s, name, engine, model_steps)
        # then the runtime
        before = self.run(self.observe())
        if len(before.engines) < self.case.engines:  # servers not started yet: slots in Init, as the model has them
            before = before._replace(engines=self.model.engines)
        if killed is not None:
            e = before.engines[killed]
            before = before._replace(
                engines=(*before.engines[:killed], e._replace(proc=DEAD), *before.engines[killed + 1 :])
            )
        start = len(self.sink)
        result: Any = None
        raised: BaseException | None = None
        try:
            result = self.run(work)
        except BaseException as exc:
            raised = exc
        self.model = s
        if raised is not None and not (expect and isinstance(raised, expect)):
            self.poisoned = True
            raise Divergence(f"{label}: the runtime raised {raised!r}; the model predicted {s}") from raised
        if expect and raised is None and self.terminal:
            self.poisoned = True
            raise Divergence(f"{label}: the model stopped the run ({s.failed}) but the runtime went on")
        if raised is not None:
            self.failed = str(raised)
        self.compare(label, start, model_steps, before, Action(label))
        return result

    def compare(self, label: str, start: int, model_steps: list[Transition], before: Product, action: Action) -> None:
        got_moves = [m for m in self.moves(start) if not (m.machine == "monitor" and m.trigger in MONITOR_NOISE)]
        want_moves = [m for t in model_steps for m in t.moves]
        problems = []
        if Counter(got_moves) != Counter(want_moves):
            extra = Counter(got_moves) - Counter(want_moves)
            missing = Counter(want_moves) - Counter(got_moves)
            problems.append(f"moves differ: runtime only {sorted(extra)}, model only {sorted(missing)}")
        seen = self.run(self.observe())
        want = self.model
        for part in ("rollout", "trainer", "monitor"):
            if getattr(seen, part) != getattr(want, part):
                problems.append(f"{part}: runtime {getattr(seen, part)}, model {getattr(want, part)}")
        if [e.state for e in seen.engines] != [e.state for e in want.engines]:
            problems.append(
                f"engines: runtime {[e.state for e in seen.engines]}, model {[e.state for e in want.engines]}"
            )
        if seen.lock != want.lock:
            problems.append(f"engine lock: runtime {seen.lock}, model {want.lock}")
        for i, (a, b) in enumerate(zip(seen.engines, want.engines, strict=False)):
            if a.state in LIVE and b.state in LIVE and a.proc == UP:
                if a.released != b.released:
                    problems.append(
                        f"engine-{i} released memory: engine says {sorted(a.released)}, model {sorted(b.released)}"
                    )
                if a.current != b.current and b.state not in ("PendingWeights", "LoadingWeights"):
                    problems.append(
                        f"engine-{i} holds the committed version: engine says {a.current}, model {b.current}"
                    )
        if bool(seen.failed) != bool(want.failed):
            problems.append(f"run stopped: runtime {seen.failed!r}, model {want.failed!r}")
        problems += [f"{name}: {p}" for name, p in check_state(self.job, seen)]
        problems += self.replay_steps(before, got_moves, action)
        problems += [f"during generate: {p}" for p in self.mid_problems]
        self.mid_problems.clear()
        if problems:
            self.poisoned = True
            raise Divergence(
                f"[{self.case.name}] after {label} (actions so far: {' -> '.join(self.history[-12:])}):\n  "
                + "\n  ".join(problems)
            )


def _apply_move(s: Product, m: Move) -> Product:
    """What one runtime move does to the product state (machine states and the ghosts the step invariants read)."""
    if m.machine == "engine":
        i = int(m.instance.rsplit("-", 1)[1])
        e = s.engines[i]
        released, proc = set(e.released), e.proc
        for effect in m.effects:
            if effect == "launch_engine":
                released, proc = set(), UP
            elif effect in ("release_weights", "release_kv_cache"):
                released.add(effect.removeprefix("release_"))
            elif effect == "resume_weights":
                released.discard("weights")
            elif effect == "resume_kv_cache":
                released.discard("kv_cache")
        view = e._replace(state=m.dst, released=frozenset(released), proc=proc)
        return s._replace(engines=(*s.engines[:i], view, *s.engines[i + 1 :]))
    if m.machine == "rollout":
        lock = s.lock or "acquire_engine_lock" in m.effects
        lock = lock and "release_engine_lock" not in m.effects
        return s._replace(rollout=m.dst, lock=lock)
    if m.machine == "monitor":
        return s._replace(monitor=m.dst)
    if m.machine == "trainer":
        return s._replace(trainer=m.dst)
    return s


# -- the worlds: one per config, reused across examples -----------------------------------------------------
WORLDS: dict[str, World] = {}
STATS: dict[str, Counter[str]] = {c.name: Counter() for c in CASES}  # actions per config, over every world


def world(case: Case) -> World:
    w = WORLDS.get(case.name)
    if w is not None and (w.poisoned or w.terminal):
        w.close()
        w = None
    if w is None:
        w = World(case)
        WORLDS[case.name] = w
        w.build()
    return w


@pytest.fixture(scope="module", autouse=True)
def _close_worlds() -> Iterator[None]:
    yield
    for w in WORLDS.values():
        w.close()
    WORLDS.clear()


# -- the loop's actions as rules -------------------------------------------------------------------------------
def loop_machine(case: Case) -> type[RuleBasedStateMachine]:
    class LoopModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.w = world(case)

        def _m(self) -> Product:
            return self.w.model

        def _live(self) -> bool:
            return not self.w.terminal and not self.w.poisoned

        # the step, in miles' order: generate -> [offload] -> train -> [onload weights] -> update -> [onload KV]
        @precondition(lambda self: self._live() and self.w.samples is None and self._m().rollout == "Ready")
        @rule()
        def generate(self) -> None:
            w = self.w

            def plan(s: Product) -> list[Any]:
                steps: list[Any] = []
                if any(e.state == "PendingWeights" for e in s.engines):
                    steps += ["rollout.catch_up", "rollout.update_done"]
                return [*steps, "rollout.generate", "rollout.generate_done"]

            w.samples = w.act("generate", w.manager.generate(w.rollout_id), plan)
            assert w.samples and len(w.samples) == 4, w.samples
            w.rollout_id += 1

        @precondition(
            lambda self: (
                self._live() and self.w.samples is not None and not self.w.trained and self._m().rollout == "Ready"
            )
        )
        @rule()
        def offload(self) -> None:
            plan = ["rollout.offload"] if self.w.job.p["offloads_rollout"] else []
            self.w.act("offload", self.w.manager.offload(), plan)

        @precondition(lambda self: self._live() and self.w.samples is not None and not self.w.trained)
        @rule()
        def train(self) -> None:
            w = self.w
            assert w.samples is not None
            if w.crashed is None:
                plan = ["trainer.train", "trainer.train_done"]
            elif w.job.p["heals_trainer"]:
                plan = [
                    "trainer.train",
                    "env.worker_crash",
                    "trainer.heal",
                    "trainer.healed",
                    "trainer.train",
                    "trainer.train_done",
                ]
            else:
                plan = ["trainer.train", "env.worker_crash", "trainer.fail"]
            w.act("train", w.trainer.train(w.samples), plan, expect=TrainerFailed if w.crashed is not None else ())
            if w.crashed is not None and w.terminal:
                assert "--ft-components train" in w.failed and "crashed" in w.failed, w.failed
                w.stop_checked = True
            w.crashed = None
            w.trained = True

        @precondition(lambda self: self._live() and self.w.trained and self._m().rollout == "Offloaded")
        @rule()
        def onload_weights(self) -> None:
            self.w.act("onload_weights", self.w.manager.onload_weights(), ["rollout.onload_weights"])

        @precondition(lambda self: self._live() and self.w.trained and self._m().rollout in ("Ready", "WeightsOnly"))
        @rule()
        def update_weights(self) -> None:
            w = self.w

            def after_recovery(s: Product) -> list[Any]:
                recovering = (
                    [i for i, e in enumerate(s.engines) if e.state == "Unhealthy"]
                    if w.job.p["trainer_recovers_rollout"]
                    else []
                )
                steps: list[Any] = ["trainer.update_weights"]
                steps += [(t, i) for i in recovering for t in ("engine.restart", "engine.ready")]
                if w.crashed is not None and not w.job.p["heals_trainer"]:
                    return [*steps, "env.worker_crash", "trainer.fail"]
                if w.crashed is not None:  # healed, then the move is redone
                    steps += ["env.worker_crash", "trainer.heal", "trainer.healed", "trainer.update_weights"]
                return [*steps, "rollout.begin_update", "rollout.update_done", "trainer.update_done"]

            sink = w.manager.controller if w.manager.controller.engines else None
            expect = TrainerFailed if w.crashed is not None else ()
            w.act("update_weights", w.trainer.update_weights(sink, w.rollout_id), after_recovery, expect=expect)
            if w.crashed is not None and w.terminal:
                assert "--ft-components train" in w.failed and "crashed" in w.failed, w.failed
                w.stop_checked = True
            w.crashed = None
            w.trained = False
            if w.model.rollout == "Ready":
                w.samples = None

        @precondition(lambda self: self._live() and not self.w.trained and self._m().rollout == "WeightsOnly")
        @rule()
        def onload_kv(self) -> None:
            self.w.act("onload_kv", self.w.manager.onload_kv(), ["rollout.onload_kv"])
            self.w.samples = None

        # faults
        @precondition(lambda self: self._live() and self._m().rollout in ("Ready", "Offloaded", "WeightsOnly"))
        @rule(i=st.integers(0, case.engines - 1))
        def kill_engine(self, i: int) -> None:
            # draws never depend on the world's state (it persists across examples): a kill that is not
            # possible now is a no-op
            w = self.w
            up = [j for j, e in enumerate(w.model.engines) if e.state in LIVE and e.proc == UP]
            if i not in up or (w.job.p["rollout_ft"] and len(up) < 2):
                return  # keep one engine serving: with none, generate has nowhere to go (a different test)
            plan: list[Any] = [("env.kill", i), ("env.ray_death", i)]
            if not w.job.p["rollout_ft"]:
                plan.append(("engine.fail", i))
            w.act(f"kill_engine({i})", w.manager.controller.kill_engine(i), plan, killed=i)

        # a crash is seen at the next call into the workers: train, or the weights write of update_weights
        @precondition(lambda self: self._live() and self.w.crashed is None and self._m().trainer == "Ready")
        @rule(rank=st.integers(0, case.workers - 1))
        def crash_trainer_worker(self, rank: int) -> None:
            w = self.w

            async def crash() -> None:
                await w.trainer.crash_worker(rank)
                for _ in range(100):  # bounded: the actor is gone once a call fails
                    try:
                        await asyncio.wait_for(w.trainer.workers[rank].call("pid"), 5.0)
                    except WorkerCrashed:
                        return
                    await asyncio.sleep(0.05)
                raise AssertionError(f"worker {rank} still answers after crash")

            w.act(f"crash_worker({rank})", crash(), [])  # the model learns of it at the next train
            w.crashed = rank

        def teardown(self) -> None:
            """Finish the step, so that every example starts at a step boundary (the draws then never
            depend on what earlier examples left behind, which hypothesis would call flaky)."""
            w = self.w
            for _ in range(8):
                if w.poisoned:
                    return
                if w.terminal:
                    if not w.stop_checked:
                        self.run_stops()
                    return
                if w.samples is None and not w.trained and w.crashed is None and w.model.rollout == "Ready":
                    return
                if w.model.rollout == "WeightsOnly" and not w.trained:
                    self.onload_kv()
                elif w.model.rollout == "Offloaded" and w.trained:
                    self.onload_weights()
                elif w.trained:
                    self.update_weights()
                elif w.samples is None:
                    self.generate()
                else:
                    self.train()
            raise AssertionError(f"teardown could not finish the step: {w.model}")

        # a stopped run: the next generate must fail fast and name the engine and the flag
        @precondition(lambda self: self.w.terminal and not self.w.stop_checked and not self.w.poisoned)
        @rule()
        def run_stops(self) -> None:
            w = self.w
            try:
                w.run(w.manager.generate(w.rollout_id))
            except EngineFailed as exc:
                assert "rollout fault tolerance is off" in str(exc) and "--ft-components rollout" in str(exc), exc
            else:
                raise Divergence(f"the model stopped the run ({w.model.failed}) but the runtime generated")
            w.stop_checked = True

        @precondition(lambda self: self.w.terminal and (self.w.stop_checked or self.w.poisoned))
        @rule()
        def stopped(self) -> None:
            """Nothing more to do in a stopped run (the next example starts a new world)."""

    LoopModel.__name__ = f"LoopModel_{case.name.replace('-', '_')}"
    return LoopModel


def _settings(examples: int | None = None, steps: int = 10) -> settings:
    # examples are cheap (the world persists), actions are not (seconds each, real processes): dev (30) -> 4
    # per config, ci (300) -> 8; the product model's own hypothesis suite is the thorough one
    scale = max(4, settings().max_examples // 40)
    return settings(
        max_examples=examples or min(scale, 8),
        stateful_step_count=steps,
        deadline=None,
        database=None,  # a persistent world cannot replay a saved example
        phases=[Phase.generate],  # ... nor shrink one
        suppress_health_check=list(HealthCheck),
    )


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_real_loop_matches_the_product_model(case: Case) -> None:
    run_state_machine_as_test(loop_machine(case), settings=_settings())
    stats = STATS[case.name]
    assert sum(stats.values()) > stats["build"], stats
    print(f"[{case.name}] {sum(stats.values())} actions: {dict(stats)}")


# -- the check can fail: re-introduced controller bugs are reported as divergences -----------------------------
# The mutants run the same rules directly (a fixed sequence), on the rollout-FT world: hypothesis would report
# the persistent world's failure as "flaky" rather than as the divergence itself.
def _divergence(case: Case, *rules: str) -> str:
    machine = loop_machine(case)()
    with pytest.raises(Divergence) as info:
        for name in rules:
            getattr(machine, name)()
    return str(info.value)


def test_divergence_when_the_controller_skips_the_before_verbs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: ``_op`` skips ENGINE_PLAN's "before" verbs (generate_done no longer drains the engines)."""
    import lifecycle.job as job_module

    async def op_without_before(self: InferenceController, trigger: str, *, weights: Any = None) -> Any:
        plan = job_module.ENGINE_PLAN.get(trigger, ())
        result = self.machine.fire(trigger)
        if not result.ok:
            return result
        await self._effects(result)
        for when, engine_trigger, states in plan:
            if when == "after":
                await self._engines_do(engine_trigger, states, weights)
        return result

    world(CASE["rollout-ft"])  # built (and checked) with the real controller
    monkeypatch.setattr(InferenceController, "_op", op_without_before)
    text = _divergence(CASE["rollout-ft"], "generate")
    assert re.search(r"engines: runtime \[[^]]*'Serving'[^]]*\], model \[[^]]*'Quiesced'", text), text
    assert "moves differ" in text, text
    assert WORLDS["rollout-ft"].poisoned  # the next user rebuilds it


@pytest.mark.monitor
def test_divergence_when_the_monitor_is_never_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the controller ignores ``pause_monitor``: the monitor keeps probing after generate."""
    real = InferenceController._effects

    async def effects_without_pause(self: InferenceController, result: Any) -> None:
        await real(self, dataclasses.replace(result, effects=tuple(e for e in result.effects if e != "pause_monitor")))

    world(CASE["rollout-ft"])
    monkeypatch.setattr(InferenceController, "_effects", effects_without_pause)
    text = _divergence(CASE["rollout-ft"], "generate")
    assert "monitor: runtime Running, model Paused" in text, text
    assert "monitors_run_only_during_generate_or_eval" in text, text
