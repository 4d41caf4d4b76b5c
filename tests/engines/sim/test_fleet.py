"""The simulated SGLang fleet: its engines answer the project's own client with SGLang's models, keep a real
server's state, die like one (connections refused, the watcher told), and a rollout manager drives 8 of them
through a whole step and a recovery as it drives CPU engines."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.client import EngineClient
from engines.errors import EngineError, EngineHTTPError
from engines.models import TinyCausalLM
from engines.models.family import load_tokenizer
from engines.sim.launcher import SimFleet
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.events import EventLog, MemorySink
from lifecycle.decide.runner import Runner
from lifecycle.observe.trace import diff, load
from rollout.executor import RolloutManager
from rollout.pattern import PatternTask

from ...rollout.conftest import bind_trainer_stand_in


@pytest.fixture
def fleet() -> Iterator[SimFleet]:
    f = SimFleet(8, {"/update_weights_from_disk": 0.01})
    yield f
    f.close()


def test_a_simulated_engine_speaks_the_lifecycle_endpoints_and_keeps_a_servers_state(
    fleet: SimFleet, tmp_path: Path
) -> None:
    weights = str(TinyCausalLM("tiny", seed=0).save_pretrained(tmp_path / "w"))

    async def scenario() -> None:
        launcher = fleet.launcher("engine-0")
        url = await launcher.launch()
        async with EngineClient(url, engine_id="engine-0", timeout=5.0) as client:
            await client.health_generate()
            await client.update_weights_from_disk(weights, weight_version="3")
            assert (await client.model_info()).weight_version == "3"
            answer = await client.generate("abcd:", sampling_params={"max_new_tokens": 5}, return_logprob=True)
            assert answer.meta_info.prompt_tokens == len(load_tokenizer(weights).encode("abcd:"))
            assert len(answer.output_ids) == 5 and answer.meta_info.weight_version == "3"
            await client.release_memory_occupation(["weights", "kv_cache"])
            with pytest.raises(EngineHTTPError):  # a released server is not healthy, and takes no weights
                await client.health()
            with pytest.raises(EngineHTTPError):
                await client.update_weights_from_disk(weights, weight_version="4")
            await client.resume_memory_occupation()
            await client.health()
            watcher = asyncio.create_task(launcher.watch())
            await asyncio.sleep(0.1)
            await asyncio.to_thread(launcher.crash)  # the fault hook: the slot's server dies
            assert await asyncio.wait_for(watcher, 10) == "killed"
            with pytest.raises(EngineError):  # refused, as a dead process's port is
                await client.health(timeout=2.0)
        assert fleet.calls()["0"]["/update_weights_from_disk"] == 2

    asyncio.run(scenario())


def test_a_rollout_manager_drives_eight_simulated_engines_through_a_step_and_a_recovery(
    fleet: SimFleet, tmp_path: Path
) -> None:
    config = LifecycleConfig.from_mapping(
        {
            "rollout_num_gpus": 8,
            "use_fault_tolerance": True,
            "offload_rollout": True,
            "rollout_health_check_interval": 5.0,
            "engine_restart_backoff": 0.05,
        }
    )
    events = MemorySink()
    runner = Runner(config, log=EventLog([events]))
    task = PatternTask(prompts_per_step=4, group_size=2, response_len=4)
    manager = RolloutManager(config, task, runner=runner, launcher_factory=fleet.launcher)
    versions = iter(range(1, 100))

    def weights() -> tuple[str, str]:
        v = next(versions)
        return str(TinyCausalLM("tiny", seed=v).save_pretrained(tmp_path / f"step-{v}")), str(v)

    bind_trainer_stand_in(runner, weights)

    async def scenario() -> list[str]:
        try:
            await runner.operate("trainer.start")
            await manager.init((str(TinyCausalLM("tiny", seed=0).save_pretrained(tmp_path / "step-0")), "0"))
            samples = await manager.generate(0)
            assert len(samples) == 8 and {s["weight_version"] for s in samples} == {"0"}
            await manager.offload()
            await manager.onload_weights()
            await runner.operate("update_weights")
            await manager.onload_kv()
            await asyncio.to_thread(manager.controller.engines[3].launcher.crash)
            for _ in range(200):  # the fleet's watcher reports the death (bounded wait)
                if runner.state.engines[3].state == "Unhealthy":
                    break
                await asyncio.sleep(0.05)
            samples = await manager.generate(1)  # recovered, caught up with version 1, then routed
            assert {s["weight_version"] for s in samples} == {"1"}
            return [e.state for e in runner.state.engines]
        finally:
            await manager.dispose()

    states = asyncio.run(scenario())
    assert states == ["Quiesced"] * 8
    calls = fleet.calls()
    assert all(calls[str(i)]["/update_weights_from_disk"] == 2 for i in range(8) if i != 3)  # version 0, then 1
    assert calls["3"]["/update_weights_from_disk"] == 1  # a new server: caught up with version 1 only
    moves = [(e["instance"], e["trigger"]) for e in events if e.get("event") == "lifecycle.transition"]
    assert ("engine-3", "recover") in moves and ("engine-3", "restart") in moves


def _fleet_step(fleet: SimFleet, tmp_path: Path, log: Path) -> dict[str, dict[str, int]]:
    """One step's fleet operations on 16 simulated engines (no FT: no monitor, so no wall-clock events);
    per operation, the fleet's peak of requests in flight."""
    config = LifecycleConfig.from_mapping({"rollout_num_gpus": 16, "offload_rollout": True})
    events = EventLog()
    runner = Runner(config, log=events)
    manager = RolloutManager(config, PatternTask(), runner=runner, launcher_factory=fleet.launcher)
    weights = str(TinyCausalLM("tiny", seed=0).save_pretrained(tmp_path / "w"))
    bind_trainer_stand_in(runner, lambda: (weights, "1"))

    peaks: dict[str, dict[str, int]] = {}

    async def scenario() -> None:
        try:
            await runner.operate("trainer.start")
            await manager.init((weights, "0"))
            peaks["init"] = fleet.peak(reset=True)
            for name, op in (
                ("offload", manager.offload),
                ("onload_weights", manager.onload_weights),
                ("update_weights", lambda: runner.operate("update_weights")),
                ("onload_kv", manager.onload_kv),
            ):
                await op()
                peaks[name] = fleet.peak(reset=True)
        finally:
            await manager.dispose()

    with events.to_jsonl(log):
        asyncio.run(scenario())
    # what each server was asked, counted at the server: ONE release per engine carrying both tags (as miles
    # releases everything in one call), then each onload's tag alone
    asked = fleet.memory_requests()
    assert len(asked) == 16
    for slot, requests in asked.items():
        assert requests == [
            ("/release_memory_occupation", ["weights", "kv_cache"]),
            ("/resume_memory_occupation", ["weights"]),
            ("/resume_memory_occupation", ["kv_cache"]),
        ], (slot, requests)
    return peaks


