"""The checker's world: real processes, reduced to what the lifecycle can observe of them, around the core.

The core (:mod:`lifecycle.decide.core`) never sees a process; it sees operations, reports and the results
of its commands. The checker supplies all of them, for every choice the world could make: a loop
calls any operation the core allows, a command's result follows the engine process's health (an
answer from a live process; a failed request from a dead or hung one) or a fault (a refused load,
a trainer worker crash, a shell error), and faults strike at any time (SIGKILL, a hang, an HTTP
server death). A step of the checker is one ``Core.step``: the function the runtime calls.

A node is the job's state plus the world's: each engine process's health and the faults used.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import NamedTuple, cast

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import (
    EVAL,
    OPERATIONS,
    RESULTS,
    ROLLOUT,
    Command,
    Completed,
    Core,
    EngineState,
    Event,
    JobState,
    Move,
    Op,
    Outcome,
)
from lifecycle.decide.core.model import command_with, engine_with, job_with
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.names import OperationName
from lifecycle.decide.predicates import elastic
from lifecycle.decide.spec import MachineSpec

# An engine process's health as the world knows it (the core learns it only through reports).
UP, DEAD, HUNG, DEAD_NOTIFIED, KILLING = "up", "dead", "hung", "dead-notified", "killing"
# Operations the checker calls: every one a loop may call, but dispose (it ends a run; the runtime tests cover it).
EXPLORED_OPS: tuple[OperationName, ...] = tuple(
    cast(OperationName, name) for name in OPERATIONS if not name.endswith("dispose")
)
ENGINE_OPS = ("stop_engine", "start_engine", "retire_engine")
# An elastic fleet's operations (offered only where the config has bounds): a scale by one engine either way and a
# retirement are bounded like faults -- they share the run's fault budget with the preemption notices, so a run
# explores at most that many membership changes besides its faults (design: a third of the states, not ten times)
ELASTIC_OPS = frozenset({"scale_rollout", "retire_engine"})
BUDGETED_OPS = frozenset({"stop_engine", "retire_engine", "scale_rollout"})
# stop_routing and hold_routing talk to the router, not to the engine: no engine fault changes their answer
# (a router fault is news)
# hand_back_requests talks to the stream, which re-sends what it holds a record of, whatever the engine's health
# drain_requests only starts the shell's watch of a withdrawn engine (the drain's end is the news drained)
_SURE = frozenset(
    {
        "allocate_workers",
        "init_model",
        "offload_train",
        "onload_train",
        "stop_routing",
        "hold_routing",
        "hand_back_requests",
        "drain_requests",
    }
)
# the trainer's commands: their plain success, and those during which the checker lets a worker crash
_SUCCESS = {
    "train_step": "trained",
    "save_checkpoint": "saved",
    "replace_worker": "healed",
    "save_job_state": "checkpointed",
    "restore_job_state": "restored",
}
# News an engine's earlier generation may still send after it was replaced: a death report, a probe verdict, a
# failed request. The checker sends each about the generation before the engine's current one (never a fault:
# a fenced report changes nothing, so it adds no state; one acted on is a violation).
STALE_NEWS = ("died", "threshold_reached", "request_failed")
_MAY_CRASH = frozenset({"train_step", "save_checkpoint", "transfer_weights", "save_job_state", "restore_job_state"})
# --fully-async: while the stream runs (an update pauses it, keeping its requests), an engine that generates or holds
# kept requests may complete a group, of any staleness up to one beyond the bound (its oldest token may be that old:
# an over-approximation, so every staleness the take can meet is met). The buffer holds at most this many groups
# (taken ones count until trained): every larger buffer repeats what two groups of different staleness show.
STREAM_STATES = frozenset({"Streaming", "PausedForUpdate", "StreamCatchingUp"})
_GENERATING = frozenset({"Serving", "Paused", "UpdatingInFlight"})
BUFFERED_GROUPS = 2


class World(NamedTuple):
    procs: tuple[str, ...] = ()  # rollout engine processes
    eval_procs: tuple[str, ...] = ()
    faults: int = 0  # faults injected so far (bounded by the checker)
    # broadcast mode only (empty otherwise), one flag per rollout engine process:
    grouped: tuple[bool, ...] = ()  # the process joined the weight-update group that exists now
    torn: tuple[bool, ...] = ()  # the process holds a mix of two weight versions (a broadcast failed midway)
    # --detach-engines, a resumed job: the driver may die anywhere, and its engines live on
    voided: bool = False  # a version was committed after the last job checkpoint (a resume voids it)
    clean: tuple[bool, ...] = ()  # after a driver's death, per rollout process: holds the checkpoint's version, whole
    # a resumed stream: the staleness of the groups the last job checkpoint buffered (the next driver restores them)
    saved: tuple[int, ...] = ()

    def group(self, group: str) -> tuple[str, ...]:
        return self.procs if group == ROLLOUT else self.eval_procs

    # the exploration builds ~10^6 worlds: a constructor call costs a third of ``_replace``'s
    def counted(self, more: int) -> World:
        """This world with ``more`` faults spent."""
        if not more:
            return self
        w = self
        return World(w.procs, w.eval_procs, w.faults + more, w.grouped, w.torn, w.voided, w.clean, w.saved)

    def with_procs(self, group: str, procs: tuple[str, ...]) -> World:
        if group == ROLLOUT:
            return World(
                procs, self.eval_procs, self.faults, self.grouped, self.torn, self.voided, self.clean, self.saved
            )
        return World(self.procs, procs, self.faults, self.grouped, self.torn, self.voided, self.clean, self.saved)


def _world_with(
    w: World,
    *,
    grouped: tuple[bool, ...] | None = None,
    torn: tuple[bool, ...] | None = None,
    voided: bool | None = None,
    clean: tuple[bool, ...] | None = None,
    saved: tuple[int, ...] | None = None,
) -> World:
    """``w`` with the fields given changed, built directly (``_replace`` is Python-level even compiled)."""
    return World(
        w.procs,
        w.eval_procs,
        w.faults,
        w.grouped if grouped is None else grouped,
        w.torn if torn is None else torn,
        w.voided if voided is None else voided,
        w.clean if clean is None else clean,
        w.saved if saved is None else saved,
    )


class Node:
    """A state of the exploration: the job as the core has it, and the world around it. Not a tuple: its hash is
    remembered. The search looks each node up several times (seen yet? its predecessors, the graph checks) and a
    job state is a deep tuple of ~100 fields that Python hashes anew on every lookup. The job's own hash is passed
    in where the checker knows it (once per decision of the core, not once per node: a job is reached under many
    worlds); the node's hash is a function of the job's hash and the world, so equal nodes hash equal."""

    __slots__ = ("_hash", "_job_hash", "job", "world")

    def __init__(self, job: JobState, world: World, job_hash: int | None = None) -> None:
        self.job = job
        self.world = world
        self._hash: int | None = None
        self._job_hash = job_hash  # hash(job), where known

    def job_hash(self) -> int:
        jh = self._job_hash
        if jh is None:
            jh = self._job_hash = hash(self.job)
        return jh

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = self._hash = hash((self.job_hash(), self.world))
        return h

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Node):
            return NotImplemented
        # one job object is shared by every node reached through one decision: identity first
        return self.world == other.world and (self.job is other.job or self.job == other.job)

    def __repr__(self) -> str:
        return f"Node(job={self.job!r}, world={self.world!r})"

    def __reduce__(self) -> tuple[type[Node], tuple[JobState, World]]:
        return Node, (self.job, self.world)

    def key(self) -> Node:
        """Identical engines are interchangeable: sort them (symmetry reduction), renaming every reference."""
        return Node(*_sorted(self.job, self.world))


class Action(NamedTuple):
    """What happened in one step: an operation, a command's results, a report, or a fault."""

    name: str  # "op.generate", "results", "news.died", "fault.kill"
    engine: int | None = None
    group: str = ROLLOUT
    fault: bool = False
    target: int | None = None  # op.scale_rollout: the new target (Op.target)

    def label(self) -> str:
        who = f"{'eval' if self.group == EVAL else 'engine'}-{self.engine}" if self.engine is not None else ""
        kind, _, what = self.name.partition(".")
        if kind == "op":
            to = f" (target {self.target})" if self.target is not None else ""
            return f"loop calls {what}" + (f" on {who}" if who else "") + to
        if kind == "results":
            said = (part.split("=", 1) for part in what.split(","))
            return "the shells report: " + ", ".join(f"{who} {outcome}" for who, outcome in said)
        if kind == "news":
            return {
                "died": f"Ray reports {who} dead",
                "threshold_reached": f"the monitor's probes of {who} fail (threshold)",
                "stale_threshold": f"a stale failed probe of {who} returns",
                "stale_epoch_died": f"Ray reports the death of {who}'s previous process (a late report)",
                "stale_epoch_threshold_reached": f"the probes of {who}'s previous process fail (a late verdict)",
                "stale_epoch_request_failed": f"a request sent to {who}'s previous process fails (late)",
                "request_failed": f"a request to {who} fails",
                "probe": "the monitor runs a probe round",
                "preempt_notice": f"{who}'s process is given a preemption notice",
                "drained": f"{who}'s requests in flight are done (or its drain bound passed)",
            }.get(what) or (
                f"the stream completes a group whose oldest token is {what.rsplit('_', 1)[1]} versions old"
                if what.startswith("group_done_")
                else f"{who} {what}"
            )
        return {
            "driver_death": "the driver dies (SIGKILL); a new one resumes the job and adopts the engines that live",
            "kill": f"{who} process dies (SIGKILL)",
            "hang": f"{who} hangs or its HTTP server dies, actor alive (probes and requests stall)",
            "kill_router": f"the {self.group} router process dies (SIGKILL)",
        }.get(what, f"{what} {who}".strip())


