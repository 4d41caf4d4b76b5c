"""One engine slot: the I/O of one inference server, reported as the outcomes the core understands.

The slot decides nothing. The lifecycle core (``lifecycle.decide.core``) moves the ``engine`` machine and
hands out commands -- launch, kill, load these weights, pause generation, release memory -- and the
slot carries each one out against the real server (through its launcher and its backend's API,
:mod:`engines.api`: SGLang's or vLLM's) and
says what happened: ``ready`` or ``start_failed``, ``dead`` or ``alive``, ``loaded``, ``refused`` or
``request_failed``, ``done``. Every wait is bounded (:class:`Timeouts`); running out is an outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from engines.api import GROUP_NAME, APIFactory, Bucket, ServerAPI, mismatch
from engines.drain import Drain, drain, read_running
from engines.errors import EngineError, EngineHTTPError, EngineMismatch, EngineStartError
from engines.launcher import Launcher, Watched
from lifecycle.decide.backends import RunningCount
from lifecycle.decide.core import Fact, Outcome
from lifecycle.decide.errors import LifecycleError
from lifecycle.decide.events import MEMORY, WEIGHTS

__all__ = ["Bucket", "Engine", "EngineFailed", "Timeouts"]

T = TypeVar("T")


class EngineFailed(LifecycleError):
    """The engine cannot serve, and the lifecycle will not (or may no longer) recover it."""

    def __init__(self, engine_id: str, state: str, reason: str) -> None:
        self.engine_id, self.state, self.reason = engine_id, state, reason
        super().__init__(f"engine {engine_id} failed in state {state}: {reason}")


def _tag_order(tag: str) -> tuple[bool, str]:
    """Weights before the KV cache (the order a server restores them in), the rest by name."""
    return (tag != "weights", tag)


@dataclass
class _Batch:
    """A memory request being gathered: the tags of the commands that join it, and its outcome for them all."""

    tags: list[str]
    done: asyncio.Future[Outcome]


# the calls an in-flight update makes on one server, each bounded by the request timeout: pause, open the session,
# transfer, close it, read the version, resume
UPDATE_CALLS = 6
# seconds a closing engine waits for its killed process's death watch to see the death (a reap takes ~30 ms)
REAP_TIMEOUT = 5.0


@dataclass
class Timeouts:
    """Every wait is bounded; each timeout is an outcome (start_failed, request_failed, alive)."""

    startup: float = 60.0
    request: float = 30.0
    death: float = 10.0

    def kept(self, update: float | None = None) -> float:
        """The bound on a generate call whose requests an in-flight update may hold paused: the generation's own
        ``request`` bound plus one update's (``update``; by default its calls on one server, each bounded by
        ``request``). Bounded still: a server that never resumes fails the call, and the stream re-sends it."""
        return self.request + (self.request * UPDATE_CALLS if update is None else update)


class Engine:
    """An engine slot: a launcher, the API of the server it started (its backend's: the launcher's ``api``),
    and what that server holds."""

    def __init__(
        self,
        engine_id: str,
        launcher: Launcher,
        *,
        api_key: str | None = None,
        timeouts: Timeouts | None = None,
        probe_endpoint: str = "health_generate",
        api: APIFactory | None = None,
        external: bool = False,
        pause_mode: str | None = None,
    ) -> None:
        """``external``: a server something else started (--rollout-external-engine-addrs): what it is, which
        process answers and what it serves are read from it at every attach, never assumed. ``pause_mode``:
        --pause-generation-mode (None: the backend's first mode that keeps requests)."""
        self.id = engine_id
        self.pause_mode = pause_mode
        self.external = external
        self.identity: str | None = None  # which process answers at the address (an external server's facts)
        self.probe_endpoint = probe_endpoint
        self.launcher = launcher
        # the key the launcher started the server with (or an external engine's owner gave), unless one is given
        self.api_key = api_key if api_key is not None else launcher.api_key
        self.api_factory: APIFactory = api or launcher.api
        self.timeouts = timeouts or Timeouts()
        self.server: ServerAPI | None = None
        self.url: str | None = None
        self.weight_version: str | None = None  # what the server reported after its last load
        # the generation of the server process the slot holds now (the core's count of the slot's launches, set by
        # whoever launches it): reports about this process name it, so a late one about a replaced process is fenced
        self.epoch: int | None = None
        self.reason = ""  # why the last command failed (it travels with the outcome)
        self._batches: dict[str, _Batch] = {}  # memory requests gathering the tags of one step's commands

    def _failed(self, name: str, reason: str) -> Outcome:
        self.reason = reason
        return Outcome(name, reason=reason)

    # -- start and stop ------------------------------------------------------------------------------
    async def launch(self) -> Outcome:
        """Start the process and wait (bounded) until it generates: ``ready`` or ``start_failed``."""
        try:
            self.url = await asyncio.wait_for(self.launcher.launch(), self.timeouts.startup)
            if self.server is not None:
                await self.server.close()
            self.server = self.api_factory(
                self.url, engine_id=self.id, api_key=self.api_key, timeout=self.timeouts.request
            )
            if self.external:  # attached, not started: is it the server it was said to be, and which process
                self.identity = (await self._until_started(self.server.identify)).identity
            await self._wait_healthy()
        except (TimeoutError, EngineError, OSError) as exc:
            return self._failed("start_failed", f"did not start: {exc}")
        self.weight_version = None
        return Outcome("ready")

    async def replaced(self) -> str | None:
        """An external server's facts read again: why the process answering at its address is not the one this
        slot attached and loaded (a new process, or another weight version than the slot loaded), or None. A
        server that cannot be asked is not a replacement (its requests and probes fail: that is news already)."""
        if not self.external or self.server is None:
            return None
        try:
            facts = await self.server.identify(self.timeouts.request)
        except (TimeoutError, EngineError, OSError):
            return None
        if self.identity is not None and facts.identity != self.identity:
            return (
                f"the server at {self.url} was replaced: another process answers there ({facts.identity}, "
                f"attached: {self.identity}), serving weight version {facts.weight_version!r}"
            )
        if self.weight_version is not None and facts.weight_version != self.weight_version:
            return (
                f"the server at {self.url} serves weight version {facts.weight_version!r}, not the "
                f"{self.weight_version!r} this job loaded into it"
            )
        return None

    async def adopt(self, url: str) -> str | None:
        """A previous driver's process, kept (--detach-engines), brought to what ``Quiesced`` means: it is alive
        (``/health``, bounded by the request timeout: a drained server may be paused, and a paused vLLM server
        answers no generation until it is resumed), generation paused (whatever the dead driver left: the next
        ``resume`` move continues it), its memory held again (a release undone; a backend that cannot release
        refuses, which is fine); and what it serves. Raises :class:`EngineError` (or ``TimeoutError``) when it
        cannot be adopted."""
        self.url = url
        if self.server is not None:
            await self.server.close()
        self.server = self.api_factory(url, engine_id=self.id, api_key=self.api_key, timeout=self.timeouts.request)
        await self.server.probe("health", self.timeouts.request)
        await asyncio.wait_for(self.server.pause(self.pause_mode), self.timeouts.request)
        for tag in ("weights", "kv_cache"):  # one by one: a tag still held is refused, the other resumed
            with contextlib.suppress(EngineError):
                await self.server.resume_memory([tag])
        self.weight_version = await self.served_version()
        return self.weight_version

    @property
    def client(self) -> Any:
        """The server's HTTP client (the rollout's routing generates through it); None without a server."""
        return None if self.server is None else self.server.client

    async def _wait_healthy(self) -> None:
        """Poll the backend's start-up probe until it answers (bounded): it generates and can take an update.
        A server process that exits meanwhile fails the start at once, with its reason (a vLLM server whose
        engine core dies at its first generation exits within a second; polling on would wait out the bound)."""
        assert self.server is not None
        await self._until_started(self.server.ready)

    async def _until_started(self, ask: Callable[[float], Awaitable[T]]) -> T:
        """Ask the server until it answers (bounded by the start-up timeout): the backend's start-up probe (it
        generates and can take an update), or what it is. An answer that says it is not the server expected (an
        :class:`EngineMismatch`, a refused key) ends the wait: asking again would change nothing. So does the
        server process's exit, with its reason (the launcher's watch)."""
        server = self.server
        assert server is not None
        deadline = time.monotonic() + self.timeouts.startup
        last: Exception | None = None

        async def poll() -> T:
            nonlocal last
            while time.monotonic() < deadline:
                try:
                    return await ask(min(5.0, self.timeouts.request))
                except EngineMismatch:
                    raise
                except EngineHTTPError as exc:
                    if exc.status in (401, 403):
                        raise await mismatch(server.client, exc, "", self.timeouts.request) from exc
                    last = exc
                except EngineError as exc:
                    last = exc
                await asyncio.sleep(0.1)
            raise TimeoutError(f"the server did not generate within {self.timeouts.startup:g}s ({last})")

        polling = asyncio.ensure_future(poll())
        death = asyncio.ensure_future(self.launcher.watch())
        try:
            await asyncio.wait({polling, death}, return_when=asyncio.FIRST_COMPLETED)
            if not polling.done():
                reason = death.result() if death.exception() is None else repr(death.exception())
                raise EngineStartError(self.id, f"the server process ended before it generated ({reason}); {last}")
            return polling.result()
        finally:
            for task in (polling, death):
                task.cancel()
            await asyncio.gather(polling, death, return_exceptions=True)

    async def kill(self) -> Outcome:
        """SIGKILL the server and wait (bounded) until its death is confirmed: ``dead`` or ``alive``."""
        await self.launcher.kill()
        if not await self.launcher.wait_dead(self.timeouts.death):
            return self._failed("alive", f"process still alive {self.timeouts.death:g}s after SIGKILL")
        if self.server is not None:
            await self.server.close()
            self.server = None
        return Outcome("dead")

    # -- weights ----------------------------------------------------------------------------------------
    async def load(self, path: str, version: str) -> Outcome:
        """The checkpoint directory in one update session; the server must then report ``version``:
        ``loaded`` or why not."""
        if self.server is None:
            return self._failed("request_failed", "no server process")
        return await self._verified(self.server.load(path, version, None), version, "disk", path)

    async def served_version(self) -> str | None:
        """What the server says it serves now, read from the server (SGLang's ``/model_info``, vLLM's
        ``/weight_info``); raises :class:`~engines.errors.EngineError` when it cannot be asked."""
        if self.server is None:
            raise EngineError(self.id, "served_version", "no server process")
        return await self.server.served_version(self.timeouts.request)

    # -- the weight-update group (broadcast mode) ---------------------------------------------------------
    async def join_group(
        self, address: str, port: int, rank: int, world_size: int, timeout: float, group: str = GROUP_NAME
    ) -> None:
        """Join the trainer's group ``group`` (one generation's name) at ``rank`` (raises EngineError: the group
        did not form)."""
        if self.server is None:
            raise EngineError(self.id, "join_group", "no server process")
        await self.server.join_group(address, port, rank, world_size, timeout, group)

    async def leave_group(self, timeout: float, group: str = GROUP_NAME) -> None:
        """Leave the group, best effort: a dead or group-less engine is already out."""
        if self.server is not None:
            with contextlib.suppress(EngineError):
                await self.server.leave_group(timeout, group)

    async def receive(
        self, buckets: Sequence[Bucket], version: str, timeout: float, group: str = GROUP_NAME
    ) -> Outcome:
        """Every bucket, each within ``timeout`` and stamped with ``group`` (its generation), while the trainer
        broadcasts them, in one update session; then the server must report ``version``."""
        if self.server is None:
            return self._failed("request_failed", "no server process")
        return await self._verified(self.server.receive(buckets, version, timeout, group), version, "broadcast")

    async def _verified(self, transfer: Awaitable[str | None], version: str, how: str, path: str = "") -> Outcome:
        """A weight transfer that returns the version the server then reports, which must be ``version``:
        ``loaded``, or ``refused`` (it answered no, or holds another version: it must not serve), or
        ``request_failed`` (no answer). ``path``: named in the reason (vLLM hides paths in its errors)."""
        where = f" from {path}" if path else ""
        try:
            got = await transfer
        except EngineHTTPError as exc:
            verb = f"refused the weights{where}" if how == "disk" else "broadcast update failed"
            return self._failed("refused", f"{verb}: {exc}")
        except EngineError as exc:
            return self._failed("request_failed", f"{'weight' if how == 'disk' else 'broadcast'} update failed: {exc}")
        if got != version:
            word = "loaded" if how == "disk" else "received"
            failed = self._failed("refused", f"{word} weight version {got!r}, expected {version!r}")
            return failed._replace(facts=(self._fact(WEIGHTS, weight_version=got, transfer=how, outcome="refused"),))
        self.weight_version = version
        return Outcome("loaded", facts=(self._fact(WEIGHTS, weight_version=version, transfer=how, outcome="loaded"),))

    async def drain(self, source: RunningCount | None, bound: float) -> Drain:
        """Wait (bounded by ``bound`` seconds) until the server runs no request: it was withdrawn from its router,
        so only what was forwarded before is left. ``source``: where its backend reports the count."""
        server = self.server
        if server is None:
            return Drain(0, False, 0.0, "no server process: its requests ended with it")
        client = server.client

        async def read(timeout: float) -> int:
            assert source is not None
            return await read_running(client, source, timeout)

        return await drain(None if source is None else read, bound)

    # -- traffic and memory -----------------------------------------------------------------------------
    async def continue_generation(self) -> Outcome:
        return await self._request("resume")

    async def pause_generation(self) -> Outcome:
        """Stop generating, keeping what runs: --pause-generation-mode, else the backend's first mode that keeps
        requests (SGLang's ``retract``, vLLM's ``keep``)."""
        return await self._request("pause", self.pause_mode)

    async def hand_back_requests(self) -> Outcome:
        """The requests the paused server kept through a failed (or reverted) update end on it now, so each
        caller gets its answer back (finish_reason abort) and the stream re-sends it to a Serving engine. The
        server stays paused: continuing it would generate on weights no completed update published. Always
        ``done`` -- the stream holds the record of every request it sent and re-sends them whether or not the
        server answered (a dead or hung server's calls end by their own bound); ``reason`` says when it did not."""
        self.reason = ""
        if self.server is None:
            self.reason = "no server process: its requests ended with it"
        else:
            try:
                await self.server.hand_back(self.timeouts.request)
            except EngineError as exc:
                self.reason = f"hand back failed (the stream re-sends the requests all the same): {exc}"
        return Outcome("done", reason=self.reason)

    async def release(self, tag: str) -> Outcome:
        """Release one memory tag. The core gives an offload's tags as one command each (``release_weights``,
        ``release_kv_cache``), handed out together: they travel in ONE request carrying every tag (SGLang's
        ``tags`` list; miles releases everything in one call). Each command still gets its own outcome and fact."""
        outcome = await self._memory("release", tag)
        return outcome._replace(facts=(self._fact(MEMORY, op="release", tag=tag, outcome=outcome.name),))

    async def resume(self, tag: str) -> Outcome:
        """Resume one memory tag (tags resumed by commands handed out together travel in one request)."""
        outcome = await self._memory("resume_memory", tag)
        return outcome._replace(facts=(self._fact(MEMORY, op="resume", tag=tag, outcome=outcome.name),))

    async def _memory(self, method: str, tag: str) -> Outcome:
        """One request per engine for the tags of the commands started together: the first command waits one
        turn of the event loop -- the runner starts every command of a core step before any of them resumes
        (``asyncio.gather``) -- and the others' tags join its request; all of them get its outcome."""
        batch = self._batches.get(method)
        if batch is not None:
            batch.tags.append(tag)
            return await asyncio.shield(batch.done)  # one sibling cancelled leaves the request to the others
        batch = self._batches[method] = _Batch([tag], asyncio.get_running_loop().create_future())
        try:
            try:
                await asyncio.sleep(0)  # the siblings of this step start now and join
            finally:
                del self._batches[method]
            outcome = await self._request(method, sorted(batch.tags, key=_tag_order))
        except BaseException:
            batch.done.cancel()  # cancelled (the runner undoes every command that was out): the siblings end too
            raise
        batch.done.set_result(outcome)
        return outcome

    def _fact(self, event: str, **fields: object) -> Fact:
        """What the server did, for the event log (the runner logs it with the result, in the core's order)."""
        return Fact.of(event, instance=self.id, epoch=self.epoch, **fields)  # which process of the slot did it

    async def probe(self, timeout: float) -> Outcome:
        """One liveness probe, bounded: the backend's default (--rollout-health-check-endpoint; vLLM's ``progress``:
        a 1-token generation answered or its token counters moving, SGLang's ``health_generate``); ``health`` is
        cheaper but misses a wedged scheduler."""
        if self.server is None:
            return self._failed("probe_failed", "no server process")
        try:  # the client's own request timeout bounds it (a second wait_for would race it)
            await self.server.probe(self.probe_endpoint, timeout)
        except (TimeoutError, EngineError) as exc:
            return self._failed("probe_failed", f"probe failed: {type(exc).__name__}: {exc}")
        return Outcome("probe_ok")

    async def _request(self, method: str, *args: object) -> Outcome:
        if self.server is None:
            return self._failed("request_failed", "no server process")
        try:
            await getattr(self.server, method)(*args)
        except EngineError as exc:
            return self._failed("request_failed", f"{method} failed: {exc}")
        return Outcome("done")

    async def close(self) -> None:
        """Best effort, whatever the state: kill the process, close the client, release the launcher."""
        with contextlib.suppress(Exception):  # already gone: nothing to do
            await self.launcher.kill()
        if isinstance(self.launcher, Watched):
            with contextlib.suppress(Exception):  # best effort, as the kill
                await self.launcher.unwatch(REAP_TIMEOUT)
        if self.server is not None:
            await self.server.close()
            self.server = None
        self.launcher.shutdown()
