"""An engine slot's duties, witnessed in seconds without a server: a stop counts only once the death is confirmed,
a weight load counts only once the server reports the version, and leaving the weight-update group reaches the
server. The core acts on these outcomes (``dead`` -> Stopped, ``loaded`` -> may serve), so a slot that reports
them too early lets the job route to a live zombie or to old weights. The same duties against real servers are
in ``test_engine_lifecycle.py`` and ``tests/rollout``."""

from __future__ import annotations

import asyncio
import sys
from types import SimpleNamespace
from typing import Any

from engines.api import SGLangAPI
from engines.engine import Engine
from engines.launcher import LocalLauncher
from engines.process import ServerProcess


class UnkillableLauncher:
    """A server that outlives its SIGKILL (uninterruptible sleep, an actor that cannot be reached)."""

    def __init__(self) -> None:
        self.kills = 0

    async def kill(self) -> None:
        self.kills += 1

    async def wait_dead(self, timeout: float) -> bool:
        return False

    def shutdown(self) -> None:
        pass


class RecordingClient:
    """The parts of ``EngineClient`` these duties use; ``holds`` is the version ``/model_info`` reports."""

    def __init__(self, holds: str | None) -> None:
        self.holds = holds
        self.calls: list[str] = []
        self.closed = False

    async def begin_weight_update(self, **kw: Any) -> None:
        self.calls.append("begin_weight_update")

    async def update_weights_from_disk(self, path: str, **kw: Any) -> None:
        self.calls.append("update_weights_from_disk")

    async def end_weight_update(self, **kw: Any) -> None:
        self.calls.append("end_weight_update")

    async def model_info(self) -> SimpleNamespace:
        self.calls.append("model_info")
        return SimpleNamespace(weight_version=self.holds)

    async def destroy_weights_update_group(self, **kw: Any) -> None:
        self.calls.append("destroy_weights_update_group")

    async def close(self) -> None:
        self.closed = True


def _engine(launcher: Any, client: RecordingClient | None) -> Engine:
    """A slot whose server speaks SGLang's API through ``client``."""
    engine = Engine("engine-0", launcher)
    if client is not None:
        api = SGLangAPI("http://127.0.0.1:9", engine_id="engine-0")
        api.client = client  # type: ignore[assignment]
        engine.server = api
    return engine


def test_a_kill_whose_death_is_not_confirmed_is_alive_not_dead() -> None:
    client = RecordingClient("1")
    engine = _engine(UnkillableLauncher(), client)
    outcome = asyncio.run(engine.kill())
    assert outcome.name == "alive" and "still alive" in outcome.reason  # the core fails the run on it
    assert engine.client is client and not client.closed  # nothing torn down as if it were gone


def test_a_process_that_has_not_exited_is_not_reported_dead() -> None:
    """The launcher's wait is bounded; running out of it means alive, and only an exit means dead."""
    launcher = LocalLauncher("engine-0", lambda: [sys.executable, "-c", "import time; time.sleep(60)"])
    launcher.process = ServerProcess(launcher.command(), engine_id="engine-0", url="http://127.0.0.1:1")
    launcher.process.spawn()
    try:
        assert asyncio.run(launcher.wait_dead(0.2)) is False and launcher.alive()
        asyncio.run(launcher.kill())
        assert asyncio.run(launcher.wait_dead(30.0)) is True and not launcher.alive()
    finally:
        launcher.process.close()


def test_a_load_counts_only_once_the_server_reports_the_version() -> None:
    stale = RecordingClient(holds="1")  # the server answered the update, but still holds version 1
    engine = _engine(UnkillableLauncher(), stale)
    outcome = asyncio.run(engine.load("/weights/step-2", "2"))
    assert outcome.name == "refused" and "'1', expected '2'" in outcome.reason  # it must not serve
    assert engine.weight_version is None and stale.calls == [
        "begin_weight_update",
        "update_weights_from_disk",
        "end_weight_update",
        "model_info",
    ]
    took = _engine(UnkillableLauncher(), RecordingClient(holds="2"))
    assert asyncio.run(took.load("/weights/step-2", "2")).name == "loaded" and took.weight_version == "2"


def test_leaving_the_weight_update_group_reaches_the_server() -> None:
    client = RecordingClient("1")
    asyncio.run(_engine(UnkillableLauncher(), client).leave_group(5.0))
    assert client.calls == ["destroy_weights_update_group"]
    asyncio.run(_engine(UnkillableLauncher(), None).leave_group(5.0))  # no server: already out, no error