class Transition(NamedTuple):
    action: Action
    moves: tuple[Move, ...]
    node: Node


class _Decided(NamedTuple):
    """What the core did with one event in one job state, whatever the world around it."""

    job: JobState
    moves: tuple[Move, ...]
    commands: tuple[Command, ...]  # every command issued, the ones answered at once included
    newer: bool  # the trainer's weights became the committed version
    checkpointed: bool  # a job checkpoint was written
    job_hash: int  # hash(job), once per decision (every node reached through it reuses it)


_UNKNOWN = object()
_STARTING = frozenset({"Starting", "Joining"})  # a process launched, not yet answered healthy: it may die or hang
_PROCESS_FAULTS = (("kill", DEAD), ("hang", HUNG))  # a hang and an HTTP server's death are both HUNG to the world
_PROBE, _PROBE_ACTION = Outcome("probe"), Action("news.probe")


class Checker:
    """The successor relation of the exploration: the core, driven by a loop and the world."""

    def __init__(
        self,
        config: LifecycleConfig,
        *,
        engines: int = 2,
        evals: int | None = None,
        machines: Mapping[str, MachineSpec] | None = None,
        max_faults: int = 2,
        remember: bool = True,
    ) -> None:
        self.config = config
        # remember=False: every question asked of the core anew (the baseline that `bench_check.py` times and the
        # tests that show remembering changes no state, transition or counterexample)
        self.remember = remember
        n_evals = (1 if config.num_eval_engines else 0) if evals is None else evals
        if not config.num_rollout_engines:
            engines = 0
        elif elastic(config):  # an elastic fleet's slots: as many as asked for, never beyond its maximum
            engines = min(engines, config.max_rollout_engines)
        self.core = Core(config, engines=engines, evals=n_evals, machines=machines)
        self.p = self.core.predicates
        self.max_faults = max_faults
        # the driver dies at any state and a new one resumes the job, adopting the engines that live on
        self.adopts = self.p["keeps_engines"] and self.p["resumes"] and self.core.engines > 0
        self.dies = self.p["resumes"]  # a resumed job's driver may die too (without kept engines: all are new)
        self.saves_stream = self.dies and self.p["streaming"]  # its checkpoints hold the stream's buffer
        self._main: dict[str, tuple[str, str] | None] = {}
        self._memo: dict[JobState, dict[Event, _Decided | object | None]] = {}
        self._job: JobState | None = None
        self._table: dict[Event, _Decided | object | None] = {}
        self._effects: set[tuple[str, str]] = set()
        self._answered: dict[tuple[object, ...], list[tuple[int, Completed, Action, tuple[_Change, ...]]]] = {}
        self._calls: dict[tuple[JobState, bool], list[tuple[Op, Action]]] = {}
        self._lates: dict[JobState, dict[tuple[str, int], list[tuple[Outcome, Action]]]] = {}
        self._said: dict[tuple[str, str, int, int | None, bool], tuple[Outcome, Action]] = {}
        # the groups the stream may complete, by staleness: built once (the version is normal: 0, see _normal_job)
        self._groups: tuple[tuple[Outcome, Action], ...] = ()
        if self.p["streaming"]:
            self._groups = tuple(
                (Outcome("group_done", version=-age), Action(f"news.group_done_{age}"))
                for age in range(self.core.bound + 2)
            )
        # the operations a loop may call here: an elastic fleet's only where the config has bounds
        self._ops = tuple(n for n in EXPLORED_OPS if self.p["elastic"] or n not in ELASTIC_OPS)
        self.elastic = self.p["elastic"]
        for name, op in OPERATIONS.items():
            main = next((p for p in op.program if "." in p), None)
            self._main[name] = None if main is None else (main.split(".", 1)[0], main.split(".", 1)[1])

    def initial(self) -> Node:
        core = self.core
        flags = (False,) * core.engines if self.p["broadcasts_weights"] else ()
        clean = (False,) * core.engines if self.adopts else ()
        world = World((UP,) * core.engines, (UP,) * core.evals, 0, flags, flags, False, clean)
        return Node(_normal_job(core.initial()), world)

    def seen_effects(self) -> frozenset[tuple[str, str]]:
        """(machine, effect) of every move the core made in a step this checker offered (decisions of the core
        that moved something are always offered as a transition)."""
        return frozenset(self._effects)

    def key(self, n: Node) -> Node:
        """:meth:`Node.key` of a node this checker made: its job is normal already (normalised per decision)."""
        job, world = _sorted(n.job, n.world, normal_job=True)
        if job is n.job:
            return n if world is n.world else Node(job, world, n.job_hash())
        return Node(job, world)

    def terminal(self, n: Node) -> bool:
        """The run is over: it stopped fast (the core names why)."""
        return bool(n.job.failed)

    def successors(self, n: Node) -> Iterator[Transition]:
        if self.terminal(n):
            return
        budget = n.world.faults < self.max_faults
        job = n.job
        if job.awaiting:
            yield from self._results(n, budget)
        elif not job.rollout_op and not job.trainer_op:
            yield from self._operations(n, budget)
        # Faults strike between commands, not while one is out: the core sees a process only through a
        # command's result and the news, and the world answers from the process's health when it answers,
        # so a fault during a command reads exactly like the same fault just before it was issued (a new
        # process failing while it starts is the launch's own start_failed answer).
        quiet = budget and not job.awaiting
        yield from self._news(n, quiet)
        if budget and self.elastic:  # a notice may come at any time, a command out or not (a launch, an update)
            yield from self._notices(n)
        if quiet:
            yield from self._faults(n)
        if budget and self.dies:  # anywhere, a command out or not: the new driver knows only the ledger
            yield _driver_death(self.core, self.adopts, n, self.saves_stream)

    # -- driving the core ---------------------------------------------------------------------------------------
    def step(self, n: Node, event: Event, action: Action, world: World | None = None) -> Transition | None:
        done = self._decide(n.job, event)
        if done is None:
            return None
        job, moves, commands, newer, checkpointed, job_hash = done
        w = world or n.world
        for cmd in commands:  # what issuing a command does to the world
            w = _issued(w, cmd)
        if self.adopts:  # which version a job checkpoint holds, against the committed one
            if newer:
                w = _world_with(w, voided=True)
            if checkpointed:
                w = _world_with(w, voided=False)
        if self.saves_stream and checkpointed:
            w = _world_with(w, saved=job.buffer)
        return Transition(action, moves, Node(job, w, job_hash))

    def _decide(self, job: JobState, event: Event) -> _Decided | None:
        """The core's answer to ``event`` in ``job``, remembered: the core is a pure function of (state, event),
        and the exploration asks the same question of one job state under many worlds (each process's health, the
        faults used) -- about 3.6 asks per distinct pair. None: the core refused the event."""
        if not self.remember:
            return self._decide_now(job, event)
        if job is not self._job:  # one node's successors ask many questions of one job: hash it once
            self._job, self._table = job, self._memo.setdefault(job, {})
        table = self._table
        done = table.get(event, _UNKNOWN)
        if done is _UNKNOWN:
            done = table[event] = self._decide_now(job, event)
        return done  # type: ignore[return-value]

    def _decide_now(self, before: JobState, event: Event) -> _Decided | None:
        result = self.core.step(before, event)
        if result.refused is not None:
            return None
        job, moves, commands = result.state, result.moves, result.commands
        newer = bool(result.commits and before.ahead)  # the trainer's weights became the committed version
        # Commands whose only possible answer is a plain success that no fault can change (the monitor's and
        # the trainer's bookkeeping) come back at once: nothing the world does in between could matter.
        while job.awaiting and all(
            c.machine not in ("engine", "trainer", "weight_sync") or c.effect in _SURE for c in job.awaiting
        ):
            more = self.core.step(job, Completed(tuple((c, Outcome("done")) for c in job.awaiting)))
            newer = newer or bool(more.commits and job.ahead)
            job, moves, commands = more.state, (*moves, *more.moves), (*commands, *more.commands)
        checkpointed = any(m.machine == "trainer" and m.trigger == "checkpoint_done" for m in moves)
        for m in moves:
            for effect in m.effects:
                self._effects.add((m.machine, effect))
        job = _normal_job(job)  # once per decision, not once per state reached through it
        if not moves and job == before:
            job = before  # the same object: later "did it change?" questions compare identities, not fields
        return _Decided(job, moves, commands, newer, checkpointed, hash(job))

    def _possible(self, n: Node, name: str, engine: int | None = None) -> bool:
        """A cheap look at the operation's own machine event: most operations are not allowed in a state."""
        main = self._main[name]
        if main is None:
            return True
        part, trigger = main
        if part == "engine":
            state = n.job.engines[engine].state if engine is not None else "Init"
        else:
            state = getattr(n.job, part)
        return (state, trigger) in self.core.compiled[part].table

    def _operations(self, n: Node, budget: bool) -> Iterator[Transition]:
        key = (n.job, budget)
        calls = self._calls.get(key) if self.remember else None
        if calls is None:  # which operations the core accepts depends on the job alone: ask once per job state
            calls = self._calls[key] = list(self._accepted(n, budget))
        for event, action in calls:
            w = n.world.counted(1) if action.fault else None
            t = self.step(n, event, action, w)
            if t is not None:
                yield t

    def _accepted(self, n: Node, budget: bool) -> Iterator[tuple[Op, Action]]:
        for name in self._ops:
            if name not in ENGINE_OPS and not self._possible(n, name):
                continue
            # an operator stopping an engine, a scale, a retirement: bounded like a fault
            fault = name in BUDGETED_OPS
            if fault and not budget:
                continue
            if name in ENGINE_OPS:
                for i in range(self.core.engines):
                    if not self._possible(n, name, i):
                        continue
                    if self._decide(n.job, Op(name, i)) is not None:
                        yield Op(name, i), Action(f"op.{name}", i, fault=fault)
                continue
            if name == "scale_rollout":  # one engine more or fewer (the core refuses a target outside the bounds)
                for target in (n.job.target + 1, n.job.target - 1):
                    op = Op(name, target=target)
                    if self._decide(n.job, op) is not None:
                        yield op, Action(f"op.{name}", fault=True, target=target)
                continue
            if self._decide(n.job, Op(name)) is not None:
                yield Op(name), Action(f"op.{name}")

    def _results(self, n: Node, budget: bool) -> Iterator[Transition]:
        """Every command out comes back at once (the runtime commits a fan-out's results in slot order)."""
        world = n.world
        for faults, event, action, changes in self._choices(n.job, world):
            w = world.counted(faults)
            for change in changes:
                w = change(w)
            t = self.step(n, event, action, w)
            if t is not None:
                yield t

    def _choices(self, job: JobState, w: World) -> list[tuple[int, Completed, Action, tuple[_Change, ...]]]:
        """Every way the world may answer the commands out, within the fault budget: how the answers depend on the
        world (each process's health and group flags, not the faults spent) and on the commands alone, so many job
        states share them. Where every way costs a fault, only the cheapest (a fault the job causes itself, CI's
        injection, happens whatever the budget says)."""
        key = (job.awaiting, w.procs, w.eval_procs, w.grouped, w.torn, w.clean, tuple(e.joined for e in job.engines))
        spend = w.faults
        cached = self._answered.get(key) if self.remember else None
        if cached is None:
            options = [_answers(cmd, w, job) for cmd in job.awaiting]
            cached = []
            for choice in itertools.product(*options):
                faults = sum(fault for _, fault, _ in choice)
                results = tuple((cmd, outcome) for cmd, (outcome, _, _) in zip(job.awaiting, choice, strict=True))
                names = ",".join(f"{cmd.instance}={o.name}" for cmd, o in results)
                action = Action(f"results.{names}", fault=faults > 0)
                cached.append((faults, Completed(results), action, tuple(c for _, _, c in choice if c is not _keep)))
            self._answered[key] = cached
        within = [c for c in cached if spend + c[0] <= self.max_faults]
        if within:
            return within
        least = min(c[0] for c in cached)
        return [c for c in cached if c[0] == least]

    def _said_of(
        self, what: str, group: str, i: int, epoch: int | None = None, fault: bool = False
    ) -> tuple[Outcome, Action]:
        """News about engine ``i`` and its label, built once per exploration (the same few are sent everywhere)."""
        key = (what, group, i, epoch, fault)
        said = self._said.get(key)
        if said is None:
            name = what if epoch is None or what == "stale_threshold" else f"stale_epoch_{what}"
            outcome = Outcome("threshold_reached" if what == "stale_threshold" else what, group, i, epoch=epoch)
            said = self._said[key] = (outcome, Action(f"news.{name}", i, group, fault=fault))
        return said

    def _news(self, n: Node, budget: bool) -> Iterator[Transition]:
        job, w, core = n.job, n.world, self.core
        if (
            self._groups
            and job.rollout in STREAM_STATES
            and len(job.buffer) + len(job.taken) < BUFFERED_GROUPS
            and any(e.state in _GENERATING for e in job.engines)
        ):
            for event, action in self._groups:
                t = self.step(n, event, action)
                if t is not None:
                    yield t
        late = self._late(job)
        if job.monitor == "Running":
            t = self.step(n, _PROBE, _PROBE_ACTION)
            if t is not None and t.moves:
                yield t
        for group in (ROLLOUT, EVAL):
            for i, (e, proc) in enumerate(zip(job.group(group), w.group(group), strict=True)):
                if proc == DEAD:  # Ray reports the death at once
                    seen = _set_proc(group, i, DEAD_NOTIFIED)(w)
                    t = self.step(n, *self._said_of("died", group, i), seen)
                    if t is not None:
                        yield t
                if e.state not in core.live:
                    continue
                if e.state == "Draining":  # its requests finished, or its drain bound passed: the shell says so
                    yield from self._maybe(n, *self._said_of("drained", group, i))
                if job.monitor == "Running" and proc in (DEAD, HUNG):
                    yield from self._maybe(n, *self._said_of("threshold_reached", group, i))
                stale = (
                    job.monitor == "Paused"
                    and proc == UP
                    and budget
                    and (group == ROLLOUT or job.rollout == "Evaluating")
                )
                if stale:  # a probe sent before the pause fails late
                    counted = w.counted(1)
                    yield from self._maybe(n, *self._said_of("stale_threshold", group, i, fault=True), counted)
                if late and (group, i) in late:  # a late report about the engine's previous process (or driver's)
                    for event, action in late[(group, i)]:
                        yield from self._maybe(n, event, action)
                busy = job.rollout in core.rollout_busy or job.fleet == "Pinned"
                if busy and e.state == "Serving" and proc in (DEAD, HUNG) and job.monitor != "Running":
                    yield from self._maybe(n, *self._said_of("request_failed", group, i))

    def _notices(self, n: Node) -> Iterator[Transition]:
        """An elastic fleet's preemption notices (a fault: the budget bounds them): to a member whose process is up,
        in any state -- joining, serving, under the engine lock, mid-stream -- but the job's first start (Starting:
        the spec has no way out of it for a leaver whose start then fails but Unhealthy, a member's failure)."""
        job, core = n.job, self.core
        counted = n.world.counted(1)
        for i, (e, proc) in enumerate(zip(job.engines, n.world.procs, strict=True)):
            if proc != UP or e.state in core.gone or e.state == "Starting" or core.leaving(e):
                continue
            event, action = self._said_of("preempt_notice", ROLLOUT, i, fault=True)
            if self._changes(job, event):
                t = self.step(n, event, action, counted)
                if t is not None:
                    yield t

    def _late(self, job: JobState) -> dict[tuple[str, int], list[tuple[Outcome, Action]]]:
        """The late reports about an engine's previous process that the core acts on in ``job``, by engine -- none,
        unless the core is broken. They change nothing in the world, so which do something depends on the job
        alone: asked once per job state, of the core directly (most job states are seen under several worlds)."""
        late = self._lates.get(job) if self.remember else None
        if late is None:
            late = self._lates[job] = {}
            for group in (ROLLOUT, EVAL):
                for i, e in enumerate(job.group(group)):
                    if e.epoch < 1 or e.state not in self.core.live:  # news of an engine not live is not sent
                        continue
                    acting = []
                    for what in STALE_NEWS:
                        said = self._said_of(what, group, i, e.epoch - 1)
                        r = self.core.step(job, said[0])
                        if r.refused is None and (r.moves or r.commands or r.state != job):
                            acting.append(said)
                    if acting:
                        late[(group, i)] = acting
        return late

    def _changes(self, job: JobState, event: Event) -> bool:
        done = self._decide(job, event)
        return done is not None and (bool(done.moves) or bool(done.commands) or done.job != job)

    def _maybe(self, n: Node, event: Event, action: Action, world: World | None = None) -> Iterator[Transition]:
        """The event, unless it changes nothing (most news does nothing in most states, fenced news never does)."""
        if world is None and not self._changes(n.job, event):
            return
        t = self.step(n, event, action, world)
        if t is not None and (t.moves or t.node != n):
            yield t

    def _faults(self, n: Node) -> Iterator[Transition]:
        # Eval engines serve only while an eval runs: a fault on one between evals is, for the lifecycle, the
        # same as one at the next eval's start (the fleet pins, probes and restarts then), so the checker
        # injects them only inside that window -- a 4x smaller state space for the configs with a fleet.
        groups = (ROLLOUT, EVAL) if n.job.rollout == "Evaluating" else (ROLLOUT,)
        for group in groups:
            # the group's router dies (SIGKILL): its watcher reports it at once; only Serving engines are in it
            if any(e.state == "Serving" for e in n.job.group(group)):
                counted = n.world.counted(1)
                action = Action("fault.kill_router", None, group, fault=True)
                t = self.step(n, Outcome("router_died", group), action, counted)
                if t is not None:
                    yield t
            for i, (e, proc) in enumerate(zip(n.job.group(group), n.world.group(group), strict=True)):
                if proc != UP or not (e.state in self.core.live or e.state in _STARTING):
                    continue
                # SIGKILL (Ray sees the death) vs a hang or an HTTP-server death: only probes and requests tell, so
                # for the lifecycle the two are one fault (the same successor; offered once, labelled with both)
                for fault, health in _PROCESS_FAULTS:
                    w = _set_proc(group, i, health)(n.world).counted(1)
                    node = Node(n.job, w, n.job_hash())
                    yield Transition(Action(f"fault.{fault}", i, group, fault=True), (), node)


