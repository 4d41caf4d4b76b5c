"""Model-based test: the real runtime against the core's prediction, for every FT configuration and mode.

A hypothesis ``RuleBasedStateMachine`` drives one real job -- a :class:`Runner`, the
:class:`RolloutManager` on real CPU engine processes (HTTP on 127.0.0.1) and the
:class:`TrainerGroup` on Ray actors -- through random orders of the calls a training loop may make
(generate, eval, offload, onload weights / KV, catch up, train, update weights, save, stop and start an
engine) and through faults (SIGKILL an engine process, crash a trainer worker). A rule is enabled
exactly when the core, asked without carrying anything out (``Core.step`` is pure), accepts its
operation now: the loop order is the core's to allow, not this test's.

After every action the core's prediction (``runner.state``) is compared with what the real parts
report:

* every engine slot: a ``live`` state has a process that answers, any other state has none; the
  memory it has released (``/server_info``) is what the core says; an engine the core says holds the
  committed weights reports that version (``/model_info``); routable engines hold it *during*
  generation too (a spy inside the rollout function);
* the monitor probes exactly when the core says ``Running``, and watches exactly the live engines;
* the trainer has workers exactly when the core allocated them (none under ``--debug-rollout-only``);
* nothing is in flight and the engine lock is free between calls; the ``transitions`` machines
  mirror the core; a run the core stopped raised the error naming the flag to turn on;

and checks ``lifecycle.check.invariants`` on the state as observed.

Engines and trainer workers cost seconds to start, so one *world* is built per case and carried
across hypothesis examples; it is rebuilt only after the run stopped or a check failed. Because the
world persists, a failing sequence cannot be replayed from scratch: shrinking is off and the failure
report prints the actions as run.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test

from lifecycle.check.invariants import check_state
from lifecycle.check.world import DEAD_NOTIFIED, UP, Checker, Node
from lifecycle.check.world import World as CheckerWorld
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import ROLLOUT, Op
from lifecycle.decide.errors import LifecycleError
from lifecycle.decide.events import EventLog, MemorySink
from lifecycle.decide.names import OperationName
from lifecycle.decide.runner import Runner

pytest.importorskip("ray")
pytest.importorskip("torch")

from engines.engine import Engine, Timeouts
from engines.launcher import launcher_factory
from engines.models import CharTokenizer
from engines.vllm.api import VLLMAPI
from rollout.controller import InferenceController
from rollout.executor import EngineRolloutFn, RolloutManager
from rollout.pattern import PatternTask
from rollout.policy_source import PolicyRolloutFn
from rollout.replay import save_rollout
from rollout.sample import Sample, sample
from trainer.app.loop import VLLM_TINY_LLAMA, initial_weights
from trainer.group import TrainerGroup
from trainer.grpo import grpo_backend
from trainer.workers import WorkerCrashed

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ray_cluster")]

T = TypeVar("T")

# probes fast enough to run during a generate, slow enough never to time out on a busy 2-core box
COMMON: dict[str, Any] = {
    "rollout_health_check_interval": 5.0,
    "rollout_health_check_timeout": 5.0,
    "rollout_health_check_first_wait": 0.0,
    "engine_restart_backoff": 0.05,
    # the world persists across examples, so kills add up: the budget must not run out here (spending it
    # is the core's give_up, checked by the explorer and tests/rollout)
    "engine_max_restarts": 10_000,
}
FT: dict[str, dict[str, Any]] = {
    "none": {},
    "train": {"use_fault_tolerance": True, "ft_components": ["train"]},
    "rollout": {"use_fault_tolerance": True, "ft_components": ["rollout"]},
    "both": {"use_fault_tolerance": True, "ft_components": ["train", "rollout"]},
}
MODES: dict[str, dict[str, Any]] = {
    "normal": {},
    "train-only": {"debug_train_only": True},
    "rollout-only": {"debug_rollout_only": True},
    "replay": {"load_debug_rollout_data": "{replay}"},
}
TASK = PatternTask(prompts_per_step=2, group_size=2, response_len=4, seed=0)
REPLAY_ROLLOUTS = 400  # saved rollouts a replay world may read (more than a world ever generates)


@dataclass(frozen=True)
class Case:
    mode: str
    ft: str
    launcher: str = "local"  # "ray": every engine server in a Ray actor, and a kill is the actor's death
    backend: str = "sglang"  # "vllm": real vLLM servers (one: each costs a core and 25-40 s to start)

    @property
    def name(self) -> str:
        return f"{self.mode}/{self.ft}" + "".join(
            f"/{part}" for part, default in ((self.launcher, "local"), (self.backend, "sglang")) if part != default
        )

    @property
    def engines(self) -> int:
        if self.mode in ("train-only", "replay"):
            return 0
        if self.backend == "vllm":
            return 1
        return 2 if "rollout" in FT[self.ft].get("ft_components", ()) else 1

    def config(self, tmp: Path, *, check_paths: bool = True) -> LifecycleConfig:
        flags: dict[str, Any] = {**COMMON, **FT[self.ft], **MODES[self.mode], "rollout_backend": self.backend}
        if self.engines:
            flags["rollout_num_gpus"] = self.engines
        if self.mode == "normal" and self.ft in ("train", "both"):
            flags["offload_rollout"] = True  # offload and onload reach the engines' memory
        if self.mode == "replay":
            flags["load_debug_rollout_data"] = str(tmp / "replay" / "{rollout_id}.json")
        return LifecycleConfig.from_mapping(flags, check_paths=check_paths)


CASES = (
    *(Case(mode, ft) for mode in MODES for ft in FT),
    Case("normal", "both", launcher="ray"),
    Case("normal", "rollout", backend="vllm"),
)
# CI's time bound (LIFECYCLE_RECORDED=1 runs the rest): of each mode the two FT configurations that protect one
# component (the core answers none and both by the same predicates; test_job_model explores all four), the Ray
# launcher's case; the vLLM case is recorded (vLLM's runtime is CI's fault cells on vLLM and its loop tests).
CI_FT = ("train", "rollout")


def recorded(case: Case) -> bool:
    """Whether ``case`` runs only with LIFECYCLE_RECORDED=1."""
    return case.backend == "vllm" or (case.launcher == "local" and case.ft not in CI_FT)


class Divergence(AssertionError):
    """The runtime and the core disagree (or the runtime broke an invariant)."""


def _samples(rollout_id: int) -> list[Sample]:
    """A trainable rollout in the executor's format (rewards differ inside each group)."""
    tok = CharTokenizer()
    out = []
    for g, prompt in enumerate(TASK.prompts(rollout_id)):
        for k in range(TASK.group_size):
            response = "abab" if k % 2 == 0 else "zzzz"
            out.append(
                sample(
                    index=g * TASK.group_size + k,
                    group=g,
                    prompt=prompt,
                    prompt_ids=tok.encode(prompt),
                    output_ids=tok.encode(response),
                    response=response,
                    reward=TASK.reward(prompt, response),
                    logprobs=[-1.0] * len(response),
                    weight_version="0",
                    engine="saved",
                )
            )
    return out


