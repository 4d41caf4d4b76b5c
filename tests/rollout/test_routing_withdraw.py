"""Withdrawing an engine from routing, witnessed in seconds: once ``stop_routing`` has run (an engine drained
after a generate, marked unhealthy, stopped), no request reaches it -- in-process routing drops it from the
members it shards over, and the gateway shell unregisters it at the router, not only in its own books.
The same rule against real engines and a real router is ``test_router.py``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from engines.router import GatewayWorker
from rollout.routing import GenRequest, LocalRouting, RouterRouting


class CountingClient:
    def __init__(self) -> None:
        self.prompts: list[str] = []

    async def generate_batch(self, texts: list[str], **kw: Any) -> list[Any]:
        self.prompts += texts
        return [SimpleNamespace(text="x") for _ in texts]


def _engine(i: int) -> Any:
    url = f"http://127.0.0.1:{30000 + i}/"
    fields = {"url": url, "api_key": None, "server": None, "weight_version": "0", "epoch": 1}
    return SimpleNamespace(id=f"engine-{i}", client=CountingClient(), **fields)


async def _never_unhealthy(engine_id: str, reason: str, epoch: int | None = None) -> None:
    raise AssertionError(f"{engine_id}: {reason}")


def test_a_withdrawn_engine_gets_no_more_requests_in_process() -> None:
    routing = LocalRouting()
    drained, serving = _engine(0), _engine(1)
    requests = [GenRequest(k, f"p{k}", {}) for k in range(4)]

    async def run() -> dict[int, Any]:
        for e in (drained, serving):
            assert (await routing.publish(e)).name == "done"
        assert (await routing.withdraw(drained)).name == "done"
        return await routing.generate(requests, _never_unhealthy, logprobs=False)

    answers = asyncio.run(run())
    assert routing.members() == ["engine-1"] and sorted(answers) == [0, 1, 2, 3]
    assert drained.client.prompts == [] and len(serving.client.prompts) == 4


class ListingRouter:
    """The router process's membership (``GET /workers``) without the process."""

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


def test_withdrawing_unregisters_the_engine_at_the_router_itself() -> None:
    async def report(reason: str) -> None:
        raise AssertionError(reason)

    routing = RouterRouting("router-rollout", on_death=report)
    router = ListingRouter()
    routing.router = router  # type: ignore[assignment]
    marked, serving = _engine(0), _engine(1)

    async def run() -> None:
        for e in (marked, serving):
            assert (await routing.publish(e)).name == "done"
        assert router.listed == {"http://127.0.0.1:30000", "http://127.0.0.1:30001"}
        assert (await routing.withdraw(marked)).name == "done"

    asyncio.run(run())
    assert router.listed == {"http://127.0.0.1:30001"}  # what the router routes to, not only our books
    assert routing.members() == ["engine-1"]
