"""The eval fleet with real CPU engine processes (local launcher), pinned by the core's ``pin`` operation.

What is shown: an eval pins every eval engine to the committed version; a killed eval engine is stopped
and started again by the next pin; a hung one is found by the fleet's own probe only when it
self-probes (rollout FT off) -- under rollout FT the fleet sends no probe of its own and the rollout
monitor's verdict is its source; a version disagreement is a pin violation, and with the core's
all-or-nothing check removed the same test fails; no eval engine is ever launched when
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
from engines.models import TinyCausalLM
from engines.process import torch_engine_command
from lifecycle import EffectLedger, EventLog, LifecycleConfig
from lifecycle.decide.core import Outcome
from lifecycle.decide.events import TRANSITION, MemorySink
from lifecycle.decide.predicates import eval_fleet_enabled
from rollout.executor import EvalResult, RolloutManager
from rollout.pattern import PatternTask

from .conftest import bind_trainer_stand_in

FAST = {
    "rollout_num_gpus": 1,
    "eval_num_gpus": 2,
    "rollout_health_check_interval": 1.0,
    "rollout_health_check_timeout": 1.0,
    "engine_restart_backoff": 0.05,
}
SELF_PROBING = FAST  # rollout FT off: nobody else probes the eval engines
MONITORED = {**FAST, "use_fault_tolerance": True, "ft_components": ["rollout"]}  # the rollout monitor does
TIMEOUTS = Timeouts(startup=60.0, request=3.0, death=10.0)


def _config(values: dict[str, Any]) -> LifecycleConfig:
    return LifecycleConfig.from_mapping(values, check_paths=False)


def _weights(tmp: Path, seed: int, version: str) -> tuple[str, str]:
    path = TinyCausalLM("tiny", seed=seed).save_pretrained(tmp / f"step-{version}")
    return str(path), version


def _factory(engine_id: str) -> LocalLauncher:
    return LocalLauncher(engine_id, lambda: torch_engine_command(seed=0), startup_timeout=60)


def _pid(engine: Engine) -> int:
    launcher = engine.launcher
    assert isinstance(launcher, LocalLauncher) and launcher.process is not None
    return launcher.process.pid


class Fleet:
    """A rollout manager with an eval fleet on real processes; what the tests read of it."""

    def __init__(self, manager: RolloutManager, sink: MemorySink, tmp: Path) -> None:
        self.manager, self.sink, self.tmp = manager, sink, tmp
        self.next: tuple[str, str] | None = None

    @property
    def evals(self) -> list[Engine]:
        return self.manager.controller.evals

    def states(self) -> dict[str, str]:
        return self.manager.controller.states("eval")

    @property
    def ledger(self) -> EffectLedger:
        return self.manager.runner.ledger

    async def versions(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for e in self.evals:
            assert e.client is not None
            out[e.id] = (await e.client.model_info()).weight_version
        return out

    async def update(self, seed: int, version: str) -> None:
        self.next = _weights(self.tmp, seed, version)
        await self.manager.runner.operate("update_weights")

    def fleet_moves(self) -> list[str]:
        return [e["dst"] for e in self.sink if e.get("event") == TRANSITION and e["machine"] == "eval_fleet"]


def _with_fleet(values: dict[str, Any], tmp: Path, body: Callable[[Fleet], Awaitable[None]]) -> None:
    """A manager with its eval fleet of real engine processes; ``body``; always disposed (processes killed)."""

    async def run() -> None:
        sink = MemorySink()
        manager = RolloutManager(
            _config(values), PatternTask(), launcher_factory=_factory, log=EventLog([sink]), timeouts=TIMEOUTS
        )
        fleet = Fleet(manager, sink, tmp)
        bind_trainer_stand_in(manager.runner, lambda: fleet.next or _weights(tmp, 9, "x"))
        try:
            await manager.runner.operate("trainer.start")
            await manager.init(_weights(tmp, 1, "v1"))
            assert manager.runner.state.fleet == "Idle" and set(fleet.states().values()) == {"PendingWeights"}
            await body(fleet)
        finally:
            await manager.dispose()
        assert manager.runner.state.fleet == "Disposed"
        assert all(not e.launcher.alive() for e in fleet.evals)

    asyncio.run(run())


def _hang(engine: Engine) -> int:
    pid = _pid(engine)
    os.kill(pid, signal.SIGSTOP)  # alive to the OS, silent on HTTP: only a probe or a request can tell
    return pid


@pytest.mark.recovery
def test_an_eval_pins_every_engine_and_a_killed_one_is_started_again(tmp_path: Path) -> None:
    async def body(f: Fleet) -> None:
        first = await f.manager.eval(0)
        assert (first.on, first.skipped, first.weight_version) == ("eval_fleet", None, "v1"), first
        assert await f.versions() == {"eval-0": "v1", "eval-1": "v1"}
        assert f.states() == {"eval-0": "Quiesced", "eval-1": "Quiesced"}  # out of routing between evals
        old = _pid(f.evals[1])
        await f.evals[1].launcher.kill()  # the watcher reports the death; the next pin restarts it
        deadline = time.monotonic() + 10
        while f.states()["eval-1"] != "Unhealthy":
            assert time.monotonic() < deadline, f.states()
            await asyncio.sleep(0.05)
        second = await f.manager.eval(1)
        assert second.skipped is None and second.weight_version == "v1", second
        assert _pid(f.evals[1]) != old and await f.versions() == {"eval-0": "v1", "eval-1": "v1"}
        assert f.fleet_moves().count("Pinned") == 2

    _with_fleet(SELF_PROBING, tmp_path, body)


@pytest.mark.monitor
@pytest.mark.lifecycle_gate
def test_a_self_probing_fleet_finds_a_hung_engine_and_misses_it_without_its_probe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def body(f: Fleet) -> None:
        await f.manager.eval(0)
        _hang(f.evals[1])
        found = await f.manager.eval(1)  # the fleet's own probe finds it, the pin restarts it
        assert found.skipped is None, found
        assert f.ledger.ever("probe_engine", "engine")
        # the bug miles fixed, re-introduced: the fleet's probe answers "ok" whatever the engine does
        _hang(f.evals[0])

        async def no_probe(cmd: Any) -> Outcome:
            return Outcome("probe_ok")

        monkeypatch.setitem(f.manager.runner.handlers, "engine.probe_engine", no_probe)
        missed = await f.manager.eval(2)  # undetected: the load to it runs out of its bound instead
        assert missed.skipped == "pin_violation" and "eval-0" in missed.detail, missed

    _with_fleet(SELF_PROBING, tmp_path, body)


@pytest.mark.monitor
@pytest.mark.lifecycle_gate
def test_under_rollout_ft_the_fleet_sends_no_probe_of_its_own(tmp_path: Path) -> None:
    async def body(f: Fleet) -> None:
        await f.manager.eval(0)
        _hang(f.evals[1])
        result = await f.manager.eval(1)
        # no probe of the fleet's: the monitor (running during the eval) or the bounded load tells
        assert not f.ledger.ever("probe_engine", "engine") and not f.ledger.failed("probe_engine", "engine")
        assert result.skipped in (None, "pin_violation"), result
        again = await f.manager.eval(2)  # whichever it was, the next pin starts it again
        assert again.skipped is None and await f.versions() == {"eval-0": "v1", "eval-1": "v1"}

    _with_fleet(MONITORED, tmp_path, body)


@pytest.mark.parametrize(
    ("values", "fleet_probes"), [(MONITORED, False), (SELF_PROBING, True)], ids=["rollout-ft", "no-ft"]
)
@pytest.mark.monitor
def test_the_fleets_own_health_generate_on_the_wire(
    values: dict[str, Any], fleet_probes: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted where it leaves: every ``/health_generate`` an eval engine's client sends outside its start-up
    wait. The rollout monitor is told never to probe here, so under rollout FT the count must be 0; with
    rollout FT off the fleet probes every pin itself, as miles' ``EvalFleet.pin`` does (so the count can fail)."""
    from engines.client import EngineClient

    sent: list[str] = []
    starting: set[str] = set()
    real_health, real_wait = EngineClient.health_generate, Engine._wait_healthy

    async def counted(self: EngineClient, **kwargs: Any) -> Any:
        if self.engine_id.startswith("eval-") and self.engine_id not in starting:
            sent.append(self.engine_id)
        return await real_health(self, **kwargs)

    async def wait(self: Engine) -> None:
        starting.add(self.id)
        try:
            await real_wait(self)
        finally:
            starting.discard(self.id)

    monkeypatch.setattr(EngineClient, "health_generate", counted)
    monkeypatch.setattr(Engine, "_wait_healthy", wait)

    async def body(f: Fleet) -> None:
        for rid in range(2):
            assert (await f.manager.eval(rid)).skipped is None

    _with_fleet({**values, "rollout_health_check_first_wait": 3600.0}, tmp_path, body)
    assert bool(sent) is fleet_probes, sent