@pytest.mark.determinism
def test_fleet_operations_fan_out_to_every_engine_and_the_log_stays_deterministic(tmp_path: Path) -> None:
    """Each fleet operation has all 16 engines answering at once (the fleet's own count of requests in
    flight), yet outcomes are committed in slot order: two runs write the same event log."""
    slow = ("/update_weights_from_disk", "/release_memory_occupation", "/resume_memory_occupation")
    logs = []
    for run in ("a", "b"):
        fleet = SimFleet(16, dict.fromkeys(slow, 0.5))
        try:
            peaks = _fleet_step(fleet, tmp_path / run, tmp_path / f"{run}.jsonl")
        finally:
            fleet.close()
        # a fleet walked one engine after another would peak at 1 (the baseline below shows the count can);
        # offload releases both tags of every engine at once, in one request per engine: 16 requests
        assert peaks == {
            "init": {"/update_weights_from_disk": 16},
            "offload": {"/release_memory_occupation": 16},
            "onload_weights": {"/resume_memory_occupation": 16},
            "update_weights": {"/update_weights_from_disk": 16},
            "onload_kv": {"/resume_memory_occupation": 16},
        }, peaks
        logs.append(load(tmp_path / f"{run}.jsonl"))
    assert diff(logs[0], logs[1]) is None, diff(logs[0], logs[1])

    fleet = SimFleet(4, {"/update_weights_from_disk": 0.2})
    weights = str(TinyCausalLM("tiny", seed=0).save_pretrained(tmp_path / "base"))

    async def sequential() -> None:
        launchers = [fleet.launcher(f"engine-{i}") for i in range(4)]
        urls = [await launcher.launch() for launcher in launchers]
        for i, url in enumerate(urls):  # the sequential baseline
            async with EngineClient(url, engine_id=f"engine-{i}", timeout=5.0) as client:
                await client.update_weights_from_disk(weights, weight_version="1")

    try:
        asyncio.run(sequential())
        assert fleet.peak()["/update_weights_from_disk"] == 1
    finally:
        fleet.close()
