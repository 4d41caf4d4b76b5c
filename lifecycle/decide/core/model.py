"""The values the core computes with: the job's state, what comes in, what goes out.

Everything is an immutable tuple, so a state is a dictionary key for the checker and a snapshot
for the runtime; nothing here does I/O or knows about time except through the ``now`` an event
carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from lifecycle.decide.names import (
    EngineStateName,
    FleetStateName,
    MachineName,
    MonitorStateName,
    OperationName,
    RolloutStateName,
    StateName,
    TrainerStateName,
    Trigger,
    WeightSyncStateName,
)

# What an engine's transfer_weights loads: the weights every current engine holds, or the trainer's new ones;
# and how, where not from their checkpoint: the weight-update group broadcasts them (Command.weights, .via).
COMMITTED_WEIGHTS, PENDING_WEIGHTS, BROADCAST = "committed", "pending", "broadcast"
ROLLOUT, EVAL = "rollout", "eval"  # the two engine groups: rollout engines and the eval fleet's
GROUP_PREFIX = {ROLLOUT: "engine", EVAL: "eval"}  # instance names: engine-0, eval-0, ...


class EngineState(NamedTuple):
    """One engine slot as the lifecycle knows it: its machine state plus the facts invariants read."""

    state: EngineStateName = "Init"
    current: bool = False  # holds the committed weight version
    fresh: bool = False  # took the weight update now in flight (becomes current when it is committed)
    released: frozenset[str] = frozenset()  # memory tags released and not yet resumed
    restarts: tuple[float, ...] = ()  # when its restarts happened, for the budget window
    joined: bool = False  # its current process is a member of the weight-update group (broadcast mode)
    mixed: bool = False  # a failed broadcast left it a mix of two versions: it reloads the committed ones first
    # the generation of its process: a new one at every launch (start, restart). News names the generation it is
    # about; news of an older one (a late death report, a probe sent to the process before) is never acted on.
    epoch: int = 0
    kept: bool = False  # a previous driver's process may still run in this slot (its ledger says so): adopt it
    # another process answers at its address now (an external engine's owner restarted it): once the old one is let
    # go, the slot attaches the new one as a new generation, which catches up before it is routed
    replaced: bool = False
    # an elastic fleet: a notice or a retirement took it out of the membership; it retires as soon as its state has a
    # retire move (now, at the engine lock's release, or at the next reconcile). A launch clears it (a fresh state).
    leaving: bool = False


class Command(NamedTuple):
    """An effect the shells must carry out: ``effect`` of ``machine[instance]`` (an engine: group and index)."""

    effect: str
    machine: str
    instance: str
    group: str | None = None
    engine: int | None = None
    delay: float = 0.0  # wait this long first (a restart's backoff)
    lane: str = "news"  # the operation lane it belongs to ("news": a report's consequence)
    weights: str = ""  # an engine's transfer_weights: what it loads (COMMITTED_WEIGHTS or PENDING_WEIGHTS)
    via: str = ""  # how, where another shell than the engine's carries it out (BROADCAST: the update group)
    # a weight-update group's call (elastic only, else 0): the group generation it is for; the shell names the
    # rendezvous by it and an engine refuses a bucket of another one; a result of an older one is fenced
    generation: int = 0

    @property
    def handler(self) -> str:
        """The name a shell binds its handler to (``Runner.provide``): ``machine.effect``, or
        ``machine.effect.via`` -- a broadcast member's receive is the weight-update group's, not the engine's."""
        return f"{self.machine}.{self.effect}.{self.via}" if self.via else f"{self.machine}.{self.effect}"


@dataclass(frozen=True, slots=True)
class Failure:
    """Why the run stopped, as fields the shells read (never a message they parse): which part, where, why.

    ``str()`` is the one-line message: the reason, or ``engine-0 failed`` where the part's own move says it.
    """

    machine: str  # the part that failed: a spec's name (engine, rollout, trainer, ...) or "router"
    instance: str  # engine-0, eval-1, rollout, trainer, weight-sync, router-rollout
    state: str  # the state it was in when it failed (a failing move's source); "" for a part with no machine
    reason: str = ""  # the message, for people (``engine-0: process still alive after SIGKILL (...)``); "" when
    # the part's own failing move says it all (its fail, give_up, servers_failed: ``engine-0 failed``)
    fix: str = ""  # what the user can change, where the core knows it

    def __str__(self) -> str:
        return self.reason or f"{self.instance} failed"


