"""The rollout tests' trainer stand-in: these tests are about the rollout side, so the trainer's part of the
job (its handlers) writes real weights files without Ray actors. The real trainer group is in tests/trainer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.process import ServerProcess, torch_engine_command
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import Command, Outcome
from lifecycle.decide.runner import Runner

Weights = tuple[str, str]


def bind_trainer_stand_in(runner: Runner, next_weights: Callable[[], Weights] | None = None) -> None:
    """Every trainer effect the config can issue, bound: a step trains nothing, an update hands over
    ``next_weights()`` (a real file the test wrote) as the trainer's new weights."""

    async def write(cmd: Command) -> Outcome | None:
        if next_weights is not None:
            runner.pending = next_weights()
        return None

    async def done(cmd: Command) -> Outcome:
        return Outcome(
            {"train_step": "trained", "save_checkpoint": "saved", "replace_worker": "healed"}.get(cmd.effect, "done")
        )

    handlers = {f"trainer.{e}": done for m, e in runner.core.commands() if m == "trainer"}
    runner.provide({**handlers, "trainer.transfer_weights": write})


@pytest.fixture
def stand_in() -> Callable[..., None]:
    return bind_trainer_stand_in


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    """Two CPU engines started outside the job (external engines), both at once; killed after the test."""
    procs = [ServerProcess(torch_engine_command(port=0, seed=0), engine_id=f"outside-{i}") for i in range(2)]
    for p in procs:  # both start at once (their torch imports overlap), then each is waited for as _start does
        p.spawn()
    try:
        for p in procs:
            p.wait_ready(60.0)
    except BaseException:
        for p in procs:
            p.close()
        raise
    yield procs
    for p in procs:
        if p.alive:
            p.kill()


def routed_manager(
    config: LifecycleConfig,
    runner: Runner,
    tmp: Path,
    run: Callable[[Awaitable[Any]], Any],
    command: Callable[..., Any] | None = None,
) -> Any:
    """A RolloutManager on real CPU engines behind a real SMG gateway, launched and loaded with step 0's weights by
    the lifecycle itself (``run``: the test's own event loop); ``command``: the engines' launch command."""
    from engines.launcher import launcher_factory
    from engines.models import TinyCausalLM
    from rollout.executor import RolloutManager
    from rollout.pattern import PatternTask

    factory = launcher_factory("local") if command is None else launcher_factory("local", command)
    manager = RolloutManager(
        config,
        PatternTask(prompts_per_step=1, group_size=1, response_len=4),
        runner=runner,
        launcher_factory=factory,
        router=True,
        log_dir=str(tmp),
    )
    path = tmp / "step-0"
    TinyCausalLM("tiny", seed=100).save_pretrained(path)
    bind_trainer_stand_in(runner)
    run(runner.operate("trainer.start"))
    run(manager.init((str(path), "0")))
    return manager
