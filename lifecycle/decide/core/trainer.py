"""The trainer group's results: trained weights run ahead of the served ones; a crashed worker heals and its
operation runs again, once."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lifecycle.decide.core.model import Failure
from lifecycle.decide.core.plan import OPERATIONS
from lifecycle.decide.spec import Step

if TYPE_CHECKING:
    from lifecycle.decide.core.step import StepDraft


def trained(step: StepDraft) -> None:
    """The trained weights are ahead of the served ones until an update commits them (where one can); only a
    job checkpoint reads it, so only a job that writes them keeps it (a smaller state space)."""
    if isinstance(step.fire("trainer", "train_done"), Step):
        step.job.taken = ()
        if step.core.tracks_ahead:
            step.job.ahead = True


def restore_version(step: StepDraft) -> None:
    """A resumed stream's committed version is its job checkpoint's: the one durable source, never restarted."""
    job = step.job
    if job.resuming:
        job.version = job.resuming[0]


def restore_buffer(step: StepDraft) -> None:
    """A resumed stream's buffered groups, each judged by its recorded oldest version against the version now."""
    job = step.job
    if job.resuming:
        oldest = job.resuming[1:]
        job.buffer = tuple(sorted(step.core.staleness(job.version, o) for o in oldest))
        job.resuming = ()


def healed(step: StepDraft) -> None:
    if isinstance(step.fire("trainer", "healed"), Step):
        retry(step)


def heal_failed(step: StepDraft, reason: str) -> None:
    step.fail_run(Failure("trainer", "trainer", step.job.trainer, f"trainer: healing failed ({reason})"))


def crashed(step: StepDraft, reason: str) -> None:
    """A trainer worker died: heal from a peer under train FT (then redo the operation), else fail."""
    where = step.job.trainer
    if not isinstance(step.fire("trainer", "worker_crashed"), Step):
        step.fail_run(Failure("trainer", "trainer", where, f"trainer: a worker crashed in state {where} ({reason})"))
        return
    step.job.set_lane("trainer", program=())
    if not isinstance(step.fire("trainer", "heal", log=True), Step):
        step.fire("trainer", "fail")


def retry(step: StepDraft) -> None:
    """After a heal the trainer's operation runs again from its start, once."""
    op = step.job.trainer_op
    if not op:
        return
    if op.endswith("!"):
        step.fail_run(
            Failure(
                "trainer",
                "trainer",
                step.job.trainer,
                f"trainer: a worker crashed again in {op.rstrip('!')} after a heal",
            )
        )
        return
    step.job.set_lane("trainer", op=op + "!", program=OPERATIONS[op].program)
