"""The streaming loop (``lifecycle run --fully-async``): generation never stops, weights are pushed while requests
are in flight, and no trained group is more than ``--max-weight-staleness`` versions behind.

Real Ray trainer, real CPU engine processes (local launcher), short runs. What each test reads is what the run
wrote: ``metrics.jsonl`` (the staleness of every group trained), ``events.jsonl`` (the engines' moves, the stream's
groups) and the job checkpoints.
"""

from __future__ import annotations

import asyncio
import functools
import io
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import GROUP_BUFFERED, GROUP_DROPPED, GROUP_TAKEN, TRANSITION, read_jsonl
from lifecycle.observe.monitor import EventMonitor

pytest.importorskip("ray")
pytest.importorskip("torch")

from engines.launcher import launcher_factory
from engines.process import torch_engine_command
from rollout.stream import Stream
from trainer.app.loop import RunOptions, RunResult, run_loop
from trainer.job_state import load_job_checkpoint

STREAM = {"rollout_num_gpus": 2, "fully_async": True}
PACE = 0.005  # seconds per decode step of a paced engine (the CPU engine's --step-delay-s)


def _config(**extra: Any) -> LifecycleConfig:
    return LifecycleConfig.from_mapping({**STREAM, **extra}, check_paths=False)


def _run(config: LifecycleConfig, run_dir: Path, steps: int, **kwargs: Any) -> RunResult:
    opts = RunOptions(steps=steps, seed=0, run_dir=run_dir, launcher="local", router=False, **kwargs)
    return asyncio.run(run_loop(config, opts, io.StringIO()))


def _paced(config: LifecycleConfig, run_dir: Path, steps: int) -> RunResult:
    """A run whose engines wait ``PACE`` s after each decode step: unpaced, a fast engine beside a slow trainer
    (CI, late in a long session) filled the queue, stopped dispatching and sat idle through every update; paced,
    generation stays busy through the updates (85 of 97 groups spanned two versions on a loaded machine)."""
    command = functools.partial(torch_engine_command, seed=0, step_delay_s=PACE)
    launcher = launcher_factory("local", command)
    opts = RunOptions(steps=steps, seed=0, run_dir=run_dir, launcher="local", router=False, engine_launcher=launcher)
    return asyncio.run(run_loop(config, opts, io.StringIO()))


def _rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _clean(run_dir: Path, config: LifecycleConfig) -> None:
    """``lifecycle trace check``'s judgement of the whole log."""
    violations = EventMonitor(config).feed_all(read_jsonl(run_dir / "events.jsonl"))
    assert not violations, [v.describe() for v in violations]


@pytest.mark.usefixtures("ray_cluster")
@pytest.mark.parametrize("bound", [1, 4])
def test_a_stream_learns_within_its_bound_while_updates_land_mid_request(tmp_path: Path, bound: int) -> None:
    config = _config(max_weight_staleness=bound)
    steps = 12
    result = _paced(config, tmp_path / "run", steps)
    assert result.last5 >= 2 * result.first5, result.rewards  # it learns
    rows = _rows(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(steps))
    lags = [lag for r in rows for lag in r["staleness"]]
    assert lags and all(0 <= lag <= bound for lag in lags), lags
    assert [r["version"] for r in rows] == list(range(steps))  # judged against the version committed then
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    moves = Counter((e["machine"], e["trigger"]) for e in events if e["event"] == TRANSITION)
    # every update paused the Serving engines keeping their requests, and resumed them: no drain per step
    assert moves[("engine", "pause")] == moves[("engine", "resume")] - 2 * moves[("rollout", "stream")]
    assert moves[("engine", "pause")] >= 2 * steps and moves[("rollout", "update_done")] == steps
    assert moves[("rollout", "stream")] == 1 and moves[("engine", "drain")] == 2
    # requests were in flight across updates: a group whose samples span two versions
    buffered = [e for e in events if e["event"] == GROUP_BUFFERED]
    spans = sum(len(e["versions"]) > 1 for e in buffered)
    print(f"{spans} of {len(buffered)} groups span two versions or more")
    assert spans, f"no group of {len(buffered)} was in flight across an update"
    taken = [e for e in events if e["event"] == GROUP_TAKEN]
    assert sum(len(r["staleness"]) for r in rows) == len(taken)
    assert sum(r["samples"] for r in rows) == len(taken) * 8  # the default task's group size
    _clean(tmp_path / "run", config)
    assert len(result.rewards) == steps


