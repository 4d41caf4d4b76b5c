"""Fast witnesses of what a resume restores, through the code that writes and reads the checkpoint on disk.

``test_resume_restores.py`` shows the trainer group hands each worker its rank's RNG state and labels the
relaunched weights with the checkpoint's version, from a checkpoint built in memory. These go the whole way
in seconds, without Ray: the real worker's ``rng_state``/``set_rng_state`` (the actor class's own methods,
called in-process), the checkpoint written by ``save_job_checkpoint`` and read back by ``load_job_checkpoint``,
the group's save and restore handlers, and what ``Job._start`` hands the engines -- the weights each engine is
told to load first. A resume that saves, reads or restores a worker's generators wrongly, or starts its
engines from any version but the checkpoint's, fails here (the slow end-to-end proof: ``test_resume.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import Command, Outcome
from lifecycle.decide.events import EventLog
from lifecycle.decide.runner import Runner

pytest.importorskip("ray")  # trainer.workers imports it; no cluster is started here

from rollout.executor import RolloutManager
from rollout.pattern import PatternTask
from trainer.app.job import Job
from trainer.app.options import RunOptions
from trainer.backend import BackendSpec, worker_seed
from trainer.group import TrainerGroup
from trainer.job_state import JobCheckpoint, load_job_checkpoint, save_job_checkpoint
from trainer.workers import TrainerWorker

from ..conftest import bind_rollout_stand_in

WORKER = TrainerWorker.__ray_metadata__.modified_class  # the actor's class: its methods, without Ray
BACKEND = BackendSpec("trainer.grpo:GRPOBackend")
TASK = PatternTask(prompts_per_step=2, group_size=2, response_len=4)


def _draw() -> tuple[list[float], list[float]]:
    """What a worker's process draws from its global generators (dropout, sampling): torch's and Python's."""
    return torch.rand(4).tolist(), [random.random() for _ in range(3)]


class ProcessWorker:
    """A trainer worker in this process, as if in its own: the real class's methods run on the global
    generators, which hold this worker's state only while one of its calls runs (each worker is a process)."""

    def __init__(self, rank: int, seed: int = 0) -> None:
        self.rank = rank
        self.answered_last = True
        self.impl: Any = object.__new__(WORKER)
        with _generators():
            torch.manual_seed(worker_seed(seed, rank))  # what TrainerWorker.__init__ does
            random.seed(worker_seed(seed, rank))
            self.generators = (torch.get_rng_state(), random.getstate())

    async def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        if method == "save_checkpoint":
            Path(args[0]).mkdir(parents=True, exist_ok=True)
            return args[0]
        if method in ("pid", "set_state", "load_checkpoint"):
            return None
        if method == "get_state":
            return {"w": torch.zeros(2)}
        return self.run(getattr(self.impl, method), *args)

    def run(self, fn: Any, *args: Any) -> Any:
        with _generators():
            torch.set_rng_state(self.generators[0])
            random.setstate(self.generators[1])
            try:
                return fn(*args)
            finally:
                self.generators = (torch.get_rng_state(), random.getstate())

    def draw(self) -> tuple[list[float], list[float]]:
        return self.run(_draw)  # type: ignore[no-any-return]

    def kill(self) -> None:
        pass


@contextlib.contextmanager
def _generators() -> Iterator[None]:
    """The test's own generators are left as they were."""
    saved = (torch.get_rng_state(), random.getstate())
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])


class ProcessGroup(TrainerGroup):
    def _worker(self, rank: int) -> ProcessWorker:  # type: ignore[override]
        return ProcessWorker(rank, self.seed)


def _config(tmp_path: Path, *, load: bool = True) -> LifecycleConfig:
    """The job's config: the first driver saves into ``ckpt``, a resumed one also loads from it."""
    save = str(tmp_path / "ckpt")
    values = {"rollout_num_gpus": 2, "save": save, **({"load": save} if load else {})}
    return LifecycleConfig.from_mapping(values, check_paths=False)


def _group(tmp_path: Path, resume: JobCheckpoint | None, seed: int = 0) -> ProcessGroup:
    config = _config(tmp_path, load=resume is not None)
    runner = Runner(config, log=EventLog([]))
    bind_rollout_stand_in(runner)
    return ProcessGroup(config, tmp_path / "run", workers=2, runner=runner, backend=BACKEND, resume=resume, seed=seed)


# -- the workers' random generators ------------------------------------------------------------------------------
def test_a_workers_generators_survive_the_checkpoint_on_disk(tmp_path: Path) -> None:
    """The worker's own rng_state, written by save_job_checkpoint and read back by load_job_checkpoint, makes
    set_rng_state draw what the worker would have drawn next -- torch's and Python's generators both."""
    config = _config(tmp_path)
    worker = ProcessWorker(0, seed=3)
    worker.draw()  # a job that ran a while
    state = worker.run(worker.impl.rng_state)
    expected = worker.draw()
    facts = {"restarts": [[], []]}
    save_job_checkpoint(tmp_path / "ckpt", JobCheckpoint(1, "1", {}, facts, {"ranks": [state]}), config)
    loaded = load_job_checkpoint(tmp_path / "ckpt", config)
    fresh = ProcessWorker(0, seed=99)  # a new process: other generators
    assert fresh.draw() != expected
    fresh.run(fresh.impl.set_rng_state, loaded.rng["ranks"][0])
    assert fresh.draw() == expected


