"""A run directory and a ``--save`` directory belong to one driver at a time (issue 41, cause 1).

Two ``lifecycle run --resume DIR`` at once both ran: they interleaved one event log (which then failed its own
``trace check``), wrote one save directory and, under ``--detach-engines``, adopted the same engine servers. Every
driver -- ``lifecycle run``, ``--resume``, ``run_loop``, a ``Job`` -- now holds its directories with one lock
(:mod:`trainer.app.dirlock`); the second driver is refused naming the holder, exit 2, its folders as it found them.

The holders here are real processes holding the lock through the module; the refused drivers are real
``lifecycle run`` processes where that is cheap (the refusal comes before Ray, torch or a checkpoint is read).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from badinput import _paragraph_problems, tree_snapshot, written

import lifecycle.cli as cli
import trainer.app.dirlock as dirlock
from lifecycle.decide.errors import ConfigError
from trainer.app.dirlock import LOCK_FILE, hold, hold_run

pytestmark = pytest.mark.bad_input

REPO = Path(__file__).resolve().parents[2]
# a driver stand-in: holds DIR through the module until its stdin closes; ``fork``: first forks a child and starts
# an exec'd one (its fds not closed: close_fds=False), prints their pids and exits, leaving both running
HOLDER = r"""
import os, subprocess, sys, time
import trainer.app.dirlock as dirlock
mode, path = sys.argv[1], sys.argv[2]
if mode == "fork-unguarded":  # the old way: a forked child keeps the open file description, so the flock
    dirlock._forget_in_child = lambda: None
lock = dirlock.hold(path, "--run-dir")
if mode.startswith("fork"):
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    spawned = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], close_fds=False)
    print(child, spawned.pid, flush=True)
    os._exit(0)
print("held", flush=True)
sys.stdin.read()
"""


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture
def holder() -> Iterator[Any]:
    """``holder(path)``: a process holding ``path``; it ends with the test."""
    started: list[subprocess.Popen[str]] = []

    def start(path: Path, mode: str = "hold") -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, mode, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        started.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"the holder did not start (exit {proc.wait(timeout=10)})"
        proc.first_line = line.strip()  # type: ignore[attr-defined]
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def _lifecycle(*argv: str, cwd: Path = REPO, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lifecycle.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd=cwd,
    )


def _still_held(path: Path, pid: int) -> None:
    """The first driver is unaffected: its lock file still names it, and another taker is still refused."""
    assert f'"pid": {pid}' in (path / LOCK_FILE).read_text()
    with pytest.raises(ConfigError, match=f"pid {pid}"):
        hold(path, "--run-dir")


def _write_run(tmp: Path, name: str = "run") -> Path:
    """A run directory ``--resume`` accepts as far as its lock (run.json of a run started with --save)."""
    from lifecycle.cli.args import _embedded
    from lifecycle.decide.config import LifecycleConfig
    from trainer.app.loop import RunOptions
    from trainer.app.run_manifest import write_run_manifest

    config = LifecycleConfig.from_mapping({**_embedded("cpu"), "save": str(tmp / name / "ckpt")})
    (tmp / name).mkdir(parents=True)
    write_run_manifest(tmp / name, config, RunOptions(steps=3, run_dir=tmp / name).manifest(), job_id="job-a")
    return tmp / name


# -- (1) a second driver on one run directory --------------------------------------------------------------------
def test_a_second_new_run_on_a_held_run_dir_is_refused_naming_the_holder(tmp_path: Path, holder: Any) -> None:
    run = tmp_path / "run"
    first = holder(run)
    before = tree_snapshot(tmp_path)
    second = _lifecycle("run", "--run-dir", str(run), "--steps", "1", "--quiet")
    assert second.returncode == 2, second
    assert not _paragraph_problems(second.stderr, ["--run-dir", str(run), f"pid {first.pid}", "kill", "Fix:"])
    assert "in use by" in second.stderr and "one driver at a time" in second.stderr
    assert not written(before, tree_snapshot(tmp_path)), "a refused run wrote into the folder"
    assert first.poll() is None
    _still_held(run, first.pid)


def test_a_second_resume_of_a_held_run_is_refused_naming_the_holder(
    tmp_path: Path, holder: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _write_run(tmp_path)
    first = holder(run)
    before = tree_snapshot(tmp_path)
    capsys.readouterr()
    assert cli.main(["run", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert not _paragraph_problems(err, ["--resume", str(run), f"pid {first.pid}"]), err
    assert not written(before, tree_snapshot(tmp_path)), "a refused resume wrote into the folder"
    _still_held(run, first.pid)


def test_the_holders_line_names_its_command_host_and_start(tmp_path: Path) -> None:
    with hold(tmp_path / "run", "--run-dir"):
        body = (tmp_path / "run" / LOCK_FILE).read_text()
    assert f'"pid": {os.getpid()}' in body and '"host": ' in body and '"command": ' in body and '"since": ' in body
    assert not (tmp_path / "run").exists(), "the folder the lock created, empty, is removed with it"


# -- (2) a dead holder's lock is taken over ----------------------------------------------------------------------
def test_a_sigkilled_holders_lock_is_taken_over(tmp_path: Path, holder: Any) -> None:
    run = tmp_path / "run"
    first = holder(run)
    with pytest.raises(ConfigError, match=f"pid {first.pid}"):
        hold(run, "--run-dir")
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert (run / LOCK_FILE).exists(), "a killed driver leaves its lock file (only the kernel's lock is gone)"
    with hold(run, "--run-dir"):
        assert f'"pid": {os.getpid()}' in (run / LOCK_FILE).read_text()
    assert not (run / LOCK_FILE).exists()


# -- (3) no child keeps the lock ---------------------------------------------------------------------------------
def _children_outlive_holder(holder: Any, run: Path, mode: str) -> list[int]:
    first = holder(run, mode)
    assert first.wait(timeout=10) == 0  # the holder has exited; its two children run on
    children = [int(pid) for pid in first.first_line.split()]
    for pid in children:
        os.kill(pid, 0)  # alive
    return children


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_child_that_outlives_its_holder_does_not_keep_the_lock(tmp_path: Path, holder: Any) -> None:
    run = tmp_path / "run"
    children = _children_outlive_holder(holder, run, "fork")
    try:
        with hold(run, "--run-dir"):  # a forked child and an exec'd one are still running
            pass
    finally:
        _kill(children)


def test_catches_a_forked_child_keeping_the_lock(tmp_path: Path, holder: Any) -> None:
    """The old way back (a forked child keeps its copy of the descriptor): the child holds the dead driver's lock."""
    run = tmp_path / "run"
    children = _children_outlive_holder(holder, run, "fork-unguarded")
    try:
        with pytest.raises(ConfigError, match="in use by"):
            hold(run, "--run-dir")
    finally:
        _kill(children)