class World:
    """One real job and the core inside it, moved one loop call at a time and compared after each."""

    def __init__(self, case: Case) -> None:
        self.case = case
        self.tmp = tempfile.TemporaryDirectory(prefix=f"loop-model-{case.mode}-{case.ft}-")
        tmp = Path(self.tmp.name)
        if case.mode == "replay":  # the saved rollouts exist before the config names them
            template = str(tmp / "replay" / "{rollout_id}.json")
            for rid in range(REPLAY_ROLLOUTS):
                save_rollout(template, rid, _samples(rid), task=TASK.pattern)
        self.config = case.config(tmp)
        self.loop = asyncio.new_event_loop()
        self.sink = MemorySink()
        self.runner = Runner(self.config, log=EventLog([self.sink]))
        launchers, backend, startup = launcher_factory("ray" if case.launcher == "ray" else "local"), None, 90.0
        if case.backend == "vllm":  # a Hugging Face Llama both sides can read, built here; the trainer writes its kind
            from engines.models import build_tiny_llama
            from engines.vllm.launcher import find_python, vllm_launcher_factory

            model = build_tiny_llama(tmp / "model", seed=0, **VLLM_TINY_LLAMA)
            launchers = vllm_launcher_factory("local", model, python=find_python())
            backend, startup = grpo_backend(checkpoint=str(model)), 300.0
        self.backend = backend or grpo_backend()
        self.trainer = TrainerGroup(self.config, tmp, runner=self.runner, workers=1, backend=backend)
        self.manager = RolloutManager(
            self.config,
            TASK,
            runner=self.runner,
            launcher_factory=launchers,
            timeouts=Timeouts(startup=startup, request=30.0, death=10.0),
        )
        self.checker = Checker(self.config, engines=self.runner.core.engines)
        self.samples: list[Sample] = _samples(0)
        self.rollout_id = 0
        self.version = 0
        self.poisoned = False
        self.stop_checked = False
        self.mid_problems: list[str] = []
        self.history: list[str] = []

    # -- running ----------------------------------------------------------------------------------------------
    def run(self, coro: Awaitable[T]) -> T:
        return self.loop.run_until_complete(coro)  # type: ignore[arg-type]

    @property
    def terminal(self) -> bool:
        return bool(self.runner.state.failed)

    def accepts(self, name: OperationName, engine: int | None = None) -> bool:
        """The core would run this operation now and it would do something (asked purely: nothing is
        carried out)."""
        if self.terminal or self.poisoned:
            return False
        result = self.runner.core.step(self.runner.state, Op(name, engine))
        return result.refused is None and bool(result.moves or result.commands or result.state.rollout_program)

    def build(self) -> None:
        async def start() -> None:
            weights = await self.trainer.start() or await initial_weights(Path(self.tmp.name), self.backend)
            await self.manager.init(weights)
            self.feed_policy(weights)

        self.act("build", start())
        self._spy()

    def feed_policy(self, weights: tuple[str, str]) -> None:
        """Plain train-only: the engine-less producer samples the trainer's own policy (as the loop does)."""
        fn = self.manager.executor.rollout_fn
        if isinstance(fn, PolicyRolloutFn):
            fn.load(*weights)

    def _spy(self) -> None:
        """During generation too: every routable engine holds the committed weights (``/model_info``)."""
        executor = self.manager.executor
        inner = executor.rollout_fn
        if not isinstance(inner, EngineRolloutFn):
            return

        async def spied(rollout_id: int, controller: InferenceController) -> list[Sample]:
            committed = controller.committed[1] if controller.committed else None
            for e in controller.routable():
                version = await e.served_version()
                if version != committed:
                    self.mid_problems.append(f"{e.id} routable with version {version}, not {committed}")
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

    # -- one loop call, then the comparison -------------------------------------------------------------------
    def act(self, label: str, work: Awaitable[Any]) -> Any:
        self.history.append(label)
        STATS[self.case.name][label.split("(")[0]] += 1
        result: Any = None
        raised: BaseException | None = None
        try:
            result = self.run(work)
        except LifecycleError as exc:  # the run stopped: allowed only when the core stopped it
            raised = exc
        except Exception as exc:
            self.poisoned = True
            raise Divergence(f"[{self.case.name}] {label}: the runtime raised {exc!r}") from exc
        problems = self.run(self.observe())
        if raised is not None and not self.terminal:
            problems.append(f"the runtime raised {raised!r} but the core did not stop the run")
        if raised is not None:
            problems += _names_the_fix(str(raised))
        problems += [f"during generate: {p}" for p in self.mid_problems]
        self.mid_problems.clear()
        if problems:
            self.poisoned = True
            raise Divergence(
                f"[{self.case.name}] after {label} (actions so far: {' -> '.join(self.history[-12:])}):\n  "
                + "\n  ".join(problems)
            )
        return result

    async def observe(self) -> list[str]:
        """Every difference between the core's prediction and what the real parts report."""
        r, c = self.runner, self.manager.controller
        s, core = r.state, r.core
        problems: list[str] = []
        if not core.settled(s) or s.lock:
            problems.append(
                f"between calls: awaiting {s.awaiting}, lanes {s.rollout_op!r}/{s.trainer_op!r}, lock {s.lock}"
            )
        for machine, state in (("rollout", s.rollout), ("trainer", s.trainer), ("monitor", s.monitor)):
            if r.machine(machine, machine).state != state:
                problems.append(f"{machine}: transitions machine in {r.machine(machine, machine).state}, core {state}")
        committed = r.committed[1] if r.committed else None
        views, procs = [], []
        for i, e in enumerate(s.engines):
            instance = f"engine-{i}"
            if r.machine("engine", instance).state != e.state:
                problems.append(
                    f"{instance}: transitions machine in {r.machine('engine', instance).state}, core {e.state}"
                )
            slot = c.engines[i] if i < len(c.engines) else None
            alive = slot is not None and slot.launcher.alive()
            procs.append(UP if alive else DEAD_NOTIFIED)
            if e.state not in core.live:
                if alive:
                    problems.append(f"{instance} is {e.state} in the core, but its process runs")
                views.append(e)
                continue
            if slot is None or not alive or slot.client is None:
                problems.append(f"{instance} is {e.state} in the core, but it has no running process")
                views.append(e)
                continue
            released = await _released(slot)
            if released != e.released:
                problems.append(
                    f"{instance} released {sorted(released)} (says the engine), the core {sorted(e.released)}"
                )
            version = await slot.served_version()
            if e.current and version != committed:
                problems.append(f"{instance} holds version {version!r}, the core says the committed {committed!r}")
            views.append(e._replace(released=released, current=e.current and version == committed))
        running = c.monitor.running
        if running != (s.monitor == "Running"):
            problems.append(f"monitor probing: {running}, the core says {s.monitor}")
        watched = (
            {(ROLLOUT, i) for i, e in enumerate(s.engines) if e.state in core.live} if core.monitoring(s) else set()
        )
        if set(c.monitor.members) != watched:
            problems.append(f"monitor watches {sorted(c.monitor.members)}, the core's live engines {sorted(watched)}")
        if bool(self.trainer.workers) != (s.trainer != "Init"):
            problems.append(f"trainer workers {len(self.trainer.workers)}, the core's trainer {s.trainer}")
        observed = s._replace(engines=tuple(views))
        problems += [
            f"{name}: {p}" for name, p in check_state(self.checker, Node(observed, CheckerWorld(tuple(procs))))
        ]
        return problems


