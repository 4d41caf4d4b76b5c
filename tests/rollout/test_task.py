from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.runner import Runner
from rollout.executor import RolloutManager
from rollout.pattern import PatternTask
from rollout.sample import SampleError

from .conftest import bind_trainer_stand_in


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


class Reverse:
    """A task that is not the project's: answer the prompt reversed (what an embedding team would bring)."""

    group_size = 2
    temperature = 1.0
    name = "reverse"

    def __init__(self, reward_value: object = None) -> None:
        self.reward_value = reward_value

    def prompts(self, rollout_id: int) -> list[str]:
        return [f"abc{rollout_id}"]

    def reward(self, prompt: str, response: str) -> float:
        if self.reward_value is not None:
            return self.reward_value  # type: ignore[return-value]
        return float(response == prompt[::-1])

    def sampling_params(self, rollout_id: int, index: int) -> dict[str, object]:
        return {"max_new_tokens": 4, "temperature": 1.0}

    def eval_params(self) -> dict[str, object]:
        return {"max_new_tokens": 4, "temperature": 0.0}


def test_any_object_with_the_members_is_a_task_and_pattern_task_is_one() -> None:
    from rollout.task import Task, checked_task

    assert isinstance(PatternTask(), Task) and isinstance(Reverse(), Task)
    assert checked_task(Reverse()).name == "reverse"
    assert PatternTask(pattern="xy").name == "xy"


@pytest.mark.bad_input
def test_a_thing_that_is_not_a_task_is_refused_naming_what_it_lacks() -> None:
    from rollout.task import TaskError, checked_task

    class Half:
        name = "half"

        def prompts(self, rollout_id: int) -> list[str]:
            return ["p"]

    with pytest.raises(TaskError, match=r"RolloutManager\(task=\.\.\.\): Half is not a Task: it lacks group_size"):
        checked_task(Half(), "RolloutManager(task=...)")


@pytest.mark.bad_input
@pytest.mark.parametrize("value", [1.5, -0.1, "1", None, True])
def test_a_reward_outside_the_unit_interval_names_the_task_and_the_fix(value: object) -> None:
    from rollout.task import TaskError, checked_reward

    task = Reverse(reward_value=value if value is not None else float("nan"))
    with pytest.raises(TaskError, match=r"task 'reverse': reward\('p', 'r'\) returned .*Fix: return a number in"):
        checked_reward(task, "p", "r")


def test_a_good_reward_passes_through_unchanged() -> None:
    from rollout.task import checked_reward

    assert checked_reward(Reverse(), "ab", "ba") == 1.0 and checked_reward(Reverse(), "ab", "ab") == 0.0


def test_a_data_source_replaces_only_the_prompts() -> None:
    from rollout.task import SourcedTask

    class Source:
        def prompts(self, rollout_id: int) -> list[str]:
            return [f"s{rollout_id}"]

    sourced = SourcedTask(Reverse(), Source())
    assert sourced.prompts(3) == ["s3"] and sourced.name == "reverse" and sourced.group_size == 2
    assert sourced.reward("ab", "ba") == 1.0 and sourced.eval_params()["temperature"] == 0.0


ROLLOUT_FNS = """
def missing(task):
    async def fn(rollout_id, controller):
        return [{"index": 0, "group": 0, "prompt": "p:", "output_ids": [5], "response": "a", "reward": 0.5}]
    return fn

def out_of_range(task):
    async def fn(rollout_id, controller):
        return [{"index": 0, "group": 0, "prompt": "p:", "prompt_ids": [1], "output_ids": [5], "response": "a",
                 "reward": 3.0}]
    return fn

def not_a_list(task):
    async def fn(rollout_id, controller):
        return None
    return fn
"""


@pytest.mark.bad_input
@pytest.mark.parametrize(
    ("attr", "problem"),
    [
        ("missing", "sample 0 lacks prompt_ids"),
        ("out_of_range", r"sample 0: reward 3.0 is outside \[0, 1\]"),
        ("not_a_list", "returned NoneType"),
    ],
)
def test_a_rollout_function_returning_bad_samples_is_one_error_naming_it_and_its_flag(
    attr: str, problem: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_rollout_fns.py").write_text(ROLLOUT_FNS)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_rollout_fns", None)
    config = LifecycleConfig.from_mapping({"debug_train_only": True})
    runner = Runner(config)
    bind_trainer_stand_in(runner)
    manager = RolloutManager(config, PatternTask(), runner=runner, rollout_fn_path=f"my_rollout_fns:{attr}")
    asyncio.run(manager.init(("w0", "0")))
    with pytest.raises(SampleError) as info:
        asyncio.run(manager.generate(0))
    message = str(info.value)
    assert f"rollout function 'my_rollout_fns:{attr}' (--rollout-function-path): rollout 0" in message
    assert re.search(problem, message) and "Fix: build each sample with rollout.sample.sample" in message
    assert manager.state == "Ready"  # generate_done ran: the manager is not left Generating
