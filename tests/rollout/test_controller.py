"""The rollout side against real CPU engine processes (HTTP on 127.0.0.1), driven by the job's core.

Catch-up before serving, recovery before a weight update, the engine lock on every exit of an update
(a refused file, a cancelled call), when the monitor runs, the construction gate, an operator's
stop/start. Every check reads what the runner's machines did (the event log) and, where it matters,
what the engines themselves report (``/model_info``). The trainer side is a stand-in that writes real
weights files: these tests are about the rollout side.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import TRANSITION, EventLog, MemorySink
from lifecycle.decide.runner import RunFailed, Runner

pytest.importorskip("torch")

from engines.engine import EngineFailed
from engines.launcher import launcher_factory
from engines.models import TinyCausalLM
from rollout.controller import InferenceController
from rollout.executor import RolloutManager
from rollout.pattern import PatternTask

from .conftest import bind_trainer_stand_in

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
    """An event-log sink that also records what the job held when each move fired."""

    def __init__(self) -> None:
        self.events = MemorySink()
        self.runner: Runner | None = None
        self.at: list[tuple[str, str, str, bool, str]] = []  # (instance, trigger, dst, lock held, monitor state)

    def __call__(self, event: dict[str, Any]) -> None:
        self.events(event)
        if event.get("event") != TRANSITION or self.runner is None:
            return
        s = self.runner.state
        self.at.append((event["instance"], event["trigger"], event["dst"], s.lock, s.monitor))

    def moves(self, instance: str | None = None) -> list[tuple[str, str]]:
        return [
            (e["instance"], e["trigger"])
            for e in self.events
            if e.get("event") == TRANSITION and (instance is None or e["instance"] == instance)
        ]


class Rig:
    """One RolloutManager on real engine processes, a trainer stand-in, and its own event loop."""

    def __init__(self, flags: dict[str, Any], tmp: Path) -> None:
        self.config = LifecycleConfig.from_mapping(flags)
        self.loop = asyncio.new_event_loop()
        self.spy = Spy()
        self.runner = Runner(self.config, log=EventLog([self.spy]))
        self.spy.runner = self.runner
        self.manager = RolloutManager(self.config, TASK, runner=self.runner, launcher_factory=launcher_factory("local"))
        self.tmp = tmp
        self.versions = 0
        self.next: tuple[str, str] | None = None

        bind_trainer_stand_in(self.runner, lambda: self.next or self.weights())
        self.run(self.runner.operate("trainer.start"))

    @property
    def c(self) -> InferenceController:
        return self.manager.controller

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def weights(self, version: int | None = None) -> tuple[str, str]:
        """A real checkpoint directory (a differently seeded model) and its version."""
        if version is None:
            self.versions += 1
            version = self.versions
        path = self.tmp / f"step-{version}"
        if not path.exists():
            TinyCausalLM("tiny", seed=100 + version).save_pretrained(path)
        return str(path), str(version)

    def update(self, weights: tuple[str, str] | None = None) -> tuple[str, str]:
        """The trainer's update_weights: the core recovers (rollout FT), takes the snapshot, loads, commits."""
        self.next = weights or self.weights()
        self.run(self.runner.operate("update_weights"))
        return self.next

    def state(self, i: int = 0) -> str:
        return self.runner.state.engines[i].state

    async def released(self, index: int = 0) -> set[str]:
        """The memory the engine itself says it has released (``/server_info``)."""
        client = self.c.engines[index].client
        assert client is not None
        mem = (await client.server_info()).engine_memory()
        assert mem is not None
        return {tag for tag, on in (("weights", mem.weights_resident), ("kv_cache", mem.kv_cache_resident)) if not on}

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


def _kill(rig: Rig) -> None:
    """SIGKILL engine-0's server: the launcher's watcher reports the death, the core marks it Unhealthy."""
    rig.run(rig.c.kill_engine(0))
    assert rig.state() == "Unhealthy"


