"""A ``Job`` refuses what ``lifecycle run`` refuses, is entered once, pushes increasing versions, and a failed start
surfaces as itself (issue 41, causes 2 and 8).

The argument checks run when the Job is constructed, before Ray or anything else starts: these tests fail Ray's
start on purpose (``_no_ray``) to show it. The few cases that need a job that really starts use the session's Ray
cluster and the project's CPU engines.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import trainer.app.job as job_module
from engines.engine import Timeouts
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.runner import UnboundEffect
from rollout.pattern import PatternTask
from rollout.task import TaskError
from tests.helpers import alive
from trainer.app import Job, RunOptions
from trainer.app.job import JobReused
from trainer.backend import BackendSpec
from trainer.job_state import JobCheckpoint

CONFIG = LifecycleConfig.from_mapping({"rollout_num_gpus": 1})


class Boom(Exception):
    """A part of the job failing while it starts (not anything the project raises)."""


@pytest.fixture(autouse=True)
def _no_ray(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """Ray must not start in the fast tests: a check that ran only after it would fail here instead."""
    if "ray_cluster" in request.fixturenames:
        return

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("Ray was started: the check did not run before it")

    monkeypatch.setattr("engines.actor.init_local_cluster", refuse)


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- each bad argument, named as a Python caller knows it, before anything starts -------------------------------------
BAD: list[tuple[str, dict[str, Any], type[Exception], str]] = [
    ("config-dict", {"config": {"rollout_num_gpus": 1}}, ConfigError, "Job(config=)"),
    ("run-dir-int", {"run_dir": 123}, ConfigError, "Job(run_dir=)"),
    ("run-dir-blank", {"run_dir": " "}, ConfigError, "Job(run_dir=)"),
    ("workers-0", {"workers": 0}, ConfigError, "RunOptions.workers"),
    ("workers-float", {"workers": 1.5}, ConfigError, "RunOptions.workers"),
    ("metrics-port-70000", {"metrics_port": 70000}, ConfigError, "RunOptions.metrics_port"),
    ("metrics-port-str", {"metrics_port": "9400"}, ConfigError, "RunOptions.metrics_port"),
    ("metrics-host-no-port", {"metrics_host": "0.0.0.0"}, ConfigError, "RunOptions.metrics_host"),
    ("keep-checkpoints-bool", {"keep_checkpoints": True}, ConfigError, "RunOptions.keep_checkpoints"),
    ("steps-0", {"steps": 0}, ConfigError, "RunOptions.steps"),
    ("seed-negative", {"seed": -1}, ConfigError, "RunOptions.seed"),
    ("ray-nodes-0", {"ray_nodes": 0}, ConfigError, "RunOptions.ray_nodes"),
    ("ray-address-garbage", {"ray_address": "not an address"}, ConfigError, "RunOptions.ray_address"),
    ("ray-nodes-and-address", {"ray_nodes": 2, "ray_address": "127.0.0.1:6379"}, ConfigError, "RunOptions.ray_nodes"),
    ("launcher-unknown", {"launcher": "slurm"}, ConfigError, "RunOptions.launcher"),
    ("engine-lease-str", {"engine_lease": "120"}, ConfigError, "RunOptions.engine_lease"),
    ("timeouts-zero", {"timeouts": Timeouts(startup=0.0)}, ConfigError, "RunOptions.timeouts"),
    ("timeouts-dict", {"timeouts": {"startup": 5}}, ConfigError, "RunOptions.timeouts"),
    ("rollout-fn-no-attr", {"rollout_fn": "mypkg"}, ConfigError, "RunOptions.rollout_fn"),
    ("initial-checkpoint-int", {"initial_checkpoint": 7}, ConfigError, "Job(initial_checkpoint=)"),
    ("initial-checkpoint-missing", {"initial_checkpoint": "/no/such/model"}, ConfigError, "Job(initial_checkpoint=)"),
    ("backend-str", {"backend": "trainer.grpo:GRPOBackend"}, ConfigError, "Job(backend=)"),
    ("engines-not-callable", {"engines": "ray"}, ConfigError, "Job(engines=)"),
    ("events-int", {"events": 3}, ConfigError, "RunOptions.events"),
    ("task-none", {"task": None}, TaskError, "Job(task=)"),
    ("options-dict", {"options": {"seed": 1}}, ConfigError, "Job(options=)"),
    ("loop-only-lr", {"lr": 0.5}, ConfigError, "RunOptions.lr"),
    ("loop-only-backend", {"options": RunOptions(backend=BackendSpec("a:B"))}, ConfigError, "Job(backend="),
    ("detach-without-address", {"config": {"detach_engines": True}}, ConfigError, "--detach-engines"),
    ("vllm-without-checkpoint", {"config": {"rollout_backend": "vllm"}}, ConfigError, "Job(initial_checkpoint=)"),
    ("load-without-resume", {"config": {"load": "ckpt"}}, ConfigError, "RunOptions.resume"),
]


def _job(tmp_path: Path, **given: Any) -> Job:
    config = given.pop("config", CONFIG)
    if isinstance(config, dict) and given.pop("_build_config", True) and "rollout_num_gpus" not in config:
        config = LifecycleConfig.from_mapping({"rollout_num_gpus": 1, **config})
    task = given.pop("task", PatternTask())
    own = {name: given.pop(name) for name in list(given) if name in JOB_ARGUMENTS}
    options = RunOptions(**given) if given else own.pop("options", None)
    return Job(config, task, **{"run_dir": tmp_path / "run", **own}, options=options)


JOB_ARGUMENTS = ("run_dir", "backend", "initial_checkpoint", "engines", "options")  # the rest: RunOptions


@pytest.mark.parametrize(("name", "given", "error", "names"), BAD, ids=[b[0] for b in BAD])
def test_each_bad_argument_is_named_before_anything_starts(
    tmp_path: Path, name: str, given: dict[str, Any], error: type[Exception], names: str
) -> None:
    with pytest.raises(error) as caught:
        _job(tmp_path, **given)
    message = str(caught.value)
    assert names in message, f"{name}: the error does not name {names}: {message}"
    assert "Fix:" in message, f"{name}: no fix given: {message}"
    assert not (tmp_path / "run").exists(), f"{name}: the refused job wrote its run directory"


def test_a_resume_without_config_load_is_refused(tmp_path: Path) -> None:
    checkpoint = JobCheckpoint(step=1, weight_version="1", trainer={}, path=tmp_path / "ckpt" / "job-1")
    with pytest.raises(ConfigError, match=r"RunOptions.resume.*config.load is unset"):
        _job(tmp_path, resume=checkpoint)


def test_a_resume_with_another_number_of_workers_is_refused(tmp_path: Path) -> None:
    checkpoint = JobCheckpoint(1, "1", {}, rng={"ranks": [{}, {}]}, path=tmp_path / "ckpt" / "job-1")
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": 1, "load": str(tmp_path / "ckpt")})
    with pytest.raises(ConfigError, match=r"RunOptions.workers.*written by 2 workers.*workers=2"):
        _job(tmp_path, config=config, resume=checkpoint, workers=1)


# -- never into another run's directory; a resumed job only into its own -----------------------------------------------
def _finished_run(root: Path, save: str = "ckpt") -> Path:
    """The files ``lifecycle run --save`` leaves in a run directory once its run ended (its weights, its logs)."""
    run = root / "finished"
    (run / "weights" / "step-1").mkdir(parents=True)
    (run / "weights" / "step-1" / "model.safetensors").write_bytes(b"the finished run's weights \x00\x01")
    (run / "events.jsonl").write_text('{"event": "job.started"}\n')
    (run / "metrics.jsonl").write_text('{"step": 0, "reward": 0.5}\n')
    body = {"format": "rl-lifecycle/run@1", "config": {"save": save}, "options": {}, "cwd": str(root)}
    (run / "run.json").write_text(json.dumps(body))
    return run


def _refused_into_a_finished_run(tmp_path: Path) -> None:
    run = _finished_run(tmp_path)
    before = _snapshot(run)
    with pytest.raises(ConfigError, match=r"Job\(run_dir=\).*already holds a run"):
        Job(CONFIG, PatternTask(), run_dir=run)
    assert _snapshot(run) == before, "the refused job changed the finished run's files"


def test_a_job_into_a_finished_runs_directory_is_refused_and_its_files_are_unchanged(tmp_path: Path) -> None:
    _refused_into_a_finished_run(tmp_path)


def test_a_resumed_job_writes_only_into_its_own_run_directory(tmp_path: Path) -> None:
    run = _finished_run(tmp_path, save=str(tmp_path / "ckpt"))
    checkpoint = JobCheckpoint(1, "1", {}, rng={"ranks": [{}]}, path=tmp_path / "ckpt" / "job-1")
    own = LifecycleConfig.from_mapping(
        {"rollout_num_gpus": 1, "save": str(tmp_path / "ckpt"), "load": str(tmp_path / "ckpt")}
    )
    Job(
        own, PatternTask(), run_dir=run, options=RunOptions(resume=checkpoint, events=None)
    )  # its own: accepted (nothing starts yet)
    other = LifecycleConfig.from_mapping({"rollout_num_gpus": 1, "load": str(tmp_path / "other")})
    before = _snapshot(run)
    with pytest.raises(ConfigError, match=r"Job\(run_dir=\).*already holds a run"):
        Job(other, PatternTask(), run_dir=run, options=RunOptions(resume=checkpoint))
    assert _snapshot(run) == before


def test_the_cli_and_a_job_refuse_with_the_same_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One check of a run's settings: ``lifecycle run`` and ``Job`` both call it (a rule added there binds both)."""
    import trainer.app.checks as checks
    from lifecycle.cli import main

    calls: list[str] = []

    def counting(config: object, options: RunOptions, **given: Any) -> None:
        calls.append(str(options.run_dir))
        raise ConfigError("--run-dir", str(options.run_dir), "refused by the one check", "none")

    import trainer.app.cli as cli_module  # imported before the patch: an import under it would keep the stand-in

    monkeypatch.setattr(checks, "check_run", counting)
    monkeypatch.setattr(job_module, "check_run", counting)
    monkeypatch.setattr(cli_module, "check_run", counting)
    assert main(["run", "--run-dir", str(tmp_path / "cli"), "--steps", "1"]) == 2
    with pytest.raises(ConfigError, match=r"Job\(run_dir=\): refused by the one check"):
        Job(CONFIG, PatternTask(), run_dir=tmp_path / "job")
    assert calls == [str(tmp_path / "cli"), str(tmp_path / "job")]


