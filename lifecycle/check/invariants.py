"""The job-level invariants (the README's invariant table) and the effect-gating rules, as named functions.

Three kinds, each a plain function the explorer *and* the hypothesis suites call, over the core's
state (:class:`lifecycle.decide.core.JobState`) and the checker's world (process health):

* ``state``  -- ``fn(checker, node) -> problem | None``, over one node;
* ``step``   -- ``fn(checker, transition, before) -> problem | None``, over one step of the core and the
  machine moves (with their effects) it made;
* ``reach``  -- ``fn(checker, seen_effects) -> problem | None``, over every effect seen while
  exploring (none registered today: "must happen" rules are written as step obligations, e.g.
  "plain train-only's init constructs the rollout function", so hypothesis can check them too).

A state or step invariant that reads the checker's world (process health, group flags) or the action's name is
registered with ``world=True``; every other one reads only the job (and, for a step, the job before it and the
moves), so the explorer judges it once per job state, or once per decision of the core, not once per node
(:class:`Verdicts`; ``tests/lifecycle/check/test_explore.py`` shows a world-reading invariant left unmarked is caught).

``no_deadlock`` and ``no_stuck_recovery`` are properties of the whole state graph; the explorer
implements them and lists them here so that ``--invariant`` can select them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from lifecycle.check.world import DEAD_NOTIFIED, UP, Checker, Node, Transition
from lifecycle.decide.core import ROLLOUT, SNAPSHOT, instance_name

Problem = str | None


@dataclass(frozen=True)
class Invariant:
    name: str
    kind: str  # state | step | reach | graph
    fn: Callable[..., Problem] | None
    doc: str
    world: bool = False  # reads the world or the action: judged on every node/transition, never remembered


INVARIANTS: dict[str, Invariant] = {}


def _register(kind: str, *, world: bool = False) -> Callable[[Callable[..., Problem]], Callable[..., Problem]]:
    def deco(fn: Callable[..., Problem]) -> Callable[..., Problem]:
        doc = " ".join((fn.__doc__ or "").split())
        INVARIANTS[fn.__name__] = Invariant(fn.__name__, kind, fn, doc, world)
        return fn

    return deco


def _effects(t: Transition, machine: str | None = None) -> Iterable[tuple[str, str]]:
    for m in t.moves:
        if machine is None or m.machine == machine:
            for e in m.effects:
                yield m.instance, e


# -- 1, 2: the construction gate -------------------------------------------------------------------
NEVER_IN_REPLAY = frozenset(
    {"construct_rollout_fn", "construct_eval_fn", "start_servers", "start_monitor", "start_eval_fleet"}
)


@_register("step")
def replay_never_constructs(job: Checker, t: Transition, before: Node) -> Problem:
    """(1) Replay never constructs the rollout/eval function and starts no server, monitor or fleet."""
    if job.p["replay"]:
        for who, effect in _effects(t):
            if effect in NEVER_IN_REPLAY:
                return f"{who} performed {effect} while replaying (--load-debug-rollout-data)"
    return None


@_register("step")
def train_only_starts_no_server(job: Checker, t: Transition, before: Node) -> Problem:
    """(2) --debug-train-only starts no rollout server."""
    if job.p["train_only"]:
        for who, effect in _effects(t):
            if effect == "start_servers":
                return f"{who} started servers under --debug-train-only"
    return None


@_register("step")
def plain_train_only_constructs_rollout_fn(job: Checker, t: Transition, before: Node) -> Problem:
    """(2) Plain --debug-train-only (no replay) still constructs the rollout function: it is the data source."""
    if job.p["train_only"] and not job.p["replay"]:
        for m in t.moves:
            if m.machine == "rollout" and m.trigger == "init" and "construct_rollout_fn" not in m.effects:
                return "--debug-train-only without replay skipped constructing the rollout function (no data for SFT)"
    return None


# -- 3: rollout FT is the one gate -------------------------------------------------------------------
@_register("step")
def recover_only_with_rollout_ft(job: Checker, t: Transition, before: Node) -> Problem:
    """(3) recover_engine runs only under rollout FT -- engine side and trainer side."""
    if not job.p["rollout_ft"]:
        for who, effect in _effects(t):
            if effect == "recover_engine":
                return f"{who} performed recover_engine without rollout fault tolerance"
    return None


@_register("step")
def monitors_only_with_rollout_ft(job: Checker, t: Transition, before: Node) -> Problem:
    """(3) Health monitors are started, and probe, only when monitors_rollout (servers + rollout FT)."""
    if not job.p["monitors_rollout"]:
        for who, effect in _effects(t):
            if effect == "start_monitor" or (who == "monitor" and effect == "probe_engine"):
                return f"{who} performed {effect} although monitors_rollout is false"
    return None


@_register("step")
def ci_injection_only_with_rollout_ft(job: Checker, t: Transition, before: Node) -> Problem:
    """(3) CI fault injection is armed, and injects, only under rollout FT (ci_injects_rollout_faults)."""
    if not job.p["ci_injects_rollout_faults"]:
        for who, effect in _effects(t):
            if effect in ("arm_ci_fault_injection", "inject_ci_fault"):
                return f"{who} performed {effect} without rollout fault tolerance"
    return None


@_register("step")
def fleet_probes_only_when_unmonitored(job: Checker, t: Transition, before: Node) -> Problem:
    """(3) The eval fleet probes its engines only when no monitor does (eval_fleet_self_probes)."""
    if not job.p["eval_fleet_self_probes"]:
        for who, effect in _effects(t, "eval_fleet"):
            if effect == "probe_engine":
                return f"{who} probed its engines although rollout monitors cover them"
    return None


@_register("step")
def fleet_self_probes_when_unmonitored(job: Checker, t: Transition, before: Node) -> Problem:
    """(3) When no rollout monitor exists (rollout FT off), the eval fleet's pin probes its engines itself."""
    if job.p["eval_fleet_self_probes"]:
        for m in t.moves:
            if m.machine == "eval_fleet" and m.trigger == "pin" and "probe_engine" not in m.effects:
                return "the eval fleet pinned without probing, and no rollout monitor probes its engines"
    return None


