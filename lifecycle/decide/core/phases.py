"""The core's own phases: the named steps of an operation's program (:data:`plan.OPERATIONS`) that are not a
machine event, as one table, ``PHASES``. A phase may put more phases in front of the rest of its operation
(``step.prepend``): the ones it waits for the commands of."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from lifecycle.decide.core import engines, weights
from lifecycle.decide.core.engines import next_delay
from lifecycle.decide.core.model import EVAL, ROLLOUT, Command, Failure, engine_with, instance_name
from lifecycle.decide.core.plan import SNAPSHOT
from lifecycle.decide.spec import Step

if TYPE_CHECKING:
    from lifecycle.decide.core.step import StepDraft


def trainer_ready(step: StepDraft) -> None:
    """The trainer's start ends in Ready: a resumed job's workers restore its checkpoint first (the spec's
    ``resumes`` guard picks the edge; the other one is not on the record: it is not a refusal)."""
    if not isinstance(step.fire("trainer", "restore"), Step):
        step.fire("trainer", "ready", log=True)


def load_initial(step: StepDraft) -> None:
    """While servers start: every engine that answered receives the initial weights."""
    if step.job.rollout == "StartingServers":
        step.engines_do(ROLLOUT, "begin_update", frozenset({"PendingWeights"}))


def recover(step: StepDraft) -> None:
    """Every Unhealthy rollout engine is recovered (its spec's guard: rollout FT); once their restarts
    have come back, again for those whose restart failed -- each try spends the restart budget."""
    moved = False
    for i, e in enumerate(step.job.engines):
        if e.state == "Unhealthy" and isinstance(step.fire("engine", "recover", ROLLOUT, i), Step):
            moved = True
    if moved:
        step.prepend(step.lane, ("recover",))


def reconcile(step: StepDraft) -> None:
    """An elastic fleet's boundary: every leaving engine that may retire does; then the members are brought to the
    target -- the surplus retired (the vacant-soon first: waiting for weights or unhealthy; then the highest slot),
    the gap joined into the lowest vacant slots whose restart budget is not spent, all launched at once. A join that
    fails leaves its slot Retired and the gap for the next boundary. Without bounds: nothing."""
    core = step.core
    if not core.elastic:
        return
    engines.retire_leavers(step)
    job = step.job
    members = list(core.members(job))
    surplus = len(members) - job.target
    if surplus > 0:
        soon = [i for i in members if job.engine(ROLLOUT, i).state in ("PendingWeights", "Unhealthy")]
        rest = sorted((i for i in members if i not in soon), reverse=True)
        for i in (*soon, *rest):
            if surplus <= 0:
                break
            if not job.lock and engines.retirable(step, i):
                step.fire("engine", "retire", ROLLOUT, i)
                surplus -= 1
        return
    for i in range(len(job.engines)):
        if surplus >= 0:
            break
        if engines.join_budget(step, i):
            step.fire("engine", "join", ROLLOUT, i)
            surplus += 1


def read_gateway(step: StepDraft) -> None:
    """An elastic fleet's scale operations, generate and stream end by reading every router's worker list back
    (``gateway.members``): the gateway's members are judged against the routable engines at every step."""
    if step.core.elastic:
        step.command(Command("read_gateway", "rollout", "rollout"))


def catch_up(step: StepDraft) -> None:
    """Restarted engines (PendingWeights) receive the committed weights before they serve."""
    job = step.job
    behind = [j for j, e in enumerate(job.engines) if e.state == "Quiesced" and e.mixed]
    if not isinstance(step.core.compiled["rollout"].table.get((job.rollout, "catch_up")), Step) or not job.committed:
        return  # from Ready, and in a stream (the others generate on)
    if not behind and not any(e.state == "PendingWeights" for e in job.engines):
        return
    if isinstance(step.composite("catch_up"), Step):
        for j in behind:  # a failed broadcast left them with mixed weights: they reload the committed ones
            step.fire("engine", "begin_update", ROLLOUT, j)
        step.prepend(step.lane, ("catch_up_done",))


def catch_up_done(step: StepDraft) -> None:
    """The catch-up pushed nothing new: engines that took the committed weights now hold them."""
    if isinstance(step.fire("rollout", "update_done"), Step):
        weights.took_committed(step)
        weights.resume_stream(step)


def begin_update(step: StepDraft) -> None:
    """The trainer's push: one snapshot of every engine still in play, under the engine lock."""
    core, job = step.core, step.job
    if not core.engines:
        return
    if not core.snapshot_ready(job):
        states = ", ".join(e.state for e in job.engines)
        step.fail_run(Failure("rollout", "rollout", job.rollout, f"weight update: engines not updatable ({states})"))
        return
    broadcast = core.predicates["broadcasts_weights"] and step.lane == "trainer"
    if broadcast and not weights.group_ready(step):
        return
    if isinstance(step.composite("begin_update", log=True, broadcast=broadcast), Step):
        step.prepend(step.lane, ("rollout.update_done", *(("stream_resume",) if core.streaming else ())))


def ci_inject(step: StepDraft) -> None:
    """--ci-test under rollout FT: once, one engine is killed while another serves, so recovery runs."""
    serving = step.core.routable(step.job)
    if step.job.ci_pending and len(serving) >= 2 and isinstance(step.fire("rollout", "inject_ci_fault"), Step):
        i = serving[-1]
        step.command(Command("inject_ci_fault", "engine", instance_name(ROLLOUT, i), ROLLOUT, i))
        step.job.ci_pending = False


def stream_resume(step: StepDraft) -> None:
    """The update is committed: the engines it paused resume their kept requests under the new version."""
    weights.resume_stream(step)


def take_batch(step: StepDraft) -> None:
    """The trainer takes the buffer: every group more than --max-weight-staleness versions behind (or newer than the
    version, which must not happen) is dropped and its prompts re-queued (the rollout manager's drop_stale); the
    trainer trains on the rest, if any."""
    job, bound = step.job, step.core.bound
    kept: list[int] = []
    for age in job.buffer:
        if 0 <= age <= bound or not isinstance(step.fire("rollout", "drop_stale", log=True), Step):
            kept.append(age)
    job.buffer, job.taken = (), tuple(sorted((*job.taken, *kept)))  # a retry after a heal keeps what it took
    if job.taken:
        step.prepend(step.lane, ("trainer.train",))


def require_routable(step: StepDraft) -> None:
    """A generate or a stream starts with an engine to send requests to -- an elastic fleet with at least its
    minimum (--rollout-min-num-gpus)."""
    job, core = step.job, step.core
    if not core.engines or job.rollout not in ("Generating", "Streaming"):
        return
    routable = core.routable(job)
    states = ", ".join(e.state for e in job.engines)
    if not routable:
        step.fail_run(Failure("rollout", "rollout", job.rollout, f"generate: no routable engine ({states})"))
    elif core.elastic and len(routable) < core.min_engines:
        spent = [
            instance_name(ROLLOUT, i)
            for i, e in enumerate(job.engines)
            if e.state == "Retired" and next_delay(e.restarts, step.now, core.config)[0] is None
        ]
        fix = (
            "lower --rollout-min-num-gpus, or set --rollout-max-num-gpus above the target so a replacement "
            "joins before a leaver goes (make-before-break)"
        )
        if spent:
            fix += f"; {', '.join(spent)} spent their restarts: raise --engine-max-restarts"
        reason = (
            f"generate: {len(routable)} routable engine(s), fewer than --rollout-min-num-gpus allows "
            f"({core.min_engines} engines; {states})"
        )
        step.fail_run(Failure("rollout", "rollout", job.rollout, reason, fix))


def dispose_engines(step: StepDraft) -> None:
    """Every engine stopped (death confirmed), then released."""
    stopping = False
    for group in (ROLLOUT, EVAL):
        for i in range(len(step.job.group(group))):
            # released where its spec allows it (never started, or stopped); stopped first otherwise
            if step.fire("engine", "dispose", group, i) is None and (
                isinstance(step.fire("engine", "stop", group, i), Step)
                or isinstance(step.fire("engine", "lost", group, i), Step)  # a drain cut short
            ):
                stopping = True
    if stopping:
        step.prepend(step.lane, ("dispose_engines",))


def sync_dispose(step: StepDraft) -> None:
    """The weight-update group is destroyed with the trainer; one that never connected has nothing to do."""
    if step.job.sync != "Init":
        step.fire("sync", "dispose")


# -- the eval fleet's pin ---------------------------------------------------------------------------------------
def fleet_dispose(step: StepDraft) -> None:
    step.fire("fleet", "release")  # a pin or a skip still held (a no-op where the spec has no release)
    step.fire("fleet", "dispose")


def fleet_restart(step: StepDraft) -> None:
    """Dead or unhealthy eval engines are stopped (death confirmed) and started again, within their budget."""
    if step.job.fleet != "Restarting":
        return
    acted = False
    for j, e in enumerate(step.job.evals):
        if e.state == "Unhealthy":
            acted |= isinstance(step.fire("engine", "stop", EVAL, j), Step)
        elif (e.state, "start") in step.core.compiled["engine"].table:  # never started, or stopped
            if e.state == "Stopped":
                delay, times = next_delay(e.restarts, step.now, step.core.config)
                step.job.set_engine(EVAL, j, engine_with(e, restarts=times))
                if delay is None:
                    step.fire("fleet", "unhealthy")
                    return
                step.delay = delay
            acted |= isinstance(step.fire("engine", "start", EVAL, j), Step)
            step.delay = 0.0
    if acted:
        step.prepend(step.lane, ("fleet_restart",))
    else:
        step.fire("fleet", "restarted")


def fleet_alive(step: StepDraft) -> None:
    if step.job.fleet != "WaitingAlive":
        return
    if all(e.state in SNAPSHOT["Ready"] for e in step.job.evals):
        step.fire("fleet", "alive")
    else:
        step.fire("fleet", "unhealthy")


def fleet_loaded(step: StepDraft) -> None:
    """All or nothing: every eval engine took the snapshot, or the pin is a violation."""
    job = step.job
    if job.fleet != "LoadingSnapshot":
        return
    if all(e.state == "Quiesced" and e.fresh for e in job.evals):
        job.evals = tuple(engine_with(e, current=True, fresh=False) for e in job.evals)
        if isinstance(step.fire("fleet", "loaded"), Step):
            step.engines_do(EVAL, "resume", frozenset({"Quiesced"}))
    else:
        step.fire("fleet", "version_mismatch")


def fleet_drain(step: StepDraft) -> None:
    step.engines_do(EVAL, "drain", frozenset({"Serving"}))


# The phase by name: every phase an operation's program or an effect names (a test holds it to plan.OPERATIONS).
PHASES: dict[str, Callable[[StepDraft], None]] = {
    "trainer_ready": trainer_ready,
    "load_initial": load_initial,
    "recover": recover,
    "reconcile": reconcile,
    "read_gateway": read_gateway,
    "catch_up": catch_up,
    "catch_up_done": catch_up_done,
    "begin_update": begin_update,
    "ci_inject": ci_inject,
    "require_routable": require_routable,
    "stream_resume": stream_resume,
    "take_batch": take_batch,
    "dispose_engines": dispose_engines,
    "sync_dispose": sync_dispose,
    "fleet_dispose": fleet_dispose,
    "fleet_restart": fleet_restart,
    "fleet_alive": fleet_alive,
    "fleet_loaded": fleet_loaded,
    "fleet_drain": fleet_drain,
}
