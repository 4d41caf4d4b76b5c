"""A failed request names the process it was sent to: the routing reads the engine's generation (``Engine.epoch``)
when it sends, so a failure that comes back after the engine's process was replaced reports the old generation,
which the core fences (``tests/rollout/test_controller.py``: a late ``request_failed`` about a replaced process
leaves the new one serving). Without it the old process's failure marked the new one Unhealthy."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from engines.errors import EngineHTTPError, EngineUnreachable
from engines.router import GatewayWorker
from rollout.routing import GenRequest, LocalRouting, RouterRouting

REQUESTS = [GenRequest(k, f"p{k}", {}) for k in range(2)]


def _engine(i: int, client: Any = None) -> Any:
    url = f"http://127.0.0.1:{30000 + i}/"
    fields = {"url": url, "api_key": None, "server": None, "weight_version": "0", "epoch": 1}
    return SimpleNamespace(id=f"engine-{i}", client=client, **fields)


class ReplacedWhileOut:
    """The engine's slot relaunches its process while the batch is out (the epoch moves on), then the old
    process's connection drops."""

    def __init__(self) -> None:
        self.engine: Any = None

    async def generate_batch(self, texts: list[str], **kw: Any) -> list[Any]:
        self.engine.epoch += 1
        raise EngineUnreachable(self.engine.id, "/generate", "connection reset")


def test_a_failed_batch_names_the_generation_it_was_sent_to() -> None:
    client = ReplacedWhileOut()
    engine = client.engine = _engine(0, client)
    heard: list[tuple[str, int | None]] = []

    async def on_unhealthy(engine_id: str, reason: str, epoch: int | None = None) -> None:
        heard.append((engine_id, epoch))

    async def run() -> None:
        routing = LocalRouting()
        assert (await routing.publish(engine)).name == "done"
        await routing.generate(REQUESTS, on_unhealthy, logprobs=False, max_tries=1)

    asyncio.run(run())
    assert engine.epoch == 2  # replaced while the batch was out
    assert heard == [("engine-0", 1)]  # the failure is the old process's


class ListingRouter:
    alive = True
    request_timeout = 5.0

    def __init__(self) -> None:
        self.listed: set[str] = set()

    async def add(self, url: str, **kw: Any) -> None:
        self.listed.add(url.rstrip("/"))

    async def remove(self, url: str, **kw: Any) -> None:
        self.listed.discard(url.rstrip("/"))

    async def workers(self) -> dict[str, GatewayWorker]:
        return {url: GatewayWorker(url, url, "ready", "0") for url in self.listed}


class FailingUpstream:
    """The gateway answers 502 naming the engine's URL (SMG's way of pinning a failure on a worker), after the
    engine's process was replaced."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    async def generate(self, text: str, **kw: Any) -> Any:
        self.engine.epoch += 1
        raise EngineHTTPError("router-rollout", "/generate", 502, f"upstream {self.engine.url}generate: reset")


def test_a_failure_the_gateway_pins_on_an_engine_names_the_generation_it_was_sent_to() -> None:
    async def never(reason: str) -> None:
        raise AssertionError(reason)

    engine = _engine(0)
    routing = RouterRouting("router-rollout", on_death=never)
    routing.router = ListingRouter()  # type: ignore[assignment]
    heard: list[tuple[str, int | None]] = []

    async def on_unhealthy(engine_id: str, reason: str, epoch: int | None = None) -> None:
        heard.append((engine_id, epoch))

    async def run() -> None:
        assert (await routing.publish(engine)).name == "done"
        routing.gateway = FailingUpstream(engine)  # type: ignore[assignment]
        await routing.generate(REQUESTS[:1], on_unhealthy, logprobs=False, max_tries=1)

    asyncio.run(run())
    assert engine.epoch == 2
    assert heard == [("engine-0", 1)]
