"""--rollout-health-check-endpoint: the monitor's probe calls the configured SGLang endpoint.

A real aiohttp server on 127.0.0.1 records the paths it is asked for; both endpoints answer as
SGLang's contract says (200 with an empty body when healthy).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from engines.api import SGLangAPI
from engines.client import EngineClient
from engines.launcher import LocalLauncher
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.runner import Runner
from rollout.executor import RolloutManager
from rollout.pattern import PatternTask

from .conftest import bind_trainer_stand_in


def _config(**kw: object) -> LifecycleConfig:
    return LifecycleConfig.from_mapping({"use_fault_tolerance": True, "rollout_num_gpus": 1, **kw}, check_paths=False)


async def _recording_server(seen: list[str]) -> AsyncIterator[str]:
    async def ok(request: web.Request) -> web.Response:
        seen.append(request.path)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_get("/health", ok)
    app.router.add_get("/health_generate", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _probe_paths(config: LifecycleConfig) -> list[str]:
    """One probe round of the controller's monitor against an engine slot made as the config says."""
    seen: list[str] = []
    gen = _recording_server(seen)
    url = await gen.__anext__()
    runner = Runner(config)
    bind_trainer_stand_in(runner)
    manager = RolloutManager(
        config, PatternTask(), runner=runner, launcher_factory=lambda i: LocalLauncher(i, lambda: ["true"])
    )
    controller = manager.controller
    engine = controller.new_engine("engine-0")
    engine.server = SGLangAPI(url, engine_id="engine-0", timeout=2.0)
    controller._monitor_add(engine)
    await controller.monitor.probe_round()
    await engine.client.close()
    await gen.aclose()
    return seen


@pytest.mark.parametrize(
    ("value", "path"),
    [
        (None, "/health_generate"),
        ("health_generate", "/health_generate"),
        ("health", "/health"),
        ("/health", "/health"),
    ],
)
@pytest.mark.monitor
def test_probe_uses_the_configured_endpoint(value: str | None, path: str) -> None:
    config = _config() if value is None else _config(rollout_health_check_endpoint=value)
    assert asyncio.run(_probe_paths(config)) == [path]


def test_a_bad_endpoint_names_the_flag_and_the_choices() -> None:
    with pytest.raises(ConfigError) as err:
        _config(rollout_health_check_endpoint="helth")
    text = str(err.value)
    assert "--rollout-health-check-endpoint" in text and "did you mean 'health'" in text
    assert "health_generate" in text


@pytest.mark.recovery
@pytest.mark.monitor
def test_cpu_engine_follows_sglangs_health_env_switch() -> None:
    """SGLang: /health runs a generation unless SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION=false."""
    import os

    from engines.errors import EngineHTTPError
    from engines.process import ServerProcess, torch_engine_command

    async def statuses(url: str) -> tuple[bool, bool]:
        client = EngineClient(url, engine_id="e", timeout=10.0)
        try:
            await client.release_memory_occupation(["weights"])
            results = []
            for call in (client.health, client.health_generate):
                try:
                    await call(timeout=5.0)
                    results.append(True)
                except EngineHTTPError as exc:
                    assert exc.status == 503
                    results.append(False)
            return results[0], results[1]
        finally:
            await client.close()

    seen = {}
    for switch in ("true", "false"):
        env = {**os.environ, "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": switch}
        proc = ServerProcess(torch_engine_command(seed=1), engine_id=f"health-{switch}", env=env)
        try:
            url = proc.start(90.0)
            seen[switch] = asyncio.run(statuses(url))
        finally:
            proc.kill()
            proc.wait_dead(10.0)
    assert seen["true"] == (False, False)  # weights released: no generation possible on either endpoint
    assert seen["false"] == (True, False)  # /health only says "up"; /health_generate still generates
