"""The InferenceController against real CPU engine processes (HTTP on 127.0.0.1).

catch_up, the bounded snapshot wait, the engine lock on every exit of a weight update, when
monitors run, and the construction gate (nothing built unless its predicate allows it). Every
check reads the machines' states and the event log the run wrote, and, where it matters, what
the engines themselves report (``/model_info``, ``/server_info``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle.config import LifecycleConfig
from lifecycle.events import TRANSITION, EventLog, MemorySink

pytest.importorskip("torch")

from engines.launcher import launcher_factory
from models import TinyCausalLM
from rollout.controller import ControllerError, InferenceController
from rollout.executor import RolloutManager
from rollout.task import PatternTask

ROLLOUT_FT = {
    "use_fault_tolerance": True,
    "ft_components": ["rollout"],
    "rollout_num_gpus": 1,
    "offload_rollout": True,
    "rollout_health_check_interval": 5.0,
    "rollout_health_check_timeout": 5.0,
    "engine_restart_backoff": 0.05,
    "engine_max_restarts": 20,  # the module's tests restart engine-0 several times
}
TASK = PatternTask(prompts_per_step=2, group_size=2, response_len=4)


class Spy:
    """An event-log sink that also records what the controller held when each move fired."""

    def __init__(self) -> None:
        self.events = MemorySink()
        self.controller: InferenceController | None = None
        self.at: list[tuple[str, str, str, bool, str]] = []  # (instance, trigger, dst, lock held, monitor state)

    def __call__(self, event: dict[str, Any]) -> None:
        self.events(event)
        if event.get("event") != TRANSITION or self.controller is None:
            return
        c = self.controller
        monitor = c.monitor.state if c.monitor is not None else "Init"
        self.at.append((event["instance"], event["trigger"], event["dst"], c.lock.locked(), monitor))

    def moves(self, instance: str | None = None) -> list[tuple[str, str]]:
        return [
            (e["instance"], e["trigger"])
            for e in self.events
            if e.get("event") == TRANSITION and (instance is None or e["instance"] == instance)
        ]


class Rig:
    """One RolloutManager on real engine processes and its own event loop, shared by a module's tests."""

    def __init__(self, flags: dict[str, Any], tmp: Path) -> None:
        self.config = LifecycleConfig.from_mapping(flags)
        self.loop = asyncio.new_event_loop()
        self.spy = Spy()
        self.manager = RolloutManager(
            self.config, TASK, launcher_factory=launcher_factory("local"), log=EventLog([self.spy])
        )
        self.spy.controller = self.manager.controller
        self.tmp = tmp
        self.versions = 0

    @property
    def c(self) -> InferenceController:
        return self.manager.controller

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def weights(self, version: int | None = None) -> tuple[str, str]:
        """A real weights file (a differently seeded model) and its version."""
        if version is None:
            self.versions += 1
            version = self.versions
        path = self.tmp / f"w{version}.safetensors"
        if not path.exists():
            TinyCausalLM("tiny", seed=100 + version).save_weights(path)
        return str(path), str(version)

    async def served_version(self, index: int) -> str | None:
        client = self.c.engines[index].client
        assert client is not None
        return (await client.model_info()).weight_version

    def close(self) -> None:
        self.run(self.manager.dispose())
        self.loop.close()


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    r = Rig(ROLLOUT_FT, tmp_path_factory.mktemp("controller"))
    r.run(r.manager.init(r.weights(0)))
    yield r
    r.close()


def _kill_and_restart(rig: Rig) -> None:
    """SIGKILL engine-0 and let rollout FT restart it: it comes back in PendingWeights, without weights."""
    rig.run(rig.c.kill_engine(0))
    assert rig.c.engines[0].state == "Unhealthy"
    assert rig.run(rig.c.recover_unhealthy()) == ["engine-0"]
    assert rig.c.engines[0].state == "PendingWeights"