async def _released(slot: Engine) -> frozenset[str]:
    """The memory tags the server says it has released: the CPU engine's residency (``/server_info``). vLLM on CPU
    cannot sleep (the config refuses offloading it), and its ``/is_sleeping`` says true while merely paused: nothing
    to read, and nothing released -- which the core must agree with."""
    if isinstance(slot.server, VLLMAPI):
        return frozenset()
    assert slot.client is not None
    mem = (await slot.client.server_info()).engine_memory()
    assert mem is not None  # the CPU engine reports its residency
    residency = (("weights", mem.weights_resident), ("kv_cache", mem.kv_cache_resident))
    return frozenset(tag for tag, resident in residency if not resident)


def _names_the_fix(message: str) -> list[str]:
    """A stopped run says which flag would have let it go on."""
    if "--ft-components rollout" in message or "--ft-components train" in message:
        return []
    return [f"the error does not name the flag to turn on: {message}"]


# -- the worlds: one per case, reused across examples -----------------------------------------------------------
WORLDS: dict[str, World] = {}
STATS: dict[str, Counter[str]] = {c.name: Counter() for c in CASES}
FAILURES: dict[str, list[str]] = {c.name: [] for c in CASES}


def world(case: Case) -> World:
    w = WORLDS.get(case.name)
    if w is not None and (w.poisoned or (w.terminal and w.stop_checked)):
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