# -- entered once; versions increase: with the parts stood in for (no Ray) --------------------------------------------
class _Trainer:
    def __init__(self, version: str) -> None:
        self.version = version
        self.pushed: list[int] = []

    async def start(self) -> tuple[str, str]:
        return ("/weights", self.version)

    async def update_weights(self, version: int) -> bool:
        self.pushed.append(version)
        return True

    async def dispose(self) -> None:
        pass


class _Manager:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.executor = type("Executor", (), {"rollout_fn": None})()

    async def init(self, weights: tuple[str, str]) -> None:
        self.calls.append("init")

    async def onload_weights(self) -> None:
        self.calls.append("onload_weights")

    async def onload_kv(self) -> None:
        self.calls.append("onload_kv")

    async def dispose(self) -> None:
        self.calls.append("dispose")


def _stood_in(monkeypatch: pytest.MonkeyPatch, version: str = "0") -> list[int]:
    """Job._build without Ray: a trainer that starts on ``version`` and records what it is asked to push, a
    manager that records its calls. The number of builds, returned, grows with each one."""
    builds: list[int] = []

    def build(self: Job) -> None:
        builds.append(len(builds))
        self._trainer = _Trainer(version)  # type: ignore[assignment]
        self._manager = _Manager()  # type: ignore[assignment]
        self.backend = BackendSpec("stand.in:Backend")

    monkeypatch.setattr(Job, "_build", build)
    monkeypatch.setattr(Job, "_freeze", lambda self: None)
    return builds


