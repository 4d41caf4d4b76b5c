"""The lifecycle core: ``step(state, event) -> (state', moves, commands)`` or a refusal. Pure.

The checker (:mod:`lifecycle.check.explore`) explores exactly this function over every operation order,
every command result and every fault; the runtime (:class:`lifecycle.decide.runner.Runner` with the shells
in ``engines/``, ``rollout/``, ``trainer/``) calls it for every operation and every report, carries
out the commands it returns and reports their results back. Each rule is written once, in this package:

* a machine moves only by its spec (:meth:`MachineSpec.compile`); guards are the named predicates;
* couplings: which engine moves go with a rollout-manager move (``ENGINE_PLAN``), what the core does with
  each effect -- moves another machine, labels the move, or hands a shell a command (``EFFECT_TABLE``) -- and
  with each result of a command (``RESULT_TABLE``), the snapshot rule (``SNAPSHOT``), an engine that may not be
  recovered fails at once (its spec's ``fail`` guard), the restart budget, which weights each engine loads;
* operations are programs of phases (:mod:`.plan`, the core's own phases: ``PHASES``), continued as the
  commands they wait for come back.

Here: :class:`Core`, the compiled machines of one config and the step function over them. A step in progress
is a :class:`~.step.StepDraft`; the rules are functions of it, by concern (the package's modules).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple, Protocol

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import operations, reports
from lifecycle.decide.core.engines import next_delay
from lifecycle.decide.core.model import (
    BROADCAST,
    ROLLOUT,
    Completed,
    EngineState,
    Event,
    JobState,
    Op,
    Result,
    engine_with,
    job_with,
)
from lifecycle.decide.core.parts import PARTS
from lifecycle.decide.core.plan import ELASTIC_PHASES, ENGINE_PLAN, OPERATIONS, SNAPSHOT
from lifecycle.decide.core.step import StepDraft
from lifecycle.decide.core.tables import COUPLED, DISPATCH, EFFECT_TABLE, LEDGER_ONLY, Handling
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.predicates import eval_fleet_enabled
from lifecycle.decide.spec import CompiledSpec, MachineSpec, Step

__all__ = ["COUPLED", "DISPATCH", "EFFECT_TABLE", "LEDGER_ONLY", "Core", "Handling", "JobView", "next_delay"]


class JobView(Protocol):
    """What the rules read of a job: a :class:`JobState`, or the state so far of a step in progress (a JobDraft)."""

    @property
    def rollout(self) -> str: ...

    @property
    def monitor(self) -> str: ...

    @property
    def engines(self) -> tuple[EngineState, ...]: ...

    @property
    def sync(self) -> str: ...

    def group(self, group: str) -> tuple[EngineState, ...]: ...


class Core:
    """The compiled machines of one config, and the step function over them."""

    def __init__(
        self,
        config: LifecycleConfig,
        *,
        engines: int | None = None,
        evals: int | None = None,
        machines: Mapping[str, MachineSpec] | None = None,
        initial: int | None = None,
    ) -> None:
        """``engines``: the rollout slots (default: the config's --rollout-max-num-gpus in engines, else its fleet);
        ``initial``: how many of them start (an elastic fleet's --rollout-num-gpus; without bounds: every slot)."""
        self.config = config
        self.specs: dict[str, MachineSpec] = {**MACHINES, **(machines or {})}
        self.compiled: dict[str, CompiledSpec] = {
            part: self.specs[name].compile(config) for part, name in PARTS.items()
        }
        self.predicates: dict[str, bool] = dict(self.compiled["engine"].values)
        self.engines = config.max_rollout_engines if engines is None else engines
        # an elastic fleet (--rollout-min/max-num-gpus): slots beyond the initial fleet stay Init until a join
        self.elastic = self.predicates["elastic"]
        if initial is None:
            initial = min(config.num_rollout_engines, self.engines) if self.elastic else self.engines
        if not 0 <= initial <= self.engines or (initial != self.engines and not self.elastic):
            raise ValueError(f"{initial} initial engines of {self.engines} slots (only an elastic fleet starts fewer)")
        self.initial_engines = initial
        self.min_engines = min(config.min_rollout_engines, initial) if self.elastic else 0
        self.programs: dict[str, tuple[str, ...]] = {
            name: tuple(p for p in op.program if self.elastic or p not in ELASTIC_PHASES)
            for name, op in OPERATIONS.items()
        }
        default_evals = config.num_eval_engines if eval_fleet_enabled(config) else 0
        self.evals = default_evals if evals is None else evals
        engine, rollout, trainer = self.specs["engine"], self.specs["rollout"], self.specs["trainer"]
        # the state groups, read off the specs' tags (never typed out by hand)
        self.live = engine.tagged("live")
        self.marked = frozenset(st.name for st in engine.states if st.marked)
        self.monitor_live = self.specs["monitor"].tagged("live")
        self.transient = engine.tagged("transient")
        self.gone = engine.tagged("gone")
        self.leaving_states = engine.tagged("leaving")  # on their way out: never in a snapshot, never counted
        self.rollout_busy = rollout.tagged("busy")
        self.rollout_updating = rollout.tagged("updating")
        self.rollout_streams = rollout.tagged("streaming")  # where the trainer takes groups
        self.trainer_busy = trainer.tagged("busy")
        self.releases = {s.name: s.releases for s in engine.states}
        self.updating_engine = frozenset(s for s in self.transient if s in self.live)  # receiving weights
        self.markable = frozenset(s for t in engine.transitions if t.trigger == "mark_unhealthy" for s in t.source)
        self.tracks_ahead = self.predicates["updates_rollout_weights"] and self.predicates["saves_job"]
        # --fully-async: the staleness bound, and the engine states an in-flight update pauses before it begins
        self.streaming = self.predicates["streaming"]
        self.bound = config.max_weight_staleness if self.streaming and config.max_weight_staleness is not None else 0
        engine_table = self.compiled["engine"].table
        self.paused_first = frozenset(
            s
            for when, trigger, states in ENGINE_PLAN.get("begin_update", ())
            if when == "before"
            for s in states
            if isinstance(engine_table.get((s, trigger)), Step)
        )
        # per part: the environment events that news of an older engine generation never fires (the specs say which)
        self.fenced: dict[str, frozenset[str]] = {part: self.specs[name].fenced for part, name in PARTS.items()}
        self._effects: dict[tuple[str, tuple[str, ...]], MoveEffects] = {}

    # -- the public surface ---------------------------------------------------------------------------
    def initial(self) -> JobState:
        return JobState(
            engines=(EngineState(),) * self.engines,
            evals=(EngineState(),) * self.evals,
            target=self.initial_engines if self.elastic else 0,
        )

    def with_restarts(self, state: JobState, restarts: tuple[tuple[float, ...], ...]) -> JobState:
        """A resumed job's rollout engines, still unstarted, with the restarts their budget window counts."""
        if len(restarts) != len(state.engines):
            raise ValueError(f"restart budgets for {len(restarts)} engines, but the job has {len(state.engines)}")
        if any(e.state != "Init" for e in state.engines):
            raise ValueError("restart budgets are restored before the first operation, not after")
        return job_with(
            state, engines=tuple(engine_with(e, restarts=r) for e, r in zip(state.engines, restarts, strict=True))
        )

    def with_kept(self, state: JobState, epochs: tuple[int | None, ...], floor: int = 0) -> JobState:
        """A resumed job's rollout slots as the run directory's engine ledger left them: the generation each
        slot's process had (None: no process of it may still run). A slot with one is adopted, not launched
        (``keeps_engines``); the others start at the latest generation ever used in the run directory (the
        ledger's, or ``floor``: what the event log records, whichever is higher), so no epoch is ever reused."""
        if len(epochs) != len(state.engines):
            raise ValueError(f"ledger entries for {len(epochs)} engines, but the job has {len(state.engines)}")
        if any(e.state != "Init" for e in state.engines):
            raise ValueError("kept engines are adopted before the first operation, not after")
        if any(k is not None for k in epochs) and not self.predicates["keeps_engines"]:
            raise ValueError("this job keeps no engines (--detach-engines, with --save): none can be adopted")
        floor = max([floor, *(k for k in epochs if k is not None)])
        return job_with(
            state,
            engines=tuple(
                engine_with(e, epoch=floor if k is None else k, kept=k is not None)
                for e, k in zip(state.engines, epochs, strict=True)
            ),
        )

    def with_target(self, state: JobState, target: int) -> JobState:
        """A resumed elastic job's target (its job checkpoint's): the fleet starts as configured and the first
        boundary (a generate, a stream, the trainer's update) joins or retires members to reach it."""
        if not self.elastic:
            raise ValueError("this job has no elastic fleet (--rollout-min/max-num-gpus): it has no target to restore")
        if not self.min_engines <= target <= self.engines:
            raise ValueError(
                f"a target of {target} engines is outside the fleet's bounds {self.min_engines}..{self.engines}"
            )
        if state.rollout != "Init":
            raise ValueError("a target is restored before the first operation, not after")
        return job_with(state, target=target)

    def with_checkpoint(self, state: JobState, version: int, oldest: tuple[int, ...] = ()) -> JobState:
        """A resumed stream's job checkpoint: its committed version and the oldest-token version of each group it
        buffered. The workers' restore publishes them (the trainer's ``restored``): the version first, then each
        group's staleness against it -- so the resumed stream enforces the bound the interrupted one did."""
        if not self.streaming:
            raise ValueError("this job does not stream (--fully-async): its checkpoint holds no stream")
        if state.trainer != "Init" or state.rollout != "Init":
            raise ValueError("a checkpoint is restored before the first operation, not after")
        if version < 0 or any(o > version for o in oldest):
            raise ValueError(f"a checkpoint's groups are never newer than its version {version}: {oldest}")
        return job_with(state, resuming=(version, *oldest))

    def step(self, state: JobState, event: Event) -> Result:
        """The job's next state, the moves and the commands one event makes -- or its refusal (state unchanged)."""
        step = StepDraft(self, state, event.now)
        if isinstance(event, Op):
            operations.start(step, event)
        elif isinstance(event, Completed):
            reports.completed(step, event)
        else:
            reports.news(step, event)
        if step.refused is not None:
            return Result(state, (), (), step.refused, tuple(step.blocked))
        operations.run_programs(step)
        return Result(
            step.job.freeze(),
            tuple(step.moves),
            tuple(step.commands),
            None,
            tuple(step.blocked),
            step.commits,
            tuple(step.fenced),
        )

    def effects_of(self, machine: str, effects: tuple[str, ...]) -> MoveEffects:
        """What a move's effects do to an engine's facts and which of them are commands (cached per move)."""
        key = (machine, effects)
        fx = self._effects.get(key)
        if fx is None:
            launch, add, drop = False, set[str](), set[str]()
            for effect in effects:
                if effect == "launch_engine":
                    launch, add, drop = True, set(), set()
                elif effect in ("release_weights", "release_kv_cache"):
                    tag = effect.removeprefix("release_")
                    add.add(tag)
                    drop.discard(tag)
                elif effect in ("resume_weights", "resume_kv_cache"):
                    tag = effect.removeprefix("resume_")
                    drop.add(tag)
                    add.discard(tag)
            commands = tuple(e for e in effects if self.is_command(machine, e))
            fx = self._effects[key] = MoveEffects(commands, launch, frozenset(add), frozenset(drop))
        return fx

    def is_command(self, machine: str, effect: str) -> bool:
        """Whether an effect of ``machine`` is work the shells carry out (else the core did it, or it is a label);
        an effect the table does not know (a mutated spec's) is a command: the runner finds it unbound."""
        handling = DISPATCH.get((machine, effect))
        return handling is None or handling.kind == "command"

    def commands(self) -> frozenset[tuple[str, str]]:
        """Every (machine, effect) this config can hand to the shells: what a runtime must bind to handlers
        (``f"{machine}.{effect}"``; a broadcast member's receive is ``transfer_weights.broadcast``: see
        :attr:`Command.handler`)."""
        out: set[tuple[str, str]] = set()
        for part, compiled in self.compiled.items():
            machine = PARTS[part]
            _, effects = compiled.reachable()
            out.update((machine, e) for e in effects if self.is_command(machine, e))
        if self.evals and self.predicates["eval_fleet_self_probes"]:
            out.add(("engine", "probe_engine"))
        if self.predicates["ci_injects_rollout_faults"]:
            out.add(("engine", "inject_ci_fault"))
        if self.predicates[
            "broadcasts_weights"
        ]:  # a member's receive: the weight-update group's handler (Command.handler)
            out.add(("engine", f"transfer_weights.{BROADCAST}"))
        if self.elastic:  # the end of every scale operation reads the routers back
            out.add(("rollout", "read_gateway"))
        if not self.engines and not self.evals:
            out = {(m, e) for m, e in out if m != "engine"}
        return frozenset(out)

    def snapshot_ready(self, s: JobView) -> bool:
        """A weight update may begin: every rollout engine still in play is in the snapshot (recovered ones too)."""
        want = SNAPSHOT.get(s.rollout)
        if want is None:
            return False
        return all(
            e.state in want or e.state in self.gone or e.state in self.paused_first or e.state in self.leaving_states
            for e in s.engines
        )

    def staleness(self, version: int, oldest: int) -> int:
        """A group's staleness as the core keeps it: the version minus its oldest token's, in -1..bound+1 (-1: the
        group is newer than the version, which went backwards; bound+1: beyond the bound, however far)."""
        return max(-1, min(self.bound + 1, version - oldest))

    def settled(self, s: JobState) -> bool:
        """No command is out and no operation is in flight: the job waits for the loop's next call."""
        return not s.awaiting and not s.rollout_op and not s.trainer_op

    def monitoring(self, s: JobView) -> bool:
        """A monitor exists (created, paused or running): every live engine is one of its members."""
        return s.monitor in self.monitor_live

    def broadcasting(self, s: JobView) -> bool:
        """The weight-update group is broadcasting: the engines of the update receive from it, not from disk."""
        return s.sync == "Broadcasting"

    def group_members(self, s: JobState) -> tuple[int, ...]:
        """The rollout engines the weight-update group joins (or joined), in rank order."""
        return tuple(i for i, e in enumerate(s.engines) if e.joined)

    def routable(self, s: JobView, group: str = ROLLOUT) -> tuple[int, ...]:
        """The engines requests may go to: Serving only (invariant 4)."""
        return tuple(i for i, e in enumerate(s.group(group)) if e.state == "Serving")

    def leaving(self, e: EngineState) -> bool:
        """An elastic fleet's engine on its way out: a notice or a retirement named it, or it is draining/retiring."""
        return e.leaving or e.state in self.leaving_states

    def members(self, s: JobView) -> tuple[int, ...]:
        """The rollout slots that hold or will hold a member: neither vacant (a gone state) nor leaving. What an
        elastic fleet's ``target`` is compared with (a shell reads it for ``fleet.scaled``)."""
        return tuple(i for i, e in enumerate(s.engines) if e.state not in self.gone and not self.leaving(e))


class MoveEffects(NamedTuple):
    """A move's effects, read once: the commands among them and what they do to the engine's memory facts."""

    commands: tuple[str, ...]
    launch: bool  # a new process: holds no weights, releases nothing (then ``add`` is released again)
    add: frozenset[str]  # memory tags released
    drop: frozenset[str]  # memory tags resumed