def test_each_resumed_worker_draws_what_its_rank_would_have_drawn(tmp_path: Path) -> None:
    """The group's save handler writes every rank's generators, the checkpoint is read back from disk, and the
    resumed group's workers -- new processes -- continue each its own rank's sequence."""
    before = _group(tmp_path, None, seed=5)
    asyncio.run(before.start())
    for w in before.workers:
        w.draw()  # type: ignore[attr-defined]
    before._job = 1
    assert asyncio.run(before._save_job(None)).name == "checkpointed"  # type: ignore[arg-type]
    expected = [w.draw() for w in before.workers]  # type: ignore[attr-defined]
    assert expected[0] != expected[1]  # the ranks draw apart: a mix-up would show

    resume = load_job_checkpoint(tmp_path / "ckpt", _config(tmp_path, load=False))
    after = _group(tmp_path, resume, seed=5)
    asyncio.run(after.start())
    assert after.state == "Ready"
    assert [w.draw() for w in after.workers] == expected  # type: ignore[attr-defined]


# -- the weight version the resumed engines start from ----------------------------------------------------------
def _resumed_job(tmp_path: Path, version: str) -> tuple[Job, list[tuple[str, tuple[str, str] | None]]]:
    """A resumed Job's parts without Ray: the trainer group on in-process workers, the real rollout manager with
    its engines' commands answered as a healthy engine does -- each load records the weights it was told to load."""
    config = _config(tmp_path)
    step = int(version)
    rng = [ProcessWorker(r).run(ProcessWorker(r).impl.rng_state) for r in range(2)]
    checkpoint = JobCheckpoint(step, version, {"w": torch.zeros(2)}, {"restarts": [[], []]}, {"ranks": rng})
    save_job_checkpoint(tmp_path / "ckpt", checkpoint, config)
    resume = load_job_checkpoint(tmp_path / "ckpt", config)
    options = RunOptions(resume=resume, events=None, workers=2)
    job = Job(config, TASK, run_dir=tmp_path / "run", backend=BACKEND, options=options)
    runner = Runner(config, log=job.log, ledger=job.ledger)
    job._runner = runner
    job._trainer = ProcessGroup(config, job.run_dir, workers=2, runner=runner, backend=BACKEND, resume=resume)
    job._manager = RolloutManager(config, TASK, runner=runner, launcher_factory=None)
    bind_rollout_stand_in(runner)
    loads: list[tuple[str, tuple[str, str] | None]] = []

    async def load(cmd: Command) -> Outcome:
        loads.append((cmd.instance, runner.weights(cmd)))
        return Outcome("loaded")

    runner.provide({"engine.transfer_weights": load})
    return job, loads


@pytest.mark.parametrize("version", ["7", "12"])
def test_the_resumed_engines_start_from_the_checkpoints_version(tmp_path: Path, version: str) -> None:
    job, loads = _resumed_job(tmp_path, version)
    asyncio.run(job._start())
    assert job.weights is not None and job.weights[1] == version
    assert job.runner.committed == job.weights  # what every engine must serve from now on
    assert sorted(instance for instance, _ in loads) == ["engine-0", "engine-1"]  # every engine loads it first
    for _, weights in loads:
        assert weights is not None
        path, loaded = weights
        assert loaded == version and Path(path).name == f"step-{version}" and Path(path).is_dir()


def test_catches_a_worker_whose_generators_are_not_restored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WORKER, "set_rng_state", lambda self, state: None)
    with pytest.raises(AssertionError):
        test_a_workers_generators_survive_the_checkpoint_on_disk(tmp_path / "a")
    with pytest.raises(AssertionError):
        test_each_resumed_worker_draws_what_its_rank_would_have_drawn(tmp_path / "b")


def test_catches_a_checkpoint_that_keeps_only_torchs_generator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(WORKER, "rng_state", lambda self: {"torch": torch.get_rng_state()})
    with pytest.raises(AssertionError):
        test_a_workers_generators_survive_the_checkpoint_on_disk(tmp_path)


def test_catches_rank_0s_generators_saved_for_every_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = ProcessWorker.call

    async def rank_0s(self: ProcessWorker, method: str, *args: Any, timeout: float | None = None) -> Any:
        if method == "rng_state" and self.rank != 0:
            return await real(ProcessWorker(0, 5), method, *args)
        return await real(self, method, *args, timeout=timeout)

    monkeypatch.setattr(ProcessWorker, "call", rank_0s)
    with pytest.raises(AssertionError):
        test_each_resumed_worker_draws_what_its_rank_would_have_drawn(tmp_path)


def test_catches_resumed_engines_started_from_version_0(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.app.job as job_module

    async def fresh_weights(*args: Any) -> tuple[str, str]:
        return ("/nowhere/step-0", "0")

    monkeypatch.setattr(job_module, "initial_weights", fresh_weights)
    real_start = TrainerGroup.start

    async def start_without_resume_weights(self: TrainerGroup) -> tuple[str, str] | None:
        await real_start(self)
        return None  # the job then starts its engines from the initial weights (version 0)

    monkeypatch.setattr(TrainerGroup, "start", start_without_resume_weights)
    with pytest.raises(AssertionError):
        test_the_resumed_engines_start_from_the_checkpoints_version(tmp_path, "7")
