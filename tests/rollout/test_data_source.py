"""--data-source MODULE:ATTR (miles' data source): a user's prompts, behind the construction gate.

The source is built only when the ``init`` move constructs the rollout function (never in replay),
feeds every rollout function (engine, train-only policy, a user's), and bad prompts are one error
naming the flag. The end-to-end test runs the real loop (train-only: a Ray trainer, no engines).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.runner import Runner
from rollout.executor import RolloutManager
from rollout.pattern import PatternTask
from rollout.replay import load_rollout
from rollout.task import DataSourceError

from .conftest import bind_trainer_stand_in

SOURCE = """
BUILT = []

class Questions:
    def __init__(self, task):
        self.task = task

    def prompts(self, rollout_id):
        return [f"q{rollout_id}-{i}:" for i in range(self.task.prompts_per_step)]

def make(task):
    BUILT.append(task)
    return Questions(task)

def broken(task):
    class Bad:
        def prompts(self, rollout_id):
            return ["ok:", ""] if rollout_id else "not a list"
    return Bad()
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "my_prompts.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_prompts", None)
    return "my_prompts"


def _manager(flags: dict[str, object], path: str) -> RolloutManager:
    """A rollout manager after its ``init`` move (no engine: train-only or replay), its trainer a stand-in."""
    config = LifecycleConfig.from_mapping(flags, check_paths=False)
    runner = Runner(config)
    bind_trainer_stand_in(runner)
    manager = RolloutManager(
        config, PatternTask(prompts_per_step=3, group_size=2), runner=runner, data_source_path=path
    )
    asyncio.run(manager.init(("w0", "v0")))
    return manager


def test_the_source_feeds_the_rollout_fn(user_module: str) -> None:
    executor = _manager({"debug_train_only": True}, f"{user_module}:make").executor
    assert "data_source" in executor.constructed and executor.rollout_fn is not None
    task = executor.rollout_fn.task  # type: ignore[attr-defined]
    assert task.prompts(4) == ["q4-0:", "q4-1:", "q4-2:"]


@pytest.mark.construction_gate
def test_replay_never_builds_the_source(user_module: str) -> None:
    manager = _manager({"load_debug_rollout_data": "r/{rollout_id}.json"}, f"{user_module}:make")
    executor = manager.executor
    assert manager.state == "Replay"
    assert executor.data_source is None and "data_source" not in executor.constructed
    assert user_module not in sys.modules  # the user's module was never even imported


def test_bad_prompts_name_the_flag(user_module: str) -> None:
    executor = _manager({"debug_train_only": True}, f"{user_module}:broken").executor
    for rollout_id, match in ((0, "got 'not a list', not a list of prompts"), (1, "bad prompt ''")):
        with pytest.raises(DataSourceError, match=f"--data-source: rollout {rollout_id}: {match}"):
            executor.task.prompts(rollout_id)


@pytest.mark.usefixtures("ray_cluster")
def test_a_train_only_run_trains_on_the_users_prompts(user_module: str, tmp_path: Path) -> None:
    from trainer.app.loop import RunOptions, run_loop

    saved = str(tmp_path / "data" / "{rollout_id}.json")
    config = LifecycleConfig.from_mapping({"debug_train_only": True, "save_debug_rollout_data": saved})
    opts = RunOptions(steps=2, seed=0, run_dir=tmp_path / "run", data_source=f"{user_module}:make", quiet=True)
    result = asyncio.run(run_loop(config, opts))
    assert len(result.rewards) == 2
    prompts = {s["prompt"] for s in load_rollout(saved, 1)}
    assert prompts == {"q1-0:", "q1-1:", "q1-2:", "q1-3:", "q1-4:", "q1-5:", "q1-6:", "q1-7:"}
