"""Determinism across a resume (issue 18): a run whose driver is SIGKILLed after its checkpoint, and resumed with
``lifecycle run --resume``, produces exactly what the same run never interrupted does -- every later step's
reward, loss and weight version, and, bit for bit, the trainer's final state.

Both runs are real ``lifecycle run`` processes (a process can start Ray once; the kill takes the whole driver).
The kill is the ``kill-driver`` fault: the driver SIGKILLs itself at the start of step 3, so step 2 -- run after
the checkpoint of step 2 -- dies with it and is run again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.events import read_jsonl

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
STEPS, INTERVAL, KILL_AT = 5, 2, 3


def _lifecycle(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "lifecycle.cli", "run", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )


def _start(run_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    flags = ["--steps", str(STEPS), "--run-dir", str(run_dir), "--save", str(run_dir / "ckpt")]
    return _lifecycle(*flags, "--save-interval", str(INTERVAL), "--quiet", *extra, cwd=run_dir.parent)


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:  # what differs between two runs of one job by nature: wall time
        row.pop("seconds")
    return rows


def _committed(events: list[dict[str, Any]]) -> list[str]:
    return [str(e["weight_version"]) for e in events if e["event"] == "weights.committed"]


def _final_state_sha(run_dir: Path) -> str:
    manifest = json.loads((run_dir / "ckpt" / f"job-{STEPS:06d}" / "state.json").read_text())
    return str(manifest["files"]["state.safetensors"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    pytest.importorskip("ray")
    base = tmp_path_factory.mktemp("resume")
    plain, killed = base / "uninterrupted", base / "killed"

    def killed_and_resumed() -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
        died = _start(killed, "--inject", f"kill-driver:0@{KILL_AT}")
        return died, _lifecycle("--resume", str(killed), "--quiet", cwd=base)

    # the two jobs are independent processes (each its own Ray), so they run side by side: two at a time
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="resume-run") as pool:
        uninterrupted = pool.submit(_start, plain)
        interrupted = pool.submit(killed_and_resumed)
        first = uninterrupted.result()
        died, resumed = interrupted.result()
    assert first.returncode == 0, first.stderr[-3000:]
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return plain, killed, died


def test_the_driver_died_by_sigkill_after_its_checkpoint(runs: tuple[Path, Path, Any]) -> None:
    _, killed, died = runs
    assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    events = read_jsonl(killed / "events.jsonl")
    died_at = next(i for i, e in enumerate(events) if e["event"] == "fault.injected")
    saved = [e["resume_at"] for e in events[:died_at] if e["event"] == "job.checkpointed"]
    assert saved == [2] and events[died_at]["target"] == "driver"  # step 2 ran after its checkpoint, then death
    assert [json.loads(line)["step"] for line in (killed / "metrics.superseded.jsonl").read_text().splitlines()] == [2]


def test_every_step_after_the_resume_is_exactly_what_the_uninterrupted_run_did(runs: tuple[Path, Path, Any]) -> None:
    plain, killed, _ = runs
    want, got = _rows(plain), _rows(killed)
    assert [r["step"] for r in got] == list(range(STEPS))  # no step lost, none repeated
    assert got == want  # rewards, losses, logprobs, samples, engine states: identical
    assert _final_state_sha(killed) == _final_state_sha(plain)  # model and optimizer, bit for bit


def test_weight_versions_continue_from_the_checkpoint_and_never_go_backwards(runs: tuple[Path, Path, Any]) -> None:
    plain, killed, _ = runs
    events = read_jsonl(killed / "events.jsonl")
    resumed = next(i for i, e in enumerate(events) if e["event"] == "job.resumed")
    assert events[resumed]["resume_at"] == 2 and events[resumed]["discarded_steps"] == [2]
    assert _committed(events[:resumed]) == ["0", "1", "2", "3"]  # the dead driver committed 3, then died
    assert _committed(events[resumed:]) == _committed(read_jsonl(plain / "events.jsonl"))[2:]  # "2", ..., "5"
    judged = subprocess.run(
        [sys.executable, "-m", "lifecycle.cli", "trace", "check", str(killed / "events.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert judged.returncode == 0 and "weight_version_never_goes_backwards" in judged.stdout, judged.stdout
