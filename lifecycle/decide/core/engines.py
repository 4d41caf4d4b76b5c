"""The engines: starting them, the monitor and the eval fleet that watch them, marking, recovering, adopting."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core.model import EVAL, ROLLOUT, Command, Failure, instance_name
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
    """Every slot gets a process: a new one, or the one a previous driver left running (adopted)."""
    for j, e in enumerate(step.job.group(group)):
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
    """The monitor's verdict marks the engine its event is about."""
    if step.subject is not None:
        g, j = step.subject
        if step.job.engine(g, j).state in step.core.markable:
            step.fire("engine", "mark_unhealthy", g, j)


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
    step.job.evals = tuple(e._replace(fresh=False) for e in step.job.evals)
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
    state = step.job.engine(group, i).state
    if state == "Stopping":
        step.fire("engine", "confirm_dead", group, i)
        e = step.job.engine(group, i)
        if e.kept or e.replaced:  # a disowned or replaced process is let go: the slot gets a new one
            step.job.set_engine(group, i, e._replace(kept=False, replaced=False))
            step.fire("engine", "start", group, i)
    elif state == "Recovering":
        relaunch(step, group, i)


def relaunch(step: StepDraft, group: str, i: int) -> None:
    """A recovered engine's old process is gone: start it again within the budget, or give up."""
    e = step.job.engine(group, i)
    delay, times = next_delay(e.restarts, step.now, step.core.config)
    step.job.set_engine(group, i, e._replace(restarts=times))
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
        step.job.set_engine(group, i, step.job.engine(group, i)._replace(kept=False, fresh=True))
    elif answer == "behind":
        step.fire("engine", "adopted_behind", group, i)
        step.job.set_engine(group, i, step.job.engine(group, i)._replace(kept=False))
    else:
        step.fire("engine", "disown", group, i)
