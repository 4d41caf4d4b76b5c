"""The eval fleet with real CPU engine processes (local launcher), and eval wired into the rollout manager.

What is shown: pin -> Pinned with every eval engine at the version; a killed eval engine is restarted by
pin; a hung one is found by the fleet's own probe only when it self-probes (rollout FT off), and under
rollout FT the bounded wait runs out -> SkippedUnhealthy; a version disagreement -> SkippedPinViolation,
and with the fleet's version check removed the same test fails; no fleet is ever created when
``eval_fleet_enabled`` is false; eval runs on the fleet when there is one, else on the rollout engines.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from engines.engine import Engine, Timeouts
from engines.launcher import LocalLauncher
from engines.process import torch_engine_command
from lifecycle import EffectLedger, LifecycleConfig
from lifecycle.predicates import eval_fleet_enabled, eval_fleet_self_probes
from models import TinyCausalLM
from rollout.eval_fleet import EvalFleet
from rollout.executor import RolloutManager
from rollout.task import PatternTask

FAST = {
    "rollout_num_gpus": 1,
    "eval_num_gpus": 2,
    "rollout_health_check_interval": 1.0,
    "rollout_health_check_timeout": 1.0,
    "engine_restart_backoff": 0.05,
}
SELF_PROBING = FAST  # rollout FT off: nobody else probes the eval engines
MONITORED = {**FAST, "use_fault_tolerance": True, "ft_components": ["rollout"]}  # the rollout monitor does
TIMEOUTS = Timeouts(startup=60.0, request=5.0, death=10.0)


def _config(values: dict[str, Any]) -> LifecycleConfig:
    return LifecycleConfig.from_mapping(values, check_paths=False)


def _weights(tmp: Path, seed: int, version: str) -> str:
    path = tmp / f"weights-{version}.safetensors"
    TinyCausalLM("tiny", seed=seed).save_weights(path)
    return str(path)


def _factory(engine_id: str) -> LocalLauncher:
    return LocalLauncher(engine_id, lambda: torch_engine_command(seed=0), startup_timeout=60)


def _pid(engine: Engine) -> int:
    launcher = engine.launcher
    assert isinstance(launcher, LocalLauncher) and launcher.process is not None
    return launcher.process.pid


def _with_fleet(config: LifecycleConfig, body: Callable[[EvalFleet, EffectLedger], Awaitable[None]], **kw: Any) -> None:
    """Create a fleet of real engine processes, run ``body``, always dispose (processes killed)."""

    async def run() -> None:
        ledger = EffectLedger()
        fleet = EvalFleet(config, _factory, ledger=ledger, timeouts=TIMEOUTS, **kw)
        try:
            assert await fleet.create()
            assert fleet.state == "Idle" and fleet.states() == {"eval-0": "PendingWeights", "eval-1": "PendingWeights"}
            await body(fleet, ledger)
        finally:
            await fleet.dispose()
        assert fleet.state == "Disposed"
        assert all(not e.launcher.alive() for e in fleet.engines)

    asyncio.run(run())


async def _versions(fleet: EvalFleet) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for e in fleet.engines:
        assert e.client is not None
        out[e.id] = (await e.client.model_info()).weight_version
    return out


@pytest.mark.recovery
def test_pin_pins_every_engine_and_restarts_a_killed_one(tmp_path: Path) -> None:
    config = _config(SELF_PROBING)
    assert eval_fleet_self_probes(config)
    v1, v2 = _weights(tmp_path, 1, "v1"), _weights(tmp_path, 2, "v2")

    async def body(fleet: EvalFleet, ledger: EffectLedger) -> None:
        pin = await fleet.pin(v1, "v1")
        assert pin.ok and pin.state == "Pinned" and pin.reason is None, pin
        assert pin.versions == {"eval-0": "v1", "eval-1": "v1"} == await _versions(fleet)
        assert [e.id for e in fleet.routable()] == ["eval-0", "eval-1"]  # Serving only while pinned
        assert ledger.ever("probe_engine", "eval_fleet") and ledger.ever("load_snapshot", "eval_fleet")
        await fleet.release()
        assert fleet.state == "Idle" and fleet.routable() == []
        assert set(fleet.states().values()) == {"Quiesced"}

        # a SIGKILLed eval engine: the fleet's own restart (stop -> start), not rollout FT's recover
        old_pid = _pid(fleet.engines[1])
        await fleet.engines[1].launcher.kill()
        await fleet.engines[1].launcher.wait_dead(5.0)
        pin = await fleet.pin(v2, "v2")
        assert pin.ok, pin
        assert pin.restarted == ("eval-1",)
        assert _pid(fleet.engines[1]) != old_pid
        assert await _versions(fleet) == {"eval-0": "v2", "eval-1": "v2"}
        assert not ledger.ever("recover_engine")
        await fleet.release()

    _with_fleet(config, body)


def _hang(engine: Engine) -> int:
    pid = _pid(engine)
    os.kill(pid, signal.SIGSTOP)  # alive to the OS, silent on HTTP: only a probe can tell
    return pid


async def _pin_with_hung_engine(fleet: EvalFleet, path: str) -> tuple[str, str | None]:
    await fleet.pin(path, "v1")
    await fleet.release()
    _hang(fleet.engines[1])
    pin = await fleet.pin(path, "v2")
    await fleet.release()
    return pin.state, pin.reason


@pytest.mark.monitor
def test_self_probing_fleet_finds_a_hung_engine_and_misses_it_without_its_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(SELF_PROBING)
    path = _weights(tmp_path, 1, "v")

    async def body(fleet: EvalFleet, ledger: EffectLedger) -> None:
        state, reason = await _pin_with_hung_engine(fleet, path)
        assert (state, reason) == ("Pinned", None), fleet.last
        assert fleet.last is not None and fleet.last.restarted == ("eval-1",)

        # the bug miles fixed, re-introduced on the same fleet: no self-probe with rollout FT off
        async def no_probe(self: EvalFleet) -> None:
            return None

        monkeypatch.setattr(EvalFleet, "_probe", no_probe)
        state, reason = await _pin_with_hung_engine(fleet, path)
        assert (state, reason) == ("SkippedUnhealthy", "unhealthy")
        assert fleet.last is not None and "not alive within 2s" in fleet.last.detail  # the bounded wait ended it

    _with_fleet(config, body, alive_timeout=2.0)


@pytest.mark.recovery
@pytest.mark.monitor
def test_monitored_fleet_does_not_probe_and_a_bounded_wait_becomes_unhealthy(tmp_path: Path) -> None:
    config = _config(MONITORED)
    assert eval_fleet_enabled(config) and not eval_fleet_self_probes(config)
    path = _weights(tmp_path, 1, "v")

    async def body(fleet: EvalFleet, ledger: EffectLedger) -> None:
        state, reason = await _pin_with_hung_engine(fleet, path)
        assert (state, reason) == ("SkippedUnhealthy", "unhealthy"), fleet.last
        assert fleet.last is not None and "eval-1" in fleet.last.detail
        assert "not alive within 2s" in fleet.last.detail  # the bounded wait, not a failed probe, ended it
        assert not ledger.ever("probe_engine", "eval_fleet")  # the rollout monitor covers them here
        assert fleet.state == "Idle" and fleet.states()["eval-1"] == "Unhealthy"
        pin = await fleet.pin(path, "v3")  # the next pin restarts the engine the wait gave up on
        assert pin.ok and pin.restarted == ("eval-1",), pin
        await fleet.release()

    _with_fleet(config, body, alive_timeout=2.0)


async def _disagreement(fleet: EvalFleet, v1: str, other: str) -> None:
    """eval-1 loads a different file (another version) than the one pinned: all or nothing."""
    engine = fleet.engines[1]
    real = engine.load_weights

    async def load_other(path: str, version: str) -> None:
        await real(other, "v-other")

    engine.load_weights = load_other  # type: ignore[method-assign]
    try:
        pin = await fleet.pin(v1, "v1")
    finally:
        del engine.load_weights  # back to the class method
    assert pin.state == "SkippedPinViolation" and pin.reason == "pin_violation", pin
    assert pin.versions == {"eval-0": "v1", "eval-1": "v-other"}
    assert "eval-1" in pin.detail and fleet.routable() == []
    await fleet.release()
    assert fleet.state == "Idle"


def test_version_disagreement_is_a_pin_violation_and_the_check_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(SELF_PROBING)
    v1, other = _weights(tmp_path, 1, "v1"), _weights(tmp_path, 2, "other")

    async def body(fleet: EvalFleet, ledger: EffectLedger) -> None:
        await _disagreement(fleet, v1, other)
        # the bug re-introduced: load on every engine but skip the all-or-nothing version check
        with monkeypatch.context() as m:

            async def load_unchecked(self: EvalFleet, path: str, version: str) -> tuple[dict[str, Any], list[str]]:
                await asyncio.gather(*(e.load_weights(path, version) for e in self.engines))
                return {e.id: version for e in self.engines}, []

            m.setattr(EvalFleet, "_load", load_unchecked)
            with pytest.raises(AssertionError):
                await _disagreement(fleet, v1, other)
            await fleet.release()
        pin = await fleet.pin(v1, "v1")  # and without the disagreement the same fleet pins
        assert pin.ok and await _versions(fleet) == {"eval-0": "v1", "eval-1": "v1"}
        await fleet.release()

    _with_fleet(config, body)


class _NoLaunch:
    """A launcher factory that fails the test if anything is ever launched."""

    calls: list[str]

    def __init__(self) -> None:
        self.calls = []

    def __call__(self, engine_id: str) -> LocalLauncher:
        self.calls.append(engine_id)
        raise AssertionError(f"{engine_id} launched")


@pytest.mark.parametrize(
    "values",
    [
        {"load_debug_rollout_data": "d/{rollout_id}.json", "eval_num_gpus": 2},  # replay
        {"debug_train_only": True, "eval_num_gpus": 2},  # plain train-only
        {"rollout_num_gpus": 1, "eval_num_gpus": 0},  # no eval GPUs
    ],
    ids=["replay", "train-only", "eval-num-gpus-0"],
)
def test_no_fleet_when_eval_fleet_is_disabled(values: dict[str, Any]) -> None:
    config = _config(values)
    assert not eval_fleet_enabled(config)
    factory = _NoLaunch()
    fleet = EvalFleet(config, factory)
    assert asyncio.run(fleet.create()) is False
    assert fleet.state == "Init" and fleet.engines == [] and factory.calls == []


def test_manager_without_fleet_evals_on_the_rollout_engines(tmp_path: Path) -> None:
    config = _config({"rollout_num_gpus": 1, "eval_num_gpus": 0, "eval_interval": 1})
    ledger = EffectLedger()

    async def run() -> None:
        manager = RolloutManager(config, PatternTask(), launcher_factory=_factory, ledger=ledger, timeouts=TIMEOUTS)
        try:
            await manager.init((_weights(tmp_path, 1, "0"), "0"))
            assert manager.controller.eval_fleet is None and not ledger.ever("start_eval_fleet")
            result = await manager.eval(0)
            assert result.on == "rollout" and result.skipped is None, result
            assert result.reward is not None and 0.0 <= result.reward <= 1.0
            assert result.weight_version == "0" and result.samples == 16
            again = await manager.eval(1)  # greedy on the same weights and prompts: the same reward
            assert again.reward == result.reward
            assert manager.state == "Ready"
            assert ledger.count("run_eval") == 2
        finally:
            await manager.dispose()

    asyncio.run(run())


@pytest.mark.construction_gate
def test_replay_and_train_only_skip_eval_and_build_no_fleet(tmp_path: Path) -> None:
    async def run(values: dict[str, Any]) -> str | None:
        factory = _NoLaunch()
        manager = RolloutManager(_config(values), PatternTask(), launcher_factory=factory)
        await manager.init(("unused", "0"))
        result = await manager.eval(0)
        assert manager.controller.eval_fleet is None and factory.calls == []
        assert result.reward is None
        await manager.dispose()
        return result.skipped

    replay = {"load_debug_rollout_data": str(tmp_path / "{rollout_id}.json"), "eval_num_gpus": 2}
    assert asyncio.run(run(replay)) == "no_eval_fn"
    assert asyncio.run(run({"debug_train_only": True, "eval_num_gpus": 2})) == "no_engines"


def test_manager_evals_on_the_pinned_fleet_and_disposes_it(tmp_path: Path) -> None:
    config = _config({**SELF_PROBING, "eval_num_gpus": 1})
    ledger = EffectLedger()

    async def run() -> None:
        manager = RolloutManager(config, PatternTask(), launcher_factory=_factory, ledger=ledger, timeouts=TIMEOUTS)
        try:
            await manager.init((_weights(tmp_path, 1, "0"), "0"))
            fleet = manager.controller.eval_fleet
            assert fleet is not None and fleet.state == "Idle" and list(fleet.states()) == ["eval-0"]
            assert [e.id for e in manager.controller.engines] == ["engine-0"]  # never routed rollout traffic
            result = await manager.eval(0)
            assert (result.on, result.skipped, result.weight_version) == ("eval_fleet", None, "0"), result
            assert result.reward is not None and result.samples == 16
            assert fleet.state == "Idle" and manager.state == "Ready"
            assert fleet.states() == {"eval-0": "Quiesced"}
            # the eval fleet pins what the rollout engines hold after a weight update
            path = _weights(tmp_path, 2, "1")
            await manager.controller.update_weights(path, "1")
            result = await manager.eval(1)
            assert result.weight_version == "1" and result.skipped is None, result
        finally:
            await manager.dispose()
        assert fleet.state == "Disposed" and fleet.states() == {"eval-0": "Disposed"}
        assert not fleet.engines[0].launcher.alive()

    asyncio.run(run())


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_loop_writes_eval_rewards_into_metrics(tmp_path: Path) -> None:
    """``lifecycle run --steps 4 --eval-interval 2 --eval-num-gpus 1``: evals at step 0 (before generate)
    and after the weight updates of steps 1 and 3, each on the fleet pinned to the weights just pushed."""
    import io

    from lifecycle.events import read_jsonl
    from trainer.loop import RunOptions, run_loop

    config = _config({**MONITORED, "rollout_num_gpus": 2, "eval_num_gpus": 1, "eval_interval": 2})
    opts = RunOptions(steps=4, seed=0, run_dir=tmp_path / "run", launcher="local", quiet=True)
    asyncio.run(run_loop(config, opts, io.StringIO()))
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    with_eval = [m["step"] for m in metrics if "eval_reward" in m]
    assert with_eval == [0, 1, 3], metrics
    assert all(0.0 <= float(m["eval_reward"]) <= 1.0 for m in metrics if "eval_reward" in m)
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    fleet = [e for e in events if e.get("machine") == "eval_fleet" and e.get("event") == "lifecycle.transition"]
    assert [e["dst"] for e in fleet].count("Pinned") == 3
    assert fleet[0]["dst"] == "Idle" and fleet[-1]["dst"] == "Disposed"
    pins = [e for e in events if e.get("machine") == "engine" and e.get("instance") == "eval-0"]
    assert any(e.get("trigger") == "begin_update" for e in pins)


@pytest.mark.monitor
@pytest.mark.lifecycle_gate
@pytest.mark.slow
def test_under_rollout_ft_the_rollout_monitor_covers_the_eval_engines(tmp_path: Path) -> None:
    """The delegation: the fleet does not probe, the rollout monitor (running during generate/eval) does,
    and the engine it marks is restarted by the fleet's next pin."""
    config = _config({**MONITORED, "eval_num_gpus": 1, "rollout_health_check_failure_threshold": 1})
    ledger = EffectLedger()

    async def run() -> None:
        manager = RolloutManager(config, PatternTask(), launcher_factory=_factory, ledger=ledger, timeouts=TIMEOUTS)
        try:
            await manager.init((_weights(tmp_path, 1, "0"), "0"))
            controller, fleet = manager.controller, manager.controller.eval_fleet
            assert fleet is not None and controller.monitor is not None
            controller.monitor.health("eval-0")  # registered with the rollout monitor
            pid = _hang(fleet.engines[0])
            await controller.begin_generate()  # monitor resumed: it probes rollout and eval engines
            deadline = time.monotonic() + 15.0
            while fleet.engines[0].state != "Unhealthy":
                assert time.monotonic() < deadline, fleet.states()
                await asyncio.sleep(0.1)
            await controller.end_generate()
            assert "failed probes" in fleet.engines[0].reason
            assert controller.states() == {"engine-0": "Quiesced"}  # the rollout engine is untouched
            result = await manager.eval(0)
            assert result.skipped is None and result.weight_version == "0", result
            assert fleet.last is not None and fleet.last.restarted == ("eval-0",)
            assert _pid(fleet.engines[0]) != pid
            assert not ledger.ever("probe_engine", "eval_fleet")  # the fleet never probed: the monitor did
            assert ledger.ever("probe_engine", "monitor")
        finally:
            await manager.dispose()

    asyncio.run(run())
