"""The restart budget: capped exponential backoff, then give up within the window."""

from __future__ import annotations

import pytest

from engines.restart import RestartBudget
from lifecycle import LifecycleConfig


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.recovery
def test_backoff_doubles_and_is_capped_then_the_budget_is_spent():
    clock = Clock()
    budget = RestartBudget(max_restarts=5, window=100.0, backoff=1.0, backoff_max=5.0, clock=clock)
    delays = [budget.next_delay() for _ in range(5)]
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert budget.next_delay() is None
    assert budget.used == 5


@pytest.mark.recovery
def test_restarts_age_out_of_the_window():
    clock = Clock()
    budget = RestartBudget(max_restarts=2, window=10.0, backoff=0.5, backoff_max=8.0, clock=clock)
    assert budget.next_delay() == 0.5
    clock.now = 5.0
    assert budget.next_delay() == 1.0
    assert budget.next_delay() is None
    clock.now = 10.5  # the first restart left the window
    assert budget.next_delay() == 1.0  # one still counted: backoff resumes from there


def test_from_config_uses_the_flags():
    config = LifecycleConfig(
        rollout_num_gpus=1,
        engine_max_restarts=1,
        engine_restart_window=60,
        engine_restart_backoff=0.25,
        engine_restart_backoff_max=2,
    )
    budget = RestartBudget.from_config(config)
    assert budget.next_delay() == 0.25
    assert budget.next_delay() is None
