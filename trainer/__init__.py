"""Trainer: the trainer group's shell (Ray workers running a backend), the GRPO backend and its policy.

The trainer group's lifecycle is :data:`lifecycle.decide.machines.TRAINER`. :class:`TrainerGroup`
(``start`` / ``train`` / ``update_weights`` / ``checkpoint`` / ``offload`` / ``onload`` / ``dispose``)
binds its handlers to the job's runner; the application that assembles a run from it and the rollout
side -- ``Job``, the project's loop, ``lifecycle run`` -- is :mod:`trainer.app`, above this package.

The names below are imported on first use: importing ``trainer`` must not pay for torch and Ray.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.backend import BackendSpec, TrainerBackend
    from trainer.group import TrainerFailed, TrainerGroup
    from trainer.job_state import JobCheckpoint, load_job_checkpoint

_EXPORTS = {
    "BackendSpec": "trainer.backend",
    "TrainerBackend": "trainer.backend",
    "TrainerFailed": "trainer.group",
    "TrainerGroup": "trainer.group",
    "JobCheckpoint": "trainer.job_state",
    "load_job_checkpoint": "trainer.job_state",
}
__all__ = ["BackendSpec", "JobCheckpoint", "TrainerBackend", "TrainerFailed", "TrainerGroup", "load_job_checkpoint"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
