"""The trainer backend protocol: the project's GRPO trainer is one implementation; a bad one names itself."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.runner import Runner

pytest.importorskip("torch")

from trainer.backend import BackendError, BackendSpec, TrainerBackend, build_backend, checked_grads
from trainer.group import TrainerGroup
from trainer.grpo import GRPOBackend, grpo_backend

from .conftest import bind_rollout_stand_in


class Half:
    def __init__(self, *, rank: int) -> None:
        self.rank = rank

    def compute_grads(self, samples: object) -> None:
        return None


def _samples() -> list[dict[str, object]]:
    return [
        {"group": 0, "reward": r, "prompt_ids": [1, 5, 6], "output_ids": [7, 8], "logprobs": []} for r in (0.0, 1.0)
    ]


@pytest.mark.bad_input
def test_a_factory_that_is_not_a_backend_is_refused_naming_it_and_what_it_lacks() -> None:
    with pytest.raises(BackendError, match=r"'tests.trainer.test_backend:Half' built a Half without apply_grads"):
        build_backend(BackendSpec("tests.trainer.test_backend:Half"), 0)
    with pytest.raises(BackendError, match="name it module:attr"):
        build_backend(BackendSpec("no_colon"), 0)
    with pytest.raises(BackendError, match="cannot be imported"):
        build_backend(BackendSpec("no_such_module_here:Thing"), 0)


def test_the_grpo_backend_trains_and_a_second_one_heals_from_its_state() -> None:
    a = build_backend(grpo_backend(seed=1), 0)
    assert isinstance(a, TrainerBackend) and isinstance(a, GRPOBackend)
    before = {k: v.clone() for k, v in a.get_state()["model"].items()}
    grads, stats = a.compute_grads(_samples())
    a.apply_grads(grads)
    after = a.get_state()["model"]
    assert "loss" in stats and any(not before[k].equal(after[k]) for k in before)
    b = build_backend(grpo_backend(seed=2), 1)
    assert any(not b.get_state()["model"][k].equal(after[k]) for k in after)
    b.set_state(a.get_state())
    assert all(b.get_state()["model"][k].equal(after[k]) for k in after)


class NoConfig(GRPOBackend):
    """A user's backend that writes weights but no config.json: the engines could not load it."""

    def save_checkpoint(self, directory: str) -> str:
        Path(directory).mkdir(parents=True, exist_ok=True)
        return directory


class BadGrads(GRPOBackend):
    def compute_grads(self, samples: Sequence[Mapping[str, Any]]) -> Any:
        return {"w": 1.0}  # gradients without the diagnostics


@pytest.mark.bad_input
def test_a_wrong_answer_from_compute_grads_names_the_backend() -> None:
    spec = BackendSpec("tests.trainer.test_backend:BadGrads")
    backend = build_backend(spec, 0)
    with pytest.raises(BackendError, match=r"'tests.trainer.test_backend:BadGrads': compute_grads returned dict"):
        checked_grads(backend.compute_grads(_samples()), spec)
    assert checked_grads(build_backend(grpo_backend(), 0).compute_grads(_samples()), spec)[1]["loss"] is not None


def _start_error(tmp_path: Path, factory: str) -> str:
    """The BackendError a trainer group on real Ray workers raises at start with the backend ``factory``."""
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": 1})
    runner = Runner(config)
    bind_rollout_stand_in(runner)
    group = TrainerGroup(config, tmp_path, runner=runner, backend=BackendSpec(factory))
    try:
        with pytest.raises(BackendError) as info:
            asyncio.run(group.start())
    finally:
        asyncio.run(group.dispose())
    return str(info.value)


@pytest.mark.bad_input
@pytest.mark.usefixtures("ray_cluster")
def test_a_checkpoint_without_config_json_stops_the_trainer_naming_the_backend(tmp_path: Path) -> None:
    """Raised in the worker actor, it reaches the caller as the plug-in's error, not as a worker crash."""
    message = _start_error(tmp_path, "tests.trainer.test_backend:NoConfig")
    assert "trainer backend 'tests.trainer.test_backend:NoConfig': save_checkpoint(" in message
    assert "not a checkpoint directory with a config.json" in message and "Fix: write a Hugging Face" in message


@pytest.mark.bad_input
@pytest.mark.usefixtures("ray_cluster")
def test_a_backend_the_workers_cannot_import_is_named_not_hidden_in_an_actor_death(tmp_path: Path) -> None:
    message = _start_error(tmp_path, "no_such_package.train:Mine")
    assert "trainer backend 'no_such_package.train:Mine' cannot be imported" in message