@_register("state")
def train_only_ft_never_recovers_rollout(job: Checker, n: Node) -> Problem:
    """(3) With --ft-components train no engine is ever Recovering and no monitor exists."""
    if job.p["train_ft"] and not job.p["rollout_ft"]:
        if any(e.state == "Recovering" for e in n.job.engines):
            return "an engine is Recovering under train-only fault tolerance"
        if n.job.monitor != "Init":
            return f"a rollout monitor is {n.job.monitor} under train-only fault tolerance"
    return None


# -- 4: routing ---------------------------------------------------------------------------------------
@_register("state")
def serving_engines_hold_current_weights(job: Checker, n: Node) -> Problem:
    """(4) Every Serving (routable) engine holds the committed weight version; recovered ones wait in PendingWeights."""
    for name, engines in (("engine", n.job.engines), ("eval", n.job.evals)):
        for i, e in enumerate(engines):
            if e.state == "Serving" and not e.current:
                return f"{name}-{i} is Serving without the current weight version"
    return None


@_register("step")
def traffic_only_to_serving(job: Checker, t: Transition, before: Node) -> Problem:
    """(4) route_traffic happens only on a transition into Serving."""
    for m in t.moves:
        if "route_traffic" in m.effects and m.dst != "Serving":
            return f"{m.instance} made routable while entering {m.dst}"
    return None


