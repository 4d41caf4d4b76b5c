"""Where generate requests go: the engines a group has published, through the real SMG gateway or in-process.

Publication is an effect of the engine machine: ``route_traffic`` (on every move into ``Serving``) adds
an engine, ``stop_routing`` (before it leaves) removes it; :class:`~rollout.controller.InferenceController`
binds both to the group's routing. So the set of engines a request can reach is exactly the Serving set,
and "a recovered engine never served again" (miles #692) or "an engine served before it held the
trainer's weights" (miles #1724) would show as a difference between the two, which the wire tests read.

* :class:`RouterRouting`: an SMG gateway process (``engines.router``); requests are sent one per prompt, as the
  gateway takes them, in the backend's own API (SGLang's ``/generate``, vLLM's ``/v1/completions``); a failed
  request names its upstream, which is reported as that engine's failed request (the lifecycle marks it; the
  next try goes to the others).
* :class:`LocalRouting`: the same membership in-process, requests sharded round-robin over the members
  as one batch per engine (``--no-router``, or where smg is not installed).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from engines.backends import GatewayClient, engine_backend
from engines.engine import Engine
from engines.errors import EngineError
from engines.protocol import GenerateResponse
from engines.router import Router, upstream_of
from lifecycle.decide.core import Fact, Outcome
from lifecycle.decide.events import GATEWAY, EventLog
from rollout.failures import ControllerError


class OnUnhealthy(Protocol):
    """Report that a request to an engine failed: (engine id, reason, the generation -- ``Engine.epoch`` -- of the
    process the request was sent to, read when it was sent). A failure that comes back after the engine's process
    was replaced is about the old one: the core fences it (a rollout function that does not know the generation
    passes none, and its report is taken as about the current process)."""

    def __call__(self, engine_id: str, reason: str, epoch: int | None = None, /) -> Awaitable[None]: ...


# the gateway's verdict on an engine: (engine id, reason, the generation of the process it was published as)
OnVerdict = Callable[[str, str, int | None], Awaitable[None]]
OnRouterDeath = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class GenRequest:
    """One prompt to generate for: ``text`` is what is sent; ``index`` orders the answers."""

    index: int
    text: str
    params: dict[str, Any]


@dataclass
class Answer:
    response: GenerateResponse
    engine: str  # the engine that answered ("router" when the router does not say)


class Routing(Protocol):
    """A group's published engines and how a batch of prompts reaches them."""

    name: str

    async def open(self) -> None:
        """Start what requests go through, with the group's first engine (bounded; raises naming the fix)."""

    def members(self) -> list[str]: ...

    async def publish(self, engine: Engine) -> Outcome: ...

    async def withdraw(self, engine: Engine) -> Outcome: ...

    async def hold(self, engine: Engine) -> Outcome:
        """Out of routing, its requests in flight left to finish (an in-flight update's pause keeps them)."""
        ...

    async def generate(
        self,
        requests: Sequence[GenRequest],
        on_unhealthy: OnUnhealthy,
        *,
        logprobs: bool,
        max_tries: int = 3,
        timeout: float | None = None,
    ) -> dict[int, Answer]: ...

    async def close(self) -> None: ...


@runtime_checkable
class GatewayRouting(Protocol):
    """A routing whose requests go through a process of its own (the SMG gateway): a fault can kill it, and its
    watcher counts the deaths it reports."""

    name: str
    deaths: int

    async def kill(self) -> None:
        """SIGKILL the gateway process: a real death its watcher reports."""