class _Change:
    """A change to the world (a process marked dead, a new process), applied when a result is chosen."""

    __slots__ = ("group", "i", "proc")

    def __init__(self, group: str | None = None, i: int = 0, proc: str = "") -> None:
        self.group, self.i, self.proc = group, i, proc

    def __call__(self, w: World) -> World:
        if self.group is None:
            return w
        procs = w.group(self.group)
        new = (*procs[: self.i], self.proc, *procs[self.i + 1 :])
        return w.with_procs(self.group, new)


_keep = _Change()


class _Flag(_Change):
    """A per-process flag of broadcast mode set or cleared (``grouped``/``torn`` of some engines)."""

    __slots__ = ("field", "indices", "value")

    def __init__(self, field: str, indices: int | frozenset[int] | None, value: bool) -> None:
        super().__init__()
        self.field, self.value = field, value
        self.indices = frozenset({indices}) if isinstance(indices, int) else indices  # None: every engine

    def __call__(self, w: World) -> World:
        flags: tuple[bool, ...] = getattr(w, self.field)
        if not flags:
            return w
        new = tuple(self.value if self.indices is None or i in self.indices else f for i, f in enumerate(flags))
        if self.field == "grouped":
            return _world_with(w, grouped=new)
        return _world_with(w, torn=new) if self.field == "torn" else _world_with(w, clean=new)


