"""External vLLM servers (``--rollout-external-engine-addrs`` with ``--rollout-backend vllm``) that are not what
the job needs, and one replaced behind its address (issue 41, causes 8 and 13), on real servers.

Slow: four vLLM servers start one after another (25-60 s each on 2 cores). Each misconfiguration fails the
start with one error naming the engine, its address, what was expected, what was found and the fix: a server
without ``VLLM_SERVER_DEV_MODE=1`` (its ``/weight_info`` is missing), one without the project's weight transfer
(vLLM: "Weight transfer not configured"), one serving another model than the job's weights (the transfer's
staged check refuses them). And a server restarted by its owner at the same address comes back with its base
weights (``/weight_info`` "default"): its Prometheus ``process_start_time_seconds`` changed, so the lifecycle
attaches it as a new generation and loads the committed weights into it before routing it -- no sample of the
base weights reaches the trainer.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers", reason="the hf extra is not installed: pip install 'rl-lifecycle[hf]'")

from engines.engine import Timeouts
from engines.models import build_tiny_llama
from engines.process import ServerProcess
from engines.vllm.launcher import DEV_MODE, server_env, vllm_command
from rollout.controller import ControllerError
from tests.helpers import free_port

from .test_external import Job

pytestmark = pytest.mark.slow

SIZES = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 256}
OTHER = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 128}
TIMEOUTS = Timeouts(startup=30.0, request=60.0)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    where = tmp_path_factory.mktemp("external-vllm")
    return {"a": build_tiny_llama(where / "a", seed=0, **SIZES), "other": build_tiny_llama(where / "o", **OTHER)}


def _server(
    python: str, model: Path, *, port: int | None = None, dev_mode: bool = True, transfer: bool = True
) -> ServerProcess:
    """A vLLM server started as its owner would (not by the job), with or without what the lifecycle needs."""
    port = port or free_port()
    cmd = vllm_command(model, port, python=python)
    if not transfer:
        k = cmd.index("--weight-transfer-config")
        del cmd[k : k + 2]
    env = {k: v for k, v in os.environ.items() if k != "VLLM_SERVER_DEV_MODE"}
    env |= {k: v for k, v in server_env().items() if dev_mode or k not in DEV_MODE}
    proc = ServerProcess(cmd, engine_id=f"owner-{port}", url=f"http://127.0.0.1:{port}", env=env)
    proc.start(300.0)
    return proc


class VLLMJob(Job):
    """The rollout manager attached to vLLM servers; the trainer stand-in hands over ``checkpoint``."""

    def __init__(self, urls: list[str], tmp: Path, checkpoint: Path) -> None:
        self.checkpoint = checkpoint
        super().__init__({"rollout_backend": "vllm"}, urls, tmp, TIMEOUTS)

    def weights(self) -> tuple[str, str]:
        self.versions += 1
        return str(self.checkpoint), str(self.versions - 1)


def _start_error(urls: list[str], tmp: Path, checkpoint: Path) -> str:
    job = VLLMJob(urls, tmp, checkpoint)
    try:
        with pytest.raises(ControllerError) as info:
            job.run(job.manager.init(job.weights()))
    finally:
        job.close()
    return str(info.value)


def _weight_info(url: str) -> Any:
    with urllib.request.urlopen(url + "/weight_info", timeout=10) as resp:
        return json.loads(resp.read())["weight_version"]


def test_a_vllm_server_without_dev_mode_is_named_with_the_fix(
    vllm_python: str, models: dict[str, Path], tmp_path: Path
) -> None:
    proc = _server(vllm_python, models["a"], dev_mode=False)
    try:
        message = _start_error([proc.url], tmp_path, models["a"])
    finally:
        proc.kill()
    assert f"engine-0 (external engine at {proc.url})" in message
    assert "expected a vLLM server started with VLLM_SERVER_DEV_MODE=1" in message
    assert "found HTTP 404 at /weight_info: it is a vLLM server (version 0.32.0)" in message
    assert "started with VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config" in message


def test_a_vllm_server_without_the_weight_transfer_is_named_with_the_fix(
    vllm_python: str, models: dict[str, Path], tmp_path: Path
) -> None:
    proc = _server(vllm_python, models["a"], transfer=False)
    try:
        message = _start_error([proc.url], tmp_path, models["a"])
    finally:
        proc.kill()
    assert f"engine-0 (external engine at {proc.url}, while LoadingWeights)" in message
    assert "expected a vLLM server with the lifecycle's weight transfer" in message
    assert "found a server started without a weight transfer engine" in message
    assert "Fix: restart it with --weight-transfer-config" in message


@pytest.fixture(scope="module")
def served(vllm_python: str, models: dict[str, Path]) -> Iterator[list[ServerProcess]]:
    """A properly started server (restarted by the test that replaces it; killed at the end)."""
    procs = [_server(vllm_python, models["a"])]
    yield procs
    for p in procs:
        if p.alive:
            p.kill()


def test_a_vllm_server_on_another_model_is_named_with_the_fix(
    served: list[ServerProcess], models: dict[str, Path], tmp_path: Path
) -> None:
    url = served[0].url
    message = _start_error([url], tmp_path, models["other"])
    assert f"engine-0 (external engine at {url}, while LoadingWeights)" in message
    assert str(models["other"]) in message  # the weights it refused, and vLLM's own reason
    assert "started on the checkpoint given as --hf-checkpoint" in message
    assert _weight_info(url) == "default", "the refused weights were not published"


def test_a_vllm_server_replaced_behind_its_address_is_caught_up_before_it_is_routed(
    served: list[ServerProcess], vllm_python: str, models: dict[str, Path], tmp_path: Path
) -> None:
    url = served[0].url
    job = VLLMJob([url], tmp_path, models["a"])
    try:
        job.run(job.manager.init(job.weights()))
        job.run(job.manager.generate(0))
        job.run(job.runner.operate("update_weights"))
        assert _weight_info(url) == "1"
        first = job.manager.controller.engines[0].identity
        assert first is not None and first.startswith("process_start_time_seconds")

        port = int(url.rsplit(":", 1)[1])
        served[0].kill()  # its owner restarts it at the same address: base weights, /weight_info "default"
        served[0].wait_dead(30.0)
        served[0] = _server(vllm_python, models["a"], port=port)
        assert _weight_info(url) == "default"

        samples = job.run(job.manager.generate(1))
        assert {s["weight_version"] for s in samples} == {"1"}, "a sample of the base weights"
        assert _weight_info(url) == "1"
        engine = job.manager.controller.engines[0]
        assert engine.identity != first and job.runner.state.engines[0].epoch == 2
        assert job.manager.controller.replacements == {"engine-0": 1}
    finally:
        job.close()