def test_a_version_disagreement_is_a_pin_violation_and_the_check_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lifecycle.decide.core import PHASES

    async def disagree(f: Fleet) -> EvalResult:
        """eval-1's server loads other weights than it is asked for: its /model_info disagrees."""
        engine = f.evals[1]
        assert engine.client is not None
        other_path, _ = _weights(f.tmp, 2, "v-other")
        real = type(engine.client).update_weights_from_disk

        async def load_other(self: Any, path: str, **kw: Any) -> Any:
            if self is engine.client:
                return await real(self, other_path, weight_version="v-other")
            return await real(self, path, **kw)

        with monkeypatch.context() as m:
            m.setattr(type(engine.client), "update_weights_from_disk", load_other)
            return await f.manager.eval(0)

    async def body(f: Fleet) -> None:
        result = await disagree(f)
        assert result.skipped == "pin_violation" and "eval-1" in result.detail, result
        # the bug re-introduced: the core's all-or-nothing check is gone, the fleet pins whatever loaded
        with monkeypatch.context() as m:
            m.setitem(PHASES, "fleet_loaded", _pin_anyway)
            with pytest.raises(AssertionError):
                result = await disagree(f)
                assert result.skipped == "pin_violation", result
        again = await f.manager.eval(1)  # and without the disagreement the same fleet pins
        assert again.skipped is None and await f.versions() == {"eval-0": "v1", "eval-1": "v1"}

    _with_fleet({**SELF_PROBING, "engine_max_restarts": 10}, tmp_path, body)