def _driver_death(core: Core, adopts: bool, n: Node, stream: bool = False) -> Transition:
    """The driver dies (SIGKILL) and a new one resumes the job from its checkpoint. The engines live on:
    the ledger names every slot whose process was launched and not confirmed dead (it is adopted); a process
    holds the checkpoint's version, whole, only if it held the committed one, took no newer one, has no
    load in flight and no broadcast's mix, and no version was committed after the checkpoint. The eval
    fleet's engines and the weight-update group die with the driver."""
    job, w = n.job, n.world
    kept = tuple(adopts and e.state not in core.gone for e in job.engines)
    clean = tuple(
        k
        and e.current
        and not (e.fresh or e.mixed or w.voided or e.state in core.transient or e.state == "Unhealthy")
        and not (w.torn and w.torn[i])
        for i, (e, k) in enumerate(zip(job.engines, kept, strict=True))
    )
    procs = tuple(
        (DEAD_NOTIFIED if p in (DEAD, KILLING) else p) if k else UP for p, k in zip(w.procs, kept, strict=True)
    )
    epochs = tuple(1 if k else None for k in kept)
    resumed = core.with_kept(core.initial(), epochs)
    if stream:  # the checkpoint's version (any, the world's are relative: one beyond every group's) and its groups
        version = core.bound + 2
        resumed = core.with_checkpoint(resumed, version, tuple(version - max(0, age) for age in w.saved))
    resumed = _normal_job(resumed)
    torn = tuple(t and k for t, k in zip(w.torn, kept, strict=True)) if w.torn else ()
    world = World(
        procs,
        (UP,) * core.evals,
        w.faults + 1,
        (False,) * len(w.grouped),
        torn,
        False,
        clean if adopts else (),
        w.saved,
    )
    return Transition(Action("fault.driver_death", fault=True), (), Node(resumed, world))


