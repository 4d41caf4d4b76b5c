"""One step of the core in progress: the job's state so far, and the moves and commands the step produced.

:class:`StepDraft` holds what every rule needs -- fire one machine event by its spec, hand a shell a command,
move the rollout manager with the engine moves it carries -- and the rules themselves are functions of a
draft, one module per concern: :mod:`.engines`, :mod:`.weights`, :mod:`.trainer`, :mod:`.phases`,
:mod:`.operations`, :mod:`.reports`; :mod:`.tables` says which of them each effect and each result runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lifecycle.decide.core import engines, weights
from lifecycle.decide.core.draft import JobDraft
from lifecycle.decide.core.model import (
    ROLLOUT,
    BlockedMove,
    Command,
    EngineState,
    Failure,
    Fenced,
    JobState,
    Move,
    Refusal,
    engine_with,
    instance_name,
)
from lifecycle.decide.core.parts import INSTANCE, LANES, PART_OF, PARTS, Origin
from lifecycle.decide.core.plan import ENGINE_PLAN
from lifecycle.decide.core.tables import DISPATCH
from lifecycle.decide.spec import Blocked, Step

if TYPE_CHECKING:
    from lifecycle.decide.core.core import Core


class StepDraft:
    """One step in progress: ``job`` is the state so far; ``moves``, ``commands``, ... what the step did."""

    __slots__ = (
        "blocked",
        "commands",
        "commits",
        "core",
        "delay",
        "epoch",
        "fenced",
        "heard",
        "job",
        "lane",
        "moves",
        "now",
        "refused",
        "subject",
    )

    def __init__(self, core: Core, state: JobState, now: float) -> None:
        self.core = core
        self.job = JobDraft(state)
        self.now = now
        self.moves: list[Move] = []
        self.commands: list[Command] = []
        self.blocked: list[BlockedMove] = []
        self.refused: Refusal | None = None
        self.commits = False  # this step committed weights: what the engines took is the served version now
        self.lane = "news"  # whose work the commands produced now are
        self.subject: tuple[str, int] | None = None  # the engine a monitor event is about
        self.delay = 0.0  # the backoff of the launch the next move issues (a restart)
        self.epoch: int | None = None  # the engine generation the news being handled is about (None: the current)
        self.fenced: list[Fenced] = []
        self.heard = ""  # the news being handled (its outcome's name)

    def fail_run(self, failure: Failure) -> None:
        self.job.fail(failure)

    def failure_of(self, cmd: Command, reason: str) -> Failure:
        """A command that could not be carried out at all stops the run: its machine, where it was, and why."""
        state = self.job.state_of(PART_OF[cmd.machine], cmd.group, cmd.engine) if cmd.machine in PART_OF else ""
        return Failure(cmd.machine, cmd.instance, state, reason)

    # -- firing one machine event: its spec step, its commands, its couplings ---------------------------------
    def fire(
        self, part: str, trigger: str, group: str | None = None, i: int | None = None, *, log: bool = False
    ) -> Step | Blocked | None:
        """Move one machine if its spec allows ``trigger`` now; ``log`` records a guard's refusal."""
        job = self.job
        src = job.state_of(part, group, i)
        out = self.core.compiled[part].table.get((src, trigger))
        machine = PARTS[part]
        instance = instance_name(group, i) if group is not None and i is not None else INSTANCE[part]
        if isinstance(out, Blocked):
            if log:
                self.blocked.append(
                    BlockedMove(machine, instance, trigger, src, out.blocked_by, out.guards, len(self.moves))
                )
            return out
        if out is None:
            return None
        if self.epoch is not None and trigger in self.core.fenced[part] and self.stale(part, trigger, src, group, i):
            return None
        fx = self.core.effects_of(machine, out.effects)
        if group is not None and i is not None:
            e = job.engine(group, i)
            dest: Any = out.dest  # a name from the engine spec (the typed names are checked against the specs)
            if fx.launch:  # a new process: a new generation, holding nothing (and in no process group)
                new = EngineState(dest, False, False, fx.add, e.restarts, epoch=e.epoch + 1)
            elif fx.add or fx.drop:
                new = engine_with(e, state=dest, released=(e.released - fx.drop) | fx.add)
            else:
                new = engine_with(e, state=dest)
            job.set_engine(group, i, new)
            leaves = dest in self.core.leaving_states
            if e.joined and (fx.launch or dest not in self.core.live or leaves):
                weights.left_group(self, group, i, planned=leaves and not fx.launch)
        else:
            job.set_machine(part, out.dest)
        names: tuple[Any, ...] = (machine, trigger, src, out.dest)  # spec names: see lifecycle.decide.names
        self.moves.append(Move(names[0], instance, names[1], names[2], names[3], out.effects))
        for effect in fx.commands:
            self.command(Command(effect, machine, instance, group, i))
        phases: tuple[str, ...] = ()
        for effect in out.effects:
            handling = DISPATCH.get((machine, effect))
            if handling is None:
                continue
            if handling.do is not None:
                handling.do(self, Origin(part, group, i, src))
            phases += handling.phases
        if phases:
            self.prepend(self.lane, tuple(phases))
        if group is not None and i is not None and out.dest == "Unhealthy":
            engines.unhealthy(self, group, i)
        return out

    def stale(self, part: str, trigger: str, src: str, group: str | None, i: int | None) -> bool:
        """The news being handled is about an older generation of its engine: the move is fenced, on the record."""
        where = (group, i) if group is not None and i is not None else self.subject
        if where is None:
            return False
        e = self.job.engine(*where)
        if self.epoch == e.epoch:
            return False
        instance = instance_name(group, i) if group is not None and i is not None else INSTANCE[part]
        fenced = Fenced(PARTS[part], instance, trigger, src, self.heard, self.epoch or 0, e.epoch, len(self.moves))
        self.fenced.append(fenced)
        return True

    def command(self, cmd: Command) -> None:
        """Hand a shell a command, stamped with this step's lane (and a launch's backoff, a load's weights)."""
        delay = self.delay if cmd.effect == "launch_engine" else 0.0
        loads, via = (
            weights.loads(self, cmd.group) if cmd.effect == "transfer_weights" and cmd.machine == "engine" else ("", "")
        )
        generation = self.job.sync_generation if cmd.machine == "weight_sync" else 0
        cmd = Command(
            cmd.effect, cmd.machine, cmd.instance, cmd.group, cmd.engine, delay, self.lane, loads, via, generation
        )
        self.commands.append(cmd)
        self.job.commands_out.append(cmd)

    def prepend(self, lane: str, phases: tuple[str, ...]) -> None:
        """Phases to run next in ``lane``'s operation, before the rest of its program."""
        if lane in LANES:
            self.job.set_lane(lane, program=(*phases, *self.job.program(lane)))

    def composite(self, trigger: str, *, log: bool = False, broadcast: bool = False) -> Step | Blocked | None:
        """A rollout-manager move with the engine moves ``ENGINE_PLAN`` attaches to it (``broadcast``: the
        group's broadcast goes out between the two, so its result is the first to come back)."""
        out = self.core.compiled["rollout"].table.get((self.job.rollout, trigger))
        if not isinstance(out, Step):
            return self.fire("rollout", trigger, log=log)
        plan = ENGINE_PLAN.get(trigger, ())
        for when, engine_trigger, states in plan:
            if when == "before":
                self.engines_do(ROLLOUT, engine_trigger, states)
        out = self.fire("rollout", trigger)
        if broadcast:
            self.fire("sync", "broadcast")
        for when, engine_trigger, states in plan:
            if when == "after":
                self.engines_do(ROLLOUT, engine_trigger, states)
        return out

    def engines_do(self, group: str, trigger: str, states: frozenset[str]) -> None:
        """Fire ``trigger`` on every engine of ``group`` in one of ``states``."""
        for j, e in enumerate(self.job.group(group)):
            if e.state in states:
                self.fire("engine", trigger, group, j)
