"""rl-lifecycle: an explicit, checkable lifecycle for RL post-training jobs.

The public API -- what a training loop imports -- is re-exported here.
"""

from lifecycle.decide.config import ConfigWarning, LifecycleConfig, add_lifecycle_arguments
from lifecycle.decide.errors import ConfigError, IllegalTransition, LifecycleError, SpecError
from lifecycle.decide.events import EventLog, bind_context, capture
from lifecycle.decide.ledger import EffectLedger
from lifecycle.decide.machines import ENGINE, EVAL_FLEET, MACHINES, MONITOR, ROLLOUT, TRAINER, WEIGHT_SYNC
from lifecycle.decide.predicates import PREDICATES, evaluate
from lifecycle.decide.runtime import FireResult, LifecycleMachine
from lifecycle.decide.spec import MachineSpec, StateSpec, T

__all__ = [
    "ENGINE",
    "EVAL_FLEET",
    "MACHINES",
    "MONITOR",
    "PREDICATES",
    "ROLLOUT",
    "TRAINER",
    "WEIGHT_SYNC",
    "ConfigError",
    "ConfigWarning",
    "EffectLedger",
    "EventLog",
    "FireResult",
    "IllegalTransition",
    "LifecycleConfig",
    "LifecycleError",
    "LifecycleMachine",
    "MachineSpec",
    "SpecError",
    "StateSpec",
    "T",
    "add_lifecycle_arguments",
    "bind_context",
    "capture",
    "evaluate",
]
__version__ = "0.1.0"
