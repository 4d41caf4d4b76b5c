"""A driver's death costs no engine (issue 31): ``lifecycle run --detach-engines`` on a Ray cluster that outlives the
driver (``ray start --head``), the driver SIGKILLed at a step's start (the ``kill-driver`` fault), and
``lifecycle run --resume`` adopting the engines that live on instead of relaunching them.

Two deaths: right after a job checkpoint (the engines hold the checkpoint's version: adopted as they are, no
reload), and one step after it (the dead driver committed a version the resume voids: the engines are reloaded
with the checkpoint's before they are routed). Either way the surviving processes are the same (server pids,
generations), and the resumed run's metrics equal those of the same run never interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.events import read_jsonl
from tests.helpers import alive, short_tmp

from .kill_mid_update import KILL_ENV

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
STEPS, KILL_AT = 4, 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A Ray head that outlives every driver of the test (``ray start --head``), stopped by its own process group:
    never ``ray stop``, which would stop this test session's Ray too."""
    from engines.actor import ray_head

    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    with short_tmp() as temp, ray_head(temp) as address:
        yield address, env


def _lifecycle(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "lifecycle.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=cwd, env=env)


def _run(cluster: tuple[str, dict[str, str]], run_dir: Path, interval: int, *extra: str, kill_update: str = "") -> Any:
    address, env = cluster
    # every run uses the same rollout function (the default one, from a module the resume imports again); the
    # mid-update case's first driver also SIGKILLs itself inside the update that pushes version ``kill_update``
    env = {**env, "PYTHONPATH": os.pathsep.join([str(HERE), env["PYTHONPATH"]]), KILL_ENV: kill_update}
    flags = ["run", "--steps", str(STEPS), "--run-dir", str(run_dir), "--save", str(run_dir / "ckpt"), "--quiet"]
    flags += ["--save-interval", str(interval), "--ray-address", address, "--detach-engines", "--engine-lease", "60"]
    flags += ["--rollout-function", "kill_mid_update:factory"]
    return _lifecycle(env, *flags, *extra, cwd=run_dir.parent)


def _resume(cluster: tuple[str, dict[str, str]], run_dir: Path) -> Any:
    address, env = cluster
    env = {**env, "PYTHONPATH": os.pathsep.join([str(HERE), env["PYTHONPATH"]])}
    return _lifecycle(env, "run", "--resume", str(run_dir), "--quiet", "--ray-address", address, cwd=run_dir.parent)


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        row.pop("seconds")
    return rows


@pytest.fixture(scope="module")
def runs(cluster: tuple[str, dict[str, str]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("kept")

    def one(name: str, interval: int) -> Path:
        run_dir = base / name
        inject = ("--inject", f"kill-driver:0@{KILL_AT}") if name.endswith("checkpoint") else ()
        # mid-update: the update of step 1 pushes version 2 (the checkpoint after step 0 holds version 1)
        first = _run(cluster, run_dir, interval, *inject, kill_update="2" if name == "mid-update" else "")
        if name != "uninterrupted":
            assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
            ledger = json.loads((run_dir / "engines.json").read_text())["engines"]
            pids = [int(e["server_pid"]) for e in ledger.values()]
            assert len(pids) == 2 and all(alive(p) for p in pids)  # the driver is dead, its engines are not
            (run_dir / "ledger.at-death.json").write_text(json.dumps(ledger))
            resumed = _resume(cluster, run_dir)
            assert resumed.returncode == 0, resumed.stderr[-3000:]
        else:
            assert first.returncode == 0, first.stderr[-3000:]
        return run_dir

    # four independent jobs (each its own run directory, so its own actor names and ledger) on the one head,
    # two at a time: each driver mostly waits on its engines and its imports
    plan = (("uninterrupted", 1), ("at-checkpoint", 1), ("after-checkpoint", 2), ("mid-update", 1))
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="kept-run") as pool:
        futures = {name: pool.submit(one, name, interval) for name, interval in plan}
        return {name: future.result() for name, future in futures.items()}


def _resumed_part(run_dir: Path) -> list[dict[str, Any]]:
    events = read_jsonl(run_dir / "events.jsonl")
    return events[next(i for i, e in enumerate(events) if e["event"] == "job.resumed") :]


@pytest.mark.parametrize("name", ["at-checkpoint", "after-checkpoint", "mid-update"])
def test_the_resume_adopts_the_same_processes_and_relaunches_none(runs: dict[str, Path], name: str) -> None:
    run_dir = runs[name]
    at_death = json.loads((run_dir / "ledger.at-death.json").read_text())
    after = _resumed_part(run_dir)
    resumed = next(e for e in after if e["event"] == "job.resumed")
    checkpoint = str(resumed["weight_version"])
    adopted = {e["instance"]: e for e in after if e["event"] == "engine.adopted"}
    assert set(adopted) == {"engine-0", "engine-1"}
    behind = set()
    for instance, seen in adopted.items():
        # on the wire: the same server process and the same generation as the dead driver's ledger names
        assert (seen["server_pid"], seen["epoch"]) == (at_death[instance]["server_pid"], at_death[instance]["epoch"])
        # kept as it is only if it serves the checkpoint's version and no transfer to it was under way
        trusted = seen["weight_version"] == checkpoint and not at_death[instance]["updating"]
        assert seen["outcome"] == ("adopted" if trusted else "behind"), (instance, seen, at_death[instance])
        if not trusted:
            behind.add(instance)
    if name == "at-checkpoint":
        assert not behind
    elif name == "after-checkpoint":  # the dead driver committed a version after its checkpoint: void now
        assert behind == {"engine-0", "engine-1"}
        assert all(seen["weight_version"] != checkpoint for seen in adopted.values())
    else:  # killed while the ledger said a transfer to engine-0 was under way: whatever it reports, reloaded
        assert at_death["engine-0"]["updating"] and "engine-0" in behind
    launches = [e for e in after if e["event"] == "lifecycle.transition" and "launch_engine" in e.get("effects", ())]
    assert launches == []  # no engine was started again
    first_commit = next(e for e in after if e["event"] == "weights.committed")
    loads = [e for e in after if e["event"] == "engine.weights" and e["ts"] < first_commit["ts"]]
    assert {e["instance"] for e in loads} == behind  # exactly the untrusted ones are loaded before serving
    assert all(e["weight_version"] == checkpoint for e in loads)


@pytest.mark.parametrize("name", ["at-checkpoint", "after-checkpoint", "mid-update"])
def test_no_engine_is_routed_before_it_holds_the_checkpoints_version(runs: dict[str, Path], name: str) -> None:
    """The live monitor's and ``trace check``'s invariants over the whole log, both drivers' parts."""
    judged = subprocess.run(
        [sys.executable, "-m", "lifecycle.cli", "trace", "check", str(runs[name] / "events.jsonl")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert judged.returncode == 0, judged.stdout[-3000:]
    after = _resumed_part(runs[name])
    resumed = next(e for e in after if e["event"] == "job.resumed")
    routed = [e for e in after if e["event"] == "engine.routed"]
    first = {inst: next(e["ts"] for e in routed if e["instance"] == inst) for inst in ("engine-0", "engine-1")}
    committed = next(e for e in after if e["event"] == "weights.committed")
    assert str(committed["weight_version"]) == str(resumed["weight_version"])
    assert all(ts > committed["ts"] for ts in first.values())


@pytest.mark.parametrize("name", ["at-checkpoint", "after-checkpoint", "mid-update"])
def test_the_resumed_run_equals_the_uninterrupted_one(runs: dict[str, Path], name: str) -> None:
    want, got = _rows(runs["uninterrupted"]), _rows(runs[name])
    assert [r["step"] for r in got] == list(range(STEPS))
    assert [(r["step"], r["reward"]) for r in got] == [(r["step"], r["reward"]) for r in want]
    assert got == want


def test_a_finished_run_leaves_no_engine_behind(runs: dict[str, Path]) -> None:
    for run_dir in runs.values():
        ledger = json.loads((run_dir / "engines.json").read_text())
        assert ledger["engines"] == {}  # every engine's death was confirmed at the end
    for name in ("at-checkpoint", "after-checkpoint", "mid-update"):
        at_death = json.loads((runs[name] / "ledger.at-death.json").read_text())
        assert not any(alive(int(e["server_pid"])) for e in at_death.values())
