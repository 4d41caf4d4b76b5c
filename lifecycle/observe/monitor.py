"""The live invariant monitor: the job-level invariants that an event log can show, judged event by event.

The explorer proves the invariants over the core's model; this judges the *run* -- the machines' moves
together with what the shells report their I/O did (``engine.weights``, ``engine.probe``,
``engine.memory``, ``engine.routed``, ``rollout.source``) -- so a shell that does something other than
what the core decided shows up as a violation. The same :class:`EventMonitor` runs as a sink of a live
:class:`~lifecycle.decide.events.EventLog` (:class:`MonitorSink`) and over a finished or torn log
(``lifecycle trace check``). Each rule carries the name of the invariant it witnesses
(:data:`lifecycle.check.invariants.INVARIANTS`), and the state sets it needs come from the core, not from here.

In a stream (``--fully-async``) it judges each group the stream reports (``stream.group_buffered``,
``stream.group_taken``, ``stream.group_dropped``) against the committed versions *this log* shows
(``weights.committed``), never against the version the event names: a runtime whose own counter went back
(miles #2244, 57 -> 1) would otherwise vouch for itself.

Why some rules wait for the *next* rollout move: a move is logged before its handlers run (the pause
of the monitor, a release of memory), so the shell's report of the work may come a little after the
move. The runner finishes every command of an operation before the rollout machine moves again, so by
the next rollout move the shell must have caught up.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lifecycle.check.invariants import IN_FLIGHT, INVARIANTS, NEVER_IN_REPLAY
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import Core
from lifecycle.decide.core.model import GROUP_PREFIX, ROLLOUT
from lifecycle.decide.errors import LifecycleError
from lifecycle.decide.events import (
    ADOPTED,
    CHECKPOINTED,
    COMMITTED,
    FLEET,
    GATEWAY,
    GATEWAY_MEMBERS,
    GROUP_BUFFERED,
    GROUP_DROPPED,
    GROUP_TAKEN,
    MEMORY,
    PREEMPT_NOTICE,
    PROBE,
    RESUMED,
    ROLLOUT_SOURCE,
    ROUTED,
    STARTED,
    SYNC_CONNECTED,
    SYNC_DESTROYED,
    TRANSITION,
    VIOLATED,
    WEIGHT_BUCKET,
    WEIGHTS,
    EventLog,
    canonical,
)
from lifecycle.decide.machines import MACHINES
from lifecycle.observe.trace import line

Event = Mapping[str, Any]
FAILED_REFIT = frozenset({"abort_update", "revert"})  # an in-flight update's failure, as an engine's move
MOVES_KEPT = 16  # per engine: far more than the moves of one batch of commands
WITHDRAWALS = frozenset({"stop_routing", "hold_routing"})  # the effects that take an engine out of its gateway
ROUTABLE = "ready"  # the one SMG worker status it routes to (pending | ready | not_ready | failed | draining)

# The elastic fleet's engine states, as transition events spell them (the engine spec tags Draining and Retiring
# "leaving"; tests/lifecycle/observe/test_monitor_elastic.py holds these names to the spec once it has them).
LEAVING = frozenset({"Draining", "Retiring"})  # out of the gateway, on the way out: never a failure
RETIRED = "Retired"  # the slot vacant, its process confirmed dead; a later join is a new process
RETIRE = "retire"  # the trigger of a planned leave (a scale-down, a retire_engines call, a notice)
_ENGINE = MACHINES["engine"]
VACANT = _ENGINE.tagged("gone") | {RETIRED}  # no process in the slot: not a member of the fleet
# an engine in one of these is no longer a rank of the broadcast group it was connected in
DEPARTED = VACANT | LEAVING | {"Stopping", "Unhealthy", "Recovering"}
FAILING = frozenset({"Unhealthy", "Failed"})  # where a death takes an engine; a planned leave never goes there

# the invariants the event stream can witness (each a name of lifecycle.check.invariants); `lifecycle trace check
# --list` prints them with their documentation
JUDGED = (
    "replay_never_constructs",
    "recover_only_with_rollout_ft",
    "train_only_ft_never_recovers_rollout",
    "traffic_only_to_serving",
    "serving_engines_hold_current_weights",
    "engine_lock_held_only_while_updating",
    "monitors_run_only_during_generate_or_eval",
    "onload_restores_what_offload_released",
    "weight_version_never_goes_backwards",
    "gateway_agrees_with_lifecycle",
    "no_trained_group_beyond_staleness",
    "no_group_newer_than_the_version",
    "no_generation_after_failed_update",
    # the elastic fleet (--rollout-min-num-gpus / --rollout-max-num-gpus): joins, leaves, the re-formed group
    "withdrawn_before_it_leaves",
    "no_broadcast_on_stale_group",
    "planned_leave_never_fails_the_run",
    "fleet_within_bounds",
)
assert all(name in INVARIANTS for name in JUDGED), "a judged invariant is missing from lifecycle.check.invariants"


class InvariantViolated(LifecycleError):
    """A run broke an invariant (fatal under --ci-test)."""


@dataclass(frozen=True)
class Violation:
    invariant: str
    problem: str
    index: int  # position in the stream of the event that showed it (0-based)
    related: tuple[int, ...] = ()  # earlier events that took part (the weights the engine reported, ...)
    instance: str | None = None  # the machine instance of the event that showed it (its timeline lane)

    def describe(self) -> str:
        return f"{self.invariant}: {self.problem} (event {self.index + 1})"


@dataclass
class _Job:
    """What the log has shown so far: each instance's state and the facts its shells reported."""

    states: dict[str, str] = field(default_factory=dict)
    # each engine's last moves (ts, state before): where a fact stamped with the time its I/O was done finds the
    # state the engine was in *then* (a command's facts are logged when its whole batch is back)
    moved: dict[str, deque[tuple[str, str]]] = field(default_factory=dict)
    rollout_moves: int = 0
    lock: bool = False
    committed: str | None = None
    committed_at: int = -1
    held: dict[str, tuple[str | None, int]] = field(default_factory=dict)  # instance -> (version, event index)
    released: dict[str, set[str]] = field(default_factory=dict)
    monitor_paused_at: int = -1  # rollout moves seen when the monitor last stopped Running
    checkpointed: tuple[str, int] | None = None  # the version of the last job checkpoint, and its event index
    resuming: tuple[str, int] | None = None  # a resumed run's checkpoint version, until its first commit
    # every commit of the job, its drivers' included: (the step it committed, the version, its event index)
    commits: list[tuple[int | None, str, int]] = field(default_factory=list)
    # the stream's buffered groups: name -> (oldest, event index); at a resume they become ``before`` (what the
    # dead driver had buffered), which the groups the resumed run restores from its checkpoint are held to
    buffered: dict[str, tuple[int, int]] = field(default_factory=dict)
    before: dict[str, tuple[int, int]] = field(default_factory=dict)
    # engines whose in-flight update failed, until they load the committed weights: (its time, its event index)
    failed_refit: dict[str, tuple[str | None, int]] = field(default_factory=dict)
    # each engine's newest process as the facts show it: the highest epoch reported, and the lowest epoch a fact
    # may carry since its last launch (a fact of an older process -- a retired one's late report -- is not its)
    epochs: dict[str, int] = field(default_factory=dict)
    floor: dict[str, int] = field(default_factory=dict)
    # engines on a planned way out (a notice, a retire), until a new process is launched in the slot: event index
    leaving: dict[str, tuple[int, str]] = field(default_factory=dict)
    # the broadcast group: its generation and members as connected (event index), and members departed since
    group: tuple[int | None, frozenset[str], int] | None = None
    generation: int | None = None
    departed: dict[str, tuple[str, int]] = field(default_factory=dict)
    group_gone: int = -1  # the event index of its destroy, while no new generation connected
    members: int = 0  # engines of the rollout group that are members (neither vacant nor leaving)
    serving: int = 0  # engines of the rollout group Serving
    # a generate/stream start, until the next rollout move: (its event index, the most engines Serving since)
    started_at: tuple[int, int] | None = None

    def state(self, instance: str) -> str:
        return self.states.get(instance, "Init")

    def older_process(self, instance: str, epoch: object) -> bool:
        """A fact stamped with an epoch below the slot's newest launch: a process that is gone."""
        return isinstance(epoch, int) and not isinstance(epoch, bool) and epoch < self.floor.get(instance, 0)

    def group_of(self, prefix: str, at: object = None) -> dict[str, str]:
        """Every engine of one group (``engine-*``, ``eval-*``) the log moved, with its state at ``at``."""
        return {name: self.state_at(name, at) for name in self.states if name.rpartition("-")[0] == prefix}

    def state_at(self, instance: str, at: object) -> str:
        """The state ``instance`` was in at ``at`` (a log timestamp; fixed-width ISO strings sort in time order),
        as far back as its remembered moves go; its current state when ``at`` is missing."""
        state = self.state(instance)
        if not isinstance(at, str):
            return state
        for ts, before in reversed(self.moved.get(instance, ())):
            if ts <= at:
                break
            state = before
        return state


