"""A ``lifecycle run`` killed with SIGKILL mid-step leaves an event log that still reads.

The event log writes each line with one ``write(2)`` on an ``O_APPEND`` fd (``JsonlSink``), so a
killed writer leaves whole lines and at worst a torn last one. This kills a real run (Ray, a CPU
engine, a trainer actor) while a step is in flight and checks: every complete line parses, at most
the final line is partial, and ``lifecycle trace show`` / ``trace diff`` read the file -- a torn last
line gives a note, never a traceback.

A SIGKILLed driver cannot clean up: Ray's processes and the engine processes (own sessions) can
outlive it. Every process the run spawned carries a marker in its environment, so the test finds
them in /proc afterwards, kills what is left and asserts nothing of the run survives.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
MARKER = "LIFECYCLE_CRASH_TEST"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def marked_pids(token: str) -> set[int]:
    """Live processes whose environment carries ``MARKER=token`` (the run and all its descendants)."""
    needle = f"{MARKER}={token}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in env.split(b"\0") and state != "Z":
            found.add(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    """Children, their children, ...: a server runs under its reaper (engines/reaper.py), a grandchild."""
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop())
        out += kids
        todo += kids
    return out


def kill_marked(token: str, grace: float) -> set[int]:
    """Wait up to ``grace`` s for the run's processes to exit on their own, then SIGKILL the rest."""
    deadline = time.monotonic() + grace
    while marked_pids(token) and time.monotonic() < deadline:
        time.sleep(0.5)
    leftovers = marked_pids(token)
    for pid in leftovers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while marked_pids(token) and time.monotonic() < deadline:
        time.sleep(0.2)
    return leftovers


@pytest.fixture
def run_token() -> Iterator[str]:
    """The marker; whatever happens in the test, no marked process survives it."""
    token = uuid.uuid4().hex
    yield token
    kill_marked(token, grace=0)
    assert not marked_pids(token), "processes of the killed run survived the cleanup"


def step_events(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    events = []
    for raw in path.read_bytes().split(b"\n")[:-1]:  # complete lines only, while the writer runs
        with contextlib.suppress(ValueError):
            events.append(json.loads(raw))
    return [e for e in events if isinstance(e, dict) and "step" in e]


def check_log(path: Path) -> tuple[int, bool]:
    """Every complete line parses as a JSON object; only the last may be partial. (events, torn?)"""
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: b"" when the file ends with a newline
    for number, raw in enumerate(complete, start=1):
        event = json.loads(raw)  # raises -> the test fails naming the line
        assert isinstance(event, dict), f"line {number} is not an event object: {raw[:80]!r}"
    torn = bool(tail.strip())
    if torn:
        with pytest.raises(ValueError):
            json.loads(tail)  # a partial line: must not be a complete event that lost its newline
    return len(complete), torn


def trace(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lifecycle.cli", "trace", *args], capture_output=True, text=True, timeout=60, cwd=REPO
    )


@pytest.mark.slow
def test_sigkill_mid_step_leaves_a_readable_event_log(tmp_path: Path, run_token: str) -> None:
    run_dir = tmp_path / "run"
    log = run_dir / "events.jsonl"
    env = {**os.environ, MARKER: run_token, "PYTHONUNBUFFERED": "1"}
    argv = ["run", "--steps", "50", "--engines", "1", "--quiet", "--run-dir", str(run_dir)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "lifecycle.cli", *argv],
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "run.err", "wb"),  # noqa: SIM115 -- closed with the process
        env=env,
        cwd=REPO,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 420
        # mid-step: step 1 has begun (its first events are written) -- kill while it is in flight
        while not any(e.get("step") == 1 for e in step_events(log)):
            assert proc.poll() is None, f"the run ended early: {(tmp_path / 'run.err').read_text()[-2000:]}"
            assert time.monotonic() < deadline, "no step events within 420 s"
            time.sleep(0.05)
        spawned = {pid: cmdline(pid) for pid in marked_pids(run_token)}
        # the router names itself (setproctitle), which hides the marker: it is the driver's (its reaper's child)
        routers = [pid for pid in descendants(proc.pid) if "router" in cmdline(pid)]
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and everything in its process group
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert proc.returncode == -signal.SIGKILL

    # the marker reaches the whole tree: Ray's processes and the engine (own session, under a Ray worker)
    assert any("engines.cpu" in c for c in spawned.values()), spawned
    assert any("raylet" in c for c in spawned.values()), spawned
    survivors = kill_marked(run_token, grace=20)  # Ray and engines in other sessions: give them a chance
    assert not marked_pids(run_token)
    if importlib.util.find_spec("smg") is not None:  # its own session, yet it dies with the driver
        assert routers, "no gateway (SMG) under the driver"
        assert not [pid for pid in routers if "router" in cmdline(pid)], "the gateway (SMG) outlived the driver"
    print(f"{len(spawned)} processes in the run; alive 20 s after the kill (now killed): {len(survivors)}")

    count, torn = check_log(log)
    assert count > 0 and any(e.get("step") == 1 for e in step_events(log))
    assert not any(
        e.get("event") == "lifecycle.transition" and e.get("trigger") == "dispose" for e in step_events(log)
    ), "the run was not killed mid-run: it already disposed"

    shown = trace("show", str(log))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert len(shown.stdout.splitlines()) == count
    assert ("incomplete" in shown.stderr) == torn

    # The torn-line path, for certain: the same log with half of a real line appended (a write cut short).
    torn_copy = tmp_path / "torn.jsonl"
    complete = log.read_bytes().rsplit(b"\n", 1)[0] + b"\n"
    last = complete.rstrip(b"\n").rsplit(b"\n", 1)[-1]
    torn_copy.write_bytes(complete + last[: len(last) // 2])
    assert check_log(torn_copy) == (count, True)
    shown = trace("show", str(torn_copy))
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert len(shown.stdout.splitlines()) == count
    assert "note:" in shown.stderr and "the last line is incomplete" in shown.stderr and str(torn_copy) in shown.stderr
    same = trace("diff", str(log), str(torn_copy))
    assert same.returncode == 0 and f"no difference: {count} events" in same.stdout, same


def test_a_torn_line_in_the_middle_is_an_error_not_a_skip(tmp_path: Path) -> None:
    """Only the LAST line may be partial: damage anywhere else is one paragraph, exit 2 (no silent loss)."""
    good = '{"event": "lifecycle.transition", "machine": "rollout", "src": "Init", "dst": "Ready"}'
    path = tmp_path / "events.jsonl"
    path.write_text(f"{good}\n{good[:30]}\n{good}\n")
    with pytest.raises(json.JSONDecodeError):
        check_log(path)
    out = trace("show", str(path))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().count("\n") == 0 and f"{path}:2" in out.stderr, out.stderr


def test_marker_finds_and_kills_a_detached_grandchild(tmp_path: Path) -> None:
    """The cleanup can fail: a grandchild in its own session (like an engine) is found by the marker."""
    token = uuid.uuid4().hex
    env = {**os.environ, MARKER: token}
    code = (
        "import subprocess, sys, time; "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True); "
        "time.sleep(120)"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while len(marked_pids(token)) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait(10)
        assert len(marked_pids(token)) == 1, "the detached grandchild outlives its parent's group kill"
    finally:
        kill_marked(token, grace=0)
    assert not marked_pids(token)
