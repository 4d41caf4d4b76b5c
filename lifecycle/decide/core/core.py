"""The lifecycle core: ``step(state, event) -> (state', moves, commands)`` or a refusal. Pure.

The checker (:mod:`lifecycle.check.explore`) explores exactly this function over every operation order,
every command result and every fault; the runtime (:class:`lifecycle.decide.runner.Runner` with the shells
in ``engines/``, ``rollout/``, ``trainer/``) calls it for every operation and every report, carries
out the commands it returns and reports their results back. Each rule is written here once:

* a machine moves only by its spec (:meth:`MachineSpec.compile`); guards are the named predicates;
* couplings: which engine moves go with a rollout-manager move (``ENGINE_PLAN``), what the core does with
  each effect -- moves another machine, labels the move, or hands a shell a command (``EFFECT_TABLE``), the
  snapshot rule (``SNAPSHOT``), an engine that may not be recovered fails at once (its spec's ``fail``
  guard), the restart budget, which weights each engine loads and how;
* operations are programs of phases (:mod:`.plan`), continued as the commands they wait for come back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, Literal, NamedTuple, Protocol, TypeVar

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core.model import (
    BROADCAST,
    COMMITTED_WEIGHTS,
    EVAL,
    PENDING_WEIGHTS,
    ROLLOUT,
    BlockedMove,
    Command,
    Completed,
    EngineState,
    Event,
    Failure,
    Fenced,
    JobState,
    Move,
    Op,
    Outcome,
    Refusal,
    Result,
    instance_name,
)
from lifecycle.decide.core.plan import ENGINE_PLAN, ERROR, OPERATIONS, SNAPSHOT
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.predicates import eval_fleet_enabled
from lifecycle.decide.spec import Blocked, CompiledSpec, MachineSpec, Step

# How the job's parts are called in JobState, and the spec each one runs.
PARTS = {
    "rollout": "rollout",
    "trainer": "trainer",
    "monitor": "monitor",
    "fleet": "eval_fleet",
    "engine": "engine",
    "sync": "weight_sync",
}
PART_OF = {machine: part for part, machine in PARTS.items()}
INSTANCE = {
    "rollout": "rollout",
    "trainer": "trainer",
    "monitor": "monitor",
    "fleet": "eval_fleet",
    "sync": "weight-sync",
}


class At(NamedTuple):
    """Where an effect happens: the part whose move it is, its engine (group and index) and the move's source."""

    part: str
    group: str | None
    i: int | None
    src: str


class Handling(NamedTuple):
    """What the core does with one machine's effect: exactly one of three kinds.

    ``coupled``: the core carries it out itself (``do``: it moves another machine or changes a fact) -- never
    a command; ``ledger``: a label of the move, with nothing more to do (XState: an action bound to no code);
    ``command``: work a shell carries out, bound by ``machine.effect`` name (:meth:`Runner.provide`).
    ``phases`` are added in front of the rest of the effect's operation (couplings that span operations).
    """

    kind: Literal["coupled", "ledger", "command"]
    doc: str
    do: Callable[[_Tx, At], object] | None = None
    phases: tuple[str, ...] = ()


def coupled(doc: str, do: Callable[[_Tx, At], object] | None = None, phases: tuple[str, ...] = ()) -> Handling:
    return Handling("coupled", doc, do, phases)


def ledger(doc: str) -> Handling:
    return Handling("ledger", doc)


def command(doc: str, phases: tuple[str, ...] = ()) -> Handling:
    return Handling("command", doc, None, phases)


Row = tuple[str, str, Handling]  # (machine, effect, what the core does with it)

# Every effect of every spec, classified once: the core's dispatch table (a test holds it to the specs).
EFFECT_TABLE: tuple[Row, ...] = (
    # -- the rollout manager ---------------------------------------------------------------------------------
    ("rollout", "construct_rollout_fn", command("the executor builds the rollout function")),
    ("rollout", "construct_eval_fn", command("the executor builds the eval function")),
    ("rollout", "load_replay_data", command("the executor reads the saved samples")),
    ("rollout", "save_rollout_data", command("the executor writes the samples")),
    (
        "rollout",
        "generate_rollouts",
        ledger("the executor calls the rollout function between this move and generate_done"),
    ),
    ("rollout", "run_eval", ledger("the executor calls the eval function between this move and eval_done")),
    ("rollout", "start_servers", coupled("every engine's start", lambda tx, at: tx.start_engines(ROLLOUT))),
    ("rollout", "stop_servers", coupled("every engine's stop and disposal (the dispose program)")),
    ("rollout", "start_monitor", coupled("the monitor's create", lambda tx, at: tx.fire("monitor", "create"))),
    ("rollout", "resume_monitor", coupled("the monitor's resume", lambda tx, at: tx.monitor_to("Paused", "resume"))),
    (
        "rollout",
        "pause_monitor",
        coupled("the monitor's pause (a no-op when it is paused)", lambda tx, at: tx.monitor_to("Running", "pause")),
    ),
    ("rollout", "stop_monitor", coupled("the monitor's stop", lambda tx, at: tx.stop_monitor())),
    (
        "rollout",
        "arm_ci_fault_injection",
        coupled("the fact ci_pending: the first generate kills one engine", lambda tx, at: tx.upd(ci_pending=True)),
    ),
    ("rollout", "inject_ci_fault", coupled("a command on the engine the ci_inject phase picks")),
    (
        "rollout",
        "start_eval_fleet",
        coupled("the eval fleet's create and its engines' starts", lambda tx, at: tx.start_eval_fleet()),
    ),
    ("rollout", "acquire_engine_lock", coupled("the fact lock", lambda tx, at: tx.lock_engines())),
    ("rollout", "release_engine_lock", coupled("the fact lock", lambda tx, at: tx.upd(lock=False))),
    ("rollout", "release_weights", coupled("the engines' offload (ENGINE_PLAN)")),
    ("rollout", "release_kv_cache", coupled("the engines' offload (ENGINE_PLAN)")),
    ("rollout", "resume_weights", coupled("the engines' onload_weights (ENGINE_PLAN)")),
    ("rollout", "resume_kv_cache", coupled("the engines' onload_kv (ENGINE_PLAN)")),
    ("rollout", "report_failure", coupled("the run stops (failed)", lambda tx, at: tx.report_failure(at))),
    # -- the trainer group -----------------------------------------------------------------------------------
    ("trainer", "allocate_workers", command("the group creates its worker actors")),
    ("trainer", "init_model", command("the workers build their policy and optimizer")),
    ("trainer", "keep_heal_state", command("train FT: a group without a peer keeps its last good state")),
    ("trainer", "restore_job_state", command("the workers load the job checkpoint")),
    ("trainer", "train_step", command("one optimisation step")),
    ("trainer", "save_checkpoint", command("a checkpoint")),
    ("trainer", "save_job_state", command("a job checkpoint")),
    ("trainer", "offload_train", command("the workers release their memory")),
    ("trainer", "onload_train", command("the workers take their memory back")),
    ("trainer", "replace_worker", command("a new worker for the crashed one")),
    ("trainer", "restore_from_peer", ledger("replace_worker restored the state")),
    ("trainer", "recover_engine", coupled("rollout FT: dead engines are recovered first", phases=("recover",))),
    # the trainer writes its new weights; the engines then take them: one snapshot under the engine lock
    ("trainer", "transfer_weights", command("the trainer writes its new weights (pending)", phases=("begin_update",))),
    ("trainer", "report_failure", coupled("the run stops (failed)", lambda tx, at: tx.report_failure(at))),
    # -- an engine ---------------------------------------------------------------------------------------------
    ("engine", "launch_engine", command("start its process (after the restart's backoff)")),
    ("engine", "kill_engine", command("kill its process and confirm the death")),
    ("engine", "adopt_engine", command("reach the process a previous driver left, check it is the ledger's, read it")),
    ("engine", "transfer_weights", command("load the weights the command names (from disk, or by broadcast)")),
    ("engine", "route_traffic", command("publish it to its group's routing")),
    ("engine", "stop_routing", command("withdraw it from its group's routing")),
    ("engine", "pause_generation", command("pause in-flight generation")),
    ("engine", "continue_generation", command("continue generation")),
    ("engine", "release_weights", command("release its weight memory")),
    ("engine", "release_kv_cache", command("release its KV-cache memory")),
    ("engine", "resume_weights", command("restore its weight memory")),
    ("engine", "resume_kv_cache", command("restore its KV-cache memory")),
    ("engine", "probe_engine", command("one health probe (the eval fleet's own, when no monitor probes)")),
    ("engine", "inject_ci_fault", command("--ci-test: SIGKILL its server")),
    ("engine", "recover_engine", ledger("the recovery is the kill and the relaunch that follow")),
    ("engine", "report_failure", coupled("the run stops (failed)", lambda tx, at: tx.report_failure(at))),
    # -- the health monitor ------------------------------------------------------------------------------------
    ("monitor", "start_monitor", command("create the monitor (paused)")),
    ("monitor", "resume_monitor", command("start probing")),
    ("monitor", "pause_monitor", command("stop probing")),
    ("monitor", "stop_monitor", command("stop for good")),
    ("monitor", "probe_engine", ledger("the round the monitor just ran")),
    ("monitor", "count_probe_failure", ledger("the monitor counts toward its threshold")),
    ("monitor", "discard_probe_result", ledger("nothing is done with the result")),
    (
        "monitor",
        "mark_engine_unhealthy",
        coupled("the engine's mark_unhealthy", lambda tx, at: tx.mark_subject()),
    ),
    # -- the eval fleet ----------------------------------------------------------------------------------------
    (
        "eval_fleet",
        "probe_engine",
        coupled("a probe command on each live eval engine", lambda tx, at: tx.probe_evals()),
    ),
    ("eval_fleet", "restart_eval_engines", coupled("the fleet_restart phase (stop, confirm, start)")),
    ("eval_fleet", "load_snapshot", coupled("the eval engines' begin_update", lambda tx, at: tx.load_snapshot())),
    # -- the weight-update group ------------------------------------------------------------------------------
    ("weight_sync", "init_weight_group", command("rank 0 and every member join (bounded)")),
    ("weight_sync", "broadcast_weights", command("rank 0 sends every bucket (bounded)")),
    ("weight_sync", "destroy_weight_group", command("everyone still alive leaves")),
)


