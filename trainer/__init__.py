"""Trainer: the trainer group, torch policy and the RL loop that embeds the lifecycle.

The trainer group's lifecycle is :data:`lifecycle.machines.TRAINER`. A training script embeds
:class:`TrainerGroup` (``start`` / ``train`` / ``update_weights`` / ``offload`` / ``onload`` /
``dispose``); :func:`run_loop` is the project's own loop built from the same pieces.
"""

from trainer.group import TrainerFailed, TrainerGroup
from trainer.loop import RunOptions, RunResult, run_loop

__all__ = ["RunOptions", "RunResult", "TrainerFailed", "TrainerGroup", "run_loop"]