# -- 5: weight updates ----------------------------------------------------------------------------------
@_register("step")
def weight_update_targets_quiesced_snapshot(job: Checker, t: Transition, before: Node) -> Problem:
    """(5) A weight update starts on one snapshot of quiesced, weight-holding engines, with monitors paused (an
    elastic fleet's leaving engines -- draining, retiring -- are no part of it)."""
    engines: dict[str, str] = {f"engine-{i}": e.state for i, e in enumerate(before.job.engines)}
    monitor: str = before.job.monitor
    for m in t.moves:  # the job as it was at the moment of each move of this step
        if m.machine == "rollout" and m.trigger == "begin_update":
            if monitor == "Running" and "pause_monitor" not in m.effects:  # a stream's update pauses it as it begins
                return "a weight update started while the health monitor was running"
            want = SNAPSHOT.get(m.src, frozenset())
            out = job.core.gone | job.core.leaving_states
            if not all(state in want or state in out for state in engines.values()):
                states = ", ".join(engines.values())
                return f"a weight update started on a fleet that is not one quiesced snapshot ({states})"
        elif m.machine == "engine" and m.instance in engines:
            engines[m.instance] = m.dst
        elif m.machine == "monitor":
            monitor = m.dst
    return None


@_register("state")
def engine_lock_held_only_while_updating(job: Checker, n: Node) -> Problem:
    """(5) The engine lock is held exactly while the rollout side updates weights: released on every exit."""
    updating = n.job.rollout in job.core.rollout_updating
    if n.job.lock and not updating:
        return f"the engine lock is still held in rollout state {n.job.rollout}"
    if updating and not n.job.lock:
        return "weights are being updated without the engine lock"
    return None


# -- 6: offload/onload -------------------------------------------------------------------------------------
@_register("state")
def onload_restores_what_offload_released(job: Checker, n: Node) -> Problem:
    """(6) An engine's released memory tags match its state (the spec's ``releases``); resident states release none."""
    for i, e in enumerate(n.job.engines):
        if e.state in job.core.live and e.released != job.core.releases[e.state]:
            return f"engine-{i} is {e.state} with released memory {sorted(e.released)}"
    return None


@_register("step")
def offload_only_from_quiesced(job: Checker, t: Transition, before: Node) -> Problem:
    """(6) Memory is released only from a quiesced engine while no generation or eval runs."""
    for m in t.moves:
        released = {"release_weights", "release_kv_cache"} & set(m.effects)
        busy = before.job.rollout in job.core.rollout_busy
        if m.machine == "engine" and released and (m.src != "Quiesced" or busy):
            return f"{m.instance} released memory from {m.src} while the rollout manager was {before.job.rollout}"
    return None


# -- 7: monitors -----------------------------------------------------------------------------------------------
@_register("state")
def monitors_run_only_during_generate_or_eval(job: Checker, n: Node) -> Problem:
    """(7) A monitor runs only while the rollout manager generates or evaluates."""
    if n.job.monitor == "Running" and n.job.rollout not in job.core.rollout_busy:
        return f"the health monitor is running while the rollout manager is {n.job.rollout}"
    return None


# -- health and shutdown -------------------------------------------------------------------------------------
@_register("state", world=True)
def dead_engines_are_not_counted_alive(job: Checker, n: Node) -> Problem:
    """An engine whose death Ray has reported is never left in a live state (also while monitors are paused)."""
    for i, (e, proc) in enumerate(zip(n.job.engines, n.world.procs, strict=True)):
        if proc == DEAD_NOTIFIED and e.state in job.core.live:
            return f"engine-{i} is dead (Ray reported it) but still counted alive in {e.state}"
    return None


@_register("step", world=True)
def healthy_engines_are_not_marked_unhealthy(job: Checker, t: Transition, before: Node) -> Problem:
    """A probe result is acted on only while the monitor runs: a stale failure must not kill a healthy engine."""
    if not any(m.machine == "monitor" and "mark_engine_unhealthy" in m.effects for m in t.moves):
        return None
    for m in t.moves:
        if m.machine == "engine" and m.trigger == "mark_unhealthy" and m.instance.startswith("engine-"):
            i = int(m.instance.rsplit("-", 1)[1])
            if before.world.procs[i] == UP:
                return f"{m.instance} was marked Unhealthy although its process is healthy (a stale probe result)"
    return None


STOPPING = frozenset({"Stopping", "Retiring"})


