"""Engine slots on a real local Ray cluster, with real CPU engine processes.

Start two engines, load weights (the version changes and /model_info reports it), route, offload
and onload (memory really released), kill one process: Ray reports the death at once, the monitor
marks it Unhealthy and, with rollout FT, it comes back to Serving with the current weights; with
train-only FT it is not recovered and the error says why.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from engines.actor import RayLauncher
from engines.engine import Engine, EngineFailed
from engines.health import create_monitor
from engines.process import torch_engine_command
from lifecycle import EffectLedger, LifecycleConfig
from models import TinyCausalLM

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _config(**kw: object) -> LifecycleConfig:
    base = {
        "use_fault_tolerance": True,
        "rollout_num_gpus": 2,
        "engine_restart_backoff": 0.05,
        "rollout_health_check_interval": 0.5,
        "rollout_health_check_timeout": 0.5,
    }
    return LifecycleConfig.from_mapping({**base, **kw}, check_paths=False)


def _weights(tmp: Path, seed: int, version: str) -> str:
    path = tmp / f"weights-{version}.safetensors"
    TinyCausalLM("tiny", seed=seed).save_weights(path)
    return str(path)


def _engine(i: int, config: LifecycleConfig, ledger: EffectLedger) -> Engine:
    # a small per-token delay keeps requests in flight long enough to pause them
    launcher = RayLauncher(f"engine-{i}", lambda: torch_engine_command(seed=i, step_delay_s=0.01), startup_timeout=90)
    return Engine(f"engine-{i}", config, launcher, ledger=ledger)


async def _serving(engines: list[Engine], path: str, version: str) -> None:
    await asyncio.gather(*(e.start() for e in engines))
    assert [e.state for e in engines] == ["PendingWeights"] * len(engines)
    for e in engines:
        await e.load_weights(path, version)
        await e.resume()
    assert all(e.routable for e in engines)


@pytest.mark.recovery
@pytest.mark.memory
def test_two_engines_serve_offload_onload_and_recover_from_a_kill(tmp_path):
    async def run() -> None:
        ledger = EffectLedger()
        config = _config()
        engines = [_engine(i, config, ledger) for i in range(2)]
        v1 = _weights(tmp_path, 11, "v1")
        await _serving(engines, v1, "v1")
        client = engines[0].client
        assert client is not None
        assert (await client.model_info()).weight_version == "v1"
        out = await client.generate("ab", sampling_params={"max_new_tokens": 4, "temperature": 0.0})
        assert out.meta_info.weight_version == "v1"

        # pause (drain, retract mode) with a request in flight, then continue: it finishes completely
        greedy = {"max_new_tokens": 40, "temperature": 0.0, "ignore_eos": True}
        reference = await client.generate("ab", sampling_params=greedy)
        in_flight = asyncio.create_task(client.generate("ab", sampling_params=greedy))
        await asyncio.sleep(0.1)
        await engines[0].drain(mode="retract")
        paused = (await client.server_info()).internal_states[0]
        assert paused["paused"] and not in_flight.done() and not engines[0].routable
        await engines[0].resume()
        finished = await asyncio.wait_for(in_flight, 30)
        assert finished.output_ids == reference.output_ids  # retracted, re-run, identical
        assert finished.meta_info.completion_tokens == 40

        # offload really releases memory, onload restores exactly that
        before = await client.server_info()
        await engines[0].drain()
        await engines[0].offload()
        released = await client.server_info()
        await engines[0].onload_weights()
        await engines[0].onload_kv()
        await engines[0].resume()
        after = await client.server_info()
        assert _resident(released) < _resident(before)
        assert _resident(after) == _resident(before)

        # a new weight version
        v2 = _weights(tmp_path, 12, "v2")
        for e in engines:
            await e.drain()
            await e.load_weights(v2, "v2")
            await e.resume()
        assert (await engines[1].client.model_info()).weight_version == "v2"  # type: ignore[union-attr]

        # kill engine-1's process: Ray's watch reports it at once; the monitor marks; FT recovers
        marked: list[str] = []
        monitor = await create_monitor(config, "rollout", lambda eid, why: marked.append(eid), ledger=ledger)
        assert monitor is not None
        watch = asyncio.create_task(engines[1].launcher.watch())
        await asyncio.sleep(0.2)
        t0 = time.perf_counter()
        await engines[1].launcher.kill()
        reason = await asyncio.wait_for(watch, 10)
        await monitor.engine_died("engine-1", reason)
        await engines[1].mark_unhealthy(reason)
        detected = time.perf_counter() - t0
        assert marked == ["engine-1"] and engines[1].state == "Unhealthy"
        assert detected < 2.0
        assert not engines[1].routable
        await engines[1].recover()
        assert engines[1].state == "PendingWeights" and not engines[1].routable
        await engines[1].load_weights(v2, "v2")
        await engines[1].resume()
        assert engines[1].routable
        assert (await engines[1].client.model_info()).weight_version == "v2"  # type: ignore[union-attr]
        assert ledger.count("recover_engine") == 1

        for e in engines:
            await e.stop()
            assert e.state == "Stopped" and not e.launcher.alive()
            e.launcher.shutdown()  # type: ignore[attr-defined]
        await monitor.stop()

    asyncio.run(run())


def _resident(info: object) -> int:
    """Bytes of weights + KV cache the engine reports as resident."""
    states = getattr(info, "internal_states", None) or [{}]
    state = states[0] if isinstance(states, list) else states
    if not isinstance(state, dict):
        state = dict(state)
    return int(state.get("weights_bytes", 0)) + int(state.get("kv_cache_bytes", 0))


@pytest.mark.recovery
@pytest.mark.lifecycle_gate
def test_train_only_ft_does_not_recover_and_says_why(tmp_path):
    async def run() -> None:
        config = _config(ft_components=["train"])
        engine = _engine(0, config, EffectLedger())
        await engine.start()
        await engine.launcher.kill()
        await engine.mark_unhealthy("process died: exit code -9")
        with pytest.raises(EngineFailed) as info:
            await engine.recover()
        assert engine.state == "Failed"
        assert "rollout fault tolerance is off" in str(info.value) and "engine-0" in str(info.value)
        assert engine.machine.ledger.count("recover_engine") == 0
        engine.launcher.shutdown()  # type: ignore[attr-defined]

    asyncio.run(run())
