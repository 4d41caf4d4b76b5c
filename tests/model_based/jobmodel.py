"""Hypothesis state machines over the lifecycle core in its world (``lifecycle.check.world.Checker``).

``make_machine(machines=None, configs=None)`` returns a ``RuleBasedStateMachine`` class whose
rules are the checker's own step families -- the operations a loop may call (rollout side, trainer
side, single engines), the shells' results and news, and the faults the world injects. A rule is
enabled exactly when ``Checker.successors(node)`` offers a step of its family, and it draws one of
those steps (``st.data()``), so the suite only ever takes steps the core allows. Each step is
checked with ``check_step``; every state with ``check_state`` and a local ``no_deadlock``. The fault
budget is the checker's (``max_faults``, default 2), as in the explorer.

Three search aids, all drawn per run (so hypothesis can shrink them away) and none of which
removes a step the core allows: ``any_event`` takes any non-fault step, so a run progresses even
when swarm testing switched some family rules off; ``fault_at`` delays each fault of the budget
to a drawn step, so runs reach weight updates and restarts before breaking them; ``seek_new``
prefers steps into states this run has not visited (loops once nothing is new).

``machines`` binds the suite to (mutated) specs, ``configs`` restricts the configs drawn at
``@initialize`` (default: every valid config of the lattice).

``make_runtime_machine`` extends it: every move the core makes is replayed on ``transitions``
machines (``LifecycleMachine``, as the runner does), one per machine instance,
and each one's state, effects, ledger and event log must equal the core's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from lifecycle import EffectLedger, EventLog, LifecycleConfig
from lifecycle.check.explore import lattice
from lifecycle.check.invariants import NEVER_IN_REPLAY, check_state, check_step
from lifecycle.check.world import Action, Checker, Node, Transition
from lifecycle.decide.core import OPERATIONS
from lifecycle.decide.events import TRANSITION, MemorySink
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.runtime import LifecycleMachine
from lifecycle.decide.spec import MachineSpec

VALID_CONFIGS: tuple[LifecycleConfig, ...] = tuple(lattice().valid)
ENGINE_COUNTS = (2, 1, 3)  # shrinks towards the explorer's default of 2
MAX_FAULTS = 2
# Fault timing: each run draws, per fault of its budget, the step from which that fault may be
# injected (0 = at once, which is also where it shrinks to). Every fault sequence stays possible;
# delayed faults let a run first reach deep states (weight updates, restarts) and then break them.
FAULT_DELAY_MAX = 40

# Faults are split by what they hit, so that hypothesis' swarm testing (each example disables a
# random subset of rules) yields runs whose small fault budget goes to one kind of fault.
FAMILIES = (
    "rollout",
    "trainer",
    "engine",
    "engine_fault",
    "rollout_fault",
    "trainer_fault",
    "fleet_fault",
    "fault",
    "world",
    # an elastic fleet: the loop's scale and retire (bounded like faults), a preemption notice (a fault), a drain's end
    "scale_rollout",
    "retire_engine",
    "preempt_notice",
    "drained",
)
ELASTIC_FAMILIES = frozenset({"scale_rollout", "retire_engine", "preempt_notice", "drained"})


def family(action: Action) -> str:
    """Which rule takes ``action``: the lane of the operation, a fault family, or ``world`` (results, news)."""
    kind, _, what = action.name.partition(".")
    if what in ELASTIC_FAMILIES:
        return what
    if kind == "op":
        if action.engine is not None:
            return "engine_fault" if action.fault else "engine"  # an operator's stop is bounded like a fault
        return OPERATIONS[what].lane
    if not action.fault:
        return "world"
    if kind == "fault":
        return "engine_fault"
    if kind == "results":
        if "worker_crashed" in what:
            return "trainer_fault"
        return "fleet_fault" if "eval-" in what else "rollout_fault"
    return "fault"


def configs_where(**predicates: bool) -> tuple[LifecycleConfig, ...]:
    """Lattice configs whose named predicates have the given values (``configs_where(replay=True)``)."""
    from lifecycle.decide.predicates import evaluate

    out = tuple(c for c in VALID_CONFIGS if all(evaluate(c)[k] == v for k, v in predicates.items()))
    assert out, f"no lattice config has {predicates}"
    return out


def render(config: LifecycleConfig, path: Sequence[Transition]) -> str:
    flags = " ".join(config.to_flags()) or "(miles defaults)"
    lines = [f"config: {flags}"]
    lines += [f"  {n}. {t.action.label()}" for n, t in enumerate(path, start=1)]
    return "\n".join(lines)


class JobModelBase(RuleBasedStateMachine):
    """Shared behaviour; the rules and the bound specs/configs come from :func:`make_machine`."""

    specs: Mapping[str, MachineSpec] | None = None

    def __init__(self) -> None:
        super().__init__()
        self.job: Checker | None = None
        self.state: Node | None = None
        self.path: list[Transition] = []
        self.seen: set[Node] = set()
        self.fault_at: tuple[int, ...] = ()
        self.seek_new = False
        self.engines = 2
        self._succ: list[Transition] | None = None
        self._pool: list[Transition] | None = None

    # -- hooks for subclasses -------------------------------------------------------------------
    def on_start(self) -> None:
        """A run starts (``@initialize`` or a rerun after a terminal state)."""

    def observe(self, t: Transition, before: Node) -> None:
        """One step was taken (already checked with ``check_step``)."""

    # -- the model ------------------------------------------------------------------------------
    def start(self, config: LifecycleConfig, engines: int) -> None:
        self.job = Checker(config, engines=engines, machines=self.specs, max_faults=MAX_FAULTS)
        self.state = self.job.initial()
        self.path = []
        self.seen = {self.state.key()}
        self._succ = self._pool = None
        self.on_start()

    @property
    def successors(self) -> list[Transition]:
        if self._succ is None:
            assert self.job is not None and self.state is not None
            self._succ = list(self.job.successors(self.state))
        return self._succ

    def fault_due(self) -> bool:
        """The next fault of the budget may be injected now (its drawn step has come)."""
        assert self.state is not None
        i = self.state.world.faults
        return i >= len(self.fault_at) or len(self.path) >= self.fault_at[i]

    def allowed(self, t: Transition) -> bool:
        return not t.action.fault or self.fault_due()

    @property
    def pool(self) -> list[Transition]:
        """The steps the rules choose from: every allowed step, or with ``seek_new`` (a depth-first
        bias), only the steps into states this run has not visited, while any exist.
        Faults are always offered (when due); loops are taken once nothing new is left."""
        if self._pool is None:
            allowed = [t for t in self.successors if not t.action.fault or self.fault_due()]
            if self.seek_new:
                new = [t for t in allowed if not t.action.fault and t.node.key() not in self.seen]
                if new:
                    allowed = new + [t for t in allowed if t.action.fault]
            self._pool = allowed
        return self._pool

    def candidates(self, fam: str | None) -> list[Transition]:
        if fam is None:
            return [t for t in self.pool if not t.action.fault]
        return [t for t in self.pool if family(t.action) == fam]

    def enabled(self, fam: str | None) -> bool:
        return self.job is not None and bool(self.candidates(fam))

    def take(self, data: st.DataObject, fam: str | None) -> None:
        """Take one candidate step of family ``fam`` (None: any step that is not a fault)."""
        options = self.candidates(fam)
        actions = list(dict.fromkeys(t.action for t in options))
        action = data.draw(st.sampled_from(actions), label=fam)
        t = next(t for t in options if t.action == action)
        self.step(t)

    def step(self, t: Transition) -> None:
        assert self.job is not None and self.state is not None
        before = self.state
        self.path.append(t)
        problems = check_step(self.job, t, before, with_state=False)
        assert not problems, self.explain(problems)
        self.state = t.node
        self.seen.add(t.node.key())
        self._succ = self._pool = None
        self.observe(t, before)

    def where(self) -> str:
        assert self.job is not None
        return render(self.job.config, self.path)

    def explain(self, problems: list[tuple[str, str]]) -> str:
        name, problem = problems[0]
        return f"invariant {name}: {problem}\n{self.where()}"

    def teardown(self) -> None:
        self.job = None


def make_machine(
    machines: Mapping[str, MachineSpec] | None = None,
    configs: Sequence[LifecycleConfig] | None = None,
    engines: Sequence[int] = ENGINE_COUNTS,
    base: type[JobModelBase] = JobModelBase,
) -> type[JobModelBase]:
    """A ``RuleBasedStateMachine`` class over the core in its world, bound to ``machines`` and ``configs``."""
    pool = tuple(configs) if configs is not None else VALID_CONFIGS
    assert pool, "no configs to draw from"

    def enabled(fam: str) -> Callable[[JobModelBase], bool]:
        return lambda self: self.enabled(fam)

    class JobModel(base):  # type: ignore[valid-type,misc]
        specs = dict(machines) if machines is not None else None

        @initialize(
            config=st.sampled_from(pool),
            engines=st.sampled_from(tuple(engines)),
            fault_at=st.lists(st.integers(0, FAULT_DELAY_MAX), min_size=MAX_FAULTS, max_size=MAX_FAULTS),
            seek_new=st.booleans(),
        )
        def configure(self, config: LifecycleConfig, engines: int, fault_at: list[int], seek_new: bool) -> None:
            self.fault_at = tuple(sorted(fault_at))
            self.seek_new = seek_new
            self.engines = engines
            self.start(config, engines)

        @precondition(enabled("rollout"))
        @rule(data=st.data())
        def rollout_event(self, data: st.DataObject) -> None:
            self.take(data, "rollout")

        @precondition(enabled("trainer"))
        @rule(data=st.data())
        def trainer_event(self, data: st.DataObject) -> None:
            self.take(data, "trainer")

        @precondition(enabled("engine"))
        @rule(data=st.data())
        def engine_event(self, data: st.DataObject) -> None:
            self.take(data, "engine")

        @precondition(lambda self: self.enabled(None))
        @rule(data=st.data())
        def any_event(self, data: st.DataObject) -> None:
            """Any operation, result or news: the run progresses even when swarm testing
            switched some families' rules off for this example."""
            self.take(data, None)

        @precondition(enabled("engine_fault"))
        @rule(data=st.data())
        def engine_fault(self, data: st.DataObject) -> None:
            self.take(data, "engine_fault")

        @precondition(enabled("rollout_fault"))
        @rule(data=st.data())
        def rollout_fault(self, data: st.DataObject) -> None:
            self.take(data, "rollout_fault")

        @precondition(enabled("trainer_fault"))
        @rule(data=st.data())
        def trainer_fault(self, data: st.DataObject) -> None:
            self.take(data, "trainer_fault")

        @precondition(enabled("fleet_fault"))
        @rule(data=st.data())
        def fleet_fault(self, data: st.DataObject) -> None:
            self.take(data, "fleet_fault")

        @precondition(enabled("fault"))
        @rule(data=st.data())
        def fault(self, data: st.DataObject) -> None:
            """Any other fault the model may grow."""
            self.take(data, "fault")

        @precondition(enabled("world"))
        @rule(data=st.data())
        def world_event(self, data: st.DataObject) -> None:
            self.take(data, "world")

        @precondition(enabled("scale_rollout"))
        @rule(data=st.data())
        def scale_rollout(self, data: st.DataObject) -> None:
            """An elastic fleet's loop scales it by one engine (bounded like a fault)."""
            self.take(data, "scale_rollout")

        @precondition(enabled("retire_engine"))
        @rule(data=st.data())
        def retire_engine(self, data: st.DataObject) -> None:
            """An elastic fleet's loop retires one member (bounded like a fault)."""
            self.take(data, "retire_engine")

        @precondition(enabled("preempt_notice"))
        @rule(data=st.data())
        def preempt_notice(self, data: st.DataObject) -> None:
            """A member of an elastic fleet is given a preemption notice (a fault)."""
            self.take(data, "preempt_notice")

        @precondition(enabled("drained"))
        @rule(data=st.data())
        def drained(self, data: st.DataObject) -> None:
            """A draining engine's requests are done (or its drain bound passed)."""
            self.take(data, "drained")

        @precondition(lambda self: self.job is not None and self.job.terminal(self.state))
        @rule()
        def rerun(self) -> None:
            """The run ended (failed fast): start a fresh run of the same job."""
            assert self.job is not None and self.state is not None
            assert not self.successors, "a terminal state has successors"
            self.start(self.job.config, self.engines)

        @invariant()
        def state_invariants(self) -> None:
            assert self.job is not None and self.state is not None
            problems = check_state(self.job, self.state)
            assert not problems, self.explain(problems)

        @invariant()
        def no_deadlock(self) -> None:
            assert self.job is not None and self.state is not None
            if not self.job.terminal(self.state):
                assert any(not t.action.fault for t in self.successors), self.explain(
                    [("no_deadlock", f"no operation, result or news is enabled in {self.state}")]
                )

        @invariant()
        def every_step_has_a_rule(self) -> None:
            assert self.job is not None and self.state is not None
            # CI's own injection (--ci-test) happens whatever the budget says (lifecycle.check.world: _results)
            ci = 1 if self.job.p["ci_injects_rollout_faults"] else 0
            assert self.state.world.faults <= self.job.max_faults + ci
            assert {family(t.action) for t in self.successors} <= set(FAMILIES)

    return JobModel


