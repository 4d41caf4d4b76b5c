"""Ray's draining nodes as preemption notices, on a real local two-node cluster (``ray_nodes_scenario.py``, in a
process of its own): draining the worker node (``GcsClient.drain_node``, reason preemption, a 20 s deadline) gives
one ``engine.preempt_notice`` per engine on it -- by ``ray``, with the node's deadline, never twice -- and each
engine's drain bound is then cut to that deadline less the margin. An engine launched into a new slot lands on a
live node with capacity: on the head while the worker node drains (a draining node is offered no engine: Ray never
schedules an actor asked onto it) and after it is removed (Decision 7: ``--ray-nodes 2`` survives a node loss).
The watcher's bookkeeping without Ray is checked here directly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lifecycle.decide.events import PREEMPT_NOTICE, EventLog, MemorySink
from rollout.preempt import NO_DEADLINE_S, DrainingNodes

ROOT = Path(__file__).resolve().parents[2]


class OnNode:
    """A launcher on a named node (``engines.launcher.Placed``)."""

    def __init__(self, node: str | None) -> None:
        self.node, self.asked = node, 0

    async def node_id(self) -> str | None:
        self.asked += 1
        return self.node


def test_each_engine_process_on_a_draining_node_is_noticed_once_and_a_new_process_again() -> None:
    engines: list[Any] = [SimpleNamespace(id=f"engine-{i}", epoch=1, launcher=OnNode(n)) for i, n in enumerate("aab")]
    draining: dict[str, float | None] = {}
    sink = MemorySink()
    news: list[tuple[str, int, int | None, float]] = []

    async def on_notice(group: str, index: int, epoch: int | None, deadline_s: float) -> None:
        news.append((group, index, epoch, deadline_s))

    watcher = DrainingNodes(engines, EventLog([sink]), on_notice, read=lambda: dict(draining))

    async def main() -> list[list[tuple[str, int | None, float]]]:
        polls = [await watcher.poll()]  # nothing drains: no lookup at all
        assert engines[0].launcher.asked == 0
        draining["a"] = 12.5
        polls.append(await watcher.poll())
        polls.append(await watcher.poll())  # the same processes: no second notice
        engines[0].epoch = 2  # engine-0 was replaced by a new process (still on node a)
        draining["b"] = None  # a drain without a deadline
        polls.append(await watcher.poll())
        return polls

    polls = asyncio.run(main())
    assert polls[0] == [] and engines[0].launcher.asked == 2  # once per process of the slot
    assert polls[1] == [("engine-0", 1, 12.5), ("engine-1", 1, 12.5)] and polls[2] == []
    assert polls[3] == [("engine-0", 2, 12.5), ("engine-2", 1, NO_DEADLINE_S)]
    assert news[:2] == [("rollout", 0, 1, 12.5), ("rollout", 1, 1, 12.5)]
    assert [e["by"] for e in sink if e["event"] == PREEMPT_NOTICE] == ["ray"] * 4


class Starting(OnNode):
    """A launcher whose actor cannot tell its node yet (its process is starting: the actor's ``info`` raised)."""

    async def node_id(self) -> str | None:
        self.asked += 1
        if self.asked == 1:
            raise RuntimeError("engine engine-2: process not started (call start() or spawn())")
        return self.node


def test_a_lookup_that_fails_is_asked_again_and_the_watcher_lives_on() -> None:
    """A joiner whose process is still starting when a node drains: its lookup fails, the others are noticed, the
    watcher goes on, and the next poll notices it -- a failed lookup once ended the watcher (no later notice), and its
    stop() re-raised at the job's close, which then left the router running (the driver never exited)."""
    engines: list[Any] = [SimpleNamespace(id="engine-0", epoch=1, launcher=OnNode("a"))]
    engines.append(SimpleNamespace(id="engine-2", epoch=1, launcher=Starting("a")))
    watcher = DrainingNodes(engines, EventLog([MemorySink()]), read=lambda: {"a": 9.0}, interval=0.01)

    async def main() -> list[list[tuple[str, int | None, float]]]:
        polls = [await watcher.poll(), await watcher.poll()]
        watcher.start()
        await asyncio.sleep(0.05)
        await watcher.stop()
        return polls

    assert asyncio.run(main()) == [[("engine-0", 1, 9.0)], [("engine-2", 1, 9.0)]]


@pytest.mark.slow
def test_draining_the_worker_node_notices_its_engines_and_joins_land_on_the_head() -> None:
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-m", "tests.rollout.ray_nodes_scenario"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    out = json.loads(lines[-1].removeprefix("RESULT "))
    worker = out["engine_nodes"][0]
    assert out["engine_nodes"] == [worker, worker] and worker != out["head"]  # engines on the worker node
    assert 15.0 < out["draining"][worker] <= 20.0  # Ray reports the node draining, with its deadline
    assert out["noticed_after_s"] < 5.0
    assert sorted(n[:3] for n in out["news"]) == [["rollout", 0, 1], ["rollout", 1, 1]]  # once each
    assert all(15.0 < n[3] <= 20.0 for n in out["news"])
    assert sorted(e["instance"] for e in out["events"]) == ["engine-0", "engine-1"]
    assert {e["by"] for e in out["events"]} == {"ray"}
    assert all(10.0 < b < 17.0 for b in out["bounds"])  # the drain ends before the deadline, less the margin
    assert out["placement_while_draining"] is False  # no engine node is offered while the only one drains
    assert out["join_while_draining"] == out["head"]
    assert out["join_after_removal"] == out["head"]