@dataclass
class LocalRouting:
    """In-process membership: the published engines, in slot order. Withdrawing an engine also cancels the batch
    in flight to it (a hung engine the lifecycle has just marked), so its prompts go to the others at once instead
    of waiting out the request timeout."""

    name: str = "local"
    _members: dict[str, Engine] = field(default_factory=dict)
    _inflight: dict[str, set[asyncio.Future[Any]]] = field(default_factory=dict)  # engine id -> batches out to it

    async def open(self) -> None:
        """Nothing to start: requests go in-process."""

    def members(self) -> list[str]:
        return sorted(self._members, key=_slot_order)

    async def publish(self, engine: Engine) -> Outcome:
        if engine.client is None:
            return Outcome("request_failed", reason="no server process to route to")
        self._members[engine.id] = engine
        return Outcome("done")

    async def hold(self, engine: Engine) -> Outcome:
        self._members.pop(engine.id, None)
        return Outcome("done")

    async def withdraw(self, engine: Engine) -> Outcome:
        self._members.pop(engine.id, None)
        for request in self._inflight.pop(engine.id, ()):
            request.cancel()  # its prompts are not answered: the generate's next try sends them to the others
        return Outcome("done")

    async def generate(
        self,
        requests: Sequence[GenRequest],
        on_unhealthy: OnUnhealthy,
        *,
        logprobs: bool,
        max_tries: int = 3,
        timeout: float | None = None,
    ) -> dict[int, Answer]:
        """Round-robin shards, one batch per member, concurrently; a member whose batch fails is reported and
        its prompts go to the others in the next try (every prompt answered at most once)."""
        done: dict[int, Answer] = {}

        async def shard(engine: Engine, batch: list[GenRequest]) -> None:
            if engine.client is None:
                return
            epoch = engine.epoch  # the process the batch goes to: by the time it fails, it may have been replaced
            request = asyncio.ensure_future(
                engine.client.generate_batch(
                    [r.text for r in batch],
                    sampling_params=[r.params for r in batch],
                    return_logprob=logprobs,
                    timeout=timeout,
                )
            )
            out = self._inflight.setdefault(engine.id, set())
            out.add(request)  # only while it waits on the engine: a report is never cut short
            try:
                answers = await request
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # the generate itself is cancelled
                return  # withdrawn while it waited (the engine was marked or stopped): tried again on the others
            except EngineError as exc:
                await on_unhealthy(engine.id, f"generate failed: {exc}", epoch)
                return
            finally:
                out.discard(request)
            for r, answer in zip(batch, answers, strict=True):
                done[r.index] = Answer(answer, engine.id)

        for _ in range(max_tries):
            todo = [r for r in requests if r.index not in done]
            members = [self._members[m] for m in self.members()]
            if not todo or not members:
                break
            shards: dict[int, list[GenRequest]] = {}
            for n, r in enumerate(todo):
                shards.setdefault(n % len(members), []).append(r)
            await asyncio.gather(*(shard(members[i], batch) for i, batch in shards.items()))
        return done

    async def close(self) -> None:
        self._members.clear()