def dispatch(rows: tuple[Row, ...]) -> dict[tuple[str, str], Handling]:
    """The table by (machine, effect); an effect classified twice is an error, not a silent override."""
    table: dict[tuple[str, str], Handling] = {}
    for machine, effect, handling in rows:
        if (machine, effect) in table:
            raise ValueError(f"{machine}.{effect} is classified twice ({table[machine, effect].kind}, {handling.kind})")
        table[machine, effect] = handling
    return table


DISPATCH = dispatch(EFFECT_TABLE)
# Views of the table by kind (the README names them).
COUPLED = {key: h.doc for key, h in DISPATCH.items() if h.kind == "coupled"}
LEDGER_ONLY = {key: h.doc for key, h in DISPATCH.items() if h.kind == "ledger"}

Lane = Literal["rollout", "trainer"]


class JobView(Protocol):
    """What the rules read of a job: a :class:`JobState`, or a step in progress."""

    @property
    def rollout(self) -> str: ...

    @property
    def monitor(self) -> str: ...

    @property
    def engines(self) -> tuple[EngineState, ...]: ...

    @property
    def sync(self) -> str: ...

    def group(self, group: str) -> tuple[EngineState, ...]: ...


LANES: tuple[Lane, ...] = ("rollout", "trainer")


def next_delay(
    restarts: tuple[float, ...], now: float, config: LifecycleConfig
) -> tuple[float | None, tuple[float, ...]]:
    """The restart budget: at most ``--engine-max-restarts`` within ``--engine-restart-window``, each after
    a delay doubling from ``--engine-restart-backoff`` up to ``--engine-restart-backoff-max``.

    Returns the delay (None: the budget is spent, give up) and the restart times to remember.
    Kubernetes' CrashLoopBackOff and Ray Serve's replica restarts make the same two promises.
    """
    recent = tuple(t for t in restarts if now - t <= config.engine_restart_window)
    if len(recent) >= config.engine_max_restarts:
        return None, recent
    delay = float(min(config.engine_restart_backoff * (2 ** len(recent)), config.engine_restart_backoff_max))
    return delay, (*recent, now)


