"""External engines (slime's ``--rollout-external-engine-addrs``): servers something else started.

The test starts two CPU engines itself, outside the rollout manager, and attaches them: they are probed,
routed and sent weights like the manager's own; a killed one is marked and let go (never restarted: its
port stays closed) with the fix in the event log, and the run goes on on the other; its owner restarts it
and ``start_engine`` attaches it again. Without rollout FT the run stops, naming the address and the fix.
The manager never kills them: they outlive its dispose.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from engines.engine import EngineFailed, Timeouts
from engines.models import TinyCausalLM
from engines.process import ServerProcess, torch_engine_command
from engines.router import router_available
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.events import EventLog, MemorySink
from lifecycle.decide.runner import Runner
from rollout.controller import ControllerError
from rollout.executor import RolloutManager
from rollout.pattern import PatternTask

from .conftest import bind_trainer_stand_in

TASK = PatternTask(prompts_per_step=2, group_size=2, response_len=4)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


def _listens(url: str) -> bool:
    try:
        _get(url + "/health")
    except OSError:
        return False
    return True


def _start(port: int = 0) -> ServerProcess:
    proc = ServerProcess(torch_engine_command(port=port, seed=0), engine_id=f"outside-{port}")
    proc.start(60.0)
    return proc


class Job:
    """A rollout manager attached to the given addresses, with a trainer stand-in writing real weights."""

    def __init__(self, flags: dict[str, Any], urls: list[str], tmp: Path, timeouts: Timeouts | None = None) -> None:
        self.config = LifecycleConfig.from_mapping({**flags, "rollout_external_engine_addrs": urls})
        self.loop = asyncio.new_event_loop()
        self.events = MemorySink()
        self.runner = Runner(self.config, log=EventLog([self.events]))
        # no launcher factory: every rollout engine is external, so none may be launched
        self.manager = RolloutManager(
            self.config, TASK, runner=self.runner, router=router_available(), log_dir=str(tmp), timeouts=timeouts
        )
        self.tmp, self.versions = tmp, 0
        bind_trainer_stand_in(self.runner, self.weights)
        self.run(self.runner.operate("trainer.start"))

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def weights(self) -> tuple[str, str]:
        path = self.tmp / f"step-{self.versions}"
        TinyCausalLM("tiny", seed=100 + self.versions).save_pretrained(path)
        self.versions += 1
        return str(path), str(self.versions - 1)

    def state(self, i: int) -> str:
        return self.runner.state.engines[i].state

    def moves(self, instance: str) -> list[str]:
        moves = [e for e in self.events if e.get("event") == "lifecycle.transition"]
        return [e["trigger"] for e in moves if e["instance"] == instance]

    def close(self) -> None:
        self.run(self.manager.dispose())
        self.loop.close()


FT = {
    "use_fault_tolerance": True,
    "ft_components": ["rollout"],
    "rollout_health_check_interval": 1.0,
    "rollout_health_check_timeout": 1.0,
    "rollout_health_check_failure_threshold": 1,
}


def test_external_engines_are_probed_routed_updated_let_go_and_attached_again(
    servers: list[ServerProcess], tmp_path: Path
) -> None:
    urls = [p.url for p in servers]
    job = Job(FT, urls, tmp_path)
    try:
        job.run(job.manager.init(job.weights()))
        samples = job.run(job.manager.generate(0))
        assert len(samples) == 4 and {s["weight_version"] for s in samples} == {"0"}
        job.run(job.runner.operate("update_weights"))  # the stand-in trainer's version 1, sent to both
        assert [_get(u + "/model_info")["weight_version"] for u in urls] == ["1", "1"]
        assert ("monitor", "create") in {(e.get("machine"), e.get("trigger")) for e in job.events}

        servers[1].kill()  # its owner's process dies
        servers[1].wait_dead(10.0)
        samples = job.run(job.manager.generate(1))  # the run goes on, on engine-0
        assert len(samples) == 4 and {s["weight_version"] for s in samples} == {"1"}
        assert job.state(1) == "Stopped" and job.state(0) == "Quiesced"
        assert "detach" in job.moves("engine-1")
        assert not {"recover", "restart"} & set(job.moves("engine-1")) and job.moves("engine-1").count("start") == 1
        assert not _listens(urls[1]), "the job must never start a server it does not own"
        detached = [e for e in job.events if e.get("event") == "engine.detached"]
        assert len(detached) == 1 and detached[0]["url"] == urls[1]
        assert urls[1] in detached[0]["fix"] and "start_engine(1)" in detached[0]["fix"]

        port = int(urls[1].rsplit(":", 1)[1])
        servers[1] = _start(port)  # its owner restarts it, at the same address
        job.run(job.manager.start_engine(1))
        assert job.state(1) == "PendingWeights"
        samples = job.run(job.manager.generate(2))  # caught up with the committed weights first
        assert {s["weight_version"] for s in samples} == {"1"}
        assert job.state(1) == "Quiesced" and _get(urls[1] + "/model_info")["weight_version"] == "1"
    finally:
        job.close()
    assert all(p.alive for p in servers), "dispose lets external engines go; it never kills them"


def test_without_rollout_ft_a_dead_external_engine_stops_the_run_naming_its_address(
    servers: list[ServerProcess], tmp_path: Path
) -> None:
    urls = [p.url for p in servers]
    job = Job({}, urls, tmp_path)
    try:
        job.run(job.manager.init(job.weights()))
        servers[0].kill()
        servers[0].wait_dead(10.0)
        with pytest.raises(EngineFailed) as info:
            job.run(job.manager.generate(0))
        message = str(info.value)
        assert "engine-0" in message and urls[0] in message and "never restarts" in message
        assert "Fix: restart the server at that address" in message
        assert "recover" not in job.moves("engine-0") and job.state(0) == "Failed"
    finally:
        job.close()
    assert servers[1].alive


def test_external_engine_addresses_are_checked_at_construction() -> None:
    with pytest.raises(ConfigError, match=r"--rollout-external-engine-addrs.*not an engine address"):
        LifecycleConfig.from_mapping({"rollout_external_engine_addrs": ["127.0.0.1"]})
    with pytest.raises(ConfigError, match="listed twice"):
        LifecycleConfig.from_mapping({"rollout_external_engine_addrs": "127.0.0.1:1,http://127.0.0.1:1"})
    with pytest.raises(ConfigError, match="--debug-train-only"):
        LifecycleConfig.from_mapping({"rollout_external_engine_addrs": ["h:1"], "debug_train_only": True})
    config = LifecycleConfig.from_mapping({"rollout_external_engine_addrs": ["h:1", "h:2"], "rollout_num_gpus": 8})
    assert config.num_rollout_engines == 2 and any("ignored" in w for w in config.warnings)
    assert LifecycleConfig.from_args(config.to_flags()) == config


def test_an_external_address_nothing_answers_at_fails_the_start_naming_it(
    servers: list[ServerProcess], tmp_path: Path
) -> None:
    url = servers[1].url
    servers[1].kill()
    servers[1].wait_dead(10.0)
    job = Job(FT, [servers[0].url, url], tmp_path, Timeouts(startup=2.0))
    try:
        with pytest.raises(ControllerError) as info:
            job.run(job.manager.init(job.weights()))
    finally:
        job.close()
    message = str(info.value)
    assert message.startswith(f"the rollout servers did not start: engine-1 (external engine at {url}): did not start")
    assert f"Fix: start the server at {url}" in message and "engine-0" not in message
    assert not _listens(url)