# -- the loop's calls as one rule -----------------------------------------------------------------------------------
# The world persists across examples, so hypothesis' draws must never depend on its state (it would call the
# data generation flaky): one rule draws a call and an engine index; when the core would not accept that call
# now, the next one in this list that it accepts is made instead (so every step does something).
CALLS = (
    "generate",
    "eval",
    "offload",
    "onload_weights",
    "onload_kv",
    "catch_up",
    "train",
    "update_weights",
    "save",
    "stop_engine",
    "start_engine",
    "kill_engine",
    "crash_trainer_worker",
    "generate",  # the loop's main call, twice as likely
)
ENGINE_CALLS = frozenset({"stop_engine", "start_engine", "kill_engine"})


class Calls:
    """The loop's calls on one world, and the faults; each returns False when it cannot be made now."""

    def __init__(self, w: World) -> None:
        self.w = w

    def possible(self, name: str, i: int) -> bool:
        w = self.w
        if w.terminal or w.poisoned:
            return False
        if name == "kill_engine":
            return i < len(w.runner.state.engines) and w.runner.state.engines[i].state in w.runner.core.live
        if name == "crash_trainer_worker":
            return bool(w.trainer.workers) and w.runner.state.trainer == "Ready"
        return w.accepts(name, i if name in ENGINE_CALLS else None)  # type: ignore[arg-type]

    def make(self, name: str, i: int) -> None:
        getattr(self, name)(i)

    def generate(self, i: int) -> None:
        w = self.w
        samples = w.act(f"generate({w.rollout_id})", w.manager.generate(w.rollout_id))
        if samples is not None:
            assert len(samples) == TASK.prompts_per_step * TASK.group_size, samples
            w.samples = samples
        w.rollout_id += 1

    def eval(self, i: int) -> None:
        self.w.act("eval", self.w.manager.eval(self.w.rollout_id))

    def offload(self, i: int) -> None:
        self.w.act("offload", self.w.manager.offload())

    def onload_weights(self, i: int) -> None:
        self.w.act("onload_weights", self.w.manager.onload_weights())

    def onload_kv(self, i: int) -> None:
        self.w.act("onload_kv", self.w.manager.onload_kv())

    def catch_up(self, i: int) -> None:
        self.w.act("catch_up", self.w.manager.catch_up())

    def train(self, i: int) -> None:
        self.w.act("train", self.w.trainer.train(self.w.samples))

    def update_weights(self, i: int) -> None:
        w = self.w
        w.version += 1
        w.act(f"update_weights(v{w.version})", w.trainer.update_weights(w.version))

    def save(self, i: int) -> None:
        w = self.w
        w.version += 1
        path = w.act(f"save(v{w.version})", w.trainer.save(w.version))
        if path is not None:
            w.feed_policy((path, str(w.version)))

    def stop_engine(self, i: int) -> None:
        self.w.act(f"stop_engine({i})", self.w.manager.stop_engine(i))

    def start_engine(self, i: int) -> None:
        self.w.act(f"start_engine({i})", self.w.manager.start_engine(i))

    def kill_engine(self, i: int) -> None:
        """SIGKILL the server (with Ray launchers: the actor's process dies); its death watcher reports it;
        the core marks it (then recovers or stops)."""
        w = self.w
        if w.case.launcher == "local":
            w.act(f"kill_engine({i})", w.manager.controller.kill_engine(i))
            return

        async def actor_dies() -> None:
            w.manager.controller.engines[i].launcher.crash()
            for _ in range(1500):  # bounded: Ray reports an actor's death within seconds
                if w.runner.state.engines[i].state not in w.runner.core.live:
                    return
                await asyncio.sleep(0.02)
            raise Divergence(f"engine-{i}: the actor's death was not reported within 30 s")

        w.act(f"crash_actor({i})", actor_dies())

    def crash_trainer_worker(self, i: int) -> None:
        """The worker's process dies; the trainer learns it at its next call (heal, or stop)."""
        w = self.w

        async def crash() -> None:
            await w.trainer.crash_worker(0)
            for _ in range(100):  # bounded: the actor is gone once a call fails
                try:
                    await asyncio.wait_for(w.trainer.workers[0].call("pid"), 5.0)
                except WorkerCrashed:
                    return
                await asyncio.sleep(0.05)
            raise AssertionError("worker 0 still answers after its crash")

        w.act("crash_worker(0)", crash())

    def run_stops(self) -> None:
        """Every later call fails fast with the error that names the flag."""
        w = self.w
        try:
            w.run(w.manager.generate(w.rollout_id))
        except LifecycleError as exc:
            if _names_the_fix(str(exc)):
                raise Divergence(f"[{w.case.name}] a call after the stop raised {exc!r}, naming no fix") from exc
        else:
            raise Divergence(f"the core stopped the run ({w.runner.state.failed}) but the runtime generated")
        w.stop_checked = True