# -- (4) the --save directory is held too ------------------------------------------------------------------------
def test_a_run_with_a_held_save_dir_is_refused_and_leaves_nothing(tmp_path: Path, holder: Any) -> None:
    save = tmp_path / "ckpt"
    first = holder(save)
    before = tree_snapshot(tmp_path)
    second = _lifecycle("run", "--run-dir", str(tmp_path / "other"), "--save", str(save), "--steps", "1", "--quiet")
    assert second.returncode == 2, second
    assert not _paragraph_problems(second.stderr, ["--save", str(save), f"pid {first.pid}"]), second.stderr
    assert not written(before, tree_snapshot(tmp_path)), "the run directory the lock created is left behind"
    assert not (tmp_path / "other").exists()
    _still_held(save, first.pid)


def test_two_holders_of_one_directory_in_one_process_share_it(tmp_path: Path) -> None:
    """``lifecycle run`` holds its directories, then run_loop and its Job take them again: reentrant."""
    outer = hold(tmp_path / "run", "--run-dir")
    inner = hold_run(tmp_path / "run", None, run_flag="RunOptions.run_dir", save_flag="config.save")
    inner.release()
    assert (tmp_path / "run" / LOCK_FILE).exists(), "still the outer holder's"
    outer.release()
    outer.release()  # once is all a holding releases
    assert not (tmp_path / "run").exists()


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "target").write_text("mine")
    (tmp_path / "run" / LOCK_FILE).symlink_to(tmp_path / "target")
    with pytest.raises(ConfigError, match=r"--run-dir.*cannot hold its lock file"):
        hold(tmp_path / "run", "--run-dir")
    assert (tmp_path / "target").read_text() == "mine"


# -- (5) Job, from Python ----------------------------------------------------------------------------------------
def _job(run_dir: Path, save: Path | None = None, **kw: Any) -> Any:
    from lifecycle.cli.args import _embedded
    from lifecycle.decide.config import LifecycleConfig
    from rollout.pattern import PatternTask
    from trainer.app.job import Job
    from trainer.app.options import RunOptions

    values = {**_embedded("cpu"), **({"save": str(save)} if save else {})}
    options = RunOptions(**kw) if kw else None
    return Job(LifecycleConfig.from_mapping(values), PatternTask(seed=0), run_dir=run_dir, options=options)


def _job_refused(tmp: Path, holder: Any) -> list[str]:
    """Problems with a Job given a run directory a live driver holds (empty: refused, nothing written, no Ray)."""
    run = tmp / "run"
    first = holder(run)
    before = tree_snapshot(tmp)
    ray_before = _ray_up()  # the session's own cluster may be up already (the fault matrix's): only a start counts
    try:
        job = _job(run)
    except ConfigError as exc:
        problems = [] if f"run_dir=: the directory is in use by pid {first.pid}" in str(exc) else [str(exc)]
    else:
        asyncio.run(job.close())
        problems = ["the job was built"]
    if written(before, tree_snapshot(tmp)):
        problems.append(f"wrote {written(before, tree_snapshot(tmp))}")
    if _ray_up() and not ray_before:
        problems.append("Ray started")
    return problems