@_register("state")
def a_stopping_engine_has_its_kill_out(job: Checker, n: Node) -> Problem:
    """(elastic) An engine the job is stopping (Stopping, Retiring) has its kill out until its death is confirmed:
    a kill dropped with a failed operation's commands would leave the slot neither live nor vacant, never confirmed
    dead, never joined again. Judged in an elastic fleet only: a fixed fleet with external engines under rollout FT
    still drops a detach's kill when the update whose load refusal detached it fails as a whole (open)."""
    if n.job.failed or not job.core.elastic:
        return None
    for i, e in enumerate(n.job.engines):
        if e.state in STOPPING and not any(
            c.effect == "kill_engine" and c.group == ROLLOUT and c.engine == i for c in n.job.awaiting
        ):
            return f"engine-{i} is {e.state} but no kill of it is out: its death is never confirmed"
    return None


@_register("state")
def external_engines_never_restarted(job: Checker, n: Node) -> Problem:
    """An engine the job did not start (--rollout-external-engine-addrs) is never restarted by it."""
    if job.p["external_engines"]:
        for i, e in enumerate(n.job.engines):
            if e.state == "Recovering":
                return f"engine-{i} is external but Recovering: the job would relaunch a server it does not own"
    return None


@_register("step", world=True)
def no_broadcast_on_stale_group(job: Checker, t: Transition, before: Node) -> Problem:
    """(broadcast; 10) No collective waits for a member that has left: a broadcast goes only to a group whose
    members are exactly the snapshot's engines, every one the process that joined it -- never to a group a member
    left (an elastic fleet's retired or draining engine), died in or restarted since. Over event logs: no
    weight_sync.bucket after a member of the last weight_sync.connected generation moved out (leaving, stopped,
    unhealthy, retired) or after its group was destroyed, and generations only increase."""
    if not any(m.machine == "weight_sync" and m.trigger == "broadcast" for m in t.moves):
        return None
    receivers = {m.instance for m in t.moves if m.machine == "engine" and m.trigger == "begin_update"}
    w = t.node.world  # the group as the step left it (a connect that came back in this step counts)
    members = {f"engine-{i}" for i, g in enumerate(w.grouped) if g}
    if receivers != members:
        return f"broadcast to {sorted(receivers)} over a group whose members are {sorted(members)} (stale)"
    return None


@_register("state", world=True)
def no_engine_routed_with_mixed_weights(job: Checker, n: Node) -> Problem:
    """(broadcast) After a failed broadcast no engine of its snapshot is routed until it has reloaded the
    committed weights (or been restarted): none serves a mix of two versions."""
    for i, (e, torn) in enumerate(zip(n.job.engines, n.world.torn, strict=False)):
        if torn and e.state == "Serving":
            return f"engine-{i} is Serving with the mixed weights of a failed broadcast"
    return None


@_register("state", world=True)
def stopped_only_after_death_confirmed(job: Checker, n: Node) -> Problem:
    """An engine is Stopped only once its process is confirmed dead."""
    for i, (e, proc) in enumerate(zip(n.job.engines, n.world.procs, strict=True)):
        if e.state == "Stopped" and proc != DEAD_NOTIFIED:
            return f"engine-{i} is Stopped but its process was not confirmed dead ({proc})"
    return None


# -- 10: an elastic fleet's joins and leaves --------------------------------------------------------------------------
WITHDRAWALS = frozenset({"stop_routing", "hold_routing"})
FAILING = frozenset({"Unhealthy", "Failed"})


@_register("step")
def withdrawn_before_it_leaves(job: Checker, t: Transition, before: Node) -> Problem:
    """(10) Every move of an engine out of Serving carries stop_routing or hold_routing: the gateway forgets it
    before it drains, pauses, stops or is marked (NeMo-RL #3613: deregistration on every way out). Over event logs
    also: an engine on its way out (Draining, Retiring) or Retired is never routed -- no engine.routed, and no
    gateway.members list that calls it ready."""
    for m in t.moves:
        if m.machine == "engine" and m.src == "Serving" and m.dst != "Serving" and not WITHDRAWALS & set(m.effects):
            return f"{m.instance} left Serving for {m.dst} ({m.trigger}) without stop_routing or hold_routing"
    return None