def loop_machine(case: Case) -> type[RuleBasedStateMachine]:
    class LoopModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.calls = Calls(world(case))

        @rule(choice=st.integers(0, len(CALLS) - 1), i=st.integers(0, max(case.engines - 1, 0)))
        def call(self, choice: int, i: int) -> None:
            """A failure is recorded, not raised: hypothesis would replay the example on a new world, see it
            pass, and report a flaky test instead of the divergence (the test reports what was recorded)."""
            w = self.calls.w
            if w.poisoned:
                return
            try:
                self._call(choice, i)
            except AssertionError as exc:
                w.poisoned = True
                FAILURES[case.name].append(str(exc))

        def _call(self, choice: int, i: int) -> None:
            calls, w = self.calls, self.calls.w
            if w.terminal:
                if not w.stop_checked:
                    calls.run_stops()
                return  # nothing more to do in a stopped run (the next example starts a new world)
            for k in range(len(CALLS)):
                name = CALLS[(choice + k) % len(CALLS)]
                if calls.possible(name, i):
                    calls.make(name, i)
                    return
            raise Divergence(f"[{case.name}] no call is possible in {w.runner.state}")

    LoopModel.__name__ = f"LoopModel_{case.mode.replace('-', '_')}_{case.ft}"
    return LoopModel


