"""A third engine backend is one row plus one package: ``tests/engines/third_backend`` (``tertius``: the CPU engine
run as a program of its own, behind an API of its own) is registered from here, and then a config names it, an
engine slot of it starts, probes, generates and loads weights from disk, and a job runs a step on it -- with no
edit anywhere in the four packages, which never name it.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from engines import backends
from engines.backends import engine_backend
from engines.engine import Engine, Timeouts
from engines.launcher import EngineSetup, LocalLauncher
from engines.models import TinyCausalLM
from lifecycle import LifecycleConfig
from lifecycle.decide.backends import CAPABILITIES
from lifecycle.decide.errors import ConfigError
from rollout.pattern import PatternTask
from trainer.app.job import Job, default_timeouts
from trainer.app.options import RunOptions

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PACKAGES = ("lifecycle", "engines", "rollout", "trainer")


@pytest.fixture
def third(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The package, importable as a user's own would be (not registered yet); the tables as they were after."""
    monkeypatch.syspath_prepend(str(HERE))
    module = importlib.import_module("third_backend")
    module.CALLS.clear()
    rows, abilities = dict(backends.BACKENDS), dict(CAPABILITIES)
    yield module
    backends.BACKENDS.clear()
    backends.BACKENDS.update(rows)
    CAPABILITIES.clear()
    CAPABILITIES.update(abilities)


def _cmdline(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def test_registering_its_row_makes_it_a_backend_the_config_and_the_job_read(third: ModuleType) -> None:
    with pytest.raises(ConfigError, match="--rollout-backend") as refused:
        LifecycleConfig.from_mapping({"rollout_backend": "tertius", "rollout_num_gpus": 1})
    assert "not one of sglang, vllm" in str(refused.value)
    third.register_tertius()
    config = LifecycleConfig.from_mapping({"rollout_backend": "tertius", "rollout_num_gpus": 1})
    assert engine_backend("tertius") is third.ROW
    assert default_timeouts(config).startup == third.STARTUP  # the job's start-up bound is the row's
    assert config.rollout_health_check_endpoint == "health_generate"  # its abilities, read by the core
    with pytest.raises(ConfigError, match="not one of sglang, vllm, tertius"):
        LifecycleConfig.from_mapping({"rollout_backend": "tertiu"})


def test_no_module_of_the_four_packages_names_it() -> None:
    """The backend needed no edit of the project: its name is nowhere in it."""
    named = [
        p.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if "tertius" in p.read_text().lower()
    ]
    assert not named, named


def test_an_engine_slot_of_it_starts_probes_generates_and_loads_weights_from_disk(
    third: ModuleType, tmp_path: Path
) -> None:
    third.register_tertius()
    launchers = engine_backend("tertius").launchers(EngineSetup("local", seed=0))

    async def run() -> None:
        engine = Engine("engine-0", launchers("engine-0"), timeouts=Timeouts(startup=60.0, request=20.0))
        try:
            assert (await engine.launch()).name == "ready"
            launcher = engine.launcher
            assert isinstance(launcher, LocalLauncher) and launcher.process is not None
            assert str(third.SERVER) in _cmdline(launcher.process.pid)  # its own program, not -m engines.cpu
            assert (await engine.probe(10.0)).name == "probe_ok"
            client = engine.client
            assert client is not None
            out = await client.generate("ab", sampling_params={"max_new_tokens": 3, "temperature": 0.0})
            assert len(out.output_ids) == 3
            weights = str(TinyCausalLM("tiny", seed=11).save_pretrained(tmp_path / "step-1"))
            assert (await engine.load(weights, "1")).name == "loaded"
            assert engine.weight_version == "1"
            out = await client.generate("ab", sampling_params={"max_new_tokens": 3, "temperature": 0.0})
            assert out.meta_info.weight_version == "1"
            assert (await engine.kill()).name == "dead"
        finally:
            await engine.close()

    asyncio.run(run())
    assert third.CALLS == ["ready", "probe", "load"]  # the row's API carried out the slot's commands


@pytest.mark.usefixtures("ray_cluster")
def test_a_job_runs_a_step_on_it(third: ModuleType, tmp_path: Path) -> None:
    """The job launches the row's servers, loads its weights through the row's API, and updates them."""
    third.register_tertius()
    config = LifecycleConfig.from_mapping({"rollout_backend": "tertius", "rollout_num_gpus": 1})
    job = Job(config, PatternTask(), run_dir=tmp_path, options=RunOptions(launcher="local", steps=1, events=None))
    seen: dict[str, object] = {}

    async def loop() -> None:
        async with job:
            samples = await job.generate(0)
            await job.train(samples)
            await job.update_weights(1)
            (engine,) = job.manager.controller.engines
            launcher = engine.launcher
            assert isinstance(launcher, LocalLauncher) and launcher.process is not None
            seen.update(cmdline=_cmdline(launcher.process.pid), version=engine.weight_version, samples=len(samples))

    asyncio.run(loop())
    assert str(third.SERVER) in seen["cmdline"]  # type: ignore[operator]
    assert seen["version"] == "1" and seen["samples"]
    assert job.timeouts.startup == third.STARTUP
    assert third.CALLS.count("load") == 2, third.CALLS  # the initial weights, then step 1's
