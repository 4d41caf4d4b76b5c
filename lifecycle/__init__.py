"""rl-lifecycle: an explicit, checkable lifecycle for RL post-training jobs.

The public API -- what a training loop imports -- is re-exported here.
"""

from lifecycle.config import ConfigWarning, LifecycleConfig, add_lifecycle_arguments
from lifecycle.errors import ConfigError, IllegalTransition, LifecycleError, SpecError
from lifecycle.events import EventLog, bind_context, capture
from lifecycle.ledger import EffectLedger
from lifecycle.machines import ENGINE, EVAL_FLEET, MACHINES, MONITOR, ROLLOUT, TRAINER, WEIGHT_SYNC
from lifecycle.predicates import PREDICATES, evaluate
from lifecycle.runtime import FireResult, LifecycleMachine
from lifecycle.spec import MachineSpec, StateSpec, T

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