@pytest.mark.monitor
@pytest.mark.weight_update
def test_monitor_paused_at_creation_resumed_only_at_generate(rig: Rig) -> None:
    assert rig.runner.state.monitor == "Paused"
    seen: list[str] = []
    running: list[bool] = []
    inner = rig.manager.executor.rollout_fn
    assert inner is not None

    async def spied(rollout_id: int, controller: InferenceController) -> list[Any]:
        seen.append(controller.runner.state.monitor)
        running.append(controller.monitor.running)
        return await inner(rollout_id, controller)

    rig.manager.executor.rollout_fn = spied
    try:
        samples = rig.run(rig.manager.generate(0))
    finally:
        rig.manager.executor.rollout_fn = inner
    assert len(samples) == 4 and seen == ["Running"] and running == [True]
    assert rig.runner.state.monitor == "Paused" and not rig.c.monitor.running  # the real monitor stopped probing
    rig.run(rig.manager.offload())
    assert rig.manager.state == "Offloaded" and rig.runner.state.monitor == "Paused"
    assert rig.run(rig.released()) == {"weights", "kv_cache"}  # what the engine itself reports
    rig.run(rig.manager.onload_weights())
    assert rig.run(rig.released()) == {"kv_cache"}
    _, version = rig.update()
    rig.run(rig.manager.onload_kv())
    assert rig.manager.state == "Ready" and rig.state() == "Quiesced"
    assert rig.run(rig.released()) == set()  # onload restored both tags
    # every monitor resume comes right after the rollout manager's generate (or eval) move, never elsewhere
    moves = rig.spy.moves()
    resumes = [i for i, m in enumerate(moves) if m == ("monitor", "resume")]
    assert resumes and all(moves[i - 1] in (("rollout", "generate"), ("rollout", "eval")) for i in resumes), moves
    # the weight update ran with the monitor paused and the lock held
    update = [a for a in rig.spy.at if a[0] == "engine-0" and a[1] == "begin_update"][-1]
    assert update[3] is True and update[4] == "Paused"
    assert rig.run(rig.served_version(0)) == version == rig.c.committed[1]  # type: ignore[index]


@pytest.mark.weight_update
@pytest.mark.routing
@pytest.mark.recovery
def test_a_dead_engine_is_recovered_and_caught_up_under_the_lock_before_it_serves(rig: Rig) -> None:
    """The restarted engine serves the trainer's latest version (not the initial one, not the one before)."""
    _, latest = rig.update()
    _kill(rig)
    assert rig.c.routable() == []
    mark = len(rig.spy.at)
    rig.run(rig.manager.generate(1))  # recover, catch up, then route
    window = rig.spy.at[mark:]
    loads = [a for a in window if a[0] == "engine-0" and a[1] == "begin_update"]
    assert loads and all(held for _, _, _, held, _ in loads)  # the catch-up ran under the engine lock
    engine_moves = [a[1] for a in window if a[0] == "engine-0"]
    assert engine_moves[:6] == ["recover", "restart", "ready", "begin_update", "finish_update", "resume"]
    assert rig.run(rig.served_version(0)) == latest


@pytest.mark.recovery
@pytest.mark.routing
def test_without_the_catch_up_a_restarted_engine_is_never_routed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The other half, and proof the check can fail: drop the core's catch-up phase, and the engine that
    was restarted (PendingWeights: it holds no committed weights) stays out of routing -- the run stops."""
    from lifecycle.decide.core import PHASES

    rig = Rig(ROLLOUT_FT, tmp_path)
    try:
        rig.run(rig.manager.init(rig.weights(0)))
        _kill(rig)
        monkeypatch.setitem(PHASES, "catch_up", lambda step: None)
        with pytest.raises(RunFailed, match="no routable engine"):
            rig.run(rig.manager.generate(2))
        assert rig.state() == "PendingWeights" and rig.c.routable() == []
    finally:
        rig.close()


@pytest.mark.weight_update
@pytest.mark.recovery
def test_an_update_recovers_a_dead_engine_first_and_it_joins_the_snapshot(rig: Rig) -> None:
    _kill(rig)
    _, version = rig.update()  # the trainer's recover_engine (rollout FT), then one snapshot
    assert rig.state() == "Quiesced" and rig.run(rig.served_version(0)) == version
    moves = [m for _, m in rig.spy.moves("engine-0")]
    tail = moves[len(moves) - 1 - moves[::-1].index("recover") :]
    assert tail[:5] == ["recover", "restart", "ready", "begin_update", "finish_update"]  # the update's own load


@pytest.mark.weight_update
def test_lock_released_when_an_engine_refuses_the_weights(rig: Rig) -> None:
    missing = (str(rig.tmp / "no-such-weights"), "bad")
    rig.update(missing)
    assert not rig.runner.state.lock and rig.manager.state == "Ready"
    assert rig.state() == "Unhealthy" and "no-such-weights" in rig.runner.reasons["engine-0"]
    assert rig.c.committed == missing  # committed: the trainer's version is the truth, catch-up retries it
    _, version = rig.update()
    assert rig.state() == "Quiesced" and rig.run(rig.served_version(0)) == version


@pytest.mark.weight_update
def test_lock_released_when_the_update_is_cancelled(rig: Rig) -> None:
    """A cancellation in the middle of the engine's load: update_failed, engines aborted, lock free."""
    rig.next = rig.weights()

    async def cancel_mid_update() -> None:
        task = asyncio.ensure_future(rig.runner.operate("update_weights"))
        deadline = time.monotonic() + 30  # bounded; polled in this task, so the cancel lands as the load starts
        while rig.state() != "UpdatingWeights":
            assert time.monotonic() < deadline, rig.state()
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    mark = len(rig.spy.at)
    rig.run(cancel_mid_update())
    assert not rig.runner.state.lock and rig.manager.state == "Ready"
    assert [a[1] for a in rig.spy.at[mark:] if a[0] == "rollout"] == ["begin_update", "update_failed"]
    assert rig.state() == "Quiesced" and rig.runner.state.dirty
    _, version = rig.update()  # the next update goes through
    assert not rig.runner.state.dirty and rig.run(rig.served_version(0)) == version