class JobState(NamedTuple):
    """Every machine's state, the engines' facts, and the operations in flight (one per lane)."""

    rollout: RolloutStateName = "Init"
    trainer: TrainerStateName = "Init"
    monitor: MonitorStateName = "Init"
    fleet: FleetStateName = "Init"
    engines: tuple[EngineState, ...] = ()
    evals: tuple[EngineState, ...] = ()
    lock: bool = False  # the engine lock: held exactly while the rollout side updates weights
    committed: bool = False  # some weights are committed (the initial ones count): there is something to load
    dirty: bool = False  # a weight update failed and was not redone: engines may disagree
    ci_pending: bool = False  # --ci-test armed a fault for the first generate
    rollout_op: str = ""  # the operation in flight on the rollout lane ("" = none)
    rollout_program: tuple[str, ...] = ()  # its phases still to run
    trainer_op: str = ""
    trainer_program: tuple[str, ...] = ()
    awaiting: tuple[Command, ...] = ()  # commands given to the shells whose results have not come back
    failed: Failure | None = None  # the run stopped fast: who failed, where, why
    sync: WeightSyncStateName = "Init"  # the weight-update process group (broadcast mode)
    ahead: bool = False  # the trainer trained since the last commit: its weights are not the served ones yet
    # --fully-async only (their defaults elsewhere, so a job without a stream keeps its exact states):
    version: int = 0  # the committed weight version: the one durable source, advanced by a commit and nothing else
    # the buffered groups' staleness, ascending: the version minus the version of a group's oldest token, at most
    # --max-weight-staleness + 1 (every staler group is alike) and at least -1 (a group newer than the version: it
    # went backwards)
    buffer: tuple[int, ...] = ()
    taken: tuple[int, ...] = ()  # the staleness of the groups the trainer is training on now (from its take)
    # a resumed stream, until its workers' restore: the job checkpoint's version, then its buffered groups' oldest
    # versions (Core.with_checkpoint)
    resuming: tuple[int, ...] = ()
    # an elastic fleet only (their defaults elsewhere, so a fleet without bounds keeps its exact states):
    target: int = 0  # the members wanted: set by scale_rollout, one less per retire_engine; a notice keeps it
    sync_generation: int = 0  # the weight-update group's generation: one more at every connect

    def group(self, group: str) -> tuple[EngineState, ...]:
        return self.engines if group == ROLLOUT else self.evals


class Move(NamedTuple):
    """One machine event the core fired (the runtime replays it on a ``transitions`` machine and logs it)."""

    machine: MachineName
    instance: str
    trigger: Trigger
    src: StateName
    dst: StateName
    effects: tuple[str, ...]


class Op(NamedTuple):
    """An operation a training loop calls (``generate``, ``update_weights``, ``stop_engine`` of engine 1, ...)."""

    name: OperationName
    engine: int | None = None
    now: float = 0.0
    # scale_rollout: the new target, in engines (not `count`: a tuple has that method already)
    target: int | None = None


class Fact(NamedTuple):
    """What a shell's I/O did (the version a server reported, a tag it released), for the event log only.

    The core never reads facts; the runner logs a command's facts when it reports the command's result, in
    the order the core gave the commands out, so the log stays deterministic however the I/O interleaves.
    """

    event: str
    fields: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, event: str, **fields: Any) -> Fact:
        return cls(event, tuple(fields.items()))

    def done_at(self, ts: str) -> Fact:
        """Stamped with the time its I/O was done: it is logged later, with its batch of commands, and a judge of
        the log (``engine.routed``: was the engine Serving *then*?) must not mistake the one time for the other."""
        return self._replace(fields=(*self.fields, ("done_at", ts)))


class Outcome(NamedTuple):
    """What a shell reports: a command's result, or news (an engine died, a probe threshold was reached).

    ``name`` is a command's result (:data:`lifecycle.decide.core.plan.RESULTS`) or news
    (:data:`lifecycle.decide.core.plan.NEWS`);
    engine outcomes name the group and index.
    """

    name: str
    group: str | None = None
    engine: int | None = None
    reason: str = ""
    now: float = 0.0
    facts: tuple[Fact, ...] = ()  # logged with the result, never judged by the core
    # news: the engine generation it is about (EngineState.epoch); None for "the process it has now" (a shell that
    # cannot tell). A command's result needs none: it answers a command the core is awaiting, from this driver.
    epoch: int | None = None
    # news group_done (the stream completed a group): the weight version of the group's oldest token
    version: int | None = None


class Completed(NamedTuple):
    """The results of commands the core handed out, in the order it handed them out (one outcome each)."""

    results: tuple[tuple[Command, Outcome], ...]
    now: float = 0.0


Event = Op | Outcome | Completed


class Refusal(NamedTuple):
    """Why an operation did not happen.

    ``kind``: ``blocked`` (a predicate is false: the operation does not apply to this config),
    ``not_applicable`` (nothing to do in this state, e.g. onload without an offload), ``busy`` (its
    lane runs another operation), ``illegal`` (not allowed in this state: a loop bug), ``failed``
    (the run has stopped).
    """

    kind: str
    reason: str
    blocked_by: tuple[str, ...] = ()


