"""Tearing down the weight-update group on both sides, witnessed in seconds: ``destroy_weight_group`` makes
trainer worker 0 (rank 0) *and* every engine that joined leave, whoever of them can no longer answer -- an
engine left in the group refuses the next ``/init_weights_update_group`` ("exists; destroy it first"), and a
rank 0 left in it keeps its rendezvous port. The shell runs here on stand-ins for worker 0 and the engines;
the group itself (gloo, real engines) is in ``tests/engines/cpu/test_distributed.py``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import Command
from lifecycle.decide.events import EventLog
from lifecycle.decide.runner import Runner

pytest.importorskip("ray")  # trainer.workers imports it; no cluster is started here
pytest.importorskip("torch")

from trainer.app.broadcast import WeightBroadcast

FLAGS = {"rollout_num_gpus": 2, "update_weight_transfer_mode": "broadcast", "update_weight_timeout": 30.0}


class Member:
    """An engine slot's group calls (``Engine.join_group`` / ``leave_group``); a dead one cannot answer."""

    def __init__(self, i: int, *, dead: bool = False) -> None:
        self.id, self.dead = f"engine-{i}", dead
        self.calls: list[str] = []

    async def join_group(
        self, address: str, port: int, rank: int, world_size: int, timeout: float, group: str = ""
    ) -> None:
        self.calls.append(f"join {rank}/{world_size} {group}")

    async def leave_group(self, timeout: float, group: str = "") -> None:
        self.calls.append(f"leave {group}")
        if self.dead:
            raise ConnectionError(f"{self.id}: connection refused")


class Sender:
    """Trainer worker 0's handle: the calls it was given."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def call(self, method: str, *args: Any, timeout: float | None = None) -> Any:
        self.calls.append(method)
        return [("w", "float32", [2])] if method == "weight_metas" else None


def _shell(engines: list[Member]) -> tuple[Runner, Sender]:
    runner = Runner(LifecycleConfig.from_mapping(FLAGS, check_paths=False), log=EventLog([]))
    sender = Sender()
    controller = SimpleNamespace(engines=engines)
    WeightBroadcast(runner, controller, SimpleNamespace(workers=[sender]))  # type: ignore[arg-type]
    # the core marked every engine as joining (what its connect phase does before init_weight_group)
    runner.state = runner.state._replace(engines=tuple(e._replace(joined=True) for e in runner.state.engines))
    return runner, sender


def _do(runner: Runner, effect: str) -> str:
    outcome = asyncio.run(runner.handlers[f"weight_sync.{effect}"](Command(effect, "weight_sync", "weight_sync")))
    assert outcome is not None
    return outcome.name


def test_destroying_the_group_makes_rank_0_and_every_engine_that_joined_leave() -> None:
    engines = [Member(0), Member(1)]
    runner, sender = _shell(engines)
    assert _do(runner, "init_weight_group") == "done"
    g1 = "weight_update_group.g1"  # the first generation's rendezvous
    assert [e.calls for e in engines] == [[f"join 1/3 {g1}"], [f"join 2/3 {g1}"]]
    assert "join_weight_group" in sender.calls
    assert _do(runner, "destroy_weight_group") == "done"
    assert [e.calls[-1] for e in engines] == [f"leave {g1}", f"leave {g1}"]
    assert sender.calls[-1] == "leave_weight_group"


def test_a_member_that_died_does_not_keep_the_others_in_the_group() -> None:
    engines = [Member(0, dead=True), Member(1)]
    runner, sender = _shell(engines)
    _do(runner, "init_weight_group")
    assert _do(runner, "destroy_weight_group") == "done"  # best effort: the dead one has left by dying
    assert engines[1].calls[-1].startswith("leave") and sender.calls[-1] == "leave_weight_group"


def test_when_rank_0_leaves_a_member_blocked_in_the_collective_fails_now_not_at_its_deadline() -> None:
    """What rank 0's leave is for (``broadcast_bucket`` leaves at once when a bucket failed): a member still
    waiting in the collective fails on the closed connection, instead of waiting out its own deadline."""
    import threading

    import torch

    from engines.models.weight_group import WeightGroup, WeightGroupError
    from tests.helpers import free_port

    port, members = free_port(), {}

    def join(rank: int) -> None:
        members[rank] = WeightGroup("127.0.0.1", port, rank, 2, timeout=20.0, name="weight_update_group")

    joining = [threading.Thread(target=join, args=(rank,)) for rank in (0, 1)]
    for t in joining:
        t.start()
    for t in joining:
        t.join()
    failed: list[str] = []

    def receive() -> None:
        try:
            members[1].broadcast([torch.zeros(4)])  # waits for rank 0's tensor, which never comes
        except WeightGroupError as exc:
            failed.append(str(exc))

    receiver = threading.Thread(target=receive)
    receiver.start()
    members[0].close()  # before or after the member entered the collective: either way it is told
    receiver.join()
    members[1].close()
    # gloo says "Connection closed by peer" or "... reset by peer"; its own deadline is "Operation timed out"
    assert len(failed) == 1 and "by peer" in failed[0] and "timed out" not in failed[0].lower(), failed