@_register("step")
def planned_leave_never_fails_the_run(job: Checker, t: Transition, before: Node) -> Problem:
    """(10) A planned leave is not a death: an engine given a preemption notice or retired (leaving, or in a
    leaving state) never moves to Unhealthy or Failed until a new process is launched in its slot, and no run
    failure names it (verl #6583: one engine's end brought the whole job down). Over event logs: after an
    engine.preempt_notice or a retire move, no mark_unhealthy or fail of that engine and no report_failure naming
    it."""
    core = job.core
    if not core.elastic:
        return None
    leavers = {f"engine-{i}" for i, e in enumerate(before.job.engines) if core.leaving(e)}
    leavers |= {f"engine-{i}" for i, e in enumerate(t.node.job.engines) if e.leaving}
    for m in t.moves:
        if m.machine != "engine":
            continue
        if m.dst in FAILING and (m.instance in leavers or m.trigger == "retire"):
            return f"{m.instance} moved {m.src}→{m.dst} ({m.trigger}) on its way out: a planned leave failed it"
        if m.trigger == "retire" or m.dst in core.leaving_states:
            leavers.add(m.instance)
        elif m.trigger == "join":  # a new process in the slot: a member again
            leavers.discard(m.instance)
    failure = t.node.job.failed
    if failure is not None and before.job.failed is None and failure.instance in leavers:
        return f"the run failed naming {failure.instance}, which was leaving ({failure})"
    return None


# -- resume after the driver's death ----------------------------------------------------------------------------------
@_register("step")
def job_checkpoint_holds_committed_weights(job: Checker, t: Transition, before: Node) -> Problem:
    """A job checkpoint is written only on the committed weights -- no training step or failed update since the
    last commit, nothing moving rollout-side -- so a job resumed from it serves that version, never an older one."""
    for m in t.moves:
        if m.machine == "trainer" and "save_job_state" in m.effects:
            b = before.job
            if b.ahead or b.dirty:
                why = "the last weight update failed" if b.dirty else "the trainer trained since the last commit"
                return f"a job checkpoint was written although {why}"
            if b.lock or b.rollout_op:
                return f"a job checkpoint was written while the rollout side was busy ({b.rollout_op or 'lock held'})"
    return None


# -- generations: news about an engine's earlier process -------------------------------------------------------------
@_register("step", world=True)
def no_news_of_an_older_epoch_acted_on(job: Checker, t: Transition, before: Node) -> Problem:
    """A death report, probe verdict or failed request about an engine's earlier process (an older epoch: before
    its restart, or the previous driver's) moves no machine: it says nothing about the process the engine has now
    (miles #2172, a verdict of a previous generation published after a restart)."""
    if t.action.name.startswith("news.stale_epoch_") and t.moves:
        moved = ", ".join(f"{m.instance} {m.trigger}" for m in t.moves)
        who = instance_name(t.action.group, t.action.engine or 0)
        what = t.action.name.removeprefix("news.stale_epoch_")
        return f"news about an older generation of {who} ({what}) was acted on: {moved}"
    return None


# -- streaming (--fully-async) ---------------------------------------------------------------------------------------
@_register("state")
def no_trained_group_beyond_staleness(job: Checker, n: Node) -> Problem:
    """(9) The trainer trains only on groups whose oldest token is at most --max-weight-staleness versions behind the
    committed version, counted when it takes them (their time in the buffer counts): a staler group is dropped and
    its prompts re-queued, never trained (slime #2278, prime-rl #3313)."""
    for age in n.job.taken:
        if not 0 <= age <= job.core.bound:
            beyond = f"more than {job.core.bound}" if age > job.core.bound else "a negative number of"
            return f"the trainer trains on a group {beyond} versions stale (--max-weight-staleness {job.core.bound})"
    return None


