"""The learning task of ``lifecycle run``: learn to answer any prompt with a target pattern.

Small enough that learning is visible on 2 CPU cores in a couple of minutes with the tiny CPU
model: the reward of a response is in [0, 1] -- half for using only the pattern's characters,
half for matching the pattern position by position ("abab..."). A random-init model scores about
0.02; a model that learned the task scores close to 1. Prompts are deterministic from the seed and
the rollout id, so two runs with the same seed see the same data. One implementation of
:class:`rollout.task.Task`, no more privileged than a user's.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PatternTask:
    """Prompts, reward and grouping (GRPO: ``group_size`` samples per prompt share a baseline)."""

    pattern: str = "ab"
    prompts_per_step: int = 8
    group_size: int = 8
    prompt_len: int = 4
    response_len: int = 8
    temperature: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.pattern:
            raise ValueError("pattern must not be empty")
        if self.prompts_per_step <= 0 or self.group_size <= 0 or self.response_len <= 0:
            raise ValueError("prompts_per_step, group_size and response_len must be positive")

    def prompts(self, rollout_id: int) -> list[str]:
        """The prompts of one rollout, deterministic from (seed, rollout_id)."""
        rng = random.Random(self.seed * 1_000_003 + rollout_id)
        letters = string.ascii_lowercase
        return [
            "".join(rng.choice(letters) for _ in range(self.prompt_len)) + ":" for _ in range(self.prompts_per_step)
        ]

    @property
    def name(self) -> str:
        return self.pattern

    def eval_params(self) -> dict[str, Any]:
        return {"max_new_tokens": self.response_len, "temperature": 0.0, "ignore_eos": True}

    def target(self, length: int | None = None) -> str:
        n = self.response_len if length is None else length
        return (self.pattern * (n // len(self.pattern) + 1))[:n]

    def reward(self, prompt: str, response: str) -> float:
        """In [0, 1]: 0.5 * share of pattern characters + 0.5 * share of positions matching the pattern."""
        del prompt  # the target does not depend on the prompt
        n = self.response_len
        text = response[:n]
        if not text:
            return 0.0
        chars = set(self.pattern)
        in_alphabet = sum(ch in chars for ch in text) / n
        target = self.target(n)
        matched = sum(a == b for a, b in zip(text, target, strict=False)) / n
        return 0.5 * in_alphabet + 0.5 * matched

    def sampling_params(self, rollout_id: int, index: int) -> dict[str, Any]:
        """SGLang sampling params of one sample: fixed length, a per-sample seed (deterministic runs)."""
        return {
            "max_new_tokens": self.response_len,
            "temperature": self.temperature,
            "ignore_eos": True,
            "sampling_seed": (self.seed * 1_000_003 + rollout_id) * 4096 + index,
        }
