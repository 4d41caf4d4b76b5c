"""rl-lifecycle: an explicit, checkable lifecycle for RL post-training jobs.

What a loop that embeds the lifecycle imports, re-exported here: the config, the core's step function and
the values a loop sends it and reads back (``Core(config).step(state, event)``), the runtime's driver of
the core (``Runner``) with its event log and effect ledger, and the errors. The specs, predicates and
``transitions`` machines behind them stay in their modules (``lifecycle.decide.machines``,
``lifecycle.decide.predicates``, ``lifecycle.decide.runtime``).

The names are imported on first use: every engine process, Ray worker and tool that imports one small module of
the package (``lifecycle.decide.jsonio``, ``errors``) would otherwise pay for all of them, structlog and rich
included (~0.3 s of CPU a process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# first: decides between the compiled checker and the pure one before either is imported (lifecycle.compiled)
from lifecycle import compiled as _compiled  # noqa: F401

if TYPE_CHECKING:
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

_NAMES = {  # module: the names it gives, space-separated
    "lifecycle.decide.config": "ConfigWarning LifecycleConfig add_lifecycle_arguments",
    "lifecycle.decide.core": "EVAL ROLLOUT Command Completed Core EngineState Event Failure JobState Move Op Outcome "
    "Refusal Result",
    "lifecycle.decide.errors": "ConfigError LifecycleError",
    "lifecycle.decide.events": "EventLog",
    "lifecycle.decide.ledger": "EffectLedger",
    "lifecycle.decide.runner": "OperationRefused RunFailed Runner",
}
_EXPORTS = {name: module for module, names in _NAMES.items() for name in names.split()}

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


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lifecycle' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