# -- the runtime layer against the model ------------------------------------------------------------
class RuntimeVsModelBase(JobModelBase):
    """Replays each step's moves on ``transitions`` machines and compares them with the core's."""

    def __init__(self) -> None:
        super().__init__()
        self.runtime: dict[str, Any] = {}
        self.ledger = EffectLedger()
        self.events = MemorySink()
        self.log = EventLog([self.events], timestamps=False)

    def on_start(self) -> None:
        assert self.job is not None
        specs = {**MACHINES, **(self.specs or {})}
        self.ledger.clear()
        self.events.clear()
        self.runtime = {}
        core = self.job.core
        instances = [(name, name) for name in ("rollout", "trainer", "monitor", "eval_fleet")]
        instances.append(("weight_sync", "weight-sync"))
        instances += [("engine", f"engine-{i}") for i in range(core.engines)]
        instances += [("engine", f"eval-{i}") for i in range(core.evals)]
        for name, instance in instances:
            self.runtime[instance] = LifecycleMachine(
                specs[name], self.job.config, instance, ledger=self.ledger, log=self.log
            )

    def observe(self, t: Transition, before: Node) -> None:
        if t.action.name == "fault.driver_death":  # a new driver: new machines, every one in Init (kept ones too)
            self.on_start()
            return
        ledger_before = len(self.ledger)
        self.events.clear()
        for m in t.moves:
            machine = self.runtime[m.instance]
            assert machine.state == m.src, f"{m.instance}: runtime in {machine.state}, the core moved it from {m.src}"
            result = machine.fire(m.trigger)
            assert result.ok, f"{m.instance}.{m.trigger} blocked at runtime by {result.blocked_by}"
            assert (result.src, result.dst, result.effects) == (m.src, m.dst, m.effects), (m, result)
        # the ledger gained exactly the step's effects, in order, attributed to the right instance
        gained = [(e.instance, e.trigger, e.effect) for e in list(self.ledger)[ledger_before:]]
        assert gained == [(m.instance, m.trigger, e) for m in t.moves for e in m.effects]
        logged = [
            (e["instance"], e["trigger"], e["src"], e["dst"], tuple(e["effects"]))
            for e in self.events
            if e["event"] == TRANSITION
        ]
        assert logged == [(m.instance, m.trigger, m.src, m.dst, m.effects) for m in t.moves]