def _answers(cmd: Command, w: World, job: JobState) -> list[tuple[Outcome, bool, _Change]]:
    """How the world may answer one command: (outcome, is it a fault, what it does to the world)."""
    same = _keep
    if cmd.machine == "weight_sync":
        return _group_answers(cmd, w, job)
    if cmd.machine == "engine" and cmd.group is not None and cmd.engine is not None:
        proc = w.group(cmd.group)[cmd.engine]
        alive = proc == UP
        mark = _set_proc(cmd.group, cmd.engine, DEAD_NOTIFIED) if proc == DEAD else same
        if cmd.effect == "launch_engine":
            if alive:
                return [(Outcome("ready"), False, same), (Outcome("start_failed"), True, same)]
            return [(Outcome("start_failed"), False, mark)]
        if cmd.effect == "kill_engine":
            return [(Outcome("dead"), False, _set_proc(cmd.group, cmd.engine, DEAD_NOTIFIED))]
        if cmd.effect == "adopt_engine":  # what the new driver reads back from the process it finds
            read = _Flag("clean", cmd.engine, False)
            if not alive:
                return [(Outcome("lost"), False, read)]
            held = "adopted" if w.clean and w.clean[cmd.engine] else "behind"
            return [(Outcome(held), False, read), (Outcome("lost"), True, read)]  # or it cannot be read
        if cmd.effect == "transfer_weights":
            # a load from disk replaces every tensor: mixed weights are gone (a broadcast's part is the group's)
            loaded = same if w.torn == () or cmd.lane == "trainer" else _Flag("torn", cmd.engine, False)
            if alive:
                return [
                    (Outcome("loaded"), False, loaded),
                    (Outcome("refused"), True, same),
                    (Outcome("error"), True, same),
                ]
            return [(Outcome("request_failed"), False, same)]
        if cmd.effect in ("stop_routing", "hold_routing"):  # the router forgets the engine whatever the engine's health
            return [(Outcome("done"), False, same)]
        if cmd.effect == "inject_ci_fault":  # the CI's own fault: a SIGKILL, counted in the budget like any
            return [(Outcome("done"), True, _set_proc(cmd.group, cmd.engine, DEAD))]
        if cmd.effect == "probe_engine":
            return [(Outcome("probe_ok" if alive else "probe_failed"), False, same)]
        return [(Outcome("done" if alive else "request_failed"), False, same)]
    if cmd.machine == "trainer":
        success = _SUCCESS.get(cmd.effect, "done")
        answers = [(Outcome(success), False, same)]
        if "worker_crashed" in RESULTS.get(cmd.effect, frozenset()) and cmd.effect in _MAY_CRASH:
            answers.append((Outcome("worker_crashed"), True, same))
        return answers
    return [(Outcome("done"), False, same)]