@pytest.mark.weight_update
def test_stop_engine_confirms_death_and_start_engine_serves_only_after_catch_up(rig: Rig) -> None:
    """An operator's stop/start of one engine: Stopped only once dead, never recovered; back via catch-up."""
    engine = rig.c.engines[0]
    rig.run(rig.manager.generate(5))
    committed = rig.c.committed
    assert committed is not None
    rig.run(rig.manager.stop_engine(0))
    assert rig.state() == "Stopped" and not engine.launcher.alive()  # the process is really gone
    assert ("rollout", 0) not in rig.c.monitor.members
    rig.run(rig.c.deaths.watchers[engine.id])  # its death watcher saw the process end (the monitor no longer probes it)
    assert rig.state() == "Stopped"  # the death we caused is not a fault: no Unhealthy, no recovery
    rig.run(rig.manager.start_engine(0))
    assert rig.state() == "PendingWeights" and rig.c.routable() == []
    samples = rig.run(rig.manager.generate(6))  # the catch-up hands it the committed weights first
    assert {s.get("weight_version") for s in samples} == {committed[1]}
    moves = [t for _, t in rig.spy.moves("engine-0")]
    last_stop = len(moves) - 1 - moves[::-1].index("stop")
    assert "recover" not in moves[last_stop:] and "confirm_dead" in moves[last_stop:]


@pytest.mark.routing
@pytest.mark.recovery
def test_the_routing_holds_exactly_the_serving_engines_after_a_recovery_and_a_drain(rig: Rig) -> None:
    """The shell's half of publication: an engine whose server answers but holds no committed weights yet is
    not in the group's routing, and one drained after a generate leaves it (``stop_routing``)."""

    def published() -> list[str]:
        return rig.c.routing().members()

    def serving() -> list[str]:
        return [e.id for e in rig.c.routable()]

    _kill(rig)
    assert published() == serving() == []
    rig.update()  # recovered: a new process, answering, loaded under the lock -- Quiesced, not routed
    assert rig.state() == "Quiesced" and published() == serving() == []
    seen: list[tuple[list[str], list[str]]] = []
    inner = rig.manager.executor.rollout_fn
    assert inner is not None

    async def spied(rollout_id: int, controller: InferenceController) -> list[Any]:
        seen.append((published(), serving()))
        return await inner(rollout_id, controller)

    rig.manager.executor.rollout_fn = spied
    try:
        rig.run(rig.manager.generate(8))
    finally:
        rig.manager.executor.rollout_fn = inner
    assert seen == [(["engine-0"], ["engine-0"])]
    assert published() == serving() == []  # drained at the end of the generate: withdrawn


