"""The lifecycle core: one pure step function that the checker explores and the runtime executes.

``Core(config).step(state, event)`` takes the job's state and an operation a loop calls (``Op``), a
report from a shell (``Outcome``) or the results of commands it handed out (``Completed``), and
returns the next state, the machine moves it made and the commands the shells must carry out --
or a refusal naming the predicate or state that blocks it.
"""

from lifecycle.decide.core.core import Core
from lifecycle.decide.core.engines import next_delay
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
    Fact,
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
from lifecycle.decide.core.phases import PHASES
from lifecycle.decide.core.plan import ENGINE_PLAN, NEWS, OPERATIONS, RESULTS, SNAPSHOT, Operation
from lifecycle.decide.core.step import StepDraft
from lifecycle.decide.core.tables import COUPLED, DISPATCH, EFFECT_TABLE, LEDGER_ONLY, RESULT_TABLE, Handling, ResultRow

__all__ = [
    "BROADCAST",
    "COMMITTED_WEIGHTS",
    "PENDING_WEIGHTS",
    "COUPLED",
    "DISPATCH",
    "EFFECT_TABLE",
    "ENGINE_PLAN",
    "EVAL",
    "LEDGER_ONLY",
    "NEWS",
    "OPERATIONS",
    "PHASES",
    "RESULTS",
    "RESULT_TABLE",
    "ROLLOUT",
    "SNAPSHOT",
    "BlockedMove",
    "Command",
    "Completed",
    "Core",
    "EngineState",
    "Event",
    "JobState",
    "Move",
    "Op",
    "Operation",
    "Fact",
    "Failure",
    "Fenced",
    "Handling",
    "Outcome",
    "Refusal",
    "Result",
    "ResultRow",
    "StepDraft",
    "instance_name",
    "next_delay",
]