@pytest.mark.monitor
def test_monitor_paused_at_creation_resumed_only_at_generate(rig: Rig) -> None:
    c = rig.c
    assert c.monitor is not None and c.monitor.state == "Paused"
    seen: list[str] = []
    inner = rig.manager.executor.rollout_fn
    assert inner is not None

    async def spied(rollout_id: int, controller: InferenceController) -> list[dict[str, Any]]:
        assert controller.monitor is not None
        seen.append(controller.monitor.state)
        return await inner(rollout_id, controller)

    rig.manager.executor.rollout_fn = spied
    try:
        samples = rig.run(rig.manager.generate(0))
    finally:
        rig.manager.executor.rollout_fn = inner
    assert len(samples) == 4 and seen == ["Running"]
    assert c.monitor.state == "Paused"
    rig.run(rig.manager.offload())
    assert rig.manager.state == "Offloaded" and c.monitor.state == "Paused"
    rig.run(rig.manager.onload_weights())
    path, version = rig.weights()
    assert rig.run(c.update_weights(path, version)) == ["engine-0"]
    rig.run(rig.manager.onload_kv())
    assert rig.manager.state == "Ready" and c.engines[0].state == "Quiesced"
    # every monitor resume comes right after the rollout manager's generate (or eval) move, never elsewhere
    moves = rig.spy.moves()
    resumes = [i for i, m in enumerate(moves) if m == ("monitor-rollout", "resume")]
    assert resumes and all(moves[i - 1] in (("rollout", "generate"), ("rollout", "eval")) for i in resumes), moves
    # the weight update ran with the monitor paused and the lock held
    update = [a for a in rig.spy.at if a[0] == "engine-0" and a[1] == "begin_update"][-1]
    assert update[3] is True and update[4] == "Paused"
    assert rig.run(rig.served_version(0)) == version


@pytest.mark.weight_update
@pytest.mark.routing
def test_catch_up_loads_committed_weights_under_the_lock_before_serving(rig: Rig) -> None:
    c = rig.c
    committed = c.weights
    assert committed is not None
    _kill_and_restart(rig)
    engine = c.engines[0]
    assert not engine.routable and c.routable() == []
    assert rig.run(rig.served_version(0)) != committed[1]  # a fresh process: the seed's weights
    mark = len(rig.spy.at)
    assert rig.run(c.catch_up()) == ["engine-0"]
    window = rig.spy.at[mark:]
    loads = [a for a in window if a[0] == "engine-0" and a[1] == "begin_update"]
    assert loads and all(held for _, _, _, held, _ in loads)  # under the engine lock
    assert [a[2] for a in window if a[0] == "rollout"] == ["CatchingUp", "Ready"]
    assert engine.state == "Quiesced" and not c.lock.locked()
    assert rig.run(rig.served_version(0)) == committed[1]
    # never routable before: between the restart and the catch-up no move of engine-0 entered Serving
    restart = max(i for i, a in enumerate(rig.spy.at) if a[0] == "engine-0" and a[1] == "restart")
    assert all(a[2] != "Serving" for a in rig.spy.at[restart:] if a[0] == "engine-0")