def _group_answers(cmd: Command, w: World, job: JobState) -> list[tuple[Outcome, bool, _Change]]:
    """The group's calls succeed only when every member's process is up; a broadcast only when the group's members
    are exactly its receivers (a collective waits for every rank: one that left -- retired, stopped, restarted --
    fails it); a failed broadcast leaves every receiver with mixed weights."""
    if cmd.effect == "init_weight_group":
        members = frozenset(i for i, e in enumerate(job.engines) if e.joined)
        if all(w.procs[i] == UP for i in members):
            return [(Outcome("done"), False, _Flag("grouped", members, True)), (Outcome("failed"), True, _keep)]
        return [(Outcome("failed"), False, _keep)]
    if cmd.effect == "broadcast_weights":
        receivers = frozenset(
            c.engine
            for c in job.awaiting
            if c.effect == "transfer_weights" and c.group == ROLLOUT and c.engine is not None
        )
        tear = _Flag("torn", receivers, True)
        members = frozenset(i for i, g in enumerate(w.grouped) if g)
        if receivers == members and all(w.procs[i] == UP for i in members):
            whole = _Flag("torn", receivers, False)  # every tensor of one version arrived
            return [
                (Outcome("done"), False, whole),
                (Outcome("failed"), True, tear),
                (Outcome("worker_crashed"), True, tear),
            ]
        return [(Outcome("failed"), False, tear)]
    return [(Outcome("done"), False, _Flag("grouped", None, False))]  # destroy: nobody is in a group now