class Core:
    """The compiled machines of one config, and the step function over them."""

    def __init__(
        self,
        config: LifecycleConfig,
        *,
        engines: int | None = None,
        evals: int | None = None,
        machines: Mapping[str, MachineSpec] | None = None,
    ) -> None:
        self.config = config
        self.specs: dict[str, MachineSpec] = {**MACHINES, **(machines or {})}
        self.c: dict[str, CompiledSpec] = {part: self.specs[name].compile(config) for part, name in PARTS.items()}
        self.p: dict[str, bool] = dict(self.c["engine"].values)
        self.engines = config.num_rollout_engines if engines is None else engines
        default_evals = config.num_eval_engines if eval_fleet_enabled(config) else 0
        self.evals = default_evals if evals is None else evals
        engine, rollout, trainer = self.specs["engine"], self.specs["rollout"], self.specs["trainer"]
        # the state groups, read off the specs' tags (never typed out by hand)
        self.live = engine.tagged("live")
        self.marked = frozenset(st.name for st in engine.states if st.marked)
        self.monitor_live = self.specs["monitor"].tagged("live")
        self.transient = engine.tagged("transient")
        self.gone = engine.tagged("gone")
        self.rollout_busy = rollout.tagged("busy")
        self.rollout_updating = rollout.tagged("updating")
        self.trainer_busy = trainer.tagged("busy")
        self.releases = {s.name: s.releases for s in engine.states}
        self.updating_engine = frozenset(s for s in self.transient if s in self.live)  # receiving weights
        self.markable = frozenset(s for t in engine.transitions if t.trigger == "mark_unhealthy" for s in t.source)
        self.tracks_ahead = self.p["updates_rollout_weights"] and self.p["saves_job"]
        # per part: the environment events that news of an older engine generation never fires (the specs say which)
        self.fenced: dict[str, frozenset[str]] = {part: self.specs[name].fenced for part, name in PARTS.items()}
        self._effects: dict[tuple[str, tuple[str, ...]], _Effects] = {}

    # -- the public surface ---------------------------------------------------------------------------
    def initial(self) -> JobState:
        return JobState(engines=(EngineState(),) * self.engines, evals=(EngineState(),) * self.evals)

    def with_restarts(self, state: JobState, restarts: tuple[tuple[float, ...], ...]) -> JobState:
        """A resumed job's rollout engines, still unstarted, with the restarts their budget window counts."""
        if len(restarts) != len(state.engines):
            raise ValueError(f"restart budgets for {len(restarts)} engines, but the job has {len(state.engines)}")
        if any(e.state != "Init" for e in state.engines):
            raise ValueError("restart budgets are restored before the first operation, not after")
        return state._replace(
            engines=tuple(e._replace(restarts=r) for e, r in zip(state.engines, restarts, strict=True))
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
        if any(k is not None for k in epochs) and not self.p["keeps_engines"]:
            raise ValueError("this job keeps no engines (--detach-engines, with --save): none can be adopted")
        floor = max([floor, *(k for k in epochs if k is not None)])
        return state._replace(
            engines=tuple(
                e._replace(epoch=floor if k is None else k, kept=k is not None)
                for e, k in zip(state.engines, epochs, strict=True)
            )
        )

    def step(self, state: JobState, event: Event) -> Result:
        tx = _Tx(self, state, event.now)
        try:
            if isinstance(event, Op):
                tx.operation(event)
            elif isinstance(event, Completed):
                tx.completed(event)
            else:
                tx.news(event)
            if tx.refused is not None:
                return Result(state, (), (), tx.refused, tuple(tx.blocked))
            tx.run_programs()
            return Result(
                tx.state(), tuple(tx.moves), tuple(tx.commands), None, tuple(tx.blocked), tx.commits, tuple(tx.fenced)
            )
        finally:
            # the step reads itself as ``tx.s``: a reference cycle that refcounting cannot free, left to the cyclic
            # collector (a step's lists with it) -- 10^5 per check, one per event in the loop. Broken here.
            del tx.s

    def effects_of(self, machine: str, effects: tuple[str, ...]) -> _Effects:
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
            fx = self._effects[key] = _Effects(commands, launch, frozenset(add), frozenset(drop))
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
        for part, compiled in self.c.items():
            machine = PARTS[part]
            _, effects = compiled.reachable()
            out.update((machine, e) for e in effects if self.is_command(machine, e))
        if self.evals and self.p["eval_fleet_self_probes"]:
            out.add(("engine", "probe_engine"))
        if self.p["ci_injects_rollout_faults"]:
            out.add(("engine", "inject_ci_fault"))
        if self.p["broadcasts_weights"]:  # a member's receive: the weight-update group's handler (Command.handler)
            out.add(("engine", f"transfer_weights.{BROADCAST}"))
        if not self.engines and not self.evals:
            out = {(m, e) for m, e in out if m != "engine"}
        return frozenset(out)

    def snapshot_ready(self, s: JobView) -> bool:
        """A weight update may begin: every rollout engine still in play is in the snapshot (recovered ones too)."""
        want = SNAPSHOT.get(s.rollout)
        return want is not None and all(e.state in want or e.state in self.gone for e in s.engines)

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


class _Effects(NamedTuple):
    """A move's effects, read once: the commands among them and what they do to the engine's memory facts."""

    commands: tuple[str, ...]
    launch: bool  # a new process: holds no weights, releases nothing (then ``add`` is released again)
    add: frozenset[str]  # memory tags released
    drop: frozenset[str]  # memory tags resumed


T = TypeVar("T")


class _Items(Generic[T]):
    """A tuple field of the state that a step changes item by item (an engine group).

    The changes go to a list, copied from the tuple once; the tuple is built again only when something reads the
    whole group, not at every change -- rebuilding it per engine move made a fleet operation over N engines cost
    O(N^2) (issue 32, P7). Reads of one item never build it.
    """

    __slots__ = ("frozen", "items")

    def __init__(self, frozen: tuple[T, ...]) -> None:
        self.frozen: tuple[T, ...] | None = frozen  # the whole, as a tuple (None: changed since it was built)
        self.items: list[T] | None = None  # the working copy, once something changed

    def get(self) -> tuple[T, ...]:
        if self.frozen is None:
            assert self.items is not None
            self.frozen = tuple(self.items)
        return self.frozen

    def put(self, i: int, item: T) -> None:
        items = self.items
        if items is None:
            assert self.frozen is not None
            items = self.items = list(self.frozen)
        items[i] = item
        self.frozen = None


_SCAN = 16  # up to this many commands out, a result is crossed off by a scan (list.remove), above through an index


class _Awaiting:
    """The commands out, while a step adds them and crosses off the ones whose results came back.

    A tuple rebuilt per command (``(*awaiting, cmd)``, and a list copy per result) made a step that hands out or
    hears back from N engines cost O(N^2) (issue 32, P7). Here a result crosses off the first equal command still
    out (exactly what ``list.remove`` did) through an index built once, a new command is appended, and the tuple is
    built once when something reads the whole: O(N + k) for k changes.
    """

    __slots__ = ("frozen", "items", "where")

    def __init__(self, frozen: tuple[Command, ...]) -> None:
        self.frozen: tuple[Command, ...] | None = frozen
        self.items: list[Command | None] | None = None  # the working copy; None: crossed off
        self.where: dict[Command, list[int]] | None = None  # per command, where its copies still out are, in order

    def get(self) -> tuple[Command, ...]:
        if self.frozen is None:
            assert self.items is not None
            self.frozen = tuple([c for c in self.items if c is not None])
            self.items = self.where = None  # the next change starts from the tuple (positions moved)
        return self.frozen

    def _working(self) -> list[Command | None]:
        if self.items is None:
            assert self.frozen is not None
            self.items = list(self.frozen)
        self.frozen = None
        return self.items

    def append(self, cmd: Command) -> None:
        items = self._working()
        if self.where is not None:
            self.where.setdefault(cmd, []).append(len(items))
        items.append(cmd)

    def remove(self, cmd: Command) -> None:
        """Cross off the first command equal to ``cmd`` still out; none: nothing changes."""
        if self.where is None:
            out = self.items if self.items is not None else self.frozen
            assert out is not None
            if len(out) <= _SCAN:  # the few commands a small job has out (the checker's): a scan beats an index
                if cmd in out:
                    self._working().remove(cmd)  # no tombstones yet: the index is what makes them
                return
            where: dict[Command, list[int]] = {}
            for j, c in enumerate(self._working()):
                if c is not None:
                    where.setdefault(c, []).append(j)
            self.where = where
        at = self.where.get(cmd)
        if not at:
            return
        items = self._working()
        items[at.pop(0)] = None
        if not at:
            del self.where[cmd]


def _awaits(awaiting: tuple[Command, ...], lane: str) -> bool:
    """A command of ``lane`` is out (a plain loop: this runs on every step, a generator costs twice as much)."""
    for c in awaiting:  # noqa: SIM110
        if c.lane == lane:
            return True
    return False


class _Tx:
    """One step in progress: the state so far, and the moves and commands it produced."""

    __slots__ = (
        *(name for name in JobState._fields if name not in ("engines", "evals", "awaiting")),
        "_awaiting",
        "_engines",
        "_evals",
        "blocked",
        "commands",
        "commits",
        "core",
        "delay",
        "epoch",
        "fenced",
        "heard",
        "lane",
        "moves",
        "now",
        "refused",
        "s",
        "subject",
    )

    def __init__(self, core: Core, state: JobState, now: float) -> None:
        # the state's fields as attributes: a step changes many of them, and rebuilding a 17-field tuple
        # on every change would cost more than the step itself (the checker takes ~10^6 steps); the engine groups
        # and the commands out are working copies (_Items, _Awaiting), changed in place, built once per read
        (
            self.rollout,
            self.trainer,
            self.monitor,
            self.fleet,
            engines,
            evals,
            self.lock,
            self.committed,
            self.dirty,
            self.ci_pending,
            self.rollout_op,
            self.rollout_program,
            self.trainer_op,
            self.trainer_program,
            awaiting,
            self.failed,
            self.sync,
            self.ahead,
        ) = state
        self._engines, self._evals, self._awaiting = _Items(engines), _Items(evals), _Awaiting(awaiting)
        self.s = self  # the step reads "the state so far" as self.s, like a JobState
        self.core = core
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

    # -- reading and writing the state -------------------------------------------------------------------------
    def state(self) -> JobState:
        return JobState(
            self.rollout,
            self.trainer,
            self.monitor,
            self.fleet,
            self.engines,
            self.evals,
            self.lock,
            self.committed,
            self.dirty,
            self.ci_pending,
            self.rollout_op,
            self.rollout_program,
            self.trainer_op,
            self.trainer_program,
            self.awaiting,
            self.failed,
            self.sync,
            self.ahead,
        )

    @property
    def engines(self) -> tuple[EngineState, ...]:
        return self._engines.get()

    @engines.setter
    def engines(self, engines: tuple[EngineState, ...]) -> None:
        self._engines = _Items(engines)

    @property
    def evals(self) -> tuple[EngineState, ...]:
        return self._evals.get()

    @evals.setter
    def evals(self, evals: tuple[EngineState, ...]) -> None:
        self._evals = _Items(evals)

    @property
    def awaiting(self) -> tuple[Command, ...]:
        return self._awaiting.get()

    @awaiting.setter
    def awaiting(self, awaiting: tuple[Command, ...]) -> None:
        self._awaiting = _Awaiting(awaiting)

    def upd(self, **values: Any) -> _Tx:
        for name, value in values.items():
            setattr(self, name, value)
        return self

    def group(self, group: str) -> tuple[EngineState, ...]:
        """The whole group (built if it changed since the last read: read one engine with :meth:`engine`)."""
        return self.engines if group == ROLLOUT else self.evals

    def engine(self, group: str, i: int) -> EngineState:
        items = self._engines if group == ROLLOUT else self._evals
        working = items.items
        if working is not None:
            return working[i]
        assert items.frozen is not None
        return items.frozen[i]

    def state_of(self, part: str, group: str | None = None, i: int | None = None) -> str:
        if part == "engine":
            assert group is not None and i is not None
            return self.engine(group, i).state
        return str(getattr(self.s, part))

    def set_engine(self, group: str, i: int, e: EngineState) -> None:
        (self._engines if group == ROLLOUT else self._evals).put(i, e)

    def set_lane(self, lane: str, *, op: str | None = None, program: tuple[str, ...] | None = None) -> None:
        if lane == "rollout":
            if op is not None:
                self.rollout_op = op
            if program is not None:
                self.rollout_program = program
        elif lane == "trainer":
            if op is not None:
                self.trainer_op = op
            if program is not None:
                self.trainer_program = program

    def set_machine(self, part: str, state: str) -> None:
        setattr(self, part, state)

    def program(self, lane: str) -> tuple[str, ...]:
        return self.s.rollout_program if lane == "rollout" else self.s.trainer_program

    def lane_op(self, lane: str) -> str:
        return self.s.rollout_op if lane == "rollout" else self.s.trainer_op

    def fail_run(self, failure: Failure) -> None:
        if not self.s.failed:
            self.upd(failed=failure)

    def failure_of(self, cmd: Command, reason: str) -> Failure:
        """A command that could not be carried out at all stops the run: its machine, where it was, and why."""
        state = self.state_of(PART_OF[cmd.machine], cmd.group, cmd.engine) if cmd.machine in PART_OF else ""
        return Failure(cmd.machine, cmd.instance, state, reason)

    # -- firing one machine event: its spec step, its commands, its couplings ---------------------------------
    def fire(
        self, part: str, trigger: str, group: str | None = None, i: int | None = None, *, log: bool = False
    ) -> Step | Blocked | None:
        """Move one machine if its spec allows ``trigger`` now; ``log`` records a guard's refusal."""
        src = self.state_of(part, group, i)
        out = self.core.c[part].table.get((src, trigger))
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
            e = self.engine(group, i)
            dest: Any = out.dest  # a name from the engine spec (the typed names are checked against the specs)
            if fx.launch:  # a new process: a new generation, holding nothing (and in no process group)
                new = EngineState(dest, False, False, fx.add, e.restarts, epoch=e.epoch + 1)
            elif fx.add or fx.drop:
                new = e._replace(state=dest, released=(e.released - fx.drop) | fx.add)
            else:
                new = e._replace(state=dest)
            self.set_engine(group, i, new)
            if e.joined and (fx.launch or dest not in self.core.live):
                self.left_group(group, i)
        else:
            self.set_machine(part, out.dest)
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
                handling.do(self, At(part, group, i, src))
            phases += handling.phases
        if phases:
            self.prepend(self.lane, tuple(phases))
        if group is not None and i is not None and out.dest == "Unhealthy":
            self.unhealthy(group, i)
        return out

    def stale(self, part: str, trigger: str, src: str, group: str | None, i: int | None) -> bool:
        """The news being handled is about an older generation of its engine: the move is fenced, on the record."""
        where = (group, i) if group is not None and i is not None else self.subject
        if where is None:
            return False
        e = self.engine(*where)
        if self.epoch == e.epoch:
            return False
        instance = instance_name(group, i) if group is not None and i is not None else INSTANCE[part]
        fenced = Fenced(PARTS[part], instance, trigger, src, self.heard, self.epoch or 0, e.epoch, len(self.moves))
        self.fenced.append(fenced)
        return True

    def command(self, cmd: Command) -> None:
        delay = self.delay if cmd.effect == "launch_engine" else 0.0
        weights, via = (
            self.loads(cmd.group) if cmd.effect == "transfer_weights" and cmd.machine == "engine" else ("", "")
        )
        cmd = Command(cmd.effect, cmd.machine, cmd.instance, cmd.group, cmd.engine, delay, self.lane, weights, via)
        self.commands.append(cmd)
        self._awaiting.append(cmd)

    # -- what coupled effects do (the dispatch table's ``do``) -----------------------------------------------------
    def report_failure(self, at: At) -> None:
        """A machine's own failing move (its ``report_failure``): the run stops, naming it and where it was."""
        who = instance_name(at.group, at.i) if at.group is not None and at.i is not None else INSTANCE[at.part]
        self.fail_run(Failure(PARTS[at.part], who, at.src))

    def start_engines(self, group: str) -> None:
        """Every slot gets a process: a new one, or the one a previous driver left running (adopted)."""
        for j, e in enumerate(self.s.group(group)):
            self.fire("engine", "adopt" if e.kept else "start", group, j)

    def monitor_to(self, state: str, trigger: str) -> None:
        """The monitor's resume or pause, where it is in the state that allows it ("monitors off": a no-op)."""
        if self.s.monitor == state:
            self.fire("monitor", trigger)

    def stop_monitor(self) -> None:
        if self.core.monitoring(self.s):
            self.fire("monitor", "stop")

    def start_eval_fleet(self) -> None:
        if isinstance(self.fire("fleet", "create"), Step):
            self.start_engines(EVAL)

    def lock_engines(self) -> None:
        self.upd(lock=True, engines=tuple(e._replace(fresh=False) for e in self.s.engines))

    def mark_subject(self) -> None:
        """The monitor's verdict marks the engine its event is about."""
        if self.subject is not None:
            g, j = self.subject
            if self.engine(g, j).state in self.core.markable:
                self.fire("engine", "mark_unhealthy", g, j)

    def probe_evals(self) -> None:
        for j, e in enumerate(self.s.evals):
            if e.state in self.core.live:
                self.command(Command("probe_engine", "engine", instance_name(EVAL, j), EVAL, j))

    def load_snapshot(self) -> None:
        self.upd(evals=tuple(e._replace(fresh=False) for e in self.s.evals))
        self.engines_do(EVAL, "begin_update", SNAPSHOT["Ready"])

    def loads(self, group: str | None) -> tuple[str, str]:
        """What an engine's transfer_weights loads, and how: a rollout engine in the trainer's update takes the
        trainer's new weights (from the weight-update group while it broadcasts, else from their checkpoint);
        every other load -- the initial weights, a catch-up, the eval fleet's snapshot -- the committed ones."""
        if self.lane == "trainer" and group == ROLLOUT:
            return PENDING_WEIGHTS, BROADCAST if self.core.broadcasting(self.s) else ""
        return COMMITTED_WEIGHTS, ""

    def unhealthy(self, group: str, i: int) -> None:
        """An engine that may not be recovered fails at once, or -- one the job did not start -- is let go
        (its spec's ``fail`` and ``detach`` guards say which); a rollout engine that fails while the servers
        start fails the start."""
        if group != ROLLOUT:
            return  # the eval fleet restarts its own engines at its next pin
        if self.s.rollout == "StartingServers":
            self.fire("rollout", "servers_failed")
        state = self.engine(group, i).state
        if isinstance(self.core.c["engine"].table.get((state, "recover")), Blocked):
            self.fire("engine", "recover", group, i, log=True)  # on the record: why it is not recovered
        if not isinstance(self.fire("engine", "fail", group, i), Step):
            self.fire("engine", "detach", group, i)

    def left_group(self, group: str, i: int) -> None:
        """A member's process left (died, was stopped, restarted): the weight-update group is stale."""
        self.set_engine(group, i, self.engine(group, i)._replace(joined=False))
        if self.s.sync == "Connected":
            self.fire("sync", "membership_changed")

    def set_joined(self, members: frozenset[int]) -> None:
        self.upd(engines=tuple(e._replace(joined=j in members) for j, e in enumerate(self.s.engines)))

    def group_ready(self) -> bool:
        """Broadcast mode: the group holds exactly the snapshot's engines, else it is destroyed (stale) or
        connected (again) first -- and the update's ``begin_update`` runs once that command is back."""
        wanted = frozenset(i for i, e in enumerate(self.s.engines) if e.state not in self.core.gone)
        joined = frozenset(i for i, e in enumerate(self.s.engines) if e.joined)
        if self.s.sync == "Connected" and joined != wanted:
            self.fire("sync", "membership_changed")
        if self.s.sync == "Stale" and isinstance(self.fire("sync", "destroy"), Step):
            self.set_joined(frozenset())
            self.prepend(self.lane, ("begin_update",))
            return False
        if self.s.sync in ("Init", "Disconnected"):
            self.set_joined(wanted)  # the members the connect command joins (the shell reads them here)
            if isinstance(self.fire("sync", "connect", log=True), Step):
                self.prepend(self.lane, ("begin_update",))
            return False
        return self.s.sync == "Connected"

    def broadcast_failed(self, reason: str, *, crashed: bool = False) -> None:
        """A broadcast that failed or ran out of time: every engine of the snapshot may hold a mix of two
        versions, so none holds the committed one any more (each reloads it, or stays out); the group is
        destroyed and the trainer's update ends with nothing committed."""
        self.engines_do(ROLLOUT, "abort_update", self.core.updating_engine)
        self.upd(
            engines=tuple(
                e._replace(current=e.current and not e.joined, fresh=False, mixed=e.mixed or e.joined)
                for e in self.s.engines
            )
        )
        self.fire("rollout", "update_failed")
        lane = self.lane
        self.upd(awaiting=tuple(c for c in self.s.awaiting if c.lane != lane))
        self.set_lane(lane, program=())
        if not crashed:  # a crashed worker's trainer moves by its crash (heal or fail), not by the update's end
            self.fire("trainer", "update_done")
        if isinstance(self.fire("sync", "broadcast_failed"), Step):
            self.set_joined(frozenset())

    def prepend(self, lane: str, phases: tuple[str, ...]) -> None:
        if lane in LANES:
            self.set_lane(lane, program=(*phases, *self.program(lane)))

    def composite(self, trigger: str, *, log: bool = False, broadcast: bool = False) -> Step | Blocked | None:
        """A rollout-manager move with the engine moves ``ENGINE_PLAN`` attaches to it (``broadcast``: the
        group's broadcast goes out between the two, so its result is the first to come back)."""
        out = self.core.c["rollout"].table.get((self.s.rollout, trigger))
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
        for j, e in enumerate(self.s.group(group)):
            if e.state in states:
                self.fire("engine", trigger, group, j)

    # -- operations -----------------------------------------------------------------------------------------------
    def operation(self, op: Op) -> None:
        spec = OPERATIONS.get(op.name)
        if spec is None:
            self.refused = Refusal("illegal", f"unknown operation {op.name!r}; known: {', '.join(OPERATIONS)}")
            return
        if self.s.failed and not op.name.endswith("dispose"):
            self.refused = Refusal("failed", str(self.s.failed))
            return
        for lane in (spec.lane, *spec.holds):
            if self.lane_op(lane):
                self.refused = Refusal("busy", f"{op.name}: the {lane} side is busy with {self.lane_op(lane)}")
                return
        if spec.when is not None and not self.core.p[spec.when]:
            self.refused = Refusal("blocked", f"{op.name}: blocked by {spec.when}", (spec.when,))
            return
        main = next((p for p in spec.program if "." in p), None)
        if main is not None:
            part, trigger = main.split(".", 1)
            if part == "engine" and (op.engine is None or not 0 <= op.engine < self.core.engines):
                self.refused = Refusal("illegal", f"{op.name}: no rollout engine {op.engine}")
                return
            group, i = (ROLLOUT, op.engine) if part == "engine" else (None, None)
            src = self.state_of(part, group, i)
            out = self.core.c[part].table.get((src, trigger))
            if isinstance(out, Blocked):
                instance = instance_name(ROLLOUT, op.engine) if op.engine is not None else INSTANCE[part]
                self.blocked.append(
                    BlockedMove(PARTS[part], instance, trigger, src, out.blocked_by, out.guards, len(self.moves))
                )
                self.refused = Refusal("blocked", f"{op.name}: blocked by {', '.join(out.blocked_by)}", out.blocked_by)
                return
            if out is None:
                kind = "not_applicable" if spec.optional else "illegal"
                self.refused = Refusal(kind, f"{op.name}: {PARTS[part]} {trigger!r} is not allowed in state {src!r}")
                return
        # the operation's own machine allows it (or it has none): now the other machines' say
        problem = self.precondition(op)
        if problem is not None:
            self.refused = Refusal("illegal", f"{op.name}: {problem}")
            return
        program = spec.program if op.engine is None else tuple(f"{p}@{op.engine}" for p in spec.program)
        for lane in spec.holds:
            self.set_lane(lane, op=op.name)
        self.set_lane(spec.lane, op=op.name, program=program)

    def precondition(self, op: Op) -> str | None:
        """Which job states allow an operation beyond its own machine's spec (the cross-machine couplings)."""
        s, core = self.s, self.core
        if op.name in ("generate", "eval") and s.dirty:
            return "the last weight update failed and was not redone: engines may hold different weights"
        if op.name in ("generate", "eval") and core.engines and all(e.state in core.gone for e in s.engines):
            return "no rollout engine is in play (all stopped or never started): start one first (start_engine)"
        if op.name == "eval_done" and s.fleet not in ("Init", "Idle"):
            return f"the eval fleet is {s.fleet}: release it first"
        if op.name == "pin" and s.rollout != "Evaluating":
            return f"the rollout manager is {s.rollout}: the fleet is pinned for an eval"
        if op.name == "offload" and s.trainer in core.trainer_busy:
            return f"the trainer is {s.trainer}"
        if op.name == "update_weights" and s.rollout not in SNAPSHOT:
            return f"the rollout manager is {s.rollout}: a weight update starts only from Ready or WeightsOnly"
        if op.name == "train" and s.rollout in ("Init", "Constructed", "StartingServers"):
            return f"the rollout manager is {s.rollout}: nothing has been generated yet"
        if op.name == "offload_train" and s.rollout in core.rollout_busy:
            return f"the rollout manager is {s.rollout}"
        if op.name == "checkpoint" and (s.ahead or s.dirty):
            why = "the last weight update failed" if s.dirty else "the trainer trained since the last weight update"
            return f"{why}: a job checkpoint holds the committed weights only (update weights first)"
        if op.name in ("stop_engine", "start_engine") and (s.rollout != "Ready" or s.lock):
            return "single engines are stopped and started between steps (rollout Ready, engine lock free)"
        return None

    # -- running programs ------------------------------------------------------------------------------------------
    def run_programs(self) -> None:
        for lane in LANES:
            self.lane = lane
            while self.lane_op(lane):
                if self.s.failed:
                    self.set_lane(lane, program=())
                if _awaits(self.awaiting, lane):
                    break
                program = self.program(lane)
                if not program:
                    self.finish(lane)
                    break
                self.set_lane(lane, program=program[1:])
                self.phase(program[0])

    def finish(self, lane: str) -> None:
        """The lane's operation has run all its phases and every command came back."""
        op = self.lane_op(lane)
        self.set_lane(lane, op="", program=())
        for held in OPERATIONS[op.rstrip("!")].holds if op else ():
            self.set_lane(held, op="")

    def phase(self, phase: str) -> None:
        name, _, arg = phase.partition("@")
        if "." not in name:
            getattr(self, f"ph_{name}")()
            return
        part, trigger = name.split(".", 1)
        if part == "rollout":
            out = self.composite(trigger, log=True)
            if isinstance(out, Step) and trigger in ("servers_ready", "update_done"):
                self.commit()
        elif part == "engine":
            self.fire("engine", trigger, ROLLOUT, int(arg), log=True)
        else:
            self.fire(part, trigger, log=True)

    def commit(self) -> None:
        """What the engines took is now the served version (the initial weights, or an update)."""
        self.commits = True
        self.upd(
            committed=True,
            dirty=False,
            ahead=False,
            engines=tuple(
                e._replace(current=e.fresh, fresh=False, mixed=e.mixed and not e.fresh) for e in self.s.engines
            ),
        )

    # -- the core's own phases -------------------------------------------------------------------------------------
    def ph_trainer_ready(self) -> None:
        """The trainer's start ends in Ready: a resumed job's workers restore its checkpoint first (the spec's
        ``resumes`` guard picks the edge; the other one is not on the record: it is not a refusal)."""
        if not isinstance(self.fire("trainer", "restore"), Step):
            self.fire("trainer", "ready", log=True)

    def ph_load_initial(self) -> None:
        """While servers start: every engine that answered receives the initial weights."""
        if self.s.rollout == "StartingServers":
            self.engines_do(ROLLOUT, "begin_update", frozenset({"PendingWeights"}))

    def ph_recover(self) -> None:
        """Every Unhealthy rollout engine is recovered (its spec's guard: rollout FT); once their restarts
        have come back, again for those whose restart failed -- each try spends the restart budget."""
        moved = False
        for i, e in enumerate(self.s.engines):
            if e.state == "Unhealthy" and isinstance(self.fire("engine", "recover", ROLLOUT, i), Step):
                moved = True
        if moved:
            self.prepend(self.lane, ("recover",))

    def ph_catch_up(self) -> None:
        """Restarted engines (PendingWeights) receive the committed weights before they serve."""
        s = self.s
        behind = [j for j, e in enumerate(s.engines) if e.state == "Quiesced" and e.mixed]
        if s.rollout != "Ready" or not s.committed:
            return
        if not behind and not any(e.state == "PendingWeights" for e in s.engines):
            return
        if isinstance(self.composite("catch_up"), Step):
            for j in behind:  # a failed broadcast left them with mixed weights: they reload the committed ones
                self.fire("engine", "begin_update", ROLLOUT, j)
            self.prepend(self.lane, ("catch_up_done",))

    def ph_catch_up_done(self) -> None:
        """The catch-up pushed nothing new: engines that took the committed weights now hold them."""
        if isinstance(self.fire("rollout", "update_done"), Step):
            self.upd(
                engines=tuple(
                    e._replace(current=e.current or e.fresh, fresh=False, mixed=e.mixed and not e.fresh)
                    for e in self.s.engines
                )
            )

    def ph_begin_update(self) -> None:
        """The trainer's push: one snapshot of every engine still in play, under the engine lock."""
        if not self.core.engines:
            return
        if not self.core.snapshot_ready(self.s):
            states = ", ".join(e.state for e in self.s.engines)
            self.fail_run(
                Failure("rollout", "rollout", self.s.rollout, f"weight update: engines not updatable ({states})")
            )
            return
        broadcast = self.core.p["broadcasts_weights"] and self.lane == "trainer"
        if broadcast and not self.group_ready():
            return
        if isinstance(self.composite("begin_update", log=True, broadcast=broadcast), Step):
            self.prepend(self.lane, ("rollout.update_done",))

    def ph_ci_inject(self) -> None:
        """--ci-test under rollout FT: once, one engine is killed while another serves, so recovery runs."""
        serving = self.core.routable(self.s)
        if self.s.ci_pending and len(serving) >= 2 and isinstance(self.fire("rollout", "inject_ci_fault"), Step):
            i = serving[-1]
            self.command(Command("inject_ci_fault", "engine", instance_name(ROLLOUT, i), ROLLOUT, i))
            self.upd(ci_pending=False)

    def ph_require_routable(self) -> None:
        if self.core.engines and self.s.rollout == "Generating" and not self.core.routable(self.s):
            states = ", ".join(e.state for e in self.s.engines)
            self.fail_run(Failure("rollout", "rollout", self.s.rollout, f"generate: no routable engine ({states})"))

    def ph_dispose_engines(self) -> None:
        """Every engine stopped (death confirmed), then released."""
        stopping = False
        for group in (ROLLOUT, EVAL):
            for i in range(len(self.s.group(group))):
                # released where its spec allows it (never started, or stopped); stopped first otherwise
                if self.fire("engine", "dispose", group, i) is None and isinstance(
                    self.fire("engine", "stop", group, i), Step
                ):
                    stopping = True
        if stopping:
            self.prepend(self.lane, ("dispose_engines",))

    def ph_sync_dispose(self) -> None:
        """The weight-update group is destroyed with the trainer; one that never connected has nothing to do."""
        if self.s.sync != "Init":
            self.fire("sync", "dispose")

    def ph_fleet_dispose(self) -> None:
        self.fire("fleet", "release")  # a pin or a skip still held (a no-op where the spec has no release)
        self.fire("fleet", "dispose")

    # -- the eval fleet's pin ---------------------------------------------------------------------------------------
    def ph_fleet_restart(self) -> None:
        """Dead or unhealthy eval engines are stopped (death confirmed) and started again, within their budget."""
        if self.s.fleet != "Restarting":
            return
        acted = False
        for j, e in enumerate(self.s.evals):
            if e.state == "Unhealthy":
                acted |= isinstance(self.fire("engine", "stop", EVAL, j), Step)
            elif (e.state, "start") in self.core.c["engine"].table:  # never started, or stopped
                if e.state == "Stopped":
                    delay, times = next_delay(e.restarts, self.now, self.core.config)
                    self.set_engine(EVAL, j, e._replace(restarts=times))
                    if delay is None:
                        self.fire("fleet", "unhealthy")
                        return
                    self.delay = delay
                acted |= isinstance(self.fire("engine", "start", EVAL, j), Step)
                self.delay = 0.0
        if acted:
            self.prepend(self.lane, ("fleet_restart",))
        else:
            self.fire("fleet", "restarted")

    def ph_fleet_alive(self) -> None:
        if self.s.fleet != "WaitingAlive":
            return
        if all(e.state in SNAPSHOT["Ready"] for e in self.s.evals):
            self.fire("fleet", "alive")
        else:
            self.fire("fleet", "unhealthy")

    def ph_fleet_loaded(self) -> None:
        """All or nothing: every eval engine took the snapshot, or the pin is a violation."""
        if self.s.fleet != "LoadingSnapshot":
            return
        if all(e.state == "Quiesced" and e.fresh for e in self.s.evals):
            self.upd(evals=tuple(e._replace(current=True, fresh=False) for e in self.s.evals))
            if isinstance(self.fire("fleet", "loaded"), Step):
                self.engines_do(EVAL, "resume", frozenset({"Quiesced"}))
        else:
            self.fire("fleet", "version_mismatch")

    def ph_fleet_drain(self) -> None:
        self.engines_do(EVAL, "drain", frozenset({"Serving"}))

    # -- what the shells report -------------------------------------------------------------------------------------
    def news(self, o: Outcome) -> None:
        if o.name == "probe":
            self.fire("monitor", "probe")
            return
        if o.name == "router_died" and o.group is not None:
            self.router_died(o.group)
            return
        if o.group is None or o.engine is None or not 0 <= o.engine < len(self.s.group(o.group)):
            return
        e = self.engine(o.group, o.engine)
        self.subject = (o.group, o.engine)
        self.epoch, self.heard = o.epoch, o.name  # fire() fences what this news would move, if it is stale
        try:
            self.engine_news(o, e)
        finally:
            self.epoch = None

    def engine_news(self, o: Outcome, e: EngineState) -> None:
        core = self.core
        if o.name == "died":  # Ray/the OS saw the process exit: acted on at once, paused or not
            if e.state not in core.live:
                return  # not started, already marked, or a death we caused (a stop, a recovery)
            if core.monitoring(self.s):  # a monitor exists: it turns the death into its verdict
                self.fire("monitor", "engine_died")
            else:
                self.fire("engine", "mark_unhealthy", o.group, o.engine)
        elif o.name == "request_failed":
            if e.state in core.markable:
                self.fire("engine", "mark_unhealthy", o.group, o.engine)
        elif o.name == "replaced" and o.group is not None and o.engine is not None:
            # another process answers at its address: a new generation, holding none of the job's weights. The old
            # one is let go (out of routing); the new one is attached, and caught up before it is routed
            group, i = o.group, o.engine
            if e.state not in core.live or (self.epoch is not None and self.stale("engine", "stop", e.state, group, i)):
                return
            if isinstance(self.fire("engine", "stop", group, i), Step):
                self.set_engine(group, i, self.engine(group, i)._replace(replaced=True))

        elif o.name in ("probe_failed", "threshold_reached", "stale_result") and e.state in core.live:
            self.fire("monitor", o.name)

    def router_died(self, group: str) -> None:
        """The group's router died: it comes back empty, so every Serving engine is registered again (the
        engine spec's ``republish``, under rollout FT); where that is blocked the run stops at once."""
        if isinstance(self.core.c["engine"].table.get(("Serving", "republish")), Blocked):
            for i, e in enumerate(self.s.group(group)):
                if e.state == "Serving":
                    self.subject = (group, i)
                    self.fire("engine", "republish", group, i, log=True)  # on the record: why not
            self.fail_run(
                Failure(
                    "router",
                    f"router-{group}",
                    "",
                    f"router-{group} died: the gateway (SMG) process exited and rollout FT is off",
                    "--use-fault-tolerance --ft-components rollout restarts the router and registers the Serving "
                    "engines again; or run without the router (--no-router)",
                )
            )
            return
        for i, e in enumerate(self.s.group(group)):
            if e.state == "Serving":
                self.fire("engine", "republish", group, i)

    def completed(self, c: Completed) -> None:
        for cmd, result in c.results:
            self._awaiting.remove(cmd)
            self.lane = cmd.lane
            self.result(cmd, result)

    def result(self, cmd: Command, o: Outcome) -> None:
        core = self.core
        if o.name == ERROR:
            self.error(cmd, o.reason or f"{cmd.instance}: {cmd.effect} failed")
            return
        if cmd.machine == "engine" and cmd.group is not None and cmd.engine is not None:
            group, i = cmd.group, cmd.engine
            state = self.engine(group, i).state
            self.subject = (group, i)
            if cmd.effect == "launch_engine":
                if state == "Starting":
                    self.fire("engine", "ready" if o.name == "ready" else "start_failed", group, i)
            elif cmd.effect == "kill_engine":
                if o.name == "alive":
                    self.fail_run(
                        Failure(
                            "engine",
                            cmd.instance,
                            state,
                            f"{cmd.instance}: process still alive after SIGKILL ({o.reason})",
                        )
                    )
                elif state == "Stopping":
                    self.fire("engine", "confirm_dead", group, i)
                    e = self.engine(group, i)
                    if e.kept or e.replaced:  # a disowned or replaced process is let go: the slot gets a new one
                        self.set_engine(group, i, e._replace(kept=False, replaced=False))
                        self.fire("engine", "start", group, i)
                elif state == "Recovering":
                    self.relaunch(group, i)
            elif cmd.effect == "adopt_engine" and state == "Adopting":
                self.adopted(group, i, o.name)
            elif cmd.effect == "transfer_weights" and state in core.updating_engine:
                if o.name == "loaded":
                    if isinstance(self.fire("engine", "finish_update", group, i), Step):
                        self.set_engine(group, i, self.engine(group, i)._replace(fresh=True))
                else:  # refused or unanswered: it must not serve with the weights it holds
                    self.fire("engine", "mark_unhealthy", group, i)
            elif o.name in ("request_failed", "probe_failed") and state in core.markable:
                self.fire("engine", "mark_unhealthy", group, i)
        elif cmd.machine == "weight_sync":
            if cmd.effect == "init_weight_group" and self.s.sync == "Connecting":
                if o.name == "done":
                    self.fire("sync", "connected")
                else:
                    self.group_failed(o.reason or "the weight-update group did not connect")
            elif cmd.effect == "broadcast_weights" and self.s.sync == "Broadcasting":
                if o.name == "done":
                    self.fire("sync", "broadcast_done")
                elif o.name == "worker_crashed":
                    self.broadcast_failed(o.reason, crashed=True)
                    self.crashed(o.reason)
                else:
                    self.broadcast_failed(o.reason)
        elif cmd.machine == "trainer":
            if o.name == "trained":
                # the trained weights are ahead of the served ones until an update commits them (where one can);
                # only a job checkpoint reads it, so only a job that writes them keeps it (a smaller state space)
                if isinstance(self.fire("trainer", "train_done"), Step) and core.tracks_ahead:
                    self.upd(ahead=True)
            elif o.name == "saved":
                self.fire("trainer", "save_done")
            elif o.name == "checkpointed":
                self.fire("trainer", "checkpoint_done")
            elif o.name == "restored":
                self.fire("trainer", "restored")
            elif o.name == "healed":
                if isinstance(self.fire("trainer", "healed"), Step):
                    self.retry()
            elif o.name == "heal_failed":
                self.fail_run(Failure("trainer", "trainer", self.s.trainer, f"trainer: healing failed ({o.reason})"))
            elif o.name == "worker_crashed":
                self.crashed(o.reason)

    def error(self, cmd: Command, reason: str) -> None:
        """A shell could not carry out a command at all (it raised): what that command was for is undone."""
        if cmd.machine == "trainer":
            self.crashed(reason)
            return
        if cmd.machine == "weight_sync":  # a group call that raised (not one that failed): the run cannot go on
            failure = self.failure_of(cmd, reason)
            self.result(cmd, Outcome("failed", reason=reason))
            self.fail_run(failure)
            return
        if cmd.machine != "engine" or cmd.group is None or cmd.engine is None:
            self.fail_run(
                self.failure_of(cmd, reason)
            )  # building the rollout function, the monitor, ...: it cannot go on
            return
        group, i = cmd.group, cmd.engine
        state = self.engine(group, i).state
        if cmd.effect == "launch_engine" and state == "Starting":
            self.fire("engine", "start_failed", group, i)
        elif cmd.effect == "adopt_engine" and state == "Adopting":  # it could not be read: not adopted
            self.adopted(group, i, "lost")
        elif cmd.effect == "kill_engine":
            self.fail_run(
                Failure("engine", cmd.instance, state, f"{cmd.instance}: its death could not be confirmed ({reason})")
            )
        elif cmd.effect == "transfer_weights" and group == ROLLOUT and self.s.rollout in self.core.rollout_updating:
            self.abort_update()
        elif state in self.core.markable:
            self.fire("engine", "mark_unhealthy", group, i)

    def group_failed(self, reason: str) -> None:
        """The group did not connect: nothing was transferred, every engine keeps the committed weights; the
        trainer's update ends (the next one connects again)."""
        if isinstance(self.fire("sync", "connect_failed"), Step):
            self.set_joined(frozenset())
        if self.s.trainer_op:
            self.set_lane("trainer", program=())
            self.fire("trainer", "update_done")

    def adopted(self, group: str, i: int, answer: str) -> None:
        """What a kept engine holds decides how it rejoins: the checkpoint's committed weights (taken at the
        initial commit, like a fresh engine's load), anything else (loaded first), or nothing reachable."""
        if answer == "adopted":
            self.fire("engine", "adopted", group, i)
            self.set_engine(group, i, self.engine(group, i)._replace(kept=False, fresh=True))
        elif answer == "behind":
            self.fire("engine", "adopted_behind", group, i)
            self.set_engine(group, i, self.engine(group, i)._replace(kept=False))
        else:
            self.fire("engine", "disown", group, i)

    def relaunch(self, group: str, i: int) -> None:
        """A recovered engine's old process is gone: start it again within the budget, or give up."""
        e = self.engine(group, i)
        delay, times = next_delay(e.restarts, self.now, self.core.config)
        self.set_engine(group, i, e._replace(restarts=times))
        if delay is None:
            self.fire("engine", "give_up", group, i)
            return
        self.delay = delay
        self.fire("engine", "restart", group, i)
        self.delay = 0.0

    def crashed(self, reason: str) -> None:
        """A trainer worker died: heal from a peer under train FT (then redo the operation), else fail."""
        where = self.s.trainer
        if not isinstance(self.fire("trainer", "worker_crashed"), Step):
            self.fail_run(
                Failure("trainer", "trainer", where, f"trainer: a worker crashed in state {where} ({reason})")
            )
            return
        self.set_lane("trainer", program=())
        if not isinstance(self.fire("trainer", "heal", log=True), Step):
            self.fire("trainer", "fail")

    def retry(self) -> None:
        """After a heal the trainer's operation runs again from its start, once."""
        op = self.s.trainer_op
        if not op:
            return
        if op.endswith("!"):
            self.fail_run(
                Failure(
                    "trainer",
                    "trainer",
                    self.s.trainer,
                    f"trainer: a worker crashed again in {op.rstrip('!')} after a heal",
                )
            )
            return
        self.set_lane("trainer", op=op + "!", program=OPERATIONS[op].program)

    def abort_update(self) -> None:
        """The weight update as a whole failed: every engine keeps what it had, the lock is released, and
        engines that took the new weights are ahead of the committed version until an update succeeds."""
        before = self.s.rollout
        self.engines_do(ROLLOUT, "abort_update", self.core.updating_engine)
        if not isinstance(self.fire("rollout", "update_failed"), Step):
            pass
        elif before == "CatchingUp":  # a catch-up loads the committed version: who took it holds it
            self.upd(
                engines=tuple(
                    e._replace(current=e.current or e.fresh, fresh=False, mixed=e.mixed and not e.fresh)
                    for e in self.s.engines
                )
            )
        else:
            self.upd(
                dirty=True,
                engines=tuple(e._replace(current=e.current and not e.fresh, fresh=False) for e in self.s.engines),
            )
        lane = self.lane
        self.upd(awaiting=tuple(c for c in self.s.awaiting if c.lane != lane))
        self.set_lane(lane, program=())
        if lane == "trainer":  # the trainer's push failed: it is back to Ready, nothing was committed
            self.fire("trainer", "update_done")
