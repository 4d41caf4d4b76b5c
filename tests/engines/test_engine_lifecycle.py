"""Engine slots on a real local Ray cluster, with real CPU engine processes: the commands' I/O.

Each command the core can hand an engine slot is carried out against a real server and reported
as the outcome the core understands -- ``ready``, ``loaded`` / ``refused``, ``done`` /
``request_failed``, ``dead`` -- with the effect visible on the server itself (``/model_info``,
``/server_info``). What the lifecycle does with the outcomes is tested in ``tests/rollout``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from engines.actor import RayLauncher
from engines.engine import Engine, Timeouts
from engines.models import TinyCausalLM
from engines.process import torch_engine_command

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _weights(tmp: Path, seed: int, version: str, size: str = "tiny") -> str:
    return str(TinyCausalLM(size, seed=seed).save_pretrained(tmp / f"step-{version}"))


def _engine(i: int) -> Engine:
    # a small per-token delay keeps requests in flight long enough to pause them
    launcher = RayLauncher(f"engine-{i}", lambda: torch_engine_command(seed=i, step_delay_s=0.01), startup_timeout=90)
    return Engine(f"engine-{i}", launcher, timeouts=Timeouts(request=20.0))


def _resident(info: object) -> int:
    """Bytes of weights + KV cache the engine reports as resident."""
    states = getattr(info, "internal_states", None) or [{}]
    state = states[0] if isinstance(states, list) else states
    if not isinstance(state, dict):
        state = dict(state)
    return int(state.get("weights_bytes", 0)) + int(state.get("kv_cache_bytes", 0))


@pytest.mark.memory
@pytest.mark.weight_update
def test_an_engine_slot_carries_out_every_command_and_reports_its_outcome(tmp_path: Path) -> None:
    async def run() -> None:
        engine = _engine(0)
        try:
            assert (await engine.launch()).name == "ready"
            client = engine.client
            assert client is not None

            v1 = _weights(tmp_path, 11, "v1")
            assert (await engine.load(v1, "v1")).name == "loaded"
            assert engine.weight_version == (await client.model_info()).weight_version == "v1"
            out = await client.generate("ab", sampling_params={"max_new_tokens": 4, "temperature": 0.0})
            assert out.meta_info.weight_version == "v1"

            # pause (retract mode) with a request in flight, then continue: it finishes completely
            greedy = {"max_new_tokens": 40, "temperature": 0.0, "ignore_eos": True}
            reference = await client.generate("ab", sampling_params=greedy)
            in_flight = asyncio.create_task(client.generate("ab", sampling_params=greedy))
            await asyncio.sleep(0.1)
            assert (await engine.pause_generation()).name == "done"
            paused = (await client.server_info()).internal_states[0]
            assert paused["paused"] and not in_flight.done()
            assert (await engine.continue_generation()).name == "done"
            finished = await asyncio.wait_for(in_flight, 30)
            assert finished.output_ids == reference.output_ids  # retracted, re-run, identical

            # memory: each tag really released, and restored
            before = await client.server_info()
            await engine.pause_generation()
            assert [(await engine.release(t)).name for t in ("weights", "kv_cache")] == ["done", "done"]
            released = await client.server_info()
            assert [(await engine.resume(t)).name for t in ("weights", "kv_cache")] == ["done", "done"]
            after = await client.server_info()
            assert _resident(released) < _resident(before) and _resident(after) == _resident(before)
            await engine.continue_generation()

            # a file of another model size is refused: the engine keeps v1 (and must not serve: the core's call)
            bad = _weights(tmp_path, 12, "small", size="small")
            refused = await engine.load(bad, "v2")
            assert refused.name == "refused" and bad in refused.reason
            assert (await client.model_info()).weight_version == "v1"

            # the kill is confirmed; a request to the dead server is a failed request, not an exception
            watch = asyncio.create_task(engine.launcher.watch())
            assert (await engine.kill()).name == "dead"
            assert "exit code" in await asyncio.wait_for(watch, 10)  # Ray's report of the death
            assert (await engine.continue_generation()).name == "request_failed"
            assert (await engine.load(v1, "v1")).name == "request_failed"
        finally:
            await engine.close()

    asyncio.run(run())


@pytest.mark.recovery
def test_a_start_that_cannot_succeed_is_start_failed_not_a_hang(tmp_path: Path) -> None:
    async def run() -> None:
        launcher = RayLauncher("engine-9", lambda: torch_engine_command(weights=tmp_path / "missing.safetensors"))
        engine = Engine("engine-9", launcher, timeouts=Timeouts(startup=30.0))
        try:
            outcome = await engine.launch()
            assert outcome.name == "start_failed" and "missing.safetensors" in outcome.reason
        finally:
            await engine.close()

    asyncio.run(run())