def _set_proc(group: str, i: int, proc: str) -> _Change:
    return _Change(group, i, proc)


def _issued(w: World, cmd: Command) -> World:
    """A launch starts a new, healthy process; a kill is on its way (the process exits when it lands)."""
    if cmd.machine != "engine" or cmd.group is None or cmd.engine is None:
        return w
    if cmd.effect == "launch_engine":
        w = _set_proc(cmd.group, cmd.engine, UP)(w)
        if w.grouped and cmd.group == ROLLOUT:  # a new process: in no group, holding its launch weights
            w = _Flag("torn", cmd.engine, False)(_Flag("grouped", cmd.engine, False)(w))
        return w
    if cmd.effect == "kill_engine" and w.group(cmd.group)[cmd.engine] != DEAD_NOTIFIED:
        return _set_proc(cmd.group, cmd.engine, KILLING)(w)
    return w


# -- symmetry reduction ----------------------------------------------------------------------------------------------
def _sorted(job: JobState, world: World, *, normal_job: bool = False) -> tuple[JobState, World]:
    """Engines sorted by (state, facts, process health); commands and programs renamed to match. ``normal_job``:
    the job is normal already (:func:`_normal_job`), only the world is normalised."""
    if normal_job:
        world = _normal_world(job, world)
    else:
        job, world = _normal(job, world)
    engines, procs = job.engines, world.procs
    if world.grouped:  # broadcast mode: a process's group membership and torn weights travel with it
        procs = tuple(
            f"{p}{'+g' if g else ''}{'+t' if t else ''}"
            for p, g, t in zip(world.procs, world.grouped, world.torn, strict=True)
        )
    if any(world.clean):  # after a driver's death: what a kept process holds travels with it
        procs = tuple(f"{p}{'+c' if c else ''}" for p, c in zip(procs, world.clean, strict=True))
    if len(engines) < 2 or (len(engines) == 2 and not (engines[1], procs[1]) < (engines[0], procs[0])):
        return job, world  # already in order (the common case, without building the sort)
    pairs = list(zip(engines, procs, strict=True))
    order = sorted(range(len(pairs)), key=pairs.__getitem__)
    if all(i == o for i, o in enumerate(order)):
        return job, world
    where = {old: new for new, old in enumerate(order)}

    def rename(cmd: Command) -> Command:
        if cmd.group != ROLLOUT or cmd.engine is None:
            return cmd
        return command_with(cmd, engine=where[cmd.engine], instance=f"engine-{where[cmd.engine]}")

    def program(phases: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(f"{p.partition('@')[0]}@{where[int(p.partition('@')[2])]}" if "@" in p else p for p in phases)

    return (
        job_with(
            job,
            engines=tuple(engines[i] for i in order),
            awaiting=tuple(rename(c) for c in job.awaiting),
            rollout_program=program(job.rollout_program),
        ),
        World(
            tuple(world.procs[i] for i in order),
            world.eval_procs,
            world.faults,
            tuple(world.grouped[i] for i in order) if world.grouped else (),
            tuple(world.torn[i] for i in order) if world.torn else (),
            world.voided,
            tuple(world.clean[i] for i in order) if world.clean else (),
            world.saved,
        ),
    )


_FINISHED = MACHINES["engine"].terminal_states
# serving nothing, holding no weights the job reads again (a Retired slot keeps its restarts: the budget window
# outlives the slot's retirement)
_IDLE = frozenset({"Stopped", "Unhealthy", "Init", "Retired"})
_GONE = MACHINES["engine"].tagged("gone")


def _generations(job: JobState) -> JobState:
    """Only whether an engine had a process before matters (news may name an earlier generation), not how many:
    the core compares a report's epoch with the engine's for equality, and the checker's stale news names the
    generation before the current one. Epochs count launches, so without this every restart would be a new state."""
    if all(e.epoch <= 1 for e in job.engines) and all(e.epoch <= 1 for e in job.evals):
        return job
    return job_with(
        job,
        engines=tuple(engine_with(e, epoch=1) if e.epoch > 1 else e for e in job.engines),
        evals=tuple(engine_with(e, epoch=1) if e.epoch > 1 else e for e in job.evals),
    )


def _normal(job: JobState, world: World) -> tuple[JobState, World]:
    """Facts that nothing can read any more are cleared (a finished engine's weights, its process)."""
    job = _normal_job(job)
    return job, _normal_world(job, world)


def _normal_job(job: JobState) -> JobState:
    """The job's part of :func:`_normal`: epochs folded, facts of engines that cannot serve cleared. The checker
    applies it once per decision of the core (every job state it explores is normal), not once per node."""
    job = _generations(job)
    if job.version:  # only the staleness of a buffered group is read, and it is kept relative to the version
        job = job_with(job, version=0)
    if job.sync_generation:  # the group's generation: only a command's against the current one is read (fencing)
        job = _relative_generation(job)
    if job.fleet in ("Idle", "SkippedUnhealthy", "SkippedPinViolation") and any(
        e.current or e.fresh for e in job.evals
    ):
        # between pins the fleet serves nothing: which version an eval engine held last is not read again
        job = job_with(job, evals=tuple(engine_with(e, current=False, fresh=False) for e in job.evals))
    for e in job.engines:
        if e.state in _FINISHED:
            if e.current or e.fresh or e.released or e.restarts or e.epoch or e != EngineState(e.state):
                break
        elif (e.state in _IDLE and (e.current or e.fresh or e.released or e.mixed)) or (e.leaving and e.state in _GONE):
            break
    else:
        return job
    engines = []
    for e in job.engines:
        if e.state in _FINISHED:
            e = EngineState(e.state)
        elif e.state in _IDLE:
            e = engine_with(e, current=False, fresh=False, released=frozenset(), mixed=False)
        if e.leaving and e.state in _GONE:  # a vacant slot: the next launch starts a member afresh
            e = engine_with(e, leaving=False)
        engines.append(e)
    return job_with(job, engines=tuple(engines))


def _relative_generation(job: JobState) -> JobState:
    """The weight-update group's generation is 0 and a command's counts from it (an older group's is negative): the
    core compares them only to fence a result of an older group, and every re-form would be a new state otherwise."""
    g = job.sync_generation
    awaiting = tuple(
        command_with(c, generation=c.generation - g) if c.machine == "weight_sync" else c for c in job.awaiting
    )
    return job_with(job, sync_generation=0, awaiting=awaiting)


def _normal_world(job: JobState, world: World) -> World:
    """The world's part of :func:`_normal`: a finished engine's process is gone (confirmed dead)."""
    procs = world.procs
    for e, p in zip(job.engines, procs, strict=True):
        if p != DEAD_NOTIFIED and e.state in _FINISHED:
            break
    else:
        return world
    new = tuple(DEAD_NOTIFIED if e.state in _FINISHED else p for e, p in zip(job.engines, procs, strict=True))
    return world.with_procs(ROLLOUT, new)
