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
from lifecycle.config import LifecycleConfig
from lifecycle.events import EventLog, MemorySink
from lifecycle.runner import Runner
from models import TinyCausalLM
from models.family import load_tokenizer
from rollout.executor import RolloutManager
from rollout.pattern import PatternTask
from sim_engine.launcher import SimFleet

from ..rollout.conftest import bind_trainer_stand_in


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