class EventMonitor:
    """Feed it events in log order; it returns the violations each one shows.

    The config comes from the constructor or from the log's own ``lifecycle.started`` line; until one is
    known, only the config-independent rules are judged.
    """

    def __init__(self, config: LifecycleConfig | None = None, *, only: Iterable[str] | None = None) -> None:
        self.only = frozenset(only) if only is not None else frozenset(JUDGED)
        unknown = sorted(self.only - set(JUDGED))
        if unknown:
            raise ValueError(f"not judged from events: {', '.join(unknown)} (judged: {', '.join(JUDGED)})")
        self.core: Core | None = None
        self.p: Mapping[str, bool] = {}
        # the config's answers the transition rules ask on every move, read once (all False until a config is known)
        self._replay = self._no_rollout_ft = self._train_only = False
        self.bounds: tuple[int, int] | None = None  # the fleet's (min, max) engines; None: not an elastic run
        self._given = config is not None  # else each driver's lifecycle.started line says (a resumed run: --load)
        if config is not None:
            self._configure(config)
        self.job = _Job()
        self.index = -1
        self.violations: list[Violation] = []
        self._drivers = 0  # lifecycle.started lines seen

    def _configure(self, config: LifecycleConfig) -> None:
        self.core = Core(config)
        self.p = p = self.core.predicates
        self._replay, self._no_rollout_ft = bool(p.get("replay")), bool(p) and not p.get("rollout_ft")
        self._train_only = bool(p.get("train_ft")) and not p.get("rollout_ft")
        self.bounds = fleet_bounds(config.to_dict())

    def feed(self, event: Event) -> list[Violation]:
        self.index += 1
        found: list[Violation] = []
        kind = event.get("event")
        handler = _HANDLERS.get(kind) if isinstance(kind, str) else None
        if "epoch" in event:
            self._epoch(event)
        if handler is not None:
            who = event.get("instance")
            for name, problem, related in handler(self, event):
                if name in self.only:
                    found.append(Violation(name, problem, self.index, related, str(who) if who else None))
        self.violations.extend(found)
        return found

    def feed_all(self, events: Iterable[Event]) -> list[Violation]:
        out: list[Violation] = []
        for e in events:
            out.extend(self.feed(e))
        return out

    # -- the rules, one method per kind of event ------------------------------------------------------------
    def _started(self, e: Event) -> Iterable[_Found]:
        if not self._given and isinstance(e.get("config"), Mapping):
            self._configure(LifecycleConfig.from_mapping(dict(e["config"]), check_paths=False))
        if self.bounds is None and isinstance(e.get("config"), Mapping):  # a --config without the run's bounds
            self.bounds = fleet_bounds(e["config"])
        if self._drivers and self.job.resuming is None:  # a new run in a reused run directory, not a resume
            self.job = _Job()
        self._drivers += 1
        return ()

    def _checkpointed(self, e: Event) -> Iterable[_Found]:
        self.job.checkpointed = (str(e.get("weight_version")), self.index)
        return ()

    def _resumed(self, e: Event) -> Iterable[_Found]:
        """A new driver: every process the log showed died with the old one; what persists is the checkpoint."""
        version, at = str(e.get("weight_version")), e.get("resume_at")
        last, before = self.job.checkpointed, {**self.job.before, **self.job.buffered}
        # the commits of the steps resumed from on died with the driver (void, like their steps); the others were
        # in the checkpoint: a resume below one of them lost versions (miles #2244's 57 -> 1), even where the log
        # lacks the checkpoint's own line
        kept = [c for c in self.job.commits if not isinstance(at, int) or c[0] is None or c[0] < at]
        self.job = _Job(checkpointed=last, resuming=(version, self.index), commits=kept, before=before)
        rule = "weight_version_never_goes_backwards"
        if last is not None and _older(version, last[0]):
            problem = f"the run resumed at weight version {version}, but version {last[0]} was checkpointed after it"
            return [(rule, problem, (last[1],))]
        newer = [c for c in kept if c[0] is not None and _older(version, c[1])]
        if newer:
            step, was, i = max(newer, key=lambda c: int(c[1]))
            problem = (
                f"the run resumed at step {at} with weight version {version}, but version {was} was committed at "
                f"step {step}, before it"
            )
            return [(rule, problem, (i,))]
        return ()

    def _transition(self, e: Event) -> Iterable[_Found]:
        job, core = self.job, self.core
        machine, instance, src, dst = e.get("machine"), str(e.get("instance")), e.get("src"), str(e.get("dst"))
        effects = tuple(e.get("effects") or ())
        out: list[_Found] = []
        if self._replay:
            for x in effects:
                if x in NEVER_IN_REPLAY:
                    out.append(("replay_never_constructs", f"{instance} performed {x} while replaying", ()))
        if self._no_rollout_ft and "recover_engine" in effects:
            out.append(("recover_only_with_rollout_ft", f"{instance} performed recover_engine without rollout FT", ()))
        if self._train_only:
            train_only = "train_only_ft_never_recovers_rollout"
            if machine == "engine" and dst == "Recovering":
                out.append((train_only, f"{instance} is Recovering under train-only fault tolerance", ()))
            if machine == "monitor" and "start_monitor" in effects:  # (its dispose from Init creates nothing)
                out.append((train_only, f"a rollout monitor was created ({dst}) under train-only fault tolerance", ()))
        if "route_traffic" in effects and dst != "Serving":
            out.append(("traffic_only_to_serving", f"{instance} made routable while entering {dst}", ()))
        if machine == "rollout" and core is not None:
            job.rollout_moves += 1
            if job.state("monitor") == "Running" and src not in core.rollout_busy:
                out.append(
                    (
                        "monitors_run_only_during_generate_or_eval",
                        f"the health monitor was running while the rollout manager was {src}",
                        (),
                    )
                )
            job.lock = (job.lock or "acquire_engine_lock" in effects) and "release_engine_lock" not in effects
            updating = dst in core.rollout_updating
            if job.lock != updating:
                held = "still held" if job.lock else "not held"
                out.append(("engine_lock_held_only_while_updating", f"the engine lock is {held} in {dst}", ()))
        if machine == "monitor" and src == "Running" and dst != "Running":
            job.monitor_paused_at = job.rollout_moves
        if machine == "rollout":
            out += self._fleet_at_start(e)
        if "report_failure" in effects:
            out += self._failure_names_a_leaver(e)
        if machine == "engine":
            if "launch_engine" in effects:  # a new process: it holds no verified weights and releases nothing
                job.held.pop(instance, None)
                job.released.pop(instance, None)
                job.leaving.pop(instance, None)
                job.floor[instance] = job.epochs.get(instance, 0) + 1
            out += self._leaves(instance, e, effects)
            if src in IN_FLIGHT and e.get("trigger") in FAILED_REFIT:  # its paused requests hold no future
                job.failed_refit[instance] = (_text(e.get("ts")), self.index)
            if dst == "Serving" and src != "Serving":
                out += self._enters_serving(instance)
            if isinstance(e.get("ts"), str):
                moved = job.moved.get(instance)
                if moved is None:  # not setdefault: its default, a new deque, would be built on every move
                    moved = job.moved[instance] = deque(maxlen=MOVES_KEPT)
                moved.append((e["ts"], str(src)))
        job.states[instance] = dst
        if machine == "engine":
            out += self._members(instance, str(src), dst)
        return out

    def _enters_serving(self, instance: str) -> list[_Found]:
        job = self.job
        out: list[_Found] = []
        if job.committed is not None:
            version, at = job.held.get(instance, (None, -1))
            if version != job.committed:
                holds = f"weight version {version}" if version is not None else "no verified weights"
                problem = f"{instance} entered Serving holding {holds}, the committed version is {job.committed}"
                related = tuple(i for i in (at, job.committed_at) if i >= 0)
                out.append(("serving_engines_hold_current_weights", problem, related))
        released = job.released.get(instance)
        if released:
            problem = f"{instance} entered Serving with memory still released: {', '.join(sorted(released))}"
            out.append(("onload_restores_what_offload_released", problem, ()))
        failed = "no_generation_after_failed_update"
        if instance in job.failed_refit:
            at = job.failed_refit[instance][1]
            problem = f"{instance} entered Serving after its in-flight weight update failed, without loading the "
            out.append((failed, problem + "committed weights since", (at,)))
        version, at = job.held.get(instance, (None, -1))
        if version is not None and job.committed is not None and _older(job.committed, version):
            problem = f"{instance} entered Serving holding weight version {version}, which was never committed "
            out.append((failed, problem + f"(the committed version is {job.committed})", (at,)))
        return out

    def _committed(self, e: Event) -> Iterable[_Found]:
        job, raw = self.job, e.get("weight_version")
        version = None if raw is None else str(raw)
        out: list[_Found] = []
        rule = "weight_version_never_goes_backwards"
        if job.resuming is not None and version is not None:  # first the checkpoint's weights, nothing older
            want, at = job.resuming
            job.resuming = None
            if version != want:
                out.append(
                    (rule, f"a resumed run committed version {version} first, its checkpoint's is {want}", (at,))
                )
        elif job.committed is not None and version is not None and _older(version, job.committed):
            problem = f"weight version {version} was committed after version {job.committed}"
            out.append((rule, problem, (job.committed_at,)))
        elif self.p.get("streaming") and version is not None and version == job.committed and _int(version) is not None:
            # a stream ages every buffered group by one version per commit: a version committed twice is a
            # commit its staleness accounting does not see
            problem = f"weight version {version} was committed twice in a row (a stream's versions only increase)"
            out.append((rule, problem, (job.committed_at,)))
        job.committed = version
        job.committed_at = self.index
        if version is not None:
            step = e.get("step")
            job.commits.append((step if isinstance(step, int) else None, version, self.index))
        return out

    def _weights(self, e: Event) -> Iterable[_Found]:
        if e.get("outcome") == "loaded" and not self.job.older_process(str(e.get("instance")), e.get("epoch")):
            job, instance = self.job, str(e.get("instance"))
            job.held[instance] = (str(e.get("weight_version")), self.index)
            # a load of the engine's own (a catch-up, a restart), not an in-flight update's, ends a failed refit
            if instance in job.failed_refit and job.state_at(instance, e.get("done_at")) == "LoadingWeights":
                del job.failed_refit[instance]
        return ()

    def _adopted(self, e: Event) -> Iterable[_Found]:
        """A kept engine read back by a new driver: the version its server reported is what it holds (whatever the
        verdict: one held back as ``behind`` must be reloaded before it may serve)."""
        version = e.get("weight_version")
        self.job.held[str(e.get("instance"))] = (None if version is None else str(version), self.index)
        return ()

    def _memory(self, e: Event) -> Iterable[_Found]:
        instance, tag = str(e.get("instance")), str(e.get("tag"))
        tags = self.job.released.setdefault(instance, set())
        out: list[_Found] = []
        if e.get("op") == "resume" and tag not in tags:  # an onload must restore what the offload released
            held = ", ".join(sorted(tags)) or "nothing"
            problem = f"{instance} was asked to resume {tag}, which it had not released (released: {held})"
            out.append(("onload_restores_what_offload_released", problem, ()))
        if e.get("outcome") == "done":
            (tags.add if e.get("op") == "release" else tags.discard)(tag)
        return out

    def _routed(self, e: Event) -> Iterable[_Found]:
        instance = str(e.get("instance"))
        state = self.job.state_at(instance, e.get("done_at"))  # when it was added, not when the batch was back
        if state in LEAVING or state == RETIRED:  # on its way out: the withdrawal's own rule names it
            problem = f"{instance} was added to {e.get('router')} while {state}, after it was withdrawn to leave"
            return [("withdrawn_before_it_leaves", problem, ())]
        if state != "Serving":
            return [("traffic_only_to_serving", f"{instance} was added to {e.get('router')} while {state}", ())]
        return ()

    def _gateway(self, e: Event) -> Iterable[_Found]:
        """SMG's view of one worker, read right after the lifecycle registered or removed it: routable
        (``ready``) exactly while Serving -- at the time it was read -- and then labelled with the committed
        version."""
        instance, status = str(e.get("instance")), e.get("status")
        state = self.job.state_at(instance, e.get("done_at"))
        where = f"the gateway {e.get('router')}"
        if (status == "ready") != (state == "Serving"):
            shown = "routes to" if status == "ready" else f"does not route to ({status or 'not registered'})"
            return [("gateway_agrees_with_lifecycle", f"{where} {shown} {instance}, which is {state}", ())]
        committed = self.job.committed
        if status == "ready" and committed is not None and e.get("weight_version") != committed:
            label = e.get("weight_version")
            problem = f"{where} labels {instance} weight version {label}, the committed is {committed}"
            return [("gateway_agrees_with_lifecycle", problem, ())]
        return ()

    def _members_listed(self, e: Event) -> Iterable[_Found]:
        """A router's whole worker list (``gateway.members``): the workers it routes to (``ready``) are exactly the
        Serving engines of its group at the time it was read -- a worker of a retired process, of a URL the job
        does not know, a leaving engine still routed, a Serving one missing are each a disagreement."""
        job, router = self.job, str(e.get("router"))
        prefix = GROUP_PREFIX.get(router.removeprefix("router-"))
        if prefix is None:
            return ()
        at = e.get("done_at")
        states = job.group_of(prefix, at)
        where, rule = f"the gateway {router}", "gateway_agrees_with_lifecycle"
        out: list[_Found] = []
        routed: set[str] = set()
        for w in e.get("workers") or ():
            if not isinstance(w, Mapping) or w.get("status") != ROUTABLE:
                continue
            instance = w.get("instance")
            if not isinstance(instance, str):
                out.append((rule, f"{where} routes to {w.get('url')}, a worker of no engine of the job", ()))
                continue
            if job.older_process(instance, w.get("epoch")):
                problem = (
                    f"{where} routes to {instance}'s process of epoch {w.get('epoch')}, which is gone (the slot's "
                    f"process since is epoch {job.floor[instance]} or later)"
                )
                out.append((rule, problem, ()))
                continue
            routed.add(instance)
            state = job.state_at(instance, at)
            if state != "Serving":  # a leaving engine still ready: its withdrawal did not reach the gateway
                out.append((rule, f"{where} routes to {instance}, which is {state}", ()))
            elif job.committed is not None and str(w.get("weight_version")) != job.committed:
                problem = f"{where} labels {instance} weight version {w.get('weight_version')}, the committed is "
                out.append((rule, problem + str(job.committed), ()))
        for instance in sorted(name for name, state in states.items() if state == "Serving" and name not in routed):
            out.append((rule, f"{where} does not route to {instance}, which is Serving", ()))
        return out

    def _leaves(self, instance: str, e: Event, effects: tuple[str, ...]) -> list[_Found]:
        """An engine's move (before the job records it): the rules of a way out -- withdrawn first, a planned leave
        never a failure, a departed member is no rank of the broadcast group any more."""
        job, src, dst, trigger = self.job, str(e.get("src")), str(e.get("dst")), e.get("trigger")
        out: list[_Found] = []
        if src == "Serving" and dst != "Serving" and not WITHDRAWALS & set(effects):
            problem = f"{instance} left Serving for {dst} ({trigger}) without being withdrawn from its gateway"
            out.append(("withdrawn_before_it_leaves", problem + " (no stop_routing or hold_routing)", ()))
        if trigger == RETIRE and dst in LEAVING and instance not in job.leaving:
            job.leaving[instance] = (self.index, "retired")
        if instance in job.leaving and (trigger == "mark_unhealthy" or dst in FAILING):
            at, how = job.leaving[instance]
            problem = (
                f"{instance} was {how} (a planned leave) and then moved to {dst} ({trigger}): treated as a failure"
            )
            out.append(("planned_leave_never_fails_the_run", problem, (at,)))
        if job.group is not None and dst in DEPARTED and src not in DEPARTED and instance in job.group[1]:
            job.departed.setdefault(instance, (dst, self.index))
        return out

    def _failure_names_a_leaver(self, e: Event) -> list[_Found]:
        """A run failure (``report_failure``) of another part whose reason names an engine on a planned way out (an
        engine's own failing move is judged by :meth:`_leaves`)."""
        reason = str(e.get("reason") or "")
        out: list[_Found] = []
        if e.get("machine") == "engine":
            return out
        for name, (at, how) in sorted(self.job.leaving.items()):
            if re.search(rf"\b{re.escape(name)}\b", reason):
                problem = f"the run failed ({e.get('machine')} {e.get('trigger')}) naming {name}, which was {how}"
                out.append(("planned_leave_never_fails_the_run", problem + " (a planned leave)", (at,)))
        return out

    def _notice(self, e: Event) -> Iterable[_Found]:
        """A notice makes a planned leave only in an elastic fleet; a fixed one ignores it (and fails fast when the
        engine then dies without rollout FT, as it promises)."""
        instance = str(e.get("instance"))
        if self.bounds is not None and not self.job.older_process(instance, e.get("epoch")):
            self.job.leaving.setdefault(instance, (self.index, f"given a preemption notice by {e.get('by')}"))
        return ()

    def _connected(self, e: Event) -> Iterable[_Found]:
        """A broadcast group formed: a new generation (they only increase), with these members."""
        job, generation = self.job, e.get("generation")
        out: list[_Found] = []
        number = generation if isinstance(generation, int) and not isinstance(generation, bool) else None
        if number is not None and job.generation is not None and number <= job.generation:
            at = job.group[2] if job.group is not None else -1
            problem = f"weight group generation {number} connected after generation {job.generation}: "
            out.append(("no_broadcast_on_stale_group", problem + "generations only increase", (at,) if at >= 0 else ()))
        if number is not None:
            job.generation = max(number, job.generation if job.generation is not None else number)
        job.group = (number, frozenset(str(m) for m in e.get("members") or ()), self.index)
        job.departed.clear()
        job.group_gone = -1
        return out

    def _destroyed(self, e: Event) -> Iterable[_Found]:
        if self.job.group is not None:
            self.job.group_gone = self.index
        self.job.group = None
        self.job.departed.clear()
        return ()

    def _bucket(self, e: Event) -> Iterable[_Found]:
        """A bucket of a broadcast goes to every rank of the group: none may have left since it connected."""
        job, rule = self.job, "no_broadcast_on_stale_group"
        if job.group is None:
            if job.group_gone >= 0:
                problem = (
                    "a weight bucket was broadcast after the weight group was destroyed, before a new one connected"
                )
                return [(rule, problem, (job.group_gone,))]
            return ()
        generation, _, connected = job.group
        out: list[_Found] = []
        for instance, (state, at) in sorted(job.departed.items()):
            problem = (
                f"a weight bucket was broadcast over group generation {generation}, but its member {instance} has "
                f"since moved to {state}: the collective waits for a member that has left"
            )
            out.append((rule, problem, (connected, at)))
        return out

    def _members(self, instance: str, src: str, dst: str) -> list[_Found]:
        """``fleet_within_bounds``: the rollout group's members (neither vacant nor leaving) never exceed the max.
        Counted by each move's difference (a move changes each count by at most one)."""
        job = self.job
        if instance.rpartition("-")[0] != GROUP_PREFIX[ROLLOUT]:
            return []
        before = job.members
        job.members += _member(dst) - _member(src)
        job.serving += (dst == "Serving") - (src == "Serving")
        if job.started_at is not None:
            job.started_at = (job.started_at[0], max(job.started_at[1], job.serving))
        if self.bounds is None:
            return []
        members, most = job.members, self.bounds[1]
        if members > most >= before:
            problem = f"{instance} ({dst}) made the fleet {members} members, above its maximum of {most} engines"
            return [("fleet_within_bounds", problem + " (--rollout-max-num-gpus)", ())]
        return []

    def _fleet_at_start(self, e: Event) -> list[_Found]:
        """``fleet_within_bounds`` at a generate/stream start: by the next rollout move (the engines resume after
        the manager's move) at least the minimum of engines served."""
        job, out = self.job, list[_Found]()
        if job.started_at is not None and self.bounds is not None:
            at, most = job.started_at
            if most < self.bounds[0]:
                problem = f"the rollout started with {most} engines Serving, below the minimum of {self.bounds[0]}"
                out.append(("fleet_within_bounds", problem + " (--rollout-min-num-gpus)", (at,)))
        job.started_at = None
        if e.get("trigger") in ("generate", "stream") and e.get("src") != e.get("dst"):
            job.started_at = (self.index, job.serving)
        return out

    def _scaled(self, e: Event) -> Iterable[_Found]:
        target = e.get("target")
        if self.bounds is None or not isinstance(target, int) or isinstance(target, bool):
            return ()
        low, high = self.bounds
        if not low <= target <= high:
            problem = f"the fleet was scaled to {target} engines, outside its bounds {low}..{high}"
            return [("fleet_within_bounds", problem + " (--rollout-min-num-gpus / --rollout-max-num-gpus)", ())]
        return ()

    def _epoch(self, e: Event) -> None:
        """Every fact naming an engine's epoch: the newest process the log has heard of in that slot."""
        instance, epoch = e.get("instance"), e.get("epoch")
        if isinstance(instance, str) and isinstance(epoch, int) and not isinstance(epoch, bool):
            self.job.epochs[instance] = max(epoch, self.job.epochs.get(instance, epoch))

    def _probe(self, e: Event) -> Iterable[_Found]:
        job, instance = self.job, str(e.get("instance"))
        if e.get("by") != "monitor":
            return ()
        if e.get("stale"):
            return ()  # a result the monitor discarded: sent while it ran, back after a pause
        monitor = job.state("monitor")
        if monitor != "Running" and job.rollout_moves > job.monitor_paused_at:
            problem = f"the health monitor probed {instance} and acted on it while {monitor}"
            return [("monitors_run_only_during_generate_or_eval", problem, ())]
        return ()

    def _source(self, e: Event) -> Iterable[_Found]:
        if self.p.get("replay") and e.get("source") != "replay":
            problem = f"rollout {e.get('rollout_id')} called the rollout function while replaying"
            return [("replay_never_constructs", problem, ())]
        return ()

    # -- the stream (--fully-async): each group judged against the versions this log committed -------------------
    def _version(self) -> int | None:
        """The committed version as this log shows it: the last weights.committed, or -- in a resumed run before
        its first commit (its restored groups) -- the checkpoint's."""
        job = self.job
        if job.committed is not None:
            return _int(job.committed)
        return _int(job.resuming[0]) if job.resuming is not None else None

    def _bound(self, e: Event) -> int | None:
        """K: the config's --max-weight-staleness (the event's own ``bound`` only where the config is unknown)."""
        if self.core is not None:
            return self.core.bound if self.core.streaming else None
        bound = e.get("bound")
        return bound if isinstance(bound, int) else None

    def _related(self) -> tuple[int, ...]:
        """The event that set the version a group is counted against: its commit, or the resume before it."""
        job = self.job
        if job.committed_at >= 0:
            return (job.committed_at,)
        return (job.resuming[1],) if job.resuming is not None else ()

    def _group(self, e: Event) -> tuple[str, int | None, list[_Found]]:
        """The group's name, its oldest version (the oldest of ``oldest``, its spans' ``versions`` and the oldest
        it was buffered with), and what is wrong with its versions whatever happens to it: one newer than the
        committed version."""
        name = str(e.get("group"))
        versions = [v for v in (e.get("oldest"), *(e.get("versions") or ())) if v is not None]
        numbers = [n for n in map(_int, versions) if n is not None]
        first = self.job.buffered.get(name) or (self.job.before.get(name) if e.get("restored") else None)
        if first is not None:
            numbers.append(first[0])
        oldest = min(numbers) if numbers else None
        version = self._version()
        out: list[_Found] = []
        if version is not None and numbers and max(numbers) > version:
            problem = (
                f"group {name} holds tokens of weight version {max(numbers)}, newer than the committed version "
                f"{version}: the version went backwards, or an engine generated under weights never committed"
            )
            out.append(("no_group_newer_than_the_version", problem, self._related()))
        return name, oldest, out

    def _judged_version(self, e: Event, name: str) -> list[_Found]:
        """The stream judged the group against the version the event names: it must be the committed one."""
        said, version = e.get("version"), self._version()
        if said is None or version is None or _int(said) == version:
            return []
        problem = f"the stream judged group {name} against weight version {said}, the committed version is {version}"
        return [("no_trained_group_beyond_staleness", problem, self._related())]

    def _group_buffered(self, e: Event) -> Iterable[_Found]:
        job = self.job
        name, oldest, out = self._group(e)
        said = _int(e.get("oldest"))
        # a resumed stream restores a group with the versions it was generated under (AReaL #1388); a group the dead
        # driver completed after its checkpoint was taken is not restored but generated again (a new stamp is right)
        first = job.before.get(name) if e.get("restored") else job.buffered.get(name)
        if first is not None and said is not None and said > first[0]:
            was, at = first
            problem = f"group {name} was buffered again with oldest {said}, first buffered with oldest {was}: "
            out.append(("no_trained_group_beyond_staleness", problem + "its staleness is undercounted", (at,)))
        if oldest is not None and name not in job.buffered:
            job.buffered[name] = (oldest, self.index)
        # an engine whose in-flight update failed generates nothing until it reloads: a group that only engines in
        # that window generated, completed after their failures, shows one that did (a group with samples of
        # another engine too may hold samples a failed engine finished before its pause: not judged)
        named = [str(x) for x in e.get("engines") or ()]
        failed = [job.failed_refit[x] for x in named if x in job.failed_refit]
        if named and len(failed) == len(named):
            done, latest = e.get("done_at"), max(failed, key=lambda f: f[1])
            if not (isinstance(done, str) and latest[0] is not None and done <= latest[0]):
                who = ", ".join(named)
                problem = f"group {name} was generated by {who} after its in-flight weight update failed, before it "
                out.append(
                    ("no_generation_after_failed_update", problem + "loaded the committed weights", (latest[1],))
                )
        return out

    def _group_taken(self, e: Event) -> Iterable[_Found]:
        name, oldest, out = self._group(e)
        self.job.buffered.pop(name, None)
        out += self._judged_version(e, name)
        version, bound, rule = self._version(), self._bound(e), "no_trained_group_beyond_staleness"
        if version is None or bound is None:
            return out  # no committed version yet, or not a stream: nothing to count against
        if oldest is None:
            problem = f"the trainer took group {name}, which names no version: its staleness cannot be judged"
            return [*out, (rule, problem, ())]
        said = _int(e.get("oldest"))
        if said is not None and said > oldest:
            problem = (
                f"group {name} is stamped oldest {said} but holds tokens of version {oldest}: staleness undercounted"
            )
            out.append((rule, problem, ()))
        stale = version - oldest
        if not 0 <= stale <= bound:
            how = f"{stale} versions stale" if stale > 0 else f"newer than the version ({stale})"
            problem = (
                f"the trainer took group {name}, {how} (oldest {oldest}, committed {version}), beyond the bound {bound}"
            )
            out.append((rule, problem, self._related()))
        return out

    def _group_dropped(self, e: Event) -> Iterable[_Found]:
        """A drop is the staleness guard's other answer: it drops exactly the groups beyond the bound, so a fresh
        group dropped shows the guard counted against another version than the committed one -- the same wrong
        count that, the other way round, trains a stale group (and fresh work is thrown away)."""
        name, oldest, out = self._group(e)
        self.job.buffered.pop(name, None)
        out += self._judged_version(e, name)
        version, bound = self._version(), self._bound(e)
        if version is None or bound is None or oldest is None:
            return out
        stale = version - oldest
        if 0 <= stale <= bound:
            problem = (
                f"group {name} was dropped as too stale at {stale} versions (oldest {oldest}, committed {version}), "
            )
            out.append(("no_trained_group_beyond_staleness", problem + f"within the bound {bound}", self._related()))
        return out

    def finish(self) -> list[Violation]:
        """The end of the log: nothing to add today (every rule judges as events arrive)."""
        return []


