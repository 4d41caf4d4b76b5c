"""Rollout: the rollout manager (InferenceController + RolloutExecutor), eval fleet and replay data.

The rollout manager's lifecycle is :data:`lifecycle.decide.machines.ROLLOUT`. What a training script
embeds is :class:`RolloutManager` (``init`` / ``generate`` / ``offload`` / ``onload_weights`` /
``onload_kv`` / ``eval`` / ``dispose``); its two halves are public for finer control.

The names below are imported on first use, so light modules (``rollout.replay``, ``rollout.task``)
can be read without importing torch or the HTTP client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.controller import ControllerError, InferenceController
    from rollout.eval_fleet import PinResult
    from rollout.executor import EngineRolloutFn, EvalResult, RolloutExecutor, RolloutManager
    from rollout.pattern import PatternTask
    from rollout.replay import ReplayDataError, load_rollout, save_rollout

_EXPORTS = {
    "ControllerError": "rollout.controller",
    "InferenceController": "rollout.controller",
    "PinResult": "rollout.eval_fleet",
    "EngineRolloutFn": "rollout.executor",
    "EvalResult": "rollout.executor",
    "RolloutExecutor": "rollout.executor",
    "RolloutManager": "rollout.executor",
    "ReplayDataError": "rollout.replay",
    "load_rollout": "rollout.replay",
    "save_rollout": "rollout.replay",
    "PatternTask": "rollout.pattern",
}
__all__ = [
    "ControllerError",
    "EngineRolloutFn",
    "EvalResult",
    "InferenceController",
    "PatternTask",
    "PinResult",
    "ReplayDataError",
    "RolloutExecutor",
    "RolloutManager",
    "load_rollout",
    "save_rollout",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
