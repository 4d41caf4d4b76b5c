"""One engine slot: the I/O of one inference server, reported as the outcomes the core understands.

The slot decides nothing. The lifecycle core (``lifecycle.decide.core``) moves the ``engine`` machine and
hands out commands -- launch, kill, load these weights, pause generation, release memory -- and the
slot carries each one out against the real server (through its launcher and ``EngineClient``) and
says what happened: ``ready`` or ``start_failed``, ``dead`` or ``alive``, ``loaded``, ``refused`` or
``request_failed``, ``done``. Every wait is bounded (:class:`Timeouts`); running out is an outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from engines.client import EngineClient
from engines.errors import EngineError, EngineHTTPError
from engines.launcher import Launcher
from engines.protocol import PauseMode
from lifecycle.decide.core import Fact, Outcome
from lifecycle.decide.errors import LifecycleError
from lifecycle.decide.events import MEMORY, WEIGHTS

Bucket = Sequence[tuple[str, str, Sequence[int]]]  # one broadcast bucket: (name, dtype, shape) of each tensor


class EngineFailed(LifecycleError):
    """The engine cannot serve, and the lifecycle will not (or may no longer) recover it."""

    def __init__(self, engine_id: str, state: str, reason: str) -> None:
        self.engine_id, self.state, self.reason = engine_id, state, reason
        super().__init__(f"engine {engine_id} failed in state {state}: {reason}")


@dataclass
class Timeouts:
    """Every wait is bounded; each timeout is an outcome (start_failed, request_failed, alive)."""

    startup: float = 60.0
    request: float = 30.0
    death: float = 10.0


class Engine:
    """An engine slot: a launcher, the client of the server it started, and what that server holds."""

    def __init__(
        self,
        engine_id: str,
        launcher: Launcher,
        *,
        api_key: str | None = None,
        timeouts: Timeouts | None = None,
        probe_endpoint: str = "health_generate",
    ) -> None:
        self.id = engine_id
        self.probe_endpoint = probe_endpoint
        self.launcher = launcher
        # the key the launcher started the server with (or an external engine's owner gave), unless one is given
        self.api_key = api_key if api_key is not None else getattr(launcher, "api_key", None)
        self.timeouts = timeouts or Timeouts()
        self.client: EngineClient | None = None
        self.url: str | None = None
        self.weight_version: str | None = None  # what the server reported after its last load
        self.reason = ""  # why the last command failed (it travels with the outcome)

    def _failed(self, name: str, reason: str) -> Outcome:
        self.reason = reason
        return Outcome(name, reason=reason)

    # -- start and stop ------------------------------------------------------------------------------
    async def launch(self) -> Outcome:
        """Start the process and wait (bounded) until ``/health_generate`` answers: ``ready`` or ``start_failed``."""
        try:
            self.url = await asyncio.wait_for(self.launcher.launch(), self.timeouts.startup)
            if self.client is not None:
                await self.client.close()
            self.client = EngineClient(self.url, engine_id=self.id, api_key=self.api_key, timeout=self.timeouts.request)
            await self._wait_healthy()
        except (TimeoutError, EngineError, OSError) as exc:
            return self._failed("start_failed", f"did not start: {exc}")
        self.weight_version = None
        return Outcome("ready")

    async def _wait_healthy(self) -> None:
        """Poll /health_generate until it answers (the startup probe, bounded), then flush the cache."""
        assert self.client is not None
        deadline = time.monotonic() + self.timeouts.startup
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                await self.client.health_generate(timeout=min(5.0, self.timeouts.request))
                await self.client.flush_cache()
                return
            except EngineError as exc:
                last = exc
                await asyncio.sleep(0.1)
        raise TimeoutError(f"/health_generate did not answer within {self.timeouts.startup:g}s ({last})")

    async def kill(self) -> Outcome:
        """SIGKILL the server and wait (bounded) until its death is confirmed: ``dead`` or ``alive``."""
        await self.launcher.kill()
        if not await self.launcher.wait_dead(self.timeouts.death):
            return self._failed("alive", f"process still alive {self.timeouts.death:g}s after SIGKILL")
        if self.client is not None:
            await self.client.close()
            self.client = None
        return Outcome("dead")

    # -- weights ----------------------------------------------------------------------------------------
    async def load(self, path: str, version: str) -> Outcome:
        """``/update_weights_from_disk``, then ``/model_info`` must report ``version``: ``loaded`` or why not."""
        client = self.client
        if client is None:
            return self._failed("request_failed", "no server process")
        return await self._verified(client.update_weights_from_disk(path, weight_version=version), version, "disk")

    # -- the weight-update group (broadcast mode) ---------------------------------------------------------
    async def join_group(self, address: str, port: int, rank: int, world_size: int, timeout: float) -> None:
        """``/init_weights_update_group`` at ``rank`` (raises EngineError: the group did not form)."""
        if self.client is None:
            raise EngineError(self.id, "/init_weights_update_group", "no server process")
        await self.client.init_weights_update_group(address, port, rank, world_size, backend="gloo", timeout=timeout)

    async def leave_group(self, timeout: float) -> None:
        """``/destroy_weights_update_group``, best effort: a dead or group-less engine is already out."""
        if self.client is not None:
            with contextlib.suppress(EngineError):
                await self.client.destroy_weights_update_group(timeout=timeout)

    async def receive(self, buckets: Sequence[Bucket], version: str, timeout: float) -> Outcome:
        """Every bucket by ``/update_weights_from_distributed`` (the last one names ``version``), each within
        ``timeout``, while the trainer broadcasts them; then ``/model_info`` must report ``version``."""
        client = self.client
        if client is None:
            return self._failed("request_failed", "no server process")

        async def every_bucket() -> None:
            for k, bucket in enumerate(buckets):
                await client.update_weights_from_distributed(
                    [n for n, _, _ in bucket],
                    [d for _, d, _ in bucket],
                    [list(shape) for _, _, shape in bucket],
                    weight_version=version if k == len(buckets) - 1 else None,
                    timeout=timeout,
                )

        return await self._verified(every_bucket(), version, "broadcast")

    async def _verified(self, transfer: Awaitable[object], version: str, how: str) -> Outcome:
        """A weight transfer, then ``/model_info`` must report ``version``: ``loaded``, or ``refused`` (it answered
        no, or holds another version: it must not serve), or ``request_failed`` (no answer)."""
        assert self.client is not None
        try:
            await transfer
            got = (await self.client.model_info()).weight_version
        except EngineHTTPError as exc:
            verb = "refused the weights" if how == "disk" else "broadcast update failed"
            return self._failed("refused", f"{verb}: {exc}")
        except EngineError as exc:
            return self._failed("request_failed", f"{'weight' if how == 'disk' else 'broadcast'} update failed: {exc}")
        if got != version:
            word = "loaded" if how == "disk" else "received"
            failed = self._failed("refused", f"{word} weight version {got!r}, expected {version!r}")
            return failed._replace(facts=(self._fact(WEIGHTS, weight_version=got, transfer=how, outcome="refused"),))
        self.weight_version = version
        return Outcome("loaded", facts=(self._fact(WEIGHTS, weight_version=version, transfer=how, outcome="loaded"),))

    # -- traffic and memory -----------------------------------------------------------------------------
    async def continue_generation(self) -> Outcome:
        return await self._request("continue_generation")

    async def pause_generation(self, mode: PauseMode = "retract") -> Outcome:
        return await self._request("pause_generation", mode=mode)

    async def release(self, tag: str) -> Outcome:
        outcome = await self._request("release_memory_occupation", tags=[tag])
        return outcome._replace(facts=(self._fact(MEMORY, op="release", tag=tag, outcome=outcome.name),))

    async def resume(self, tag: str) -> Outcome:
        outcome = await self._request("resume_memory_occupation", tags=[tag])
        return outcome._replace(facts=(self._fact(MEMORY, op="resume", tag=tag, outcome=outcome.name),))

    def _fact(self, event: str, **fields: object) -> Fact:
        """What the server did, for the event log (the runner logs it with the result, in the core's order)."""
        return Fact.of(event, instance=self.id, **fields)

    async def probe(self, timeout: float) -> Outcome:
        """One liveness probe, bounded: ``/health_generate`` (a real 1-token generation) by default;
        ``/health`` (--rollout-health-check-endpoint health) is cheaper but misses a wedged scheduler."""
        if self.client is None:
            return self._failed("probe_failed", "no server process")
        call = self.client.health if self.probe_endpoint == "health" else self.client.health_generate
        try:  # the client's own request timeout bounds it (a second wait_for would race it)
            await call(timeout=timeout)
        except (TimeoutError, EngineError) as exc:
            return self._failed("probe_failed", f"probe failed: {type(exc).__name__}: {exc}")
        return Outcome("probe_ok")

    async def _request(self, method: str, **kwargs: object) -> Outcome:
        if self.client is None:
            return self._failed("request_failed", "no server process")
        try:
            await getattr(self.client, method)(**kwargs)
        except EngineError as exc:
            return self._failed("request_failed", f"{method} failed: {exc}")
        return Outcome("done")

    async def close(self) -> None:
        """Best effort, whatever the state: kill the process, close the client, release the launcher."""
        with contextlib.suppress(Exception):  # already gone: nothing to do
            await self.launcher.kill()
        if self.client is not None:
            await self.client.close()
            self.client = None
        self.launcher.shutdown()
