"""The engines: starting them, the monitor and the eval fleet that watch them, marking, recovering, adopting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core.model import EVAL, ROLLOUT, Command, Failure, engine_with, instance_name
from lifecycle.decide.core.parts import INSTANCE, PARTS, Origin
from lifecycle.decide.core.plan import SNAPSHOT
from lifecycle.decide.spec import Blocked, Step

if TYPE_CHECKING:
    from lifecycle.decide.core.step import StepDraft


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


def report_failure(step: StepDraft, origin: Origin) -> None:
    """A machine's own failing move (its ``report_failure``): the run stops, naming it and where it was."""
    if origin.group is not None and origin.engine is not None:
        who = instance_name(origin.group, origin.engine)
    else:
        who = INSTANCE[origin.part]
    step.fail_run(Failure(PARTS[origin.part], who, origin.src))


def start_engines(step: StepDraft, group: str) -> None:
    """Every slot of the initial fleet gets a process: a new one, or the one a previous driver left running (adopted);
    an elastic fleet's other slots stay vacant until a join."""
    first = step.core.initial_engines if group == ROLLOUT else len(step.job.group(group))
    for j, e in enumerate(step.job.group(group)):
        if j < first:
            step.fire("engine", "adopt" if e.kept else "start", group, j)


def arm_ci_fault(step: StepDraft) -> None:
    """--ci-test under rollout FT: the first generate kills one engine (the ci_inject phase)."""
    step.job.ci_pending = True


# -- the health monitor ------------------------------------------------------------------------------------------
def monitor_to(step: StepDraft, state: str, trigger: str) -> None:
    """The monitor's resume or pause, where it is in the state that allows it ("monitors off": a no-op)."""
    if step.job.monitor == state:
        step.fire("monitor", trigger)


def stop_monitor(step: StepDraft) -> None:
    if step.core.monitoring(step.job):
        step.fire("monitor", "stop")


def mark_subject(step: StepDraft) -> None:
    """The monitor's verdict marks the engine its event is about (a leaving one is stopped instead: lost)."""
    if step.subject is not None:
        fault(step, *step.subject)


def fault(step: StepDraft, group: str, i: int) -> None:
    """News that an engine is dead or failing: a member is marked Unhealthy; a leaving one (an elastic fleet's) is
    stopped instead (lost) -- a planned leave never fails the run, never spends a restart."""
    e = step.job.engine(group, i)
    if step.core.leaving(e):
        step.fire("engine", "lost", group, i)
    elif e.state in step.core.markable:
        step.fire("engine", "mark_unhealthy", group, i)


def faultable(step: StepDraft, group: str, i: int) -> bool:
    """News about this engine may move it (:func:`fault`): it may be marked, or it is leaving and may be lost."""
    e = step.job.engine(group, i)
    return e.state in step.core.markable or (
        step.core.leaving(e) and isinstance(step.core.compiled["engine"].table.get((e.state, "lost")), Step)
    )


# -- the eval fleet ------------------------------------------------------------------------------------------------
def start_eval_fleet(step: StepDraft) -> None:
    if isinstance(step.fire("fleet", "create"), Step):
        start_engines(step, EVAL)


def probe_evals(step: StepDraft) -> None:
    for j, e in enumerate(step.job.evals):
        if e.state in step.core.live:
            step.command(Command("probe_engine", "engine", instance_name(EVAL, j), EVAL, j))


def load_snapshot(step: StepDraft) -> None:
    """The eval fleet's engines take one snapshot of the committed weights."""
    step.job.evals = tuple(engine_with(e, fresh=False) if e.fresh else e for e in step.job.evals)
    step.engines_do(EVAL, "begin_update", SNAPSHOT["Ready"])


# -- failures and recovery -------------------------------------------------------------------------------------
def unhealthy(step: StepDraft, group: str, i: int) -> None:
    """An engine that may not be recovered fails at once, or -- one the job did not start -- is let go
    (its spec's ``fail`` and ``detach`` guards say which); a rollout engine that fails while the servers
    start fails the start."""
    if group != ROLLOUT:
        return  # the eval fleet restarts its own engines at its next pin
    if step.job.rollout == "StartingServers":
        step.fire("rollout", "servers_failed")
    state = step.job.engine(group, i).state
    if isinstance(step.core.compiled["engine"].table.get((state, "recover")), Blocked):
        step.fire("engine", "recover", group, i, log=True)  # on the record: why it is not recovered
    if not isinstance(step.fire("engine", "fail", group, i), Step):
        step.fire("engine", "detach", group, i)


