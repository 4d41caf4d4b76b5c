"""What a resumed job restores, witnessed in seconds: each worker's random generators (its own rank's), the
weight version the relaunched engines are labelled with, and the restart budget's ages -- on a clock that is
not the dead driver's.

The end-to-end proof (a driver SIGKILLed and resumed, every later step identical) is ``test_resume.py`` (slow);
here the trainer group runs on in-process worker stand-ins that record what they were asked, so a resume that
skips a part, or restores the wrong one, fails at once.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import EventLog
from lifecycle.decide.runner import Runner

pytest.importorskip("ray")  # trainer.workers imports it; no cluster is started here

from trainer.backend import BackendSpec
from trainer.group import TrainerGroup
from trainer.job_state import JobCheckpoint

from .conftest import bind_rollout_stand_in

FLAGS = {"rollout_num_gpus": 2, "save": "ckpt", "load": "ckpt"}
RNG = [
    {"torch": "state of rank 0", "python": [3, [1, 2], None]},
    {"torch": "state of rank 1", "python": [3, [4], None]},
]


class RecordingWorker:
    """A trainer worker stand-in: answers as a healthy worker does and keeps every call it was given."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.answered_last = True
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    async def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        self.calls.append((method, args))
        if method == "save_checkpoint":
            Path(args[0]).mkdir(parents=True, exist_ok=True)
            return args[0]
        if method == "rng_state":
            return {"torch": f"drawn by rank {self.rank}"}
        return None

    def given(self, method: str) -> list[tuple[Any, ...]]:
        return [args for m, args in self.calls if m == method]

    def kill(self) -> None:
        pass


class LocalGroup(TrainerGroup):
    def _worker(self, rank: int) -> RecordingWorker:  # type: ignore[override]
        return RecordingWorker(rank)


def _checkpoint(version: str = "7", restarts: list[list[float]] | None = None) -> JobCheckpoint:
    lifecycle = {"restarts": restarts if restarts is not None else [[], []]}
    return JobCheckpoint(8, version, {"model": "trainer state"}, lifecycle, {"ranks": RNG}, Path("ckpt/job-000008"))


def _group(tmp_path: Path, resume: JobCheckpoint | None, clock: float = 1000.0) -> LocalGroup:
    config = LifecycleConfig.from_mapping(FLAGS if resume is not None else {"rollout_num_gpus": 2}, check_paths=False)
    runner = Runner(config, log=EventLog([]), clock=lambda: clock)
    bind_rollout_stand_in(runner)
    backend = BackendSpec("trainer.grpo:GRPOBackend")
    return LocalGroup(config, tmp_path, workers=2, runner=runner, backend=backend, resume=resume)


def test_each_resumed_worker_gets_the_trainer_state_and_its_own_ranks_generators(tmp_path: Path) -> None:
    group = _group(tmp_path, _checkpoint())
    asyncio.run(group.start())
    assert group.state == "Ready"
    workers: list[RecordingWorker] = group.workers  # type: ignore[assignment]
    for w in workers:
        assert w.given("set_state") == [({"model": "trainer state"},)]
        assert w.given("set_rng_state") == [(RNG[w.rank],)]  # rank for rank: never another rank's, never none
        restored = [m for m, _ in w.calls]
        assert restored.index("set_rng_state") > restored.index("set_state")


def test_a_resumed_job_labels_the_relaunched_weights_with_the_checkpoints_version(tmp_path: Path) -> None:
    path, version = asyncio.run(_group(tmp_path, _checkpoint(version="7")).start())  # type: ignore[misc]
    assert version == "7" and path.endswith("step-7")  # not "0": the engines would serve v0 after v7
    fresh = asyncio.run(_group(tmp_path / "fresh", None).start())
    assert fresh is not None and fresh[1] == "0"


def test_restart_budget_ages_survive_a_resume_on_another_clock(tmp_path: Path) -> None:
    """The dead driver's monotonic clock means nothing to the new one: ages are kept, times rebuilt from them."""
    group = _group(tmp_path, _checkpoint(restarts=[[], [3.5, 0.25]]), clock=1000.0)
    assert [e.restarts for e in group.runner.state.engines] == [(), (996.5, 999.75)]
    assert group.runner.restart_ages() == [[], [3.5, 0.25]]
    # what the next checkpoint keeps, written at a later time of the new clock: the same restarts, older
    later = Runner(group.config, log=EventLog([]), clock=lambda: 1010.0)
    later.state = group.runner.state
    assert later.restart_ages() == [[], [13.5, 10.25]]