def make_runtime_machine(
    machines: Mapping[str, MachineSpec] | None = None,
    configs: Sequence[LifecycleConfig] | None = None,
    engines: Sequence[int] = ENGINE_COUNTS,
) -> type[JobModelBase]:
    """The checker's machine whose every move also drives (and is compared with) the transitions machines."""
    cls = make_machine(machines, configs, engines, base=RuntimeVsModelBase)

    class RuntimeVsModel(cls):  # type: ignore[valid-type,misc]
        @invariant()
        def runtime_matches_model(self) -> None:
            assert self.state is not None
            s = self.state.job
            predicted = {"rollout": s.rollout, "trainer": s.trainer, "monitor": s.monitor, "eval_fleet": s.fleet}
            predicted["weight-sync"] = s.sync
            predicted |= {f"engine-{i}": e.state for i, e in enumerate(s.engines)}
            predicted |= {f"eval-{i}": e.state for i, e in enumerate(s.evals)}
            actual = {name: m.state for name, m in self.runtime.items()}
            assert actual == predicted

    return RuntimeVsModel


TRAIN_ONLY_FT = configs_where(ft_enabled=True, train_ft=True, rollout_ft=False)
REPLAY = configs_where(replay=True)
ROLLOUT_RECOVERY = frozenset({"recover_engine", "start_monitor", "probe_engine", "arm_ci_fault_injection"})