def _pin_anyway(step: Any) -> None:
    if step.job.fleet == "LoadingSnapshot":
        step.fire("fleet", "loaded")
        step.engines_do("eval", "resume", frozenset({"Quiesced"}))


@pytest.mark.parametrize(
    "values",
    [
        {"load_debug_rollout_data": "d/{rollout_id}.json", "eval_num_gpus": 2},  # replay
        {"debug_train_only": True, "eval_num_gpus": 2},  # plain train-only
        {"rollout_num_gpus": 1, "eval_num_gpus": 0},  # no eval GPUs
    ],
    ids=["replay", "train-only", "eval-num-gpus-0"],
)
@pytest.mark.construction_gate
def test_no_eval_engine_when_the_fleet_is_disabled(values: dict[str, Any], tmp_path: Path) -> None:
    config = _config(values)
    assert not eval_fleet_enabled(config)
    launched: list[str] = []

    def factory(engine_id: str) -> LocalLauncher:
        launched.append(engine_id)
        return _factory(engine_id)

    async def run() -> tuple[EvalResult, str]:
        manager = RolloutManager(config, PatternTask(), launcher_factory=factory, timeouts=TIMEOUTS)
        bind_trainer_stand_in(manager.runner)
        try:
            await manager.init(_weights(tmp_path, 1, "0"))
            return await manager.eval(0), manager.runner.state.fleet
        finally:
            await manager.dispose()

    result, fleet = asyncio.run(run())
    assert not any(e.startswith("eval-") for e in launched) and fleet in ("Init", "Disposed")
    if "debug_train_only" in values or "load_debug_rollout_data" in values:
        assert result.reward is None and result.skipped in ("no_eval_fn", "no_engines")
    else:
        assert result.on == "rollout" and result.reward is not None


def test_without_a_fleet_eval_runs_on_the_rollout_engines(tmp_path: Path) -> None:
    config = _config({"rollout_num_gpus": 1, "eval_num_gpus": 0, "eval_interval": 1})

    async def run() -> None:
        manager = RolloutManager(config, PatternTask(), launcher_factory=_factory, timeouts=TIMEOUTS)
        bind_trainer_stand_in(manager.runner)
        try:
            await manager.init(_weights(tmp_path, 1, "0"))
            result = await manager.eval(0)
            assert result.on == "rollout" and result.skipped is None, result
            assert result.reward is not None and 0.0 <= result.reward <= 1.0
            assert result.weight_version == "0" and result.samples == 16
            again = await manager.eval(1)  # greedy on the same weights and prompts: the same reward
            assert again.reward == result.reward and manager.state == "Ready"
            assert manager.runner.ledger.count("run_eval") == 2
        finally:
            await manager.dispose()

    asyncio.run(run())


@pytest.mark.weight_update
def test_the_fleet_pins_what_the_rollout_engines_hold_after_an_update(tmp_path: Path) -> None:
    async def body(f: Fleet) -> None:
        await f.update(2, "v2")
        result = await f.manager.eval(0)
        assert result.weight_version == "v2" and result.skipped is None, result
        assert await f.versions() == {"eval-0": "v2", "eval-1": "v2"}

    _with_fleet({**SELF_PROBING, "eval_num_gpus": 2}, tmp_path, body)


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")
def test_loop_writes_eval_rewards_into_metrics(tmp_path: Path) -> None:
    """``lifecycle run --steps 4 --eval-interval 2 --eval-num-gpus 1``: evals at step 0 (before generate)
    and after the weight updates of steps 1 and 3, each on the fleet pinned to the weights just pushed."""
    import io

    from lifecycle.decide.events import read_jsonl
    from trainer.app.loop import RunOptions, run_loop

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

    async def body(f: Fleet) -> None:
        controller = f.manager.controller
        assert ("eval", 0) in controller.monitor.members  # registered with the rollout monitor
        pid = _hang(f.evals[0])
        await f.manager.runner.operate("generate")  # the monitor runs: it probes rollout and eval engines
        deadline = time.monotonic() + 20.0
        while f.states()["eval-0"] != "Unhealthy":
            assert time.monotonic() < deadline, f.states()
            await asyncio.sleep(0.1)
        await f.manager.runner.operate("generate_done")
        assert "failed probes" in f.manager.runner.reasons["eval-0"]
        assert controller.states() == {"engine-0": "Quiesced"}  # the rollout engine is untouched
        result = await f.manager.eval(0)
        assert result.skipped is None and result.weight_version == "v1", result
        assert _pid(f.evals[0]) != pid
        assert not f.ledger.ever("probe_engine", "engine")  # the fleet never probed: the monitor did

    _with_fleet({**MONITORED, "eval_num_gpus": 1, "rollout_health_check_failure_threshold": 1}, tmp_path, body)