# -- an elastic fleet: notices, retirements, joins ------------------------------------------------------------
def notice(step: StepDraft, group: str, i: int) -> None:
    """A preemption notice: the engine leaves the membership (its slot's gap is replaced: the target stays) and
    retires as soon as it may -- at once when Serving (a withdrawal is safe at any time) or when the engine lock is
    free, else when the lock is released or at the next reconcile. Without bounds nothing moves (no fleet to drain)."""
    e = step.job.engine(group, i)
    if not step.core.elastic or group != ROLLOUT or e.state in step.core.gone or step.core.leaving(e):
        return
    if step.epoch is not None and step.stale("engine", "retire", e.state, group, i):
        return  # a notice about a process the slot no longer runs
    step.job.set_engine(group, i, engine_with(e, leaving=True))
    retire_leaver(step, i)


def retirable(step: StepDraft, i: int) -> bool:
    """The rollout engine's state has a retire move now."""
    state = step.job.engine(ROLLOUT, i).state
    return isinstance(step.core.compiled["engine"].table.get((state, "retire")), Step)


def retire_leaver(step: StepDraft, i: int) -> None:
    """A leaving rollout engine retires where it may now: Serving always (it is withdrawn first), any other state
    with a retire move while the engine lock is free (under the lock it is part of an update's snapshot)."""
    e = step.job.engine(ROLLOUT, i)
    if e.leaving and (e.state == "Serving" or (not step.job.lock and retirable(step, i))):
        step.fire("engine", "retire", ROLLOUT, i)


def retire_leavers(step: StepDraft) -> None:
    """Every leaving rollout engine that may retire now does (the engine lock's release, a reconcile)."""
    for i in range(len(step.job.engines)):
        retire_leaver(step, i)


def launched(step: StepDraft, cmd: Command) -> None:
    """A launch answered: the engine is up, holding no weights of the job's (PendingWeights); a joiner that was
    given notice meanwhile retires at once (the engine lock permitting)."""
    group, i = cmd.group, cmd.engine
    assert group is not None and i is not None
    if (
        isinstance(step.fire("engine", "ready", group, i), Step)
        and group == ROLLOUT
        and step.job.engine(group, i).leaving
    ):
        retire_leaver(step, i)


def join_budget(step: StepDraft, i: int) -> bool:
    """A vacant slot may be joined: its state has a join move and its restart budget is not spent (a slot that
    gave up is not launched again before its window lets it restart)."""
    e = step.job.engine(ROLLOUT, i)
    if not isinstance(step.core.compiled["engine"].table.get((e.state, "join")), Step):
        return False
    return next_delay(e.restarts, step.now, step.core.config)[0] is not None


def still_alive(step: StepDraft, cmd: Command, why: str) -> None:
    """A kill whose death is not confirmed: the run stops (a second process is never started beside it)."""
    assert cmd.group is not None and cmd.engine is not None
    state = step.job.engine(cmd.group, cmd.engine).state
    step.fail_run(Failure("engine", cmd.instance, state, f"{cmd.instance}: {why}"))


def killed(step: StepDraft, cmd: Command) -> None:
    """An engine's death is confirmed: a stop ends (a disowned or replaced process's slot gets a new one), a
    recovery relaunches."""
    group, i = cmd.group, cmd.engine
    assert group is not None and i is not None
    e = step.job.engine(group, i)
    state = e.state
    if state == "Retiring" or (state == "Recovering" and e.leaving):  # a leaver's death: the slot is vacant
        step.fire("engine", "retired", group, i)
        if step.job.rollout == "Disposed":  # a drain the dispose cut short, or one that ended as the job did
            step.fire("engine", "dispose", group, i)
    elif state == "Stopping":
        step.fire("engine", "confirm_dead", group, i)
        e = step.job.engine(group, i)
        if e.kept or e.replaced:  # a disowned or replaced process is let go: the slot gets a new one
            step.job.set_engine(group, i, engine_with(e, kept=False, replaced=False))
            step.fire("engine", "start", group, i)
    elif state == "Recovering":
        relaunch(step, group, i)


def relaunch(step: StepDraft, group: str, i: int) -> None:
    """A recovered engine's old process is gone: start it again within the budget, or give up."""
    e = step.job.engine(group, i)
    delay, times = next_delay(e.restarts, step.now, step.core.config)
    step.job.set_engine(group, i, engine_with(e, restarts=times))
    if delay is None:
        step.fire("engine", "give_up", group, i)
        return
    step.delay = delay
    step.fire("engine", "restart", group, i)
    step.delay = 0.0


def adopted(step: StepDraft, cmd: Command, answer: str) -> None:
    """What a kept engine holds decides how it rejoins: the checkpoint's committed weights (taken at the
    initial commit, like a fresh engine's load), anything else (loaded first), or nothing reachable."""
    group, i = cmd.group, cmd.engine
    assert group is not None and i is not None
    if answer == "adopted":
        step.fire("engine", "adopted", group, i)
        step.job.set_engine(group, i, engine_with(step.job.engine(group, i), kept=False, fresh=True))
    elif answer == "behind":
        step.fire("engine", "adopted_behind", group, i)
        step.job.set_engine(group, i, engine_with(step.job.engine(group, i), kept=False))
    else:
        step.fire("engine", "disown", group, i)