def _entered_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _stood_in(monkeypatch)
    job = Job(CONFIG, PatternTask(), run_dir=tmp_path / "run", options=RunOptions(events=None))

    async def twice() -> None:
        async with job:
            pass
        with pytest.raises(JobReused, match=r"entered already.*Fix: construct a new Job"):
            async with job:
                raise AssertionError("the body of a second entry ran")

    asyncio.run(twice())
    assert builds == [0], f"the second entry built the job's parts again ({len(builds)} builds)"


def test_a_job_is_entered_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _entered_twice(tmp_path, monkeypatch)


def test_a_job_entered_while_it_runs_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = _stood_in(monkeypatch)
    job = Job(CONFIG, PatternTask(), run_dir=tmp_path / "run", options=RunOptions(events=None))

    async def nested() -> None:
        async with job:
            with pytest.raises(JobReused):
                await job.__aenter__()
            assert job.manager.calls == ["init"], "the refused entry touched the running job's parts"

    asyncio.run(nested())
    assert builds == [0]


def _versions_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, started: str = "0") -> None:
    """The versions a loop pushes only increase, from the version the job started on; a refused one sends nothing."""
    _stood_in(monkeypatch, version=started)
    job = Job(CONFIG, PatternTask(), run_dir=tmp_path / "run", options=RunOptions(events=None))
    first = int(started) + 2

    async def loop() -> None:
        async with job:
            trainer, manager = job.trainer, job.manager
            assert isinstance(trainer, _Trainer) and isinstance(manager, _Manager)
            await job.update_weights(first)
            for bad in (first, first - 1, int(started), True, "9"):
                sent = (list(trainer.pushed), list(manager.calls))
                with pytest.raises(ConfigError, match=rf"Job.update_weights\(version=\).*above the last.*{first}"):
                    await job.update_weights(bad)  # type: ignore[arg-type]
                assert (trainer.pushed, manager.calls) == sent, f"version {bad!r} was sent"
            await job.update_weights(first + 1)
            assert trainer.pushed == [first, first + 1]

    asyncio.run(loop())


