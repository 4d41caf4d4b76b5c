"""Rollout: the rollout manager (InferenceController + RolloutExecutor), eval fleet and replay data.

The rollout manager's lifecycle is :data:`lifecycle.machines.ROLLOUT`. What a training script
embeds is :class:`RolloutManager` (``init`` / ``generate`` / ``offload`` / ``onload_weights`` /
``onload_kv`` / ``eval`` / ``dispose``); its two halves are public for finer control.
"""

from rollout.controller import ControllerError, InferenceController
from rollout.eval_fleet import EvalFleet, PinResult
from rollout.executor import EngineRolloutFn, EvalResult, RolloutExecutor, RolloutManager
from rollout.replay import ReplayDataError, load_rollout, save_rollout
from rollout.task import PatternTask

__all__ = [
    "ControllerError",
    "EngineRolloutFn",
    "EvalFleet",
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
