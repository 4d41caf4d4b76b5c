"""vLLM's API for an engine slot (:class:`engines.api.ServerAPI`): what each lifecycle command is on a vLLM server.

The weight-update session is vLLM's own (``/start_weight_update`` ... ``/finish_weight_update``) through the
project's transfer engine (:mod:`engines.vllm.plugin`, ``--weight-transfer-config {"backend": "lifecycle"}``):
a disk load is one ``/update_weights {"path": DIR}``, a broadcast one ``/update_weights`` per bucket. vLLM
publishes the version only at finish, and a failed chunk ends the session in the worker with the old weights
serving, so a failure is never followed by a finish. A session the lifecycle lost track of (a driver that
died mid-update) is cancelled with the plugin's ``{"abort": true}`` before a new one starts.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from engines.api import GROUP_NAME, Bucket, ServerFacts, keeping_pause, mismatch
from engines.errors import (
    EngineError,
    EngineHTTPError,
    EngineMismatch,
    EngineProtocolError,
    EngineTimeout,
    EngineUnreachable,
)
from engines.vllm.client import VLLMClient, process_start_time, read_metrics, read_progress
from lifecycle.decide.backends import BackendName

# a bucket's HTTP call waits for the trainer's broadcast of it; the group's own timeout must fire first, so the
# engine's error (the trainer died, or fell silent) comes back as an answer rather than a client timeout
BUCKET_GRACE = 5.0
PROGRESS_POLL = 0.5  # seconds between two reads of /metrics in a progress probe (a working engine steps faster)
PROBE_SHARE = 0.9  # of the probe's timeout: the probe's own verdict comes back before the monitor's bound fires


class VLLMAPI:
    backend: BackendName = "vllm"

    def __init__(self, url: str, *, engine_id: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.client = VLLMClient(url, engine_id=engine_id, api_key=api_key, timeout=timeout)
        self.pause_mode = keeping_pause(self.backend)  # "keep": frozen, resumed by /resume
        self.released: set[str] = set()  # the memory tags this server's sleep released (a new process: none)

    async def ready(self, timeout: float) -> None:
        await self.client.health(timeout=timeout)
        await self.client.health_generate(timeout=timeout)  # the model answers (and its id is known)

    async def probe(self, endpoint: str, timeout: float) -> None:
        if endpoint == "progress":
            await self._progress(timeout)
            return
        call = self.client.health if endpoint == "health" else self.client.health_generate
        await call(timeout=timeout)

    async def _progress(self, timeout: float) -> None:
        """The engine core works: within ``timeout`` it answers a 1-token generation *or* its token counters move.

        /health is the API server's answer and stays 200 while the engine core is stopped; a generation alone
        queues behind a busy engine's own requests and times out on a healthy one. A busy engine moves its
        counters at every step; an idle one answers the generation at once; a wedged one does neither."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout * PROBE_SHARE  # inside the monitor's own bound: our reason, not its
        await self.client.health(timeout=timeout)  # 503 (or no answer): the engine core is dead
        before = await read_progress(self.client, timeout=max(deadline - loop.time(), 0.001))
        generation = asyncio.ensure_future(self.client.health_generate(timeout=max(deadline - loop.time(), 0.001)))
        try:
            now = before
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    break
                await asyncio.wait({generation}, timeout=min(PROGRESS_POLL, left))
                if generation.done():
                    if generation.exception() is None or now.tokens > before.tokens:
                        return
                    raise generation.exception()  # type: ignore[misc]
                if deadline - loop.time() < PROGRESS_POLL / 10:  # no time left for a read: the verdict below
                    break
                now = await read_progress(self.client, timeout=deadline - loop.time())
                if now.tokens > before.tokens:
                    return
        finally:
            generation.cancel()
            with contextlib.suppress(BaseException):
                await generation
        raise EngineTimeout(
            self.client.engine_id,
            "/metrics",
            timeout,
            f"no progress in {timeout * PROBE_SHARE:g}s: a 1-token generation did not answer and the engine core's "
            f"token counters stayed at {now.tokens:g} with {now.running:g} requests running, {now.waiting:g} "
            "waiting (its API server answers /health: the engine core is wedged)",
        )

    async def load(self, path: str, version: str, timeout: float | None) -> str | None:
        async with _core_alive(self.client.engine_id):
            await self._start(timeout)
            await self.client.update_weights({"path": path}, timeout=timeout)  # a failure ends the session
            await self.client.finish_weight_update(version, timeout=timeout)
            return await self.client.weight_info()

    async def served_version(self, timeout: float) -> str | None:
        return await self.client.weight_info(timeout=timeout)

    async def identify(self, timeout: float) -> ServerFacts:
        """``/weight_info`` (only with VLLM_SERVER_DEV_MODE=1), ``/v1/models`` (its model) and its Prometheus
        ``process_start_time_seconds`` (its API server process)."""
        expected = (
            "a vLLM server started with VLLM_SERVER_DEV_MODE=1 (its /weight_info answers; --rollout-backend vllm)"
        )
        try:
            version = await self.client.weight_info(timeout=timeout)
            model = await self.client.model(timeout=timeout)
        except (EngineHTTPError, EngineProtocolError) as exc:
            raise await mismatch(self.client, exc, expected, timeout) from exc
        try:
            start = process_start_time(await read_metrics(self.client, timeout=timeout))
        except EngineError:
            start = None  # no metrics: its process cannot be told apart (a replaced one is seen by its version only)
        return ServerFacts(None if start is None else f"process_start_time_seconds {start!r}", version, model)

    async def join_group(
        self, address: str, port: int, rank: int, world_size: int, timeout: float, group: str = GROUP_NAME
    ) -> None:
        info = {"address": address, "port": port, "rank": rank, "world_size": world_size, "timeout": timeout}
        info["group_name"] = group
        await self.client.init_weight_transfer_engine(info, timeout=timeout + BUCKET_GRACE)

    async def leave_group(self, timeout: float, group: str = GROUP_NAME) -> None:
        """vLLM holds one transfer engine: shutting it down leaves whatever group it is in."""
        await self.client.shutdown_weight_transfer_engine(timeout=timeout)

    async def receive(
        self, buckets: Sequence[Bucket], version: str, timeout: float, group: str = GROUP_NAME
    ) -> str | None:
        async with _core_alive(self.client.engine_id):
            await self._start(timeout)
            for bucket in buckets:
                update = {
                    "names": [n for n, _, _ in bucket],
                    "dtype_names": [d for _, d, _ in bucket],
                    "shapes": [list(shape) for _, _, shape in bucket],
                    "group_name": group,  # the plugin refuses a bucket of another generation's group
                }
                await self.client.update_weights(update, timeout=timeout + BUCKET_GRACE)
            await self.client.finish_weight_update(version, timeout=timeout)
            return await self.client.weight_info()

    async def _start(self, timeout: float | None) -> None:
        """Open a session; one left open (by a driver that died mid-update) is cancelled first."""
        try:
            await self.client.start_weight_update(timeout=timeout)
        except EngineHTTPError as exc:
            if NOT_CONFIGURED in exc.body:
                raise EngineMismatch(
                    self.client.engine_id,
                    exc.endpoint,
                    "a vLLM server with the lifecycle's weight transfer (--weight-transfer-config "
                    '\'{"backend": "lifecycle"}\', rl-lifecycle installed in its environment)',
                    "a server started without a weight transfer engine (vLLM: 'Weight transfer not configured')",
                    'restart it with --weight-transfer-config \'{"backend": "lifecycle"}\' (the project\'s '
                    "plugin: pip install rl-lifecycle in the server's environment)",
                ) from None
            if "already active" not in exc.body:
                raise
            with contextlib.suppress(EngineHTTPError):  # answers 500 by design: nothing applied, session over
                await self.client.update_weights({"abort": True}, timeout=timeout)
            await self.client.start_weight_update(timeout=timeout)

    async def pause(self, mode: str | None = None) -> None:
        await self.client.pause(mode or self.pause_mode)  # type: ignore[arg-type]

    async def resume(self) -> None:
        await self.client.resume()

    async def hand_back(self, timeout: float) -> None:
        """``/abort_requests`` with no ids: the API server ends every request it tracks (its callers get
        finish_reason abort and the tokens so far) and the engine core drops them; the scheduler stays paused
        (``/is_paused`` true), so nothing queued after runs until a ``/resume`` -- which only a completed
        update's engine gets."""
        await self.client.abort_requests(timeout=timeout)

    async def release(self, tags: Sequence[str]) -> None:
        """vLLM's sleep (level 1) releases weights and KV cache at once: one ``/sleep`` whatever the tags, and a
        later release finds them released. Only
        where the config allows offloading with vLLM (--rollout-device cuda): its CPU platform releases nothing.
        Kept here, not asked: vLLM 0.32's ``/is_sleeping`` also says true while the server is merely *paused* --
        and an offload always follows a drain's pause, so asking would skip the sleep and release nothing."""
        if not self.released:
            await self.client.sleep(1, "keep")  # "keep": what drain froze stays frozen
            self.released = {"weights", "kv_cache"}

    async def resume_memory(self, tags: Sequence[str]) -> None:
        for tag in tags:  # one ``/wake_up`` per tag, weights first, as vLLM restores them (its client's rule)
            await self.client.wake_up([tag])
            self.released.discard(tag)

    async def close(self) -> None:
        await self.client.close()


NOT_CONFIGURED = "Weight transfer not configured"  # vLLM's answer to a session on a server without a transfer engine

# vLLM's API server answers 500 naming its engine core when that process died (the server exits soon after):
# the server did not refuse the weights, it is gone -- the slot must report request_failed, not refused
_DEAD_CORE = ("EngineDeadError", "EngineCore encountered an issue")


@contextlib.asynccontextmanager
async def _core_alive(engine_id: str) -> AsyncIterator[None]:
    try:
        yield
    except EngineHTTPError as exc:
        if exc.status >= 500 and any(word in exc.body for word in _DEAD_CORE):
            raise EngineUnreachable(engine_id, exc.endpoint, f"vLLM's engine core died: {exc.body[:200]}") from None
        raise


def vllm_api(url: str, *, engine_id: str, api_key: str | None, timeout: float) -> VLLMAPI:
    return VLLMAPI(url, engine_id=engine_id, api_key=api_key, timeout=timeout)