def test_versions_a_loop_pushes_must_increase(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _versions_refused(tmp_path, monkeypatch)


def test_a_resumed_jobs_first_version_is_above_its_checkpoints(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _versions_refused(tmp_path, monkeypatch, started="5")
    _stood_in(monkeypatch, version="5")
    job = Job(CONFIG, PatternTask(), run_dir=tmp_path / "again", options=RunOptions(events=None))

    async def loop() -> None:
        async with job:
            with pytest.raises(ConfigError, match=r"above the last weight version, 5.*push 6"):
                await job.update_weights(5)

    asyncio.run(loop())


# -- a failed start surfaces as itself; its cleanup leaves nothing behind ---------------------------------------------
def _start_fails_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **given: Any) -> BaseException:
    """Enter a job whose build fails after the trainer group exists (Ray not started: its cluster is skipped);
    the exception the caller sees."""
    monkeypatch.setattr("engines.actor.init_local_cluster", lambda **kwargs: None)
    job = Job(given.pop("config", CONFIG), PatternTask(), run_dir=tmp_path / "run", options=RunOptions(**given))

    async def enter() -> None:
        async with job:
            raise AssertionError("the job started")

    with pytest.raises(BaseException) as caught:
        asyncio.run(enter())
    assert not job.log.enabled, "a sink is still attached to the half-built job's event log"
    return caught.value


def _surfaces_as_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(*args: Any, **kwargs: Any) -> None:
        raise Boom("the rollout manager could not be built")

    monkeypatch.setattr(job_module, "RolloutManager", fails)
    raised = _start_fails_with(tmp_path, monkeypatch)
    assert isinstance(raised, Boom), f"the start's failure was hidden by {type(raised).__name__}: {raised}"


def test_a_failed_start_surfaces_as_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _surfaces_as_itself(tmp_path, monkeypatch)


def _cleanup_failure_is_a_note(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """However the cleanup fails, the start's (or the loop body's) failure is what the caller sees; the cleanup's
    is a note on it, and every part was still disposed of."""
    builds = _stood_in(monkeypatch)
    closed: list[str] = []
    original = Job.close

    async def broken_close(self: Job) -> None:
        await original(self)
        closed.append("closed")
        raise RuntimeError("the cleanup broke too")

    monkeypatch.setattr(Job, "close", broken_close)

    async def failing_start(self: Job) -> None:
        raise Boom("the start failed")

    for where in ("start", "body"):
        job = Job(CONFIG, PatternTask(), run_dir=tmp_path / where, options=RunOptions(events=None))
        if where == "start":
            monkeypatch.setattr(Job, "_start", failing_start)

        async def enter(job: Job = job) -> None:
            async with job:
                raise Boom("the loop body failed")

        with pytest.raises(Boom) as caught:
            asyncio.run(enter())
        assert any("the cleanup broke too" in n for n in getattr(caught.value, "__notes__", [])), where
        assert not job.log.enabled, f"{where}: a sink is still attached"
    assert closed == ["closed", "closed"] and builds == [0, 1]


def test_a_failing_cleanup_is_a_note_on_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _cleanup_failure_is_a_note(tmp_path, monkeypatch)


def test_an_unreadable_engine_ledger_surfaces_as_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--detach-engines with a torn engines.json: the ledger reader's own error, not the cleanup's."""
    from engines.ledger import LEDGER, EngineLedger

    config = LifecycleConfig.from_mapping({"rollout_num_gpus": 1, "detach_engines": True, "save": str(tmp_path / "c")})
    config = LifecycleConfig.from_mapping({**config.to_dict(), "load": str(tmp_path / "c")})
    run = tmp_path / "run"
    run.mkdir()
    (run / LEDGER).write_text('{"engines": {"rollout-0": {"epoch": ')  # torn mid-write
    with pytest.raises(Exception) as direct:
        EngineLedger.read(run / LEDGER, namespace="keep")
    checkpoint = JobCheckpoint(1, "1", {}, {"restarts": [[]]}, {"ranks": [{}]}, tmp_path / "c" / "job-1")
    raised = _start_fails_with(
        tmp_path, monkeypatch, config=config, resume=checkpoint, ray_address="127.0.0.1:6379", events=None
    )
    assert not isinstance(raised, UnboundEffect), f"the cleanup's error hid the ledger's: {raised}"
    assert type(raised) is type(direct.value), f"{type(raised).__name__}: {raised}"


def test_a_half_built_groups_workers_are_killed_even_when_its_dispose_fails() -> None:
    """The trainer group's dispose kills every worker even when the core cannot run the dispose (a half-built job:
    handlers missing), so no Ray actor outlives a failed start."""
    from lifecycle.decide.runner import Runner
    from trainer.group import TrainerGroup

    runner = Runner(CONFIG)  # no rollout handlers bound: operate raises UnboundEffect
    group = TrainerGroup(CONFIG, "unused", runner=runner)
    killed: list[int] = []
    group.workers = [type("Worker", (), {"kill": lambda self, r=r: killed.append(r)})() for r in range(2)]  # type: ignore[misc]
    with pytest.raises(UnboundEffect):
        asyncio.run(group.dispose())
    assert killed == [0, 1]


# -- a real job: entered once, increasing versions, nothing left running (Ray, CPU engines) ---------------------------
@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_a_real_job_is_entered_once_and_refuses_a_lower_version(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    job = Job(
        CONFIG, PatternTask(), run_dir=tmp_path / "run", options=RunOptions(launcher="local", router=False, steps=1)
    )
    seen: dict[str, list[int]] = {}

    async def loop() -> None:
        async with job:
            samples = await job.generate(0)
            await job.train(samples)
            await job.update_weights(2)
            with pytest.raises(ConfigError, match=r"version=\).*above the last weight version, 2"):
                await job.update_weights(1)
            assert job.runner.committed is not None and job.runner.committed[1] == "2"
            seen["pids"] = [pid for e in job.manager.controller.engines if (pid := await e.launcher.server_pid())]
        with pytest.raises(JobReused):
            async with job:
                pass

    asyncio.run(loop())
    assert seen["pids"] and not [p for p in seen["pids"] if alive(p)], "an engine server outlived the job"
    assert set(job.manager.controller.states().values()) == {"Disposed"}


# -- the old behaviour, put back, is caught ---------------------------------------------------------------------------
def test_catches_a_job_without_the_shared_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(job_module, "check_run", lambda config, options, **given: None)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        _refused_into_a_finished_run(tmp_path)


def test_catches_a_job_entered_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def old_enter(self: Job) -> Job:  # no single-use guard
        try:
            self._build()
            await self._start()
            self._freeze()
        except BaseException:
            await self.close()
            raise
        return self

    monkeypatch.setattr(Job, "__aenter__", old_enter)
    with pytest.raises((pytest.fail.Exception, AssertionError)):
        _entered_twice(tmp_path, monkeypatch)


def test_catches_a_lower_version_pushed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def old_update(self: Job, version: int, *, onload: bool = True) -> None:  # no version check
        if onload:
            await self.manager.onload_weights()
        await self.trainer.update_weights(version)
        if onload:
            await self.manager.onload_kv()

    monkeypatch.setattr(Job, "update_weights", old_update)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        _versions_refused(tmp_path, monkeypatch)


async def _old_close_under(self: Job, cause: BaseException) -> None:  # the cleanup's error replaces the cause
    await self.close()


async def _old_close(self: Job) -> None:  # a half-built job's core asked to dispose of it, handlers missing
    if self._closed:
        return
    self._closed = True
    try:
        if self._manager is not None:
            await self._manager.dispose()
    finally:
        try:
            if self._trainer is not None:
                await self._trainer.dispose()
        finally:
            self.log.remove_sink(self.monitor)
            if self._sink is not None:
                self.log.remove_sink(self._sink)


def test_catches_a_half_built_jobs_cleanup_raising_over_the_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Job, "_close_under", _old_close_under)
    monkeypatch.setattr(Job, "close", _old_close)
    with pytest.raises(AssertionError, match="hidden by UnboundEffect"):
        _surfaces_as_itself(tmp_path, monkeypatch)


def test_catches_a_cleanup_failure_replacing_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Job, "_close_under", _old_close_under)
    with pytest.raises(RuntimeError, match="the cleanup broke too"):
        _cleanup_failure_is_a_note(tmp_path, monkeypatch)


def test_catches_workers_left_by_a_failed_dispose(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.group import _NOT_NOW, TrainerGroup

    async def old_dispose(self: TrainerGroup) -> None:
        await self.runner.operate("trainer.dispose", allow=_NOT_NOW | {"failed"})
        for w in self.workers:
            w.kill()

    monkeypatch.setattr(TrainerGroup, "dispose", old_dispose)
    with pytest.raises(AssertionError, match=r"assert \[\] == \[0, 1\]"):
        test_a_half_built_groups_workers_are_killed_even_when_its_dispose_fails()
