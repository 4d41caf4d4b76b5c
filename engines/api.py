"""What an engine slot asks of its server, in the lifecycle's words, once per backend.

The slot (:class:`engines.engine.Engine`) carries out the core's commands -- wait until serving, probe, load
a checkpoint and publish its version, join/receive/leave a broadcast, pause, resume, release and resume
memory -- and reports outcomes. *How* each is spelled on the wire is the backend's: SGLang's API (real
SGLang, and the project's CPU engine, which speaks it) here, vLLM's in :mod:`engines.vllm.api`. A launcher
names the API of the server it starts (its ``api`` attribute); the default is SGLang's.

Both backends bracket a weight update in the server's own session, so a version is published only by a
completed update: SGLang ``/begin_weight_update`` ... ``/end_weight_update``, vLLM ``/start_weight_update`` ...
``/finish_weight_update``. A failed transfer closes (or abandons) the session and leaves the old weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Protocol

from engines.client import EngineClient
from engines.errors import EngineError
from lifecycle.decide.backends import BackendName, capabilities

Bucket = Sequence[tuple[str, str, Sequence[int]]]  # one broadcast bucket: (name, dtype, shape) of each tensor
GROUP_BACKEND = "gloo"  # the weight-update group's transport on these CPUs


class ServerAPI(Protocol):
    """One server's API (raises :class:`~engines.errors.EngineError` on every failure). ``client`` is its HTTP
    client: the rollout's routing calls ``client.generate_batch`` with SGLang's arguments on either backend."""

    backend: BackendName
    client: Any

    async def ready(self, timeout: float) -> None:
        """One start-up probe: returns once the server generates and can take an update."""

    async def probe(self, endpoint: str, timeout: float) -> None:
        """One liveness probe (``health_generate``: a real 1-token generation; ``health``: liveness only)."""

    async def load(self, path: str, version: str, timeout: float | None) -> str | None:
        """Load a checkpoint directory in one update session publishing ``version``; the version it reports."""

    async def served_version(self, timeout: float) -> str | None:
        """The weight version the server says it serves now (what a load or a broadcast published)."""

    async def join_group(self, address: str, port: int, rank: int, world_size: int, timeout: float) -> None:
        """Join the trainer's weight-update group at ``rank`` (blocks until every member joined)."""

    async def leave_group(self, timeout: float) -> None:
        """Leave the group (raises if the server cannot be told)."""

    async def receive(self, buckets: Sequence[Bucket], version: str, timeout: float) -> str | None:
        """Receive every bucket of the trainer's broadcast in one session publishing ``version``."""

    async def pause(self) -> None:
        """Stop generating, keeping what runs (resumed by :meth:`resume`)."""

    async def resume(self) -> None: ...

    async def release(self, tags: Sequence[str]) -> None:
        """Release the memory tags (``weights``, ``kv_cache``) in one request."""

    async def resume_memory(self, tags: Sequence[str]) -> None:
        """Bring the memory tags back."""

    async def close(self) -> None: ...


class SGLangAPI:
    """SGLang's HTTP API (``/health_generate``, ``/update_weights_from_disk``, ``/model_info``, ...)."""

    backend: BackendName = "sglang"

    def __init__(self, url: str, *, engine_id: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.client = EngineClient(url, engine_id=engine_id, api_key=api_key, timeout=timeout)
        # what drain asks: SGLang's "retract" puts running requests back in the queue, resumed by continue
        self.pause_mode = capabilities("sglang", "cpu").pause_modes[0]

    async def ready(self, timeout: float) -> None:
        await self.client.health_generate(timeout=timeout)
        await self.client.flush_cache()  # the queue is empty: an offload or an update may follow

    async def probe(self, endpoint: str, timeout: float) -> None:
        call = self.client.health if endpoint == "health" else self.client.health_generate
        await call(timeout=timeout)

    async def load(self, path: str, version: str, timeout: float | None) -> str | None:
        async with self._session(timeout):
            await self.client.update_weights_from_disk(path, weight_version=version, timeout=timeout)
        return (await self.client.model_info()).weight_version

    async def served_version(self, timeout: float) -> str | None:
        return (await self.client.model_info(timeout=timeout)).weight_version

    async def join_group(self, address: str, port: int, rank: int, world_size: int, timeout: float) -> None:
        await self.client.init_weights_update_group(
            address, port, rank, world_size, backend=GROUP_BACKEND, timeout=timeout
        )

    async def leave_group(self, timeout: float) -> None:
        await self.client.destroy_weights_update_group(timeout=timeout)

    async def receive(self, buckets: Sequence[Bucket], version: str, timeout: float) -> str | None:
        async with self._session(timeout):
            for k, bucket in enumerate(buckets):
                await self.client.update_weights_from_distributed(
                    [n for n, _, _ in bucket],
                    [d for _, d, _ in bucket],
                    [list(shape) for _, _, shape in bucket],
                    weight_version=version if k == len(buckets) - 1 else None,
                    timeout=timeout,
                )
        return (await self.client.model_info()).weight_version

    @contextlib.asynccontextmanager
    async def _session(self, timeout: float | None) -> Any:
        """``/begin_weight_update`` ... ``/end_weight_update``; ended even when the transfer failed (a failed
        SGLang update changes nothing, and a session left open would refuse the next one)."""
        await self.client.begin_weight_update(timeout=timeout)
        try:
            yield
        except BaseException:
            with contextlib.suppress(EngineError):
                await self.client.end_weight_update(timeout=timeout)
            raise
        await self.client.end_weight_update(timeout=timeout)

    async def pause(self) -> None:
        await self.client.pause_generation(mode=self.pause_mode)  # type: ignore[arg-type]

    async def resume(self) -> None:
        await self.client.continue_generation()

    async def release(self, tags: Sequence[str]) -> None:
        await self.client.release_memory_occupation(list(tags))  # SGLang's tags: a list, every tag in one call

    async def resume_memory(self, tags: Sequence[str]) -> None:
        await self.client.resume_memory_occupation(list(tags))

    async def close(self) -> None:
        await self.client.close()


class APIFactory(Protocol):
    def __call__(self, url: str, *, engine_id: str, api_key: str | None, timeout: float) -> ServerAPI: ...


def sglang_api(url: str, *, engine_id: str, api_key: str | None, timeout: float) -> ServerAPI:
    return SGLangAPI(url, engine_id=engine_id, api_key=api_key, timeout=timeout)