@_register("state")
def no_group_newer_than_the_version(job: Checker, n: Node) -> Problem:
    """(9) Weight versions never go backwards: no buffered or trained group is newer than the committed version --
    across a worker's heal, an engine's recovery, a driver's death and a resume (miles #2244: a failover published
    57 -> 1, staleness went negative, and the most off-policy groups passed the filter)."""
    if any(age < 0 for age in (*n.job.buffer, *n.job.taken)):
        return "a buffered group is newer than the committed version: the version went backwards"
    return None


IN_FLIGHT = frozenset({"Paused", "UpdatingInFlight"})  # an engine an in-flight update paused, holding kept requests


@_register("step")
def no_generation_after_failed_update(job: Checker, t: Transition, before: Node) -> Problem:
    """(9) An in-flight weight update that failed resumes no engine it paused: each holds weights that were never
    published (or a mix), so it hands its requests back and serves only after loading the committed ones (the SMG
    ``paused()`` helper resumed engines after a failed refit). A lock-step update's engines are judged by (4)."""
    if any(m.machine == "rollout" and m.trigger == "update_failed" for m in t.moves):
        for m in t.moves:
            if m.machine == "engine" and m.dst == "Serving" and m.src in IN_FLIGHT:
                return f"{m.instance} resumed serving ({m.src}→Serving) in the step its weight update failed"
    return None


# -- graph-level (implemented by the explorer) ------------------------------------------------------------------------
INVARIANTS["no_deadlock"] = Invariant(
    "no_deadlock",
    "graph",
    None,
    "Every state where the run has not stopped can go on without a fault: an operation, a result, a report.",
)
INVARIANTS["no_stuck_recovery"] = Invariant(
    "no_stuck_recovery",
    "graph",
    None,
    "Under rollout FT, from every state with an Unhealthy or Recovering engine, a state where all engines are "
    "Serving-capable again, or the run failed fast, is reachable.",
)
INVARIANTS["train_only_ft_rollout_side_equals_no_ft"] = Invariant(
    "train_only_ft_rollout_side_equals_no_ft",
    "lattice",
    None,
    "(8) The rollout-side machines (rollout, engine, monitor, eval fleet) behave identically under "
    "--ft-components train and without FT, so their event streams are equal.",
)

INVARIANTS["weight_version_never_goes_backwards"] = Invariant(
    "weight_version_never_goes_backwards",
    "trace",
    None,
    "Committed weight versions only increase within a run, and a resumed run commits first the version of the "
    "checkpoint it resumed from, which is the last version that run checkpointed (versions committed after that "
    "checkpoint died with the driver and are listed as discarded); judged over event logs (lifecycle trace check).",
)

INVARIANTS["gateway_agrees_with_lifecycle"] = Invariant(
    "gateway_agrees_with_lifecycle",
    "trace",
    None,
    "The gateway (SMG) routes to an engine exactly while the lifecycle holds it Serving, labelled with the committed "
    "weight version: what SMG reports for a worker right after its registration or removal is read back as a fact, "
    "and a worker SMG calls routable that is not Serving, a Serving one it does not, or a label that differs from "
    "the committed version is a violation; a router's whole worker list (gateway.members) calls ready exactly the "
    "Serving engines of its group, each by its current process (a worker of a retired process or of no engine is "
    "a violation); judged over event logs (lifecycle trace check).",
)

INVARIANTS["fleet_within_bounds"] = Invariant(
    "fleet_within_bounds",
    "trace",
    None,
    "An elastic fleet (--rollout-min-num-gpus / --rollout-max-num-gpus, in engines: GPUs / "
    "--rollout-num-gpus-per-engine) never holds more members (engines neither vacant nor leaving) than its maximum, "
    "is never scaled (fleet.scaled) outside its bounds, and has at least its minimum of engines Serving at every "
    "generate or stream start; judged over event logs (lifecycle trace check) from lifecycle.started's bounds.",
)