class RouterRouting:
    """Membership in a real SMG gateway process; every request of the group goes through it.

    The router's death is reported (``on_death``) unless this object killed it; a dead router is started
    again by the next ``publish`` (the core's ``republish`` under rollout FT: with FT off the run has
    already stopped), empty, so every engine that is Serving is registered again by its own effect.
    """

    def __init__(
        self,
        name: str,
        *,
        on_death: OnRouterDeath,
        log_dir: str | Path | None = None,
        log: EventLog | None = None,
        backend: str = "sglang",
        on_news: OnVerdict | None = None,
        health_checks: bool = False,
        news_period: float = 0.5,
        request_timeout: float = 30.0,
    ) -> None:
        self.name = name
        self.backend = backend  # the engines' API, which the gateway forwards (SGLang's /generate, vLLM's completions)
        self.gateway: GatewayClient | None = None  # what generate requests go through
        self.log = log
        log_path = Path(log_dir) / f"{name}.log" if log_dir is not None else None
        self.router = Router(name, log_path=log_path, health_checks=health_checks, request_timeout=request_timeout)
        # SMG's own verdict on a published worker (its health checks, when kept on): news for the lifecycle
        self.on_news = on_news
        self.news_period = news_period
        self._news: asyncio.Task[None] | None = None
        self._epochs: dict[str, int | None] = {}
        self._told: set[str] = set()  # engines whose SMG verdict was reported since their last publication
        self.on_death = on_death
        self._urls: dict[str, str] = {}  # published engine id -> its URL (for error attribution)
        self._engines: dict[str, Engine] = {}
        self._lock = asyncio.Lock()
        self._watch: asyncio.Task[None] | None = None
        self._gen = 0
        self.deaths = 0  # deaths reported (not caused by a restart or close)

    @property
    def url(self) -> str | None:
        return self.router.url

    def members(self) -> list[str]:
        return sorted(self._urls, key=_slot_order)

    async def open(self) -> None:
        """The gateway starts (bounded) with the group's first engine; one that cannot start fails that launch,
        and the exception names the gateway and the fix."""
        if self.router.process is not None:
            return
        try:
            await self.start()
        except EngineError as exc:
            raise ControllerError(
                f"{self.name}: the gateway (SMG) did not start: {exc}. Fix: pip install "
                "'rl-lifecycle[router]', or run without the router (--no-router)"
            ) from None

    async def start(self) -> None:
        async with self._lock:
            await self._start()

    async def _start(self) -> None:
        self._gen += 1
        self._urls.clear()  # a (re)started router is empty
        self._engines.clear()
        if self.router.process is None:
            await self.router.start()
        else:
            await self.router.restart()
        if self.gateway is not None:
            await self.gateway.close()
        assert self.router.url is not None
        self.gateway = engine_backend(self.backend).gateway(
            self.router.url, name=self.name, timeout=self.router.client_timeout
        )
        if self.log is not None:
            self.log.emit("router.started", router=self.name, restarts=self.router.restarts)
        gen = self._gen

        async def watch() -> None:
            reason = await self.router.watch()
            if gen == self._gen:  # not a death we caused (a restart or close)
                self.deaths += 1
                await self.on_death(f"{self.name}: {reason}")

        self._watch = asyncio.create_task(watch(), name=f"watch-{self.name}")
        if self.on_news is not None and self.router.health_checks and self._news is None:
            self._news = asyncio.create_task(self._watch_verdicts(), name=f"verdicts-{self.name}")

    async def _watch_verdicts(self) -> None:
        """Poll SMG's view of the published workers; one SMG no longer routes to (``not_ready``, ``failed``, gone)
        is reported once per publication -- the lifecycle marks the engine, which withdraws it (SMG decides
        nothing about a worker the lifecycle holds Serving: it only tells)."""
        assert self.on_news is not None
        while True:
            await asyncio.sleep(self.news_period)
            if not self.router.alive or not self._engines:
                continue
            try:
                view = await self.router.workers()
            except EngineError:
                continue  # a dead gateway is its watcher's news
            for engine_id, url in list(self._urls.items()):
                worker = view.get(url)
                if engine_id in self._told or (worker is not None and worker.routable):
                    continue
                self._told.add(engine_id)
                status = worker.status if worker is not None else "gone"
                reason = f"the gateway {self.name} (SMG) reports its worker {status}"
                await self.on_news(engine_id, reason, self._epochs.get(engine_id))

    async def publish(self, engine: Engine) -> Outcome:
        if engine.url is None:
            return Outcome("request_failed", reason="no server process to route to")
        try:
            async with self._lock:
                if not self.router.alive:
                    await self._start()
            runtime = engine.server.backend if engine.server is not None else "sglang"
            await self.router.add(
                engine.url, runtime=runtime, weight_version=engine.weight_version, api_key=engine.api_key
            )
            seen = await self._seen(engine)
        except EngineError as exc:
            return Outcome("request_failed", reason=f"router registration failed: {exc}")
        self._urls[engine.id] = engine.url.rstrip("/")
        self._engines[engine.id] = engine
        self._epochs[engine.id] = engine.epoch  # the process published: SMG's verdicts on this worker are about it
        self._told.discard(engine.id)
        return Outcome("done", facts=(seen,))

    async def _seen(self, engine: Engine) -> Fact:
        """What SMG reports for the engine's worker now, as a fact (``trace check`` compares it with the machine)."""
        worker = (await self.router.workers()).get((engine.url or "").rstrip("/"))
        status, version = (worker.status, worker.weight_version) if worker is not None else (None, None)
        fields = {
            "status": status,
            "weight_version": version,
            "epoch": engine.epoch,
        }  # the gateway's view, of which process
        return Fact.of(GATEWAY, instance=engine.id, router=self.name, **fields)

    async def hold(self, engine: Engine) -> Outcome:
        """The gateway forgets the engine; what it forwarded already stays with the engine."""
        return await self.withdraw(engine)

    async def withdraw(self, engine: Engine) -> Outcome:
        self._engines.pop(engine.id, None)
        url = self._urls.pop(engine.id, None) or (engine.url or "").rstrip("/")
        if not self.router.alive:  # a dead router routes nothing: already out
            return Outcome("done")
        try:
            await self.router.remove(url)
            seen = await self._seen(engine)
        except EngineError as exc:
            return Outcome("request_failed", reason=f"router unregistration failed: {exc}")
        return Outcome("done", facts=(seen,))

    async def generate(
        self,
        requests: Sequence[GenRequest],
        on_unhealthy: OnUnhealthy,
        *,
        logprobs: bool,
        max_tries: int = 3,
        timeout: float | None = None,
    ) -> dict[int, Answer]:
        """Every prompt is one ``/generate`` through the router, concurrently; a failure the router pins on an
        engine is reported as that engine's, and the prompts left go through the router again."""
        done: dict[int, Answer] = {}
        by_url: dict[str, str] = {}

        async def one(r: GenRequest) -> tuple[str, str] | None:
            """None when answered, else (the engine the router names or "", the error)."""
            client = self.gateway if self.router.alive else None
            if client is None:
                return "", "the router is not running"
            try:
                # its bound is the gateway's (request_timeout, a stream's kept one): ``timeout`` is the local path's
                answer = await client.generate(r.text, sampling_params=r.params, return_logprob=logprobs)
            except EngineError as exc:
                return by_url.get(upstream_of(exc) or "", ""), str(exc)
            if answer.meta_info.weight_version is None:  # vLLM's answers name none: the routable engines' one
                answer = answer.model_copy(update={"meta_info": answer.meta_info.model_copy(update=served)})
            done[r.index] = Answer(answer, "router")
            return None

        for _ in range(max_tries):
            todo = [r for r in requests if r.index not in done]
            if not todo or not await self._members_ready():
                break
            by_url = {url: engine_id for engine_id, url in self._urls.items()}
            epochs = {engine_id: e.epoch for engine_id, e in self._engines.items()}  # the processes this try reaches
            versions = {e.weight_version for e in self._engines.values()}  # Serving engines hold one (committed)
            served = {"weight_version": versions.pop() if len(versions) == 1 else None}
            failures = [f for f in await asyncio.gather(*(one(r) for r in todo)) if f is not None]
            named = {engine_id: error for engine_id, error in failures if engine_id}
            for engine_id in sorted(named, key=_slot_order):
                await on_unhealthy(
                    engine_id, f"generate through the router failed: {named[engine_id]}", epochs.get(engine_id)
                )
            unnamed = [error for engine_id, error in failures if not engine_id]
            if unnamed:
                await self._diagnose(unnamed[0], on_unhealthy)
        return done

    async def _diagnose(self, error: str, on_unhealthy: OnUnhealthy) -> None:
        """A failure the router does not pin on an engine (a timeout): probe the members, bounded, and report
        the ones that do not answer -- the lifecycle marks them, the next try goes to the others."""
        engines = [self._engines[e] for e in self.members() if e in self._engines]
        epochs = [engine.epoch for engine in engines]  # the processes probed
        timeout = min(10.0, self.router.request_timeout)
        outcomes = await asyncio.gather(*(engine.probe(timeout) for engine in engines))
        for engine, epoch, outcome in zip(engines, epochs, outcomes, strict=True):
            if outcome.name != "probe_ok":
                reason = f"generate through the router failed ({error}); {outcome.reason}"
                await on_unhealthy(engine.id, reason, epoch)

    async def kill(self) -> None:
        """SIGKILL the router process (the ``kill-router`` fault): a real death its watcher reports."""
        if self.router.process is not None:
            self.router.process.kill()

    async def _members_ready(self) -> bool:
        """Wait (bounded by the request timeout) while a restarted router is being repopulated: the
        lifecycle's ``republish`` is registering the Serving engines again."""
        deadline = asyncio.get_running_loop().time() + self.router.request_timeout
        while not (self.router.alive and self._urls):
            if asyncio.get_running_loop().time() > deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    async def close(self) -> None:
        self._gen += 1
        for task in (self._watch, self._news):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._news = None
        await self.router.close()
        if self.gateway is not None:
            await self.gateway.close()
            self.gateway = None
        self._urls.clear()


def _slot_order(engine_id: str) -> tuple[str, int]:
    prefix, _, index = engine_id.rpartition("-")
    return prefix, int(index) if index.isdigit() else -1
