"""Withdrawing an engine from routing, witnessed in seconds: once ``stop_routing`` has run (an engine drained
after a generate, marked unhealthy, stopped), no request reaches it -- in-process routing drops it from the
members it shards over, and the gateway shell unregisters it at the router, not only in its own books.
The same rule against real engines and a real router is ``test_router.py``."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from engines.errors import EngineHTTPError, EngineUnreachable
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


class HungClient:
    """An engine that never answers (hung): its batch waits until it is cancelled."""

    def __init__(self) -> None:
        self.waiting = 0
        self.cancelled = 0

    async def generate_batch(self, texts: list[str], **kw: Any) -> list[Any]:
        self.waiting += 1
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        raise AssertionError("a hung engine answered")


async def _until(condition: Any) -> None:
    for _ in range(2000):  # bounded: 2,000 turns of the event loop
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


def test_withdrawing_an_engine_cancels_its_batch_out_and_its_prompts_go_to_the_others() -> None:
    """A hung engine the lifecycle marks is withdrawn while the rollout's batch waits on it: the batch is cancelled
    and its prompts go to the other engine at once, instead of waiting out the request timeout."""
    routing = LocalRouting()
    hung, serving = _engine(0), _engine(1)
    hung.client = HungClient()
    requests = [GenRequest(k, f"p{k}", {}) for k in range(4)]

    async def run() -> dict[int, Any]:
        for e in (hung, serving):
            assert (await routing.publish(e)).name == "done"
        generate = asyncio.ensure_future(routing.generate(requests, _never_unhealthy, logprobs=False))
        await _until(lambda: hung.client.waiting == 1)
        assert (await routing.withdraw(hung)).name == "done"
        return await asyncio.wait_for(generate, 10)  # without the cancel: waits for the hung engine for ever

    answers = asyncio.run(run())
    assert hung.client.cancelled == 1
    assert sorted(answers) == [0, 1, 2, 3] and {a.engine for a in answers.values()} == {"engine-1"}
    assert len(serving.client.prompts) == 4  # two in the first try, the hung engine's two in the next


def test_a_cancelled_generate_stays_cancelled() -> None:
    """The withdrawal's cancel is the routing's own: a generate that is itself cancelled (the run stops) is not
    turned into a retry or an answer."""
    routing = LocalRouting()
    hung = _engine(0)
    hung.client = HungClient()

    async def run() -> None:
        assert (await routing.publish(hung)).name == "done"
        generate = asyncio.ensure_future(routing.generate([GenRequest(0, "p", {})], _never_unhealthy, logprobs=False))
        await _until(lambda: hung.client.waiting == 1)
        generate.cancel()
        try:
            await generate
        except asyncio.CancelledError:
            return
        raise AssertionError("the cancelled generate returned")

    asyncio.run(run())
    assert hung.client.cancelled == 1 and hung.client.waiting == 1  # not retried


# -- a failed request names the process it was sent to ----------------------------------------------------------
# The routing reads the engine's generation (``Engine.epoch``) when it sends, so a failure that comes back after the
# engine's process was replaced reports the old generation, which the core fences (test_controller.py: a late
# ``request_failed`` about a replaced process leaves the new one serving). Without it the old process's failure
# marked the new one Unhealthy.
REQUESTS = [GenRequest(k, f"p{k}", {}) for k in range(2)]


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
    engine = client.engine = _engine(0)
    engine.client = client
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
