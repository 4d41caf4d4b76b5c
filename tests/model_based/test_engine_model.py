"""Model-based test: random engine events and faults against a real engine in a real Ray actor.

Each rule is one controller verb (or a fault); its precondition is the engine spec's own table
(the event must be allowed in the predicted state). After every step the runtime machine's state
must equal the spec's prediction, and what the real server reports must agree with it: a Serving
engine serves the weight version last loaded, an offloaded one holds no weights, a stopped one
has no process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engines.actor import RayLauncher
from engines.engine import Engine
from engines.process import torch_engine_command
from lifecycle import ENGINE, LifecycleConfig
from lifecycle.spec import Step
from models import TinyCausalLM

pytestmark = [pytest.mark.usefixtures("ray_cluster"), pytest.mark.slow]

CONFIG = LifecycleConfig.from_mapping(
    {"use_fault_tolerance": True, "rollout_num_gpus": 1, "engine_restart_backoff": 0.01, "engine_max_restarts": 50},
    check_paths=False,
)
TABLE = ENGINE.compile(CONFIG)
# The triggers each Engine verb fires, in order (the runtime's contract with the spec).
VERBS = {
    "start": ("start", "ready"),
    "load_weights": ("begin_update", "finish_update"),
    "resume": ("resume",),
    "drain": ("drain",),
    "offload": ("offload",),
    "onload_weights": ("onload_weights",),
    "onload_kv": ("onload_kv",),
    "kill_and_detect": ("mark_unhealthy",),
    "recover": ("recover", "restart", "ready"),
    "stop": ("stop", "confirm_dead"),
}


def predict(state: str, verb: str) -> str | None:
    """The state the spec predicts after ``verb``, or None if the spec does not allow it."""
    for trigger in VERBS[verb]:
        out = TABLE.step(state, trigger)
        if not isinstance(out, Step):
            return None
        state = out.dest
    return state


class EngineModel(RuleBasedStateMachine):
    weights_dir: Path

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        launcher = RayLauncher("mb-engine", lambda: torch_engine_command(seed=5), startup_timeout=90)
        self.engine = Engine("mb-engine", CONFIG, launcher)
        self.predicted = "Init"
        self.version = 0
        self.loaded: str | None = None

    def run(self, coro: object) -> object:
        return self.loop.run_until_complete(coro)  # type: ignore[arg-type]

    def step(self, verb: str, *args: object) -> None:
        expected = predict(self.predicted, verb)
        assert expected is not None
        self.run(getattr(self.engine, verb)(*args) if verb != "kill_and_detect" else self._kill())
        self.predicted = expected

    async def _kill(self) -> None:
        await self.engine.launcher.kill()
        await self.engine.mark_unhealthy("process killed")

    def can(self, verb: str) -> bool:
        return predict(self.predicted, verb) is not None

    @precondition(lambda self: self.can("start"))
    @rule()
    def start(self) -> None:
        self.step("start")
        self.loaded = None

    @precondition(lambda self: self.can("load_weights"))
    @rule()
    def load_weights(self) -> None:
        self.version += 1
        path = self.weights_dir / f"w{self.version % 2}.safetensors"
        self.step("load_weights", str(path), f"v{self.version}")
        self.loaded = f"v{self.version}"

    @precondition(lambda self: self.can("resume"))
    @rule()
    def resume(self) -> None:
        self.step("resume")

    @precondition(lambda self: self.can("drain"))
    @rule()
    def drain(self) -> None:
        self.step("drain")

    @precondition(lambda self: self.can("offload"))
    @rule()
    def offload(self) -> None:
        self.step("offload")

    @precondition(lambda self: self.can("onload_weights"))
    @rule()
    def onload_weights(self) -> None:
        self.step("onload_weights")

    @precondition(lambda self: self.can("onload_kv"))
    @rule()
    def onload_kv(self) -> None:
        self.step("onload_kv")

    @precondition(lambda self: self.can("kill_and_detect") and self.engine.launcher.alive())
    @rule()
    def kill(self) -> None:
        self.step("kill_and_detect")

    @precondition(lambda self: self.can("recover"))
    @rule()
    def recover(self) -> None:
        self.step("recover")
        self.loaded = None

    @precondition(lambda self: self.can("stop"))
    @rule()
    def stop(self) -> None:
        self.step("stop")

    @invariant()
    def runtime_state_equals_the_spec_prediction(self) -> None:
        assert self.engine.state == self.predicted

    @invariant()
    def the_real_server_agrees(self) -> None:
        state = self.engine.state
        client = self.engine.client
        if state == "Serving":
            assert self.loaded is not None  # only an engine holding the current weights serves
            assert client is not None
            out = self.run(client.generate("ab", sampling_params={"max_new_tokens": 2, "temperature": 0.0}))
            assert out.meta_info.weight_version == self.loaded  # type: ignore[attr-defined]
        elif state in ("Offloaded", "WeightsOnly"):
            assert client is not None
            memory = self.run(client.server_info()).internal_states[0]  # type: ignore[attr-defined]
            assert memory["kv_cache_bytes"] == 0
            assert (memory["weights_bytes"] == 0) == (state == "Offloaded")
        elif state == "Stopped":
            assert not self.engine.launcher.alive()

    def teardown(self) -> None:
        try:
            if self.engine.state not in ("Init", "Stopped", "Failed") and self.engine.launcher.alive():
                self.run(self.engine.launcher.kill())
            if self.engine.client is not None:
                self.run(self.engine.client.close())
        finally:
            self.engine.launcher.shutdown()  # type: ignore[attr-defined]
            self.loop.close()


def test_engine_runtime_follows_the_spec_on_a_real_actor(tmp_path):
    for i in range(2):
        TinyCausalLM("tiny", seed=100 + i).save_weights(tmp_path / f"w{i}.safetensors")
    EngineModel.weights_dir = tmp_path
    run = EngineModel.TestCase
    run.settings = settings(
        max_examples=3,
        stateful_step_count=12,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    run().runTest()
