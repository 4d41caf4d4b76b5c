"""What a learning task is to the rollout side (the :class:`Task` protocol), and the checks that name a task
or a data source when it returns something the loop cannot use. The project's own task is one
implementation, :class:`rollout.pattern.PatternTask`; an embedding loop brings its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from lifecycle.decide.errors import LifecycleError


class DataSource(Protocol):
    """Where a rollout's prompts come from (miles' data source): plugged in with ``--data-source MODULE:ATTR``."""

    def prompts(self, rollout_id: int) -> list[str]: ...


@runtime_checkable
class Task(Protocol):
    """What a learning task gives the rollout side: the prompts of each rollout, how many samples share a
    GRPO baseline, how each sample is drawn and how its response is scored (any object with these members)."""

    @property
    def group_size(self) -> int:
        """Samples drawn per prompt (one GRPO group)."""
        ...

    @property
    def temperature(self) -> float:
        """The sampling temperature (the trainer recomputes logprobs at the same one)."""
        ...

    @property
    def name(self) -> str:
        """A short label (replay files record it; errors name it)."""
        ...

    def prompts(self, rollout_id: int) -> list[str]: ...

    def reward(self, prompt: str, response: str) -> float:
        """In [0, 1]."""
        ...

    def sampling_params(self, rollout_id: int, index: int) -> dict[str, Any]:
        """SGLang sampling params of sample ``index`` of rollout ``rollout_id`` (``max_new_tokens`` at least)."""
        ...

    def eval_params(self) -> dict[str, Any]:
        """Sampling params of the held-out eval answers (greedy)."""
        ...


class TaskError(LifecycleError, ValueError):
    """A task returned something the loop cannot use: names the task, the method and the fix."""


def checked_reward(task: Task, prompt: str, response: str) -> float:
    """``task.reward`` checked once here, so a bad value names the task instead of failing in the loss."""
    value = task.reward(prompt, response)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= float(value) <= 1.0:
        raise TaskError(
            f"task {task.name!r}: reward({prompt!r}, {response!r}) returned {value!r}. "
            "Fix: return a number in [0, 1] from Task.reward (the GRPO baseline and the reported reward assume it)"
        )
    return float(value)


def checked_task(task: object, where: str = "task") -> Task:
    """The task an embedding loop passed, checked before anything starts (one error naming what is missing)."""
    missing = [
        m
        for m in ("name", "group_size", "temperature", "prompts", "reward", "sampling_params", "eval_params")
        if not hasattr(task, m)
    ]
    if missing:
        raise TaskError(
            f"{where}: {type(task).__name__} is not a Task: it lacks {', '.join(missing)}. "
            "Fix: implement rollout.task.Task (see rollout.pattern.PatternTask)"
        )
    assert isinstance(task, Task)
    size = task.group_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise TaskError(f"{where}: group_size must be a positive integer, got {size!r}")
    return task


class DataSourceError(LifecycleError, ValueError):
    """A plugged-in data source returned something the rollout cannot use (names the flag)."""


def checked_prompts(prompts: object, rollout_id: int) -> list[str]:
    """A user's prompts, checked once here rather than failing deep inside tokenisation or a worker."""
    fix = "return a non-empty list of non-empty strings from prompts(rollout_id)"
    if not isinstance(prompts, list | tuple) or not prompts:
        problem = f"rollout {rollout_id}: got {prompts!r}, not a list of prompts"
        raise DataSourceError(f"--data-source: {problem}. Fix: {fix}")
    bad = [p for p in prompts if not isinstance(p, str) or not p]
    if bad:
        raise DataSourceError(f"--data-source: rollout {rollout_id}: bad prompt {bad[0]!r}. Fix: {fix}")
    return list(prompts)


@dataclass(frozen=True)
class SourcedTask:
    """A task whose prompts come from a plugged-in data source (``--data-source``); the rest is the task's."""

    task: Task
    source: DataSource

    @property
    def name(self) -> str:
        return self.task.name

    @property
    def group_size(self) -> int:
        return self.task.group_size

    @property
    def temperature(self) -> float:
        return self.task.temperature

    def prompts(self, rollout_id: int) -> list[str]:
        return checked_prompts(self.source.prompts(rollout_id), rollout_id)

    def reward(self, prompt: str, response: str) -> float:
        return self.task.reward(prompt, response)

    def sampling_params(self, rollout_id: int, index: int) -> dict[str, Any]:
        return self.task.sampling_params(rollout_id, index)

    def eval_params(self) -> dict[str, Any]:
        return self.task.eval_params()