@pytest.mark.recovery
def test_a_late_verdict_about_a_replaced_process_is_fenced_and_the_new_one_keeps_serving(rig: Rig) -> None:
    """Issue 31: every report names the generation of the process it is about. After a recovery the engine's
    old process's verdicts (a probe that failed, its death) arrive while the new process serves: the core
    discards them (``lifecycle.fenced``) -- the same report about the current process marks the engine."""
    from lifecycle.decide.core import ROLLOUT, Outcome
    from lifecycle.decide.events import FENCED

    _kill(rig)
    rig.run(rig.manager.generate(9))  # recovered: a new process, caught up, routed
    engine = rig.c.engines[0]
    now = rig.runner.epoch(ROLLOUT, 0)
    assert now >= 2 and engine.epoch == now  # the slot knows the generation the core counted
    assert rig.c.monitor.health((ROLLOUT, 0)).epoch == now  # the monitor's verdicts will name it
    old = now - 1
    states: list[str] = []
    routed: list[list[str]] = []
    inner = rig.manager.executor.rollout_fn
    assert inner is not None

    async def spied(rollout_id: int, controller: InferenceController) -> list[Any]:
        for news in ("threshold_reached", "died", "request_failed"):  # the old process's late news
            await controller.runner.report(Outcome(news, ROLLOUT, 0, f"late {news} of generation {old}", epoch=old))
            states.append(controller.runner.state.engines[0].state)
        routed.append([e.id for e in controller.routable()])
        return await inner(rollout_id, controller)

    mark = len(rig.spy.events)
    rig.manager.executor.rollout_fn = spied
    try:
        samples = rig.run(rig.manager.generate(10))
    finally:
        rig.manager.executor.rollout_fn = inner
    assert states == ["Serving"] * 3 and routed == [[engine.id]] and len(samples) == 4
    fenced = [e for e in rig.spy.events[mark:] if e.get("event") == FENCED]
    assert [(e["news"], e["epoch"], e["current_epoch"]) for e in fenced] == [
        ("threshold_reached", old, now),
        ("died", old, now),
        ("request_failed", old, now),
    ]
    assert not [m for m in rig.spy.moves("engine-0")[-6:] if m[1] == "mark_unhealthy"]


# -- the construction gate, and rollout FT as the one gate ------------------------------------------------------
@pytest.mark.construction_gate
def test_replay_constructs_nothing_and_starts_nothing(tmp_path: Path) -> None:
    """Replay's generate reads the saved rollout; no rollout function exists to call (miles' TypeError on None)."""
    from rollout.replay import save_rollout
    from rollout.sample import sample

    template = str(tmp_path / "{rollout_id}.json")
    saved = [
        sample(index=0, group=0, prompt="ab:", prompt_ids=[1, 2], output_ids=[3], response="a", reward=1.0,
               weight_version="0", engine="engine-0", logprobs=[-0.5]),
    ]  # fmt: skip
    save_rollout(template, 0, saved, task="ab")
    config = LifecycleConfig.from_mapping({"load_debug_rollout_data": template})
    spy = Spy()
    manager = RolloutManager(config, TASK, launcher_factory=None, log=EventLog([spy]))
    bind_trainer_stand_in(manager.runner)

    async def go() -> list[Any]:
        await manager.init(("unused", "0"))
        await manager.offload()
        return await manager.generate(0)

    assert asyncio.run(go()) == saved
    assert manager.state == "Replay"
    assert manager.controller.engines == [] and manager.runner.state.monitor == "Init"
    assert manager.executor.rollout_fn is None and manager.executor.constructed == []
    effects = {e for ev in spy.events for e in ev.get("effects") or ()}
    assert not effects & {"construct_rollout_fn", "construct_eval_fn", "start_servers", "start_monitor"}
    assert spy.moves() == [("rollout", "init"), ("rollout", "generate")]
    assert manager.runner.ledger.ever("load_replay_data") and not manager.runner.ledger.ever("construct_rollout_fn")


@pytest.mark.parametrize(
    "flags", [{}, {"use_fault_tolerance": True, "ft_components": ["train"]}], ids=["no-ft", "train-ft"]
)
@pytest.mark.monitor
@pytest.mark.lifecycle_gate
def test_no_rollout_ft_starts_no_monitor_and_a_dead_engine_fails_naming_the_flag(
    flags: dict[str, Any], tmp_path: Path
) -> None:
    rig = Rig({"rollout_num_gpus": 1, **flags}, tmp_path)
    try:
        rig.run(rig.manager.init(rig.weights(0)))
        rig.run(rig.manager.generate(0))
        assert rig.runner.state.monitor == "Init" and rig.c.monitor.members == ()
        assert not [m for m in rig.spy.moves() if m[0] == "monitor"]
        assert rig.state() == "Quiesced" and rig.manager.executor.constructed == ["rollout_fn", "eval_fn"]
        rig.run(rig.c.kill_engine(0))
        assert rig.state() == "Failed"
        with pytest.raises(EngineFailed) as info:
            rig.run(rig.manager.generate(1))
        message = str(info.value)
        assert "engine engine-0 failed in state Unhealthy" in message and "(while Quiesced)" in message
        assert "rollout fault tolerance is off" in message and "--ft-components rollout" in message
        assert not rig.runner.ledger.ever("recover_engine")
    finally:
        rig.close()
