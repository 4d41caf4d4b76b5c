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

from engines.api import SGLangAPI, sglang_api
from engines.engine import Engine
from engines.errors import EngineHTTPError
from engines.launcher import LocalLauncher
from engines.process import ServerProcess


class UnkillableLauncher:
    """A server that outlives its SIGKILL (uninterruptible sleep, an actor that cannot be reached)."""

    api = staticmethod(sglang_api)
    api_key = None

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
        self.refuse = False

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

    async def release_memory_occupation(self, tags: list[str] | None, **kw: Any) -> None:
        self.calls.append(f"release_memory_occupation {tags}")
        await asyncio.sleep(0.01)  # a request takes a while: siblings started later must not send their own
        if self.refuse:
            raise EngineHTTPError("engine-0", "/release_memory_occupation", 400, "refused")

    async def resume_memory_occupation(self, tags: list[str] | None, **kw: Any) -> None:
        self.calls.append(f"resume_memory_occupation {tags}")

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


async def _offload(engine: Engine) -> list[Any]:
    """What the runner does with an offload's two commands for one engine: both started at once (gather)."""
    return list(await asyncio.gather(engine.release("weights"), engine.release("kv_cache")))


def test_an_offloads_two_release_commands_go_out_as_one_request_carrying_both_tags() -> None:
    """miles releases everything in one call: the core's release_weights and release_kv_cache commands, handed
    out together, reach the server as ONE /release_memory_occupation with both tags; each command still has its
    own outcome and its own fact (the event log names each tag)."""
    client = RecordingClient("1")
    outcomes = asyncio.run(_offload(_engine(UnkillableLauncher(), client)))
    assert client.calls == ["release_memory_occupation ['weights', 'kv_cache']"]
    assert [o.name for o in outcomes] == ["done", "done"]
    assert [dict(o.facts[0].fields)["tag"] for o in outcomes] == ["weights", "kv_cache"]

    client = RecordingClient("1")  # commands given in the other order: weights still first on the wire
    engine = _engine(UnkillableLauncher(), client)

    async def reversed_order() -> None:
        await asyncio.gather(engine.release("kv_cache"), engine.release("weights"))

    asyncio.run(reversed_order())
    assert client.calls == ["release_memory_occupation ['weights', 'kv_cache']"]

    client = RecordingClient("1")  # one after another (not one step's commands): a request each
    engine = _engine(UnkillableLauncher(), client)

    async def one_by_one() -> None:
        await engine.release("weights")
        await engine.release("kv_cache")
        await engine.resume("weights")

    asyncio.run(one_by_one())
    assert client.calls == [
        "release_memory_occupation ['weights']",
        "release_memory_occupation ['kv_cache']",
        "resume_memory_occupation ['weights']",
    ]


def test_a_refused_joint_release_fails_both_commands() -> None:
    client = RecordingClient("1")
    client.refuse = True
    outcomes = asyncio.run(_offload(_engine(UnkillableLauncher(), client)))
    assert len(client.calls) == 1
    assert [o.name for o in outcomes] == ["request_failed", "request_failed"]
    assert all("refused" in o.reason for o in outcomes)
    assert [dict(o.facts[0].fields)["outcome"] for o in outcomes] == ["request_failed", "request_failed"]


def test_a_joint_release_cancelled_ends_every_command_it_carried() -> None:
    """The runner cancels what is out when its caller gives up: no sibling command is left waiting for ever."""
    client = RecordingClient("1")
    engine = _engine(UnkillableLauncher(), client)

    async def cancelled() -> list[Any]:
        tasks = [asyncio.ensure_future(engine.release(t)) for t in ("weights", "kv_cache")]
        await asyncio.sleep(0.001)  # the request is out
        tasks[0].cancel()
        return list(await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5.0))

    results = asyncio.run(cancelled())
    assert all(isinstance(r, asyncio.CancelledError) for r in results), results
    assert engine._batches == {}