class BlockedMove(NamedTuple):
    """A machine event a guard refused (the event log's ``lifecycle.blocked``): why a move did not happen."""

    machine: str
    instance: str
    trigger: str
    state: str
    blocked_by: tuple[str, ...]
    guards: tuple[tuple[str, bool], ...]
    after: int = 0  # how many of the step's moves came before it (the event log keeps the order)


class Fenced(NamedTuple):
    """News about an older generation of an engine, not acted on (the event log's ``lifecycle.fenced``): the
    machine event it would have fired, and both generations."""

    machine: str
    instance: str
    trigger: str
    state: str
    news: str  # the outcome's name (died, threshold_reached, ...)
    epoch: int  # the generation the news is about
    current: int  # the engine's generation now
    after: int = 0  # how many of the step's moves came before it


class Result(NamedTuple):
    """What one event did: the next state, the moves fired, the commands to carry out, or a refusal."""

    state: JobState
    moves: tuple[Move, ...] = ()
    commands: tuple[Command, ...] = ()
    refused: Refusal | None = None
    blocked: tuple[BlockedMove, ...] = ()
    commits: bool = False  # weights were committed: the trainer's pending ones (if any) are the served ones now
    fenced: tuple[Fenced, ...] = ()  # news of an older engine generation, not acted on

    @property
    def ok(self) -> bool:
        return self.refused is None


def instance_name(group: str, index: int) -> str:
    return f"{GROUP_PREFIX[group]}-{index}"


# -- changed copies, built directly ---------------------------------------------------------------------------------
# A NamedTuple's ``_replace`` is Python-level (a keyword dict, ``map(kwds.pop, ...)``) even in the compiled build, and
# the checker takes ~10^6 steps that each change a few fields: these build the tuple directly (a field left None is
# kept; none of them sets a field to None), about 3x cheaper compiled.
def engine_with(
    e: EngineState,
    *,
    state: EngineStateName | None = None,
    current: bool | None = None,
    fresh: bool | None = None,
    released: frozenset[str] | None = None,
    restarts: tuple[float, ...] | None = None,
    joined: bool | None = None,
    mixed: bool | None = None,
    epoch: int | None = None,
    kept: bool | None = None,
    replaced: bool | None = None,
    leaving: bool | None = None,
) -> EngineState:
    """``e`` with the fields given changed."""
    return EngineState(
        e.state if state is None else state,
        e.current if current is None else current,
        e.fresh if fresh is None else fresh,
        e.released if released is None else released,
        e.restarts if restarts is None else restarts,
        e.joined if joined is None else joined,
        e.mixed if mixed is None else mixed,
        e.epoch if epoch is None else epoch,
        e.kept if kept is None else kept,
        e.replaced if replaced is None else replaced,
        e.leaving if leaving is None else leaving,
    )


def job_with(
    job: JobState,
    *,
    engines: tuple[EngineState, ...] | None = None,
    evals: tuple[EngineState, ...] | None = None,
    rollout_program: tuple[str, ...] | None = None,
    awaiting: tuple[Command, ...] | None = None,
    version: int | None = None,
    resuming: tuple[int, ...] | None = None,
    target: int | None = None,
    sync_generation: int | None = None,
) -> JobState:
    """``job`` with the fields given changed (the ones the core and the checker change outside a step's draft)."""
    return JobState(
        job.rollout,
        job.trainer,
        job.monitor,
        job.fleet,
        job.engines if engines is None else engines,
        job.evals if evals is None else evals,
        job.lock,
        job.committed,
        job.dirty,
        job.ci_pending,
        job.rollout_op,
        job.rollout_program if rollout_program is None else rollout_program,
        job.trainer_op,
        job.trainer_program,
        job.awaiting if awaiting is None else awaiting,
        job.failed,
        job.sync,
        job.ahead,
        job.version if version is None else version,
        job.buffer,
        job.taken,
        job.resuming if resuming is None else resuming,
        job.target if target is None else target,
        job.sync_generation if sync_generation is None else sync_generation,
    )


def command_with(
    cmd: Command, *, instance: str | None = None, engine: int | None = None, generation: int | None = None
) -> Command:
    """``cmd`` with the fields given changed (the checker renames engines and makes generations relative)."""
    return Command(
        cmd.effect,
        cmd.machine,
        cmd.instance if instance is None else instance,
        cmd.group,
        cmd.engine if engine is None else engine,
        cmd.delay,
        cmd.lane,
        cmd.weights,
        cmd.via,
        cmd.generation if generation is None else generation,
    )
