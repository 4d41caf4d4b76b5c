from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout.task import PatternTask


@pytest.mark.determinism
def test_prompts_are_deterministic_from_seed_and_rollout() -> None:
    task = PatternTask(seed=3)
    assert task.prompts(2) == PatternTask(seed=3).prompts(2)
    assert task.prompts(2) != task.prompts(3)
    assert task.prompts(2) != PatternTask(seed=4).prompts(2)
    assert len(task.prompts(0)) == task.prompts_per_step


def test_reward_extremes() -> None:
    task = PatternTask()
    assert task.reward("x:", "abababab") == 1.0
    assert task.reward("x:", "zzzzzzzz") == 0.0
    assert task.reward("x:", "aaaaaaaa") == 0.75
    assert task.reward("x:", "") == 0.0


@given(st.text(max_size=20))
def test_reward_in_unit_interval(response: str) -> None:
    assert 0.0 <= PatternTask().reward("p:", response) <= 1.0


def test_sampling_seeds_distinct_per_sample() -> None:
    task = PatternTask()
    seeds = {task.sampling_params(1, i)["sampling_seed"] for i in range(64)}
    assert len(seeds) == 64
