"""``trainer.app.Job``: a run's assembly is disposed of in order on every way out of ``async with``.

The user's loop body is where most failures happen (their reward, their data): when it raises, the
engines must be gone, then the trainer, the exporter closed and the sinks detached -- and the body's own
exception is what the caller sees.
"""

from __future__ import annotations

import asyncio
import gc
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import TRANSITION, read_jsonl
from rollout.pattern import PatternTask
from tests.helpers import alive
from trainer.app import Job, RunOptions, heap

pytest.importorskip("ray")
pytest.importorskip("torch")


class Boom(Exception):
    """The user's loop body failing (not anything the project raises)."""


def test_the_parts_exist_only_once_the_job_has_started(tmp_path: Path) -> None:
    job = Job(
        LifecycleConfig.from_mapping({"rollout_num_gpus": 1}),
        PatternTask(),
        run_dir=tmp_path,
        options=RunOptions(events=None),
    )
    for part in ("runner", "trainer", "manager"):
        with pytest.raises(RuntimeError, match=f"job.{part} exists once the job has started"):
            getattr(job, part)


def test_a_job_leaves_an_embedders_own_frozen_heap_frozen(tmp_path: Path) -> None:
    """A process that froze its heap before the job (its own collector policy) still has it frozen after the job
    closes: the job's unfreeze would be all or none, so it is none."""
    job = Job(
        LifecycleConfig.from_mapping({"rollout_num_gpus": 1}),
        PatternTask(),
        run_dir=tmp_path,
        options=RunOptions(events=None),
    )
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        assert before > 0
        job._freeze()
        job._unfreeze()
        assert gc.get_freeze_count() >= before, "the job unfroze the embedder's heap"
    finally:
        gc.unfreeze()


def test_a_job_raises_the_young_threshold_while_it_runs_and_puts_it_back(tmp_path: Path) -> None:
    """While a job runs, a fleet operation's in-flight requests are not walked by a young collection every 700
    allocations (benchmark P7); the process's own threshold is back once the job closes."""
    job = Job(
        LifecycleConfig.from_mapping({"rollout_num_gpus": 1}),
        PatternTask(),
        run_dir=tmp_path,
        options=RunOptions(events=None),
    )
    before = gc.get_threshold()
    gc.set_threshold(700, before[1], before[2])
    try:
        job._freeze()
        try:
            assert gc.get_threshold()[0] == heap.YOUNG
        finally:
            job._unfreeze()
        assert gc.get_threshold() == (700, before[1], before[2])
        gc.set_threshold(50_000, before[1], before[2])  # a process's own, higher threshold is its policy
        job._freeze()
        job._unfreeze()
        assert gc.get_threshold()[0] == 50_000
    finally:
        gc.set_threshold(*before)


@pytest.mark.usefixtures("ray_cluster")
def test_a_failing_loop_body_disposes_engines_then_trainer_then_exporter_and_sinks(tmp_path: Path) -> None:
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": 2})
    options = RunOptions(launcher="local", metrics_port=0, steps=1)
    job = Job(config, PatternTask(), run_dir=tmp_path, options=options)
    seen: dict[str, object] = {}

    async def loop() -> None:
        async with job:
            samples = await job.generate(0)
            await job.train(samples)
            await job.update_weights(1)
            pids = [await e.launcher.server_pid() for e in job.manager.controller.engines]
            seen.update(pids=pids, url=job.exporter.url if job.exporter else None, frozen=gc.get_freeze_count())
            assert all(pid is not None and alive(pid) for pid in pids), pids
            raise Boom("the user's reward broke")

    with pytest.raises(Boom, match="the user's reward broke"):
        asyncio.run(loop())

    pids = seen["pids"]
    assert isinstance(pids, list) and len(pids) == 2
    assert not [pid for pid in pids if alive(pid)], "an engine server outlived the job"
    assert set(job.manager.controller.states().values()) == {"Disposed"}
    assert job.runner.state.rollout == "Disposed" and job.runner.state.trainer == "Disposed"
    moves = [
        (e["machine"], e["trigger"])
        for e in read_jsonl(tmp_path / "events.jsonl")
        if e.get("event") == TRANSITION and e.get("trigger") == "dispose"
    ]
    assert ("rollout", "dispose") in moves and ("trainer", "dispose") in moves, moves
    assert moves.index(("rollout", "dispose")) < moves.index(("trainer", "dispose")), "the trainer went first"
    url = seen["url"]
    assert isinstance(url, str)
    with pytest.raises(urllib.error.URLError):  # the exporter is closed: nothing listens there any more
        urllib.request.urlopen(url)
    assert not job.log.enabled, "a sink is still attached to the job's event log"
    # the start-up heap left the collector's reach while the job ran (issue 32, P7), and is collectable again after
    frozen = seen["frozen"]
    assert isinstance(frozen, int) and frozen > 0 and gc.get_freeze_count() == 0