@pytest.mark.recovery
@pytest.mark.weight_update
@pytest.mark.routing
def test_without_catch_up_a_restarted_engine_is_never_routed(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other half (and the check can fail): skip catch_up and the engine stays out of routing."""
    c = rig.c

    async def no_catch_up(self: InferenceController) -> list[str]:
        return []

    _kill_and_restart(rig)
    monkeypatch.setattr(InferenceController, "catch_up", no_catch_up)
    with pytest.raises(ControllerError, match="no routable engine"):
        rig.run(rig.manager.generate(1))  # the only engine waits for weights: nothing may serve
    assert c.engines[0].state == "PendingWeights"
    assert rig.manager.state == "Ready"
    monkeypatch.undo()
    samples = rig.run(rig.manager.generate(1))  # catch_up runs first, then the engine serves
    assert c.weights is not None and {s["weight_version"] for s in samples} == {c.weights[1]}


@pytest.mark.weight_update
def test_snapshot_wait_is_bounded_and_releases_everything(rig: Rig) -> None:
    c = rig.c
    rig.run(c.kill_engine(0))  # Unhealthy: not updatable, not gone -> the snapshot rule waits
    c.snapshot_timeout = 0.5
    path, version = rig.weights()
    try:
        with pytest.raises(ControllerError, match=r"not updatable after 0.5s.*engine-0.*Unhealthy"):
            rig.run(c.update_weights(path, version))
    finally:
        c.snapshot_timeout = 60.0
    assert not c.lock.locked() and rig.manager.state == "Ready"  # nothing taken, a legal state
    assert rig.run(c.recover_unhealthy()) == ["engine-0"]
    assert rig.run(c.update_weights(path, version)) == ["engine-0"]  # PendingWeights joins the snapshot
    assert rig.run(rig.served_version(0)) == version


@pytest.mark.weight_update
def test_lock_released_when_an_engine_update_fails(rig: Rig) -> None:
    c = rig.c
    missing = str(rig.tmp / "no-such-weights.safetensors")
    assert rig.run(c.update_weights(missing, "bad")) == []
    assert not c.lock.locked() and rig.manager.state == "Ready"
    assert c.engines[0].state == "Unhealthy" and "no-such-weights" in c.engines[0].reason
    rig.run(c.recover_unhealthy())
    path, version = rig.weights()
    assert rig.run(c.update_weights(path, version)) == ["engine-0"]
    assert c.engines[0].state == "Quiesced"


@pytest.mark.weight_update
def test_lock_released_when_the_update_is_cancelled(rig: Rig) -> None:
    """A cancellation in the middle of the engine's load: update_failed, engines aborted, lock free."""
    c = rig.c
    path, version = rig.weights()

    async def cancel_mid_update() -> None:
        task = asyncio.ensure_future(c.update_weights(path, version))
        while c.engines[0].state != "UpdatingWeights":
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    mark = len(rig.spy.at)
    rig.run(cancel_mid_update())
    assert not c.lock.locked() and rig.manager.state == "Ready"
    assert [a[1] for a in rig.spy.at[mark:] if a[0] == "rollout"] == ["begin_update", "update_failed"]
    assert c.engines[0].state == "Quiesced"
    assert rig.run(c.update_weights(path, version)) == ["engine-0"]  # the next update goes through


# -- the construction gate -----------------------------------------------------------------------------------
@pytest.mark.construction_gate
def test_replay_constructs_nothing_and_starts_nothing(tmp_path: Path) -> None:
    config = LifecycleConfig.from_mapping({"load_debug_rollout_data": str(tmp_path / "{rollout_id}.json")})
    spy = Spy()
    manager = RolloutManager(config, TASK, launcher_factory=None, log=EventLog([spy]))

    async def go() -> None:
        await manager.init(("unused", "0"))
        await manager.offload()

    asyncio.run(go())
    assert manager.state == "Replay"
    assert manager.controller.engines == [] and manager.controller.monitor is None
    assert manager.executor.rollout_fn is None and manager.executor.constructed == []
    effects = {e for ev in spy.events for e in ev.get("effects") or ()}
    assert not effects & {"construct_rollout_fn", "construct_eval_fn", "start_servers", "start_monitor"}
    assert spy.moves() == [("rollout", "init")]


@pytest.mark.parametrize(
    "flags", [{}, {"use_fault_tolerance": True, "ft_components": ["train"]}], ids=["no-ft", "train-ft"]
)
@pytest.mark.monitor
@pytest.mark.lifecycle_gate
def test_no_rollout_ft_starts_no_monitor(flags: dict[str, Any], tmp_path: Path) -> None:
    rig = Rig({"rollout_num_gpus": 1, **flags}, tmp_path)
    try:
        rig.run(rig.manager.init(rig.weights(0)))
        rig.run(rig.manager.generate(0))
        assert rig.c.monitor is None
        assert not [m for m in rig.spy.moves() if m[0].startswith("monitor")]
        assert rig.c.engines[0].state == "Quiesced" and rig.manager.executor.constructed == ["rollout_fn", "eval_fn"]
    finally:
        rig.close()


@pytest.mark.weight_update
def test_stop_engine_confirms_death_and_start_engine_serves_only_after_catch_up(rig: Rig) -> None:
    """An operator's stop/start of one engine: Stopped only once dead, never recovered; back via catch_up."""
    c = rig.c
    engine = c.engines[0]
    rig.run(rig.manager.generate(5))  # Serving -> Quiesced at generate_done, weights committed
    committed = c.weights
    assert committed is not None
    rig.run(c.stop_engine("engine-0"))
    assert engine.state == "Stopped" and not engine.launcher.alive()  # the process is really gone
    assert c.monitor is not None and "engine-0" not in c.monitor._engines
    rig.run(asyncio.sleep(0.3))
    assert engine.state == "Stopped"  # the death we caused is not a fault: no Unhealthy, no recovery
    with pytest.raises(ControllerError, match="no routable engine"):
        rig.run(rig.manager.executor.generate(6))  # bypasses catch_up: nothing may serve
    rig.run(c.start_engine("engine-0"))
    assert engine.state == "PendingWeights" and not engine.routable
    samples = rig.run(rig.manager.generate(6))  # catch_up hands it the committed weights first
    assert {s["weight_version"] for s in samples} == {committed[1]}
    assert rig.run(rig.served_version(0)) == committed[1]
    moves = [t for i, t in rig.spy.moves("engine-0")]
    last_stop = len(moves) - 1 - moves[::-1].index("stop")
    assert "recover" not in moves[last_stop:] and "confirm_dead" in moves[last_stop:]
