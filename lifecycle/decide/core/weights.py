"""The weight update: the engine lock, what each engine loads and how, the broadcast group, commit and abort."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lifecycle.decide.core import engines, trainer
from lifecycle.decide.core.model import BROADCAST, COMMITTED_WEIGHTS, PENDING_WEIGHTS, ROLLOUT, Command, engine_with
from lifecycle.decide.spec import Step

if TYPE_CHECKING:
    from lifecycle.decide.core.step import StepDraft


def lock_engines(step: StepDraft) -> None:
    """The engine lock is taken: no engine has taken the update yet."""
    job = step.job
    job.lock = True
    job.engines = tuple(engine_with(e, fresh=False) if e.fresh else e for e in job.engines)


def unlock_engines(step: StepDraft) -> None:
    """The engine lock is released: an elastic fleet's engines given notice under it retire now -- as news, not as
    the update's work: a failed update drops its lane's commands still out, and a leaver's kill must not go with
    them (its slot would stay Retiring, never confirmed dead)."""
    step.job.lock = False
    if step.core.elastic:
        lane, step.lane = step.lane, "news"
        engines.retire_leavers(step)
        step.lane = lane


def loads(step: StepDraft, group: str | None) -> tuple[str, str]:
    """What an engine's transfer_weights loads, and how: a rollout engine in the trainer's update takes the
    trainer's new weights (from the weight-update group while it broadcasts, else from their checkpoint);
    every other load -- the initial weights, a catch-up, the eval fleet's snapshot -- the committed ones."""
    if step.lane == "trainer" and group == ROLLOUT:
        return PENDING_WEIGHTS, BROADCAST if step.core.broadcasting(step.job) else ""
    return COMMITTED_WEIGHTS, ""


def loaded(step: StepDraft, cmd: Command) -> None:
    """An engine took the weights: it holds them once they are committed."""
    group, i = cmd.group, cmd.engine
    assert group is not None and i is not None
    if isinstance(step.fire("engine", "finish_update", group, i), Step):
        step.job.set_engine(group, i, engine_with(step.job.engine(group, i), fresh=True))


def commit(step: StepDraft, *, update: bool = True) -> None:
    """What the engines took is now the served version (the initial weights -- a resumed job's, its checkpoint's --
    or an update: a new version)."""
    step.commits = True
    job = step.job
    job.committed, job.dirty, job.ahead = True, False, False
    job.engines = tuple(
        engine_with(e, current=e.fresh, fresh=False, mixed=e.mixed and not e.fresh) for e in job.engines
    )
    if step.core.streaming and update:  # a new version: every buffered group is one version staler
        job.version += 1
        bound = step.core.bound
        job.buffer = tuple(age if age < 0 else min(bound + 1, age + 1) for age in job.buffer)


def took_committed(step: StepDraft) -> None:
    """A catch-up loaded the committed version: the engines that took it hold it."""
    job = step.job
    job.engines = tuple(
        engine_with(e, current=e.current or e.fresh, fresh=False, mixed=e.mixed and not e.fresh) for e in job.engines
    )


def abort_update(step: StepDraft) -> None:
    """The weight update as a whole failed: every engine keeps what it had, the lock is released, and
    engines that took the new weights are ahead of the committed version until an update succeeds."""
    job = step.job
    before = job.rollout
    step.engines_do(ROLLOUT, "abort_update", step.core.updating_engine)
    revert_paused(step)
    if not isinstance(step.fire("rollout", "update_failed"), Step):
        pass
    elif before == "CatchingUp":  # a catch-up loads the committed version: who took it holds it
        took_committed(step)
    else:
        job.dirty = True
        job.engines = tuple(engine_with(e, current=e.current and not e.fresh, fresh=False) for e in job.engines)
    end_update(step)


def revert_paused(step: StepDraft) -> None:
    """An in-flight update failed as a whole: every engine it paused took weights that will never be published (or
    a mix), so none resumes -- each hands its requests back and waits for the committed weights (the engine spec's
    revert; an update that is not in flight paused none)."""
    step.engines_do(ROLLOUT, "revert", frozenset({"Paused"}))