def train_only_ft_machine(machines=None) -> type[JobModelBase]:
    """``--use-fault-tolerance --ft-components train``: nothing rollout-side recovers or monitors."""

    class TrainOnlyFT(make_machine(machines, TRAIN_ONLY_FT)):
        def observe(self, t: Transition, before: Node) -> None:
            for m in t.moves:
                # probe_engine is the monitor's probe; the eval fleet probing itself is expected here
                forbidden = ROLLOUT_RECOVERY - ({"probe_engine"} if m.machine == "eval_fleet" else set())
                bad = forbidden & set(m.effects)
                assert not bad, f"{m.instance}.{m.trigger} performed {sorted(bad)} under train-only FT\n{self.where()}"

        @invariant()
        def no_rollout_recovery_state(self) -> None:
            assert self.state is not None
            s = self.state.job
            assert not any(e.state == "Recovering" for e in s.engines), f"an engine is Recovering: {s.engines}"
            assert s.monitor in ("Init", "Stopped"), f"a rollout monitor is {s.monitor} under train-only FT"

    return TrainOnlyFT


def replay_machine(machines=None) -> type[JobModelBase]:
    """``--load-debug-rollout-data``: the job never constructs, starts servers, monitors or a fleet."""

    class Replay(make_machine(machines, REPLAY)):
        def observe(self, t: Transition, before: Node) -> None:
            for m in t.moves:
                bad = NEVER_IN_REPLAY & set(m.effects)
                assert not bad, f"{m.instance}.{m.trigger} performed {sorted(bad)} while replaying\n{self.where()}"

        @invariant()
        def nothing_built(self) -> None:
            assert self.state is not None
            s = self.state.job
            assert s.rollout in ("Init", "Replay"), s.rollout
            assert s.monitor == "Init" and s.fleet == "Init"
            assert all(e.state == "Init" for e in s.engines)

    return Replay
