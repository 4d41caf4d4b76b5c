"""The weight-update group by generation, through the shell (:class:`trainer.app.broadcast.WeightBroadcast`) with
real CPU engines as members and a real gloo rank 0 in place of trainer worker 0 (the worker's three group calls,
run in this process): each connect forms ``weight_update_group.g{N}`` with a fresh rendezvous and logs
``weight_sync.connected``; an engine refuses a bucket stamped with another generation, naming both; a member killed
between two buckets fails the update within ``--update-weight-timeout`` (never a hang), and the destroy that
follows says why (``weight_sync.destroyed``)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray")  # trainer.workers imports it; no cluster is started here
pytest.importorskip("torch")

from engines.api import group_name
from engines.engine import Engine
from engines.launcher import ExternalLauncher
from engines.models import TinyCausalLM
from engines.models.weight_group import WeightGroup, WeightGroupError
from engines.process import ServerProcess, torch_engine_command
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import BROADCAST, PENDING_WEIGHTS, ROLLOUT, Command, Move
from lifecycle.decide.events import SYNC_CONNECTED, SYNC_DESTROYED, EventLog, MemorySink
from lifecycle.decide.runner import Runner
from trainer.app.broadcast import MARGIN, WeightBroadcast

TIMEOUT = 8.0  # --update-weight-timeout: the bound a departed member's failure must come within
FLAGS = {
    "rollout_num_gpus": 2,
    "update_weight_transfer_mode": "broadcast",
    "update_weight_timeout": TIMEOUT,
    "update_weight_buffer_size": 64 * 1024,  # several buckets: a member can die between two
}


class RankZero:
    """Trainer worker 0's group calls (``trainer.workers``), run here on a real gloo group."""

    def __init__(self) -> None:
        source = TinyCausalLM("tiny", seed=99)
        self.state = {n: p.detach().contiguous() for n, p in source.named_parameters()}
        self.group: WeightGroup | None = None

    async def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        return await asyncio.wait_for(asyncio.to_thread(getattr(self, method), *args), timeout)

    def weight_metas(self) -> list[tuple[str, str, list[int]]]:
        from engines.models.weight_group import dtype_name

        return [(n, dtype_name(t.dtype), list(t.shape)) for n, t in self.state.items()]

    def join_weight_group(self, address: str, port: int, world: int, name: str, timeout: float) -> None:
        self.leave_weight_group()
        self.group = WeightGroup(address, port, 0, world, timeout=timeout, name=name)

    def broadcast_bucket(self, names: list[str]) -> str:
        if self.group is None:
            return "no weight-update group"
        try:
            self.group.broadcast([self.state[n] for n in names])
        except WeightGroupError as exc:
            self.leave_weight_group()
            return str(exc)
        return ""

    def leave_weight_group(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()


class Shell:
    def __init__(self, procs: list[ServerProcess]) -> None:
        self.loop = asyncio.new_event_loop()
        self.events = MemorySink()
        self.runner = Runner(LifecycleConfig.from_mapping(FLAGS, check_paths=False), log=EventLog([self.events]))
        self.engines = [Engine(f"engine-{k}", ExternalLauncher(f"engine-{k}", p.url)) for k, p in enumerate(procs)]
        for e in self.engines:
            assert self.run(e.launch()).name == "ready", e.reason
        self.rank0 = RankZero()
        controller = SimpleNamespace(
            engines=self.engines,
            slot=lambda cmd: self.engines[cmd.engine],
            transferring=lambda engine, flag: None,
        )
        self.shell = WeightBroadcast(self.runner, controller, SimpleNamespace(workers=[self.rank0]))  # type: ignore[arg-type]
        self.runner.state = self.runner.state._replace(
            engines=tuple(e._replace(joined=True) for e in self.runner.state.engines)
        )
        self.runner.pending = ("unused", "v1")  # the trainer's new weights: this update's version

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def do(self, effect: str) -> Any:
        return self.run(self.runner.handlers[f"weight_sync.{effect}"](Command(effect, "weight_sync", "weight_sync")))

    def move(self, trigger: Any) -> None:
        """The weight_sync machine's move that asks for the next command (what the runner's watchers see)."""
        self.shell._on_move(Move("weight_sync", "weight_sync", trigger, "Stale", "Disconnected", ()))

    async def update(self, kill: ServerProcess | None = None) -> tuple[Any, list[Any]]:
        """Rank 0 broadcasts while every member receives (the core hands out both at once); ``kill`` is SIGKILLed
        once the first bucket went through."""
        receive = self.runner.handlers[f"engine.transfer_weights.{BROADCAST}"]
        cmds = [
            Command("transfer_weights", "engine", e.id, ROLLOUT, k, weights=PENDING_WEIGHTS, via=BROADCAST)
            for k, e in enumerate(self.engines)
        ]
        receivers = [asyncio.ensure_future(receive(c)) for c in cmds]
        broadcast = self.runner.handlers["weight_sync.broadcast_weights"]
        sender = asyncio.ensure_future(broadcast(Command("broadcast_weights", "weight_sync", "weight_sync")))
        if kill is not None:
            while not any(e["event"] == "weight_sync.bucket" for e in self.events):
                await asyncio.sleep(0.005)
            os.kill(kill.pid, signal.SIGKILL)
        out = await sender
        return out, list(await asyncio.gather(*receivers))

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in e.items() if k not in ("event", "ts")} for e in self.events if e["event"] == kind]