def resume_stream(step: StepDraft) -> None:
    """In a stream, the engines an update or a catch-up left paused or quiesced holding the committed weights are
    routed again; the others (still behind) wait for the next catch-up."""
    if step.job.rollout != "Streaming":
        return
    for j, e in enumerate(step.job.engines):
        if e.current and not e.fresh and not e.mixed:
            step.fire("engine", "resume", ROLLOUT, j)


def end_update(step: StepDraft) -> None:
    """The lane's update is over: its commands still out are dropped, its program ends."""
    lane, job = step.lane, step.job
    job.awaiting = tuple(c for c in job.awaiting if c.lane != lane)
    job.set_lane(lane, program=())
    if lane == "trainer":  # the trainer's push failed: it is back to Ready, nothing was committed
        step.fire("trainer", "update_done")


# -- the weight-update group (broadcast mode) -------------------------------------------------------------------
def left_group(step: StepDraft, group: str, i: int, *, planned: bool = False) -> None:
    """A member's process left (died, was stopped, restarted) -- or, ``planned``, an elastic fleet retired it: the
    weight-update group is stale."""
    step.job.set_engine(group, i, engine_with(step.job.engine(group, i), joined=False))
    if step.job.sync == "Connected":
        step.fire("sync", "member_left" if planned else "membership_changed")


def set_joined(step: StepDraft, members: frozenset[int]) -> None:
    step.job.engines = tuple(engine_with(e, joined=j in members) for j, e in enumerate(step.job.engines))


def group_ready(step: StepDraft) -> bool:
    """Broadcast mode: the group holds exactly the snapshot's engines, else it is destroyed (stale) or
    connected (again) first -- and the update's ``begin_update`` runs once that command is back."""
    job = step.job
    gone, leaving = step.core.gone, step.core.leaving_states
    wanted = frozenset(i for i, e in enumerate(job.engines) if e.state not in gone and e.state not in leaving)
    joined = frozenset(i for i, e in enumerate(job.engines) if e.joined)
    if job.sync == "Connected" and joined != wanted:
        step.fire("sync", "membership_changed")
    if job.sync == "Stale" and isinstance(step.fire("sync", "destroy"), Step):
        set_joined(step, frozenset())
        step.prepend(step.lane, ("begin_update",))
        return False
    if job.sync in ("Init", "Disconnected"):
        set_joined(step, wanted)  # the members the connect command joins (the shell reads them here)
        if step.core.elastic:  # a new group: a new generation, which its calls name (Command.generation)
            job.sync_generation += 1
        if isinstance(step.fire("sync", "connect", log=True), Step):
            step.prepend(step.lane, ("begin_update",))
        return False
    return job.sync == "Connected"


def group_failed(step: StepDraft) -> None:
    """The group did not connect: nothing was transferred, every engine keeps the committed weights; the
    trainer's update ends (the next one connects again)."""
    if isinstance(step.fire("sync", "connect_failed"), Step):
        set_joined(step, frozenset())
    if step.job.trainer_op:
        step.job.set_lane("trainer", program=())
        step.fire("trainer", "update_done")


def broadcast_failed(step: StepDraft, *, crashed: bool = False) -> None:
    """A broadcast that failed or ran out of time: every engine of the snapshot may hold a mix of two
    versions, so none holds the committed one any more (each reloads it, or stays out); the group is
    destroyed and the trainer's update ends with nothing committed."""
    job = step.job
    step.engines_do(ROLLOUT, "abort_update", step.core.updating_engine)
    revert_paused(step)
    job.engines = tuple(
        engine_with(e, current=e.current and not e.joined, fresh=False, mixed=e.mixed or e.joined) for e in job.engines
    )
    step.fire("rollout", "update_failed")
    lane = step.lane
    job.awaiting = tuple(c for c in job.awaiting if c.lane != lane)
    job.set_lane(lane, program=())
    if not crashed:  # a crashed worker's trainer moves by its crash (heal or fail), not by the update's end
        step.fire("trainer", "update_done")
    if isinstance(step.fire("sync", "broadcast_failed"), Step):
        set_joined(step, frozenset())


def broadcast_crashed(step: StepDraft, reason: str) -> None:
    """Rank 0's worker crashed mid-broadcast: the broadcast failed, and the trainer heals or fails."""
    broadcast_failed(step, crashed=True)
    trainer.crashed(step, reason)
