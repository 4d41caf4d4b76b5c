"""rl-lifecycle: an explicit, checkable lifecycle for RL post-training jobs.

What a loop that embeds the lifecycle imports, re-exported here: the config, the core's step function and
the values a loop sends it and reads back (``Core(config).step(state, event)``), the runtime's driver of
the core (``Runner``) with its event log and effect ledger, and the errors. The specs, predicates and
``transitions`` machines behind them stay in their modules (``lifecycle.decide.machines``,
``lifecycle.decide.predicates``, ``lifecycle.decide.runtime``).
"""

# first: decides between the compiled checker and the pure one before either is imported (lifecycle.compiled)
from lifecycle import compiled as _compiled  # noqa: F401
from lifecycle.decide.config import ConfigWarning, LifecycleConfig, add_lifecycle_arguments
from lifecycle.decide.core import (
    EVAL,
    ROLLOUT,
    Command,
    Completed,
    Core,
    EngineState,
    Event,
    Failure,
    JobState,
    Move,
    Op,
    Outcome,
    Refusal,
    Result,
)
from lifecycle.decide.errors import ConfigError, LifecycleError
from lifecycle.decide.events import EventLog
from lifecycle.decide.ledger import EffectLedger
from lifecycle.decide.runner import OperationRefused, RunFailed, Runner

__all__ = [
    "EVAL",
    "ROLLOUT",
    "Command",
    "Completed",
    "ConfigError",
    "ConfigWarning",
    "Core",
    "EffectLedger",
    "EngineState",
    "Event",
    "EventLog",
    "Failure",
    "JobState",
    "LifecycleConfig",
    "LifecycleError",
    "Move",
    "Op",
    "OperationRefused",
    "Outcome",
    "Refusal",
    "Result",
    "RunFailed",
    "Runner",
    "add_lifecycle_arguments",
]
__version__ = "0.1.0"