@pytest.mark.usefixtures("ray_cluster")
def test_a_dropped_group_is_never_trained_and_its_prompt_comes_back(tmp_path: Path) -> None:
    """K = 0: only groups generated entirely under the committed weights are trained; everything else is dropped,
    logged with its versions, and its prompt generated again."""
    config = _config(max_weight_staleness=0)
    _run(config, tmp_path / "run", 4)
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    dropped = [e for e in events if e["event"] == GROUP_DROPPED]
    taken = [e for e in events if e["event"] == GROUP_TAKEN]
    assert dropped, "with K = 0 a stream that updates mid-request must drop something"
    assert all(int(e["version"]) - int(e["oldest"]) > 0 for e in dropped)
    assert all(int(e["version"]) == int(e["oldest"]) for e in taken)
    again = {e["group"] for e in events if e["event"] == GROUP_BUFFERED and events.index(e) > events.index(dropped[0])}
    assert dropped[0]["group"] in again
    assert all(lag == 0 for r in _rows(tmp_path / "run") for lag in r["staleness"])
    _clean(tmp_path / "run", config)


@pytest.mark.usefixtures("ray_cluster")
def test_a_stream_saves_and_resumes_its_version_and_queue(tmp_path: Path) -> None:
    """A job checkpoint records the stream (its queue of completed groups and the prompts to send again); the
    resumed job continues its weight versions (never from 0: miles #2244) and judges the restored groups by the
    versions they were generated under (AReaL #1388)."""
    run = tmp_path / "run"
    config = _config(save=str(tmp_path / "ckpt"), save_interval=2)
    _run(config, run, 4)
    job = RunOptions(steps=4, seed=0, run_dir=run, launcher="local", router=False).job_settings()
    checkpoint = load_job_checkpoint(str(tmp_path / "ckpt"), config, job)
    assert checkpoint.step == 4 and checkpoint.weight_version == "4"
    stream = checkpoint.stream
    assert stream is not None and stream["cursor"] > 0
    saved = {f"{g['rollout_id']}/{g['index']}": g["oldest"] for g in stream["groups"]}
    resumed = _config(save=str(tmp_path / "ckpt"), save_interval=2, load=str(tmp_path / "ckpt"))
    _run(resumed, run, 7)
    rows = _rows(run)
    assert [r["step"] for r in rows] == list(range(7))
    assert [r["version"] for r in rows[4:]] == [4, 5, 6]  # the resumed job's versions continue from 4
    events = read_jsonl(run / "events.jsonl")
    after = events[next(i for i, e in enumerate(events) if e["event"] == "job.resumed") :]
    judged: dict[str, int] = {}  # the first judgement of each group (a dropped one comes back, newer)
    for e in after:
        if e["event"] in (GROUP_TAKEN, GROUP_DROPPED):
            judged.setdefault(e["group"], int(e["oldest"]))
    for key, oldest in saved.items():  # a restored group keeps the version it was generated under
        if key in judged:
            assert judged[key] == oldest
    assert any(key in judged for key in saved), (saved, judged)
    assert all(0 <= lag <= 1 for r in rows for lag in r["staleness"])
    _clean(run, resumed)


def test_the_stream_record_is_checked_when_read() -> None:
    """What a checkpoint holds of the stream is checked by the rules that wrote it: a group newer than the
    checkpoint's version (the symptom of a version that went backwards) is refused, as are malformed shapes."""
    from rollout.stream import stream_problem

    good = {"cursor": 2, "prompts": [[1, 0, "abc", 0]], "groups": []}
    assert stream_problem(good, "3") == ""
    sample = {
        "index": 0,
        "group": 0,
        "prompt": "p",
        "prompt_ids": [1],
        "output_ids": [2],
        "response": "r",
        "reward": 0.5,
    }
    group = {"rollout_id": 1, "index": 0, "text": "p", "tries": 0, "samples": [sample], "oldest": 2, "versions": [2, 3]}
    assert stream_problem({**good, "groups": [group]}, "3") == ""
    assert "newer than the checkpoint's 3" in stream_problem({**good, "groups": [{**group, "oldest": 4}]}, "3")
    assert "cursor" in stream_problem({**good, "cursor": -1}, "3")
    assert "prompt 0" in stream_problem({**good, "prompts": [[1, 0]]}, "3")
    assert "group 0" in stream_problem({**good, "groups": [{**group, "samples": []}]}, "3")
    assert "not an integer" in stream_problem(good, "v3")
    assert Stream is not None