def fleet_bounds(settings: Mapping[str, Any]) -> tuple[int, int] | None:
    """The fewest and most engines of an elastic fleet from its settings (GPUs / --rollout-num-gpus-per-engine);
    None when neither bound is set (a fixed fleet: ``fleet_within_bounds`` is not judged)."""
    low, high = settings.get("rollout_min_num_gpus"), settings.get("rollout_max_num_gpus")
    if low is None and high is None:
        return None
    per = int(settings.get("rollout_num_gpus_per_engine") or 1)
    gpus = settings.get("rollout_num_gpus")
    most = int(high) // per if high is not None else int(gpus) // per if gpus is not None else None
    return (int(low) // per if low is not None else 1, most if most is not None else 1 << 30)


def _member(state: str) -> bool:
    """A member of the fleet: a process in the slot that is not on its way out."""
    return state not in VACANT and state not in LEAVING


def _int(version: object) -> int | None:
    """A version as a number (they are the trainer's step numbers as text); None for anything else."""
    if isinstance(version, bool):
        return None
    if isinstance(version, int):
        return version
    try:
        return int(str(version))
    except ValueError:
        return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _older(version: str, than: str) -> bool:
    """Versions are the trainer's step numbers; others (a user's labels) have no order to judge."""
    try:
        return int(version) < int(than)
    except ValueError:
        return False


_Found = tuple[str, str, tuple[int, ...]]
_HANDLERS: dict[str, Callable[[EventMonitor, Event], Iterable[_Found]]] = {
    STARTED: EventMonitor._started,
    CHECKPOINTED: EventMonitor._checkpointed,
    RESUMED: EventMonitor._resumed,
    TRANSITION: EventMonitor._transition,
    COMMITTED: EventMonitor._committed,
    WEIGHTS: EventMonitor._weights,
    ADOPTED: EventMonitor._adopted,
    MEMORY: EventMonitor._memory,
    ROUTED: EventMonitor._routed,
    GATEWAY: EventMonitor._gateway,
    PROBE: EventMonitor._probe,
    ROLLOUT_SOURCE: EventMonitor._source,
    GROUP_BUFFERED: EventMonitor._group_buffered,
    GROUP_TAKEN: EventMonitor._group_taken,
    GROUP_DROPPED: EventMonitor._group_dropped,
    GATEWAY_MEMBERS: EventMonitor._members_listed,
    PREEMPT_NOTICE: EventMonitor._notice,
    SYNC_CONNECTED: EventMonitor._connected,
    SYNC_DESTROYED: EventMonitor._destroyed,
    WEIGHT_BUCKET: EventMonitor._bucket,
    FLEET: EventMonitor._scaled,
}


class MonitorSink:
    """The monitor on a live log: each violation is logged as ``lifecycle.invariant_violated``, naming the
    invariant and the events that broke it (as ``lifecycle trace show`` lines, so it reads the same whatever
    the order of the log's sinks), right after the event that showed it."""

    RECENT = 256  # events kept to quote the ones a violation relates to (a weights report some steps back)

    def __init__(self, log: EventLog, config: LifecycleConfig | None = None) -> None:
        self.log = log
        self.monitor = EventMonitor(config)
        self._recent: deque[tuple[int, Mapping[str, Any]]] = deque(maxlen=self.RECENT)

    def __call__(self, event: dict[str, Any]) -> None:
        found = self.monitor.feed(event)  # its own events count too (indices match the file) but show nothing
        self._recent.append((self.monitor.index, event))
        for v in found:
            wanted = {*v.related, v.index}
            quoted = [line(canonical(e)) for i, e in self._recent if i in wanted]
            where = {"instance": v.instance} if v.instance else {}
            self.log.emit(VIOLATED, invariant=v.invariant, problem=v.problem, at=v.index, events=quoted, **where)

    @property
    def violations(self) -> list[Violation]:
        return self.monitor.violations

    def raise_if_violated(self) -> None:
        """--ci-test: the first violation stops the run."""
        if self.monitor.violations:
            first = self.monitor.violations[0]
            raise InvariantViolated(
                f"invariant {first.invariant} violated: {first.problem}. The event log names the events; "
                "`lifecycle trace check events.jsonl` shows them with their context"
            )
