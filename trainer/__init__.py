"""Trainer: the trainer group, torch policy and the RL loop that embeds the lifecycle.

The trainer group's lifecycle is :data:`lifecycle.machines.TRAINER`. A training script embeds
:class:`TrainerGroup` (``start`` / ``train`` / ``update_weights`` / ``checkpoint`` / ``offload`` /
``onload`` / ``dispose``); :func:`run_loop` is the project's own loop built from the same pieces.

The names below are imported on first use: ``lifecycle run`` is registered from ``trainer.cli``
on every ``lifecycle`` invocation, which must not pay for importing torch and Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.broadcast import WeightBroadcast
    from trainer.group import TrainerFailed, TrainerGroup
    from trainer.job_state import JobCheckpoint, load_job_checkpoint
    from trainer.loop import RunOptions, RunResult, run_loop

_EXPORTS = {
    "TrainerFailed": "trainer.group",
    "TrainerGroup": "trainer.group",
    "RunOptions": "trainer.loop",
    "RunResult": "trainer.loop",
    "run_loop": "trainer.loop",
    "WeightBroadcast": "trainer.broadcast",
    "JobCheckpoint": "trainer.job_state",
    "load_job_checkpoint": "trainer.job_state",
}
__all__ = [
    "JobCheckpoint",
    "RunOptions",
    "RunResult",
    "TrainerFailed",
    "TrainerGroup",
    "WeightBroadcast",
    "load_job_checkpoint",
    "run_loop",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