@pytest.fixture
def procs() -> Iterator[list[ServerProcess]]:
    ps = [
        ServerProcess(torch_engine_command(seed=k, weight_group_timeout_s=TIMEOUT), engine_id=f"m-{k}")
        for k in range(2)
    ]
    for p in ps:
        p.spawn()
    try:
        for p in ps:
            p.wait_ready(90.0)
        yield ps
    finally:
        for p in ps:
            if p.alive:
                p.kill()


def test_each_connect_is_a_new_named_generation_and_a_bucket_of_another_is_refused(procs: list[ServerProcess]) -> None:
    s = Shell(procs)
    assert s.do("init_weight_group").name == "done"
    sent, received = s.run(s.update())
    assert sent.name == "done" and [r.name for r in received] == ["loaded", "loaded"], (sent, received)
    s.move("destroy")  # a membership change made the group stale
    assert s.do("destroy_weight_group").name == "done"
    assert s.do("init_weight_group").name == "done"  # generation 2: a fresh group, never the old one grown
    # an engine in generation 2 is handed a bucket stamped with generation 1
    stale = s.run(s.engines[0].receive(s.run(s.shell.buckets())[:1], "v9", 5.0, group_name(1)))
    assert stale.name == "refused"
    assert "weight_update_group.g1" in stale.reason and "weight_update_group.g2" in stale.reason, stale.reason
    assert "another generation" in stale.reason
    s.move("dispose")
    assert s.do("destroy_weight_group").name == "done"
    members = ["engine-0", "engine-1"]
    assert s.of(SYNC_CONNECTED) == [
        {"generation": 1, "world_size": 3, "members": members},
        {"generation": 2, "world_size": 3, "members": members},
    ]
    assert s.of(SYNC_DESTROYED) == [
        {"generation": 1, "world_size": 3, "why": "membership"},
        {"generation": 2, "world_size": 3, "why": "shutdown"},
    ]
    for e in s.engines:
        s.run(e.close())
    s.loop.close()


def test_a_member_killed_mid_broadcast_fails_the_update_within_the_bound(procs: list[ServerProcess]) -> None:
    s = Shell(procs)
    assert s.do("init_weight_group").name == "done"
    started = time.monotonic()
    sent, received = s.run(asyncio.wait_for(s.update(kill=procs[1]), 4 * (TIMEOUT + MARGIN)))
    took = time.monotonic() - started
    assert sent.name == "failed" and "broadcast failed" in sent.reason, sent
    assert received[0].name != "loaded" and received[1].name != "loaded", received  # nobody took a torn update
    assert took < TIMEOUT + MARGIN, took  # a dead rank ends the collective within the bound, never a hang
    s.move("broadcast_failed")
    assert s.do("destroy_weight_group").name == "done"
    assert s.of(SYNC_DESTROYED) == [{"generation": 1, "world_size": 3, "why": "failed"}]
    for e in s.engines:
        s.run(e.close())
    s.loop.close()