def _ray_up() -> bool:
    return "ray" in sys.modules and bool(sys.modules["ray"].is_initialized())


def test_a_job_refuses_a_run_dir_another_process_holds_before_ray_starts(tmp_path: Path, holder: Any) -> None:
    assert _job_refused(tmp_path, holder) == []


def test_a_job_refuses_a_save_dir_another_process_holds(tmp_path: Path, holder: Any) -> None:
    first = holder(tmp_path / "ckpt")
    with pytest.raises(ConfigError, match=f"config.save: the directory is in use by pid {first.pid}"):
        _job(tmp_path / "run", tmp_path / "ckpt")
    assert not (tmp_path / "run").exists()


def test_a_job_holds_its_directories_until_it_closes(tmp_path: Path) -> None:
    job = _job(tmp_path / "run", tmp_path / "ckpt")
    assert (tmp_path / "run" / LOCK_FILE).exists() and (tmp_path / "ckpt" / LOCK_FILE).exists()
    asyncio.run(job.close())
    assert not (tmp_path / "run" / LOCK_FILE).exists() and not (tmp_path / "ckpt").exists()


def test_a_job_never_closed_frees_its_directories_when_collected(tmp_path: Path) -> None:
    import gc

    job = _job(tmp_path / "run", events=None)  # no event log: the directory holds no run for the next one
    assert (tmp_path / "run" / LOCK_FILE).exists()
    del job
    gc.collect()
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    with hold(tmp_path / "run", "--run-dir"):  # a collected job gives back only its own share
        held = _job(tmp_path / "run", events=None)
        del held
        gc.collect()
        assert (tmp_path / "run" / LOCK_FILE).exists(), "still this holder's"


# -- (6) the check fails with the lock gone -----------------------------------------------------------------------
def _second_driver(tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Problems with a second ``lifecycle run`` on a run directory a live driver holds (empty: refused as it
    should be). In-process, with the loop replaced by a recorder: a driver that gets past its checks is seen."""
    import trainer.app.loop

    ran: list[Path] = []
    monkeypatch.setattr(trainer.app.loop, "run", lambda config, opts: ran.append(opts.run_dir))
    run = tmp / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, "hold", str(run)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env()
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        capsys.readouterr()
        code = cli.main(["run", "--run-dir", str(run), "--steps", "1", "--quiet"])
        err = capsys.readouterr().err
    finally:
        proc.kill()
        proc.wait(timeout=10)
    problems = [f"the second driver ran in {ran[0]}"] if ran else []
    if code != 2:
        problems.append(f"exit {code}")
    return problems + _paragraph_problems(err, ["--run-dir", f"pid {proc.pid}"])


def test_the_second_driver_check_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _second_driver(tmp_path, monkeypatch, capsys) == []


def test_catches_two_drivers_on_one_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The lock made a no-op (the old code): the second driver is not refused -- it runs."""

    class NoLock:
        def release(self) -> None:
            pass

    monkeypatch.setattr(dirlock, "hold", lambda path, flag: NoLock())
    problems = _second_driver(tmp_path, monkeypatch, capsys)
    assert any(p.startswith("the second driver ran") for p in problems), problems


def test_catches_a_job_without_the_lock(tmp_path: Path, holder: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.app.job

    monkeypatch.setattr(trainer.app.job, "hold_run", lambda *a, **k: dirlock.DirLocks())
    assert "the job was built" in _job_refused(tmp_path, holder)  # and it opened the other driver's event log


# -- end to end: two real resumes racing --------------------------------------------------------------------------
@pytest.mark.slow
def test_two_resumes_racing_on_one_run_dir_one_runs_and_the_log_checks(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    run = tmp_path / "run"
    started = _lifecycle(
        "run", "--steps", "1", "--run-dir", str(run), "--save", str(run / "ckpt"), "--quiet", cwd=tmp_path, timeout=600
    )
    assert started.returncode == 0, started.stderr[-3000:]
    argv = [sys.executable, "-m", "lifecycle.cli", "run", "--resume", str(run), "--steps", "2", "--quiet"]
    t0 = time.monotonic()
    racing = [
        subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path)
        for _ in range(2)
    ]
    try:
        results = [(p.wait(timeout=600), *p.communicate()) for p in racing]
    finally:
        for p in racing:
            if p.poll() is None:
                p.kill()
    assert sorted(code for code, _, _ in results) == [0, 2], [(c, e[-2000:]) for c, _, e in results]
    refused = next(err for code, _, err in results if code == 2)
    winner = next(p for p, (code, _, _) in zip(racing, results, strict=True) if code == 0)
    assert not _paragraph_problems(refused, ["--resume", str(run), f"pid {winner.pid}"]), refused
    check = _lifecycle("trace", "check", str(run / "events.jsonl"))
    assert check.returncode == 0, check.stdout + check.stderr
    assert not (run / LOCK_FILE).exists() and time.monotonic() - t0 < 600