STATE = [i for i in INVARIANTS.values() if i.kind == "state"]
STEP = [i for i in INVARIANTS.values() if i.kind == "step"]
STATE_JOB, STATE_WORLD = [i for i in STATE if not i.world], [i for i in STATE if i.world]
STEP_JOB, STEP_WORLD = [i for i in STEP if not i.world], [i for i in STEP if i.world]
REACH = [i for i in INVARIANTS.values() if i.kind == "reach"]


def check_state(
    job: Checker, n: Node, only: frozenset[str] | None = None, verdicts: Verdicts | None = None
) -> list[tuple[str, str]]:
    """Every state-invariant violation of ``s`` as (name, problem)."""
    if verdicts is not None:
        return verdicts.state(job, n, only)
    return _judge_state(STATE, job, n, only)


def _judge_state(
    invariants: Iterable[Invariant], job: Checker, n: Node, only: frozenset[str] | None
) -> list[tuple[str, str]]:
    out = []
    for inv in invariants:
        if only is None or inv.name in only:
            assert inv.fn is not None
            problem = inv.fn(job, n)
            if problem:
                out.append((inv.name, problem))
    return out


def _judge_step(
    invariants: Iterable[Invariant], job: Checker, t: Transition, before: Node, only: frozenset[str] | None
) -> list[tuple[str, str]]:
    out = []
    for inv in invariants:
        if only is None or inv.name in only:
            assert inv.fn is not None
            problem = inv.fn(job, t, before)
            if problem:
                out.append((inv.name, problem))
    return out


def check_step(
    job: Checker,
    t: Transition,
    before: Node,
    only: frozenset[str] | None = None,
    *,
    with_state: bool = True,
    verdicts: Verdicts | None = None,
) -> list[tuple[str, str]]:
    """Every step-invariant violation of one step of the core, and of the state it reaches (``with_state``)."""
    out = verdicts.step(job, t, before, only) if verdicts is not None else _judge_step(STEP, job, t, before, only)
    return out + check_state(job, t.node, only, verdicts) if with_state else out


class Verdicts:
    """The job-only invariants' verdicts, remembered for one exploration: a job state is reached under many worlds
    (about four nodes per job state) and a decision of the core under many more, and what a job-only invariant says
    cannot differ between them. Keyed by identity -- the checker hands out one object per decision and job state --
    and each entry holds its key object, so an id is never reused while remembered."""

    def __init__(self) -> None:
        self._steps: dict[int, tuple[object, list[tuple[str, str]]]] = {}
        self._states: dict[int, tuple[object, list[tuple[str, str]]]] = {}

    def step(self, job: Checker, t: Transition, before: Node, only: frozenset[str] | None) -> list[tuple[str, str]]:
        out = _judge_step(STEP_WORLD, job, t, before, only)
        if not t.moves:  # the empty tuple is one object for every decision: nothing to remember it by
            return _judge_step(STEP_JOB, job, t, before, only) + out
        entry = self._steps.get(id(t.moves))
        if entry is None or entry[0] is not t.moves:
            entry = self._steps[id(t.moves)] = (t.moves, _judge_step(STEP_JOB, job, t, before, only))
        return entry[1] + out if entry[1] else out

    def state(self, job: Checker, n: Node, only: frozenset[str] | None) -> list[tuple[str, str]]:
        out = _judge_state(STATE_WORLD, job, n, only)
        entry = self._states.get(id(n.job))
        if entry is None or entry[0] is not n.job:
            entry = self._states[id(n.job)] = (n.job, _judge_state(STATE_JOB, job, n, only))
        return entry[1] + out if entry[1] else out


def check_reach(
    job: Checker, seen: frozenset[tuple[str, str]], only: frozenset[str] | None = None
) -> list[tuple[str, str]]:
    out = []
    for inv in REACH:
        if only is None or inv.name in only:
            assert inv.fn is not None
            problem = inv.fn(job, seen)
            if problem:
                out.append((inv.name, problem))
    return out