def _settings() -> settings:
    # examples are cheap (the world persists), actions are not (real processes): 3 examples of 8 calls per case
    # in dev, 4 in ci; the core's own hypothesis suite (test_job_model) is the thorough one
    examples = 4 if settings().max_examples >= 100 else 3
    return settings(
        max_examples=examples,
        stateful_step_count=8,
        deadline=None,
        database=None,  # a persistent world cannot replay a saved example
        phases=[Phase.generate],  # ... nor shrink one
        suppress_health_check=list(HealthCheck),
    )


CASE_PARAMS = [pytest.param(c, marks=pytest.mark.recorded) if recorded(c) else c for c in CASES]


@pytest.mark.parametrize("case", CASE_PARAMS, ids=[c.name for c in CASES])
def test_real_runtime_matches_the_core(case: Case, request: pytest.FixtureRequest) -> None:
    if case.backend == "vllm":
        request.getfixturevalue("vllm_python")  # skips without the engine environment (make engine-env)
    run_state_machine_as_test(loop_machine(case), settings=_settings())
    assert not FAILURES[case.name], "\n\n".join(FAILURES[case.name])
    stats = STATS[case.name]
    assert sum(stats.values()) > stats["build"], stats
    print(f"[{case.name}] {sum(stats.values())} calls: {dict(stats)}")


# -- the check can fail: shells that do not carry out the core's commands are caught ------------------------------
def fresh_world(case: Case) -> World:
    """A new world for a fixed sequence of calls (one left by the random tests may be anywhere)."""
    old = WORLDS.pop(case.name, None)
    if old is not None:
        old.close()
    return world(case)


def _divergence(case: Case, steps: Callable[[World], None]) -> str:
    w = world(case)
    with pytest.raises(Divergence) as info:
        steps(w)
    return str(info.value)


def test_divergence_when_onload_resumes_only_the_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the shell's ``resume_kv_cache`` handler does nothing (onload restores one memory tag of two)."""
    case = Case("normal", "train")  # offloads
    w = fresh_world(case)
    handlers = w.runner.handlers

    async def nothing(cmd: Any) -> None:
        return None

    monkeypatch.setitem(handlers, "engine.resume_kv_cache", nothing)

    def steps(w: World) -> None:
        for name in ("generate", "offload", "train", "onload_weights", "update_weights", "onload_kv"):
            Calls(w).make(name, 0)

    text = _divergence(case, steps)
    assert "released ['kv_cache'] (says the engine), the core []" in text, text


def test_divergence_when_a_restarted_engine_gets_the_previous_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: catch-up loads the version before the committed one (the miles bug of a stale restart)."""
    case = Case("normal", "rollout")
    w = fresh_world(case)
    real = w.runner.handlers["engine.transfer_weights"]
    first = w.runner.committed
    assert first is not None

    async def stale(cmd: Any) -> Any:
        if cmd.lane == "rollout":  # a catch-up or a recovery: the committed weights are due
            return await w.manager.controller.slot(cmd).load(*first)
        return await real(cmd)

    monkeypatch.setitem(w.runner.handlers, "engine.transfer_weights", stale)

    def steps(w: World) -> None:
        calls = Calls(w)
        for name in ("generate", "train", "update_weights", "kill_engine", "generate"):
            calls.make(name, 0)  # the second generate recovers engine-0 and catches it up -- with old weights

    text = _divergence(case, steps)
    assert "engine-0 holds version '0', the core says the committed" in text or "routable with version 0" in text, text


def test_the_cases_cover_every_mode_and_ft_configuration() -> None:
    assert {(c.mode, c.ft) for c in CASES} == {(m, f) for m in MODES for f in FT}
    assert {c.launcher for c in CASES} == {"local", "ray"}
    assert {c.backend for c in CASES} == {"sglang", "vllm"}
    modes = {c.config(Path("/nonexistent"), check_paths=False).mode for c in CASES}
    assert modes >= {"train-only", "rollout-only", "replay"}, modes
