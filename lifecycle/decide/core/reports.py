"""What the shells report: news (a death, a probe verdict, a failed request, a replaced process, a dead
router) and the results of commands, which :data:`.tables.RESULT_TABLE` says what to do with."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lifecycle.decide.core import engines
from lifecycle.decide.core.model import Completed, EngineState, Failure, Fenced, Outcome, engine_with
from lifecycle.decide.core.tables import apply_result
from lifecycle.decide.spec import Blocked, Step

if TYPE_CHECKING:
    from lifecycle.decide.core.step import StepDraft


def completed(step: StepDraft, c: Completed) -> None:
    """Each result crosses its command off and does what the result table says, in the order given out."""
    job = step.job
    for cmd, result in c.results:
        job.commands_out.remove(cmd)  # its result came back
        step.lane = cmd.lane
        if cmd.machine == "weight_sync" and cmd.generation < job.sync_generation:
            # a call to a weight-update group that has since been re-formed: about members it no longer has
            fenced = Fenced(
                "weight_sync", cmd.instance, cmd.effect, job.sync, result.name, cmd.generation, job.sync_generation
            )
            step.fenced.append(fenced._replace(after=len(step.moves)))
            continue
        apply_result(step, cmd, result)


def news(step: StepDraft, outcome: Outcome) -> None:
    if outcome.name == "probe":
        step.fire("monitor", "probe")
        return
    if outcome.name == "router_died" and outcome.group is not None:
        router_died(step, outcome.group)
        return
    if outcome.name == "group_done":
        group_done(step, outcome)
        return
    if outcome.group is None or outcome.engine is None or not 0 <= outcome.engine < len(step.job.group(outcome.group)):
        return
    e = step.job.engine(outcome.group, outcome.engine)
    step.subject = (outcome.group, outcome.engine)
    step.epoch, step.heard = outcome.epoch, outcome.name  # fire() fences what this news would move, if it is stale
    try:
        engine_news(step, outcome, e)
    finally:
        step.epoch = None


def engine_news(step: StepDraft, outcome: Outcome, e: EngineState) -> None:
    core = step.core
    if outcome.name == "died":  # Ray/the OS saw the process exit: acted on at once, paused or not
        if e.state not in core.live:
            return  # not started, already marked, or a death we caused (a stop, a recovery)
        if core.monitoring(step.job):  # a monitor exists: it turns the death into its verdict
            step.fire("monitor", "engine_died")
        elif outcome.group is not None and outcome.engine is not None:
            engines.fault(step, outcome.group, outcome.engine)
    elif outcome.name == "request_failed" and outcome.group is not None and outcome.engine is not None:
        engines.fault(step, outcome.group, outcome.engine)
    elif outcome.name == "preempt_notice" and outcome.group is not None and outcome.engine is not None:
        engines.notice(step, outcome.group, outcome.engine)
    elif outcome.name == "drained" and outcome.group is not None and outcome.engine is not None:
        step.fire("engine", "drained", outcome.group, outcome.engine)  # fenced: a drain of an earlier process
    elif outcome.name == "replaced" and outcome.group is not None and outcome.engine is not None:
        # another process answers at its address: a new generation, holding none of the job's weights. The old
        # one is let go (out of routing); the new one is attached, and caught up before it is routed
        group, i = outcome.group, outcome.engine
        if e.state not in core.live or (step.epoch is not None and step.stale("engine", "stop", e.state, group, i)):
            return
        if isinstance(step.fire("engine", "stop", group, i), Step):
            step.job.set_engine(group, i, engine_with(step.job.engine(group, i), replaced=True))
    elif outcome.name in ("probe_failed", "threshold_reached", "stale_result") and e.state in core.live:
        step.fire("monitor", outcome.name)


def group_done(step: StepDraft, outcome: Outcome) -> None:
    """The stream completed a group: it is buffered with its staleness against the committed version (a stream's
    news; none is expected without one, and a group without its oldest version cannot be judged: both ignored)."""
    job = step.job
    if not step.core.streaming or outcome.version is None:
        return
    job.buffer = tuple(sorted((*job.buffer, step.core.staleness(job.version, outcome.version))))


def router_died(step: StepDraft, group: str) -> None:
    """The group's router died: it comes back empty, so every Serving engine is registered again (the
    engine spec's ``republish``, under rollout FT); where that is blocked the run stops at once."""
    if isinstance(step.core.compiled["engine"].table.get(("Serving", "republish")), Blocked):
        for i, e in enumerate(step.job.group(group)):
            if e.state == "Serving":
                step.subject = (group, i)
                step.fire("engine", "republish", group, i, log=True)  # on the record: why not
        step.fail_run(
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
    for i, e in enumerate(step.job.group(group)):
        if e.state == "Serving":
            step.fire("engine", "republish", group, i)
